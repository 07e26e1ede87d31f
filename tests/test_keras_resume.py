"""Resuming ``fit`` with Keras' ``BackupAndRestore``: with ``npyfeed.tf.EpochCallback`` (``npyfeed.tf.dataset``;
tf.keras 2 and Keras 3) or ``npyfeed.keras.EpochCallback`` (``npyfeed.keras.PyDataset``; Keras 3) beside it, a
job preempted and run again reads exactly the batches an uninterrupted one reads from where Keras resumes.

* The callbacks by hand (no training): Keras' epoch and its first step set where the dataset's next pass starts;
  passes without them read the epochs after it.
* The preemption: the same script run twice in fresh interpreters (as a scheduler restarts a job). The first run
  is preempted at the start of epoch 2 (``save_freq="epoch"``), or mid-epoch 1 (``save_freq=2``); the second
  resumes from the backup. A layer records the ``x`` of every step; the oracle is ``src.batches`` of the epochs
  an uninterrupted run reads. tf.keras 2 resumes mid-epoch at the step after the last backup; Keras 3 restarts
  the interrupted epoch at its first step.
"""

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

sys.path.insert(0, os.path.dirname(__file__))
from test_tf import PATHS, _make_arrays  # noqa: E402

TIMEOUT_S = 300
BATCH = 8
KW = dict(shuffle=True, seed=3)
EPOCHS = 4


@pytest.fixture(scope="module")
def src():
    return npyfeed.WindowSource.from_arrays(*_make_arrays(), 4)


def _oracle(src, epoch: int, first: int = 0, **kwargs) -> list:
    return [x for x, _ in src.batches(BATCH, epoch=epoch, **dict(KW, **kwargs))][first:]


def _assert_reads(got: list, expected: list):
    assert len(got) == len(expected)
    for x, ex in zip(got, expected):
        np.testing.assert_array_equal(x, ex, strict=True)


# ----------------------------------------------------------------------------------------------------------
# The callbacks by hand


@pytest.fixture(scope="module", params=PATHS)
def nftf(request):
    """npyfeed.tf, on one path (native ops or the numpy_function fallback)."""
    pytest.importorskip("tensorflow")
    import npyfeed.tf
    import npyfeed.tf._feed

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NPYFEED_TF_OPS", "1" if request.param == "native" else "0")
        assert (npyfeed.tf._feed.native_ops() is not None) == (request.param == "native")
        yield npyfeed.tf


@pytest.mark.parametrize("gather", ["host", "device"])
def test_keras_epoch_and_first_step_set_the_next_pass(src, nftf, gather):
    kwargs = dict(gather=gather, device="/cpu:0") if gather == "device" else {}
    ds = nftf.dataset(src, BATCH, epoch=1, **KW, **kwargs)
    callback = nftf.EpochCallback(ds)
    callback.set_params({"steps": len(ds), "epochs": 9, "verbose": 0})
    callback.on_train_begin()

    def one_pass():
        return [x.numpy() for x, _ in ds]

    callback.on_epoch_begin(5)  # a restored Keras epoch: the dataset's epoch 1 + 5
    callback.on_train_batch_begin(0)
    _assert_reads(one_pass(), _oracle(src, 6))
    callback.on_epoch_begin(3)  # tf.keras 2 resumed mid-epoch: its first step is the pass's first batch
    callback.on_train_batch_begin(2)
    callback.on_train_batch_begin(3)  # later steps move nothing
    # The pass is the n - 2 steps Keras runs (its cardinality still counts the epoch's n: Keras' step count).
    _assert_reads([x.numpy() for x, _ in ds.take(len(ds) - 2)], _oracle(src, 4, first=2))
    _assert_reads(one_pass(), _oracle(src, 5))  # without the callback: the next epoch, from its first batch
    _assert_reads([x.numpy() for x, _ in ds.take(2)], _oracle(src, 6)[:2])


def test_a_pass_starts_when_it_is_read_not_when_its_iterator_is_made(src, nftf):
    # tf.keras 2 makes an epoch's iterator (and one more, never read) before on_epoch_begin: the pass must start at
    # its first batch, where the callback has set it by then (a fallback that started it at iter() read epochs
    # 1, 2, ... in an uninterrupted fit).
    ds = nftf.dataset(src, BATCH, **KW)
    unread = iter(ds)
    it = iter(ds)
    nftf.EpochCallback(ds).on_epoch_begin(5)
    _assert_reads([x.numpy() for x, _ in it], _oracle(src, 5))
    _assert_reads([x.numpy() for x, _ in ds], _oracle(src, 6))
    del unread


def test_tf_epoch_callback_refuses_what_it_cannot_follow(src, nftf):
    ds = nftf.dataset(src, BATCH, **KW)
    for other in (ds.repeat(), ds.map(lambda x, y: (x, y)), src):
        with pytest.raises(npyfeed._checks.ArgumentTypeError, match="returned by npyfeed.tf.dataset"):
            nftf.EpochCallback(other)
    callback = nftf.EpochCallback(ds)
    callback.set_params({"steps": len(ds) - 1, "epochs": 2, "verbose": 0})
    with pytest.raises(ValueError, match="leave steps_per_epoch out"):
        callback.on_train_begin()
    for epoch, batch in ((0, len(ds)), (-1, 0), (2**62, 0)):
        with pytest.raises(ValueError, match="batch|epoch"):
            npyfeed.tf._pipeline.pipeline_of(ds).passes.start(epoch, batch)


def test_a_streamed_device_pipeline_starts_passes_at_an_epochs_first_batch(nftf):
    rng = np.random.default_rng(0)
    factors = {f"k{i}": rng.standard_normal((300, 4)).astype(np.float32) for i in range(6)}
    labels = {k: rng.standard_normal((300, 1)).astype(np.float32) for k in factors}
    index = [(f, f, k) for k in factors for f in range(9, 300, 7)]
    src = npyfeed.WindowSource.from_arrays(index, factors, labels, 10, cache=False)
    kw = dict(shuffle="blocks", memory_budget=20_000, seed=0)
    ds = nftf.dataset(src, 16, gather="device", device="/cpu:0", device_memory_budget=34_000, **kw)
    assert npyfeed.tf._pipeline.pipeline_of(ds).device.streams
    callback = nftf.EpochCallback(ds)
    callback.on_epoch_begin(2)
    with pytest.raises(ValueError, match="at an epoch's first batch only"):
        callback.on_train_batch_begin(3)
    callback.on_epoch_begin(2)
    callback.on_train_batch_begin(0)
    _assert_reads([x.numpy() for x, _ in ds], [x for x, _ in src.batches(16, epoch=2, **kw)])


def test_pydataset_epoch_callback_sets_the_epoch(src):
    keras = pytest.importorskip("keras")
    if int(keras.__version__.split(".")[0]) < 3:
        pytest.skip("npyfeed.keras needs Keras 3")
    import npyfeed.keras as nfk

    ds = nfk.PyDataset(src, BATCH, epoch=1, **KW)
    callback = nfk.EpochCallback(ds)
    callback.set_params({"steps": len(ds), "epochs": 9, "verbose": 0})
    callback.on_train_begin()
    callback.on_epoch_begin(5)
    ds.on_epoch_begin()
    _assert_reads([ds[i][0] for i in range(len(ds))], _oracle(src, 6))
    ds.on_epoch_end()
    assert ds.epoch == 7
    callback.on_epoch_begin(2)  # a second fit from a restored epoch: back to it
    assert ds.epoch == 3
    with pytest.raises(npyfeed._checks.ArgumentTypeError, match="PyDataset"):
        nfk.EpochCallback(src)


# ----------------------------------------------------------------------------------------------------------
# Preempted and run again, in fresh interpreters

#: name -> (dataset, save_freq, (epoch, step) at whose start the first run is preempted).
CASES = {
    "tf_epoch": ("tf", "epoch", (2, 0)),
    "tf_mid_epoch": ("tf", 2, (1, 4)),
    "tf_device_mid_epoch": ("tf_device", 2, (1, 4)),
    "pydataset_epoch": ("pydataset", "epoch", (2, 0)),
    "pydataset_mid_epoch": ("pydataset", 2, (1, 4)),
}

_JOB = f"""
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
sys.path.insert(0, {os.path.dirname(__file__)!r})
import numpy as np
import tensorflow as tf
import npyfeed, npyfeed.tf
from test_tf import _make_arrays

import keras as _keras_package
keras = tf.keras  # tf.keras 2 on TensorFlow 2.15, Keras 3 from 2.16 on
KERAS_3 = int(_keras_package.__version__.split(".")[0]) >= 3
if KERAS_3:
    import npyfeed.keras
directory, run = sys.argv[1], sys.argv[2]
src = npyfeed.WindowSource.from_arrays(*_make_arrays(), 4)
out = {{"keras_3": np.array(KERAS_3)}}


class Preempted(Exception):
    pass


class Preempt(keras.callbacks.Callback):
    # The scheduler takes the node away at the start of step `step` of epoch `epoch` (first run only).
    def __init__(self, at):
        super().__init__()
        self.at, self.epoch = at, None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if run == "1" and (self.epoch, batch) == self.at:
            raise Preempted()


for name, (kind, save_freq, at) in {CASES!r}.items():
    if kind == "pydataset" and not KERAS_3:
        continue
    seen = []

    class Record(keras.layers.Layer):
        def call(self, x):
            try:  # run_eagerly: the step's concrete batch (not the model build's symbolic one)
                seen.append(np.array(x))
            except Exception:
                pass
            return x

    if kind == "pydataset":
        ds = npyfeed.keras.PyDataset(src, {BATCH}, **{KW!r})
        follow = npyfeed.keras.EpochCallback(ds)
    else:
        device = dict(gather="device", device="/cpu:0") if kind == "tf_device" else dict()
        ds = npyfeed.tf.dataset(src, {BATCH}, **{KW!r}, **device)
        follow = npyfeed.tf.EpochCallback(ds)
    model = keras.Sequential([keras.Input((4, 3)), Record(), keras.layers.Flatten(), keras.layers.Dense(2)])
    model.compile("sgd", "mse", run_eagerly=True)
    backup = keras.callbacks.BackupAndRestore(os.path.join(directory, name), save_freq=save_freq)
    try:
        model.fit(ds, epochs={EPOCHS}, verbose=0, callbacks=[backup, follow, Preempt(tuple(at))], shuffle=False)
        assert run == "2", "the first run was not preempted"
    except Preempted:
        assert run == "1"
    out[name + "/n"] = np.array(len(seen))
    out.update({{f"{{name}}/{{i}}": x for i, x in enumerate(seen)}})
np.savez(os.path.join(directory, "run" + run + ".npz"), **out)
print("ok")
"""


def _run_job(directory, run: str, path: str):
    env = dict(os.environ, NPYFEED_TF_OPS="1" if path == "native" else "0", KERAS_BACKEND="tensorflow",
               CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", _JOB, str(directory), run], capture_output=True, text=True,
                          timeout=TIMEOUT_S, env=env)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr[-4000:]
    with np.load(directory / f"run{run}.npz") as steps:
        return dict(steps)


@pytest.fixture(scope="module", params=PATHS)
def job(tmp_path_factory, request):
    """The two runs of the job: preempted, then resumed from the backups (a new interpreter each)."""
    directory = tmp_path_factory.mktemp("backup")
    return _run_job(directory, "1", request.param), _run_job(directory, "2", request.param)


def _steps(run, name: str) -> list:
    return [run[f"{name}/{i}"] for i in range(int(run[f"{name}/n"]))]


@pytest.mark.slow  # two TensorFlow processes per path: 25-35 s on 2 busy cores
@pytest.mark.parametrize("name", list(CASES))
def test_a_resumed_fit_reads_what_an_uninterrupted_one_reads(src, job, name):
    first, second = job
    kind, save_freq, (epoch, step) = CASES[name]
    if kind == "pydataset" and not first["keras_3"]:
        pytest.skip("npyfeed.keras needs Keras 3")
    uninterrupted = [_oracle(src, e) for e in range(EPOCHS)]
    # Preempted at the start of step `step` of `epoch`: the first run read everything before it.
    _assert_reads(_steps(first, name), sum(uninterrupted[:epoch], []) + uninterrupted[epoch][:step])
    if save_freq == "epoch":
        resumed_at = (epoch, 0)  # the backup at the end of epoch - 1
    elif second["keras_3"]:
        resumed_at = (epoch, 0)  # Keras 3 restarts the interrupted epoch at its first step
    else:
        # tf.keras 2: backups every 2 steps (counted across epochs: 5 batches an epoch), the last one after step
        # 2 of epoch 1; the resumed run starts at step 3.
        resumed_at = (1, 3)
    e, b = resumed_at
    _assert_reads(_steps(second, name), uninterrupted[e][b:] + sum(uninterrupted[e + 1:], []))
