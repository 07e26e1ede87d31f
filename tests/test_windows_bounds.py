"""Window shapes (1-d labels, 3-d factors and labels) and the bounds policies: error (naming file, line, key
and rows), skip (dropped and counted), pad (zero rows), extreme feature indexes.

The numpy reference and the data sets: windows_data.py."""


from __future__ import annotations

import npyfeed
import numpy as np
import pytest
from windows_data import (
    FILE_MODES,
    MODES,
    OUT_DTYPES,
    assert_batch,
    check_epoch,
    open_source,
    random_entries,
    reference,
    sample_values,
    write_dataset,
)

# ----------------------------------------------------------------------------------------------------------
# Shapes: 1-d labels, 3-d factors, 3-d labels


@pytest.mark.parametrize("mode", MODES)
def test_1d_labels_and_3d_factors(tmp_path, mode):
    rng = np.random.default_rng(21)
    factors = {k: sample_values(rng, "<f8", (int(rng.integers(20, 40)), 3, 4)) for k in ("p", "q", "r")}
    labels = {k: sample_values(rng, "<i4", (len(v),)) for k, v in factors.items()}
    entries = random_entries(rng, factors, labels, 5, per_key=8)
    ds = write_dataset(tmp_path, factors, labels, entries, 5)
    src = open_source(ds, mode)
    assert src.x_shape == (5, 3, 4) and src.y_shape == ()
    x, y = src.get(np.arange(len(src)))
    assert x.shape == (len(entries), 5, 3, 4) and y.shape == (len(entries),)
    assert_batch((x, y), reference(ds, entries, "float32"))
    check_epoch(src, ds, "float32", 5, shuffle=True, seed=1)


@pytest.mark.parametrize("mode", MODES)
def test_3d_labels_with_padding(tmp_path, mode):
    rng = np.random.default_rng(22)
    factors = {"a": sample_values(rng, "<f4", (12, 3, 2)), "b": sample_values(rng, "<u2", (9, 3, 2))}
    labels = {"a": sample_values(rng, "<f2", (12, 2, 2)), "b": sample_values(rng, "<f2", (5, 2, 2))}
    entries = [(0, 0, "a"), (11, 11, "a"), (13, 12, "a"), (3, 4, "b"), (8, 5, "b"), (-1, -1, "b"), (2, 2, "b")]
    ds = write_dataset(tmp_path, factors, labels, entries, 4)
    src = open_source(ds, mode, bounds="pad", dtype="float64")
    assert src.x_shape == (4, 3, 2) and src.y_shape == (2, 2)
    assert_batch(src.get(np.arange(len(entries))), reference(ds, entries, "float64"))
    check_epoch(src, ds, "float64", 3, shuffle=True, seed=2)


def test_fortran_3d_factor_is_refused(tmp_path):
    rng = np.random.default_rng(23)
    factors = {"a": np.asfortranarray(rng.standard_normal((10, 2, 3)))}
    labels = {"a": rng.standard_normal((10, 1))}
    ds = write_dataset(tmp_path, factors, labels, [(5, 1, "a")], 3, fortran=True)
    for mode in FILE_MODES:
        with pytest.raises(ValueError, match="a.npy.*Fortran"):
            open_source(ds, mode)
    # In memory, Fortran arrays of any rank are copied to C order first.
    assert_batch(open_source(ds, "arrays").get([0]), reference(ds, ds.entries, "float32"))


# ----------------------------------------------------------------------------------------------------------
# bounds=


@pytest.fixture
def bounds_dataset(tmp_path):
    """Key 'a': 30 factor rows, 25 label rows; key 'b': 12 and 12. W=5. Good and bad lines mixed; line 2 is blank
    (so index lines and sample numbers differ)."""
    rng = np.random.default_rng(31)
    factors = {"a": sample_values(rng, "<f4", (30, 4)), "b": sample_values(rng, "<f8", (12, 4))}
    labels = {"a": sample_values(rng, "<f4", (25, 2)), "b": sample_values(rng, "<f8", (12, 2))}
    entries = [
        (10, 3, "a"),   # ok
        (2, 3, "a"),    # window starts before row 0: rows [-2, 3)
        (29, 24, "a"),  # ok: last factor row, last label row
        (30, 0, "a"),   # ends one past the last row
        (-3, 1, "a"),   # entirely before
        (40, 2, "a"),   # entirely after
        (12, 25, "a"),  # label row past the end
        (12, -1, "a"),  # negative label row
        (11, 4, "a"),   # ok, overlaps the bad ones around it
        (4, 0, "b"),    # ok: first full window
        (0, 11, "b"),   # starts before row 0
        (11, 11, "b"),  # ok
        (13, 12, "b"),  # both out
        (9, 5, "a"),    # ok
    ]
    good = [0, 2, 8, 9, 11, 13]
    lines = [f"{fi},{li},{key}" for fi, li, key in entries]
    text = lines[0] + "\n\n" + "\n".join(lines[1:]) + "\n"
    ds = write_dataset(tmp_path, factors, labels, entries, 5, index_text=text)
    ds.good = good
    return ds


def _line_of(sample_position: int) -> int:
    return 1 if sample_position == 0 else sample_position + 2  # line 2 is blank


@pytest.mark.parametrize("mode", MODES)
def test_bounds_error_names_file_line_key_and_rows(bounds_dataset, mode):
    ds = bounds_dataset
    with pytest.raises(IndexError) as info:
        open_source(ds, mode)
    message = str(info.value)
    # The first bad line: sample 1, (2, 3, 'a'), on line 3.
    assert f"{ds.index}:3:" in message
    assert "'a'" in message
    assert "[-2, 3)" in message
    if mode != "arrays":
        assert str(ds.factor_dir / "a.npy") in message


@pytest.mark.parametrize("position", [1, 3, 4, 5, 6, 7, 10, 12])
def test_bounds_error_for_each_kind_of_bad_line(tmp_path, bounds_dataset, position):
    ds = bounds_dataset
    fi, li, key = ds.entries[position]
    good_lines = [f"{e[0]},{e[1]},{e[2]}" for i, e in enumerate(ds.entries) if i in ds.good]
    index = tmp_path / "one_bad.txt"
    index.write_text("\n".join(good_lines[:3] + [f"  {fi} , {li} , {key}  "] + good_lines[3:]) + "\n")
    with pytest.raises(IndexError) as info:
        npyfeed.WindowSource(index, ds.factor_dir, ds.label_dir, 5, mode="read")
    message = str(info.value)
    assert f"{index}:4:" in message
    assert f"'{key}'" in message
    rows = len(ds.factors[key])
    if fi - 4 < 0 or fi >= rows:
        assert f"[{fi - 4}, {fi + 1})" in message
        assert f"{rows} rows" in message
    else:
        assert f"label row {li}" in message
        assert str(ds.label_dir / f"{key}.npy") in message
    with pytest.raises(IndexError, match=rf"<index list>:1: key '{key}'"):
        npyfeed.WindowSource.from_arrays([(fi, li, key)], ds.factors, ds.labels, 5)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("out", OUT_DTYPES)
def test_bounds_skip_drops_and_counts(bounds_dataset, mode, out):
    ds = bounds_dataset
    src = open_source(ds, mode, bounds="skip", dtype=out)
    good = [ds.entries[i] for i in ds.good]
    assert len(src) == len(good)
    assert src.skipped == len(ds.entries) - len(good)
    for sample, position in enumerate(ds.good):
        fi, li, key = ds.entries[position]
        assert src.describe(sample) == (f"{ds.index}:{_line_of(position)}: key '{key}', feature_index {fi}, "
                                        f"label_index {li}")
    for bad in (len(good), -1):
        with pytest.raises(IndexError):
            src.describe(bad)
    assert_batch(src.get(np.arange(len(good))), reference(ds, good, out))
    for shuffle in (False, True):
        check_epoch(src, ds, out, 4, entries=good, shuffle=shuffle, seed=8)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("out", OUT_DTYPES)
def test_bounds_pad_zero_fills(bounds_dataset, mode, out):
    ds = bounds_dataset
    src = open_source(ds, mode, bounds="pad", dtype=out)
    assert len(src) == len(ds.entries) and src.skipped == 0
    x, y = src.get(np.arange(len(ds.entries)))
    assert_batch((x, y), reference(ds, ds.entries, out))
    assert np.all(x[1, :2] == 0) and np.all(x[5] == 0) and np.all(y[6] == 0) and np.all(y[7] == 0)
    assert np.any(x[1, 2:] != 0)  # the rows inside the array are real
    for shuffle in (False, True):
        check_epoch(src, ds, out, 3, shuffle=shuffle, seed=9)
    # Alone in a gather, each padded sample is its own merge group.
    for i in range(len(ds.entries)):
        assert_batch(src.get([i]), reference(ds, [ds.entries[i]], out))


@pytest.mark.parametrize("feature", [-2**63, -2**63 + 1])
def test_bounds_error_for_extreme_feature_index(feature):
    factors = {"a": np.ones((20, 2), np.float32)}
    labels = {"a": np.ones((20,), np.float32)}
    with pytest.raises(IndexError, match="key 'a'"):
        npyfeed.WindowSource.from_arrays([(feature, 0, "a")], factors, labels, 3)
    src = npyfeed.WindowSource.from_arrays([(feature, 0, "a"), (5, 0, "a")], factors, labels, 3, bounds="skip")
    assert len(src) == 1 and src.skipped == 1


@pytest.mark.parametrize("feature", [2**63 - 1, 2**63 - 3, 2**62, -2**62])
def test_huge_feature_index(feature):
    factors = {"a": np.arange(40, dtype=np.float32).reshape(20, 2) + 1}
    labels = {"a": np.ones((20,), np.float32)}
    with pytest.raises(IndexError, match="key 'a'"):
        npyfeed.WindowSource.from_arrays([(feature, 0, "a")], factors, labels, 3)
    skip = npyfeed.WindowSource.from_arrays([(feature, 0, "a"), (5, 0, "a")], factors, labels, 3, bounds="skip")
    assert len(skip) == 1 and skip.skipped == 1
    pad = npyfeed.WindowSource.from_arrays([(feature, 0, "a"), (5, 0, "a")], factors, labels, 3, bounds="pad")
    x, y = pad.get([0, 1])
    assert np.all(x[0] == 0) and np.array_equal(x[1], factors["a"][3:6])
