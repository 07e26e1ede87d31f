"""The `.npy` header, read by `read_header` and by the pure parser `_core.parse_header_bytes`, against numpy's
own reading; and hand-written headers that numpy accepts (any key order, quoting, spacing, Python 2 longs,
old alignments, latin-1 and utf-8 field names), loaded in every mode."""

from __future__ import annotations

import os

import npyfeed
import numpy as np
import pytest
from npyfeed import _core

MODES = ("auto", "mmap", "read", "direct")
VERSIONS = [(1, 0), (2, 0), (3, 0)]

DTYPES = [
    ("f8-le", np.dtype("<f8")),
    ("i2-be", np.dtype(">i2")),
    ("bool", np.dtype("?")),
    ("U3-be", np.dtype(">U3")),
    ("M8ns", np.dtype("<M8[ns]")),
    ("struct-subarray", np.dtype([("id", "<i4"), ("pos", ">f8", (2, 3)), ("tag", "S3")])),
    ("struct-padded", np.dtype({"names": ["a", "b"], "formats": ["<i4", "<f8"], "offsets": [0, 16],
                                "itemsize": 32})),
]
SHAPES = [("0d", (), "C"), ("empty", (0,), "C"), ("0x3", (0, 3), "C"), ("3d", (2, 3, 4), "C"),
          ("2d-F", (3, 5), "F")]


def numpy_header(path):
    """What numpy's format module reads from the header: (version, shape, fortran_order, dtype, data_offset)."""
    with open(path, "rb") as fp:
        version = np.lib.format.read_magic(fp)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran_order, dtype = read(fp)  # ascii headers here, so 2.0's latin-1 reads 3.0 too
        return version, shape, fortran_order, dtype, fp.tell()


@pytest.mark.parametrize("version", VERSIONS, ids=["v1", "v2", "v3"])
@pytest.mark.parametrize("shape, order", [(s, o) for _, s, o in SHAPES], ids=[i for i, _, _ in SHAPES])
@pytest.mark.parametrize("dtype", [d for _, d in DTYPES], ids=[i for i, _ in DTYPES])
def test_read_header_matches_numpy(tmp_path, write_npy, dtype, shape, order, version):
    array = np.zeros(shape, dtype, order=order)
    path = write_npy(tmp_path / "a.npy", array, version)
    np_version, np_shape, np_fortran, np_dtype, np_offset = numpy_header(path)
    header = npyfeed.read_header(path)
    assert isinstance(header, npyfeed.Header)
    assert header.version == np_version == version
    assert header.shape == np_shape == shape
    assert header.fortran_order == np_fortran == (order == "F")
    assert header.dtype == np_dtype and header.dtype.str == np_dtype.str
    assert header.dtype.descr == np_dtype.descr
    assert header.data_offset == np_offset
    assert header.data_offset % 64 == 0
    assert header.nbytes == array.nbytes
    assert header.file_size == os.path.getsize(path)

    # The pure parser gives the same from the header bytes alone, or from the whole file.
    data = path.read_bytes()
    for prefix in (data[:header.data_offset], data):
        parsed = _core.parse_header_bytes(prefix, 10000)
        assert parsed["shape"] == header.shape
        assert parsed["dtype"] == header.dtype
        assert parsed["fortran_order"] == header.fortran_order
        assert parsed["version"] == header.version
        assert parsed["data_offset"] == header.data_offset
        assert parsed["nbytes"] == header.nbytes


# ----------------------------------------------------------------------------------------------------------
# Hand-written headers: the variety numpy's reader accepts, not only what its writer produces


def npy_bytes(header: str, data: bytes = b"", version=(1, 0), align: int = 64) -> bytes:
    """A `.npy` file with header text `header`, padded with spaces and a newline so the data is `align`-aligned."""
    text = header.encode("utf8" if version[0] == 3 else "latin1")
    preamble = 10 if version[0] == 1 else 12
    text += b" " * ((-(preamble + len(text) + 1)) % align) + b"\n"
    length = len(text).to_bytes(2 if version[0] == 1 else 4, "little")
    return b"\x93NUMPY" + bytes(version) + length + text + data


_I4x6 = np.arange(6, dtype="<i4").tobytes()
_F8x6 = np.linspace(-1, 1, 6).astype("<f8").tobytes()
_REC = np.arange(48, dtype="u1").tobytes()

HANDWRITTEN = [
    # id, header text, data, version, alignment
    ("keys-reordered", "{'shape': (2, 3), 'fortran_order': False, 'descr': '<i4'}", _I4x6, (1, 0), 64),
    ("double-quotes", '{"descr": "<i4", "fortran_order": False, "shape": (2, 3)}', _I4x6, (1, 0), 64),
    ("compact", "{'descr':'<i4','fortran_order':False,'shape':(2,3)}", _I4x6, (1, 0), 64),
    ("spaces-tabs-newlines", "{ 'descr' :\t'<i4' ,\n 'fortran_order' : False , 'shape' : ( 2 , 3 , ) , }",
     _I4x6, (2, 0), 64),
    # Python 2 writers: np.load accepts the L suffix in 1.0/2.0 files (with a UserWarning, filtered below).
    ("python2-longs", "{'descr': '<i4', 'fortran_order': False, 'shape': (2L, 3L), }", _I4x6, (1, 0), 64),
    ("one-tuple", "{'descr': '<i4', 'fortran_order': False, 'shape': (6,), }", _I4x6, (1, 0), 64),
    ("zero-d", "{'descr': '<i4', 'fortran_order': False, 'shape': (), }", _I4x6[:4], (1, 0), 64),
    ("fortran-2d", "{'descr': '<f8', 'fortran_order': True, 'shape': (2, 3), }", _F8x6, (1, 0), 64),
    ("fortran-1d", "{'descr': '<f8', 'fortran_order': True, 'shape': (6,), }", _F8x6, (1, 0), 64),
    ("fortran-0d", "{'descr': '<f8', 'fortran_order': True, 'shape': (), }", _F8x6[:8], (1, 0), 64),
    ("fortran-empty", "{'descr': '<f8', 'fortran_order': True, 'shape': (0, 3), }", b"", (1, 0), 64),
    ("old-writer-16-aligned", "{'descr': '<f8', 'fortran_order': False, 'shape': (6,), }", _F8x6, (1, 0), 16),
    ("bare-typestr", "{'descr': 'i4', 'fortran_order': False, 'shape': (6,), }", _I4x6, (1, 0), 64),
    ("native-order-typestr", "{'descr': '=i4', 'fortran_order': False, 'shape': (6,), }", _I4x6, (1, 0), 64),
    ("bool-b1", "{'descr': '|b1', 'fortran_order': False, 'shape': (2,), }", b"\x01\x00", (1, 0), 64),
    ("timedelta-days", "{'descr': '<m8[D]', 'fortran_order': False, 'shape': (3,), }", _I4x6, (1, 0), 64),
    ("latin1-field-name", "{'descr': [('caf\xe9', '<i4'), ('b', '>f8')], 'fortran_order': False, 'shape': (4,), }",
     _REC, (1, 0), 64),
    ("utf8-field-names", "{'descr': [('漢字', '<i4'), ('😀', '<f8')], 'fortran_order': False, 'shape': (4,), }",
     _REC, (3, 0), 64),
    ("field-titles", "{'descr': [(('my title', 'a'), '<i4'), ('b', '<f8')], 'fortran_order': False, "
     "'shape': (4,), }", _REC, (1, 0), 64),
    ("padding-field", "{'descr': [('a', '<i4'), ('', '|V4'), ('b', '<f8')], 'fortran_order': False, "
     "'shape': (3,), }", _REC, (1, 0), 64),
    ("subarray-int-shape", "{'descr': [('a', '<i2', 3)], 'fortran_order': False, 'shape': (4,), }",
     _REC[:24], (1, 0), 64),
]


_PY2_WARNING = "ignore:Reading `.npy` or `.npz` file required additional header parsing:UserWarning"


@pytest.mark.parametrize("text, data, version, align", [
    pytest.param(*c[1:], id=c[0], marks=[pytest.mark.filterwarnings(_PY2_WARNING)] if "L," in c[1] else [])
    for c in HANDWRITTEN])
def test_handwritten_header(tmp_path, assert_same_as_np_load, text, data, version, align):
    path = tmp_path / "a.npy"
    path.write_bytes(npy_bytes(text, data, version, align))
    expected = np.load(path)
    header = npyfeed.read_header(path)
    assert header.shape == expected.shape and header.dtype == expected.dtype
    assert header.version == version
    assert header.data_offset % align == 0
    for mode in MODES:
        array = npyfeed.load(path, mode=mode)
        try:
            assert_same_as_np_load(array, path, expected=expected)
        except AssertionError as e:
            raise AssertionError(f"mode={mode!r}: {e}") from None


@pytest.mark.parametrize("mode", MODES)
def test_unaligned_data_offset(tmp_path, assert_same_as_np_load, mode):
    # A hand-made file whose data starts at an odd offset: values must still be right in every mode
    # (a zero-copy view is then unaligned, as np.load(mmap_mode="r") would be).
    path = tmp_path / "a.npy"
    text = "{'descr': '<f8', 'fortran_order': False, 'shape': (6,), }"
    text += " " * (len(text) % 2)  # 10 bytes of preamble + text + newline: an odd offset
    path.write_bytes(npy_bytes(text, _F8x6, align=1))
    header = npyfeed.read_header(path)
    assert header.data_offset % 2 == 1
    assert_same_as_np_load(npyfeed.load(path, mode=mode), path, check_aligned=mode in ("read", "auto"))


@pytest.mark.parametrize("version", VERSIONS, ids=["v1", "v2", "v3"])
def test_field_names_needing_escapes(tmp_path, write_npy, assert_same_as_np_load, version):
    names = ["it's", 'say "hi"', "back\\slash", "tab\there", "nul\x00byte", "new\nline", "ünï"]
    dtype = np.dtype([(name, "<i2") for name in names])
    path = write_npy(tmp_path / "a.npy", np.arange(3 * len(names), dtype="<i2").view(dtype), version)
    for mode in MODES:
        array = npyfeed.load(path, mode=mode)
        assert array.dtype.names == tuple(names)
        assert_same_as_np_load(array, path)


def _many_fields(n: int) -> np.dtype:
    return np.dtype([(f"field_{i:05d}", "<i2") for i in range(n)])


@pytest.mark.parametrize("version", VERSIONS, ids=["v1", "v2", "v3"])
def test_header_longer_than_first_read(tmp_path, write_npy, assert_same_as_np_load, version):
    # Over 4 KiB of header (the first read) but under numpy's 10000 limit.
    path = write_npy(tmp_path / "a.npy", np.zeros(5, _many_fields(300)), version)
    header = npyfeed.read_header(path)
    assert 4096 < header.data_offset < 10000
    for mode in MODES:
        assert_same_as_np_load(npyfeed.load(path, mode=mode), path)


@pytest.mark.parametrize("version", VERSIONS, ids=["v1", "v2", "v3"])
def test_max_header_size(tmp_path, write_npy, assert_same_as_np_load, version):
    path = write_npy(tmp_path / "a.npy", np.ones(5, _many_fields(1200)), version)
    with pytest.raises(ValueError):  # numpy's own limit
        np.load(path)
    with pytest.raises(npyfeed.NpyFormatError, match="max_header_size") as excinfo:
        npyfeed.read_header(path)
    assert excinfo.value.path == str(path)
    with pytest.raises(npyfeed.NpyFormatError):
        npyfeed.load(path)
    with pytest.raises(npyfeed.NpyFormatError):
        _core.parse_header_bytes(path.read_bytes(), 10000)

    header = npyfeed.read_header(path, max_header_size=100_000)
    assert header.data_offset > 10000
    expected = np.load(path, max_header_size=100_000)
    assert _core.parse_header_bytes(path.read_bytes(), 100_000)["dtype"] == expected.dtype
    for mode in MODES:
        array = npyfeed.load(path, mode=mode, max_header_size=100_000)
        assert_same_as_np_load(array, path, expected=expected)
    store = npyfeed.load_factor_files([path], {}, max_header_size=100_000)
    assert_same_as_np_load(store["a"], path, expected=expected)


def test_header_cap_counts_characters_in_v3(tmp_path, write_npy):
    # numpy's limit is on characters: 3500 three-byte characters are 10500 bytes but 3500 characters.
    name = "漢" * 3500
    path = write_npy(tmp_path / "a.npy", np.arange(2, dtype="<i4").view([(name, "<i4")]), (3, 0))
    assert npyfeed.read_header(path).data_offset > 10000
    expected = np.load(path)  # under the default max_header_size
    array = npyfeed.load(path)
    assert array.dtype.names == (name,)
    np.testing.assert_array_equal(array, expected)


def test_data_after_the_array_is_ignored(tmp_path, assert_same_as_np_load):
    # np.load reads exactly prod(shape) items; trailing bytes (appended by some writers) do not matter.
    path = tmp_path / "a.npy"
    path.write_bytes(npy_bytes("{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }", _I4x6))
    header = npyfeed.read_header(path)
    assert header.file_size == header.data_offset + 24 and header.nbytes == 12
    for mode in MODES:
        assert_same_as_np_load(npyfeed.load(path, mode=mode), path)
