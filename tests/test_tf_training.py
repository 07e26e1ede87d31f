"""npyfeed.tf for long training jobs, each in fresh interpreters (with a deadline, so that a hang fails):

* resume: an iterator saved with ``tf.train.Checkpoint(iterator=it)`` and restored in a NEW process yields the
  batches an uninterrupted run yields next (bit for bit, across the epoch boundary), for a shuffled and an
  in-order ``repeat()``, a shard with ``drop_remainder``, one from ``epoch=2``, and ``shuffle="blocks"`` (the
  same cases, with budgets of one and two keys per block); the checkpoint holds positions;
* no leak (global shuffle and blocks): 100 datasets over 100 WindowSources, built, read and dropped, leave no
  source, mapping, descriptor or batch memory behind;
* several workers: 2 processes on loopback ports under ``MultiWorkerMirroredStrategy`` (TF_CONFIG), with
  ``distribute_datasets_from_function``: every sample exactly once per epoch, and a custom training loop.

The numpy iterator (``src.batches``) is the oracle.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import textwrap

import npyfeed
import numpy as np
import pytest

if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("TensorFlow is not installed", allow_module_level=True)

sys.path.insert(0, os.path.dirname(__file__))
from test_tf import PATHS, SAMPLES, WINDOW, _make_arrays  # noqa: E402

TIMEOUT_S = 300

_PRELUDE = f"""
import json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
sys.path.insert(0, {os.path.dirname(__file__)!r})
import numpy as np
import npyfeed
from test_tf import _make_arrays
index, factors, labels = _make_arrays()
src = npyfeed.WindowSource.from_arrays(index, factors, labels, {WINDOW})
"""


def _env(path: str) -> dict:
    """The environment of a script on `path` (one of test_tf.PATHS)."""
    return dict(os.environ, NPYFEED_TF_OPS="1" if path == "native" else "0")


def _run(code: str, *args, env=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _PRELUDE + textwrap.dedent(code), *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _finish(proc: subprocess.Popen, name: str) -> str:
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"{name}: no exit within {TIMEOUT_S} s\nstdout:\n{out}\nstderr:\n{err[-4000:]}")
    assert proc.returncode == 0, f"{name}: exit status {proc.returncode}\nstdout:\n{out}\nstderr:\n{err[-4000:]}"
    return out


# ----------------------------------------------------------------------------------------------------------
# Resume in a new process

#: name -> (dataset keyword arguments, (num_input_pipelines, input_pipeline_id) or None, repeat, batches
#: taken before the checkpoint). 37 samples: 5 batches of 8 per epoch; shard 1 of 2 (18 samples) with the
#: per-replica batch 4 and drop_remainder: 4 batches. Each shuffled case also runs with shuffle="blocks" (a key
#: is 1600 bytes of arrays: budget 1 puts one key in a block, 6400 two), where a restored iterator starts a new
#: stream at its batch, mid-block.
CASES = {
    "shuffled_repeat": (dict(batch_size=8, shuffle=True, seed=3), None, True, 7),
    "in_order_repeat": (dict(batch_size=8), None, True, 4),
    "shard_drop_remainder_repeat": (dict(batch_size=8, shuffle=True, seed=5, drop_remainder=True), (2, 1), True, 3),
    "at_the_epoch_boundary": (dict(batch_size=8, shuffle=True, seed=3), None, True, 10),
    "from_epoch_2": (dict(batch_size=8, shuffle=True, seed=3, epoch=2), None, True, 6),
}
for _name, (_kwargs, _shard, _repeat, _before) in list(CASES.items()):
    if _kwargs.get("shuffle"):
        _budget = 1 if _before % 2 else 6400
        CASES["blocks_" + _name] = (dict(_kwargs, shuffle="blocks", memory_budget=_budget), _shard, _repeat, _before)
AFTER = 8  # batches compared after the checkpoint (fewer for a single pass: the rest of it)

_CHECKPOINT = f"""
import tensorflow as tf
import npyfeed.tf
mode, directory = sys.argv[1], sys.argv[2]
cases = {CASES!r}
out = {{}}
for name, (kwargs, shard, repeat, before) in cases.items():
    if shard is not None:
        kwargs = dict(kwargs, input_context=tf.distribute.InputContext(*shard, num_replicas_in_sync=shard[0]))
    ds = npyfeed.tf.dataset(src, **kwargs)
    it = iter(ds.repeat() if repeat else ds)
    checkpoint = tf.train.Checkpoint(iterator=it)
    prefix = os.path.join(directory, name)
    if mode == "save":
        for _ in range(before):
            next(it)
        checkpoint.write(prefix)
    else:
        checkpoint.read(prefix).assert_consumed()
    batches = []
    for _ in range({AFTER}):
        try:
            x, y = next(it)
        except StopIteration:
            break
        batches.append((x.numpy(), y.numpy()))
    for i, (x, y) in enumerate(batches):
        out[f"{{name}}/x{{i}}"], out[f"{{name}}/y{{i}}"] = x, y
    out[f"{{name}}/n"] = np.array(len(batches))
np.savez(os.path.join(directory, mode + ".npz"), **out)
print("ok")
"""


def _expected(src, kwargs: dict, shard, repeat: bool, before: int) -> list:
    """The numpy iterator's batches from batch `before` of the stream on: epochs `epoch`, `epoch + 1`, ..."""
    kwargs = dict(kwargs)
    batch_size, first_epoch = kwargs.pop("batch_size"), kwargs.pop("epoch", 0)
    if shard is not None:
        batch_size //= shard[0]
        kwargs.update(num_shards=shard[0], shard_index=shard[1])
    stream = []
    for epoch in range(first_epoch, first_epoch + (4 if repeat else 1)):
        stream += list(src.batches(batch_size, epoch=epoch, **kwargs))
    return stream[before:before + AFTER]


@pytest.fixture(scope="module", params=PATHS)
def resumed(tmp_path_factory, request):
    """Runs the save process (reads, checkpoints, reads on) and then the restore process (a new interpreter)."""
    directory = tmp_path_factory.mktemp("tf_checkpoints")
    _finish(_run(_CHECKPOINT, "save", directory, env=_env(request.param)), "save")
    _finish(_run(_CHECKPOINT, "restore", directory, env=_env(request.param)), "restore")
    return directory


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_a_restored_iterator_continues_bit_identically(resumed, name):
    kwargs, shard, repeat, before = CASES[name]
    src = npyfeed.WindowSource.from_arrays(*_make_arrays(), WINDOW)
    expected = _expected(src, kwargs, shard, repeat, before)
    assert len(expected) == (AFTER if repeat else 5 - before)
    with np.load(resumed / "save.npz") as saved, np.load(resumed / "restore.npz") as restored:
        for run in (saved, restored):  # the uninterrupted run, and the restored one, against numpy
            assert int(run[f"{name}/n"]) == len(expected)
            for i, (ex, ey) in enumerate(expected):
                np.testing.assert_array_equal(run[f"{name}/x{i}"], ex, strict=True)
                np.testing.assert_array_equal(run[f"{name}/y{i}"], ey, strict=True)
    # Positions, not batches: a batch of 8 samples alone is 8 * 4 * 3 * 4 bytes of x.
    size = sum(p.stat().st_size for p in resumed.glob(f"{name}.*"))
    assert size < 4096, size


# ----------------------------------------------------------------------------------------------------------
# No leak

_LEAK = """
import gc, weakref
import tensorflow as tf
import npyfeed.tf
directory, shuffle = sys.argv[1], sys.argv[2]
shuffle = shuffle if shuffle == "blocks" else True
data = os.path.join(directory, "factor", "k0.npy")

def mapped():
    with open("/proc/self/maps") as f:
        return sum(data in line for line in f)

def fds():
    return sum(os.path.realpath(os.path.join("/proc/self/fd", fd)).startswith(directory)
               for fd in os.listdir("/proc/self/fd") if os.path.exists(os.path.join("/proc/self/fd", fd)))

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

def one_round():
    src = npyfeed.WindowSource(os.path.join(directory, "index.txt"), os.path.join(directory, "factor"),
                               os.path.join(directory, "label"), 50, mode="mmap")
    assert mapped() >= 1 and fds() >= 0
    ds = npyfeed.tf.dataset(src, 64, shuffle=shuffle, seed=1, memory_budget=1 << 20)
    for i, (x, y) in enumerate(ds.repeat()):  # a pass, and the start of a second one (batches in flight)
        if i == 6:
            break
    next(iter(ds))
    return weakref.ref(src)

for _ in range(10):
    one_round()
gc.collect()
base = rss()
refs = [one_round() for _ in range(100)]
gc.collect()
alive = sum(r() is not None for r in refs)
print(json.dumps(dict(alive=alive, mapped=mapped(), fds=fds(), grown=rss() - base)))
"""


@pytest.mark.slow
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("shuffle", ["global", "blocks"])
def test_dropped_datasets_leave_nothing_behind(tmp_path, shuffle, path):
    # One key, T=4000 rows of 64 float32 (1 MB), 320 samples of W=50: a batch of 64 holds 800 KB.
    rng = np.random.default_rng(0)
    (tmp_path / "factor").mkdir()
    (tmp_path / "label").mkdir()
    np.save(tmp_path / "factor" / "k0.npy", rng.standard_normal((4000, 64)).astype(np.float32))
    np.save(tmp_path / "label" / "k0.npy", rng.standard_normal((4000, 2)).astype(np.float32))
    lines = [f"{f},{f},k0" for f in rng.integers(49, 4000, 320)]
    (tmp_path / "index.txt").write_text("\n".join(lines) + "\n")
    out = _finish(_run(_LEAK, tmp_path, shuffle, env=_env(path)), "leak")
    result = json.loads(out.splitlines()[-1])
    assert result["alive"] == 0, result  # every WindowSource was freed
    assert result["mapped"] == 0, result  # and with it its mappings
    assert result["fds"] == 0, result  # and descriptors
    # 100 rounds that each held 7+ batches of 800 KB (blocks: and the key's 1 MB block): a leaked batch, block or
    # source per round would be 80+ MB.
    assert result["grown"] < 40 * 2**20, result


# ----------------------------------------------------------------------------------------------------------
# Two workers under MultiWorkerMirroredStrategy

_WORKER = """
task, ports, directory = int(sys.argv[1]), sys.argv[2].split(","), sys.argv[3]
os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                                      "task": {"type": "worker", "index": task}})
import tensorflow as tf
import npyfeed.tf
strategy = tf.distribute.MultiWorkerMirroredStrategy()
assert strategy.num_replicas_in_sync == 2
GLOBAL_BATCH = 4 * strategy.num_replicas_in_sync
dist = strategy.distribute_datasets_from_function(
    lambda ctx: npyfeed.tf.dataset(src, GLOBAL_BATCH, shuffle=True, seed=9, input_context=ctx))
with strategy.scope():
    w = tf.Variable(tf.zeros((4 * 3, 2)), aggregation=tf.VariableAggregation.MEAN)

@tf.function
def train_step(x, y):
    def step(x, y):
        x = tf.reshape(x, (-1, 4 * 3))
        y = tf.stack([x[:, -1], x[:, -2]], axis=1)  # a target the linear model can learn
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((x @ w - y) ** 2)
        w.assign_sub(0.05 * tape.gradient(loss, w))  # MEAN: the replicas' updates, averaged
        return loss
    return strategy.run(step, args=(x, y))

out = {"epochs": [], "losses": []}
for epoch in range(3):
    seen = []
    for x, y in dist:
        seen += [v.tolist() for part in strategy.experimental_local_results(y) for v in part.numpy()[:, 0]]
        loss = train_step(x, y)
        out["losses"].append(float(strategy.reduce("MEAN", loss, axis=None)))
    out["epochs"].append(seen)
out["w"] = w.numpy().tolist()
with open(os.path.join(directory, f"worker{task}.json"), "w") as f:
    json.dump(out, f)
print("ok")
"""


def _free_ports(n: int) -> list:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.mark.slow
def test_two_workers_see_every_sample_once_per_epoch_and_train(tmp_path):
    ports = ",".join(map(str, _free_ports(2)))
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    procs = [_run(_WORKER, task, ports, tmp_path, env=env) for task in range(2)]
    try:
        for task, proc in enumerate(procs):
            _finish(proc, f"worker {task}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    workers = [json.loads((tmp_path / f"worker{t}.json").read_text()) for t in range(2)]
    index, _, labels = _make_arrays()
    id_of = {float(np.float32(labels[k][l, 0])): i for i, (_, l, k) in enumerate(index)}
    src = npyfeed.WindowSource.from_arrays(*_make_arrays(), WINDOW)
    for epoch in range(3):
        union = []
        for task, worker in enumerate(workers):
            ids = [id_of[v] for v in worker["epochs"][epoch]]
            # Worker `task` reads shard `task` of the epoch, in the numpy iterator's order.
            assert ids == list(src.epoch_order(epoch, shuffle=True, seed=9, num_shards=2, shard_index=task))
            union += ids
        assert sorted(union) == list(range(SAMPLES)), f"epoch {epoch}: not every sample exactly once"
    # One model: both workers end with the same weights, and the loss went down.
    np.testing.assert_array_equal(np.array(workers[0]["w"]), np.array(workers[1]["w"]))
    losses = workers[0]["losses"]
    assert len(losses) == 15 and np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5]), losses
