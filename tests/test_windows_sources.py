"""Building window sources: `from_arrays` (the users' migration path) and the construction errors (arguments,
missing, mismatched and corrupt files).

The numpy reference and the data sets: windows_data.py."""


from __future__ import annotations

import gc
import re
import time

import npyfeed
import numpy as np
import pytest
from windows_data import (
    FILE_MODES,
    MODES,
    THREADS,
    assert_batch,
    check_epoch,
    many_keys_dataset,
    open_source,
    reference,
    write_dataset,
)

# ----------------------------------------------------------------------------------------------------------
# locate: where each sample comes from


@pytest.mark.parametrize("mode", MODES)
def test_locate_gives_each_samples_index_line(small, mode):
    """locate(ids) = the index lines of those samples, in the order asked, against the index as written."""
    src = open_source(small, mode)
    keys = np.array(src.keys)
    everything = src.locate(np.arange(len(src)))
    assert isinstance(everything, npyfeed.SampleLocation)
    assert list(zip(everything.feature_index.tolist(), everything.label_index.tolist(),
                    keys[everything.key].tolist())) == [tuple(e) for e in small.entries]
    order = src.epoch_order(3, shuffle=True, seed=9)[:17]
    some = src.locate(order.tolist())
    assert [(int(f), int(l), keys[k]) for k, f, l in zip(*some)] == [tuple(small.entries[i]) for i in order]
    none = src.locate(np.array([], dtype=np.int32))
    assert [len(a) for a in none] == [0, 0, 0]
    with pytest.raises(IndexError, match=str(len(src))):
        src.locate([0, len(src)])
    with pytest.raises(IndexError):
        src.locate([-1])
    with pytest.raises(TypeError, match="sample_ids must be a 1-d sequence of integers"):
        src.locate([[0, 1]])
    with pytest.raises(TypeError, match="sample_ids must be a 1-d sequence of integers"):
        src.locate([0.5])


def test_locate_numbers_keys_in_the_index_when_keys_are_left_out(tmp_path):
    """missing='skip' and bounds='skip': the samples left are located by their lines, keys numbered in `keys`."""
    rng = np.random.default_rng(3)
    factors = {f"k{k}": rng.standard_normal((10, 3)).astype(np.float32) for k in range(4)}
    labels = {k: rng.standard_normal((10, 1)).astype(np.float32) for k in factors}
    entries = [(int(rng.integers(0, 12)), int(rng.integers(0, 11)), f"k{int(rng.integers(0, 4))}") for _ in range(60)]
    ds = write_dataset(tmp_path, factors, labels, entries, 3)
    (ds.label_dir / "k1.npy").unlink()
    src = open_source(ds, "mmap", missing="skip", bounds="skip")
    kept = [e for e in entries if e[2] != "k1" and 2 <= e[0] < 10 and e[1] < 10]
    assert len(src) == len(kept) > 10 and src.missing_keys == ("k1",) and src.skipped > 0
    where = src.locate(np.arange(len(src)))
    assert [(int(f), int(l), src.keys[k]) for k, f, l in zip(*where)] == kept


# ----------------------------------------------------------------------------------------------------------
# from_arrays: the users' migration path


def test_from_arrays_with_load_factor_files(small):
    paths = sorted(small.factor_dir.glob("*.npy"))
    for mode in ("auto", "mmap"):
        factors = npyfeed.load_factor_files(paths, mode=mode)
        labels = npyfeed.load_factor_files(sorted(small.label_dir.glob("*.npy")), {}, mode=mode)
        assert set(factors) == set(small.factors)
        for index in (small.index, str(small.index), [small.index], [str(small.index)]):
            src = npyfeed.WindowSource.from_arrays(index, factors, labels, small.window, threads=THREADS)
            assert src.mode == "memory" and len(src) == len(small.entries)
            check_epoch(src, small, "float32", 8, shuffle=True, seed=1)
        files = open_source(small, "read")
        arrays = npyfeed.WindowSource.from_arrays(small.index, factors, labels, small.window)
        for (x1, y1), (x2, y2) in zip(files.batches(16), arrays.batches(16)):
            assert np.array_equal(x1, x2) and np.array_equal(y1, y2)


def test_from_arrays_keeps_its_arrays_alive_until_the_source_is_gone(small):
    """The core holds the arrays itself (not a Python attribute): an iterator outliving every other reference
    still reads them, and they are freed once the source and its iterators are gone."""
    import weakref

    factors = {k: v.copy() for k, v in small.factors.items()}
    labels = {k: v.copy() for k, v in small.labels.items()}
    refs = [weakref.ref(a) for a in (*factors.values(), *labels.values())]
    src = npyfeed.WindowSource.from_arrays(small.index, factors, labels, small.window, threads=THREADS)
    it = src.batches(len(small.entries))
    del factors, labels, src
    gc.collect()
    assert all(r() is not None for r in refs)
    x, y = next(it)
    assert_batch((x, y), reference(small, small.entries, "float32"))
    it.close()
    del it
    deadline = time.monotonic() + 5  # a pool worker may hold the finished read-ahead for a moment
    while any(r() is not None for r in refs) and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)
    assert all(r() is None for r in refs)


def test_from_arrays_with_tuples_and_odd_arrays(small):
    entries = [(np.int64(fi), int(li), key) for fi, li, key in small.entries]
    # Non-contiguous and Fortran-order arrays are accepted (copied once to C order).
    factors = {k: np.asfortranarray(v) for k, v in small.factors.items()}
    labels = {k: np.repeat(v, 2, axis=1)[:, ::2] for k, v in small.labels.items()}
    assert not labels["s0"].flags.c_contiguous and not factors["s0"].flags.c_contiguous
    src = npyfeed.WindowSource.from_arrays(entries, factors, labels, small.window, dtype="float64")
    assert src.keys == list(dict.fromkeys(k for _, _, k in small.entries))
    assert_batch(src.get(np.arange(len(entries))), reference(small, small.entries, "float64"))


def test_from_arrays_missing_keys(small):
    factors = dict(small.factors)
    labels = dict(small.labels)
    del factors["s1"], labels["s4"]
    with pytest.raises(KeyError, match="2 of 6 keys.*'s1'.*'s4'|2 of 6 keys.*'s4'.*'s1'"):
        npyfeed.WindowSource.from_arrays(small.index, factors, labels, small.window)


@pytest.mark.parametrize("index, error", [([], ValueError), ([(1, 2)], ValueError), ([(1.5, 2, "a")], ValueError),
                                          ([(1, 2, "a/b")], ValueError), ([(1, 2, "")], ValueError),
                                          ([(1, 2, "a"), (1, 2, "b\udce9")], ValueError)])
def test_from_arrays_bad_tuples(index, error):
    arrays = {"a": np.zeros((5, 2)), "a/b": np.zeros((5, 2)), "": np.zeros((5, 2)), "b\udce9": np.zeros((5, 2))}
    with pytest.raises(error) as info:
        npyfeed.WindowSource.from_arrays(index, arrays, arrays, 1)
    assert type(info.value) is ValueError  # a message of npyfeed's, not the binding's TypeError


# ----------------------------------------------------------------------------------------------------------
# Construction errors: arguments, missing, mismatched and corrupt files


@pytest.mark.parametrize("kwargs, match", [
    (dict(window=0), "window"), (dict(window=-3), "window"), (dict(window=2.0), "window"),
    (dict(window=True), "window"),
    (dict(dtype="int32"), "dtype"), (dict(dtype="float16"), "dtype"), (dict(bounds="clip"), "bounds"),
    (dict(mode="fast"), "mode"), (dict(threads=0), "threads")])
def test_invalid_source_arguments(small, kwargs, match):
    kwargs = dict(kwargs)
    window = kwargs.pop("window", small.window)
    with pytest.raises(ValueError, match=match):
        npyfeed.WindowSource(small.index, small.factor_dir, small.label_dir, window, **kwargs)
    kwargs.pop("mode", None)
    if kwargs or window != small.window:
        with pytest.raises(ValueError, match=match):
            npyfeed.WindowSource.from_arrays(small.index, small.factors, small.labels, window, **kwargs)


@pytest.mark.parametrize("mode", FILE_MODES)
def test_missing_key_files_are_listed(tmp_path, mode):
    ds = many_keys_dataset(tmp_path, 9)
    for k in range(1, 9):
        (ds.factor_dir / f"key{k:02d}.npy").unlink()
    (ds.label_dir / "key02.npy").unlink()
    with pytest.raises(FileNotFoundError) as info:
        open_source(ds, mode)
    message = str(info.value)
    assert "8 of 9 keys" in message
    for k in range(1, 6):  # the first few, with their paths
        assert f"'key{k:02d}'" in message and str(ds.factor_dir / f"key{k:02d}.npy") in message
    assert str(ds.label_dir / "key02.npy") in message
    assert "'key08'" not in message and "..." in message
    assert info.value.filename is not None and "key0" in str(info.value.filename)


def test_one_missing_label_file(tmp_path):
    ds = many_keys_dataset(tmp_path, 3)
    (ds.label_dir / "key01.npy").unlink()
    with pytest.raises(FileNotFoundError, match=r"1 of 3 keys.*'key01'.*label.key01\.npy"):
        open_source(ds, "read")


@pytest.mark.parametrize("which", ["factor_dir", "label_dir"])
def test_missing_directory_is_named(tmp_path, which):
    """A folder that is not there is named as such, not reported as every key's files missing."""
    ds = many_keys_dataset(tmp_path, 2)
    folders = {"factor_dir": ds.factor_dir, "label_dir": ds.label_dir, which: tmp_path / "nowhere"}
    for missing in ("error", "skip"):
        with pytest.raises(FileNotFoundError, match=f"{which} does not exist") as info:
            npyfeed.WindowSource(ds.index, folders["factor_dir"], folders["label_dir"], 3, missing=missing)
        assert info.value.filename == str(tmp_path / "nowhere")
        assert "keys have no data file" not in str(info.value)
    with pytest.raises(FileNotFoundError, match=f"{which} does not exist"):
        npyfeed.WindowSource.dense(folders["factor_dir"], folders["label_dir"], 3)


def test_missing_key_files_error_says_how_to_go_on(tmp_path):
    ds = many_keys_dataset(tmp_path, 3)
    (ds.factor_dir / "key01.npy").unlink()
    with pytest.raises(FileNotFoundError, match=r"1 of 3 keys.*missing='skip'"):
        open_source(ds, "read")
    with pytest.raises(ValueError, match="missing must be 'error' or 'skip'"):
        open_source(ds, "read", missing="ignore")


@pytest.mark.parametrize("mode", FILE_MODES)
def test_missing_skip_reads_exactly_the_other_keys(tmp_path, mode, caplog):
    """missing='skip': the keys without a factor or label file are left out with all their lines, one warning
    counts them, and every batch equals np.load's rows of the remaining keys' lines."""
    ds = many_keys_dataset(tmp_path, 9)
    (ds.factor_dir / "key00.npy").unlink()  # the first key: the row shapes come from a later one
    (ds.label_dir / "key04.npy").unlink()
    (ds.factor_dir / "key07.npy").unlink()
    gone = {"key00", "key04", "key07"}
    kept = [e for e in ds.entries if e[2] not in gone]
    assert 0 < len(kept) < len(ds.entries)
    with caplog.at_level("WARNING", logger="npyfeed"):
        src = open_source(ds, mode, missing="skip")
    assert src.missing_keys == ("key00", "key04", "key07")
    assert len(src) == len(kept) and src.skipped == 0
    warning = [r.getMessage() for r in caplog.records if "missing='skip'" in r.getMessage()]
    assert len(warning) == 1
    assert "3 of 9 keys" in warning[0] and f"their {len(ds.entries) - len(kept)} samples" in warning[0]
    assert all(f"'{k}'" in warning[0] for k in gone)
    check_epoch(src, ds, "float32", 7, entries=kept)
    check_epoch(src, ds, "float32", 5, entries=kept, shuffle=True, seed=3)
    for i in range(len(src)):
        assert src.describe(i).split(": key")[0] == f"{ds.index}:{ds.entries.index(kept[i]) + 1}"
    assert not any(f"{k}.npy" in str(p) for p in src.files for k in gone)
    summary = src.describe()
    assert "3 of 9 keys without a file" in summary and "'key04'" in summary


def test_missing_skip_with_blocks_and_dense(tmp_path):
    ds = many_keys_dataset(tmp_path, 5)
    (ds.label_dir / "key02.npy").unlink()
    kept = [e for e in ds.entries if e[2] != "key02"]
    src = open_source(ds, "mmap", missing="skip")
    order = src.epoch_order(0, shuffle="blocks", seed=2)
    assert sorted(order.tolist()) == list(range(len(kept)))
    check_epoch(src, ds, "float32", 4, entries=kept, shuffle="blocks", seed=2)
    keys = [f"key{k:02d}" for k in range(5)]
    dense = npyfeed.WindowSource.dense(ds.factor_dir, ds.label_dir, ds.window, keys=keys, missing="skip")
    whole = npyfeed.WindowSource.dense(ds.factor_dir, ds.label_dir, ds.window, keys=[k for k in keys if k != "key02"])
    assert dense.missing_keys == ("key02",) and len(dense) == len(whole)
    ids = np.arange(len(whole))
    for a, b in zip(dense.get(ids), whole.get(ids)):
        assert np.array_equal(a, b)
    with pytest.raises(FileNotFoundError):
        npyfeed.WindowSource.dense(ds.factor_dir, ds.label_dir, ds.window, keys=keys)


def test_missing_skip_with_no_key_left(tmp_path):
    ds = many_keys_dataset(tmp_path, 2)
    for k in range(2):
        (ds.factor_dir / f"key{k:02d}.npy").unlink()
    with pytest.raises(FileNotFoundError, match=r"2 of 2 keys.*no key is left"):
        open_source(ds, "read", missing="skip")


@pytest.mark.parametrize("which", ["factor", "label"])
@pytest.mark.parametrize("mode", FILE_MODES)
def test_row_shapes_must_match(tmp_path, which, mode):
    ds = many_keys_dataset(tmp_path, 4)
    directory = ds.factor_dir if which == "factor" else ds.label_dir
    np.save(directory / "key02.npy", np.zeros((10, 5), np.float32))
    with pytest.raises(ValueError) as info:
        open_source(ds, mode)
    message = str(info.value)
    assert str(directory / "key02.npy") in message and str(directory / "key00.npy") in message
    assert re.search(r"\(5, ?\)", message)  # the shapes, too


@pytest.mark.parametrize("mode", MODES)
def test_row_shapes_must_match_in_memory(small, mode):
    factors = dict(small.factors)
    factors["s3"] = np.zeros((40, 4))
    with pytest.raises(ValueError, match=r"factors\['s3'\].*factors\['s\d'\]|factors\['s\d'\].*factors\['s3'\]"):
        npyfeed.WindowSource.from_arrays(small.index, factors, small.labels, small.window)


@pytest.mark.parametrize("damage", ["magic", "header", "truncated", "empty"])
@pytest.mark.parametrize("mode", FILE_MODES)
def test_corrupt_factor_file(tmp_path, damage, mode):
    ds = many_keys_dataset(tmp_path, 3)
    path = ds.factor_dir / "key01.npy"
    data = path.read_bytes()
    if damage == "magic":
        data = b"\x93NUMPZ" + data[6:]
    elif damage == "header":
        data = data.replace(b"'descr'", b"'descx'")
    elif damage == "truncated":
        data = data[:-5]
    else:
        data = b""
    path.write_bytes(data)
    with pytest.raises(npyfeed.NpyFormatError) as info:
        open_source(ds, mode)
    assert isinstance(info.value, ValueError)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("dtype", ["<c8", "<U2", "<M8[s]", [("a", "<f4")]])
def test_unconvertible_dtype(tmp_path, dtype):
    ds = many_keys_dataset(tmp_path, 2)
    path = ds.factor_dir / "key01.npy"
    np.save(path, np.zeros((10, 3), dtype))
    for mode in FILE_MODES:
        with pytest.raises(ValueError, match="key01.npy"):
            open_source(ds, mode)
    with pytest.raises(ValueError):
        npyfeed.WindowSource.from_arrays(ds.index, {**ds.factors, "key01": np.zeros((10, 3), dtype)}, ds.labels, 3)


@pytest.mark.parametrize("mode", ["read", "direct"])
def test_file_truncated_after_opening(tmp_path, mode):
    """A file that shrinks under a running job: the gather raises naming the file, it never returns garbage; an
    epoch refuses it at its start (FileChangedError)."""
    ds = many_keys_dataset(tmp_path, 3)
    src = open_source(ds, mode)
    path = ds.factor_dir / "key01.npy"
    with open(path, "r+b") as fh:
        fh.truncate(130)
    # A read short of the data, or (direct: the file opened again for the read) the change itself.
    with pytest.raises((npyfeed.NpyFormatError, npyfeed.FileChangedError), match="key01.npy"):
        src.get([1])
    with pytest.raises(npyfeed.FileChangedError, match="truncated") as info:
        list(src.batches(1, prefetch=3))
    assert info.value.filename == str(path)
    assert_batch(src.get([0, 2]), reference(ds, [ds.entries[0], ds.entries[2]], "float32"))
