#!/usr/bin/env python3
"""Feeding a GPU: how fast npyfeed's batches reach the device, and whether the next batch's way there hides behind
the GPU's compute on this one, asked through TensorFlow (``--framework tf``, the default) or PyTorch (``--framework
torch``: the same hardware questions where no TensorFlow build for the GPU can be installed).

One generated data set in the users' layout (W=100, B=256, F=256, float32); each measurement runs ``--steps``
steps and waits for the device at the end. For each of the framework's feeds (below): ``feed`` (the feed alone,
each batch reduced on the device), ``compute`` (a step of K chained (B*W, F) x (F, F) matmuls with tanh on a batch
already on the device), ``both`` (the feed into that step) and ``overlap`` = (feed + compute - both) / min(feed,
compute): 1 = feeding hides behind compute, 0 = they take turns. K is calibrated first (steps of 1 and 17
matmuls) so that compute takes about as long as the plain feed (npyfeed, pageable), where overlap matters most.
Beside them, the limits: one batch copied host -> device (``x copy``: samples/s against the copy from ordinary
memory) and the numpy iterator over the same source (the host side alone); per feed, the host CPU time (this
process, every thread) and the host -> device bytes per step.

tf: each feed read by ``next(iterator)`` inside a ``tf.function``, as Keras ``fit`` does. ``device=`` ends the
pipeline with ``tf.data.experimental.prefetch_to_device``; TensorFlow's docs and tensorflow#43905 say that a copy
overlaps compute only from pinned (page-locked) host memory, and npyfeed's batch buffers are ordinary pages. The
copy limit: ``tf.identity`` under ``tf.device``, from a tensor in ordinary host memory.

  npyfeed   ``npyfeed.tf.dataset(src, B, shuffle=True, device=...)``: the gather on the host, then the copy
  device    the same with ``gather="device"``: the arrays uploaded once, each step's host part only start rows
            (4 x B int64), the batch formed on the device by one gather
  streamed  the same with ``shuffle="blocks"`` and a device budget under the arrays' size: each block (an eighth
            of the data) uploaded once per epoch, the next while the current one is consumed (bytes per step: the
            start rows and what the epoch uploads, over its steps)
  ready     a ``numpy_function`` returning the same ready, aligned batch every time: the copy alone (and
            TensorFlow's own work per element), nothing gathered

torch: ``npyfeed.torch.WindowDataset``. Before timing, each feed's first batches are checked against the host
batches of the same plan, element for element (the device feed's too: its gather is the one under test). The copy
limits: from ordinary and from page-locked memory.

  pageable  npyfeed's batches (ordinary pages) copied on a copy stream of their own (``.to(device,
            non_blocking=True)``), the compute stream waiting on each copy: a prefetcher as PyTorch users write one
  staged    the same batches copied first into one of two page-locked staging buffers (what ``DataLoader(...,
            pin_memory=True)`` does), then to the GPU asynchronously: one host copy more, a faster DMA
  pinned    ``WindowDataset(..., device=...)``: the batches gathered into page-locked buffers of npyfeed's
            (``Plan.batches(pin_memory=True)``), copied on a stream of its own, no host copy
  device    ``WindowDataset(..., gather="device", device=...)``: the arrays uploaded once; each step's host part
            only the start rows (4 x B int64), the batch formed on the GPU by one gather of factor rows and one of
            label rows
  ready     one ready batch in ordinary memory, copied every step: the copy alone, nothing gathered

Without a GPU it says so and exits 0; ``--device /cpu:0`` (tf) or ``--device cpu`` (torch) runs every step on the
CPU instead (a smoke run of the script: those numbers mean nothing).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import npyfeed  # noqa: E402

MAX_MATMULS = 4096  # a bound on K, whatever the calibration says
START_STEPS = 10  # steps of each feed before its time starts: first gathers, tracing, the allocator
TORCH_FEEDS = ("pageable", "staged", "pinned", "device", "ready")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_data_args(p, files=120, rows=4800, cols=256, dtype="float32")
    g = p.add_argument_group("gpu")
    g.add_argument("--framework", choices=("tf", "torch"), default="tf", help="who feeds the device (default tf)")
    g.add_argument("--device", default=None,
                   help="device to feed (default: the first GPU; a smoke run on the CPU: /cpu:0 for tf, cpu for torch)")
    g.add_argument("--window", type=int, default=100, help="window W (default 100)")
    g.add_argument("--batch", type=int, default=256, help="batch size B (default 256)")
    g.add_argument("--steps", type=int, default=200, help="steps per measurement (default 200)")
    args = p.parse_args(argv)
    if args.quick:
        args.files, args.rows, args.cols, args.window, args.batch, args.steps, args.repeats = 8, 400, 32, 20, 32, 20, 1
    return args


def first_gpu(framework: str) -> str | None:
    """The framework's first GPU, or None."""
    if framework == "tf":
        import tensorflow as tf  # noqa: PLC0415 (only this benchmark needs it)

        gpus = tf.config.list_logical_devices("GPU")
        return gpus[0].name if gpus else None
    import torch  # noqa: PLC0415

    return "cuda:0" if torch.cuda.is_available() else None


def open_source(args, threads: int) -> tuple:
    """(the data set, made or reused and warmed, a mapped WindowSource over it with `threads` threads)."""
    spec = common.DataSpec(files=args.files, rows=args.rows, cols=args.cols, dtype=args.dtype, stocks=1,
                           window=args.window)
    ds = common.make_dataset(args.dir, spec)
    common.warm(ds.factor_paths + ds.label_paths)
    src = npyfeed.WindowSource(ds.index_paths[0], str(ds.factor_dir("S000")), str(ds.label_dir("S000")),
                               args.window, mode="mmap", threads=threads)
    return ds, src


class Feeds:
    """A framework's half of the benchmark, on one device: FEEDS (in the table's order), `reference` (the feed K is
    calibrated against), `labels` (each feed's table row), `copies` (JSON key -> (row label, one batch copied host ->
    device, waiting for the device), the first from ordinary memory), `h2d_bytes` (host -> device bytes per step, by
    feed), `where` (the device, for the heading), `bench` (the JSON's name), and:

    ``feed(name, repeat)``: a context for one measurement of a new feed `name` (its order drawn from `repeat`) that
    yields ``run(steps, k)``: that many steps of it, each into K matmuls (k = 0: reduced), then waits for the device;
    ``compute(steps, k)``: that many steps of K matmuls on a resident batch, then waits for the device."""

    def check(self) -> int | None:
        """Batches checked against the host's before timing (None: not here)."""
        return None

    def sync(self) -> None:
        """Waits for the device (TensorFlow's calls return once it is done)."""

    def json_extra(self, gb_per_s: dict) -> dict:
        return {}


class TfFeeds(Feeds):
    """TensorFlow's half (the module's docstring says what each feed is)."""

    bench, reference, copy_column = "bench_gpu", "npyfeed", "x copy"
    FEEDS = ("npyfeed", "device", "streamed", "ready")
    labels = {"npyfeed": "feed npyfeed: npyfeed.tf.dataset(device=...)",
              "device": "feed device: npyfeed.tf.dataset(gather='device')",
              "streamed": "feed streamed: gather='device', shuffle='blocks' over the device budget",
              "ready": "feed ready: a ready batch, copied"}

    def __init__(self, args, device: str, src, plan, ds):
        import npyfeed.tf as nftf  # noqa: PLC0415
        import tensorflow as tf  # noqa: PLC0415

        self.tf, self.nftf, self.where = tf, nftf, device
        b, w, f = args.batch, args.window, args.cols
        x_bytes, y_bytes = b * w * f * 4, b * int(np.prod(src.y_shape, dtype=np.int64)) * 4
        self.h2d_bytes = {"npyfeed": x_bytes + y_bytes, "ready": x_bytes + y_bytes}
        self.h2d_bytes["device"] = 4 * 8 * b  # gather="device": the start rows, four int64 per sample
        with tf.device(device):
            weight = tf.Variable(tf.random.stateless_normal((f, f), seed=(1, 2)) / np.sqrt(f))
            resident = tf.Variable(tf.random.stateless_normal((b, w, f), seed=(3, 4)))

        def compute(x, k):
            h = tf.reshape(x, (b * w, f))
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

        self._fed, self._alone = fed, alone
        ready_x, ready_y = common.aligned_float32((b, w, f)), common.aligned_float32((b, *src.y_shape))
        ready_x[...] = 1.0

        def ready(_seed):
            ds = tf.data.Dataset.range(2**62).map(
                lambda i: tuple(tf.numpy_function(lambda _: (ready_x, ready_y), [i], (tf.float32, tf.float32),
                                                  stateful=False)))
            return ds.prefetch(2).apply(tf.data.experimental.prefetch_to_device(device))

        data_bytes = sum(os.path.getsize(p) for p in ds.factor_paths + ds.label_paths)
        # Under the arrays' size on the device: blocks of an eighth of the data, each uploaded once per epoch (two
        # held, and the batches).
        streamed_budget = int(1.1 * (data_bytes // 4 + 5 * (x_bytes + y_bytes)))
        self._datasets = {
            "npyfeed": lambda seed: nftf.dataset(src, b, shuffle=True, seed=seed, device=device),
            "device": lambda seed: nftf.dataset(src, b, shuffle=True, seed=seed, gather="device", device=device),
            "streamed": lambda seed: nftf.dataset(src, b, shuffle="blocks", seed=seed, memory_budget=data_bytes // 4,
                                                  gather="device", device=device,
                                                  device_memory_budget=streamed_budget),
            "ready": ready}
        with tf.device("/cpu:0"):  # ordinary (pageable) host memory, as npyfeed's batches are
            host = tf.constant(np.random.default_rng(0).random((b, w, f), np.float32))

        def copy():
            with tf.device(device):
                tf.reduce_sum(tf.identity(host)).numpy()

        self.copies = {"h2d": ("host -> device copy of one batch ({mb:.1f} MB, unpinned): {gbs:.1f} GB/s", copy)}

    @contextlib.contextmanager
    def feed(self, name: str, repeat: int):
        tf, ds = self.tf, self._datasets[name](repeat)
        if name == "streamed" and name not in self.h2d_bytes:  # the start rows and what an epoch uploads, per step
            for _ in ds:  # epoch 0, before the timed ones (the arrays, were they resident, would be uploaded here)
                pass
            before, steps = ds.stats()["device_bytes"], sum(1 for _ in ds)  # epoch 1, counted by its statistics
            uploaded = ds.stats()["device_bytes"] - before
            assert uploaded > 0, "the streamed feed must be over its device budget"
            self.h2d_bytes[name] = self.h2d_bytes["device"] + uploaded / steps
        it = iter(ds)
        yield lambda steps, k: self._fed(it, tf.constant(steps), tf.constant(k)).numpy()

    def compute(self, steps: int, k: int) -> None:
        self._alone(self.tf.constant(steps), self.tf.constant(k)).numpy()  # the value waits for the device


class TorchFeeds(Feeds):
    """PyTorch's half: each feed an iterator of (x, y) on the device (the epoch: `repeat`), its copies on a stream
    of their own, handed to the compute stream."""

    bench, reference, copy_column = "bench_gpu_torch", "pageable", "x pageable copy"
    FEEDS = TORCH_FEEDS
    labels = {name: f"feed {name}" for name in TORCH_FEEDS}

    def __init__(self, args, device: str, src, plan, _ds):
        import npyfeed.torch as nft  # noqa: PLC0415
        import torch  # noqa: PLC0415
        self.torch, self.src, self.plan, self.nft = torch, src, plan, nft
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.device_name = torch.cuda.get_device_name(self.device) if self.cuda else "cpu"
        self.where = f"{self.device} ({self.device_name}), PyTorch {torch.__version__}"
        self.copy_stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.on_device = nft.WindowDataset(src, plan.batch_size, shuffle=True, seed=0, drop_remainder=True,
                                           gather="device", device=self.device)  # the arrays uploaded once
        self.x_shape, self.y_shape = tuple(src.x_shape), tuple(src.y_shape)
        b = plan.batch_size
        self.ready_x = torch.from_numpy(common.aligned_float32((b, *self.x_shape)))
        self.ready_x.fill_(1.0)
        self.ready_y = torch.from_numpy(common.aligned_float32((b, *self.y_shape)))
        self.staging = [(torch.empty((b, *self.x_shape), pin_memory=self.cuda),
                         torch.empty((b, *self.y_shape), pin_memory=self.cuda)) for _ in range(2)]
        self.staged = [None, None]  # per staging buffer: the event after its last copy to the device
        x_bytes, y_bytes = self.ready_x.nbytes, self.ready_y.nbytes
        self.h2d_bytes = {name: x_bytes + y_bytes for name in TORCH_FEEDS}
        self.h2d_bytes["device"] = 4 * 8 * b
        gen = torch.Generator(device="cpu").manual_seed(1)
        self.weight = (torch.randn((args.cols, args.cols), generator=gen) / np.sqrt(args.cols)).to(self.device)
        self.resident = torch.randn((b, args.window, args.cols), generator=gen).to(self.device)
        host = torch.from_numpy(np.random.default_rng(0).random((b, args.window, args.cols), np.float32))
        pinned = host.pin_memory() if self.cuda else host
        self.copies = {
            "h2d_pageable": ("host -> device copy of one batch ({mb:.1f} MB), ordinary pages: {gbs:.1f} GB/s",
                             lambda: (host.to(self.device), self.sync())),
            "h2d_pinned": ("host -> device copy of one batch, page-locked: {gbs:.1f} GB/s",
                           lambda: (pinned.to(self.device, non_blocking=True), self.sync()))}

    def _sent(self, *host):
        """The `host` tensors copied to the device on the copy stream and handed to the compute stream: it waits for
        their copies, and their memory (the copy stream's) is marked as used there."""
        if not self.cuda:
            return tuple(t.to(self.device) for t in host)
        with self.torch.cuda.stream(self.copy_stream):
            sent = tuple(t.to(self.device, non_blocking=True) for t in host)
        current = self.torch.cuda.current_stream(self.device)
        current.wait_stream(self.copy_stream)
        for t in sent:
            t.record_stream(current)
        return sent

    def _host_batches(self, epoch):
        with self.plan.batches(epoch) as batches:
            yield from batches

    def _pageable(self, epoch):
        for x, y in self._host_batches(epoch):
            yield self._sent(self.torch.from_numpy(x), self.torch.from_numpy(y))

    def _pinned(self, epoch):
        if not self.cuda:  # device= takes CUDA devices only: on the CPU, the pageable feed stands in
            return self._pageable(epoch)
        return iter(self.nft.WindowDataset(self.src, self.plan.batch_size, shuffle=True, seed=0, drop_remainder=True,
                                           epoch=epoch, device=self.device))

    def _staged(self, epoch):
        for i, (x, y) in enumerate(self._host_batches(epoch)):
            slot = i % 2
            if self.staged[slot] is not None:
                self.staged[slot].synchronize()  # its previous copy to the device has read it
            sx, sy = (t[:len(x)] for t in self.staging[slot])
            sx.copy_(self.torch.from_numpy(x))
            sy.copy_(self.torch.from_numpy(y))
            sent = self._sent(sx, sy)
            if self.cuda:
                self.staged[slot] = self.torch.cuda.Event()
                self.staged[slot].record(self.copy_stream)
            yield sent

    def _device(self, epoch):
        self.on_device.set_epoch(epoch)
        return iter(self.on_device)

    def _ready(self, _epoch):
        for _ in range(len(self.plan)):
            yield self._sent(self.ready_x, self.ready_y)

    def check(self) -> int:
        """Each feed's first 3 batches against the host batches of the same plan and epoch; the number checked."""
        checked = 0
        for name in TORCH_FEEDS[:-1]:  # the ready batch is no plan's
            with self.plan.batches(1) as reference, contextlib.closing(getattr(self, f"_{name}")(1)) as it:
                for (x, y), (rx, ry) in zip(itertools.islice(it, 3), reference):
                    if not (np.array_equal(x.cpu().numpy(), rx) and np.array_equal(y.cpu().numpy(), ry)):
                        raise SystemExit(f"bench_gpu: feed {name}: a batch on {self.device} differs from the host's")
                    checked += 1
        return checked

    def _compute(self, x, k):
        h = x.reshape(-1, self.weight.shape[0])
        for _ in range(k):
            h = self.torch.tanh(h @ self.weight)
        return h.sum()

    @contextlib.contextmanager
    def feed(self, name: str, repeat: int):
        total = self.torch.zeros((), device=self.device)

        def run(steps, k):
            nonlocal total
            for _ in range(steps):
                x, y = next(it)
                total += self._compute(x, k) if k else x.sum() + y.sum()
            float(total)  # waits for the device

        with contextlib.closing(getattr(self, f"_{name}")(repeat)) as it:
            yield run

    def compute(self, steps: int, k: int) -> None:
        total = self.torch.zeros((), device=self.device)
        for i in range(steps):  # the input depends on the step
            total += self._compute(self.resident + i * 1e-6, k)
        float(total)

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def json_extra(self, gb_per_s: dict) -> dict:
        return {"device_name": self.device_name, "torch": self.torch.__version__,
                "host_to_device_gb_per_s": {key.removeprefix("h2d_"): v for key, v in gb_per_s.items()}}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.framework == "tf":
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.device is None:
        args.device = first_gpu(args.framework)
        if args.device is None:
            who, cpu = ("TensorFlow", "/cpu:0") if args.framework == "tf" else ("PyTorch", "cpu")
            print(f"bench_gpu: no GPU visible to {who}: nothing to measure (--device {cpu} for a smoke run)")
            return 0
    threads = common.resolve_threads(args.threads)
    ds, src = open_source(args, threads)
    plan = src.plan(args.batch, shuffle=True, seed=0, drop_remainder=True)
    if len(plan) < 2 * args.steps + 20:
        raise SystemExit(f"{len(plan)} batches per epoch: too few for {args.steps} steps; add --files")
    fw = (TfFeeds if args.framework == "tf" else TorchFeeds)(args, args.device, src, plan, ds)
    checked = fw.check()
    cpu_per_step: dict = {}  # host CPU seconds per step (this process, every thread), at the best repeat

    def timed(fn, *a) -> float:
        fw.sync()
        t0 = time.perf_counter()
        fn(*a)
        return time.perf_counter() - t0

    def feed_seconds(name: str, k: int) -> float:
        best = float("inf")
        for r in range(args.repeats):
            with fw.feed(name, r) as run:
                run(START_STEPS, k)
                fw.sync()
                cpu0, t0 = time.process_time(), time.perf_counter()
                run(args.steps, k)
                seconds = (time.perf_counter() - t0) / args.steps
                if seconds < best:
                    best, cpu_per_step[(name, k)] = seconds, (time.process_time() - cpu0) / args.steps
        return best

    def compute_seconds(k: int) -> float:
        fw.compute(args.steps, k)  # warms up
        return min(timed(fw.compute, args.steps, k) / args.steps for _ in range(args.repeats))

    def numpy_seconds() -> float:
        with plan.batches(2) as it:
            next(it)
            t0 = time.perf_counter()
            for _ in range(args.steps):
                next(it)
            return (time.perf_counter() - t0) / args.steps

    host = numpy_seconds()
    copies = {key: min(timed(fn) for _ in range(max(5, args.repeats))) for key, (_, fn) in fw.copies.items()}
    feed = {name: feed_seconds(name, 0) for name in fw.FEEDS}
    one, seventeen = compute_seconds(1), compute_seconds(17)
    if seventeen > 1.2 * one:
        per_matmul = (seventeen - one) / 16  # a step: (one - per_matmul) + k * per_matmul
        k = min(max(round((feed[fw.reference] - (one - per_matmul)) / per_matmul), 1), MAX_MATMULS)
    else:
        k = 16
        print(f"bench_gpu: 17 matmuls took {seventeen * 1e3:.3f} ms a step, 1 took {one * 1e3:.3f} ms: too close to "
              f"calibrate, K = {k}")
    comp = compute_seconds(k)
    both = {name: feed_seconds(name, k) for name in fw.FEEDS}
    overlap = {name: (feed[name] + comp - both[name]) / min(feed[name], comp) for name in fw.FEEDS}

    batch_bytes = args.batch * args.window * args.cols * 4
    gb_per_s = {key: batch_bytes / seconds / 1e9 for key, seconds in copies.items()}
    copy = next(iter(copies.values()))  # from ordinary memory, as npyfeed's batches are

    def row(label, seconds, feed_name=None, matmuls=0, samples=True):
        cpu = cpu_per_step.get((feed_name, matmuls))
        return [label, f"{seconds * 1e3:.3f}", f"{args.batch / seconds:,.0f}" if samples else "-",
                f"{copy / seconds:.2f}x" if samples else "-", f"{comp / seconds:.2f}x" if samples else "-",
                "-" if cpu is None else f"{cpu * 1e3:.2f}",
                f"{fw.h2d_bytes[feed_name] / 1e3:,.1f}" if feed_name in fw.h2d_bytes else "-"]

    rows_out = [
        row("numpy iterator (the host side alone)", host),
        *(row(label.format(mb=batch_bytes / 1e6, gbs=gb_per_s[key]), copies[key])
          for key, (label, _) in fw.copies.items()),
        *(row(fw.labels[name], feed[name], name) for name in fw.FEEDS),
        row(f"compute: {k} matmul(s) + tanh on a resident batch (the limit)", comp, samples=False),
        *(row(f"both: {name} into that compute", both[name], name, k) for name in fw.FEEDS),
    ]
    print(f"npyfeed {npyfeed.__version__} bench_gpu --framework {args.framework} on {fw.where}: {args.files} files x "
          f"({args.rows}, {args.cols}) {args.dtype}, W={args.window}, B={args.batch}, {args.steps} steps, best of "
          f"{args.repeats}, threads={threads}, load {common.load_average()}"
          + ("" if checked is None else f"; {checked} batches checked against the host's"))
    print(common.format_table(("measurement", "ms/step", "samples/s", fw.copy_column, "x compute", "host CPU ms/step",
                               "host->device kB/step"), rows_out, align="lrrrrrr"))
    for name in fw.FEEDS:
        print(f"overlap {name} (feed + compute - both) / min(feed, compute) = {overlap[name]:.2f}  (1: feeding hides "
              "behind compute; 0: they take turns)")
    if args.quick or "cpu" in str(args.device).lower():
        print("(--quick or a CPU device: a smoke run; these numbers mean nothing)")
    if args.json:
        common.write_json(args.json, {
            "bench": fw.bench, "config": vars(args), "device": args.device, "machine": common.machine_info(),
            "matmuls": k, "batch_bytes": batch_bytes,
            **({} if checked is None else {"checked_batches": checked}),
            "overlap": overlap, "host_to_device_bytes_per_step": fw.h2d_bytes,
            "host_cpu_seconds_per_step": {f"{n}_{m}": v for (n, m), v in cpu_per_step.items()},
            "seconds_per_step": {"numpy": host, **copies, "compute": comp,
                                 **{f"feed_{n}": v for n, v in feed.items()},
                                 **{f"both_{n}": v for n, v in both.items()}},
            **fw.json_extra(gb_per_s)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
