"""Loader placement (issue 8, item 5): ``cpus=``, ``nice=`` and ``io_priority=`` place npyfeed's own pool
threads, for WindowSource and the loaders, and nothing else: not the caller's thread, not the threads of
calls with another placement (the default one included). Observed through /proc/self/task (thread names,
Cpus_allowed_list), os.getpriority per thread and the ioprio_get system call. Each scenario runs in a fresh
subprocess (pools live as long as the process) that prints JSON. Mirrors tests/cpp/test_placement.cpp.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap

import npyfeed
import numpy as np
import pytest
from _sandbox import run_unprivileged, shared_dir

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread placement is Linux")

HANG_GUARD_S = 300
IOPRIO_GET = {"x86_64": 252, "aarch64": 31}.get(platform.machine())

CHILD_SETUP = textwrap.dedent(
    """
    import ctypes, json, os, sys, threading
    import numpy as np
    import npyfeed

    args = json.loads(sys.argv[1])
    libc = ctypes.CDLL(None, use_errno=True)

    def npyfeed_threads():
        tids = set()
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    if f.read().strip() == "npyfeed":
                        tids.add(int(tid))
            except FileNotFoundError:
                pass
        return tids

    def state(tid):
        with open(f"/proc/self/task/{tid}/status") as f:
            cpus = next(line for line in f if line.startswith("Cpus_allowed_list")).split()[1]
        ioprio = libc.syscall(args["ioprio_get"], 1, tid) if args["ioprio_get"] else None
        return {"cpus": sorted(os.sched_getaffinity(tid)), "cpus_list": cpus,
                "nice": os.getpriority(os.PRIO_PROCESS, tid), "ioprio": ioprio}

    def states(tids):
        return sorted({json.dumps(state(t), sort_keys=True) for t in tids})

    def report(**out):
        print("RESULT " + json.dumps(out), flush=True)
    """
)


def run_child(body: str, **args) -> dict:
    args["ioprio_get"] = IOPRIO_GET
    code = CHILD_SETUP + textwrap.dedent(body)
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(args)], capture_output=True, text=True,
                          timeout=HANG_GUARD_S)
    assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-5000:]}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("placement")
    (d / "f").mkdir()
    (d / "l").mkdir()
    (d / "z").mkdir()
    lines = []
    for key in ("a", "b", "c", "d"):
        np.save(d / "f" / f"{key}.npy", np.ones((3000, 8), dtype=np.float32))
        np.savez_compressed(d / "z" / f"{key}.npz", x=np.ones((3000, 8), dtype=np.float32), y=np.zeros(3000))
        np.save(d / "l" / f"{key}.npy", np.ones(3000, dtype=np.float32))
        lines += [f"{r},{r},{key}" for r in range(10, 3000, 7)]
    (d / "index.txt").write_text("\n".join(lines) + "\n")
    return d


def cpu_choice():
    cpus = sorted(os.sched_getaffinity(0))
    return cpus[-1], cpus[0]


def state_of(cpus, nice, ioprio):
    return json.dumps({"cpus": cpus, "cpus_list": ",".join(map(str, cpus)) if len(cpus) == 1 else None,
                       "nice": nice, "ioprio": ioprio}, sort_keys=True)


PLACED = """
    d = args["dir"]
    files = [os.path.join(d, "f", k + ".npy") for k in "abcd"]
    caller = state(threading.get_native_id())
    npyfeed.load_many(files, threads=3)                   # the default pool
    default_tids = npyfeed_threads()
    default_before = states(default_tids)

    def src(**kw):
        return npyfeed.WindowSource(os.path.join(d, "index.txt"), os.path.join(d, "f"), os.path.join(d, "l"), 4, **kw)

    if args["api"] == "WindowSource":
        s = src(cpus=[args["cpu"]], nice=args["nice"], io_priority="idle", threads=3)
        s.get(np.arange(len(s)))
        with s.batches(64) as it:
            sum(1 for _ in it)
    elif args["api"] == "from_arrays":
        arrays = {k: np.ones((3000, 8), np.float32) for k in "abcd"}
        labels = {k: np.ones(3000, np.float32) for k in "abcd"}
        s = npyfeed.WindowSource.from_arrays(os.path.join(d, "index.txt"), arrays, labels, 4, cpus=[args["cpu"]],
                                             nice=args["nice"], io_priority="idle", threads=3)
        s.get(np.arange(len(s)))
    elif args["api"] == "load_factor_files":
        npyfeed.load_factor_files(files, cpus=[args["cpu"]], nice=args["nice"], io_priority="idle", threads=3)
    elif args["api"] == "load_many_npz":  # archives: members inflated on the placed pool
        archives = [os.path.join(d, "z", k + ".npz") for k in "abcd"]
        npyfeed.load_many(archives, cpus=[args["cpu"]], nice=args["nice"], io_priority="idle", threads=3)
    else:
        getattr(npyfeed, args["api"])(files if args["api"] == "load_many" else files[0], cpus=[args["cpu"]],
                                      nice=args["nice"], io_priority="idle", threads=3, mode="mmap", populate=True)
    placed_tids = npyfeed_threads() - default_tids
    placed = states(placed_tids)
    # Another placement: its own threads; the first placement's are left as they were.
    npyfeed.load_many(files, cpus=[args["other_cpu"]], io_priority=("best-effort", 6), threads=2)
    other_tids = npyfeed_threads() - default_tids - placed_tids
    report(caller=[caller, state(threading.get_native_id())], default=[default_before, states(default_tids)],
           placed=placed, placed_after=states(placed_tids), n_placed=len(placed_tids), other=states(other_tids))
"""


@pytest.mark.parametrize("api", ["WindowSource", "from_arrays", "load", "load_many", "load_factor_files",
                                 "load_many_npz"])
def test_only_npyfeed_threads_of_that_call_are_placed(data, api):
    cpu, other_cpu = cpu_choice()
    nice = min(os.getpriority(os.PRIO_PROCESS, 0) + 5, 19)
    r = run_child(PLACED, dir=str(data), api=api, cpu=cpu, other_cpu=other_cpu, nice=nice)
    idle = (3 << 13) if IOPRIO_GET else None
    want = json.loads(state_of([cpu], nice, idle))
    assert r["n_placed"] >= 1
    # A mapped source's background populate runs placed too, at the lowest priority whatever nice= asks for.
    background = dict(want, nice=19)
    assert state_of([cpu], nice, idle) in r["placed"], r["placed"]
    for s in r["placed"]:
        s = json.loads(s)
        assert s["cpus"] == [cpu] and s["cpus_list"] == str(cpu), s
        assert s in (want, background) and s["ioprio"] == want["ioprio"], s
    assert r["placed_after"] == r["placed"]
    # The caller and the default pool's workers are untouched.
    assert r["caller"][0] == r["caller"][1]
    assert r["default"][0] == r["default"][1]
    for s in map(json.loads, r["default"][1]):
        assert s["cpus"] == r["caller"][0]["cpus"] and s["nice"] == r["caller"][0]["nice"], s
    for s in map(json.loads, r["other"]):
        assert s["cpus"] == [other_cpu] and s["nice"] == r["caller"][0]["nice"], s
        if IOPRIO_GET:
            assert s["ioprio"] == (2 << 13) | 6, s


def test_threads_default_to_one_per_cpu(data):
    cpu, _ = cpu_choice()
    src = npyfeed.WindowSource(data / "index.txt", data / "f", data / "l", 4, cpus=[cpu])
    assert src.threads == 1
    src = npyfeed.WindowSource(data / "index.txt", data / "f", data / "l", 4, cpus=[cpu], threads=3)
    assert src.threads == 3


@pytest.mark.parametrize("cpus, error, words", [
    ([-1], ValueError, "CPU numbers"),
    ([1 << 20], ValueError, "CPU numbers"),
    ([], ValueError, "at least one CPU"),
    ([1023], ValueError, "1023 cannot be used by this process"),
    (["0"], TypeError, "CPU numbers"),
    ([0.0], TypeError, "CPU numbers"),
    ([True], TypeError, "CPU numbers"),
    (0, TypeError, "iterable"),
], ids=["negative", "huge", "empty", "not-available", "str", "float", "bool", "not-iterable"])
def test_invalid_cpus(data, tmp_path, cpus, error, words):
    np.save(tmp_path / "x.npy", np.arange(10))
    with pytest.raises(error, match=words):
        npyfeed.load(tmp_path / "x.npy", cpus=cpus)
    with pytest.raises(error, match=words):
        npyfeed.WindowSource(data / "index.txt", data / "f", data / "l", 4, cpus=cpus)


@pytest.mark.parametrize("kwargs, error, words", [
    ({"nice": 20}, ValueError, "nice must be from -20 to 19"),
    ({"nice": -21}, ValueError, "nice must be from -20 to 19"),
    ({"nice": "5"}, TypeError, "nice"),
    ({"io_priority": "fast"}, ValueError, "io_priority class"),
    ({"io_priority": ("best-effort", 8)}, ValueError, "level must be from 0 to 7"),
    ({"io_priority": ("idle",)}, TypeError, "io_priority"),
    ({"io_priority": ("best-effort", 1.5)}, TypeError, "level"),
], ids=["nice-high", "nice-low", "nice-str", "io-name", "io-level", "io-tuple", "io-level-type"])
def test_invalid_nice_and_io_priority(tmp_path, kwargs, error, words):
    np.save(tmp_path / "x.npy", np.arange(10))
    with pytest.raises(error, match=words):
        npyfeed.load(tmp_path / "x.npy", **kwargs)


def test_lower_niceness_needs_privileges():
    """As an unprivileged user (a child that drops root, when the tests run as root): nice=-20 is refused."""
    with shared_dir() as root:
        np.save(root / "x.npy", np.arange(10))
        os.chmod(root / "x.npy", 0o444)
        proc = run_unprivileged("""
            try:
                npyfeed.load(sys.argv[1], nice=-20)
            except PermissionError as e:
                print("refused:", e)
            else:
                print("accepted")
            print(npyfeed.load(sys.argv[1], nice=5).tolist() == list(range(10)))
        """, root / "x.npy", imports="import npyfeed\n")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("refused:") and lines[-1] == "True", proc.stdout


def test_placed_loads_give_the_same_arrays(data):
    cpu, _ = cpu_choice()
    files = sorted((data / "f").glob("*.npy"))
    for mode in ("read", "mmap", "direct"):
        for got, path in zip(npyfeed.load_many(files, mode=mode, cpus=[cpu], nice=1, io_priority="idle"), files):
            np.testing.assert_array_equal(got, np.load(path))


# ----------------------------------------------------------------------------------------------------------
# The default threads on a node shared by several processes


@pytest.fixture
def node(monkeypatch):
    """A node of `machine` CPUs on which this process may use `mine`, launched with the given variables."""
    from npyfeed import _resources

    def make(machine: int, mine: int, **variables):
        for name in _resources.PROCESSES_PER_NODE + ("NPYFEED_THREADS",):
            monkeypatch.delenv(name, raising=False)
        for name, value in variables.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(os, "cpu_count", lambda: machine)
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(mine)))
        return _resources.thread_choice(None)

    return make


@pytest.mark.parametrize("machine, mine, variables, threads, words", [
    (64, 64, {}, 64, "the 64 CPUs this process may use"),
    (64, 64, {"LOCAL_WORLD_SIZE": "10"}, 6, "shared by 10 processes (LOCAL_WORLD_SIZE=10)"),
    (24, 24, {"LOCAL_WORLD_SIZE": "10"}, 2, "shared by 10 processes"),
    (8, 8, {"SLURM_NTASKS_PER_NODE": "10"}, 1, "shared by 10 processes (SLURM_NTASKS_PER_NODE=10)"),
    (64, 64, {"SLURM_NTASKS_PER_NODE": "4(x3)"}, 16, "SLURM_NTASKS_PER_NODE=4"),
    (64, 64, {"OMPI_COMM_WORLD_LOCAL_SIZE": "8"}, 8, "OMPI_COMM_WORLD_LOCAL_SIZE=8"),
    (64, 64, {"LOCAL_WORLD_SIZE": "2", "SLURM_NTASKS_PER_NODE": "8"}, 32, "LOCAL_WORLD_SIZE=2"),
    (64, 6, {"LOCAL_WORLD_SIZE": "10"}, 6, "its own slice"),  # the launcher pinned each process
    (32, 32, {"LOCAL_WORLD_SIZE": "nonsense"}, 32, "the 32 CPUs"),
    (64, 64, {"LOCAL_WORLD_SIZE": "10", "NPYFEED_THREADS": "3"}, 3, "NPYFEED_THREADS"),
], ids=["alone", "torchrun", "small-node", "tiny-node", "slurm-uneven", "openmpi", "torchrun-first", "pinned",
        "ignored", "env-wins"])
def test_default_threads_share_the_node(node, machine, mine, variables, threads, words):
    chosen, why = node(machine, mine, **variables)
    assert chosen == threads and words in why, why


def test_describe_says_how_the_threads_were_chosen(data, node):
    node(64, 64, LOCAL_WORLD_SIZE="10")
    src = npyfeed.WindowSource(data / "index.txt", data / "f", data / "l", 4)
    assert src.threads == 6
    assert "threads: 6 (64 CPUs this process may use, shared by 10 processes (LOCAL_WORLD_SIZE=10))" in \
        src.describe()
    src = npyfeed.WindowSource(data / "index.txt", data / "f", data / "l", 4, threads=2)
    assert src.threads == 2 and "threads: 2 (threads=)" in src.describe()


def test_the_package_reads_the_environment_in_one_place():
    """Every environment variable the Python package reads goes through _resources.environment and its table."""
    import re
    from pathlib import Path

    from npyfeed import _resources

    root = Path(npyfeed.__file__).parent
    for path in root.rglob("*.py"):
        text = path.read_text()
        reads = re.findall(r"environ\.get|getenv\(|environ\[", text)
        assert not reads or path.name == "_resources.py", f"{path.name} reads the environment itself"
        for name in re.findall(r"environment\(\"(\w+)\"\)", text):
            assert name in _resources.ENVIRONMENT, name
    with pytest.raises(KeyError):
        _resources.environment("HOME")
    # The repository's docs, beside tests/ (the package may be installed anywhere, a wheel's or a source build's).
    documented = (Path(__file__).resolve().parent.parent / "docs" / "one-node.md").read_text()
    for name in _resources.ENVIRONMENT:
        assert f"`{name}`" in documented, name


def test_the_core_reads_the_environment_in_one_unit():
    """The C++ core's getenv calls are all in csrc/npyfeed/common/settings.cpp, and every variable it names there is in its
    table (so in npyfeed.settings() and in the docs' table)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    names = {name for name, _ in npyfeed._core.core_settings()}
    documented = (root / "docs" / "one-node.md").read_text()
    for path in sorted((root / "csrc").rglob("*.[ch]pp")):
        text = path.read_text()
        if path.name != "settings.cpp":
            assert not re.search(r"\bgetenv\b|\benviron\b", text), f"{path} reads the environment itself"
        for name in re.findall(r"\"(NPYFEED_\w+)\"", text):
            assert name in names, f"{path.name} names {name}, which the settings table does not list"
    assert len(names) == 7
    for name in names:
        assert f"`{name}`" in documented, name


def test_settings_lists_every_variable_with_its_value_now(monkeypatch):
    from npyfeed import _resources

    monkeypatch.setenv("NPYFEED_MAX_MAPPINGS", "4096")
    monkeypatch.setenv("NPYFEED_THREADS", " 3 ")
    monkeypatch.delenv("NPYFEED_IO_URING", raising=False)
    monkeypatch.setenv("NPYFEED_POPULATE", "")
    table = npyfeed.settings()
    assert set(table) == set(_resources.ENVIRONMENT) | {name for name, _ in npyfeed._core.core_settings()}
    assert table["NPYFEED_MAX_MAPPINGS"] == {"value": "4096", "read_by": "core",
                                             "meaning": table["NPYFEED_MAX_MAPPINGS"]["meaning"]}
    assert "mmap" in table["NPYFEED_MAX_MAPPINGS"]["meaning"]
    assert table["NPYFEED_THREADS"]["value"] == "3" and table["NPYFEED_THREADS"]["read_by"] == "python"
    assert table["NPYFEED_IO_URING"]["value"] is None and table["NPYFEED_POPULATE"]["value"] is None
    assert all(row["meaning"] for row in table.values())


def test_info_settings_prints_the_table(monkeypatch, capsys):
    from npyfeed import cli

    monkeypatch.setenv("NPYFEED_STREAMING", "1")
    assert cli.main(["info", "--settings"]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if "NPYFEED_STREAMING" in line)
    assert "'1'" in line and "core" in line
    assert cli.main(["info", "--settings", "--json"]) == 0
    import json

    assert json.loads(capsys.readouterr().out)["settings"]["NPYFEED_STREAMING"]["value"] == "1"


def _recipe_function(page: str):
    """The `cpu_slices` function of the placement recipe on `page`, as written there."""
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / page).read_text()
    start = text.index("def cpu_slices")
    code = text[start:text.index("\n\n", start)]
    namespace: dict = {}
    exec(code, namespace)  # noqa: S102 - the documentation's own code
    return namespace["cpu_slices"]


@pytest.mark.parametrize("page", ["README.md", "docs/one-node.md"])
def test_the_placement_recipe_never_gives_an_empty_cpu_set(page):
    cpu_slices = _recipe_function(page)
    for cores in range(1, 70):
        node = list(range(100, 100 + cores))
        used = set()
        for rank in range(10):
            tf_cores, loader_cores = cpu_slices(node, rank, 10)
            assert tf_cores and loader_cores, (cores, rank)
            assert set(tf_cores) | set(loader_cores) <= set(node)
            used |= set(tf_cores) | set(loader_cores)
            if cores >= 30:  # three cores or more each: npyfeed's two apart from TensorFlow's
                assert len(loader_cores) == 2 and not set(tf_cores) & set(loader_cores)
        assert used == set(node)  # every core serves a trainer
