"""Write the fuzzer's seed corpus: `.npy` headers as numpy writes them, plus a few malformed ones.

    python tests/fuzz/make_seeds.py OUT_DIR

Valid seeds come from numpy.lib.format itself (many dtypes, shapes, memory orders and all three format
versions), so the fuzzer starts from what real files look like. Seeds whose first byte is not 0x93 feed the
target's second mode: the rest of the seed is the text of one header value (see fuzz_npy_header.cpp).
Deterministic: the same numpy writes the same seeds.
"""

from __future__ import annotations

import io
import sys
import warnings
from pathlib import Path

import numpy as np
from numpy.lib import format as npformat

DTYPES = [
    "?", "i1", "<i2", ">i2", "<i4", ">i4", "<i8", ">i8", "u1", "<u2", ">u4", "<u8",
    "<f2", ">f2", "<f4", ">f4", "<f8", ">f8", "<c8", ">c16", "S5", "<U3", ">U2", "V7",
    "<M8[ns]", ">m8[s]", "<M8[D]", "<M8", np.longdouble, np.clongdouble,
    np.dtype([("a", "<i4"), ("b", ">f8")]),
    np.dtype([("a", "u1"), ("b", "<i8")], align=True),  # padding: '' void fields in the descr
    np.dtype([("x", "<f4", (2, 3)), ("y", [("p", "<i2"), ("q", "S3")])]),
    np.dtype({"names": ["a", "b"], "formats": ["<i4", "<f4"], "titles": ["first", "second"]}),
    np.dtype([("\u00e9t\u00e9", "<i4"), ("\u540d", "<f8")]),  # not latin-1: numpy writes version 3.0
    # Fields whose type is itself a subarray, of numbers or of (padded) structs, nested (numpy's format tests).
    np.dtype([("c", ("<f8", (5,)), (2,))]),
    np.dtype([("x", (np.dtype({"names": ["a", "b"], "formats": ["i1", "i1"], "offsets": [0, 4], "itemsize": 8}),
                     (3,)), (4,))]),
    np.dtype([("a", ((np.dtype([("a", "<i8"), ("b", [("c", ">f4", (2,))])]), (3,)), (4,)), (2,))]),
]
SHAPES = [(), (0,), (3,), (2, 3), (2, 0, 4), (1,) * 9]


def headers_from_numpy():
    """Whole small files (header and data) written by numpy in every version it can use for them."""
    for dtype in DTYPES:
        dtype = np.dtype(dtype)
        for shape in SHAPES:
            for order in ("C", "F"):
                if order == "F" and len(shape) < 2:
                    continue
                array = np.zeros(shape, dtype=dtype, order=order)
                for version in ((1, 0), (2, 0), (3, 0)):
                    buf = io.BytesIO()
                    try:
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore")
                            npformat.write_array(buf, array, version=version, allow_pickle=False)
                    except ValueError:
                        continue  # e.g. a non-latin-1 field name in version 1.0/2.0
                    yield buf.getvalue()


def header(d: dict, version=(1, 0)) -> bytes:
    """Just a header, for shapes too large to allocate."""
    buf = io.BytesIO()
    if version == (1, 0):
        npformat.write_array_header_1_0(buf, d)
    else:
        npformat.write_array_header_2_0(buf, d)
    return buf.getvalue()


def raw(text: str, major: int = 1, encoding: str = "latin1") -> bytes:
    """A preamble around any header text, padded like numpy pads it."""
    body = text.encode(encoding)
    pre = 10 if major == 1 else 12
    pad = (64 - (pre + len(body) + 1) % 64) % 64
    body += b" " * pad + b"\n"
    length = len(body).to_bytes(2 if major == 1 else 4, "little")
    return b"\x93NUMPY" + bytes([major, 0]) + length + body


def large_and_malformed():
    good = "{'descr': '<f8', 'fortran_order': False, 'shape': (3, 4), }"
    yield header({"descr": "<f8", "fortran_order": False, "shape": (2**40, 2**20)})
    yield header({"descr": "|u1", "fortran_order": True, "shape": (2**62, 2)}, (2, 0))
    yield header({"descr": "<f8", "fortran_order": False, "shape": (2**32, 2**32)})
    yield raw(good)
    yield raw(good, 2)
    yield raw(good, 3)
    yield raw(good)[:8]                                    # ends inside the preamble
    yield raw(good)[:40]                                   # ends inside the header text
    yield b"\x93NUMPY\x04\x00" + raw(good)[8:]             # unknown version
    yield b"\x93NUMPY\x01\x01" + raw(good)[8:]
    yield b"\x93NUMPZ" + raw(good)[6:]                     # bad magic
    yield b"\x93NUMPY\x02\x00\xff\xff\xff\xff{}"           # absurd header length
    yield raw(good.replace("False", "Fa\0se"))             # NUL in the text
    yield raw("{'descr': __import__('os').system('x'), 'fortran_order': False, 'shape': ()}")
    yield raw("{'descr': '<f8', 'descr': '<i4', 'fortran_order': False, 'shape': (1,)}")  # repeated key
    yield raw("{'descr': '<f8', 'shape': (1,)}")           # missing key
    yield raw("{'descr': '<f8', # comment\n 'fortran_order': False, 'shape': (1L,)}")
    yield raw("{'descr': '<f8', 'fortran_order': False, 'shape': (-1,)}")
    yield raw("{'descr': '|O', 'fortran_order': False, 'shape': (2,)}")
    yield raw("{'descr': " + "[" * 40 + "]" * 40 + ", 'fortran_order': False, 'shape': ()}")
    yield raw("{'descr': [('\u00e9', '<i4')], 'fortran_order': False, 'shape': ()}")  # latin-1 in v1
    yield raw("{'descr': [('\u540d', '<i4')], 'fortran_order': False, 'shape': ()}", 3, "utf-8")
    yield raw("{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': ()}", 3)[:-3] + b"\xff\xfe\n"
    yield raw("{'descr': '<f8', 'fortran_order': False, 'shape': (0x10, 0o7, 0b1, 1_000)}", 3)
    yield raw("{\"descr\": u'<' '>f8', \"fortran_order\": True, \"shape\": (3,\n4)}")
    yield raw("{'descr': '<f8', 'fortran_order': False, 'shape': (" + "1, " * 70 + ")}")
    long_text = "{'descr': '<f8', 'fortran_order': False, 'shape': (3," + " " * 9940 + ")}"
    yield raw("\n  " + good)                               # indented first line: refused, as by Python
    yield raw("\x0c # c\n\\\n" + good + "\n  ")            # form feed, comment, continuation; indented end
    yield raw("{'descr': ('<i4', (1,)), 'fortran_order': False, 'shape': (3,)}")  # top-level subarray
    yield raw(long_text)                                   # just under numpy's 10000 cap
    yield raw(long_text + " " * 100)                       # just over it
    # Old writers aligned the data to 16 bytes.
    body = good.encode() + b"  \n"
    yield b"\x93NUMPY\x01\x00" + len(body).to_bytes(2, "little") + body


def value_seeds():
    """Seeds for the target's second mode: selector byte, then one value's text."""
    for selector, text in [
        (0, "'<f8'"), (0, "[('a', '<i4', (2, 3)), ('b', [('c', '>f8')])]"), (0, "'<U10'"), (0, "'<M8[us]'"),
        (4, "[('\u540d', '<i4')]"), (0, "[(('title', 'name'), '|S3')]"), (0, "'|O'"),
        (0, "[('c', ('<f8', (5,)), (2,))]"), (0, "[('x', ([('a', '|i1'), ('', '|V3')], (3,)), [4])]"),
        (0, "('<i4', ())"), (0, "(('>f8', 1), (1, 1))"), (0, "[('a', ('<i4', (2,), 'x'))]"),
        (1, "(3, 4)"), (1, "()"), (1, "(0, 9223372036854775807)"), (1, "(2,)*3"), (1, "(1L, 2L)"),
        (2, "True"), (2, "False"), (2, "None"), (2, "1"),
    ]:
        yield bytes([selector]) + text.encode("utf-8")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    seeds = list(dict.fromkeys([*headers_from_numpy(), *large_and_malformed(), *value_seeds()]))
    for i, seed in enumerate(seeds):
        (out / f"seed-{i:04d}").write_bytes(seed)
    print(f"{len(seeds)} seeds in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
