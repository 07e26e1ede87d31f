"""numpy's own `.npy` format test arrays, saved with ``np.save`` and loaded in every mode, against ``np.load``.

The arrays come from the installed numpy's test module (``numpy.lib.tests.test_format``: ``basic_arrays``,
``record_arrays`` and the dtypes of ``test_descr_to_dtype``) when it is installed, else from the copy below,
so the test never silently runs nothing; where both exist, the copy is checked against numpy's. Plus the
zero-itemsize view of numpy's ``test_zero_width_string``. Also: nested subarray fields through
``read_header`` (with error offsets at the offending field) and ``WindowSource`` refusing them.
"""

from __future__ import annotations

import warnings

import npyfeed
import numpy as np
import pytest
from conftest import NUMPY_2

MODES = ("read", "mmap", "direct", "load_many")


def _copied_cases() -> list:
    """The arrays of numpy/lib/tests/test_format.py (numpy 2.4), without the object ones (never loaded)."""
    basic = []
    for scalar in (np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32, np.uint64, np.int64,
                   np.float32, np.float64, np.complex64, np.complex128):
        for endian in "<>":
            dtype = np.dtype(scalar).newbyteorder(endian)
            a = np.arange(1500).astype(dtype)
            basic += [np.array([], dtype=dtype), np.array(10, dtype=dtype), a, a.reshape((30, 50)),
                      a.reshape((30, 50)).T, a.reshape((30, 50))[::-1, ::2]]
    pdescr = [("x", "i4", (2,)), ("y", "f8", (2, 2)), ("z", "u1")]
    pbuffer = [([3, 2], [[6.0, 4.0], [6.0, 4.0]], 8), ([4, 3], [[7.0, 5.0], [7.0, 5.0]], 9)]
    ndescr = [("x", "i4", (2,)),
              ("Info", [("value", "c16"), ("y2", "f8"),
                        ("Info2", [("name", "S2"), ("value", "c16", (2,)), ("y3", "f8", (2,)), ("z3", "u4", (2,))]),
                        ("name", "S2"), ("z2", "b1")]),
              ("color", "S2"), ("info", [("Name", "U8"), ("Value", "c16")]), ("y", "f8", (2, 2)), ("z", "u1")]
    nbuffer = [([3, 2], (6j, 6.0, ("nn", [6j, 4j], [6.0, 4.0], [1, 2]), "NN", True), "cc", ("NN", 6j),
                [[6.0, 4.0], [6.0, 4.0]], 8),
               ([4, 3], (7j, 7.0, ("oo", [7j, 5j], [7.0, 5.0], [2, 1]), "OO", False), "dd", ("OO", 7j),
                [[7.0, 5.0], [7.0, 5.0]], 9)]
    records = [np.array(pbuffer, dtype=np.dtype(pdescr).newbyteorder("<")),
               np.array(nbuffer, dtype=np.dtype(ndescr).newbyteorder("<")),
               np.array(pbuffer, dtype=np.dtype(pdescr).newbyteorder(">")),
               np.array(nbuffer, dtype=np.dtype(ndescr).newbyteorder(">")),
               np.zeros(1, dtype=[("c", ("<f8", (5,)), (2,))])]
    padded = np.dtype({"names": ["a", "b"], "formats": ["i1", "i1"], "offsets": [0, 4], "itemsize": 8})
    descr_dtypes = [
        np.dtype([("a", np.int8), ("b", np.int16), ("c", np.int32)], align=True),
        np.dtype([("x", np.dtype((padded, (3,))), (4,))]),
        np.dtype([("x", ("<f8", (5,)), (2,))]),
        np.dtype([("x", np.dtype((np.dtype((padded, (3,))), (4,))))]),
        np.dtype([("a", np.dtype((np.dtype((np.dtype((np.dtype([("a", int), ("b", padded)]), (3,))), (4,))), (5,))))]),
    ]
    return ([(f"basic-{i}", a) for i, a in enumerate(basic)] + [(f"record-{i}", a) for i, a in enumerate(records)]
            + [(f"descr-{i}", np.zeros(3, d)) for i, d in enumerate(descr_dtypes)])


def _numpy_cases():
    """The same from the installed numpy's test module, or None where it is not installed."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. pytest's warning about numpy's own marks
            from numpy.lib.tests import test_format
    except (Exception, pytest.fail.Exception):  # noqa: BLE001 - not installed or not importable (e.g. an
        return None                                # unknown mark under --strict-markers): use the copy
    basic = [a for a in test_format.basic_arrays if not a.dtype.hasobject]
    marks = [m for m in getattr(test_format.test_descr_to_dtype, "pytestmark", []) if m.name == "parametrize"]
    descr_dtypes = list(marks[0].args[1]) if marks else []
    return ([(f"basic-{i}", a) for i, a in enumerate(basic)]
            + [(f"record-{i}", a) for i, a in enumerate(test_format.record_arrays)]
            + [(f"descr-{i}", np.zeros(3, d)) for i, d in enumerate(descr_dtypes)])


def _zero_width_view() -> np.ndarray:
    # numpy's test_zero_width_string: a view of an 'S0' field, itemsize 0, reshaped.
    return np.zeros(4, dtype=[("I", int), ("S", "S0")])["S"].reshape(2, 2)


COPIED = _copied_cases()
INSTALLED = _numpy_cases()
CASES = (INSTALLED if INSTALLED is not None else COPIED) + [("zero-width", _zero_width_view())]


def test_there_are_cases():
    assert len(CASES) >= 155
    # Fields whose type is itself a (descr, shape) subarray, of numbers and of structs.
    nested = [field[1] for _, a in CASES if a.dtype.names for field in a.dtype.descr if isinstance(field[1], tuple)]
    assert any(isinstance(t[0], str) for t in nested) and any(isinstance(t[0], list) for t in nested)


@pytest.mark.skipif(INSTALLED is None, reason="numpy's test module is not installed")
@pytest.mark.skipif(not NUMPY_2, reason="the copy is of numpy 2's test module; numpy 1.x's has other cases")
def test_the_copy_matches_numpy():
    assert [i for i, _ in COPIED] == [i for i, _ in INSTALLED]
    for (case_id, ours), (_, theirs) in zip(COPIED, INSTALLED):
        assert ours.dtype == theirs.dtype and ours.dtype.descr == theirs.dtype.descr, case_id
        assert ours.shape == theirs.shape and ours.strides == theirs.strides, case_id
        assert ours.tobytes() == theirs.tobytes(), case_id


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict:
    directory = tmp_path_factory.mktemp("numpy-format")
    paths = {}
    for case_id, array in CASES:
        paths[case_id] = directory / f"{case_id}.npy"
        np.save(paths[case_id], array, allow_pickle=False)
    return paths


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case_id", [i for i, _ in CASES])
def test_load_matches_np_load(saved, assert_same_as_np_load, case_id, mode):
    path = saved[case_id]
    array = npyfeed.load_many([path])[0] if mode == "load_many" else npyfeed.load(path, mode=mode)
    assert_same_as_np_load(array, path)


@pytest.mark.parametrize("case_id", [i for i, _ in CASES])
def test_read_header_matches_np_load(saved, case_id):
    expected = np.load(saved[case_id])
    header = npyfeed.read_header(saved[case_id])
    assert header.dtype == expected.dtype and header.dtype.descr == expected.dtype.descr
    assert header.shape == expected.shape and header.nbytes == expected.nbytes


def _raw_npy(path, descr_text: str, shape=(1,), data: bytes = b"") -> bytes:
    text = f"{{'descr': {descr_text}, 'fortran_order': False, 'shape': {shape!r}, }}"
    text += " " * (-(10 + len(text) + 1) % 64) + "\n"
    blob = b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text.encode("latin-1")
    path.write_bytes(blob + data)
    return blob


@pytest.mark.parametrize(("descr_text", "bad"), [
    ("[('a', '<i4'), ('c', ('<f8', (5,)), (2,)), ('d', ('<f8', (-5,)))]", "-5"),
    ("[('a', [('b', ('<i4', (2,))), ('o', ('|O', (3,)))])]", "'|O'"),
    ("[('a', ([('x', '<i3')], (2,)), (4,))]", "'<i3'"),
    ("[('a', ('<f8',))]", "('<f8',)"),
    ("[('a', ('<f8', (2,)), ('x',))]", "'x'"),
    ("('<i4', (2,))", "('<i4'"),
])
def test_errors_point_at_the_offending_field(tmp_path, descr_text, bad):
    path = tmp_path / "bad.npy"
    blob = _raw_npy(path, descr_text, data=bytes(1024))
    for call in (npyfeed.read_header, npyfeed.load):
        with pytest.raises(npyfeed.NpyFormatError) as info:
            call(path)
        assert info.value.offset == blob.index(bad.encode()), info.value
        assert f"at byte {info.value.offset}" in str(info.value)
    with pytest.raises(Exception):  # noqa: B017 - numpy refuses each of them too, with various types
        np.load(path)


def test_window_source_refuses_nested_fields_cleanly(tmp_path):
    factor_dir, label_dir = tmp_path / "factor", tmp_path / "label"
    factor_dir.mkdir()
    label_dir.mkdir()
    np.save(factor_dir / "k.npy", np.zeros(10, dtype=[("c", ("<f8", (5,)), (2,))]))
    np.save(label_dir / "k.npy", np.zeros((10, 1), np.float32))
    index = tmp_path / "index.txt"
    index.write_text("5,5,k\n")
    with pytest.raises(ValueError, match="cannot be converted to float") as info:
        npyfeed.WindowSource([index], factor_dir, label_dir, window=2)
    assert str(factor_dir / "k.npy") in str(info.value)
