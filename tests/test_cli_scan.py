"""``npyfeed scan``: finds every .npy file, checks them in parallel, lists the bad ones, sets the exit status."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
from pathlib import Path

import npyfeed
import numpy as np
import pytest
from corpus import make_corpus as mc
from npyfeed import cli


def run_cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "npyfeed", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def dataset(tmp_path) -> Path:
    """stock/{a,b}/factor/*.npy like the users' data, a label file, and a file that is not .npy."""
    for stock in ("a", "b"):
        (tmp_path / stock / "factor").mkdir(parents=True)
        np.save(tmp_path / stock / "factor" / "k1.npy", np.arange(48, dtype=np.float32).reshape(12, 4))
        np.save(tmp_path / stock / "factor" / "k2.npy", np.arange(20, dtype=np.float32).reshape(5, 4))
    np.save(tmp_path / "a" / "label.npy", np.arange(12, dtype=np.int64))
    (tmp_path / "a" / "notes.txt").write_text("not an array")
    return tmp_path


def add_bad(root: Path) -> dict:
    """Bad files under `root`: path -> a word their reason must contain."""
    truncated = root / "a" / "factor" / "truncated.npy"
    np.save(truncated, np.arange(100.0))
    truncated.write_bytes(truncated.read_bytes()[:-8])
    objects = root / "b" / "objects.npy"
    np.save(objects, np.array([{"x": 1}, None], dtype=object), allow_pickle=True)
    magic = root / "b" / "factor" / "magic.npy"
    magic.write_bytes(b"\x93NUMPX" + bytes(100))
    return {truncated: "truncated", objects: "object", magic: "magic"}


def summary_line(stdout: str) -> str:
    return next(line for line in stdout.splitlines() if line.startswith("Checked "))


def test_all_good(dataset):
    proc = run_cli("scan", dataset)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert summary_line(proc.stdout) == "Checked 5 .npy files (headers, dtypes and sizes): 5 ok, 0 bad"
    assert "<f4  4 files" in proc.stdout and "<i8  1 file" in proc.stdout
    assert "(12, 4)" in proc.stdout and "(5, 4)" in proc.stdout and "(12,)" in proc.stdout
    assert "Bad files" not in proc.stdout
    assert proc.stderr == ""  # no progress bar when stderr is not a terminal


def test_bad_files_are_listed_with_their_reason(dataset):
    bad = add_bad(dataset)
    proc = run_cli("scan", dataset / "a", dataset / "b", "--threads", 3)
    assert proc.returncode == 1
    assert summary_line(proc.stdout) == "Checked 8 .npy files (headers, dtypes and sizes): 5 ok, 3 bad"
    listed = proc.stdout.split("Bad files:\n", 1)[1].splitlines()
    assert len(listed) == len(bad)
    for path, word in bad.items():
        line = next(line for line in listed if line.startswith(f"  {path}: "))
        assert word in line.lower()


def test_in_process_main(dataset, capsys):
    add_bad(dataset)
    assert cli.main(["scan", str(dataset), "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "5 ok, 3 bad" in out
    assert "dtypes:" not in out  # --quiet leaves out the dtype and shape tables
    (dataset / "b" / "objects.npy").unlink()
    (dataset / "b" / "factor" / "magic.npy").unlink()
    (dataset / "a" / "factor" / "truncated.npy").unlink()
    assert cli.main(["scan", str(dataset)]) == 0


@pytest.mark.parametrize("argv", [[], ["scan"], ["scan", "x", "--threads", "0"], ["scan", "x", "--threads", "two"],
                                  ["scan", "x", "--max-header-size", "-1"], ["no-such-command"]])
def test_usage_errors_exit_2(argv, capsys):
    assert cli.main(argv) == 2
    assert "usage:" in capsys.readouterr().err


def test_usage_error_from_the_command_line():
    proc = run_cli("scan", "--threads", "0", ".")
    assert proc.returncode == 2 and "positive integer" in proc.stderr


def test_paths_not_found_and_nothing_found(tmp_path, capsys):
    missing = tmp_path / "missing"
    assert cli.main(["scan", str(missing)]) == 1
    assert f"{missing}: FileNotFoundError" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    assert cli.main(["scan", str(tmp_path / "empty")]) == 1
    assert "No .npy files found" in capsys.readouterr().out


def test_named_files_whatever_their_extension_and_no_duplicates(dataset, capsys):
    other = dataset / "array.bin"
    np.save(other, np.zeros(3))
    os.rename(str(other) + ".npy", other)
    assert cli.main(["scan", str(other), str(dataset), str(dataset / "a"), str(dataset / "a" / "label.npy")]) == 0
    assert "Checked 6 .npy files" in capsys.readouterr().out


def test_max_header_size(dataset, capsys):
    big = dataset / "big_header.npy"
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }"
    text = (header + " " * (20000 - len(header) - 1) + "\n").encode()
    big.write_bytes(b"\x93NUMPY\x02\x00" + len(text).to_bytes(4, "little") + text + bytes(8))
    assert cli.main(["scan", str(big)]) == 1
    assert "max_header_size" in capsys.readouterr().out
    assert cli.main(["scan", str(big), "--max-header-size", "20000"]) == 0


def test_headers_are_checked_in_parallel(dataset, monkeypatch, capsys):
    # Two checks must be in flight at once to pass the barrier; a serial scan breaks it (after the timeout,
    # which only guards against hanging).
    barrier = threading.Barrier(2, timeout=30)
    real = npyfeed.read_header

    def read_header(path, **kw):
        if Path(path).name == "k1.npy":
            barrier.wait()
        return real(path, **kw)

    monkeypatch.setattr(npyfeed.loading, "read_header", read_header)  # what the CLI calls
    assert cli.main(["scan", str(dataset), "--threads", "2"]) == 0
    assert not barrier.broken


def test_data_reads_every_good_file_in_bounded_batches(dataset, monkeypatch, capsys):
    bad = add_bad(dataset)
    loaded, real = [], npyfeed.load_many

    def load_many(paths, **kw):
        assert kw["mode"] == "read"
        assert len(paths) <= 2
        loaded.extend(paths)
        return real(paths, **kw)

    monkeypatch.setattr(npyfeed.loading, "load_many", load_many)  # what the CLI calls
    monkeypatch.setattr(cli, "DATA_BATCH_FILES", 2)
    assert cli.main(["scan", str(dataset), "--data"]) == 1
    out = capsys.readouterr().out
    assert "(headers, dtypes, sizes and data): 5 ok, 3 bad" in out
    assert sorted(loaded) == sorted(str(p) for p in dataset.rglob("*.npy") if p not in bad)


def test_data_isolates_a_file_that_fails_to_read(dataset, monkeypatch, capsys):
    # An IO error that only a full read finds (a bad disk block): the other files are still read.
    victim = str(dataset / "b" / "factor" / "k1.npy")
    loaded, real = [], npyfeed.load_many

    def load_many(paths, **kw):
        if victim in paths:
            raise OSError(5, "Input/output error", victim)
        loaded.extend(paths)
        return real(paths, **kw)

    monkeypatch.setattr(npyfeed.loading, "load_many", load_many)  # what the CLI calls
    assert cli.main(["scan", str(dataset), "--data"]) == 1
    out = capsys.readouterr().out
    assert "4 ok, 1 bad" in out
    assert f"{victim}: OSError: Input/output error" in out
    assert len(loaded) == 4 and victim not in loaded


def test_data_on_good_files_from_the_command_line(dataset):
    proc = run_cli("scan", "--data", dataset)
    assert proc.returncode == 0
    assert "(headers, dtypes, sizes and data): 5 ok, 0 bad" in proc.stdout


class _Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize(("tty", "quiet", "bar"), [(True, False, True), (True, True, False), (False, False, False)])
def test_progress_bar_only_on_a_terminal(dataset, monkeypatch, capsys, tty, quiet, bar):
    pytest.importorskip("tqdm")
    stderr = _Terminal() if tty else io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    assert cli.main(["scan", str(dataset)] + (["--quiet"] if quiet else [])) == 0
    assert ("headers" in stderr.getvalue()) == bar


def test_demo_hook_is_optional(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "npyfeed.demo", None)  # as if the module did not exist
    assert cli.main(["demo"]) == 2
    assert "invalid choice: 'demo'" in capsys.readouterr().err
    assert cli.main(["scan", "--help"]) == 0


def test_scan_finds_exactly_the_corpus_files_npyfeed_refuses(tmp_path):
    paths = mc.write_all(tmp_path)
    proc = run_cli("scan", "--data", "--quiet", tmp_path, timeout=300)  # the corpus has a FIFO: must not hang
    assert proc.returncode == 1, proc.stderr
    listed = {line.split(": ", 1)[0].strip() for line in proc.stdout.split("Bad files:\n", 1)[1].splitlines()}
    expected = {str(paths[c.id]) for c in mc.CASES if c.id in paths and not c.accepted and c.build is not mc._mkdir}
    expected.add(str(paths["file_symlink_loop"]).replace(".npy", "_other.npy"))  # the loop's other half
    known_bugs = {cli.display_path(paths[c.id]) for c in mc.CASES if c.known_bug}
    assert listed - known_bugs == expected


def test_names_that_are_not_utf8_are_printed_escaped(tmp_path):
    name = os.fsdecode(b"caf\xe9.npy")
    np.save(tmp_path / "ok.npy", np.zeros(3))
    (tmp_path / name).write_bytes((tmp_path / "ok.npy").read_bytes())
    (tmp_path / "truncated.npy").write_bytes((tmp_path / "ok.npy").read_bytes()[:-1])
    proc = run_cli("scan", tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{tmp_path / 'truncated.npy'}: NpyFormatError" in proc.stdout
    bad = proc.stdout.split("Bad files:\n", 1)[1]
    assert "caf\\xe9.npy" in bad or "caf" not in bad  # listed with an escape while the binding refuses it


# ----------------------------------------------------------------------------------------------------------
# scan FACTOR_DIR LABEL_DIR --index INDEX... --window W: an index checked against its files


def index_dataset(root: Path) -> tuple:
    """Keys k0..k5 and two index files holding one problem of each kind; returns (index files, factor dir,
    label dir, {kind: [where, ...]}) with every problem's place as the report must name it."""
    factors, labels = root / "factor", root / "label"
    factors.mkdir()
    labels.mkdir()
    for k in range(6):
        np.save(factors / f"k{k}.npy", np.arange(60, dtype=np.float32).reshape(20, 3))
        np.save(labels / f"k{k}.npy", np.arange(20, dtype=np.float32).reshape(20, 1))
    np.save(factors / "k2.npy", np.arange(60, dtype=np.float64).reshape(20, 3))   # float64 among float32
    np.save(labels / "k3.npy", np.arange(19, dtype=np.float32).reshape(19, 1))    # 19 label rows, 20 factor rows
    np.save(factors / "k4.npy", np.arange(80, dtype=np.float32).reshape(20, 4))   # rows of 4, not 3
    (factors / "k5.npy").write_bytes(b"\x93NUMPY\x01\x00garbage")                   # a corrupt header
    day1 = root / "day1.idx"
    day1.write_text("feature_index,label_index,key\n"      # 1: a header line
                    "4,4,k0\n"                             # 2
                    "2,2,k0\n"                             # 3: window [-2, 3) outside (W=5)
                    "\n"                                   # 4: blank, fine
                    "6,25,k1\n"                            # 5: label row 25 of 20
                    "7,7,k0\n"                             # 6
                    "7,7,k0\n"                             # 7: repeats line 6
                    "5,5,ghost\n"                          # 8: no files
                    "1,2\n"                                # 9: a missing field
                    "5000000000,5,k1\n"                    # 10: a window beyond int32, outside
                    "8,8,k2\n9,9,k3\n9,9,k4\n9,9,k5\n")    # 11-14
    day2 = root / "day2.idx"
    day2.write_text("4,4,k0\n"                             # 1: repeats day1.idx:2
                    "10,10,k1\n")
    where = {
        "malformed": [f"{day1}:1", f"{day1}:9"],
        "no_file": [str(factors / "ghost.npy"), str(labels / "ghost.npy")],
        "bad_file": [str(factors / "k5.npy")],
        "row_shape": [str(factors / "k4.npy")],
        "row_count": [str(labels / "k3.npy")],
        "window": [f"{day1}:3", f"{day1}:10"],
        "label_row": [f"{day1}:5"],
        "duplicate": [f"{day1}:7", f"{day2}:1"],
        "dtype": [str(factors / "k2.npy")],
    }
    return [day1, day2], factors, labels, where


def test_check_index_reports_every_problem_with_its_place(tmp_path):
    index, factors, labels, where = index_dataset(tmp_path)
    report = npyfeed.check_index(index, factors, labels, 5)
    assert not report.ok
    assert report.counts == {kind: len(places) for kind, places in where.items()}
    assert {kind: [p.where for p in report.problems if p.kind == kind] for kind in where} == where
    assert report.lines == 13 and report.keys == 7  # malformed and blank lines are not samples
    by_place = {p.where: p for p in report.problems}
    assert "feature_index is not an integer" in by_place[f"{index[0]}:1"].message
    assert "'feature_index,label_index,key'" in by_place[f"{index[0]}:1"].message
    assert "window rows [-2, 3) outside" in by_place[f"{index[0]}:3"].message
    assert "window rows [4999999996, 5000000001)" in by_place[f"{index[0]}:10"].message
    assert "label row 25 outside" in by_place[f"{index[0]}:5"].message
    assert f"the same line as {index[0]}:6" in by_place[f"{index[0]}:7"].message
    assert f"the same line as {index[0]}:2" in by_place[f"{index[1]}:1"].message
    assert f"lines start at {index[0]}:8" in by_place[str(factors / "ghost.npy")].message
    assert "19 rows, but" in by_place[str(labels / "k3.npy")].message
    assert "float64 among 4 files of float32" in by_place[str(factors / "k2.npy")].message
    severities = {p.kind: p.severity for p in report.problems}
    assert severities.pop("duplicate") == severities.pop("dtype") == "warning"
    assert set(severities.values()) == {"error"}
    # What the source accepts is a warning there.
    lenient = npyfeed.check_index(index, factors, labels, 5, bounds="skip", missing="skip")
    assert {p.kind for p in lenient.warnings} >= {"window", "label_row", "no_file"}


def test_scan_index_lists_everything_and_fails(tmp_path):
    index, factors, labels, where = index_dataset(tmp_path)
    r = run_cli("scan", factors, labels, "--index", *index, "--window", 5)
    assert r.returncode == 1, r.stderr
    for places in where.values():
        for place in places:
            assert f"  {place}: " in r.stdout, place
    assert "errors" in r.stdout.splitlines()[0] and "9 x" not in r.stdout
    assert "error: 2 x malformed" in r.stdout and "warning: 2 x duplicate" in r.stdout


def test_scan_index_warnings_only_exit_zero(tmp_path):
    factors, labels = tmp_path / "f", tmp_path / "l"
    factors.mkdir()
    labels.mkdir()
    np.save(factors / "a.npy", np.zeros((10, 2), np.float32))
    np.save(factors / "b.npy", np.zeros((10, 2), np.float64))
    for k in "ab":
        np.save(labels / f"{k}.npy", np.zeros(10, np.float32))
    (tmp_path / "i.idx").write_text("3,3,a\n4,4,b\n3,3,a\n")
    r = run_cli("scan", factors, labels, "--index", tmp_path / "i.idx", "--window", 2)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{tmp_path / 'i.idx'}:3: the same line as {tmp_path / 'i.idx'}:1" in r.stdout
    assert "0 errors, 2 warnings" in r.stdout
    # ... and a clean index: no problem, and the source opens.
    (tmp_path / "i.idx").write_text("3,3,a\n4,4,b\n")
    report = npyfeed.check_index(tmp_path / "i.idx", factors, labels, 2)
    assert report.counts == {"dtype": 1} and report.ok
    assert len(npyfeed.WindowSource(tmp_path / "i.idx", factors, labels, 2)) == 2


def test_scan_index_missing_folder_and_usage(tmp_path):
    index, factors, labels, _ = index_dataset(tmp_path)
    report = npyfeed.check_index(index, tmp_path / "nowhere", labels, 5)
    assert [(p.kind, p.where) for p in report.errors if p.kind == "folder"] == [("folder", str(tmp_path / "nowhere"))]
    assert "no_file" not in report.counts
    assert run_cli("scan", factors, "--index", *index, "--window", 5).returncode == 2
    assert run_cli("scan", factors, labels, "--index", *index).returncode == 2
    r = run_cli("scan", factors, labels, "--index", tmp_path / "none.idx", "--window", 5)
    assert r.returncode == 1 and f"{tmp_path / 'none.idx'}: no such file" in r.stdout


def test_check_index_file_with_nul_is_left_out(tmp_path):
    index, factors, labels, _ = index_dataset(tmp_path)
    (tmp_path / "binary.idx").write_bytes(b"1,1,k0\n\x00\x01")
    report = npyfeed.check_index([tmp_path / "binary.idx", index[1]], factors, labels, 5)
    assert [(p.kind, p.where) for p in report.errors] == [("index_file", str(tmp_path / "binary.idx"))]
    assert report.lines == 2


def test_check_index_is_vectorised(tmp_path):
    """A million lines over a thousand keys in well under the time Python takes per line."""
    import time

    factors, labels = tmp_path / "f", tmp_path / "l"
    factors.mkdir()
    labels.mkdir()
    for k in range(1000):
        np.save(factors / f"k{k}.npy", np.zeros((1000, 2), np.float32))
        np.save(labels / f"k{k}.npy", np.zeros(1000, np.float32))
    rows = np.arange(1_000_000)
    text = "\n".join(f"{r % 1000},{r % 1000},k{r // 1000}" for r in rows.tolist())
    (tmp_path / "big.idx").write_text(text + "\n1000,1,k0\n")
    start = time.perf_counter()
    report = npyfeed.check_index(tmp_path / "big.idx", factors, labels, 1)
    elapsed = time.perf_counter() - start
    assert report.lines == 1_000_001 and report.counts == {"window": 1}
    assert report.problems[0].where == f"{tmp_path / 'big.idx'}:1000001"
    assert elapsed < 20, elapsed
