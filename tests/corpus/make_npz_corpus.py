"""A hostile-input corpus of `.npz` archives, generated in code (no committed binaries): issue 12 item 5.

Every case is an archive's bytes, what npyfeed must do (``"accept"`` or an exception type name) and, where npyfeed
refuses an archive that ``np.load`` (Python's zipfile) may read, why (``differs``; also in DIFFERENCES.md).
numpy's outcome is not recorded: ``tests/test_hostile_npz.py`` runs ``dict(np.load(path))`` on each case, since
zipfile's checks change between Python versions (overlapping entries are refused from 3.12 on, for instance).

Refusals name the archive (the exception's ``path``/``filename``) and, where there is one, the member (`says`).

Usage::

    python tests/corpus/make_npz_corpus.py OUTDIR       # write every case to OUTDIR/<id>.npz and list them
"""

from __future__ import annotations

import argparse
import io
import struct
import sys
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

ACCEPT = "accept"
NPYFORMAT = "NpyFormatError"


@dataclass(frozen=True)
class Case:
    id: str
    expect: str
    data: bytes
    says: str = ""  # a word the message must contain (lower case): the member's name, or the problem
    differs: str = ""
    needs_zlib: bool = False

    @property
    def accepted(self) -> bool:
        return self.expect == ACCEPT


@dataclass
class Member:
    """One member as `zip_bytes` writes it; the fields after `content` break it on purpose."""

    name: str
    content: bytes
    deflate: bool = False
    local_name: Optional[str] = None  # a different name in the local header
    zip64_local: bool = True  # np.savez writes a ZIP64 extra field in every local header (force_zip64)
    zip64_central: bool = False
    descriptor: bool = False  # sizes in a data descriptor after the data (flag bit 3)
    crc: Optional[int] = None
    usize: Optional[int] = None  # announced uncompressed size
    csize: Optional[int] = None  # announced compressed size
    flags: int = 0
    method: Optional[int] = None
    offset: Optional[int] = None  # where the central entry says the local header is
    write_local: bool = True
    extra_central: bytes = field(default=b"")


def deflated(data: bytes) -> bytes:
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush()


def npy_of(array: np.ndarray, version=None) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array, version=version, allow_pickle=True)
    return buf.getvalue()


def zip_bytes(members: list, *, prefix: bytes = b"", comment: bytes = b"", entries: Optional[int] = None,
              cd_offset_delta: int = 0, zip64_end: bool = False) -> bytes:
    """An archive as Python's zipfile writes it, with control over every field."""
    out = bytearray(prefix)
    central = bytearray()
    for m in members:
        data = deflated(m.content) if m.deflate else m.content
        crc = zlib.crc32(m.content) if m.crc is None else m.crc
        usize = len(m.content) if m.usize is None else m.usize
        csize = len(data) if m.csize is None else m.csize
        method = (8 if m.deflate else 0) if m.method is None else m.method
        flags = m.flags | (0x8 if m.descriptor else 0) | (0x800 if not m.name.isascii() else 0)
        offset = len(out) - len(prefix) if m.offset is None else m.offset
        name = m.name.encode()
        if m.write_local:
            lname = (m.local_name if m.local_name is not None else m.name).encode()
            extra = struct.pack("<HHQQ", 1, 16, usize, csize) if m.zip64_local else b""
            sizes = (0, 0, 0) if m.descriptor else (crc, 0xFFFFFFFF, 0xFFFFFFFF) if m.zip64_local else (crc, csize, usize)
            out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 45, flags, method, 0, 0x21, *sizes, len(lname), len(extra))
            out += lname + extra + data
            if m.descriptor:
                out += struct.pack("<IIII", 0x08074B50, crc, csize, usize)
        extra = m.extra_central
        c_sizes = (csize, usize, offset)
        if m.zip64_central:
            extra = struct.pack("<HHQQQ", 1, 24, usize, csize, offset) + extra
            c_sizes = (0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF)
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 45, 45, flags, method, 0, 0x21, crc, c_sizes[0],
                               c_sizes[1], len(name), len(extra), 0, 0, 0, 0, c_sizes[2])
        central += name + extra
    cd_at = len(out) - len(prefix)
    out += central
    n = len(members) if entries is None else entries
    if zip64_end:
        end64_at = len(out) - len(prefix)
        out += struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, n, n, len(central), cd_at + cd_offset_delta)
        out += struct.pack("<IIQI", 0x07064B50, 0, end64_at, 1)
        out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, len(comment))
    else:
        out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, n, n, len(central), cd_at + cd_offset_delta, len(comment))
    return bytes(out + comment)


def savez(compressed: bool = False, **arrays) -> bytes:
    buf = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buf, **arrays)
    return buf.getvalue()


A = np.arange(24, dtype=np.float32).reshape(4, 6)
A_NPY = npy_of(A)


def _cases() -> list:
    cases = []

    def add(id, expect, data, **kw):
        cases.append(Case(id=id, expect=expect, data=data, **kw))

    # ---- accepted: what numpy writes, and valid zip variants Python's zipfile reads -----------------------
    add("savez_stored", ACCEPT, savez(a=A, b=np.arange(5)))
    add("savez_deflated", ACCEPT, savez(True, a=A, b=np.arange(5)), needs_zlib=True)
    add("empty_archive", ACCEPT, savez())
    add("member_v2_header", ACCEPT, zip_bytes([Member("a.npy", npy_of(A, (2, 0)))]))
    add("member_v3_header", ACCEPT, zip_bytes([Member("a.npy", npy_of(np.zeros(2, [("ü", "<i4")]), (3, 0)))]))
    add("data_descriptor", ACCEPT, zip_bytes([Member("a.npy", A_NPY, deflate=True, descriptor=True, zip64_local=False)]),
        needs_zlib=True)
    add("zip64_central_fields", ACCEPT, zip_bytes([Member("a.npy", A_NPY, zip64_central=True)]))
    add("zip64_end_record", ACCEPT, zip_bytes([Member("a.npy", A_NPY)], zip64_end=True))
    # np.load takes a file for a zip only when it starts with a zip signature: so does npyfeed.
    add("prepended_stub", NPYFORMAT, zip_bytes([Member("a.npy", A_NPY)], prefix=b"#!/bin/sh\nexit 0\n" * 3),
        says="does not start with a zip")
    add("archive_comment", ACCEPT, zip_bytes([Member("a.npy", A_NPY)], comment=b"a comment"))
    # Names are only keys, never paths (zip-slip): numpy and npyfeed both return them as keys.
    add("zip_slip_name", ACCEPT, zip_bytes([Member("../../etc/evil.npy", A_NPY)]))
    add("absolute_name", ACCEPT, zip_bytes([Member("/tmp/evil.npy", A_NPY)]))
    add("member_without_npy_suffix", ACCEPT, zip_bytes([Member("plain", A_NPY)]))
    add("trailing_bytes_in_member", ACCEPT, zip_bytes([Member("a.npy", A_NPY + b"\0" * 7)]))

    # ---- refused by both --------------------------------------------------------------------------------
    good = zip_bytes([Member("a.npy", A_NPY), Member("b.npy", A_NPY)])
    add("truncated_central_directory", NPYFORMAT, good[:-30], says="end of central directory")
    add("truncated_in_data", NPYFORMAT, good[:200], says="end of central directory")
    add("directory_entries_missing", NPYFORMAT, zip_bytes([Member("a.npy", A_NPY)], entries=2), says="truncated",
        differs="zipfile reads entries while directory bytes last; npyfeed checks the end record's entry count")
    add("directory_offset_past_end", NPYFORMAT, zip_bytes([Member("a.npy", A_NPY)], cd_offset_delta=10**6),
        says="truncated")
    add("not_a_zip", NPYFORMAT, b"PK\x03\x04" + b"\0" * 100, says="end of central directory")
    add("crc_mismatch_stored", NPYFORMAT, zip_bytes([Member("a.npy", A_NPY, crc=zlib.crc32(A_NPY) ^ 1)]),
        says="crc-32")
    add("crc_mismatch_deflated", NPYFORMAT,
        zip_bytes([Member("a.npy", A_NPY, deflate=True, crc=zlib.crc32(A_NPY) ^ 1)]), says="crc-32", needs_zlib=True)
    corrupt = bytearray(zip_bytes([Member("a.npy", A_NPY, deflate=True)]))
    corrupt[30 + 5 + 20 + 3] ^= 0xFF  # inside the deflate stream
    add("corrupt_deflate_stream", NPYFORMAT, bytes(corrupt), says="'a.npy'", needs_zlib=True)
    add("local_name_differs", NPYFORMAT, zip_bytes([Member("a.npy", A_NPY, local_name="b.npy")]), says="'a.npy'")
    add("encrypted_flag", NPYFORMAT, zip_bytes([Member("a.npy", A_NPY, flags=0x1)]), says="encrypted")
    add("object_member", NPYFORMAT, savez(o=np.array([{"a": 1}, None], dtype=object)), says="'o.npy'")
    add("member_header_leading_newline_indent", NPYFORMAT, zip_bytes([Member("a.npy", _indented_header_npy())]),
        says="'a.npy'")
    add("member_data_short", NPYFORMAT, zip_bytes([Member("a.npy", A_NPY[:-4])]), says="truncated")
    add("member_runs_into_directory", NPYFORMAT, zip_bytes([Member("a.npy", A_NPY, csize=len(A_NPY) + 40,
                                                                   usize=len(A_NPY) + 40, zip64_local=False)]),
        says="'a.npy'")
    add("deflated_longer_than_announced", NPYFORMAT,
        zip_bytes([Member("a.npy", A_NPY + b"\0" * 64, deflate=True, usize=len(A_NPY), zip64_local=False)]),
        says="'a.npy'", needs_zlib=True)
    add("deflated_shorter_than_announced", NPYFORMAT,
        zip_bytes([Member("a.npy", A_NPY, deflate=True, usize=len(A_NPY) + 64, zip64_local=False)]),
        says="'a.npy'", needs_zlib=True, differs="np.load reads only the bytes the header needs; npyfeed inflates "
                                              "every member to its announced size and checks its CRC-32")

    # ---- refused by npyfeed; Python's zipfile may read them (see `differs`) -------------------------------
    big = np.zeros(1 << 20, dtype=np.uint8)
    bomb_member = npy_of(big)
    add("zip_bomb_ratio", NPYFORMAT, zip_bytes([Member("bomb.npy", bomb_member, deflate=True, usize=1 << 40,
                                                       zip64_central=True)]), says="zip bomb",
        differs="the sizes are checked against deflate's largest ratio before anything is allocated")
    add("duplicate_member_names", NPYFORMAT, zip_bytes([Member("a.npy", A_NPY), Member("a.npy", npy_of(A * 2))]),
        says="twice", differs="zipfile reads the last of two equal names; npyfeed refuses the ambiguity")
    add("two_names_one_key", NPYFORMAT, zip_bytes([Member("a", A_NPY), Member("a.npy", npy_of(A * 2))]),
        says="both give the key", differs="np.load's dict keeps one of them; npyfeed refuses the ambiguity")
    inner = zip_bytes([Member("b.npy", A_NPY)])
    add("overlapping_members", NPYFORMAT,
        zip_bytes([Member("a.npy", inner), Member("b.npy", A_NPY, offset=30 + 5 + 20, write_local=False)]),
        says="overlaps", differs="Python's zipfile refuses overlapping entries only from 3.12 on")
    add("not_npy_member", NPYFORMAT, zip_bytes([Member("notes.txt", b"hello")]), says="'notes.txt'",
        differs="np.load returns the raw bytes of a member that is not a .npy array; npyfeed loads arrays only")
    add("bzip2_member", NPYFORMAT, _bzip2_archive(), says="compression method 12",
        differs="zipfile reads bzip2 and lzma members; np.savez never writes them")
    add("nul_in_name", NPYFORMAT, zip_bytes([Member("a\0b.npy", A_NPY)]), says="nul",
        differs="zipfile cuts a name at its NUL byte; npyfeed refuses it")
    return cases


def _indented_header_npy() -> bytes:
    """The leading-newline case of issue 12 inside a member: a v1 header text "\\n  {...}" numpy refuses."""
    text = "\n  {'descr': '<i4', 'fortran_order': False, 'shape': (2,), }"
    text += " " * (-(10 + len(text) + 1) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode() + b"\0" * 8


def _bzip2_archive() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_BZIP2) as z:
        z.writestr("a.npy", A_NPY)
    return buf.getvalue()


CASES: list = _cases()
BY_ID = {c.id: c for c in CASES}
assert len(BY_ID) == len(CASES), "duplicate case ids"


def write_all(directory: Path) -> dict:
    """Write every case to `directory`/<id>.npz; returns id -> path."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for case in CASES:
        path = directory / f"{case.id}.npz"
        path.write_bytes(case.data)
        paths[case.id] = path
    return paths


def numpy_outcome(path) -> str:
    """What ``dict(np.load(path, allow_pickle=False))`` does: "accept" or the exception type's name."""
    try:
        # An open file, closed here: np.load leaves the file it opened itself open when zipfile refuses it.
        with open(path, "rb") as f, np.load(f, allow_pickle=False) as archive:
            for key in archive.files:
                archive[key]
        return ACCEPT
    except Exception as e:  # noqa: BLE001 - the type is the outcome
        return type(e).__name__


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=Path)
    args = parser.parse_args(argv)
    for case_id, path in write_all(args.outdir).items():
        print(f"{case_id:40s} npyfeed: {BY_ID[case_id].expect:15s} numpy: {numpy_outcome(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
