"""Live pipeline statistics (npyfeed.stats): counted exactly against known workloads (N batches of B samples read
-> those counts, for every order and both ways of reading a plan; a blocks epoch -> every block and every file's
bytes once), a consumer that sleeps (its wait near zero, the gathers' time reported) against a slow gather (the
consumer's wait reported), plan and source totals, per-epoch differences and the one-line verdict."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import windows_data
from npyfeed import _core
from npyfeed import stats as nfs

KINDS = [False, True, "blocks"]
KIND_IDS = ["in_order", "shuffled", "blocks"]
BATCH = 10


def _open(ds, mode="mmap", **kwargs):
    return windows_data.open_source(ds, mode, **kwargs)


def _nbytes(batches) -> int:
    return sum(x.nbytes + y.nbytes for x, y in batches)


@pytest.mark.parametrize("shuffle", KINDS, ids=KIND_IDS)
def test_an_epoch_is_counted_exactly(ordered, shuffle):
    src = _open(ordered)
    plan = src.plan(BATCH, shuffle=shuffle, seed=3, memory_budget=1000)
    assert plan.stats()["batches"] == 0
    batches = list(plan.batches(0))
    got = plan.stats()
    assert got["batches"] == len(batches) == len(plan) == 11
    assert got["samples"] == len(src) == 103
    assert got["bytes"] == _nbytes(batches)
    assert 0 <= got["ready_batches"] <= got["batches"]
    assert got["gather_seconds"] > 0 and got["elapsed_seconds"] > 0
    assert 0 <= got["wait_seconds"] <= got["elapsed_seconds"]
    assert got["samples_per_second"] == pytest.approx(got["samples"] / got["elapsed_seconds"])
    assert src.stats() == got  # the only plan: the source's totals are its own


def test_take_and_iterators_of_one_plan_add_up_and_plans_add_up_in_the_source(ordered):
    src = _open(ordered)
    plan = src.plan(BATCH, shuffle=True, seed=1)
    taken = [plan.take(4, b) for b in (0, 1, 2, 7)]  # in order, then a jump (a new stream)
    it = plan.batches(5, start_batch=9)
    rest = list(it)
    assert plan.stats()["batches"] == it.stats()["batches"] == 6
    assert plan.stats()["samples"] == 4 * BATCH + BATCH + 3
    assert plan.stats()["bytes"] == _nbytes(taken + rest)
    other = src.plan(7)
    list(other.batches(0))
    assert other.stats()["samples"] == 103
    total, a, b = src.stats(), plan.stats(), other.stats()
    for field in ("batches", "samples", "bytes", "ready_batches", "blocks_read"):
        assert total[field] == a[field] + b[field], field
    assert total["gather_seconds"] == pytest.approx(a["gather_seconds"] + b["gather_seconds"])
    assert total["wait_seconds"] == pytest.approx(a["wait_seconds"] + b["wait_seconds"])


@pytest.mark.parametrize("mode", ["mmap", "direct"])
def test_a_blocks_epoch_reads_each_block_and_each_file_once(ordered, mode):
    src = _open(ordered, mode)
    plan = src.plan(BATCH, shuffle="blocks", seed=2, memory_budget=1000)
    blocks = _core.testing.shard_blocks(plan._core, 0)
    assert len(blocks) > 2
    list(plan.batches(0))
    got = plan.stats()
    # Every factor file of a block is read whole; label files too, except that outside mode "mmap" these small
    # ones were read whole at open already (nothing to read again).
    factor_bytes = sum(a.nbytes for a in ordered.factors.values())
    label_bytes = sum(a.nbytes for a in ordered.labels.values())
    assert got["blocks_read"] == len(blocks)
    assert got["block_bytes_read"] == factor_bytes + (label_bytes if mode == "mmap" else 0)
    assert got["block_read_seconds"] > 0
    assert 0 <= got["block_waits"] <= len(blocks)  # (these reads are too small to be caught in flight)
    assert got["block_hits"] == len(blocks) - got["block_waits"]


def test_arrays_in_memory_are_not_read_again(ordered):
    src = _open(ordered, "arrays")
    plan = src.plan(BATCH, shuffle="blocks", seed=2, memory_budget=1000)
    list(plan.batches(0))
    assert plan.stats()["block_bytes_read"] == 0 and plan.stats()["samples"] == 103


@pytest.fixture(scope="module")
def heavy(tmp_path_factory) -> windows_data.DataSet:
    """Batches that take a gather thread milliseconds: 6 keys of (1500, 256) float32, W=100."""
    rng = np.random.default_rng(3)
    factors = {f"h{k}": rng.standard_normal((1500, 256)).astype(np.float32) for k in range(6)}
    labels = {k: rng.standard_normal((1500, 2)).astype(np.float32) for k in factors}
    entries = [(int(f), int(f), k) for k in factors for f in rng.integers(99, 1500, 200)]
    return windows_data.write_dataset(tmp_path_factory.mktemp("heavy"), factors, labels, entries, 100)


def test_a_slow_consumer_does_not_wait_and_the_gathers_time_is_reported(ordered):
    src = _open(ordered)
    plan = src.plan(BATCH, prefetch=2)
    for _ in plan.batches(0):
        time.sleep(0.05)  # the "model": far slower than a gather of 10 small windows
    got = plan.stats()
    assert got["gather_seconds"] > 0
    assert got["wait_fraction"] < nfs.INPUT_BOUND, got
    assert got["ready_batches"] >= got["batches"] - 1, got  # all but (at most) the first were ready
    assert got["read_ahead"] >= 1, got
    assert nfs.summary(got).startswith("not input-bound"), nfs.summary(got)


@pytest.mark.parametrize("read", ["iterator", "take"])
def test_a_slow_gather_makes_the_consumer_wait(heavy, read):
    src = _open(heavy, threads=1)
    plan = src.plan(128, shuffle=True, seed=0, prefetch=1)
    # The consumer does nothing: it waits for each gather (the iterator, or take() as tf.data's op calls it).
    batches = plan.batches(0) if read == "iterator" else (plan.take(0, b) for b in range(len(plan)))
    for _ in batches:
        pass
    got = plan.stats()
    # (Bounds with room for a busy machine, where the consumer itself waits for a core now and then.)
    assert got["wait_fraction"] > 0.3, got
    # Readiness is judged when a batch is first asked for, not once waited for: the first batch, started by that
    # very request, was never ready (on a busy machine the others may be, the consumer waiting for a core).
    assert got["ready_batches"] < got["batches"], got
    # The gathers' time is reported, of the order of the waits (less the hand-offs between threads, which take
    # milliseconds on a busy machine).
    assert got["gather_seconds"] > 0.1 * got["wait_seconds"], got
    assert nfs.summary(got).startswith("input-bound"), nfs.summary(got)


def test_gather_seconds_counts_cpu_time_not_the_readers_blocked_time(heavy):
    # mode="direct" gathers with 4 blocking readers per thread. Pinned to one CPU, one thread's readers share it:
    # their CPU time can never exceed the time that CPU had, the elapsed time; their time at work (blocked in
    # reads, or waiting for the CPU) adds up to about 4 times it.
    cpu = min(os.sched_getaffinity(0))
    src = _open(heavy, "direct", threads=1, cpus=[cpu])
    plan = src.plan(64, shuffle=True, seed=0)
    list(plan.batches(0))
    got = plan.stats()
    assert 0 < got["gather_seconds"] <= got["elapsed_seconds"], got


def test_a_consumer_waiting_for_a_block_read_is_counted(heavy):
    src = _open(heavy, "direct", threads=1)
    plan = src.plan(64, shuffle="blocks", seed=0, memory_budget=4 << 20)  # a key (1.5 MB) per block
    list(plan.batches(0))
    got = plan.stats()
    assert got["blocks_read"] == len(_core.testing.shard_blocks(plan._core, 0)) == 6
    # The first block's read starts when the first batch is asked for: several MB take longer than the asking.
    assert got["block_waits"] >= 1, got
    assert "blocks read, waited for" in nfs.summary(got)


def test_the_dict_and_the_summary_follow_from_the_counters():
    raw = dict(batches=4, samples=100, bytes=4000, wait_ns=300_000_000, elapsed_ns=1_000_000_000,
               gather_ns=2_500_000_000, ready_batches=1, read_ahead_sum=6, blocks_read=2, block_bytes_read=512,
               block_read_ns=50_000_000, block_waits=1, device_bytes=7)
    got = nfs.as_dict(raw)
    assert list(got) == list(nfs.FIELDS)
    assert got["samples_per_second"] == 100.0
    assert got["wait_fraction"] == pytest.approx(0.3)
    assert got["gather_seconds"] == pytest.approx(2.5)
    assert got["read_ahead"] == 1.5
    assert got["block_read_seconds"] == pytest.approx(0.05)
    assert got["block_hits"] == 1
    line = nfs.summary(got)
    assert line.startswith("input-bound: the consumer waited 30% of its time") and "2 blocks read" in line
    raw.update(wait_ns=50_000_000)
    assert nfs.summary(nfs.as_dict(raw)).startswith("not input-bound: the consumer waited 5%")
    assert nfs.summary(nfs.as_dict(dict.fromkeys(raw, 0))) == "no batches yet"


def test_the_logger_counts_each_epoch_apart(ordered):
    src = _open(ordered)
    plan = src.plan(BATCH)
    logger = nfs.StatsLogger(plan)
    per_epoch = []
    for epoch in range(3):
        logger.epoch_begin()
        batches = list(plan.batches(epoch))
        got = logger.epoch_end()
        per_epoch.append(got)
        assert got["batches"] == len(plan) and got["samples"] == 103 and got["bytes"] == _nbytes(batches)
    assert sum(e["gather_seconds"] for e in per_epoch) == pytest.approx(plan.stats()["gather_seconds"])


def test_statistics_are_found_on_each_kind_of_object(ordered):
    src = _open(ordered)
    plan = src.plan(BATCH)
    it = plan.batches(0)
    next(it)
    for obj in (src, plan, it):
        assert nfs.raw_counts_of(obj)()["batches"] == 1
    with pytest.raises(TypeError, match="cannot find npyfeed statistics in int"):
        nfs.raw_counts_of(3)


def _spin(seconds: float) -> None:
    """Uses `seconds` of this thread's CPU (a model's step that needs the CPU, not one that sleeps)."""
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        pass


@pytest.mark.skipif(nfs.thread_times() is None, reason="the kernel reports no per-thread scheduler statistics")
def test_the_logger_says_when_the_main_thread_waited_for_a_core_held_by_the_workers(heavy):
    cpu = min(os.sched_getaffinity(0))
    src = _open(heavy, threads=2, cpus=[cpu])  # two workers on one CPU (a pool of their own)
    logger = nfs.StatsLogger(src)
    assert logger.cpu is None
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})  # this thread only: the main thread shares the workers' CPU
    try:
        start, used = time.monotonic(), time.thread_time()
        logger.epoch_begin()
        for _ in src.batches(64, shuffle=True, seed=0):
            _spin(0.002)
        logger.epoch_end()
        seconds, used = time.monotonic() - start, time.thread_time() - used
    finally:
        os.sched_setaffinity(0, mine)
    share = logger.cpu
    # The main thread's CPU is its own CPU time; the workers ran; the main thread, ready to run, waited for the
    # CPU the two workers held (about 40% of the time on an idle machine; more on a busy one).
    assert share["main_cores"] * seconds == pytest.approx(used, rel=0.25), (share, used, seconds)
    assert share["npyfeed_cores"] > 0.05, share
    assert nfs.CPU_WAIT < share["main_cpu_wait"] <= 1, share
    assert "the cores are shared" in nfs.cpu_summary(share)


def test_the_cpu_share_follows_from_the_thread_times():
    ms = 1_000_000
    before = {1: ("main", 100 * ms, 10 * ms), 2: ("npyfeed", 50 * ms, 0), 3: ("other", 10 * ms, 5 * ms),
              4: ("npyfeed", 70 * ms, 0)}  # thread 4 ends before the second reading
    after = {1: ("main", 400 * ms, 210 * ms), 2: ("npyfeed", 850 * ms, 90 * ms), 3: ("other", 110 * ms, 5 * ms),
             5: ("npyfeed", 200 * ms, 1 * ms)}  # thread 5 started after the first
    share = nfs.cpu_share(before, after, 2.0)
    assert share == pytest.approx({"main_cores": 0.15, "npyfeed_cores": 0.5, "other_cores": 0.05,
                                   "main_cpu_wait": 0.1})
    assert "(the cores are shared" in nfs.cpu_summary(share)
    assert nfs.cpu_summary(share).startswith("the main thread used 0.15 of a core and waited 10% of the time")
    # Under CPU_WAIT, or no worker ran: nothing to blame on npyfeed's workers.
    assert "shared" not in nfs.cpu_summary(dict(share, main_cpu_wait=nfs.CPU_WAIT / 2))
    assert "shared" not in nfs.cpu_summary(dict(share, npyfeed_cores=0.0))
    # A consumer that waited longer for batches than for a core is held up by the input, not by the cores.
    assert "shared" in nfs.cpu_summary(share, wait_fraction=0.05)
    assert "shared" not in nfs.cpu_summary(share, wait_fraction=0.5)
