"""The hand-off into TensorFlow on the native path: the batch is taken in the thread that asks for it (a map with no
inter-op pool, never made parallel, no prefetch of TensorFlow's and none injected), and an eager loop reads it
through npyfeed's iterator, which skips TensorFlow's per-step executor switch. The speed is measured in
bench/bench_handoff.py; these tests hold the structure that speed comes from, and the batches: every one equal
to the numpy iterator's, eagerly, in a tf.function, across repeat() and a checkpoint's restore."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import npyfeed
import numpy as np
import pytest

if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("TensorFlow is not installed", allow_module_level=True)

BATCH = 8


@pytest.fixture(scope="module")
def tf():
    tf = pytest.importorskip("tensorflow")
    import npyfeed.tf
    import npyfeed.tf._feed

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NPYFEED_TF_OPS", "1")
        if npyfeed.tf._feed.native_ops() is None:
            pytest.skip("npyfeed's op library did not load")
        yield tf


@pytest.fixture(scope="module")
def src():
    rng = np.random.default_rng(5)
    factors = {k: rng.standard_normal((60, 3)).astype(np.float32) for k in "abc"}
    labels = {k: rng.standard_normal((60, 2)).astype(np.float32) for k in "abc"}
    index = [(int(f), int(f), k) for k in "abc" for f in rng.integers(3, 60, 20)]
    return npyfeed.WindowSource.from_arrays(index, factors, labels, 4)


def _graph(ds):
    """The dataset's graph: its tf.data transformations, and the functions they call."""
    from tensorflow.core.framework import graph_pb2

    graph = graph_pb2.GraphDef()
    graph.ParseFromString(ds._as_serialized_graph().numpy())
    return graph


def _ops(ds) -> list:
    graph = _graph(ds)
    return [node.op for node in graph.node] + [node.op for f in graph.library.function for node in f.node_def]


def _gather_maps(ds) -> list:
    """The attributes of each map whose function takes a batch (calls NpyfeedTake)."""
    graph = _graph(ds)
    takes = {f.signature.name for f in graph.library.function if any(n.op == "NpyfeedTake" for n in f.node_def)}
    nodes = list(graph.node) + [node for f in graph.library.function for node in f.node_def]
    return [node.attr for node in nodes if "MapDataset" in node.op and node.attr["f"].func.name in takes]


def _expected(src, epochs, shuffle=True):
    return [(x.copy(), y.copy()) for e in epochs for x, y in src.batches(BATCH, shuffle=shuffle, seed=3, epoch=e)]


def _assert_batches(got, want):
    assert len(got) == len(want)
    for (x, y), (wx, wy) in zip(got, want):
        np.testing.assert_array_equal(np.asarray(x), wx)
        np.testing.assert_array_equal(np.asarray(y), wy)


@pytest.mark.parametrize("repeat", [False, True])
def test_the_native_pipeline_takes_the_batch_in_the_calling_thread(tf, src, repeat):
    ds = npyfeed.tf.dataset(src, BATCH, shuffle=True, seed=3)
    if repeat:
        ds = ds.repeat(2)
    names = _ops(ds)
    assert "PrefetchDataset" not in names and not any(n.startswith("ParallelMapDataset") for n in names), names
    maps = _gather_maps(ds)
    assert len(maps) == 1 and not maps[0]["use_inter_op_parallelism"].b, names
    options = ds.options()
    assert options.experimental_optimization.inject_prefetch is False
    # Never parallelised by tf.data: force_synchronous where TensorFlow has it, else map_parallelization off.
    assert (maps[0]["force_synchronous"].b if "force_synchronous" in maps[0]
            else options.experimental_optimization.map_parallelization is False)


def test_the_fallback_keeps_its_prefetch(tf, src, monkeypatch):
    # The numpy_function needs the GIL: its calls stay in TensorFlow's threads, ahead of the loop.
    monkeypatch.setenv("NPYFEED_TF_OPS", "0")
    names = _ops(npyfeed.tf.dataset(src, BATCH))
    assert "PrefetchDataset" in names, names


@pytest.mark.parametrize("pipeline", ["native", "fallback", "device", "device streamed"])
def test_no_pipeline_runs_an_autotuning_model(tf, src, monkeypatch, pipeline):
    # With autotuning on, deleting an iterator waits for its model thread's current period (up to a minute):
    # every Keras fit/evaluate/predict deletes one. Nothing in these pipelines needs it; a parallel map appended
    # with AUTOTUNE still runs, and reads the same batches.
    monkeypatch.setenv("NPYFEED_TF_OPS", "0" if pipeline == "fallback" else "1")
    kwargs = {}
    if pipeline.startswith("device"):
        kwargs = {"gather": "device", "device": "/cpu:0"}
    if pipeline == "device streamed":  # arrays of 36,000 bytes, streamed within 30,000 in blocks of one key
        rng = np.random.default_rng(6)
        src = npyfeed.WindowSource.from_arrays(
            [(int(f), int(f), k) for k in "abc" for f in rng.integers(3, 600, 20)],
            {k: rng.standard_normal((600, 3)).astype(np.float32) for k in "abc"},
            {k: rng.standard_normal((600, 2)).astype(np.float32) for k in "abc"}, 4)
        kwargs.update(shuffle="blocks", memory_budget=1 << 13, device_memory_budget=30000)
    else:
        kwargs["shuffle"] = True
    ds = npyfeed.tf.dataset(src, BATCH, seed=3, **kwargs)
    assert ds.options().autotune.enabled is False
    doubled = ds.map(lambda x, y: (2 * x, y), num_parallel_calls=tf.data.AUTOTUNE)
    assert doubled.options().autotune.enabled is False
    want = [(2 * x, y) for x, y in src.batches(BATCH, seed=3, epoch=0, **{k: v for k, v in kwargs.items()
                                                                          if k in ("shuffle", "memory_budget")})]
    _assert_batches(list(doubled), want)


def test_eager_iterators_are_npyfeeds_and_read_the_numpy_batches(tf, src):
    import npyfeed.tf._compat

    ds = npyfeed.tf.dataset(src, BATCH, shuffle=True, seed=3)
    it = iter(ds)
    assert type(it) is npyfeed.tf._compat.HostIterator
    assert isinstance(it, tf.data.Iterator)
    _assert_batches(list(it), _expected(src, [0]))
    repeated = ds.repeat(2)  # epochs 0 and 1: repeat() counts from the dataset's first epoch
    assert type(iter(repeated)) is npyfeed.tf._compat.HostIterator
    _assert_batches(list(repeated), _expected(src, [0, 1]))
    _assert_batches(list(ds), _expected(src, [2]))  # the next pass continues after the epochs repeat() read


def _get_next_ops(function) -> list:
    """The ops a traced function (and the loops in it) gets an iterator's elements with."""
    graph = function.graph.as_graph_def()
    nodes = list(graph.node) + [node for f in graph.library.function for node in f.node_def]
    return sorted({node.op for node in nodes if node.op.startswith("IteratorGetNext")})


@pytest.mark.parametrize("iterator_is", ["an argument", "captured"])
def test_a_tf_function_takes_the_batch_in_its_own_thread_and_reads_the_numpy_batches(tf, src, iterator_is):
    # IteratorGetNextSync: the step's own thread takes the batch (IteratorGetNext hands each call to the iterator's
    # background thread and back). A tf.function rebuilds an iterator passed to it from its type: npyfeed's, or
    # the step would be TensorFlow's again.
    ds = npyfeed.tf.dataset(src, BATCH, shuffle=True, seed=3, drop_remainder=True)
    steps = len(ds)
    it = iter(ds)

    @tf.function
    def read(iterator):
        iterator = iterator if iterator_is == "an argument" else it
        xs = tf.TensorArray(tf.float32, size=steps)
        for i in tf.range(steps):
            x, _ = next(iterator)
            xs = xs.write(i, x)
        return xs.stack()

    assert _get_next_ops(read.get_concrete_function(it)) == ["IteratorGetNextSync"]
    got = read(it).numpy()
    want = [x for x, _ in _expected(src, [0]) if len(x) == BATCH]
    np.testing.assert_array_equal(got, np.stack(want))


_ONE_THREAD_STEPS = """
import numpy as np
import tensorflow as tf

tf.config.threading.set_inter_op_parallelism_threads(1)
tf.config.threading.set_intra_op_parallelism_threads(1)
import npyfeed
import npyfeed.tf

rng = np.random.default_rng(5)
factors = {k: rng.standard_normal((60, 3)).astype(np.float32) for k in "abc"}
labels = {k: rng.standard_normal((60, 2)).astype(np.float32) for k in "abc"}
index = [(int(f), int(f), k) for k in "abc" for f in rng.integers(3, 60, 20)]
src = npyfeed.WindowSource.from_arrays(index, factors, labels, 4)
step = tf.function(lambda iterator: next(iterator))
it = iter(npyfeed.tf.dataset(src, 8, shuffle=True, seed=3).repeat(2))
want = [x for e in (0, 1) for x, _ in src.batches(8, shuffle=True, seed=3, epoch=e)]
got = [step(it)[0].numpy() for _ in want]
assert all(np.array_equal(a, b) for a, b in zip(got, want))
print("read", len(got))
"""


@pytest.mark.parametrize("native", [True, False], ids=["native", "fallback"])
def test_graph_steps_on_a_pool_of_one_thread_read_every_batch(tf, native):
    # The step's thread blocks in IteratorGetNextSync while the pipeline makes the batch: with TensorFlow's pools
    # at one thread each, across an epoch boundary (the next epoch's functions run), it must not wait on itself.
    env = {**os.environ, "NPYFEED_TF_OPS": "1" if native else "0", "TF_CPP_MIN_LOG_LEVEL": "3"}
    run = subprocess.run([sys.executable, "-c", _ONE_THREAD_STEPS], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split()[-2:] == ["read", "16"], run.stdout


def test_a_signature_of_tensorflows_iterator_type_takes_npyfeeds(tf, src):
    # A step declared over tf.data.IteratorSpec accepts npyfeed's iterator (and gets TensorFlow's in it).
    ds = npyfeed.tf.dataset(src, BATCH, shuffle=True, seed=3)

    @tf.function(input_signature=[tf.data.IteratorSpec(ds.element_spec)])
    def step(iterator):
        return next(iterator)

    assert _get_next_ops(step.get_concrete_function()) == ["IteratorGetNext"]
    it = iter(ds)
    _assert_batches([step(it) for _ in range(len(ds))], _expected(src, [0]))
    with pytest.raises(tf.errors.OutOfRangeError):
        step(it)


def test_to_tensorflow_the_iterator_is_of_its_own_iterator_type(tf, src, tmp_path):
    # Only tf.function's tracing sees npyfeed's type: a SavedModel step over an iterator (its signature is
    # TensorFlow's IteratorSpec) takes npyfeed's, and so do TensorFlow's compatibility checks.
    ds = npyfeed.tf.dataset(src, BATCH, shuffle=True, seed=3)
    it = iter(ds)
    assert type(tf.type_spec_from_value(it)) is tf.data.IteratorSpec
    assert tf.data.IteratorSpec(ds.element_spec).is_compatible_with(it)

    class Step(tf.Module):
        @tf.function
        def step(self, iterator):
            return next(iterator)

    module = Step()
    first = module.step(it)
    tf.saved_model.save(module, str(tmp_path / "step"))
    loaded = tf.saved_model.load(str(tmp_path / "step"))
    _assert_batches([first, loaded.step(it), loaded.step(iter(ds))], _expected(src, [0])[:2] + _expected(src, [1])[:1])


def test_unrolled_next_calls_in_a_graph_without_autograph_fail_as_tensorflows(tf, src):
    # A Python loop over the iterator in a tf.function without AutoGraph unrolls into the graph: TensorFlow's
    # iterator refuses past 32 calls, with its message; npyfeed's too.
    from npyfeed.tf._compat import iterator_ops

    @tf.function(autograph=False)
    def unrolled(iterator):
        return [next(iterator)[0] for _ in range(iterator_ops.GET_NEXT_CALL_ERROR_THRESHOLD + 1)]

    with pytest.raises(ValueError, match="unusually high number"):
        unrolled(iter(npyfeed.tf.dataset(src, BATCH)))


def test_a_tf_function_step_ends_the_epoch_and_checkpoints_as_tensorflows(tf, src, tmp_path):
    # The end of the data is TensorFlow's OutOfRangeError, and an iterator advanced by a tf.function saves and
    # restores its position.
    want = _expected(src, [0, 1])
    ds = npyfeed.tf.dataset(src, BATCH, shuffle=True, seed=3)
    step = tf.function(lambda iterator: next(iterator))
    it = iter(ds)
    first = [step(it) for _ in range(len(ds))]
    with pytest.raises(tf.errors.OutOfRangeError):
        step(it)
    _assert_batches(first, want[:len(ds)])
    repeated = iter(npyfeed.tf.dataset(src, BATCH, shuffle=True, seed=3).repeat(2))
    head = [step(repeated) for _ in range(len(ds) + 2)]  # into the second epoch
    path = tf.train.Checkpoint(iterator=repeated).write(str(tmp_path / "it"))
    restored = iter(npyfeed.tf.dataset(src, BATCH, shuffle=True, seed=3).repeat(2))
    tf.train.Checkpoint(iterator=restored).read(path).assert_consumed()
    _assert_batches(head + [step(restored) for _ in range(len(want) - len(head))], want)


def test_a_restored_eager_iterator_continues(tf, src, tmp_path):
    want = _expected(src, [0, 1])
    ds = npyfeed.tf.dataset(src, BATCH, shuffle=True, seed=3).repeat(2)
    it = iter(ds)
    first = [next(it) for _ in range(5)]
    ckpt = tf.train.Checkpoint(iterator=it)
    path = ckpt.write(str(tmp_path / "it"))
    it2 = iter(npyfeed.tf.dataset(src, BATCH, shuffle=True, seed=3).repeat(2))
    tf.train.Checkpoint(iterator=it2).read(path).assert_consumed()
    _assert_batches(first + list(it2), want)


def test_an_asynchronous_executor_gets_tensorflows_own_next(tf, src, monkeypatch):
    # Off TensorFlow's default (a synchronous executor), the iterator leaves the step to TensorFlow.
    from npyfeed.tf._compat import context, iterator_ops

    calls = []
    real = iterator_ops.OwnedIterator._next_internal

    def counted(self):
        calls.append(1)
        return real(self)

    monkeypatch.setattr(iterator_ops.OwnedIterator, "_next_internal", counted)
    it = iter(npyfeed.tf.dataset(src, BATCH))
    next(it)
    assert calls == []  # the short step, synchronously
    executor = type(context.context().executor)
    monkeypatch.setattr(executor, "is_async", lambda self: True)
    x, y = next(it)
    assert calls == [1]
    np.testing.assert_array_equal(x.numpy(), _expected(src, [0], shuffle=False)[1][0])
