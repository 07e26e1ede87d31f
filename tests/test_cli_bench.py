"""``npyfeed bench`` and ``npyfeed.bench.run``: the figures it prints and writes, the recommendation that follows
from them, cold rows only where the page cache can be dropped, clear errors naming the file, and nothing written
to the data's folders."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import npyfeed
import numpy as np
import pytest
from npyfeed import _core, _layout, bench, cli
from npyfeed.bench import _run as _bench_run
from npyfeed.bench import measure

KEYS, ROWS, COLS, LABELS, W, B = 10, 300, 8, 2, 20, 32
HAVE_TF = importlib.util.find_spec("tensorflow") is not None
HAVE_MPL = importlib.util.find_spec("matplotlib") is not None


def _save(path, array) -> None:
    """np.save, then fsync: written-back pages are ones posix_fadvise can drop."""
    with open(path, "wb") as f:
        np.save(f, array, allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())


def make_data(root: Path) -> tuple:
    """KEYS keys of (ROWS, COLS) float32 factors and (ROWS, LABELS) labels; two index files (keys split between
    them). Returns (index files, factor dir, label dir)."""
    base = root / "S" / "train"
    rng = np.random.default_rng(0)
    entries = [], []
    for k in range(KEYS):
        key = f"k{k:03d}"
        _layout.write_key(base, key, rng.standard_normal((ROWS, COLS), dtype=np.float32),
                          rng.standard_normal((ROWS, LABELS), dtype=np.float32), save=_save)
        entries[k % 2].extend((i, i, key) for i in range(W - 1, ROWS, 2))
    index = [_layout.write_index(base / f"index{i}.txt", _layout.index_text(e), sync=True)
             for i, e in enumerate(entries)]
    return index, str(base / "factor"), str(base / "label")


def snapshot(root: Path) -> dict:
    """Every path under `root`: kind, size, mtime (ns) and sha256 of files."""
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
        out[str(path.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns, digest)
    return out


def residency(paths) -> float:
    sizes, _ = _core.warm_files([str(p) for p in paths], 2, False, None)
    return sum(b for _, b, _ in sizes) / sum(s for s, _, _ in sizes)


def data_files(factor_dir, label_dir) -> list:
    return sorted(str(p) for d in (factor_dir, label_dir) for p in Path(d).glob("*.npy"))


def drop_works(paths) -> bool:
    """Whether this filesystem lets posix_fadvise(DONTNEED) drop these files (tmpfs does not)."""
    measure.evict(paths)
    dropped = residency(paths) <= bench.MAX_COLD_RESIDENCY
    npyfeed.warm(paths, lock=False)
    return dropped


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """One CLI run over the whole data set (cold rows, TensorFlow if installed, --json, --plot when matplotlib is):
    the data root, its snapshot before, the exit status, stdout, the JSON and the files' residency around it."""
    root = tmp_path_factory.mktemp("bench-data")
    out = tmp_path_factory.mktemp("bench-out")
    index, factor_dir, label_dir = make_data(root)
    files = data_files(factor_dir, label_dir)
    npyfeed.warm(files, lock=False)
    before = snapshot(root)
    argv = ["bench", *index, factor_dir, label_dir, "--window", str(W), "--batch-size", str(B), "--processes", "3",
            "--seconds", "0.2", "--json", str(out / "report.json"), "--quiet"]
    if HAVE_MPL:
        argv += ["--plot", str(out / "report.svg")]
    if not HAVE_TF:
        argv.append("--no-tf")
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        status = cli.main(argv)
    return {"root": root, "out": out, "before": before, "status": status, "stdout": stdout.getvalue(),
            "stderr": stderr.getvalue(), "files": files, "drop_works": drop_works(files[:2]),
            "report": json.loads((out / "report.json").read_text()) if status == 0 else None,
            "resident_after": residency(files)}


def test_the_run_succeeds_and_prints_a_table(ran):
    assert ran["status"] == 0, ran["stderr"]
    header = next(line for line in ran["stdout"].splitlines() if line.startswith("row "))
    for column in ("samples/s", "GB/s", "x iter", "limit", "x limit"):
        assert column in header
    assert "recommendation: WindowSource(" in ran["stdout"]


def test_the_report_fits_120_columns(ran):
    lines = ran["stdout"].splitlines()
    assert max(map(len, lines)) <= bench.WIDTH == 120, max(lines, key=len)


def test_the_json_holds_every_row_and_figure(ran):
    rep = ran["report"]
    d = rep["data"]
    assert (d["keys"], d["window"], d["batch_size"], d["sampled"]) == (KEYS, W, B, False)
    assert d["samples"] == KEYS * len(range(W - 1, ROWS, 2))
    assert d["bytes"] == sum(os.path.getsize(p) for p in ran["files"])
    assert d["factor_shape"] == [ROWS, COLS] and d["dtype"] == "float32"
    rows = {(r["name"], r["cache"]): r for r in rep["rows"]}
    warm = [bench.DICT_ROW, bench.NP_LOAD_ROW, bench.ITERATOR, 'npyfeed mode="read"']
    warm += [bench.TF_ROW] if HAVE_TF else []
    for name in warm:
        r = rows[(name, "warm")]
        assert r["skipped"] is None and r["samples_per_s"] > 0 and r["batches"] >= 1, r
    out_bytes = 4 * (W * COLS + LABELS)
    iterator = rows[(bench.ITERATOR, "warm")]["samples_per_s"]
    copy = rep["limits"]["copy"]
    assert copy["samples_per_s"] == pytest.approx(copy["gbps"] * 1e9 / out_bytes)
    for r in rep["rows"]:
        if r["skipped"]:
            continue
        assert r["gbps"] == pytest.approx(r["samples_per_s"] * out_bytes / 1e9)
        if r["cache"] == "warm":
            assert r["vs_iterator"] == pytest.approx(r["samples_per_s"] / iterator)
            assert r["limit"] == "copy" and r["vs_limit"] == pytest.approx(r["samples_per_s"] / copy["samples_per_s"])
    assert {"copy_1", "copy"} <= set(rep["limits"])
    assert rep["machine"]["cpus"] >= 1 and rep["processes"] == 3


def test_cold_rows_are_measured_where_the_cache_can_be_dropped(ran):
    rows = {(r["name"], r["cache"]): r for r in ran["report"]["rows"]}
    cold = [rows[(f'npyfeed mode="{m}"', "cold")] for m in bench.MODES] + [rows[(bench.BLOCKS_ROW, "cold")]]
    if not ran["drop_works"]:
        dropped = [r for r in cold if "direct" not in r["name"]]  # O_DIRECT is measured either way
        assert all(r["skipped"] and "stayed in the page cache" in r["skipped"] for r in dropped)
        return
    assert all(r["skipped"] is None and r["samples_per_s"] > 0 for r in cold), cold
    limits = ran["report"]["limits"]
    assert {"disk_seq", "disk_random", "disk_random_cached"} <= set(limits)
    by_limit = {r["name"]: r["limit"] for r in cold}
    # O_DIRECT against the disk's O_DIRECT reads; the modes that read through the page cache against the same
    # reads through it; blocks against sequential reads (or the copy, where that is lower).
    assert by_limit['npyfeed mode="direct"'] in ("disk_random", "copy")
    assert by_limit['npyfeed mode="mmap"'] in ("disk_random_cached", "copy")
    assert by_limit['npyfeed mode="read"'] in ("disk_random_cached", "copy")
    assert by_limit[bench.BLOCKS_ROW] in ("disk_seq", "copy")
    assert "page cache" in limits["disk_random_cached"]["name"] and limits["disk_random_cached"]["samples_per_s"] > 0


def footnotes(text: str) -> dict:
    """The numbered notes under the tables of a printed report, their wrapped lines joined: {"[1]": text}."""
    notes, last = {}, None
    for line in text.splitlines():
        found = re.match(r"(\[\d+\]) (.*)", line)
        if found:
            last = found.group(1)
            notes[last] = found.group(2)
        elif last and line.startswith("    ") and line.strip():
            notes[last] += " " + line.strip()
        else:
            last = None
    return notes


def test_the_printed_figures_are_the_json_figures(ran):
    lines = ran["stdout"].splitlines()
    notes = footnotes(ran["stdout"])
    for r in ran["report"]["rows"]:
        line = next(ln for ln in lines if ln.startswith(f"{r['name']} ") and f" {r['cache']} " in ln)
        marker = line.split()[-1]
        if r["skipped"]:
            assert notes[marker] == "skipped: " + r["skipped"], line
            continue
        assert f" {r['samples_per_s']:,.0f} " in line and f" {r['gbps']:.2f} " in line, line
        assert f" {r['limit']} " in line, line  # the limit's key
        if r["note"]:
            assert notes[marker] == r["note"], line
    for key, lim in ran["report"]["limits"].items():
        line = next(ln for ln in lines if ln.startswith(lim["name"] + " "))
        assert f" {key} " in line and f"{lim['samples_per_s']:,.0f}" in line
        if lim["note"]:
            assert notes[line.split()[-1]] == lim["note"], line


def synthetic_report(processes: int = 10) -> bench.BenchReport:
    """A report of long notes and large figures: a skipped row, two rows sharing a note, a limit with a note."""
    long = "stopped at half the sampled files' bytes, so as not to find its own reads cached; " * 2
    rows = [bench.Row(bench.DICT_ROW, "warm", 34602.0, 3.54, 193, 2.0, 0.1, "copy", 0.26, 0.26,
                      "all 49,873 samples it was given; 53 keys np.load-ed in 0.11 s: 0.1 s and 0.30 GB per process "
                      "for every key"),
            bench.Row(bench.ITERATOR, "warm", 12345678.0, 1234.56, 1234567, 2.0, 0.1, "copy", 1.0, 123.45, long),
            bench.Row('npyfeed mode="read"', "warm", 71186.0, 7.29, 220, 2.0, 0.1, "copy", 0.53, 0.54, long),
            bench.Row(bench.ITERATOR, "cold", skipped="100% of the files stayed in the page cache after "
                                                      "posix_fadvise(DONTNEED)")]
    limits = {"copy": bench.Limit("memory copy, 2 threads", 13.38, 130675.0),
              "disk_random_cached": bench.Limit("disk random read, 1,234.5 MB (page cache)", 1.40, 13712.0,
                                                "the same reads without O_DIRECT, best of 1/4/16 in flight per "
                                                "thread (32): the limit of mode=\"mmap\" and \"read\", whose cold "
                                                "reads go through the page cache")}
    data = {"keys": 60, "samples": 56460, "bytes": 299535360, "factor_shape": [4800, 256], "dtype": "float32",
            "window": 100, "batch_size": 256, "threads": 2, "seed": 0, "sampled": False, "sampled_keys": 60,
            "sampled_samples": 56460, "sampled_bytes": 299535360, "open_seconds": 0.0}
    machine = {"cpus": 2, "memory_bytes": 25e9, "memory_available": 24e9, "load": "1.1"}
    rec = bench.recommend([vars(r) for r in rows], {k: vars(v) for k, v in limits.items()}, data, machine, processes)
    return bench.BenchReport(rows, limits, data, machine, rec, processes, ["a report note " * 12], 9.9)


def test_the_report_fits_120_columns_whatever_its_notes_and_figures():
    report = synthetic_report()
    text = report.format_table()
    assert max(map(len, text.splitlines())) <= 120, max(text.splitlines(), key=len)
    lines = text.splitlines()
    dict_row = next(ln for ln in lines if ln.startswith(bench.DICT_ROW))
    assert dict_row.split()[-3:] == ["copy", "0.26x", "[1]"]  # the limit's key and the note's number
    notes = footnotes(text)
    assert notes["[1]"] == report.rows[0].note
    assert notes["[2]"] == report.rows[1].note.strip()  # one number for the note two rows share
    assert [ln.split()[-1] for ln in lines if ln.startswith(('npyfeed mode="mmap"', 'npyfeed mode="read"'))] == \
        ["[2]", "[2]", "[3]"]
    assert notes["[3]"] == "skipped: " + report.rows[3].skipped
    assert notes["[4]"] == report.limits["disk_random_cached"].note
    assert "processes share the node's 2 CPUs" in text and "10 processes on this node" in text


def test_wide_puts_the_limits_names_and_the_notes_in_the_tables():
    report = synthetic_report()
    text = report.format_table(wide=True)
    lines = text.splitlines()
    assert not footnotes(text)
    dict_row = next(ln for ln in lines if ln.startswith(bench.DICT_ROW))
    assert dict_row.endswith("  memory copy, 2 threads    0.26x  " + report.rows[0].note)
    skipped = next(ln for ln in lines if ln.startswith(bench.ITERATOR) and " cold " in ln)
    assert skipped.endswith("skipped: " + report.rows[3].skipped)
    limit = next(ln for ln in lines if ln.startswith("disk random read, 1,234.5 MB (page cache)"))
    assert limit.endswith(report.limits["disk_random_cached"].note)
    assert report.recommendation.text() in text  # one line per reason
    assert max(map(len, lines)) > 120


def test_the_command_prints_wide_with_wide(data, capsys):
    argv = ["bench", *data["index"], data["factor_dir"], data["label_dir"], "--window", str(W), "--batch-size",
            str(B), "--seconds", "0.05", "--no-cold", "--no-tf", "--quiet", "--processes", "4"]
    assert cli.main([*argv, "--wide"]) == 0
    out = capsys.readouterr().out
    row = next(ln for ln in out.splitlines() if ln.startswith(bench.ITERATOR))
    assert re.search(r"  memory copy, \d+ threads? +\d+\.\d\dx  ", row), row  # the limit's name, not its key
    assert "[1]" not in out
    reasons = out.split("recommendation: ")[1].splitlines()
    assert any(len(line) > 120 for line in reasons), reasons  # the reasons unwrapped


def test_the_recommendation_follows_from_the_figures(ran):
    rep = ran["report"]
    again = bench.recommend(rep["rows"], rep["limits"], rep["data"], rep["machine"], rep["processes"])
    rec = rep["recommendation"]
    assert vars(again) == {**rec, "bounds": again.bounds} and again.bounds == pytest.approx(rec["bounds"])
    # and from the figures as printed, independently: the data fits, so mmap and a global shuffle; each process
    # gets at most a third of the node's memory copy and as many threads as a third of the CPUs allows (one
    # thread, a third of the node's gathers, where there are fewer than three CPUs).
    assert (rec["mode"], rec["shuffle"], rec["memory_budget"]) == ("mmap", True, None)
    rows = {(r["name"], r["cache"]): r["samples_per_s"] for r in rep["rows"]}
    limits = rep["limits"]
    copy = limits.get("copy_node", limits["copy"])["samples_per_s"]
    cpus = rep["machine"]["cpus"]
    per_thread = rows[(bench.ITERATOR, "warm")] / min(rep["data"]["threads"], cpus)
    most = max(1, cpus // 3)
    assert 1 <= rec["threads"] <= most
    gather = rec["threads"] * per_thread * min(1, cpus / 3)
    assert rec["expected_samples_per_s"] == pytest.approx(min(copy / 3, gather))
    assert 3 * rec["expected_samples_per_s"] <= per_thread * cpus * (1 + 1e-9)
    assert rec["threads"] == min(most, max(1, -(-copy / 3 // per_thread)))
    text = ran["stdout"].split("recommendation: ")[1]
    assert f'mode="mmap", threads={rec["threads"]}), shuffle=True' in text
    assert f"about {rec['expected_samples_per_s']:,.0f} samples/s per process" in text


def figures(data_bytes, available, *, iterator=20000.0, blocks=15000.0, copy=100000.0, disk_seq=40000.0, cpus=16,
            threads=4):
    rows = [{"name": bench.ITERATOR, "cache": "warm", "samples_per_s": iterator},
            {"name": bench.BLOCKS_ROW, "cache": "cold", "samples_per_s": blocks}]
    limits = {"copy": {"samples_per_s": copy}, "disk_seq": {"samples_per_s": disk_seq}}
    data = {"bytes": data_bytes, "samples": 10**6, "threads": threads}
    return rows, limits, data, {"cpus": cpus, "memory_available": available}


@pytest.mark.parametrize("processes, threads, expected, limited_by", [
    (1, 16, 80000.0, "gather threads"),      # 16 CPUs of 5,000/s each, under the copy's 100k
    (10, 1, 5000.0, "gather threads"),       # 1 CPU each (5,000/s), under the copy's 10k per process
    (4, 4, 20000.0, "gather threads"),
    (8, 2, 10000.0, "gather threads"),
])
def test_recommend_when_the_data_fits(processes, threads, expected, limited_by):
    rec = bench.recommend(*figures(10e9, 20e9), processes)
    assert (rec.mode, rec.shuffle, rec.threads, rec.limited_by) == ("mmap", True, threads, limited_by)
    assert rec.expected_samples_per_s == pytest.approx(expected)


@pytest.mark.parametrize("cpus, threads, processes", [
    (2, 2, 4),     # 4 processes on the 2 CPUs the row was measured on
    (2, 2, 3),
    (2, 4, 4),     # the row ran 4 threads on 2 CPUs: its rate is the 2 CPUs'
    (2, 1, 10),    # the row ran 1 thread: a CPU's rate, times the node's 2 CPUs
    (16, 16, 17),
    (16, 4, 40),
])
def test_recommend_never_promises_more_processes_than_cpus_more_than_the_node_gathers(cpus, threads, processes):
    iterator = 279508.0  # samples/s of the warm numpy iterator row, with `threads` threads
    rec = bench.recommend(*figures(10e9, 20e9, iterator=iterator, copy=1e9, cpus=cpus, threads=threads), processes)
    node = iterator / min(threads, cpus) * cpus  # every CPU of the node at the rate of one measured thread
    assert (rec.threads, rec.limited_by) == (1, "gather threads")
    assert rec.expected_samples_per_s == pytest.approx(node / processes)
    assert rec.expected_samples_per_s * processes <= node * (1 + 1e-9)
    if threads >= cpus:  # the row had every CPU: the processes together get no more than it measured
        assert rec.expected_samples_per_s * processes <= iterator * (1 + 1e-9)
    assert f"{processes} processes share the node's {cpus} CPUs: one gather thread each" in rec.text()
    assert f"the node gathers {node:,.0f} samples/s in all" in rec.text()


def test_recommend_with_the_cpus_measured_then_shared_four_ways():
    # The figures of a 2-CPU node: 279,508 samples/s with 2 threads, 139,754 per thread; 4 processes share it.
    rec = bench.recommend(*figures(10e9, 20e9, iterator=279508.0, copy=2.4e6, cpus=2, threads=2), 4)
    assert rec.threads == 1 and rec.bounds == pytest.approx({"memory copy": 600000.0, "gather threads": 69877.0})
    assert rec.expected_samples_per_s == pytest.approx(69877.0) and rec.limited_by == "gather threads"


def test_recommend_is_bound_by_the_memory_copy_shared_by_the_processes():
    rec = bench.recommend(*figures(10e9, 20e9, copy=30000.0), 3)
    assert rec.threads == 2 and rec.limited_by == "memory copy" and rec.expected_samples_per_s == pytest.approx(10000)


def test_recommend_blocks_when_the_data_does_not_fit():
    rec = bench.recommend(*figures(70e9, 24e9, cpus=32), 10)
    assert (rec.mode, rec.shuffle) == ("direct", "blocks")
    assert rec.memory_budget == int(24e9 // 40)  # a quarter of the memory available per process
    # 10 processes share the disk's 40,000 samples/s of sequential reads: 4,000 each, more than one thread of the
    # blocks row gives (15,000 / 4 threads), so two of the three CPUs each has
    assert rec.bounds == pytest.approx({"memory copy": 10000, "disk sequential read": 4000, "gather threads": 7500})
    assert rec.threads == 2 and rec.limited_by == "disk sequential read"
    assert rec.expected_samples_per_s == pytest.approx(4000)
    assert "do not fit" in rec.text() and 'shuffle="blocks"' in rec.text()


def test_recommend_blocks_without_a_cold_figure_says_so():
    rows, limits, data, machine = figures(70e9, 24e9)
    rec = bench.recommend(rows[:1], {"copy": limits["copy"]}, data, machine, 1)
    assert rec.shuffle == "blocks" and "disk sequential read" not in rec.bounds
    assert any("no cold blocks figure" in r for r in rec.reasons)
    assert any("disk was not measured" in r for r in rec.reasons)


def test_nothing_in_the_data_folders_changes(ran):
    assert snapshot(ran["root"]) == ran["before"]


def test_the_files_stay_in_the_page_cache(ran):
    assert ran["resident_after"] >= 0.99


@pytest.mark.skipif(not HAVE_MPL, reason="matplotlib is not installed")
def test_the_plot_is_an_svg(ran):
    svg = (ran["out"] / "report.svg").read_text(encoding="utf-8")
    assert svg.lstrip().startswith("<?xml") and "</svg>" in svg
    assert "samples/s (log scale)" in svg and "users' np.load per sample (warm)" in svg


@pytest.fixture
def data(tmp_path):
    index, factor_dir, label_dir = make_data(tmp_path / "data")
    return {"root": tmp_path / "data", "index": index, "factor_dir": factor_dir, "label_dir": label_dir}


def quick(data, **kw):
    args = {"window": W, "batch_size": B, "seconds": 0.05, "tf": False, "progress": False, **kw}
    return bench.run(data["index"], data["factor_dir"], data["label_dir"], **args)


def test_npz_archives_are_measured_like_npy_files(tmp_path):
    """A data set of .npz archives of one array beside .npy files (float64 here): the users' rows read the archives
    as they would (np.load(path)["arr_0"]), and the report's dtype and shape are the member's, not assumed."""
    base = tmp_path / "npz"
    rng = np.random.default_rng(1)
    for sub in ("factor", "label"):
        (base / sub).mkdir(parents=True)
    for k in range(3):
        save = np.save if k == 1 else np.savez  # key k1: .npy files; the others: archives
        save(base / "factor" / f"k{k}.np{'y' if k == 1 else 'z'}", rng.standard_normal((ROWS, COLS)))
        save(base / "label" / f"k{k}.np{'y' if k == 1 else 'z'}", rng.standard_normal((ROWS, LABELS)))
    index = _layout.write_index(base / "index.txt", _layout.index_text((i, i, f"k{i % 3}") for i in range(W, ROWS)))
    rep = bench.run(index, base / "factor", base / "label", window=W, batch_size=B, seconds=0.05, tf=False,
                    progress=False, cold=False)
    assert rep.data["dtype"] == "float64" and rep.data["factor_shape"] == [ROWS, COLS]
    assert rep.data["samples"] == ROWS - W
    rows = {r.name: r for r in rep.rows}
    for name in (bench.DICT_ROW, bench.NP_LOAD_ROW, bench.ITERATOR):
        assert rows[name].skipped is None and rows[name].samples_per_s > 0, rows[name]


def test_cold_rows_are_skipped_when_the_cache_cannot_be_dropped(data, monkeypatch):
    files = data_files(data["factor_dir"], data["label_dir"])
    npyfeed.warm(files, lock=False)
    monkeypatch.setattr(measure, "evict", lambda paths: None)  # posix_fadvise that drops nothing
    report = quick(data)
    rows = {(r.name, r.cache): r for r in report.rows}
    for name in ('npyfeed mode="mmap"', 'npyfeed mode="read"', bench.BLOCKS_ROW):
        assert rows[(name, "cold")].samples_per_s is None
        assert "stayed in the page cache after posix_fadvise(DONTNEED)" in rows[(name, "cold")].skipped
    direct = rows[('npyfeed mode="direct"', "cold")]  # O_DIRECT goes around the cache: still measured, with a note
    assert direct.samples_per_s and "could not be dropped" in direct.note
    assert any("cold rows were skipped" in n for n in report.notes)
    # The share still cached is what mincore saw (the files were warmed, nothing dropped them, but memory pressure
    # from other processes may take a few pages).
    assert re.search(r"skipped: \d+% of the files stayed in the page cache", report.format_table())
    assert all(rows[(n, "warm")].samples_per_s for n in (bench.ITERATOR, bench.DICT_ROW))


def test_no_cold_leaves_the_page_cache_alone(data, monkeypatch):
    monkeypatch.setattr(measure, "evict", lambda paths: pytest.fail("evicted with cold=False"))
    report = quick(data, cold=False)
    assert {r.cache for r in report.rows} == {"warm"}
    assert not {"disk_seq", "disk_random"} & set(report.limits)


def test_the_page_cache_is_restored_when_a_run_fails(data, monkeypatch):
    files = data_files(data["factor_dir"], data["label_dir"])
    if not drop_works(files):
        pytest.skip("this filesystem keeps dropped pages (tmpfs)")

    def fail(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(_bench_run.Bench, "_warm_rows", fail)  # stopped after the cold rows
    with pytest.raises(KeyboardInterrupt):
        quick(data)
    assert residency(files) >= 0.99


def test_a_sample_of_keys_in_a_temporary_folder_removed_afterwards(data, monkeypatch, tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    before = snapshot(data["root"])
    per_key = sum(os.path.getsize(p) for p in data_files(data["factor_dir"], data["label_dir"])) / KEYS
    report = quick(data, sample_bytes=int(2.5 * per_key), cold=False)
    d = report.data
    assert d["sampled"] and d["sampled_keys"] == bench.MIN_SAMPLED_KEYS < KEYS
    assert d["sampled_samples"] == bench.MIN_SAMPLED_KEYS * len(range(W - 1, ROWS, 2))
    assert "8 of 10 keys measured (seed 0)" in report.notes[0]
    assert "sampled 8 keys" in report.format_table()
    assert list(scratch.iterdir()) == []
    assert snapshot(data["root"]) == before
    again = quick(data, sample_bytes=int(2.5 * per_key), cold=False)
    assert again.data["sampled_samples"] == d["sampled_samples"]  # seeded


def test_without_tensorflow_the_tf_row_is_skipped_with_a_note(data, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # import tensorflow raises ImportError
    report = quick(data, cold=False, tf=True)
    row = next(r for r in report.rows if r.name == bench.TF_ROW)
    assert row.samples_per_s is None and row.skipped == "TensorFlow is not installed"
    assert any("pip install 'npyfeed[tf]'" in n for n in report.notes)


def test_the_plot_without_matplotlib_names_the_extra(data, monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    report = quick(data, cold=False)
    with pytest.raises(ImportError, match=re.escape("pip install 'npyfeed[bench]'")):
        report.plot(tmp_path / "x.svg")
    status = cli.main(["bench", *data["index"], data["factor_dir"], data["label_dir"], "--window", str(W),
                       "--batch-size", str(B), "--plot", str(tmp_path / "x.svg")])
    assert status == 1 and "pip install 'npyfeed[bench]'" in capsys.readouterr().err
    assert not (tmp_path / "x.svg").exists()


@pytest.mark.parametrize("extra, message", [
    (["--batch-size", "32"], "--window"),
    (["--window", "0", "--batch-size", "32"], "expected a positive integer, got '0'"),
    (["--window", "20", "--batch-size", "-1"], "expected a positive integer, got '-1'"),
    (["--window", "20", "--batch-size", "32", "--seconds", "0"], "expected a positive number, got '0'"),
    (["--window", "20", "--batch-size", "32", "--seconds", "soon"], "expected a positive number, got 'soon'"),
    (["--window", "20", "--batch-size", "32", "--processes", "0"], "expected a positive integer, got '0'"),
    (["--window", "20", "--batch-size", "32", "--plot", "out.pdf"], "written as .svg or .png"),
    (["--window", "20", "--batch-size", "32", "--bounds", "clip"], "invalid choice: 'clip'"),
])
def test_bad_arguments_exit_2(data, extra, message, capsys):
    status = cli.main(["bench", *data["index"], data["factor_dir"], data["label_dir"], *extra])
    assert status == 2 and message in capsys.readouterr().err


def test_too_few_paths_exit_2(data, capsys):
    assert cli.main(["bench", data["index"][0], "--window", "20", "--batch-size", "32"]) == 2
    assert "required" in capsys.readouterr().err


@pytest.mark.parametrize("value", [{"window": 0}, {"batch_size": -1}, {"processes": 0}, {"seconds": 0},
                                   {"seconds": float("nan")}, {"bounds": "clip"}])
def test_bad_values_from_python_raise_value_error(data, value):
    with pytest.raises(ValueError):
        quick(data, **value)


def break_missing_key(data) -> str:
    path = Path(data["factor_dir"]) / "k003.npy"
    path.unlink()
    return str(path)


def break_header(data) -> str:
    path = Path(data["label_dir"]) / "k005.npy"
    with open(path, "r+b") as f:
        f.write(b"\x93NUMPX")
    return str(path)


def break_unreadable(data) -> str:
    path = Path(data["factor_dir"]) / "k007.npy"  # a folder where a file should be: unreadable, even as root
    path.unlink()
    path.mkdir()
    return str(path)


def break_index(data) -> str:
    with open(data["index"][1], "a") as f:
        f.write("12,12\n")
    return data["index"][1]


def break_missing_index(data) -> str:
    os.unlink(data["index"][0])
    return data["index"][0]


def break_folder(data) -> str:
    os.rename(data["label_dir"], data["label_dir"] + "-gone")
    return data["label_dir"]


@pytest.mark.parametrize("damage, words", [
    (break_missing_key, "No such file or directory"),
    (break_header, "bad magic"),
    (break_unreadable, "Is a directory"),
    (break_index, "expected 'feature_index,label_index,key'"),
    (break_missing_index, "No such file or directory"),
    (break_folder, "no such folder"),
], ids=["missing key file", "corrupt header", "unreadable file", "bad index line", "missing index", "missing folder"])
def test_bad_data_exits_1_naming_the_file(data, damage, words, capsys, tmp_path):
    named = damage(data)
    before = snapshot(data["root"])
    status = cli.main(["bench", *data["index"], data["factor_dir"], data["label_dir"], "--window", str(W),
                       "--batch-size", str(B), "--seconds", "0.05", "--no-tf", "--json", str(tmp_path / "r.json")])
    err = capsys.readouterr().err
    assert status == 1 and err.startswith("npyfeed bench: ") and named in err and words in err, err
    assert not (tmp_path / "r.json").exists()
    assert snapshot(data["root"]) == before


def test_a_window_outside_its_file_names_the_index_line(data, capsys):
    status = cli.main(["bench", *data["index"], data["factor_dir"], data["label_dir"], "--window", str(ROWS + 1),
                       "--batch-size", str(B), "--no-tf"])
    err = capsys.readouterr().err
    assert status == 1 and data["index"][0] in err, err


def test_the_module_imports_neither_tensorflow_nor_matplotlib():
    code = ("import sys, npyfeed.bench, npyfeed.bench._run, npyfeed.cli; "
            "print(sorted(m for m in ('tensorflow', 'matplotlib', 'tqdm') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_no_page_cache_limit_where_the_files_cannot_be_dropped(shm_path):
    # On tmpfs the files stay in memory whatever posix_fadvise says: reads "through the page cache" there measure
    # memory, not a disk, so the run gives no such limit (and skips the cold rows that would read through it).
    index, factor_dir, label_dir = make_data(shm_path)
    if drop_works(data_files(factor_dir, label_dir)):
        pytest.skip("this tmpfs dropped its pages")
    rep = bench.run(index, factor_dir, label_dir, window=W, batch_size=B, seconds=0.1, tf=False, progress=False)
    assert "disk_random_cached" not in rep.limits
    rows = {(r.name, r.cache): r for r in rep.rows}
    assert rows[(bench.ITERATOR, "cold")].skipped and rows[('npyfeed mode="read"', "cold")].skipped


def test_the_random_read_probes_report_files_smaller_than_a_block_as_nothing_to_measure(tmp_path):
    # A file shorter than one block has no offset to read at: both probes say None (not an error), and read
    # the files that do hold a block.
    paths = []
    for name, array in (("big", np.arange(64 * 1024, dtype=np.float32)), ("tiny", np.zeros(10, np.float32))):
        np.save(tmp_path / f"{name}.npy", array)
        paths.append(str(tmp_path / f"{name}.npy"))
    buffered = measure.buffered_random_bandwidth(paths, 2, block=8192, reads=64, seed=5)
    assert (buffered.reads, buffered.block) == (64, 8192) and buffered.gbps > 0
    direct = measure.odirect_random_bandwidth(paths, 2, block=8192, reads=64, seed=5)
    assert direct is None or (direct.reads, direct.block) == (64, 8192)  # None: O_DIRECT refused here
    assert measure.buffered_random_bandwidth(paths[1:], 2) is None
    assert measure.odirect_random_bandwidth(paths[1:], 2) is None


def test_time_batches_counts_what_it_took_stops_at_each_bound_and_closes_the_iterator():
    def batches(n, sizes=(3, 5)):
        for i in range(n):
            time.sleep(0.002)
            yield np.zeros((sizes[i % 2], 4)), np.zeros(sizes[i % 2])

    class Closable:  # as npyfeed's iterators: close() ends it (a generator's would also run when it is freed)
        def __init__(self, it):
            self.it, self.closed = it, False

        def __iter__(self):
            return self

        def __next__(self):
            return next(self.it)

        def close(self):
            self.closed = True

    iterator = Closable(batches(10))
    run = measure.time_batches(iterator, most_batches=4, keep_first=True)
    assert (run.batches, run.samples, run.first_samples, run.stopped) == (4, 16, 3, "batches") and iterator.closed
    assert run.first[0].shape == (3, 4) and 0 < run.first_s < run.seconds
    assert run.samples_per_s == pytest.approx(16 / run.seconds)
    assert run.steady_samples_per_s == pytest.approx(13 / (run.seconds - run.first_s))
    assert measure.time_batches(batches(10), most_samples=9).samples == 11  # stops at the batch that reaches it
    ended = measure.time_batches(batches(3))
    assert (ended.batches, ended.stopped, ended.first) == (3, "end", None)
    timed = measure.time_batches(batches(1000), seconds=0.02)
    assert timed.stopped == "seconds" and timed.seconds - timed.first_s >= 0.02 and timed.batches < 1000
    one = measure.time_batches(batches(1))
    assert one.steady_samples_per_s == one.samples_per_s == pytest.approx(3 / one.first_s)

    def late_start():  # a function is called on the clock: its time counts towards the first batch
        time.sleep(0.05)
        return batches(2)

    assert measure.time_batches(late_start).first_s >= 0.05
    assert measure.time_batches(iter(())).batches == 0


@pytest.mark.parametrize("buffered", [False, True], ids=["direct", "buffered"])
def test_the_random_read_limit_is_the_best_probe_over_the_reads_in_flight(monkeypatch, buffered):
    calls = []
    gbps = {1: 1.0, 4: 3.0, 16: 2.0}  # per thread in flight -> GB/s: the best at 4 per thread

    def probe(paths, threads, block, reads, seed):
        calls.append(threads)
        return measure.RandomReadResult(gbps[threads // 3], 0.0, block, reads, threads)

    monkeypatch.setattr(measure, "buffered_random_bandwidth" if buffered else "odirect_random_bandwidth", probe)
    best = measure.random_read_limit(["f"], 3, block=4096, reads=10, buffered=buffered)
    assert calls == [3 * d for d in measure.READS_IN_FLIGHT]
    assert (best.gbps, best.threads) == (3.0, 12)
    monkeypatch.setattr(measure, "buffered_random_bandwidth" if buffered else "odirect_random_bandwidth",
                        lambda *a, **k: None)
    assert measure.random_read_limit(["f"], 3, block=4096, buffered=buffered) is None  # O_DIRECT refused


@pytest.mark.parametrize(("cpuinfo", "described"), [
    ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\nmodel name\t: AMD EPYC\n"
     "flags\t\t: fpu sse2 avx2 avx512f\n\nprocessor\t: 1\nmodel name\t: other\n",
     "AMD EPYC (family 26, model 2, AVX-512)"),
    ("processor\t: 0\ncpu family\t: 6\nmodel\t\t: 167\nmodel name\t: Intel Xeon\nflags\t\t: sse2 avx2\n",
     "Intel Xeon (family 6, model 167, AVX2)"),
    ("processor\t: 0\nBogoMIPS\t: 50.00\nProcessor\t: ARMv8\n", "ARMv8"),
    ("processor\t: 0\nBogoMIPS\t: 50.00\n", None),
])
def test_the_cpu_is_described_by_its_name_family_model_and_widest_vector_unit(cpuinfo, described):
    # A virtual machine's model name alone ("AMD EPYC") names no generation: results must tell Zen 3 from Zen 5.
    assert measure.describe_cpu(cpuinfo) == described
