"""TensorFlow's private API, held in `npyfeed.tf._compat`: this TensorFlow release is one the surface was checked
on, every private name is there, and without it the pipelines still give the numpy iterator's batches through
public tf.data API, saying once what is missing."""

from __future__ import annotations

import importlib.util
import logging
import os
import pathlib
import subprocess
import sys
import threading

import npyfeed
import numpy as np
import pytest

if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("TensorFlow is not installed", allow_module_level=True)

BATCH = 8
PYTHON = pathlib.Path(__file__).resolve().parents[1] / "python" / "npyfeed"


@pytest.fixture(scope="module")
def compat():
    pytest.importorskip("tensorflow")
    import npyfeed.tf  # noqa: F401
    import npyfeed.tf._compat
    import npyfeed.tf._feed

    return npyfeed.tf._compat


@pytest.fixture(scope="module")
def src():
    rng = np.random.default_rng(11)
    factors = {k: rng.standard_normal((50, 3)).astype(np.float32) for k in "abc"}
    labels = {k: rng.standard_normal((50, 2)).astype(np.float32) for k in "abc"}
    index = [(int(f), int(f), k) for k in "abc" for f in rng.integers(3, 50, 14)]
    return npyfeed.WindowSource.from_arrays(index, factors, labels, 4)


def _expected(src, epochs, **kw):
    return [(x.copy(), y.copy()) for e in epochs for x, y in src.batches(BATCH, shuffle=True, seed=3, epoch=e, **kw)]


def _assert_batches(got, want):
    assert len(got) == len(want)
    for (x, y), (wx, wy) in zip(got, want):
        np.testing.assert_array_equal(np.asarray(x), wx)
        np.testing.assert_array_equal(np.asarray(y), wy)


def _maps(ds) -> list:
    """The attributes of every map in the dataset's graph (its functions' included)."""
    from tensorflow.core.framework import graph_pb2

    graph = graph_pb2.GraphDef()
    graph.ParseFromString(ds._as_serialized_graph().numpy())
    nodes = list(graph.node) + [node for f in graph.library.function for node in f.node_def]
    maps = [node.attr for node in nodes if node.op == "MapDataset"]
    assert maps
    return maps


def test_the_private_map_is_in_the_calling_thread(compat, src, monkeypatch):
    # The control of the fallback's map check below: the private map has no inter-op pool.
    monkeypatch.setenv("NPYFEED_TF_OPS", "1")
    if npyfeed.tf._feed.native_ops() is None:
        pytest.skip("npyfeed's op library did not load")
    assert not all(attr["use_inter_op_parallelism"].b for attr in _maps(npyfeed.tf.dataset(src, BATCH)))


def test_this_tensorflow_release_was_checked(compat):
    # A new release goes red here (.ci/latest) until its private surface is checked and the release added.
    import tensorflow as tf

    assert compat.version_checked(tf.__version__), (
        f"TensorFlow {tf.__version__} is not among the releases npyfeed's use of TensorFlow's private API was checked "
        f"on ({compat.CHECKED_VERSIONS}): run the TensorFlow tests on it, check the names in "
        f"python/npyfeed/tf/_compat.py, then add it to CHECKED_VERSIONS")


@pytest.mark.parametrize("version, checked", [("2.15.1", True), ("2.21.0", True), ("2.21.0rc1", True),
                                              ("2.22.0", False), ("3.0.0", False), ("2.1.0", False)])
def test_version_checked_compares_major_and_minor(compat, version, checked):
    assert compat.version_checked(version) is checked


def test_every_private_name_is_there(compat):
    import tensorflow as tf

    assert compat.MISSING == [] and compat.AVAILABLE
    # Only this module reaches into tensorflow.python.
    reaching = sorted(p.relative_to(PYTHON).as_posix() for p in PYTHON.rglob("*.py")
                      if "tensorflow.python" in p.read_text())
    assert reaching == ["tf/_compat.py"], reaching
    # The attributes of TensorFlow's own objects the adapters read, on real ones.
    ds = tf.data.Dataset.range(3)
    it = iter(ds)
    objects = {"dataset": ds, "OwnedIterator": it, "IteratorSpec": tf.data.IteratorSpec(ds.element_spec),
               "executor": compat.context.context().executor}
    assert set(objects) == set(compat.INSTANCE_ATTRIBUTES)
    assert type(it) is compat.iterator_ops.OwnedIterator
    missing = [f"{kind}.{name}" for kind, names in compat.INSTANCE_ATTRIBUTES.items() for name in names
               if not hasattr(objects[kind], name)]
    assert missing == []
    # force_synchronous from TensorFlow 2.16 on.
    assert compat.map_is_synchronous() == (tuple(int(v) for v in tf.__version__.split(".")[:2]) >= (2, 16))


def test_a_missing_name_or_keyword_is_found(compat, monkeypatch):
    table = dict(compat.PRIVATE_NAMES)
    table["tensorflow.python.data.ops.map_op"] += ("_MapDataset.no_such_method",)
    monkeypatch.setattr(compat, "PRIVATE_NAMES", table)
    monkeypatch.setattr(compat, "MAP_KEYWORDS", compat.MAP_KEYWORDS + ("no_such_keyword",))
    assert compat._missing() == ["tensorflow.python.data.ops.map_op._MapDataset.no_such_method"]
    table["tensorflow.python.data.ops.map_op"] = ("_MapDataset",)
    assert compat._missing() == ["tensorflow.python.data.ops.map_op._MapDataset(no_such_keyword=)"]


@pytest.fixture
def without_private_api(compat, monkeypatch, caplog):
    """The pipelines as where TensorFlow lacks a private name; yields the warnings npyfeed's logger gave."""
    monkeypatch.setattr(compat, "AVAILABLE", False)
    monkeypatch.setattr(compat, "MISSING", ["tensorflow.python.data.ops.map_op._MapDataset"])
    monkeypatch.setattr(compat, "_warned", threading.Event())
    with caplog.at_level(logging.WARNING, logger="npyfeed"):
        yield lambda: [r.getMessage() for r in caplog.records if "public tf.data API" in r.getMessage()]


@pytest.mark.parametrize("feed", ["native", "numpy_function"])
def test_without_the_private_api_the_batches_are_the_same(compat, src, without_private_api, monkeypatch, feed):
    import npyfeed.tf._feed
    import tensorflow as tf

    monkeypatch.setenv("NPYFEED_TF_OPS", "1" if feed == "native" else "0")
    if feed == "native" and npyfeed.tf._feed.native_ops() is None:
        pytest.skip("npyfeed's op library did not load")
    ds = npyfeed.tf.dataset(src, BATCH, shuffle=True, seed=3)
    it = iter(ds)
    assert not isinstance(it, compat.HostIterator) and not isinstance(ds, compat.HostDataset)  # TensorFlow's own
    assert all(attr["use_inter_op_parallelism"].b for attr in _maps(ds))  # TensorFlow's own map
    _assert_batches(list(it), _expected(src, [0]))
    _assert_batches(list(ds.repeat(2)), _expected(src, [1, 2]))  # TensorFlow's repeat(): the next two passes
    step = tf.function(lambda iterator: next(iterator))
    it = iter(ds)
    _assert_batches([step(it) for _ in range(len(ds))], _expected(src, [3]))
    # Statistics and the epoch callback find the dataset as before.
    assert ds.stats()["batches"] == npyfeed.stats.StatsLogger(ds)._counts()["batches"] == 4 * len(ds)
    npyfeed.tf.EpochCallback(ds).on_epoch_begin(7)
    _assert_batches(list(ds), _expected(src, [7]))
    gathered = npyfeed.tf.dataset(src, BATCH, shuffle=True, seed=3, gather="device", device="/cpu:0")
    _assert_batches(list(gathered), _expected(src, [0]))
    warnings = without_private_api()
    assert len(warnings) == 1 and "tensorflow.python.data.ops.map_op._MapDataset" in warnings[0], warnings


_MISSING_AT_IMPORT = """
import sys
import numpy as np
import tensorflow as tf
import tensorflow.python.autograph.core as core

# A release without the module: its import fails (TensorFlow's own code holds its copy).
del core.ag_ctx
sys.modules["tensorflow.python.autograph.core.ag_ctx"] = None
import npyfeed, npyfeed.tf._compat, npyfeed.tf

assert not npyfeed.tf._compat.AVAILABLE, npyfeed.tf._compat.MISSING
rng = np.random.default_rng(11)
factors = {k: rng.standard_normal((50, 3)).astype(np.float32) for k in "abc"}
labels = {k: rng.standard_normal((50, 2)).astype(np.float32) for k in "abc"}
src = npyfeed.WindowSource.from_arrays([(int(f), int(f), k) for k in "abc" for f in rng.integers(3, 50, 14)],
                                       factors, labels, 4)
got = [(x.numpy(), y.numpy()) for x, y in npyfeed.tf.dataset(src, 8, shuffle=True, seed=3)]
want = list(src.batches(8, shuffle=True, seed=3))
assert len(got) == len(want) and all(np.array_equal(a, b) and np.array_equal(c, d) for (a, c), (b, d) in zip(got, want))
print("read", len(got))
"""


def test_a_module_missing_at_import_selects_the_public_path(compat):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    run = subprocess.run([sys.executable, "-c", _MISSING_AT_IMPORT], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split()[-2:] == ["read", str(-(-42 // BATCH))], run.stdout
    warnings = [line for line in run.stderr.splitlines() if "public tf.data API" in line]
    assert len(warnings) == 1 and "tensorflow.python.autograph.core.ag_ctx" in warnings[0], run.stderr[-3000:]
