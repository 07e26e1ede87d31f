"""The main job (`npyfeed demo`) at a tiny size: it must run end to end and print its comparison."""

from __future__ import annotations

import os
import subprocess
import sys

import npyfeed
import numpy as np
import pytest
from npyfeed.demo import generate

TINY = ["--keys", "3", "--rows", "300", "--features", "8", "--labels", "2", "--window", "10",
        "--batch-size", "16", "--stride", "3", "--measure-batches", "2"]


def run_demo(*extra, timeout=300):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, "-m", "npyfeed", "demo", *TINY, *extra], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_generated_data_set_matches_the_users_layout(tmp_path):
    factor_dir, label_dir, index_path = generate(str(tmp_path), keys=2, rows=50, features=4, labels=2, window=5,
                                                 stride=7)
    assert factor_dir == os.path.join(str(tmp_path), "demo_stock", "train", "factor")
    with open(index_path) as f:
        lines = f.read().split()
    src = npyfeed.WindowSource(index_path, factor_dir, label_dir, 5)
    assert len(src) == len(lines) == 2 * len(range(4, 50, 7))
    fi, li, key = lines[-1].split(",")
    x, y = src.get([len(lines) - 1])
    factor = np.load(os.path.join(factor_dir, key + ".npy"))
    label = np.load(os.path.join(label_dir, key + ".npy"))
    assert np.array_equal(x[0], factor[int(fi) - 4: int(fi) + 1])
    assert np.array_equal(y[0], label[int(li)])


def test_demo_without_tensorflow_prints_the_comparison(tmp_path):
    proc = run_demo("--no-train", "--dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for row in ("load: np.load loop (users' code)", "load: npyfeed.load_factor_files mode=read",
                "open: npyfeed.WindowSource mode=mmap", "batches: npyfeed WindowSource.batches"):
        assert row in out
    assert "x the samples/s of preloaded dict + per-sample numpy slicing" in out
    # --dir keeps the data set where the user asked for it.
    assert os.path.isfile(os.path.join(str(tmp_path), "demo_stock", "train", "index.txt"))


def test_demo_trains_a_keras_model_fed_by_npyfeed():
    pytest.importorskip("tensorflow")
    proc = run_demo("--steps", "4")
    assert proc.returncode == 0, proc.stderr
    assert "batches: npyfeed.tf.dataset (tf.data)" in proc.stdout
    assert "batches: users' tf.numpy_function per sample (tf.data)" in proc.stdout
    assert "Keras model trained 4 steps on npyfeed batches" in proc.stdout


def test_demo_refuses_impossible_sizes():
    proc = subprocess.run([sys.executable, "-m", "npyfeed", "demo", "--rows", "5", "--window", "10"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--rows" in proc.stderr
