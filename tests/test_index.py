"""Index files: ``feature_index,label_index,key`` lines, parsed in C++.

Tolerated: blank lines, spaces and tabs around fields, CRLF line endings, a missing final newline, a UTF-8
byte-order mark opening a file; several files are concatenated in order. A malformed line raises ValueError naming
the file and the line number. Checked through the public API: `WindowSource.describe` names each sample's file and
line, and the batches show which rows were read.
"""

from __future__ import annotations

import npyfeed
import numpy as np
import pytest

W = 2


def _arrays(keys, rows=50):
    """Factor rows hold (row, key number) and label rows (row + 1000), so batches show what was read."""
    factors, labels = {}, {}
    for n, key in enumerate(keys):
        factors[key] = np.stack([np.arange(rows), np.full(rows, n)], axis=1).astype(np.float32)
        labels[key] = (np.arange(rows) + 1000).astype(np.float32)
    return factors, labels


def _source(index, keys, **kwargs):
    factors, labels = _arrays(keys)
    return npyfeed.WindowSource.from_arrays(index, factors, labels, W, **kwargs)


def _check(src, expected, keys):
    """`expected`: (path, line, feature_index, label_index, key) per sample, in order; `keys` as given to
    `_arrays`."""
    assert len(src) == len(expected)
    for i, (path, line, fi, li, key) in enumerate(expected):
        assert src.describe(i) == f"{path}:{line}: key '{key}', feature_index {fi}, label_index {li}"
    if expected:
        x, y = src.get(np.arange(len(expected)))
        assert np.array_equal(x[:, -1, 0], [fi for _, _, fi, _, _ in expected])  # the window ends at fi
        assert np.array_equal(x[:, 0, 0], [fi - W + 1 for _, _, fi, _, _ in expected])
        assert np.array_equal(x[:, 0, 1], [keys.index(k) for _, _, _, _, k in expected])
        assert np.array_equal(y, [li + 1000 for _, _, _, li, _ in expected])


def test_blank_lines_and_spaces(tmp_path):
    path = tmp_path / "index.txt"
    path.write_text("\n"
                    "5,7,a\n"
                    "   \n"
                    "  6 , 8 ,  b  \n"
                    "\t7\t,\t9\t,\ta\t\n"
                    "\n\n"
                    "+8,10,b\n"
                    "9,0,a")  # no final newline
    src = _source(path, ["a", "b"])
    _check(src, [(path, 2, 5, 7, "a"), (path, 4, 6, 8, "b"), (path, 5, 7, 9, "a"), (path, 8, 8, 10, "b"),
                 (path, 9, 9, 0, "a")], ["a", "b"])
    assert src.keys == ["a", "b"]


@pytest.mark.parametrize("ending", ["\r\n", "\n"], ids=["crlf", "lf"])
def test_line_endings(tmp_path, ending):
    path = tmp_path / "index.txt"
    path.write_bytes(ending.join(["3,4,k1", "", "10,11,k2 ", "12,13,k1", ""]).encode())
    src = _source(path, ["k1", "k2"])
    _check(src, [(path, 1, 3, 4, "k1"), (path, 3, 10, 11, "k2"), (path, 4, 12, 13, "k1")], ["k1", "k2"])
    assert src.keys == ["k1", "k2"]  # no '\r' left on a key


def test_a_byte_order_mark_opening_a_file_is_not_part_of_its_first_line(tmp_path):
    """What Windows editors and ``encoding="utf-8-sig"`` write; elsewhere in a file it is still malformed."""
    path = tmp_path / "index.txt"
    path.write_text("3,4,k1\r\n10,11,k2\r\n", encoding="utf-8-sig")
    assert path.read_bytes().startswith(b"\xef\xbb\xbf")
    src = _source(path, ["k1", "k2"])
    _check(src, [(path, 1, 3, 4, "k1"), (path, 2, 10, 11, "k2")], ["k1", "k2"])
    only_mark = tmp_path / "empty.txt"
    only_mark.write_bytes(b"\xef\xbb\xbf")
    assert len(_source([only_mark, path], ["k1", "k2"])) == 2
    inside = tmp_path / "inside.txt"
    inside.write_bytes(b"3,4,k1\n\xef\xbb\xbf10,11,k2\n")
    with pytest.raises(ValueError, match=f"{inside}:2: feature_index is not an integer"):
        _source(inside, ["k1", "k2"])


def test_a_key_that_is_not_utf8_names_its_line(tmp_path):
    """An index saved as GBK (or Latin-1): a ValueError naming the file and line, from the source, the compiled
    cache and check_index alike, not a UnicodeDecodeError without either. UTF-8 keys of any script are keys."""
    good = tmp_path / "utf8.txt"
    good.write_text("10,10,中国平安\n11,11,k1\n", encoding="utf-8")
    assert _source(good, ["中国平安", "k1"]).keys == ["中国平安", "k1"]
    gbk = tmp_path / "gbk.txt"
    gbk.write_bytes("10,10,k1\n11,11,中国平安\n".encode("gbk"))
    for cache in (False, True):
        with pytest.raises(ValueError, match=f"{gbk}:2: key is not UTF-8 text"):
            _source(gbk, ["k1"], cache=cache, cache_dir=tmp_path / "cache")
    report = npyfeed.check_index(gbk, tmp_path, tmp_path, W)
    assert [(p.where, p.kind) for p in report.errors if "UTF-8" in p.message] == [(f"{gbk}:2", "malformed")]


@pytest.mark.parametrize("text", [b"10,10,k1\r11,11,k2\r12,12,k1\r", b"10,10,k1\r11"])
def test_old_mac_line_endings_are_named_as_such(tmp_path, text):
    """Lines end with \\n or \\r\\n; a lone \\r inside a line is said to be one (shown escaped), whether the line
    then has too many fields or a key holding it."""
    path = tmp_path / "index.txt"
    path.write_bytes(text)
    with pytest.raises(ValueError, match=rf"{path}:1: a carriage return inside the line") as error:
        _source(path, ["k1", "k2"])
    assert "\r" not in str(error.value) and "(line: '10,10,k1\\r11" in str(error.value)


def test_several_files_in_order(tmp_path):
    first, second, third = tmp_path / "1.txt", tmp_path / "2.txt", tmp_path / "3.txt"
    first.write_text("1,1,b\n2,2,a\n")
    second.write_text("\n3,3,c\r\n4,4,b\r\n")
    third.write_text("")
    src = _source([first, second, third, first], ["a", "b", "c"])
    _check(src, [(first, 1, 1, 1, "b"), (first, 2, 2, 2, "a"), (second, 2, 3, 3, "c"), (second, 3, 4, 4, "b"),
                 (first, 1, 1, 1, "b"), (first, 2, 2, 2, "a")], ["a", "b", "c"])
    assert src.keys == ["b", "a", "c"]  # order of first appearance
    # The same through the file-reading source.
    factors, labels = _arrays(["a", "b", "c"])
    for key in "abc":
        (tmp_path / "factor").mkdir(exist_ok=True)
        (tmp_path / "label").mkdir(exist_ok=True)
        np.save(tmp_path / "factor" / f"{key}.npy", factors[key])
        np.save(tmp_path / "label" / f"{key}.npy", labels[key])
    files = npyfeed.WindowSource((str(second), first), tmp_path / "factor", tmp_path / "label", W, mode="read")
    _check(files, [(second, 2, 3, 3, "c"), (second, 3, 4, 4, "b"), (first, 1, 1, 1, "b"), (first, 2, 2, 2, "a")],
           ["a", "b", "c"])


def test_realistic_keys(tmp_path):
    keys = ["600000.SH", "000001.SZ", "2020-01-02_am", "ÉTÉ", "a b"]
    path = tmp_path / "index.txt"
    path.write_text("".join(f"{n + 1},{n},{k}\n" for n, k in enumerate(keys)), encoding="utf-8")
    src = _source(path, keys)
    _check(src, [(path, n + 1, n + 1, n, k) for n, k in enumerate(keys)], keys)


def test_negative_and_large_numbers_parse(tmp_path):
    path = tmp_path / "index.txt"
    path.write_text("-3,-1,a\n9223372036854775807,0,a\n-9223372036854775807,5,a\n5,6,a\n")
    src = _source(path, ["a"], bounds="skip")
    assert len(src) == 1 and src.skipped == 3
    pad = _source(path, ["a"], bounds="pad")
    assert pad.describe(1) == f"{path}:2: key 'a', feature_index 9223372036854775807, label_index 0"
    assert pad.describe(2) == f"{path}:3: key 'a', feature_index -9223372036854775807, label_index 5"


def test_many_lines(tmp_path):
    rng = np.random.default_rng(5)
    n = 200_000
    fi = rng.integers(W - 1, 50, n)
    li = rng.integers(0, 50, n)
    keys = np.array(["a", "b", "c"])[rng.integers(0, 3, n)]
    path = tmp_path / "index.txt"
    path.write_text("".join(f"{f},{l},{k}\n" for f, l, k in zip(fi.tolist(), li.tolist(), keys.tolist())))
    src = _source(path, ["a", "b", "c"])
    assert len(src) == n
    ids = np.array([0, 1, n // 2, n - 1])
    x, y = src.get(ids)
    assert np.array_equal(x[:, -1, 0], fi[ids]) and np.array_equal(y, li[ids] + 1000)
    assert src.describe(n - 1) == f"{path}:{n}: key '{keys[-1]}', feature_index {fi[-1]}, label_index {li[-1]}"


MALFORMED = [
    ("one-field", "12"),
    ("two-fields", "1,2"),
    ("only-commas", ",,"),
    ("missing-feature", " ,2,k"),
    ("missing-label", "1,,k"),
    ("word", "one,2,k"),
    ("float-feature", "1.5,2,k"),
    ("float-label", "1,2.0,k"),
    ("exponent", "1e3,2,k"),
    ("hex", "0x10,2,k"),
    ("space-inside-number", "1 2,3,k"),
    ("double-sign", "--1,2,k"),
    ("sign-only", "-,2,k"),
    ("overflow", "99999999999999999999,1,k"),
    ("underflow", "1,-9223372036854775809,k"),
    ("extra-field", "1,2,k,4"),
    ("trailing-comma", "1,2,k,"),
    ("empty-key", "1,2,"),
    ("blank-key", "1,2,   "),
    ("slash-key", "1,2,a/b"),
    ("absolute-key", "1,2,/etc/passwd"),
    ("dot-key", "1,2,."),
    ("dotdot-key", "1,2,.."),
    ("semicolons", "1;2;k"),
]


@pytest.mark.parametrize("line", [m[1] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_line_names_file_and_line(tmp_path, line):
    path = tmp_path / "index.txt"
    path.write_text(f"1,1,k\n\n{line}\n4,4,k\n")
    with pytest.raises(ValueError) as info:
        _source(path, ["k", "a/b", "", ".", ".."])
    assert f"{path}:3:" in str(info.value)
    assert not isinstance(info.value, npyfeed.NpyFormatError)
    # The file-reading source parses the same way, before it looks for any data file.
    with pytest.raises(ValueError, match=f"{path}:3:"):
        npyfeed.WindowSource(path, tmp_path / "none", tmp_path / "none", W)


def test_malformed_line_in_second_file(tmp_path):
    good, bad = tmp_path / "good.txt", tmp_path / "bad.txt"
    good.write_text("1,1,k\n" * 5)
    bad.write_text("1,1,k\r\n\r\n1,1\r\n")
    with pytest.raises(ValueError, match=f"{bad}:3:"):
        _source([good, bad], ["k"])


def test_long_malformed_line_is_shortened_in_the_message(tmp_path):
    path = tmp_path / "index.txt"
    path.write_text("1,2," + "k" * 10_000 + ",extra\n")
    with pytest.raises(ValueError, match=f"{path}:1:") as info:
        _source(path, ["k"])
    assert len(str(info.value)) < 1000


def test_nul_byte(tmp_path):
    path = tmp_path / "index.npy"
    np.save(path, np.arange(3))  # a binary file given as an index
    with pytest.raises(ValueError, match=str(path)):
        _source(path, ["k"])


def test_missing_index_file(tmp_path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(FileNotFoundError) as info:
        _source(missing, ["k"])
    assert info.value.filename == str(missing)
    with pytest.raises(FileNotFoundError):
        npyfeed.WindowSource([tmp_path / "nope.txt"], tmp_path, tmp_path, W)
    with pytest.raises(OSError):
        _source(tmp_path, ["k"])  # a directory


def test_a_glob_pattern_stands_for_the_files_it_matches_sorted(tmp_path):
    folder = tmp_path / "index"
    folder.mkdir()
    files = {name: folder / name for name in ("train_2.txt", "train_10.txt", "train_1.txt", "test.txt")}
    for path, line in zip(files.values(), ("4,4,b\n", "2,2,a\n", "1,1,c\n", "3,3,a\n")):
        path.write_text(line)
    (folder / "train_x.txt").mkdir()  # a folder the pattern matches is no index file
    keys = ["a", "b", "c"]
    pattern = folder / "train_*.txt"
    in_order = [(files["train_1.txt"], 1, 1, 1, "c"), (files["train_10.txt"], 1, 2, 2, "a"),
                (files["train_2.txt"], 1, 4, 4, "b")]  # sorted by name
    _check(_source(str(pattern), keys), in_order, keys)
    # Among other paths, in the order given.
    _check(_source([files["test.txt"], pattern], keys, cache=False), [(files["test.txt"], 1, 3, 3, "a"), *in_order],
           keys)
    # The file-reading source the same way, its arrays equal to np.load's slices.
    factors, labels = _arrays(keys)
    for sub, arrays in (("factor", factors), ("label", labels)):
        (tmp_path / sub).mkdir()
        for key in keys:
            np.save(tmp_path / sub / f"{key}.npy", arrays[key])
    src = npyfeed.WindowSource(pattern, tmp_path / "factor", tmp_path / "label", W)
    _check(src, in_order, keys)
    x, y = src.get([0])
    np.testing.assert_array_equal(x[0], np.load(tmp_path / "factor" / "c.npy")[0:2], strict=True)
    np.testing.assert_array_equal(y[0], np.load(tmp_path / "label" / "c.npy")[1], strict=True)
    # A pattern that matches no file names itself.
    with pytest.raises(FileNotFoundError, match="pattern matches no file") as info:
        _source([files["test.txt"], folder / "val_*.txt"], keys)
    assert info.value.filename == str(folder / "val_*.txt")
    # A file whose name has glob characters is that file, not a pattern.
    literal = folder / "train_[1].txt"
    literal.write_text("5,5,a\n")
    _check(_source(literal, keys), [(literal, 1, 5, 5, "a")], keys)


def test_no_index_files(tmp_path):
    with pytest.raises(ValueError, match="no index files"):
        npyfeed.WindowSource([], tmp_path, tmp_path, W)


def test_index_argument_types(tmp_path):
    path = tmp_path / "index.txt"
    path.write_text("3,4,k\n")
    for index in (path, str(path), bytes(path), [path], (str(path),)):
        _check(_source(index, ["k"]), [(path, 1, 3, 4, "k")], ["k"])
    with pytest.raises(TypeError):
        npyfeed.WindowSource([3], tmp_path, tmp_path, W)


def test_an_empty_index_is_refused_like_from_arrays(tmp_path):
    factor, label = tmp_path / "factor", tmp_path / "label"
    factor.mkdir()
    label.mkdir()
    index = tmp_path / "empty.txt"
    index.write_text("\n  \n")
    with pytest.raises(ValueError, match="index is empty.*empty.txt"):
        npyfeed.WindowSource(index, factor, label, 3)
    with pytest.raises(ValueError, match="index is empty"):
        npyfeed.WindowSource.from_arrays([], {}, {}, 3)
