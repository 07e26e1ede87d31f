"""The users' code shape on the oldest supported stack: a ``tf.estimator.Estimator`` whose ``input_fn`` returns
``npyfeed.tf.dataset(...)`` over files in the users' layout.

``tf.estimator`` exists up to TensorFlow 2.15 (with ``tensorflow-estimator``); the test is skipped where it does
not (TensorFlow >= 2.16). ``.ci/run`` runs it in its floor environment (TensorFlow 2.15, numpy 1.26).

The Estimator trains a linear model for one pass (graph mode, ``tf.compat.v1`` sessions, ``from_generator`` in a
graph), which must lower its evaluation loss, and predicts with an identity head, whose outputs must equal numpy
slicing of the files, sample by sample, in index order.

Resume: a job with ``tf.data.experimental.CheckpointInputPipelineHook`` over ``npyfeed.tf.dataset(...).repeat()``,
preempted between two checkpoints (its process ends) and run again in a new process, continues with exactly the
batch after the restored checkpoint, across the epochs (native ops and fallback).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import npyfeed
import numpy as np
import pytest
from npyfeed import _layout

if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("TensorFlow is not installed", allow_module_level=True)

WINDOW = 5
ROWS = 60
FEATURES = 4
LABELS = 2
KEYS = 3
BATCH = 16


@pytest.fixture(scope="module")
def tf():
    tf = pytest.importorskip("tensorflow")
    if not hasattr(tf, "estimator") or not hasattr(tf.estimator, "Estimator"):
        pytest.skip(f"tf.estimator does not exist in TensorFlow {tf.__version__} (removed in 2.16)")
    import npyfeed.tf  # noqa: F401

    return tf


@pytest.fixture(scope="module")
def users_layout(tmp_path_factory):
    """``<root>/factor/<key>.npy``, ``<root>/label/<key>.npy`` and an index file, as the users have them.

    Labels are a linear function of the window's last row, so one pass of a linear model must learn something.
    """
    root = tmp_path_factory.mktemp("users")
    rng = np.random.default_rng(20261130)
    mix = rng.standard_normal((FEATURES, LABELS))
    entries, expected_x, expected_y = [], [], []
    for k in range(KEYS):
        key = f"{600000 + k}"
        factor = rng.standard_normal((ROWS, FEATURES)).astype(np.float32)
        label = (factor @ mix).astype(np.float32)  # label row r depends on factor row r
        _layout.write_key(root, key, factor, label)
        for row in range(WINDOW - 1, ROWS):
            entries.append((row, row, key))
            expected_x.append(factor[row - WINDOW + 1: row + 1])
            expected_y.append(label[row])
    _layout.write_index(root / "train.txt", _layout.index_text(entries))
    return root, np.stack(expected_x), np.stack(expected_y)


def _model_fn(features, labels, mode):
    import tensorflow as tf

    v1 = tf.compat.v1
    flat = tf.reshape(features, [-1, WINDOW * FEATURES])
    weights = v1.get_variable("w", [WINDOW * FEATURES, LABELS], initializer=v1.zeros_initializer())
    prediction = tf.matmul(flat, weights)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"x": features, "prediction": prediction})
    loss = tf.reduce_mean(tf.square(prediction - labels))
    train_op = v1.train.GradientDescentOptimizer(0.05).minimize(loss, global_step=v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def test_estimator_trains_and_predicts_from_npyfeed_dataset(tf, users_layout, tmp_path):
    root, expected_x, expected_y = users_layout

    def input_fn(shuffle):
        def fn():
            src = npyfeed.WindowSource([root / "train.txt"], root / "factor", root / "label", window=WINDOW)
            return npyfeed.tf.dataset(src, BATCH, shuffle=shuffle, seed=0)

        return fn

    # Checkpoints at the end of each train() call (the default), which evaluate() and predict() start from.
    config = tf.estimator.RunConfig(model_dir=str(tmp_path / "model"), tf_random_seed=0)
    estimator = tf.estimator.Estimator(_model_fn, config=config)
    batches_per_pass = -(-len(expected_x) // BATCH)

    estimator.train(input_fn(shuffle=True), steps=1)  # one step, so that evaluate has a checkpoint to start from
    loss_before = estimator.evaluate(input_fn(shuffle=False))["loss"]
    estimator.train(input_fn(shuffle=True))  # one whole pass: the dataset ends, the Estimator stops
    assert estimator.get_variable_value("global_step") == 1 + batches_per_pass
    loss_after = estimator.evaluate(input_fn(shuffle=False))["loss"]
    assert loss_after < 0.5 * loss_before

    predictions = list(estimator.predict(input_fn(shuffle=False)))
    assert len(predictions) == len(expected_x)
    np.testing.assert_array_equal(np.stack([p["x"] for p in predictions]), expected_x)
    weights = estimator.get_variable_value("w")
    np.testing.assert_allclose(np.stack([p["prediction"] for p in predictions]),
                               expected_x.reshape(len(expected_x), -1) @ weights, rtol=1e-4, atol=1e-4)


# An Estimator preempted and run again: tf.data.experimental.CheckpointInputPipelineHook saves the iterator with
# the model's checkpoints (every SAVE_STEPS steps), and a new process restores both and continues with exactly
# the next batch of the stream (the one after the checkpoint), across the epochs of repeat().
SAVE_STEPS = 3
PREEMPTED_AFTER = 8  # steps
MAX_STEPS = 2 * -(-KEYS * (ROWS - WINDOW + 1) // BATCH) + 2  # into the third epoch

_PREEMPTED_JOB = f"""
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
sys.path.insert(0, {os.path.dirname(__file__)!r})
import numpy as np
import tensorflow as tf
import npyfeed, npyfeed.tf
from test_estimator import _model_fn

root, model_dir, run = sys.argv[1], sys.argv[2], sys.argv[3]
seen = []


class Record(tf.estimator.SessionRunHook):
    # The batch each step trains on; the first run is preempted (the process ends) after {PREEMPTED_AFTER} steps.
    def begin(self):
        self.x = tf.compat.v1.get_collection("npyfeed_x")[0]

    def before_run(self, run_context):
        return tf.estimator.SessionRunArgs(self.x)

    def after_run(self, run_context, run_values):
        seen.append(run_values.results)
        if run == "1" and len(seen) == {PREEMPTED_AFTER}:
            save()
            os._exit(3)


def save():
    np.savez(os.path.join(model_dir, "run" + run + ".npz"), *seen)


def model_fn(features, labels, mode):
    tf.compat.v1.add_to_collection("npyfeed_x", features)
    return _model_fn(features, labels, mode)


def input_fn():
    src = npyfeed.WindowSource([os.path.join(root, "train.txt")], os.path.join(root, "factor"),
                               os.path.join(root, "label"), window={WINDOW})
    return npyfeed.tf.dataset(src, {BATCH}, shuffle=True, seed=0).repeat()


config = tf.estimator.RunConfig(model_dir=model_dir, tf_random_seed=0, save_checkpoints_steps={SAVE_STEPS})
estimator = tf.estimator.Estimator(model_fn, config=config)
estimator.train(input_fn, max_steps={MAX_STEPS},
                hooks=[tf.data.experimental.CheckpointInputPipelineHook(estimator), Record()])
save()
print("ok")
"""


@pytest.mark.parametrize("path", ["native", "numpy_function"])
def test_checkpoint_input_pipeline_hook_resumes_at_the_next_batch(tf, users_layout, tmp_path, path):
    root, _, _ = users_layout
    model_dir = tmp_path / "model"
    env = dict(os.environ, NPYFEED_TF_OPS="1" if path == "native" else "0", CUDA_VISIBLE_DEVICES="")

    def run(number: str, status: int) -> list:
        proc = subprocess.run([sys.executable, "-c", _PREEMPTED_JOB, str(root), str(model_dir), number],
                              capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == status, proc.stdout + proc.stderr[-4000:]
        with np.load(model_dir / f"run{number}.npz") as steps:
            return [steps[f"arr_{i}"] for i in range(len(steps.files))]

    first = run("1", 3)  # preempted: the process ends after PREEMPTED_AFTER steps
    saved_step = int(tf.train.load_variable(str(model_dir), "global_step"))
    assert 0 < saved_step < PREEMPTED_AFTER  # the latest checkpoint is before the preemption
    second = run("2", 0)

    src = npyfeed.WindowSource([root / "train.txt"], root / "factor", root / "label", window=WINDOW)
    stream = [x for epoch in range(3) for x, _ in src.batches(BATCH, shuffle=True, seed=0, epoch=epoch)]
    assert len(first) == PREEMPTED_AFTER and len(second) == MAX_STEPS - saved_step
    # The first run reads the stream from its start; the second one from the batch after the checkpoint on.
    for got, expected in zip(first + second, stream[:PREEMPTED_AFTER] + stream[saved_step:MAX_STEPS]):
        np.testing.assert_array_equal(got, expected, strict=True)
