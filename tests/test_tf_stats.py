"""Live statistics through npyfeed.tf: ``ds.stats()`` of a dataset counts exactly what its passes read, on both paths
(the native op and the numpy_function fallback); `npyfeed.tf.StatsCallback` in ``model.fit``: one stats dict per
epoch, its figures in Keras' logs, its line printed, and TensorBoard scalars that read back as those figures."""

from __future__ import annotations

import gc
import importlib.util
import os
import weakref

import npyfeed
import numpy as np
import pytest

if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("TensorFlow is not installed", allow_module_level=True)

BATCH = 8


@pytest.fixture(scope="module", params=["native", "numpy_function"])
def tf(request):
    tf = pytest.importorskip("tensorflow")
    import npyfeed.tf
    import npyfeed.tf._feed

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NPYFEED_TF_OPS", "1" if request.param == "native" else "0")
        assert (npyfeed.tf._feed.native_ops() is not None) == (request.param == "native")
        yield tf


@pytest.fixture(scope="module")
def src():
    rng = np.random.default_rng(9)
    factors = {k: rng.standard_normal((50, 3)).astype(np.float32) for k in "abcd"}
    labels = {k: rng.standard_normal((50, 2)).astype(np.float32) for k in "abcd"}
    index = [(int(f), int(f), k) for k in "abcd" for f in rng.integers(3, 50, 15)]
    return npyfeed.WindowSource.from_arrays(index, factors, labels, 4)


def test_dataset_stats_count_its_passes(tf, src):
    ds = npyfeed.tf.dataset(src, BATCH, shuffle=True, seed=1)
    assert ds.stats()["batches"] == 0
    nbytes = 0
    for _ in range(2):
        for x, y in ds:
            nbytes += x.numpy().nbytes + y.numpy().nbytes
    got = ds.stats()
    steps = src.num_batches(BATCH)
    assert got["batches"] == 2 * steps
    assert got["samples"] == 2 * len(src) == 120
    assert got["bytes"] == nbytes
    assert got["elapsed_seconds"] > 0 and 0 <= got["wait_fraction"] <= 1


def _events(log_dir, tf) -> dict:
    """{(step, tag): value} of the scalars written under `log_dir`."""
    out = {}
    for name in os.listdir(log_dir):
        for event in tf.compat.v1.train.summary_iterator(os.path.join(log_dir, name)):
            for value in event.summary.value:
                assert value.metadata.plugin_data.plugin_name == "scalars"
                out[event.step, value.tag] = float(tf.make_ndarray(value.tensor))
    return out


def test_stats_callback_in_model_fit(tf, src, tmp_path, capsys):
    ds = npyfeed.tf.dataset(src, BATCH, shuffle=True, seed=2)
    model = tf.keras.Sequential([tf.keras.Input(src.x_shape), tf.keras.layers.Flatten(),
                                 tf.keras.layers.Dense(src.y_shape[0])])
    model.compile("sgd", "mse")
    callback = npyfeed.tf.StatsCallback(ds, log_dir=tmp_path / "logs")
    history = model.fit(ds, epochs=3, verbose=0, shuffle=False, callbacks=[callback])
    steps = src.num_batches(BATCH)
    assert [e["batches"] for e in callback.epochs] == [steps] * 3
    assert [e["samples"] for e in callback.epochs] == [len(src)] * 3
    assert history.history["npyfeed_wait_fraction"] == [e["wait_fraction"] for e in callback.epochs]
    assert history.history["npyfeed_samples_per_second"] == [e["samples_per_second"] for e in callback.epochs]
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("npyfeed, epoch")]
    assert [line.split(":")[0] for line in printed] == ["npyfeed, epoch 1", "npyfeed, epoch 2", "npyfeed, epoch 3"]
    assert all("the model waited" in line for line in printed)
    # How the threads shared the CPUs, per epoch, where the kernel reports it (Linux).
    if npyfeed.stats.thread_times() is not None:
        assert len(callback.cpu) == 3 and all(0 <= c["main_cpu_wait"] <= 1 for c in callback.cpu), callback.cpu
        assert history.history["npyfeed_main_cpu_wait"] == [c["main_cpu_wait"] for c in callback.cpu]
        assert all(c["main_cores"] > 0 for c in callback.cpu), callback.cpu  # Keras' Python ran each epoch
        assert all("; CPU: the main thread used" in line for line in printed)
    events = _events(tmp_path / "logs", tf)
    assert {tag for _, tag in events} == {f"npyfeed/{name}" for name in npyfeed.tf.StatsCallback.SCALARS}
    for epoch, stats in enumerate(callback.epochs):
        for name in npyfeed.tf.StatsCallback.SCALARS:
            assert events[epoch, f"npyfeed/{name}"] == pytest.approx(stats[name], rel=1e-6), (epoch, name)


def test_stats_callback_watches_a_source_or_a_plan(tf, src):
    for watched in (src, src.plan(BATCH)):
        callback = npyfeed.tf.StatsCallback(watched, verbose=0)
        callback.on_epoch_begin(0)
        plan = watched if isinstance(watched, npyfeed.Plan) else src.plan(BATCH)
        list(plan.batches(0))
        callback.on_epoch_end(0, {})
        assert callback.epochs[0]["batches"] == src.num_batches(BATCH)
    with pytest.raises(TypeError, match="cannot find npyfeed statistics"):
        npyfeed.tf.StatsCallback(tf.data.Dataset.range(3))


def test_npyfeed_keeps_what_it_knows_of_a_dataset_beside_it_not_on_it(tf, src):
    # A registry of npyfeed's, keyed by the dataset: no attribute of npyfeed's on TensorFlow's object (but the
    # public stats()), found for the dataset itself only, and gone with it.
    import npyfeed.tf._pipeline

    ds = npyfeed.tf.dataset(src, BATCH, shuffle=True, seed=1)
    assert [name for name in vars(ds) if "npyfeed" in name or "stats" in name] == ["stats"]
    pipeline = npyfeed.tf._pipeline.pipeline_of(ds)
    assert pipeline.passes is not None and len(pipeline.batches) == src.num_batches(BATCH)
    derived = ds.map(lambda x, y: (x, y))
    assert npyfeed.tf._pipeline.pipeline_of(derived) is None
    with pytest.raises(TypeError, match="cannot find npyfeed statistics"):
        npyfeed.stats.StatsLogger(derived)
    logger = npyfeed.stats.StatsLogger(ds)
    logger.epoch_begin()
    list(ds)
    assert logger.epoch_end()["batches"] == src.num_batches(BATCH)
    assert npyfeed.tf._pipeline.pipeline_of(tf.constant(1)) is None and npyfeed.tf._pipeline.pipeline_of(3) is None
    gone = weakref.ref(ds)
    del ds, derived, logger, pipeline
    gc.collect()
    assert gone() is None  # nothing of npyfeed's holds it

