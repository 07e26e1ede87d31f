#!/usr/bin/env python3
"""Host-to-device feeding measured through PyTorch on a CUDA GPU: the questions of ``bench_gpu.py`` where no
TensorFlow build for the GPU can be installed (a machine with PyTorch's CUDA stack and no TensorFlow).

The copy to the GPU, its overlap with compute and batches formed on the device are the same hardware facts
whichever framework issues them; this script asks them of ``npyfeed.torch.WindowDataset`` and of the core's
device half (``_core.DeviceRows``, what ``npyfeed.tf.dataset(gather="device")`` uses), on one generated data set
in the users' layout (W=100, B=256, F=256, float32). Each measurement runs `--steps` steps, each step's batch
reduced on the GPU, and waits for the GPU at the end. Feeds:

  pageable  ``WindowDataset`` batches (npyfeed's own buffers: ordinary pages) copied to the GPU on a copy stream
            of their own (``.to(device, non_blocking=True)``), the compute stream waiting on each copy: a
            prefetcher as PyTorch users write one
  staged    the same batches copied first into one of two page-locked staging buffers (what ``DataLoader(...,
            pin_memory=True)`` does), then to the GPU asynchronously: one host copy more, a faster DMA that
            returns at once
  pinned    ``WindowDataset(..., device=...)``: the batches gathered into page-locked buffers of npyfeed's
            (``Plan.batches(pin_memory=True)``), copied on a stream of its own, no host copy
  device    the arrays uploaded once; each step's host part only the start rows (``DeviceRows.rows``: 4 x B
            int64), the batch formed on the GPU by one gather of factor rows and one of label rows
  ready     one ready batch in ordinary memory, copied every step: the copy alone, nothing gathered

and for each: ``feed`` (the feed alone), ``both`` (the feed into a step of K chained (B*W, F) x (F, F) matmuls
with tanh, K calibrated so that compute alone takes about as long as the pageable feed), and ``overlap`` =
(feed + compute - both) / min(feed, compute): 1 = feeding hides behind compute, 0 = they take turns. Beside
them, the limits: one batch copied host -> device from ordinary and from page-locked memory (GB/s), and the
numpy iterator over the same source (the host side alone).

Before timing, each feed's batches are checked against the host batches of the same plan, element for element
(the device feed's too: its gather is the one under test).

``--device cpu`` runs it all on the CPU (a smoke run of the script: those numbers mean nothing). Without a CUDA
GPU and without ``--device`` it says so and exits 0.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import npyfeed  # noqa: E402

MAX_MATMULS = 4096  # a bound on K, whatever the calibration says
FEEDS = ("pageable", "staged", "pinned", "device", "ready")


def parse_args(argv=None):
    return common.gpu_parser(__doc__, "torch device (default: cuda:0; cpu for a smoke run)").parse_args(argv)


class Feeds:
    """The four feeds over one plan; each `make(name, epoch)` returns an iterator of (x, y) on the device."""

    def __init__(self, torch, src, plan, device, window: int, pinned_dataset):
        from npyfeed import _core  # noqa: PLC0415 - the device half: what npyfeed.tf's gather="device" uses

        self.torch, self.src, self.plan, self.device, self.window = torch, src, plan, device, window
        self.cuda = device.type == "cuda"
        self.copy_stream = torch.cuda.Stream(device) if self.cuda else None
        self.pad = src.bounds == "pad"
        self.host_rows = _core.DeviceRows(plan._core, "float32")
        self.factors = self._resident(False)
        self.labels = self._resident(True)
        self.x_shape, self.y_shape = tuple(src.x_shape), tuple(src.y_shape)
        b = plan.batch_size
        self.ready_x = torch.from_numpy(common.aligned_float32((b, *self.x_shape)))
        self.ready_x.fill_(1.0)
        self.ready_y = torch.from_numpy(common.aligned_float32((b, *self.y_shape)))
        pin = self.cuda
        self.staging = [(torch.empty((b, *self.x_shape), pin_memory=pin),
                         torch.empty((b, *self.y_shape), pin_memory=pin)) for _ in range(2)]
        self.staged = [None, None]  # per staging buffer: the event after its last copy to the device
        self.pinned_dataset = pinned_dataset  # epoch -> npyfeed.torch.WindowDataset(..., device=device)

    def _resident(self, label: bool):
        host = self.host_rows.read_resident(label)  # (rows + 1, row elements), the last row zeros
        return self.torch.from_numpy(host).to(self.device)

    def _stream(self):
        return self.torch.cuda.stream(self.copy_stream) if self.cuda else contextlib.nullcontext()

    def _handed_over(self, *tensors):
        """`tensors`, copied to the device on the copy stream, handed to the compute stream: it waits for their
        copies, and their memory (the copy stream's) is marked as used there."""
        if self.cuda:
            current = self.torch.cuda.current_stream(self.device)
            current.wait_stream(self.copy_stream)
            for t in tensors:
                t.record_stream(current)
        return tensors

    def make(self, name: str, epoch: int):
        return getattr(self, f"_{name}")(epoch)

    def _host_batches(self, epoch):
        with self.plan.batches(epoch) as batches:
            yield from batches

    def _pageable(self, epoch):
        for x, y in self._host_batches(epoch):
            with self._stream():
                xd = self.torch.from_numpy(x).to(self.device, non_blocking=True)
                yd = self.torch.from_numpy(y).to(self.device, non_blocking=True)
            yield self._handed_over(xd, yd)

    def _pinned(self, epoch):
        yield from self.pinned_dataset(epoch)

    def _staged(self, epoch):
        for i, (x, y) in enumerate(self._host_batches(epoch)):
            slot = i % 2
            if self.staged[slot] is not None:
                self.staged[slot].synchronize()  # its previous copy to the device has read it
            sx, sy = self.staging[slot]
            n = len(x)
            sx[:n].copy_(self.torch.from_numpy(x))
            sy[:n].copy_(self.torch.from_numpy(y))
            with self._stream():
                xd = sx[:n].to(self.device, non_blocking=True)
                yd = sy[:n].to(self.device, non_blocking=True)
                if self.cuda:
                    self.staged[slot] = self.torch.cuda.Event()
                    self.staged[slot].record(self.copy_stream)
            yield self._handed_over(xd, yd)

    def _device(self, epoch):
        torch = self.torch
        j = torch.arange(self.window, device=self.device)
        zero_row = self.factors.shape[0] - 1
        for b in range(len(self.plan)):
            start, lo, hi, y_row = (torch.from_numpy(a) for a in self.host_rows.rows(epoch, b))
            with self._stream():
                start, lo, hi, y_row = (a.to(self.device, non_blocking=True) for a in (start, lo, hi, y_row))
            start, lo, hi, y_row = self._handed_over(start, lo, hi, y_row)
            rows = start[:, None] + j[None, :]
            if self.pad:
                valid = (j[None, :] >= lo[:, None]) & (j[None, :] < hi[:, None])
                rows = torch.where(valid, rows, torch.full_like(rows, zero_row))
            x = self.factors[rows].reshape(len(start), *self.x_shape)
            y = self.labels[y_row].reshape(len(start), *self.y_shape)
            yield x, y

    def _ready(self, _epoch):
        for _ in range(len(self.plan)):
            with self._stream():
                xd = self.ready_x.to(self.device, non_blocking=True)
                yd = self.ready_y.to(self.device, non_blocking=True)
            yield self._handed_over(xd, yd)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.quick:
        args.files, args.rows, args.cols, args.window, args.batch, args.steps, args.repeats = 8, 400, 32, 20, 32, 20, 1
    import torch  # noqa: PLC0415 (only this benchmark needs it)

    if args.device is None:
        if not torch.cuda.is_available():
            print("bench_gpu_torch: no CUDA GPU visible to PyTorch: nothing to measure (--device cpu for a smoke run)")
            return 0
        args.device = "cuda:0"
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    threads = common.resolve_threads(args.threads)
    _, src = common.gpu_source(args, threads)
    plan = src.plan(args.batch, shuffle=True, seed=0, drop_remainder=True)
    if len(plan) < 2 * args.steps + 20:
        raise SystemExit(f"{len(plan)} batches per epoch: too few for {args.steps} steps; add --files")
    import npyfeed.torch as nft  # noqa: PLC0415

    def pinned_dataset(epoch):
        if not cuda:  # device= takes CUDA devices only: on the CPU, the pageable feed stands in
            return feeds.make("pageable", epoch)
        return iter(nft.WindowDataset(src, args.batch, shuffle=True, seed=0, drop_remainder=True, epoch=epoch,
                                      device=device))

    feeds = Feeds(torch, src, plan, device, args.window, pinned_dataset)
    batch_bytes = args.batch * args.window * args.cols * 4
    y_bytes = args.batch * int(np.prod(src.y_shape, dtype=np.int64)) * 4

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    # Correctness first: every feed's first batches against the host batches of the same plan and epoch.
    checked = 0
    for name in FEEDS:
        if name == "ready":
            continue
        with plan.batches(1) as reference:
            it = feeds.make(name, 1)
            for _ in range(3):
                x, y = next(it)
                rx, ry = next(reference)
                if not (np.array_equal(x.cpu().numpy(), rx) and np.array_equal(y.cpu().numpy(), ry)):
                    raise SystemExit(f"bench_gpu_torch: feed {name}: a batch on {device} differs from the host's")
                checked += 1
            it.close()

    rows, cols = args.batch * args.window, args.cols
    gen = torch.Generator(device="cpu").manual_seed(1)
    weight = (torch.randn((cols, cols), generator=gen) / np.sqrt(cols)).to(device)
    resident = torch.randn((args.batch, args.window, cols), generator=gen).to(device)

    def compute(x, k):
        h = x.reshape(rows, cols)
        for _ in range(k):
            h = torch.tanh(h @ weight)
        return h.sum()

    def fed_seconds(name: str, k: int, seed: int) -> tuple:
        it = feeds.make(name, seed)
        total = torch.zeros((), device=device)
        for _ in range(10):  # start-up (first gathers, allocator) outside the time
            x, y = next(it)
            total += compute(x, k) if k else x.sum() + y.sum()
        sync()
        cpu0, t0 = time.process_time(), time.perf_counter()
        for _ in range(args.steps):
            x, y = next(it)
            total += compute(x, k) if k else x.sum() + y.sum()
        float(total)  # waits for the device
        seconds = (time.perf_counter() - t0) / args.steps
        it.close()
        return seconds, (time.process_time() - cpu0) / args.steps

    cpu_per_step: dict = {}

    def feed_seconds(name: str, k: int) -> float:
        best = float("inf")
        for r in range(args.repeats):
            seconds, cpu = fed_seconds(name, k, r)
            if seconds < best:
                best, cpu_per_step[(name, k)] = seconds, cpu
        return best

    def compute_seconds(k: int) -> float:
        best = float("inf")
        for r in range(args.repeats + 1):
            total = torch.zeros((), device=device)
            sync()
            t0 = time.perf_counter()
            for i in range(args.steps):
                total += compute(resident + i * 1e-6, k)
            float(total)
            if r:  # the first run warms up
                best = min(best, (time.perf_counter() - t0) / args.steps)
        return best

    def h2d_seconds(pinned: bool) -> float:
        host = torch.from_numpy(np.random.default_rng(0).random((args.batch, args.window, cols), np.float32))
        if pinned and cuda:
            host = host.pin_memory()
        best = float("inf")
        for _ in range(max(5, args.repeats)):
            sync()
            t0 = time.perf_counter()
            host.to(device, non_blocking=pinned)
            sync()
            best = min(best, time.perf_counter() - t0)
        return best

    def numpy_seconds() -> float:
        with plan.batches(2) as it:
            next(it)
            t0 = time.perf_counter()
            for _ in range(args.steps):
                next(it)
            return (time.perf_counter() - t0) / args.steps

    host = numpy_seconds()
    h2d = {"pageable": h2d_seconds(False), "pinned": h2d_seconds(True)}
    feed = {name: feed_seconds(name, 0) for name in FEEDS}
    one, seventeen = compute_seconds(1), compute_seconds(17)
    if seventeen > 1.2 * one:
        per_matmul = (seventeen - one) / 16
        k = min(max(round((feed["pageable"] - (one - per_matmul)) / per_matmul), 1), MAX_MATMULS)
    else:
        k = 16
        print(f"bench_gpu_torch: 17 matmuls took {seventeen * 1e3:.3f} ms a step, 1 took {one * 1e3:.3f} ms: too "
              f"close to calibrate, K = {k}")
    comp = compute_seconds(k)
    both = {name: feed_seconds(name, k) for name in FEEDS}
    overlap = {name: (feed[name] + comp - both[name]) / min(feed[name], comp) for name in FEEDS}
    h2d_per_step = {name: batch_bytes + y_bytes for name in FEEDS}
    h2d_per_step["device"] = 4 * 8 * args.batch

    def row(label, seconds, samples=True, feed_name=None, matmuls=0):
        cpu = cpu_per_step.get((feed_name, matmuls))
        return [label, f"{seconds * 1e3:.3f}", f"{args.batch / seconds:,.0f}" if samples else "-",
                f"{h2d['pageable'] / seconds:.2f}x" if samples else "-", f"{comp / seconds:.2f}x" if samples else "-",
                "-" if cpu is None else f"{cpu * 1e3:.2f}",
                f"{h2d_per_step[feed_name] / 1e3:,.1f}" if feed_name in h2d_per_step else "-"]

    gbs = {kind: batch_bytes / s / 1e9 for kind, s in h2d.items()}
    rows_out = [
        row("numpy iterator (the host side alone)", host),
        row(f"host -> device copy of one batch ({batch_bytes / 1e6:.1f} MB), ordinary pages: "
            f"{gbs['pageable']:.1f} GB/s", h2d["pageable"]),
        row(f"host -> device copy of one batch, page-locked: {gbs['pinned']:.1f} GB/s", h2d["pinned"]),
        *(row(f"feed {name}", feed[name], feed_name=name) for name in FEEDS),
        row(f"compute: {k} matmul(s) + tanh on a resident batch (the limit)", comp, samples=False),
        *(row(f"both: {name} into that compute", both[name], feed_name=name, matmuls=k) for name in FEEDS),
    ]
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    print(f"npyfeed {npyfeed.__version__} bench_gpu_torch on {device} ({name}), PyTorch {torch.__version__}: "
          f"{args.files} files x ({args.rows}, {args.cols}) {args.dtype}, W={args.window}, B={args.batch}, "
          f"{args.steps} steps, best of {args.repeats}, threads={threads}, load {common.load_average()}; "
          f"{checked} batches checked against the host's")
    print(common.format_table(("measurement", "ms/step", "samples/s", "x pageable copy", "x compute",
                               "host CPU ms/step", "host->device kB/step"), rows_out, align="lrrrrrr"))
    for feed_name in FEEDS:
        print(f"overlap {feed_name:8s} (feed + compute - both) / min(feed, compute) = {overlap[feed_name]:.2f}  "
              "(1: feeding hides behind compute; 0: they take turns)")
    if args.quick or not cuda:
        print("(--quick or --device cpu: a smoke run; these numbers mean nothing)")
    if args.json:
        common.write_json(args.json, {
            "bench": "bench_gpu_torch", "config": vars(args), "device": str(device), "device_name": name,
            "torch": torch.__version__, "machine": common.machine_info(), "matmuls": k, "batch_bytes": batch_bytes,
            "checked_batches": checked, "overlap": overlap, "host_to_device_bytes_per_step": h2d_per_step,
            "host_to_device_gb_per_s": gbs,
            "host_cpu_seconds_per_step": {f"{n}_{m}": v for (n, m), v in cpu_per_step.items()},
            "seconds_per_step": {"numpy": host, "h2d_pageable": h2d["pageable"], "h2d_pinned": h2d["pinned"],
                                 "compute": comp, **{f"feed_{n}": v for n, v in feed.items()},
                                 **{f"both_{n}": v for n, v in both.items()}}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
