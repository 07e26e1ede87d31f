"""``Plan.batches(pin_memory=True)``: batches gathered into page-locked buffers, registered with the CUDA runtime.

Without a GPU, against a stand-in for the runtime (tests/fakes/fake_cudart.c, built here with the C compiler and
named by ``NPYFEED_CUDA_RUNTIME``): the batches equal the numpy oracle and the unpinned ones, every buffer is
registered once on pages of its own for the device asked (the caller's current device untouched) and
unregistered before it is unmapped, for both streams (shuffle True and "blocks"); a refused registration and a
missing runtime raise RuntimeError with the runtime's message. On a machine with CUDA and PyTorch,
tests/test_torch.py checks ``WindowDataset(device="cuda")`` against numpy on the GPU itself.
"""

from __future__ import annotations

import ctypes
import gc
import shutil
import subprocess
from pathlib import Path

import npyfeed
import numpy as np
import pytest
from windows_data import THREADS, open_source, reference

FAKE_SOURCE = Path(__file__).parent / "fakes" / "fake_cudart.c"


@pytest.fixture(scope="module")
def fake_runtime(tmp_path_factory):
    """(path of the built fake libcudart, ctypes handle on the same loaded library)."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler to build the fake CUDA runtime")
    path = tmp_path_factory.mktemp("fake-cudart") / "libcudart-fake.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-pthread", "-o", str(path), str(FAKE_SOURCE)], check=True)
    return str(path), ctypes.CDLL(str(path))


def counts(lib) -> dict:
    out = (ctypes.c_int * 5)()
    lib.fake_counts(out)
    return dict(zip(("live", "registers", "unregisters", "errors", "device"), out))


@pytest.fixture
def runtime(fake_runtime, monkeypatch):
    path, lib = fake_runtime
    monkeypatch.setenv("NPYFEED_CUDA_RUNTIME", path)
    lib.fake_fail_with(0)
    lib.fake_fail_set_device(0)
    gc.collect()
    assert counts(lib)["live"] == 0, "a previous test left buffers registered"
    return lib


@pytest.mark.parametrize("shuffle", [True, "blocks"])
def test_pinned_batches_equal_numpy_every_buffer_registered_once_and_undone(small, runtime, shuffle):
    src = open_source(small, "mmap")
    plan = src.plan(3, shuffle=shuffle, seed=3, memory_budget=4096)  # 20 batches an epoch
    before = counts(runtime)["registers"]
    for epoch in (0, 1):
        order = plan.order(epoch)
        with plan.batches(epoch, pin_memory=True, pin_memory_device=2) as pinned, plan.batches(epoch) as plain:
            for b, ((x, y), (px, py)) in enumerate(zip(pinned, plain)):
                ids = order[b * 3:(b + 1) * 3]
                ex, ey = reference(small, [small.entries[i] for i in ids], "float32")
                np.testing.assert_array_equal(x, ex)
                np.testing.assert_array_equal(y, ey)
                np.testing.assert_array_equal(x, px)
                np.testing.assert_array_equal(y, py)
                assert x.ctypes.data % 64 == 0
            c = counts(runtime)
            assert c["live"] >= 2 and c["device"] == 2 and c["errors"] == 0
        del x, y, px, py
        gc.collect()
        c = counts(runtime)
        assert c["live"] == 0, c  # the stream and its batches gone: every registration undone
    assert c["errors"] == 0, c  # each on pages of its own, portable, unregistered while still mapped
    registered = c["registers"] - before
    # Buffers are recycled registered: each epoch's stream registers those in flight and held (x and y of
    # prefetch + 3 batches at most), not one per batch (2 epochs x 20 batches x 2 arrays = 80).
    assert 4 <= registered <= 2 * 2 * (plan.prefetch + 3), registered


def test_pinned_batches_kept_by_the_caller_stay_registered_until_let_go(small, runtime):
    src = open_source(small, "read")
    plan = src.plan(10, shuffle=True, seed=1)
    with plan.batches(0, pin_memory=True, pin_memory_device=0) as it:
        kept = [next(it) for _ in range(3)]
    gc.collect()
    assert counts(runtime)["live"] == 6  # x and y of the three batches still held
    order = plan.order(0)
    for b, (x, y) in enumerate(kept):
        ex, ey = reference(small, [small.entries[i] for i in order[b * 10:(b + 1) * 10]], "float32")
        np.testing.assert_array_equal(x, ex)
        np.testing.assert_array_equal(y, ey)
    del kept, x, y
    gc.collect()
    assert counts(runtime)["live"] == 0


def test_refused_registration_raises_with_the_runtime_message(small, runtime):
    src = open_source(small, "mmap")
    runtime.fake_fail_with(2)
    with pytest.raises(RuntimeError, match=r"cudaHostRegister.*out of memory"):
        with src.plan(5).batches(0, pin_memory=True) as it:
            next(it)
    runtime.fake_fail_with(0)
    with src.plan(5).batches(0, pin_memory=True) as it:  # the next stream works
        x, _ = next(it)
    ex, _ = reference(small, small.entries[:5], "float32")
    np.testing.assert_array_equal(x, ex)


def test_a_device_that_cannot_be_made_current_is_refused_when_the_stream_is_made(small, runtime):
    src = open_source(small, "mmap")
    runtime.fake_fail_set_device(35)
    with pytest.raises(RuntimeError, match="cannot make CUDA device 1 current: CUDA driver version is insufficient"):
        src.plan(5).batches(0, pin_memory=True, pin_memory_device=1)
    runtime.fake_fail_set_device(0)


def test_missing_runtime_raises_naming_it(small, monkeypatch):
    monkeypatch.setenv("NPYFEED_CUDA_RUNTIME", "/nonexistent/libcudart.so.99")
    src = open_source(small, "mmap", threads=THREADS)
    with pytest.raises(RuntimeError, match="/nonexistent/libcudart.so.99"):
        src.plan(5).batches(0, pin_memory=True)


def test_pin_memory_arguments(small):
    plan = open_source(small, "mmap").plan(5)
    with pytest.raises(ValueError, match="pin_memory_device"):
        plan.batches(0, pin_memory_device=0)
    with pytest.raises(ValueError, match="pin_memory_device"):
        plan.batches(0, pin_memory=True, pin_memory_device=-1)


def test_tf_dataset_pin_memory_adopts_pinned_buffers(small, runtime):
    """npyfeed.tf.dataset(pin_memory=True): the tensors equal the numpy iterator's batches; take()'s streams
    gathered into registered buffers, all undone once the dataset and its tensors are gone."""
    tf = pytest.importorskip("tensorflow")
    import npyfeed.tf as nftf

    src = open_source(small, "mmap")
    before = counts(runtime)["registers"]
    ds = nftf.dataset(src, 7, shuffle=True, seed=3, pin_memory=True)  # for the first GPU
    got = [(x.numpy(), y.numpy()) for x, y in ds]
    c = counts(runtime)
    assert c["registers"] > before and c["device"] == 0 and c["errors"] == 0, c
    expected = list(src.batches(7, shuffle=True, seed=3))
    assert len(got) == len(expected)
    for (x, y), (ex, ey) in zip(got, expected):
        np.testing.assert_array_equal(x, ex)
        np.testing.assert_array_equal(y, ey)
    del ds, got
    gc.collect()
    c = counts(runtime)
    assert c["live"] == 0 and c["errors"] == 0, c
    with pytest.raises(ValueError, match="gather='host' only"):
        nftf.dataset(src, 7, gather="device", pin_memory=True)
    runtime.fake_fail_set_device(35)  # refused where the pipeline is made, not at its first batch
    with pytest.raises(RuntimeError, match="cannot make CUDA device 2 current"):
        nftf.dataset(src, 7, pin_memory=True, device="/gpu:2")
    runtime.fake_fail_set_device(0)
    assert [nftf._gpu_index(d) for d in (None, "/gpu:1", "/job:localhost/device:GPU:2", "/cpu:0")] == [0, 1, 2, 0]
    assert tf.executing_eagerly()


def test_the_gpu_memory_probe_opens_the_runtime_pin_memory_found(runtime, fake_runtime, monkeypatch):
    """One lookup of the CUDA runtime: npyfeed.tf's probe of a GPU's free memory opens the library the core found
    for pin_memory (NPYFEED_CUDA_RUNTIME here), and none where the core finds none."""
    path, _ = fake_runtime
    assert npyfeed._core.cuda_runtime_library() == path
    pytest.importorskip("tensorflow")
    from npyfeed.tf import _device

    assert _device._cudart()._name == path
    monkeypatch.setenv("NPYFEED_CUDA_RUNTIME", "/nonexistent/libcudart.so.99")
    assert npyfeed._core.cuda_runtime_library() is None and _device._cudart() is None
