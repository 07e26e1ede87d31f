"""A hostile-input corpus of `.npy` files, generated in code (no committed binaries).

Every case has an id, the file's bytes (or a builder for special files: directories, FIFOs, symlinks, ...),
what ``np.load(path, allow_pickle=False)`` does with it (decided by running numpy 2.x, written next to the case
and re-checked by ``tests/test_hostile.py::test_numpy_still_does_this``) and what npyfeed must do:

- ``"accept"``: npyfeed's array equals ``np.load``'s byte for byte, with the same dtype, shape and memory order;
- an exception name (``"NpyFormatError"``, ``"IsADirectoryError"``, ...): npyfeed raises that type, naming the file.

Where npyfeed deliberately differs from numpy (one accepts, the other refuses), ``differs`` says why; those
cases are listed in ``DIFFERENCES.md`` too.

Usage::

    python tests/corpus/make_corpus.py OUTDIR           # write every case to OUTDIR/<id>.npy, print the table
    python tests/corpus/make_corpus.py OUTDIR --check   # also run np.load on each and compare with the record
"""

from __future__ import annotations

import argparse
import io
import os
import pickle
import struct
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np

MAGIC = b"\x93NUMPY"
#: numpy's header parser is Python's ast.literal_eval, which strips leading spaces and tabs from Python 3.10 on.
PYTHON_STRIPS_INDENT = sys.version_info >= (3, 10)
NUMPY_2 = np.lib.NumpyVersion(np.__version__) >= "2.0.0"
#: The most dimensions the installed numpy's arrays can have (the format allows 64).
NUMPY_MAX_DIMS = 64 if NUMPY_2 else 32
ACCEPT = "accept"
#: numpy outcomes that are not an exception name.
NUMPY_NPZ = "npz"  # np.load returned an NpzFile, not an array
NUMPY_HANGS = "hangs"  # np.load blocks forever (never run by the checks)


@dataclass(frozen=True)
class Case:
    """One corpus file.

    Attributes
    ----------
    id : str
        Unique; also the file name (``<id>.npy``) and the pytest id.
    expect : str
        What npyfeed must do: ``"accept"`` or the name of the exception type it raises.
    numpy : str
        What ``np.load(path, allow_pickle=False)`` does: ``"accept"``, ``"npz"``, ``"hangs"`` or the exception
        type name it raised (numpy 2.4 on Python 3.11; the checks compare accept/refuse, not the exact type).
    data : bytes, optional
        The file's content, for regular files.
    build : callable, optional
        ``build(path)`` creates a special file at `path` (used when `data` is None).
    errno : str, optional
        For ``OSError`` expectations, the errno name (``"ELOOP"``).
    differs : str
        Why npyfeed deliberately differs from numpy here (empty when it does not).
    needs_non_root : bool
        The case is meaningless as root (root reads a chmod 000 file).
    says : str
        A word npyfeed's error message must contain (lower case), where the case has one to check.
    known_bug : str
        npyfeed does not meet `expect` yet: the bug (the tests mark the case as a strict xfail).
    same_as : str
        For a file npyfeed accepts and this numpy refuses: the id of a case that numpy reads as the same array
        (the oracle for this one).
    """

    id: str
    expect: str
    numpy: str
    data: Optional[bytes] = None
    build: Optional[Callable[[Path], None]] = None
    errno: str = ""
    differs: str = ""
    needs_non_root: bool = False
    says: str = ""
    known_bug: str = ""
    same_as: str = ""

    @property
    def accepted(self) -> bool:
        return self.expect == ACCEPT

    def materialize(self, directory: Path) -> Path:
        """Create this case's file in `directory` and return its path (a builder may choose another name)."""
        path = directory / f"{self.id}.npy"
        if self.data is not None:
            path.write_bytes(self.data)
            return path
        assert self.build is not None, self.id
        return self.build(path) or path


# ----------------------------------------------------------------------------------------------------------
# Builders

def header_text(descr, shape, fortran_order: bool = False) -> str:
    """The dict as numpy writes it."""
    return f"{{'descr': {descr!r}, 'fortran_order': {fortran_order!r}, 'shape': {shape!r}, }}"


def npy(text, data: bytes = b"", *, version=(1, 0), pad: bool = True, align: int = 64, length: Optional[int] = None,
        magic: bytes = MAGIC, encoding: Optional[str] = None) -> bytes:
    """Bytes of a `.npy` file with full control over every field.

    `text` (str or bytes) is the header text; with `pad` it gets numpy's padding (spaces and a final newline
    up to `align`). `length` overrides the header length field. The length field has 2 bytes for major
    version 1 and 4 bytes otherwise (also for unsupported versions).
    """
    if isinstance(text, str):
        text = text.encode(encoding or ("utf-8" if version[0] == 3 else "latin-1"))
    preamble = 10 if version[0] == 1 else 12
    if pad:
        text += b" " * (-(preamble + len(text) + 1) % align) + b"\n"
    n = len(text) if length is None else length
    field = struct.pack("<H", n) if version[0] == 1 else struct.pack("<I", n)
    return magic + bytes(version) + field + text + data


def content(dtype, shape) -> np.ndarray:
    """A deterministic array: 0, 1, 2, ... cast to `dtype` (every byte of the values is meaningful)."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    if dtype.names is not None or dtype.kind == "V":
        raw = (np.arange(count * dtype.itemsize, dtype=np.int64) * 7 % 251).astype(np.uint8)
        return raw.view(dtype).reshape(shape) if count else np.zeros(shape, dtype)
    if dtype.kind in "SU":
        return np.array([f"s{i}" for i in range(count)], dtype=dtype).reshape(shape)
    if dtype.kind in "Mm":
        return np.arange(count, dtype=np.int64).astype(dtype.newbyteorder("=")).astype(dtype).reshape(shape)
    if dtype.kind == "c":
        return (np.arange(count) + 1j * np.arange(count)[::-1]).astype(dtype).reshape(shape)
    return np.arange(count).astype(dtype).reshape(shape)


def saved(array: np.ndarray, version=None) -> bytes:
    """What numpy's own writer produces for `array`."""
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array, version=version, allow_pickle=False)
    return buf.getvalue()


def with_header(text, dtype, shape, *, version=(1, 0), extra: bytes = b"", **kw) -> bytes:
    """A file whose header text is `text` and whose data is ``content(dtype, shape)`` (+ `extra`)."""
    return npy(text, content(dtype, shape).tobytes() + extra, version=version, **kw)


def good(descr="<i4", shape=(2, 3), fortran_order=False, **kw) -> bytes:
    return with_header(header_text(descr, shape, fortran_order), descr, shape, **kw)


def bad_text(text, version=(1, 0)) -> bytes:
    """A header text that must be refused, followed by enough data for the dict it resembles."""
    return npy(text, bytes(64), version=version)


def keyed(**entries) -> str:
    """A header dict with the given items, in order, written with repr (values given as source text)."""
    return "{" + ", ".join(f"{k!r}: {v}" for k, v in entries.items()) + "}"


def _mkdir(path: Path) -> None:
    path.mkdir()


def _unreadable(path: Path) -> None:
    path.write_bytes(good())
    path.chmod(0)


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _symlink_loop(path: Path) -> None:
    other = path.with_name(path.stem + "_other.npy")
    os.symlink(other.name, path)
    os.symlink(path.name, other)


def _dangling(path: Path) -> None:
    os.symlink(path.stem + "_missing_target.npy", path)


def _symlink_to(target: str) -> Callable[[Path], None]:
    def build(path: Path) -> None:
        os.symlink(target, path)
    return build


def _name_not_utf8(path: Path) -> Path:
    # A latin-1 name ("caf\xe9") from an old system: Python hands it around as a surrogate-escaped str.
    named = path.with_name(os.fsdecode(path.stem.encode() + b"_caf\xe9.npy"))
    named.write_bytes(good("<f4", (3, 2)))
    return named


def _symlink_to_good(path: Path) -> None:
    real = path.with_name(path.stem + "_target.bin")
    real.write_bytes(good("<f8", (4, 2), True))
    os.symlink(real.name, path)


# ----------------------------------------------------------------------------------------------------------
# The cases

NPYFORMAT = "NpyFormatError"

_DESCR_NAMES = ("numpy also accepts type names and character codes ('float64', 'd', 'i', '<i'); npyfeed reads "
                "only array-protocol typestrs ('<f8', '|b1', ...) as np.save and every known writer write them: "
                "names and codes are platform-dependent ('l' is 4 bytes on Windows)")


_RARE_SYNTAX = ("Python syntax that no .npy writer produces (triple-quoted or r'' strings, \\N{...} escapes, Python "
                "2's '3 L' with a space, a float even as an overwritten value) is refused: the header parser stays a "
                "small subset of Python literals")


def _cases() -> list:
    cases = []

    def add(id, expect, numpy, data=None, **kw):
        cases.append(Case(id=id, expect=expect, numpy=numpy, data=data, **kw))

    refuse = NPYFORMAT
    ok = ACCEPT

    # --- magic -------------------------------------------------------------------------------------------
    base = good()
    add("magic_empty_file", refuse, "EOFError", b"")
    for i, letter in enumerate(["x93", "N", "U", "M", "P", "Y"]):
        broken = bytearray(base)
        broken[i] ^= 0x20 if i else 0x01
        add(f"magic_wrong_{letter}", refuse, "ValueError", bytes(broken))
    add("magic_lowercase", refuse, "ValueError", b"\x93numpy" + base[6:])
    add("magic_dali_one_letter", refuse, "ValueError", b"\x93NXXXX" + base[6:])
    add("magic_truncated_4_bytes", refuse, "ValueError", MAGIC[:4])
    add("magic_only", refuse, "ValueError", MAGIC)
    add("magic_no_length", refuse, "ValueError", MAGIC + b"\x01\x00")
    add("magic_half_length_v1", refuse, "ValueError", MAGIC + b"\x01\x00\x76")
    add("magic_half_length_v2", refuse, "ValueError", MAGIC + b"\x02\x00\x76\x00")
    add("magic_pickle_file", refuse, "ValueError", pickle.dumps(np.arange(3), protocol=2))
    npz = io.BytesIO()
    np.savez(npz, a=np.arange(3))
    add("magic_npz_named_npy", refuse, NUMPY_NPZ, npz.getvalue(),
        differs="np.load returns an NpzFile for a zip archive whatever its name; npyfeed loads only .npy arrays")
    add("magic_zip_garbage", refuse, "BadZipFile", b"PK\x03\x04" + bytes(60))

    # --- version bytes -----------------------------------------------------------------------------------
    for major, minor in [(0, 0), (1, 1), (2, 1), (3, 1), (4, 0), (255, 255)]:
        add(f"version_{major}_{minor}", refuse, "ValueError",
            npy(header_text("<i4", (2, 3)), content("<i4", (2, 3)).tobytes(), version=(major, minor)))

    # --- header length field -----------------------------------------------------------------------------
    text = header_text("<i4", (2, 3))
    add("hlen_v1_beyond_file", refuse, "ValueError", npy(text, version=(1, 0), length=500))
    add("hlen_v2_beyond_file", refuse, "ValueError", npy(text, version=(2, 0), length=500))
    add("hlen_v3_beyond_file", refuse, "ValueError", npy(text, version=(3, 0), length=500))
    add("hlen_v1_ffff", refuse, "ValueError", npy(text, version=(1, 0), length=0xFFFF))
    add("hlen_v2_ffffffff", refuse, "ValueError", npy(text, version=(2, 0), length=0xFFFFFFFF))
    add("hlen_v3_ffffffff", refuse, "ValueError", npy(text, version=(3, 0), length=0xFFFFFFFF))
    add("hlen_v2_80000000", refuse, "ValueError", npy(text, version=(2, 0), length=0x80000000))
    add("hlen_zero", refuse, "ValueError", npy(b"", bytes(24), pad=False))
    add("hlen_cuts_dict", refuse, "TokenError", npy(text, bytes(24), length=20))
    # The length field one short: the header's final newline becomes the first data byte. numpy reads on.
    data = content("<i4", (2, 3)).tobytes()
    one_short = npy(text, data)
    add("hlen_one_short_shifts_data", ok, ok, one_short[:8] + struct.pack("<H", len(one_short) - 10 - 24 - 1)
        + one_short[10:])
    add("hlen_v1_full_65535_over_cap", refuse, "ValueError",
        npy(text + " " * (0xFFFF - len(text) - 1) + "\n", data, pad=False))

    def at_size(n, version, filler=" "):
        # A header text of exactly n characters: the dict, `filler` padding, a final newline.
        return npy(text + filler * (n - len(text) - 1) + "\n", data, version=version, pad=False)

    add("hlen_v1_exactly_10000", ok, ok, at_size(10000, (1, 0)))
    add("hlen_v1_10001_over_cap", refuse, "ValueError", at_size(10001, (1, 0)))
    add("hlen_v2_exactly_10000", ok, ok, at_size(10000, (2, 0)))
    add("hlen_v2_10001_over_cap", refuse, "ValueError", at_size(10001, (2, 0)))
    # v3 counts characters, not bytes: 10000 characters, 4000 of them 3 bytes long in utf-8.
    wide = "{'descr': [('" + "\u20ac" * 4000 + "', '<i4')], 'fortran_order': False, 'shape': (2,), }"
    wide_data = content([("\u20ac" * 4000, "<i4")], (2,)).tobytes()
    add("hlen_v3_10000_chars_18k_bytes", ok, ok,
        npy(wide + " " * (10000 - len(wide) - 1) + "\n", wide_data, version=(3, 0), pad=False))
    add("hlen_v3_10001_chars_over_cap", refuse, "ValueError",
        npy(wide + " " * (10001 - len(wide) - 1) + "\n", wide_data, version=(3, 0), pad=False))

    # --- header text -------------------------------------------------------------------------------------
    add("text_list", refuse, "ValueError", bad_text("['<i4', False, (2, 3)]"))
    add("text_tuple", refuse, "ValueError", bad_text("('descr', '<i4')"))
    add("text_int", refuse, "ValueError", bad_text("42"))
    add("text_string", refuse, "ValueError", bad_text("'descr'"))
    add("text_empty_dict", refuse, "ValueError", bad_text("{}"))
    add("text_only_spaces", refuse, "ValueError", bad_text(" " * 50))
    add("text_missing_descr", refuse, "ValueError", bad_text(keyed(fortran_order="False", shape="(2, 3)")))
    add("text_missing_fortran_order", refuse, "ValueError", bad_text(keyed(descr="'<i4'", shape="(2, 3)")))
    add("text_missing_shape", refuse, "ValueError", bad_text(keyed(descr="'<i4'", fortran_order="False")))
    add("text_extra_key", refuse, "ValueError",
        bad_text(keyed(descr="'<i4'", fortran_order="False", shape="(2, 3)", extra="1")))
    add("text_wrong_key_case", refuse, "ValueError",
        bad_text(keyed(Descr="'<i4'", fortran_order="False", shape="(2, 3)")))
    add("text_key_is_bytes", refuse, "TypeError",
        bad_text("{b'descr': '<i4', 'fortran_order': False, 'shape': (2, 3)}"))
    add("text_key_is_int", refuse, "TypeError", bad_text("{1: '<i4', 'fortran_order': False, 'shape': (2, 3)}"))
    add("text_duplicate_key_same", ok, ok,
        with_header("{'descr': '<i4', 'descr': '<i4', 'fortran_order': False, 'shape': (2, 3)}", "<i4", (2, 3)))
    # Python keeps the last value of a repeated key, and so does np.load.
    add("text_duplicate_key_last_wins", ok, ok,
        with_header("{'descr': '<f8', 'shape': (9,), 'fortran_order': True, 'descr': '<i2', 'shape': (2, 3),"
                    " 'fortran_order': False}", "<i2", (2, 3)))
    add("text_keys_reordered", ok, ok,
        with_header("{'shape': (2, 3), 'fortran_order': False, 'descr': '<i4'}", "<i4", (2, 3)))
    add("text_double_quotes", ok, ok,
        with_header('{"descr": "<i4", "fortran_order": False, "shape": (2, 3)}', "<i4", (2, 3)))
    add("text_import_call", refuse, "ValueError",
        bad_text("{'descr': __import__('os').system('touch /tmp/npyfeed_pwned'), 'fortran_order': False, "
                 "'shape': (2, 3)}"))
    add("text_expression_in_shape", refuse, "ValueError",
        bad_text("{'descr': '<i4', 'fortran_order': False, 'shape': (1+1, 3)}"))
    add("text_function_call_in_shape", refuse, "ValueError",
        bad_text("{'descr': '<i4', 'fortran_order': False, 'shape': tuple([2, 3])}"))
    add("text_name_as_descr", refuse, "ValueError",
        bad_text("{'descr': float32, 'fortran_order': False, 'shape': (2, 3)}"))
    add("text_lambda", refuse, "ValueError",
        bad_text("{'descr': (lambda: '<i4')(), 'fortran_order': False, 'shape': (2, 3)}"))
    add("text_attribute", refuse, "ValueError",
        bad_text("{'descr': np.float32, 'fortran_order': False, 'shape': (2, 3)}"))
    add("text_subscript", refuse, "ValueError",
        bad_text("{'descr': '<i4'[0], 'fortran_order': False, 'shape': (2, 3)}"))
    add("text_fstring", refuse, "ValueError",
        bad_text("{'descr': f'<i{4}', 'fortran_order': False, 'shape': (2, 3)}"))
    add("text_double_unary_minus", refuse, "ValueError",
        bad_text("{'descr': '<i4', 'fortran_order': False, 'shape': (--2, 3)}"))
    add("text_unary_plus", ok, ok, with_header("{'descr': '<i4', 'fortran_order': False, 'shape': (+2, 3)}",
                                               "<i4", (2, 3)))
    add("text_comment", ok, ok,
        with_header("{'descr': '<i4',  # a comment\n 'fortran_order': False, 'shape': (2, 3)}  # end", "<i4",
                    (2, 3)))
    add("text_hash_inside_string", ok, ok,
        with_header("{'descr': [('a#b', '<i4')], 'fortran_order': False, 'shape': (2, 3)}", [("a#b", "<i4")],
                    (2, 3)))
    add("text_odd_spacing", ok, ok,
        with_header("{ 'descr' :'<i4' ,'fortran_order':False,'shape':( 2 ,3 , ) }", "<i4", (2, 3)))
    add("text_no_spaces_no_padding", ok, ok,
        with_header("{'descr':'<i4','fortran_order':False,'shape':(2,3)}", "<i4", (2, 3), pad=False))
    add("text_tabs_newlines_crlf", ok, ok,
        with_header("{\t'descr':\n'<i4',\r\n\t'fortran_order'\t: False,\r'shape': (2,\n 3)}", "<i4", (2, 3)))
    add("text_leading_spaces_tabs", ok, ok if PYTHON_STRIPS_INDENT else "ValueError",
        with_header(" \t {'descr': '<i4', 'fortran_order': False, 'shape': (2, 3)}", "<i4", (2, 3)),
        **({} if PYTHON_STRIPS_INDENT else dict(same_as="text_tabs_newlines_crlf", differs=(
            "numpy on Python 3.9 refuses spaces or tabs before the header dict (ast.literal_eval strips them from "
            "Python 3.10 on); npyfeed reads them on every Python, as numpy does on 3.10 and later"))))
    add("text_leading_newline", ok, ok,
        with_header("\n{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3)}", "<i4", (2, 3)))
    # Outside the brackets Python reads the header line by line: ast.literal_eval strips leading spaces and
    # tabs, but an indented line after a newline, comment line, continuation or form feed is an "unexpected
    # indent", and so is a last line of only spaces without a newline (Python 3.11 to 3.13 alike).
    plain = "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3)}"
    for version in ((1, 0), (3, 0)):
        v = f"v{version[0]}"
        add(f"text_leading_newline_indent_{v}", refuse, "ValueError", bad_text("\n  " + plain, version))
        add(f"text_leading_newline_tab_{v}", refuse, "ValueError", bad_text("\r\n\t" + plain, version))
        add(f"text_comment_line_then_indent_{v}", refuse, "ValueError", bad_text("# c\n " + plain, version))
        add(f"text_continuation_then_indent_{v}", refuse, "ValueError", bad_text("\\\n " + plain, version))
        add(f"text_blank_lines_comments_first_{v}", ok, ok,
            with_header("\n  \n# c\n   # d\r\n\x0c" + plain, "<i4", (2, 3), version=version))
        add(f"text_trailing_comment_line_{v}", ok, ok,
            with_header(plain + "\n  # c", "<i4", (2, 3), version=version, pad=False))
    add("text_form_feed_then_indent_v3", refuse, "ValueError",
        with_header("\x0c " + plain, "<i4", (2, 3), version=(3, 0)))
    add("text_form_feed_then_indent_v1", refuse, ok, with_header("\x0c " + plain, "<i4", (2, 3)), differs=(
        "ast.literal_eval refuses the indented first line; numpy then retries v1/v2 headers through its Python 2 "
        "filter (tokenize/untokenize), which happens to turn this indentation into spaces that it strips"))
    # numpy on Python <= 3.11 also "repairs" a v1/v2 last line of spaces that way, Python >= 3.12 not: v3 only.
    add("text_trailing_indent_no_newline_v3", refuse, "ValueError",
        with_header(plain + "\n  ", "<i4", (2, 3), version=(3, 0), pad=False))
    add("text_form_feed", ok, ok,
        with_header("{'descr':\x0c'<i4', 'fortran_order': False, 'shape': (2, 3)}", "<i4", (2, 3)))
    add("text_vertical_tab", refuse, "ValueError",
        bad_text("{'descr':\x0b'<i4', 'fortran_order': False, 'shape': (2, 3)}"))
    add("text_line_continuation", ok, ok,
        with_header("{'descr': '<i4', \\\n'fortran_order': False, 'shape': (2, 3)}", "<i4", (2, 3)))
    add("text_line_continuation_before_padding", ok, ok,
        with_header("{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3)}\\\n", "<i4", (2, 3)))
    # A backslash-newline as the very last bytes is a syntax error (in every version: numpy's Python-2
    # filter for v1/v2 headers fails on it too).
    at_end = "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3)}\\\n"
    add("text_line_continuation_at_end_v1", refuse, "TokenError", with_header(at_end, "<i4", (2, 3), pad=False))
    add("text_line_continuation_at_end_v3", refuse, "ValueError",
        with_header(at_end, "<i4", (2, 3), pad=False, version=(3, 0)))
    add("text_trailing_comma_dict", ok, ok,
        with_header("{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3),}", "<i4", (2, 3)))
    add("text_double_comma", refuse, "ValueError",
        bad_text("{'descr': '<i4', 'fortran_order': False, 'shape': (2,, 3)}"))
    add("text_lone_comma_tuple", refuse, "ValueError",
        bad_text("{'descr': '<i4', 'fortran_order': False, 'shape': (,)}"))
    add("text_padding_spaces_no_newline", ok, ok,
        with_header(header_text("<i4", (2, 3)) + " " * 30, "<i4", (2, 3), pad=False))
    add("text_padding_many_newlines", ok, ok,
        with_header(header_text("<i4", (2, 3)) + "\n" * 30, "<i4", (2, 3), pad=False))
    add("text_trailing_garbage", refuse, "ValueError", bad_text(header_text("<i4", (2, 3)) + " x"))
    add("text_two_dicts", refuse, "ValueError", bad_text(header_text("<i4", (2, 3)) * 2))
    add("text_unclosed_dict", refuse, "TokenError", bad_text(header_text("<i4", (2, 3))[:-1]))
    add("text_unterminated_string", refuse, "ValueError",
        bad_text("{'descr': '<i4, 'fortran_order': False, 'shape': (2, 3)}"))
    add("text_triple_quoted", refuse, ok, differs=_RARE_SYNTAX, data=with_header("{'descr': '''<i4''', 'fortran_order': False, 'shape': (2, 3)}", "<i4", (2, 3)))
    add("text_escape_in_descr", ok, ok,
        with_header("{'descr': '\\x3ci4', 'fortran_order': False, 'shape': (2, 3)}", "<i4", (2, 3)))
    add("text_adjacent_strings", ok, ok,
        with_header("{'descr': '<' \"i4\", 'fortran_order': False, 'shape': (2, 3)}", "<i4", (2, 3)))
    add("text_unicode_prefix", ok, ok,
        with_header("{u'descr': u'<i4', 'fortran_order': False, 'shape': (2, 3)}", "<i4", (2, 3)))
    add("text_raw_prefix", refuse, ok, differs=_RARE_SYNTAX, data=with_header("{r'descr': R'<i4', 'fortran_order': False, 'shape': (2, 3)}", "<i4", (2, 3)))
    add("text_named_escape", refuse, ok, differs=_RARE_SYNTAX, data=with_header(
        "{'descr': [('\\N{DIGIT ONE}', '<i4')], 'fortran_order': False, 'shape': (2, 3)}", [("1", "<i4")], (2, 3)))
    add("text_string_continuation_cr", ok, ok,
        with_header("{'descr': [('a\\\rb', '<i4')], 'fortran_order': False, 'shape': (2, 3)}", [("ab", "<i4")],
                    (2, 3)))
    add("text_int_underscores", ok, ok,
        with_header("{'descr': '|u1', 'fortran_order': False, 'shape': (0x_2, 1_5)}", "|u1", (2, 15)))
    add("text_int_leading_zero_underscore", refuse, "ValueError",
        bad_text("{'descr': '|u1', 'fortran_order': False, 'shape': (03_0,)}"))
    add("text_int_octal_old_style", refuse, "ValueError", bad_text("{'descr': '|u1', 'fortran_order': False, 'shape': (010,)}"))
    add("text_duplicate_key_float_overwritten", refuse, ok, differs=_RARE_SYNTAX, data=with_header(
        "{'descr': '<i4', 'fortran_order': False, 'shape': 1.5, 'shape': (2, 3)}", "<i4", (2, 3)))
    add("text_bytes_descr", refuse, "ValueError",
        bad_text("{'descr': b'<i4', 'fortran_order': False, 'shape': (2, 3)}"))
    add("text_set_shape", refuse, "ValueError", bad_text("{'descr': '<i4', 'fortran_order': False, 'shape': {2, 3}}"))
    add("text_deeply_nested", refuse, "ValueError",
        bad_text("{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), 'x': " + "[" * 500 + "]" * 500 + "}"))
    # Non-ASCII: v1/v2 headers are latin-1, v3 headers utf-8 (numpy writes v3 only when utf-8 is needed).
    latin = "{'descr': [('\u00e9t\u00e9', '<i4')], 'fortran_order': False, 'shape': (2, 3)}"
    add("text_latin1_v1", ok, ok, with_header(latin, [("\u00e9t\u00e9", "<i4")], (2, 3), version=(1, 0)))
    add("text_latin1_v2", ok, ok, with_header(latin, [("\u00e9t\u00e9", "<i4")], (2, 3), version=(2, 0)))
    add("text_utf8_v3", ok, ok, saved(content([("\u6570\u636e", "<i4"), ("\U0001f600", "<f8")], (3,)), (3, 0)))
    add("text_utf8_bytes_in_v1_read_as_latin1", ok, ok,
        with_header(latin.encode("utf-8"), [("\u00c3\u00a9t\u00c3\u00a9", "<i4")], (2, 3), version=(1, 0)))
    add("text_latin1_bytes_in_v3_invalid_utf8", refuse, "UnicodeDecodeError",
        with_header(latin.encode("latin-1"), [("\u00e9t\u00e9", "<i4")], (2, 3), version=(3, 0)))
    add("text_v3_overlong_utf8", refuse, "UnicodeDecodeError",
        with_header(b"{'descr': [('\xc0\xaf', '<i4')], 'fortran_order': False, 'shape': (2, 3)}", "<i4", (2, 6),
                    version=(3, 0)))
    add("text_v3_surrogate_utf8", refuse, "UnicodeDecodeError",
        with_header(b"{'descr': [('\xed\xa0\x80', '<i4')], 'fortran_order': False, 'shape': (2, 3)}", "<i4", (2, 6),
                    version=(3, 0)))
    add("text_v3_truncated_utf8", refuse, "UnicodeDecodeError",
        with_header(b"{'descr': [('\xe6\x95', '<i4')], 'fortran_order': False, 'shape': (2, 3)}", "<i4", (2, 6),
                    version=(3, 0)))
    add("text_nul_padding", refuse, "ValueError",
        npy(header_text("<i4", (2, 3)).encode() + b"\x00" * 20 + b"\n", content("<i4", (2, 3)).tobytes()))
    add("text_nul_in_descr", refuse, "ValueError",
        bad_text(b"{'descr': '<i4\x00', 'fortran_order': False, 'shape': (2, 3)}"))
    add("text_nul_first", refuse, "ValueError", bad_text(b"\x00{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3)}"))
    add("text_non_ascii_outside_string", refuse, "ValueError",
        bad_text("{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3)}\u00a0\u00e9"))
    # Python 2 wrote longs as 3L; numpy filters them out of v1/v2 headers (with a warning), never v3.
    py2 = "{'descr': '<i4', 'fortran_order': False, 'shape': (2L, 3L)}"
    add("text_py2_long_v1", ok, ok, with_header(py2, "<i4", (2, 3), version=(1, 0)))
    add("text_py2_long_v2", ok, ok, with_header(py2, "<i4", (2, 3), version=(2, 0)))
    add("text_py2_long_v3", refuse, "ValueError", with_header(py2, "<i4", (2, 3), version=(3, 0)))
    add("text_py2_long_hex_v1", ok, ok,
        with_header("{'descr': '<i4', 'fortran_order': False, 'shape': (0x2L, 3L)}", "<i4", (2, 3)))
    add("text_py2_lowercase_l", refuse, "ValueError",
        bad_text("{'descr': '<i4', 'fortran_order': False, 'shape': (2l, 3l)}"))
    add("text_py2_long_after_space", refuse, ok, differs=_RARE_SYNTAX, data=with_header("{'descr': '<i4', 'fortran_order': False, 'shape': (2 L, 3L)}", "<i4", (2, 3)))
    add("text_py2_long_twice", refuse, "ValueError",
        bad_text("{'descr': '<i4', 'fortran_order': False, 'shape': (2LL, 3)}"))

    # --- fortran_order -----------------------------------------------------------------------------------
    for name, value in [("int", "0"), ("none", "None"), ("string", "'False'"), ("tuple", "(False,)")]:
        add(f"fortran_order_{name}", refuse, "ValueError",
            bad_text(f"{{'descr': '<i4', 'fortran_order': {value}, 'shape': (2, 3)}}"))

    # --- shape -------------------------------------------------------------------------------------------
    def shape_case(id, shape_src, expect, numpy, descr="<i4", data=bytes(64), **kw):
        add(id, expect, numpy, npy(f"{{'descr': {descr!r}, 'fortran_order': False, 'shape': {shape_src}}}", data),
            **kw)

    shape_case("shape_negative", "(-1,)", refuse, "ValueError" if NUMPY_2 else ok,
               differs="" if NUMPY_2 else "numpy 1.x reads a shape of (-1,) as 'whatever the file holds'")
    shape_case("shape_two_negatives", "(-2, -3)", refuse, "ValueError", data=content("<i4", (6,)).tobytes())
    shape_case("shape_float", "(2.0, 3)", refuse, "ValueError")
    shape_case("shape_exponent", "(1e1,)", refuse, "ValueError")
    shape_case("shape_string", "('2', '3')", refuse, "ValueError")
    shape_case("shape_none", "(None,)", refuse, "ValueError")
    shape_case("shape_list", "[2, 3]", refuse, "ValueError")
    shape_case("shape_int_not_tuple", "6", refuse, "ValueError")
    shape_case("shape_parenthesised_int", "(6)", refuse, "ValueError")
    shape_case("shape_nested_tuple", "((2, 3),)", refuse, "ValueError")
    shape_case("shape_bool", "(True, 6)", refuse, "TypeError", data=content("<i4", (6,)).tobytes())
    shape_case("shape_bool_zero", "(False,)", refuse, "TypeError", data=b"")
    shape_case("shape_product_wraps_to_zero", "(4294967296, 4294967296)", refuse, "ValueError", descr="<f8")
    shape_case("shape_bytes_overflow", "(2305843009213693952,)", refuse, "ValueError", descr="<f8")
    shape_case("shape_int64_max", "(9223372036854775807,)", refuse, "MemoryError", descr="|u1")
    shape_case("shape_beyond_int64", "(18446744073709551616,)", refuse, "OverflowError")
    shape_case("shape_huge_beyond_int64", "(" + "9" * 400 + ",)", refuse, "OverflowError")
    shape_case("shape_zero_times_huge", "(0, 4611686018427387904)", refuse, "ValueError", descr="<f8", data=b"")
    shape_case("shape_65_dims", "(" + "1, " * 65 + ")", refuse, "ValueError", data=bytes(4))
    add("shape_max_dims", ok, ok, good("<i4", (1,) * (NUMPY_MAX_DIMS - 1) + (2,)))
    if NUMPY_MAX_DIMS < 64:  # numpy 1.x: valid for the format, beyond what this numpy can make
        shape_case("shape_64_dims_numpy1", "(" + "1, " * 64 + ")", refuse, "ValueError", data=bytes(4))
    add("shape_zero", ok, ok, good("<f8", (0,)))
    add("shape_zero_2d", ok, ok, good("<f8", (0, 5)))
    add("shape_zero_fortran", ok, ok, good("<f8", (5, 0), True))
    add("shape_zero_with_extra_bytes", ok, ok, good("<f8", (0,), extra=b"junk"))
    add("shape_0d", ok, ok, saved(np.array(3.5)))
    add("shape_0d_struct", ok, ok, saved(content([("a", "<i4"), ("b", "|S2")], ())))
    add("shape_0d_no_data", refuse, "ValueError", npy(header_text("<f8", ())))
    add("shape_big_zero_size_string", ok, ok, good("|S0", (1000000,)))

    # --- dtypes that must be read ------------------------------------------------------------------------
    for descr in ["|b1", "|i1", "|u1", "<i2", ">i2", "<u2", "<i4", ">u4", "<i8", ">i8", "<u8", "<f2", ">f2",
                  "<f4", ">f4", "<f8", ">f8", "<f16", "<c8", ">c8", "<c16", ">c16", "<c32",
                  "<M8[ns]", ">M8[D]", "<m8[s]", "<M8", "<M8[2ms]", "|S5", "<U3", ">U3", "|V4"]:
        safe = descr.translate(str.maketrans("<>|[]", "lbn__"))
        add(f"dtype_{safe}", ok, ok, saved(content(descr, (3, 4))))
    add("dtype_f8_fortran", ok, ok, saved(np.asfortranarray(content(">f8", (3, 4, 2)))))
    add("dtype_f8_v2", ok, ok, saved(content("<f8", (5,)), (2, 0)))
    add("dtype_f8_v3", ok, ok, saved(content("<f8", (5,)), (3, 0)))
    add("dtype_structured", ok, ok,
        saved(content([("a", "<i4"), ("b", ">f8", (2,)), ("c", "|S3"), ("d", "<U2")], (4,))))
    add("dtype_structured_nested", ok, ok,
        saved(content([("a", [("x", "<i2"), ("y", ">f4", (2, 2))]), ("b", "|b1")], (2, 3))))
    add("dtype_structured_aligned_padding", ok, ok,
        saved(content(np.dtype([("a", "|u1"), ("b", "<f8")], align=True), (3,))))
    add("dtype_structured_titles", ok, ok,
        saved(content(np.dtype({"names": ["a"], "formats": ["<i4"], "titles": ["Alpha"]}), (3,))))
    add("dtype_structured_fortran", ok, ok, saved(np.asfortranarray(content([("a", "<i2"), ("b", "<f4")], (3, 2)))))
    add("dtype_structured_empty", ok, ok, npy(header_text([], (3,))))
    add("dtype_bare_b_is_int8", ok, ok, with_header(header_text("b", (2, 3)), "|i1", (2, 3)))
    add("dtype_bare_question_mark", ok, ok, with_header(header_text("?", (2, 3)), "|b1", (2, 3)))
    add("dtype_leading_zero_size", ok, ok, with_header(header_text("<i04", (2, 3)), "<i4", (2, 3)))
    add("dtype_type_name", refuse, ok, with_header(header_text("float64", (2, 3)), "<f8", (2, 3)),
        differs=_DESCR_NAMES)
    add("dtype_char_code", refuse, ok, with_header(header_text("d", (2, 3)), "<f8", (2, 3)), differs=_DESCR_NAMES)
    add("dtype_kind_without_size", refuse, ok, with_header(header_text("<i", (2, 3)), "<i4", (2, 3)),
        differs=_DESCR_NAMES)
    # numpy builds the subarray dtype, then finds 6 elements where the shape promised 3.
    add("dtype_descr_subarray_tuple", refuse, "ValueError",
        with_header(header_text(("<i4", (2,)), (3,)), "<i4", (3, 2)))
    # ... unless there is one element per element, or none at all: then np.load gives the base dtype.
    add("dtype_descr_subarray_tuple_one", ok, ok, with_header(header_text(("<i4", (1,)), (3,)), "<i4", (3,)))
    add("dtype_descr_subarray_tuple_unit", ok, ok, with_header(header_text((">f8", ()), (2, 2)), ">f8", (2, 2)))
    add("dtype_descr_subarray_tuple_empty", ok, ok, with_header(header_text(("<i4", (5,)), (0, 3)), "<i4", (0,)))
    # Fields whose type is a subarray, of numbers or of structs, nested as deep as numpy writes them
    # (numpy's own format tests: record_arrays[4] and test_descr_to_dtype).
    add("dtype_field_of_subarray", ok, ok, saved(content([("c", ("<f8", (5,)), (2,))], (2,))))
    padded = np.dtype({"names": ["a", "b"], "formats": ["i1", "i1"], "offsets": [0, 4], "itemsize": 8})
    add("dtype_field_of_struct_subarray", ok, ok, saved(content([("x", (padded, (3,)), (4,))], (2,))))
    add("dtype_field_deeply_nested", ok, ok,
        saved(content([("a", (((np.dtype([("a", "<i8"), ("b", padded)]), (3,)), (4,))), (5,))], (2,)), (2, 0)))
    add("dtype_field_of_subarray_titles_v3", ok, ok,
        saved(content([(("t\u00e9", "\u540d"), (">f4", (2, 2)), (3,)), ("z", "|u1")], (2, 2)), (3, 0)))
    add("dtype_field_of_subarray_fortran", ok, ok,
        saved(np.asfortranarray(content([("c", ("<i2", (3,)), (2,))], (3, 4)))))
    add("dtype_zero_itemsize_view", ok, ok,
        saved(np.zeros(4, dtype=[("I", "<i8"), ("S", "S0")])["S"].reshape(2, 2)))

    # --- dtypes that must be refused ---------------------------------------------------------------------
    add("dtype_object", refuse, "ValueError", npy(header_text("|O", (3,)), bytes(24)))
    add("dtype_object_bare", refuse, "ValueError", npy(header_text("O", (3,)), bytes(24)))
    add("dtype_structured_with_object", refuse, "ValueError",
        npy(header_text([("a", "<i4"), ("b", "|O")], (3,)), bytes(36)))
    add("dtype_nested_object", refuse, "ValueError",
        npy(header_text([("a", [("x", "<i4"), ("o", "|O")])], (3,)), bytes(36)))
    add("dtype_subarray_of_object", refuse, "ValueError", npy(header_text([("o", "|O", (2,))], (3,)), bytes(48)))
    add("dtype_stringdtype", refuse, "ValueError", npy(header_text("|T16", (3,)), bytes(48)))
    add("dtype_unknown_kind", refuse, "ValueError", npy(header_text("<x4", (3,)), bytes(12)))
    add("dtype_bad_int_size", refuse, "ValueError", npy(header_text("<i3", (3,)), bytes(12)))
    add("dtype_f12", refuse, "ValueError", npy(header_text("<f12", (3,)), bytes(36)))
    add("dtype_bad_datetime_unit", refuse, "ValueError", npy(header_text("<M8[xyz]", (3,)), bytes(24)))
    add("dtype_datetime_size_4", refuse, "ValueError", npy(header_text("<M4", (3,)), bytes(12)))
    add("dtype_descr_int", refuse, "ValueError", npy("{'descr': 4, 'fortran_order': False, 'shape': (3,)}", bytes(12)))
    add("dtype_descr_with_spaces", refuse, "ValueError", npy(header_text(" <i4", (3,)), bytes(12)))
    add("dtype_duplicate_field_names", refuse, "ValueError",
        npy(header_text([("a", "<i4"), ("a", "<f4")], (3,)), bytes(24)))
    add("dtype_field_name_bytes", refuse, "ValueError",
        npy("{'descr': [(b'a', '<i4')], 'fortran_order': False, 'shape': (3,)}", bytes(12)))
    add("dtype_field_negative_subarray", refuse, "ValueError", npy(header_text([("a", "<i4", (-1,))], (3,)), bytes(12)))
    add("dtype_field_bool_subarray", refuse, "ValueError",
        npy("{'descr': [('a', '<i4', (True,))], 'fortran_order': False, 'shape': (3,)}", bytes(12)))
    add("dtype_field_huge_subarray", refuse, "ValueError",
        npy(header_text([("a", "<i4", (2 ** 40, 2 ** 40))], (3,)), bytes(12)))
    add("dtype_field_one_element_tuple", refuse, "ValueError",
        npy("{'descr': [('a',)], 'fortran_order': False, 'shape': (3,)}", bytes(12)))
    add("dtype_field_subarray_one_element", refuse, "IndexError",
        npy("{'descr': [('a', ('<i4',))], 'fortran_order': False, 'shape': (3,)}", bytes(12)))
    add("dtype_field_subarray_negative", refuse, "ValueError",
        npy("{'descr': [('a', ('<f8', (5,)), (2,)), ('b', ('<i4', (-1,)))], 'fortran_order': False, 'shape': (1,)}",
            bytes(80)))
    add("dtype_field_subarray_of_object", refuse, "ValueError",
        npy("{'descr': [('a', ([('o', '|O')], (2,)))], 'fortran_order': False, 'shape': (1,)}", bytes(16)))

    # --- data shorter or longer than promised ------------------------------------------------------------
    full = good("<f8", (10,))
    add("data_short_by_one", refuse, "ValueError", full[:-1])
    add("data_missing", refuse, "ValueError", npy(header_text("<f8", (10,))))
    add("data_short_by_one_element", refuse, "ValueError", full[:-8])
    add("data_long_trailing_bytes", ok, ok, full + b"trailing garbage")
    add("data_long_twice_the_data", ok, ok, full + full)
    add("data_unaligned_offset", ok, ok, good("<f8", (10,), pad=False))
    add("data_16_aligned_old_writer", ok, ok, good("<f8", (10,), align=16))
    add("data_struct_short", refuse, "ValueError", good([("a", "<i4"), ("b", "<f8")], (5,))[:-3])

    # --- not a regular readable file ---------------------------------------------------------------------
    add("file_directory", "IsADirectoryError", "IsADirectoryError", build=_mkdir)
    add("file_unreadable_chmod_000", "PermissionError", "PermissionError", build=_unreadable, needs_non_root=True)
    add("file_fifo", refuse, NUMPY_HANGS, build=_fifo,
        differs="np.load blocks forever opening a FIFO with no writer; npyfeed refuses anything but a regular file")
    add("file_dev_null", refuse, "EOFError", build=_symlink_to("/dev/null"))
    add("file_dev_zero", refuse, "ValueError", build=_symlink_to("/dev/zero"))
    add("file_symlink_loop", "OSError", "OSError", build=_symlink_loop, errno="ELOOP")
    add("file_dangling_symlink", "FileNotFoundError", "FileNotFoundError", build=_dangling)
    add("file_symlink_to_good", ok, ok, build=_symlink_to_good)
    add("file_name_not_utf8", ok, ok, build=_name_not_utf8)
    return cases


#: What npyfeed's message must say, by case id prefix (the first match wins).
_SAYS = [
    ("magic_wrong_", "magic"), ("magic_lowercase", "magic"), ("magic_dali", "magic"), ("magic_pickle", "magic"),
    ("version_", "version"),
    ("hlen_v1_ffff", "max_header_size"), ("hlen_v2_ffffffff", "max_header_size"),
    ("hlen_v3_ffffffff", "max_header_size"), ("hlen_v2_80000000", "max_header_size"),
    ("hlen_v1_full_65535", "max_header_size"), ("hlen_v1_10001", "max_header_size"),
    ("hlen_v2_10001", "max_header_size"), ("hlen_v3_10001", "max_header_size"), ("hlen_", "header"),
    ("text_import_call", "__import__"), ("text_missing_", "keys"), ("text_extra_key", "keys"),
    ("text_v3_", "utf-8"), ("text_latin1_bytes_in_v3", "utf-8"), ("text_nul", "nul"),
    ("fortran_order_", "fortran_order"),
    ("shape_negative", "negative"), ("shape_two_negatives", "negative"), ("shape_bool", "shape"),
    ("shape_product_wraps", "too large"), ("shape_bytes_overflow", "too large"), ("shape_zero_times", "too large"),
    ("shape_int64_max", "truncated"), ("shape_65_dims", "dimensions"), ("shape_64_dims_numpy1", "dimensions"), ("shape_0d_no_data", "truncated"),
    ("dtype_object", "object"), ("dtype_structured_with_object", "object"), ("dtype_nested_object", "object"),
    ("dtype_subarray_of_object", "object"), ("dtype_field_subarray_of_object", "object"),
    ("text_leading_", "indent"), ("text_comment_line_then_indent", "indent"), ("text_continuation_then", "indent"),
    ("text_form_feed_then_indent", "indent"), ("text_trailing_indent", "indent"),
    ("data_", "truncated"),
    ("file_fifo", "regular file"), ("file_dev_", "regular file"),
]


def _with_messages(cases: list) -> list:
    import dataclasses

    out = []
    for case in cases:
        word = next((w for prefix, w in _SAYS if case.id.startswith(prefix)), "")
        out.append(dataclasses.replace(case, says=word) if word and not case.accepted else case)
    return out


CASES: list = _with_messages(_cases())

#: Cases by id.
BY_ID = {c.id: c for c in CASES}
assert len(BY_ID) == len(CASES), "duplicate case ids"


def numpy_outcome(path) -> str:
    """What ``np.load(path, allow_pickle=False)`` does: ``"accept"``, ``"npz"`` or the exception type name."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Python 2 headers warn; pytest runs with warnings as errors
        try:
            result = np.load(path, allow_pickle=False)
        except Exception as e:  # noqa: BLE001 - recording whatever numpy raises is the point
            return type(e).__name__
    if isinstance(result, np.ndarray):
        return ACCEPT
    result.close()
    return NUMPY_NPZ


def write_all(directory: Path, cases=None) -> dict:
    """Materialize `cases` (default: all that make sense for this user) in `directory`; returns id -> path."""
    directory.mkdir(parents=True, exist_ok=True)
    is_root = os.geteuid() == 0
    return {c.id: c.materialize(directory) for c in (cases or CASES) if not (c.needs_non_root and is_root)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--check", action="store_true", help="run np.load on each case and compare with the record")
    args = parser.parse_args(argv)
    paths = write_all(args.outdir)
    mismatches = 0
    for case in CASES:
        if case.id not in paths:
            print(f"{case.id:45s} skipped (needs a non-root user)")
            continue
        line = f"{case.id:45s} npyfeed={case.expect:18s} numpy={case.numpy}"
        if args.check and case.numpy != NUMPY_HANGS:
            seen = numpy_outcome(paths[case.id])
            if seen != case.numpy:
                mismatches += 1
                line += f"   MISMATCH: numpy now does {seen}"
        print(line)
    accepted = sum(c.accepted for c in CASES)
    print(f"{len(CASES)} cases: {accepted} accepted, {len(CASES) - accepted} refused, "
          f"{sum(bool(c.differs) for c in CASES)} deliberate differences from numpy")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
