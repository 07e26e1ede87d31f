#!/usr/bin/env python3
"""Host-to-device overlap: does ``npyfeed.tf.dataset(..., device="/gpu:0")`` copy the next batch while the GPU
computes on this one?

``device=`` ends the pipeline with ``tf.data.experimental.prefetch_to_device``; TensorFlow's docs and
tensorflow#43905 say that a host-to-device copy overlaps compute only from pinned (page-locked) host memory, and
npyfeed's batch buffers are ordinary (64-byte-aligned) pages. This measures it, in one run, on one generated data
set in the users' layout (W=100, B=256, F=256, float32), reading each measurement by ``next(iterator)`` inside a
``tf.function`` as Keras ``fit`` does. Three feeds:

  npyfeed   ``npyfeed.tf.dataset(src, B, shuffle=True, device=...)``: the gather on the host, then the copy
            (``prefetch_to_device``)
  device    ``npyfeed.tf.dataset(src, B, shuffle=True, gather="device", device=...)``: the arrays uploaded once,
            each step's host part only start rows (4 x B int64), the batch formed on the device by one gather
  streamed  the same with ``shuffle="blocks"`` and a device budget under the arrays' size: each block (an eighth
            of the data) uploaded once per epoch, the next while the current one is consumed (host -> device
            bytes per step: the start rows and what a whole epoch uploads, over its steps)
  ready     a ``numpy_function`` that returns the same ready, aligned batch every time: the copy alone (and
            TensorFlow's own work per element), nothing gathered

and for each:

  feed      the feed alone: each batch arrives on the device and is reduced there
  compute   a step of K chained (B*W, F) x (F, F) matmuls on a batch already on the device (no input at all)
  both      the feed into that same step
  overlap   (feed + compute - both) / min(feed, compute): 1 = feeding hides behind compute, 0 = they take turns;
            for "ready", whether the copy itself overlaps compute; for npyfeed, whether the whole feed does

K is calibrated first (steps of 1 and 17 matmuls) so that compute takes about as long as npyfeed's feed (where
overlap matters most). Beside them, the limits: a plain copy of one batch host -> device (``tf.identity`` under
``tf.device``, from a tensor in ordinary host memory), and the numpy iterator over the same source (the host side
alone); ``x copy`` = samples/s against the copy's.

Without a GPU it says so and exits 0; ``--device /cpu:0`` runs every step on the CPU instead (a smoke run of the
script: those numbers mean nothing).
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import npyfeed  # noqa: E402

MAX_MATMULS = 4096  # a bound on K, whatever the calibration says


def parse_args(argv=None):
    p = common.gpu_parser(__doc__, "device to feed (default: the first GPU; /cpu:0 for a smoke run)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.quick:
        args.files, args.rows, args.cols, args.window, args.batch, args.steps, args.repeats = 8, 400, 32, 20, 32, 20, 1
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import npyfeed.tf as nftf  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415 (only this benchmark needs it)

    device = args.device
    if device is None:
        gpus = tf.config.list_logical_devices("GPU")
        if not gpus:
            print("bench_gpu: no GPU visible to TensorFlow: nothing to measure (--device /cpu:0 for a smoke run)")
            return 0
        device = gpus[0].name
    threads = common.resolve_threads(args.threads)
    ds, src = common.gpu_source(args, threads)
    batch_bytes = args.batch * args.window * args.cols * 4
    data_bytes = sum(os.path.getsize(p) for p in ds.factor_paths + ds.label_paths)
    per_epoch = len(src) // args.batch
    if per_epoch < 2 * args.steps + 20:
        raise SystemExit(f"{per_epoch} batches per epoch: too few for {args.steps} steps; add --files")

    rows, cols = args.batch * args.window, args.cols
    with tf.device(device):
        weight = tf.Variable(tf.random.stateless_normal((cols, cols), seed=(1, 2)) / np.sqrt(cols))
        resident = tf.Variable(tf.random.stateless_normal((args.batch, args.window, cols), seed=(3, 4)))

    def compute(x, k):
        h = tf.reshape(x, (rows, cols))
        for _ in tf.range(k):
            h = tf.tanh(tf.matmul(h, weight))
        return tf.reduce_sum(h)

    @tf.function
    def fed(iterator, steps, k):
        total = tf.constant(0.0)
        with tf.device(device):
            for _ in tf.range(steps):
                x, _y = next(iterator)
                total += compute(x, k) if k > 0 else tf.reduce_sum(x)
        return total

    @tf.function
    def alone(steps, k):
        total = tf.constant(0.0)
        with tf.device(device):
            for i in tf.range(steps):  # the input depends on the step: nothing to hoist out of the loop
                total += compute(resident + tf.cast(i, tf.float32) * 1e-6, k)
        return total

    def timed(fn, *a) -> float:
        t0 = time.perf_counter()
        fn(*a).numpy()  # the value waits for the device to finish
        return time.perf_counter() - t0

    ready_x = common.aligned_float32((args.batch, args.window, cols))
    ready_y = common.aligned_float32((args.batch, *src.y_shape))
    ready_x[...] = 1.0

    def ready_dataset(_seed):
        ds = tf.data.Dataset.range(2**62).map(
            lambda b: tuple(tf.numpy_function(lambda _: (ready_x, ready_y), [b], (tf.float32, tf.float32),
                                              stateful=False)))
        return ds.prefetch(2).apply(tf.data.experimental.prefetch_to_device(device))

    feeds = {"npyfeed": lambda seed: nftf.dataset(src, args.batch, shuffle=True, seed=seed, device=device),
             "device": lambda seed: nftf.dataset(src, args.batch, shuffle=True, seed=seed, gather="device",
                                                 device=device),
             # Under the arrays' size on the device: blocks of an eighth of the data, each uploaded once per epoch
             # (two held, and the batches).
             "streamed": lambda seed: nftf.dataset(src, args.batch, shuffle="blocks", seed=seed,
                                                   memory_budget=data_bytes // 4, gather="device", device=device,
                                                   device_memory_budget=streamed_budget),
             "ready": ready_dataset}
    y_bytes = args.batch * int(np.prod(src.y_shape, dtype=np.int64)) * 4
    streamed_budget = int(1.1 * (data_bytes // 4 + 5 * (batch_bytes + y_bytes)))
    h2d_bytes = {"npyfeed": batch_bytes + y_bytes, "ready": batch_bytes + y_bytes}
    cpu_per_step: dict = {}  # host CPU seconds per step (this process, every thread), at the best repeat

    def feed_seconds(name: str, k: int) -> float:
        best = float("inf")
        for r in range(args.repeats):
            ds = feeds[name](r)
            it = iter(ds)
            fed(it, tf.constant(10), tf.constant(k)).numpy()  # start-up (first gathers, trace) outside the time
            cpu0 = time.process_time()
            seconds = timed(fed, it, tf.constant(args.steps), tf.constant(k)) / args.steps
            if seconds < best:
                best = seconds
                cpu_per_step[(name, k)] = (time.process_time() - cpu0) / args.steps
            if name == "device":
                h2d_bytes["device"] = npyfeed.tf._pipeline.pipeline_of(ds).device.host_bytes_per_step
            if name == "streamed":  # the start rows, and what a whole epoch uploads over its steps
                on_device = npyfeed.tf._pipeline.pipeline_of(ds).device
                assert on_device.streams, "the streamed feed must be over its device budget"
                h2d_bytes["streamed"] = on_device.host_bytes_per_step + npyfeed._core.testing.streamed_epoch_bytes(on_device.host_rows, r) / per_epoch
            del it, ds
        return best

    def compute_seconds(k: int) -> float:
        alone(tf.constant(2), tf.constant(k)).numpy()
        return min(timed(alone, tf.constant(args.steps), tf.constant(k)) / args.steps for _ in range(args.repeats))

    def h2d_seconds() -> float:
        best = float("inf")
        with tf.device("/cpu:0"):  # ordinary (pageable) host memory, as npyfeed's batches are
            host = tf.constant(np.random.default_rng(0).random((args.batch, args.window, cols), np.float32))
        for _ in range(max(3, args.repeats)):
            t0 = time.perf_counter()
            with tf.device(device):
                tf.reduce_sum(tf.identity(host)).numpy()
            best = min(best, time.perf_counter() - t0)
        return best

    def numpy_seconds() -> float:
        it = src.batches(args.batch, shuffle=True, seed=0)
        try:
            next(it)
            t0 = time.perf_counter()
            for _ in range(args.steps):
                next(it)
            return (time.perf_counter() - t0) / args.steps
        finally:
            it.close()

    feed = {name: feed_seconds(name, 0) for name in feeds}
    one, seventeen = compute_seconds(1), compute_seconds(17)
    if seventeen > 1.2 * one:
        per_matmul = (seventeen - one) / 16
        k = round((feed["npyfeed"] - (one - per_matmul)) / per_matmul)  # a step: (one - per_matmul) + k*per_matmul
        k = min(max(k, 1), MAX_MATMULS)
    else:
        k = 16
        print(f"bench_gpu: 17 matmuls took {seventeen * 1e3:.3f} ms a step, 1 took {one * 1e3:.3f} ms: too close to "
              f"calibrate, K = {k}")
    comp = compute_seconds(k)
    both = {name: feed_seconds(name, k) for name in feeds}
    overlap = {name: (feed[name] + comp - both[name]) / min(feed[name], comp) for name in feeds}
    h2d = h2d_seconds()
    host = numpy_seconds()

    def row(label, seconds, samples=True, feed_name=None, matmuls=0):
        rate = f"{args.batch / seconds:,.0f}" if samples else "-"
        cpu = cpu_per_step.get((feed_name, matmuls))
        return [label, f"{seconds * 1e3:.2f}", rate, f"{h2d / seconds:.2f}x" if samples else "-",
                f"{comp / seconds:.2f}x" if samples else "-", "-" if cpu is None else f"{cpu * 1e3:.2f}",
                f"{h2d_bytes[feed_name] / 1e3:,.1f}" if feed_name in h2d_bytes else "-"]

    rows_out = [
        row("numpy iterator (the host side alone)", host),
        row(f"host -> device copy of one batch ({batch_bytes / 1e6:.1f} MB, unpinned): "
            f"{batch_bytes / h2d / 1e9:.1f} GB/s", h2d),
        row("feed npyfeed: npyfeed.tf.dataset(device=...)", feed["npyfeed"], feed_name="npyfeed"),
        row("feed device: npyfeed.tf.dataset(gather='device')", feed["device"], feed_name="device"),
        row("feed streamed: gather='device', shuffle='blocks' over the device budget", feed["streamed"],
            feed_name="streamed"),
        row("feed ready: a ready batch, copied", feed["ready"], feed_name="ready"),
        row(f"compute: {k} matmul(s) on a resident batch (the limit)", comp, samples=False),
        row("both: npyfeed into that compute", both["npyfeed"], feed_name="npyfeed", matmuls=k),
        row("both: device into that compute", both["device"], feed_name="device", matmuls=k),
        row("both: streamed into that compute", both["streamed"], feed_name="streamed", matmuls=k),
        row("both: ready into that compute", both["ready"], feed_name="ready", matmuls=k),
    ]
    print(f"npyfeed {npyfeed.__version__} bench_gpu on {device}: {args.files} files x ({args.rows}, {args.cols}) "
          f"{args.dtype}, W={args.window}, B={args.batch}, {args.steps} steps, best of {args.repeats}, "
          f"threads={threads}, load {common.load_average()}")
    print(common.format_table(("measurement", "ms/step", "samples/s", "x copy", "x compute", "host CPU ms/step",
                               "host->device kB/step"), rows_out, align="lrrrrrr"))
    for name in feeds:
        print(f"overlap {name:7s} (feed + compute - both) / min(feed, compute) = {overlap[name]:.2f}  (1: feeding "
              "hides behind compute; 0: they take turns)")
    if args.quick:
        print("(--quick: tiny sizes, one round; these numbers mean nothing)")
    if args.json:
        common.write_json(args.json, {
            "bench": "bench_gpu", "config": vars(args), "device": device, "machine": common.machine_info(),
            "matmuls": k, "batch_bytes": batch_bytes, "overlap": overlap, "host_to_device_bytes_per_step": h2d_bytes,
            "host_cpu_seconds_per_step": {f"{n}_{m}": v for (n, m), v in cpu_per_step.items()},
            "seconds_per_step": {"numpy": host, "h2d": h2d, "compute": comp,
                                 **{f"feed_{n}": v for n, v in feed.items()},
                                 **{f"both_{n}": v for n, v in both.items()}}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
