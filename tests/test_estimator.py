"""The users' code shape on the oldest supported stack: a ``tf.estimator.Estimator`` whose ``input_fn`` returns
``npyfeed.tf.dataset(...)`` over files in the users' layout.

``tf.estimator`` exists up to TensorFlow 2.15 (with ``tensorflow-estimator``); the test is skipped where it does
not (TensorFlow >= 2.16). ``.ci/run`` runs it in its floor environment (TensorFlow 2.15, numpy 1.26).

The Estimator trains a linear model for one pass (graph mode, ``tf.compat.v1`` sessions, ``from_generator`` in a
graph), which must lower its evaluation loss, and predicts with an identity head, whose outputs must equal numpy
slicing of the files, sample by sample, in index order.
"""

from __future__ import annotations

import importlib.util

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
