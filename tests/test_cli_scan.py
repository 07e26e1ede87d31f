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
