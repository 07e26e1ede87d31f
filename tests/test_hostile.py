"""The hostile-input corpus (tests/corpus/make_corpus.py) against npyfeed, with np.load as the oracle.

For every case and every entry point (``read_header`` and ``load`` in each mode): accepted files equal
``np.load`` byte for byte (dtype, shape, memory order); refused files raise the documented type, naming the
file; nothing crashes or hangs. Plus the invariants of issue 4: no descriptors or mappings leaked by failures,
memory freed when arrays die, no half-filled dict from ``load_factor_files``.
"""

from __future__ import annotations

import builtins
import errno
import gc
import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import npyfeed
import numpy as np
import pytest
from conftest import flags_are_comparable
from corpus import make_corpus as mc

TESTS_DIR = Path(__file__).resolve().parent
OPS = ("read_header", "mmap", "read", "direct")
IS_ROOT = os.geteuid() == 0
# The numpy and Python the corpus's numpy outcomes were recorded with: exception names may differ elsewhere.
RECORDED_WITH = ("2.4", (3, 11))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    """id -> path of every case this user can run."""
    return mc.write_all(tmp_path_factory.mktemp("corpus"))


def case_params(*, for_npyfeed=True) -> list:
    """One `pytest.param` per corpus case (a list: pytest refuses generators as parameter values).

    As root, the cases that need an unprivileged user are left to `test_case_as_an_unprivileged_user`."""
    params = []
    for case in mc.CASES:
        if case.needs_non_root and IS_ROOT:
            continue
        marks = []
        if case.known_bug and for_npyfeed:
            marks.append(pytest.mark.xfail(strict=True, reason=case.known_bug))
        params.append(pytest.param(case, id=case.id, marks=marks))
    return params


def run_op(op: str, path: Path):
    if op == "read_header":
        return npyfeed.read_header(path)
    return npyfeed.load(path, mode=op)


def numpy_load(path: Path) -> np.ndarray:
    with warnings.catch_warnings():
        # numpy warns when it had to filter Python 2 "3L" ints out of a header.
        warnings.filterwarnings("ignore", message=".*created on Python 2", category=UserWarning)
        return np.load(path, allow_pickle=False)


def expected_exception(case: mc.Case) -> type:
    return npyfeed.NpyFormatError if case.expect == mc.NPYFORMAT else getattr(builtins, case.expect)


def check_refused(case: mc.Case, path: Path, error: BaseException) -> None:
    assert isinstance(error, expected_exception(case)), f"{case.id}: raised {type(error).__name__}: {error}"
    assert str(path) in str(error), f"{case.id}: the message does not name the file: {error}"
    assert case.says in str(error).lower(), f"{case.id}: the message does not say {case.says!r}: {error}"
    if isinstance(error, npyfeed.NpyFormatError):
        assert isinstance(error, ValueError)
        assert error.path == str(path)
        assert error.reason and str(error.reason) in str(error)
    if isinstance(error, OSError):
        assert error.filename == str(path)
        if case.errno:
            assert error.errno == getattr(errno, case.errno)


def check_accepted(case: mc.Case, op: str, path: Path, result, oracle: Path) -> None:
    """`result` of `op` on `path` is what np.load makes of `oracle` (`path`, or the twin of a deliberate difference)."""
    expected = numpy_load(oracle)
    if op == "read_header":
        header = result
        assert header.dtype == expected.dtype and header.dtype.str == expected.dtype.str
        assert header.dtype.descr == expected.dtype.descr and header.dtype.fields == expected.dtype.fields
        assert header.shape == expected.shape
        assert header.nbytes == expected.nbytes
        assert header.file_size == os.path.getsize(path) >= header.data_offset + header.nbytes
        raw = path.read_bytes()[header.data_offset:header.data_offset + header.nbytes]
        assert raw == expected.tobytes(order="F" if header.fortran_order else "C")
        return
    array = result
    assert type(array) is np.ndarray
    assert array.dtype == expected.dtype and array.dtype.str == expected.dtype.str
    assert array.dtype.descr == expected.dtype.descr and array.dtype.fields == expected.dtype.fields
    assert array.shape == expected.shape
    if flags_are_comparable(expected):
        assert array.flags.c_contiguous == expected.flags.c_contiguous
        assert array.flags.f_contiguous == expected.flags.f_contiguous
    if expected.size:
        assert array.strides == expected.strides
        assert array.flags.writeable == (op != "mmap")
    assert array.tobytes(order="A") == expected.tobytes(order="A")


# --------------------------------------------------------------------------------------------------------
# Crash canary first: the whole corpus, every entry point, in a fresh interpreter. A segfault or a hang
# (the FIFO) shows up here as a return code or a timeout rather than killing the test session.

_CHILD = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    from corpus import make_corpus as mc
    import npyfeed
    paths = mc.write_all(Path(sys.argv[2]))
    for case in mc.CASES:
        if case.id not in paths:
            continue
        for op in ("read_header", "mmap", "read", "direct"):
            try:
                if op == "read_header":
                    npyfeed.read_header(paths[case.id])
                else:
                    npyfeed.load(paths[case.id], mode=op)
                outcome = "accept"
            except Exception as e:
                outcome = type(e).__name__
            print(json.dumps([case.id, op, outcome]), flush=True)
""")


def test_whole_corpus_in_a_subprocess(tmp_path):
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(TESTS_DIR), str(tmp_path)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = {}
    for line in proc.stdout.splitlines():
        case_id, op, outcome = json.loads(line)
        seen[case_id, op] = outcome
    runnable = [c for c in mc.CASES if not (c.needs_non_root and IS_ROOT)]
    assert len(seen) == len(runnable) * len(OPS)
    wrong = [f"{c.id}/{op}: {seen[c.id, op]} (expected {c.expect})" for c in runnable for op in OPS
             if seen[c.id, op] != c.expect and not c.known_bug]
    assert not wrong, "\n".join(wrong)


# --------------------------------------------------------------------------------------------------------
# One id per case and entry point.

@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("case", case_params())
def test_case(case: mc.Case, op: str, corpus, tmp_path):
    path = corpus[case.id]
    if case.build is mc._fifo:
        # A regression here would block in open(); keep it out of this process.
        code = (f"import npyfeed, sys\ntry:\n    {'npyfeed.read_header(sys.argv[1])' if op == 'read_header' else f'npyfeed.load(sys.argv[1], mode={op!r})'}"
                f"\nexcept npyfeed.NpyFormatError as e:\n    assert sys.argv[1] in str(e)\n    print('refused')")
        proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and proc.stdout.strip() == "refused", proc.stderr
        return
    if case.accepted:
        check_accepted(case, op, path, run_op(op, path), corpus[case.same_as or case.id])
    else:
        with pytest.raises(Exception) as info:
            run_op(op, path)
        check_refused(case, path, info.value)


@pytest.mark.parametrize("case", case_params(for_npyfeed=False))
def test_numpy_still_does_this(case: mc.Case, corpus):
    """The numpy outcome written next to each case is what np.load does."""
    if case.numpy == mc.NUMPY_HANGS:
        pytest.skip("np.load blocks forever on this file")
    seen = mc.numpy_outcome(corpus[case.id])
    if (np.__version__.rsplit(".", 1)[0], sys.version_info[:2]) == RECORDED_WITH:
        assert seen == case.numpy
    else:  # exception types vary between versions; accepting or refusing must not
        assert (seen == mc.ACCEPT, seen == mc.NUMPY_NPZ) == (case.numpy == mc.ACCEPT, case.numpy == mc.NUMPY_NPZ)


def test_corpus_is_consistent():
    assert len(mc.CASES) >= 60
    for case in mc.CASES:
        numpy_refuses = case.numpy not in (mc.ACCEPT, mc.NUMPY_NPZ, mc.NUMPY_HANGS)
        assert bool(case.differs) == (numpy_refuses == case.accepted), f"{case.id}: mark (only) the differences"
        assert case.expect == mc.ACCEPT or case.expect == mc.NPYFORMAT or issubclass(expected_exception(case), OSError)
        assert (case.data is None) != (case.build is None)
    documented = (TESTS_DIR / "corpus" / "DIFFERENCES.md").read_text()
    for case in mc.CASES:
        if case.differs:
            assert f"`{case.id}`" in documented, f"{case.id} differs from numpy but is not in DIFFERENCES.md"


def test_max_header_size_can_be_raised(corpus):
    path = corpus["hlen_v2_10001_over_cap"]
    with pytest.raises(npyfeed.NpyFormatError, match="max_header_size"):
        npyfeed.read_header(path)
    expected = np.load(path, max_header_size=10001)
    assert npyfeed.read_header(path, max_header_size=10001).shape == expected.shape
    for mode in OPS[1:]:
        assert np.array_equal(npyfeed.load(path, mode=mode, max_header_size=10001), expected)


# --------------------------------------------------------------------------------------------------------
# Invariants (issue 4 item 5).

def _fds() -> list:
    out = []
    for name in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink(f"/proc/self/fd/{name}"))
        except OSError:  # the descriptor listdir itself used
            pass
    return out


def _maps() -> list:
    with open("/proc/self/maps") as f:
        return f.read().splitlines()


def test_failures_leak_no_descriptors_or_mappings(corpus):
    refused = [path for case_id, path in corpus.items() if not mc.BY_ID[case_id].accepted]
    where = str(Path(refused[0]).parent)

    def fail_all():
        for path in refused:
            for op in OPS:
                with pytest.raises((npyfeed.NpyFormatError, OSError)):
                    run_op(op, path)
        gc.collect()

    fail_all()  # warm up: thread pool, lazy imports, allocator arenas
    fds, maps = _fds(), _maps()
    for _ in range(3):
        fail_all()
    assert [f for f in _fds() if f.startswith(where)] == []
    assert [m for m in _maps() if where in m] == []
    assert len(_fds()) == len(fds)
    # Every mapping npyfeed made for these failures is gone. Three rounds fail len(refused) * len(OPS) times
    # each (hundreds), so a leak of anything per failure would add hundreds; other frameworks' threads in this
    # process (TensorFlow, JAX, loaded by earlier test files) may map a stack or an arena meanwhile: one or two.
    assert len(_maps()) - len(maps) <= 2, (len(refused) * len(OPS), sorted(set(_maps()) - set(maps)))


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.parametrize(("mode", "rounds"), [("read", 10), ("mmap", 5), ("direct", 3)])
def test_memory_is_freed_when_arrays_die(mode, rounds, tmp_path):
    size = 100 << 20
    path = tmp_path / "big.npy"
    with open(path, "wb") as f:  # a sparse file: no disk writes, reads still fill every page
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (size // 4,)})
        f.truncate(f.tell() + size)
    gc.collect()
    before = _rss()
    array = npyfeed.load(path, mode=mode, populate=True)
    held = _rss()
    assert held - before > 0.9 * size  # the measure sees the array (so this test can fail)
    del array
    for _ in range(rounds):
        array = npyfeed.load(path, mode=mode, populate=True)
        assert array.nbytes == size
        del array
    gc.collect()
    assert _rss() - before < 0.5 * size


@pytest.mark.parametrize("mode", OPS[1:])
def test_load_factor_files_leaves_the_dict_alone_on_failure(mode, corpus, tmp_path):
    good = tmp_path / "good.npy"
    new = tmp_path / "new.npy"
    np.save(good, np.arange(6.0))
    np.save(new, np.arange(3))
    old = np.zeros(2)
    store = {"good": old, "other": "kept"}
    snapshot = dict(store)
    for bad in ("data_short_by_one", "dtype_object", "file_directory", "magic_wrong_N", "dtype_bad_datetime_unit"):
        with pytest.raises((npyfeed.NpyFormatError, OSError), match=bad):
            npyfeed.load_factor_files([good, new, corpus[bad]], store, mode=mode)
        assert store.keys() == snapshot.keys() and all(store[k] is snapshot[k] for k in store)
    # Without the bad file the same call does fill it (so the checks above can fail).
    assert npyfeed.load_factor_files([good, new], store, mode=mode) is store
    assert store["good"] is not old and np.array_equal(store["new"], np.arange(3))


# --------------------------------------------------------------------------------------------------------
# Layout outside the brackets (issue 12): every arrangement of up to four pieces of whitespace, newlines,
# comment lines and continuations before and after the dict, with ast.literal_eval, run here, as the oracle.
# numpy calls it on the header text; for v1/v2 numpy also retries a refused text through its Python 2 filter,
# whose accidental repairs npyfeed does not follow (DIFFERENCES.md): there only numpy may accept more.

_LAYOUT_PIECES = (" ", "\t", "\x0c", "\n", "\r", "\r\n", "\\\n", "#c\n", "\\\r\n")
_LAYOUT_DICT = mc.header_text("<i4", (2, 3))


def _layouts():
    import itertools

    for n in range(5):
        for pieces in itertools.product(_LAYOUT_PIECES, repeat=n):
            yield "".join(pieces)


@pytest.mark.parametrize("version", [(1, 0), (3, 0)], ids=["v1", "v3"])
@pytest.mark.parametrize("where", ["before", "after"])
def test_layout_outside_the_dict_matches_literal_eval(where, version):
    import ast
    import io

    data = mc.content("<i4", (2, 3)).tobytes()
    wrong = []
    count = 0
    for layout in _layouts():
        for end in ("", "#c") if where == "after" else ("",):
            text = layout + _LAYOUT_DICT + "   \n" if where == "before" else _LAYOUT_DICT + layout + end
            blob = mc.npy(text, data, version=version, pad=False)
            count += 1
            try:
                ast.literal_eval(text)
                oracle = True
            except SyntaxError:
                oracle = False
            try:
                npyfeed._core.parse_header_bytes(blob)
                ours = True
            except npyfeed.NpyFormatError as e:
                ours = False
                assert "at byte" in str(e)
            try:
                numpy_load(io.BytesIO(blob))
                theirs = True
            except Exception:  # noqa: BLE001 - ValueError, or tokenize.TokenError from the Python 2 filter
                theirs = False
            if ours != oracle or (ours and not theirs) or (version == (3, 0) and ours != theirs):
                wrong.append(f"{text!r}: npyfeed {ours}, ast.literal_eval {oracle}, np.load {theirs}")
    assert count > 7000
    assert not wrong, f"{len(wrong)} of {count} differ:\n" + "\n".join(wrong[:20])


# --------------------------------------------------------------------------------------------------------
# Cases that mean something only without root's privileges (root reads a chmod 000 file), run as root too:
# in a child that drops to user nobody.

_UNPRIVILEGED_IMPORTS = "import json, sys\nimport numpy as np\nimport npyfeed\n"  # while still root
_UNPRIVILEGED_CASE = """
    path, outcomes = sys.argv[1], {}
    for op in ("read_header", "mmap", "read", "direct", "numpy"):
        try:
            if op == "numpy":
                np.load(path, allow_pickle=False)
            elif op == "read_header":
                npyfeed.read_header(path)
            else:
                npyfeed.load(path, mode=op)
            outcomes[op] = ["accept", "", ""]
        except Exception as e:
            outcomes[op] = [type(e).__name__, getattr(e, "filename", None) or "", str(e)]
    print(json.dumps(outcomes))
"""


@pytest.mark.parametrize("case", [c for c in mc.CASES if c.needs_non_root], ids=lambda c: c.id)
def test_case_as_an_unprivileged_user(case: mc.Case):
    from _sandbox import run_unprivileged, shared_dir

    with shared_dir() as directory:
        path = case.materialize(directory)
        proc = run_unprivileged(_UNPRIVILEGED_CASE, path, imports=_UNPRIVILEGED_IMPORTS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    outcomes = json.loads(proc.stdout.splitlines()[-1])
    assert outcomes.pop("numpy")[0] == case.numpy
    for op, (outcome, filename, message) in outcomes.items():
        assert outcome == case.expect, (op, outcome, message)
        assert filename == str(path) and str(path) in message, (op, message)
