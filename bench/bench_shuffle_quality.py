"""How good is ``shuffle="blocks"``? Shuffle statistics and a small training comparison against ``shuffle=True``.

A synthetic task in the users' shape: K keys (stocks) of T rows of F factors; the label of a window is a fixed
linear function of its last row plus a per-key offset (keys differ, as stocks do), plus noise. A linear model
over the window's last row (it cannot see the key) is trained by plain SGD for
``--steps`` batches; the loss is then measured on a fixed evaluation set drawn from every key (the per-key offsets it cannot see
set its floor, printed). A shuffle that
feeds batches from few keys at a time drags the model towards those keys' offsets, which shows as a higher loss.

For each order (no shuffle, global shuffle, blocks at several budgets given as keys per block) it prints:

* **keys/batch**: distinct keys (files) in a batch, mean over the epoch;
* **key span**: the part of the epoch over which one key's samples are spread, mean over keys (1 = everywhere);
* **displacement**: mean |position in the epoch - position in file order| / samples (1/3 for a uniform shuffle);
* **loss**: evaluation MSE after ``--steps`` SGD steps, mean and spread over ``--seeds`` seeds, and its ratio to
  the global shuffle's.

    python bench/bench_shuffle_quality.py            # a minute on 2 cores
    python bench/bench_shuffle_quality.py --quick    # seconds: a smoke test
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def make_data(keys: int, rows: int, features: int, window: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(features).astype(np.float32)
    factors, labels, index = {}, {}, []
    for k in range(keys):
        key = f"k{k:04d}"
        x = rng.standard_normal((rows, features)).astype(np.float32) + rng.normal(0, 0.5, features).astype(np.float32)
        offset = rng.normal(0, 2.0)  # the per-key effect a batch from few keys over-fits
        y = (x @ w + offset + rng.normal(0, 0.1, rows)).astype(np.float32)[:, None]
        factors[key], labels[key] = x, y
        index += [(r, r, key) for r in range(window - 1, rows)]
    return factors, labels, index


def stats(order: np.ndarray, key_of: np.ndarray, batch: int) -> dict:
    n = len(order)
    keys_per_batch = np.mean([len(np.unique(key_of[order[i:i + batch]])) for i in range(0, n, batch)])
    pos = np.empty(n, np.int64)
    pos[order] = np.arange(n)
    file_order = np.argsort(key_of, kind="stable")  # samples key by key: what reading files in order gives
    file_pos = np.empty(n, np.int64)
    file_pos[file_order] = np.arange(n)
    displacement = float(np.mean(np.abs(pos - file_pos))) / n
    spans = []
    for k in np.unique(key_of):
        p = pos[key_of == k]
        spans.append((p.max() - p.min() + 1) / n)
    return {"keys_per_batch": float(keys_per_batch), "key_span": float(np.mean(spans)), "displacement": displacement}


def train(src, batch: int, steps: int, lr: float, eval_set, **kwargs) -> float:
    f = src.x_shape[-1]
    w, b = np.zeros(f, np.float32), np.float32(0)
    done, epoch = 0, 0
    while done < steps:
        for x, y in src.batches(batch, epoch=epoch, **kwargs):
            last = x[:, -1, :]
            err = last @ w + b - y[:, 0]
            w -= lr * (last.T @ err) / len(y)
            b -= lr * err.mean()
            done += 1
            if done >= steps:
                break
        epoch += 1
    ex, ey = eval_set
    return float(np.mean((ex[:, -1, :] @ w + b - ey[:, 0]) ** 2))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--keys", type=int, default=200)
    p.add_argument("--rows", type=int, default=1000)
    p.add_argument("--features", type=int, default=16)
    p.add_argument("--window", type=int, default=8)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--keys-per-block", default="1,4,16,64", help="blocks budgets, as keys per block")
    p.add_argument("--json", metavar="PATH", default=None)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.keys, args.rows, args.steps, args.seeds, args.batch = 12, 200, 30, 1, 32
    import npyfeed

    factors, labels, index = make_data(args.keys, args.rows, args.features, args.window)
    src = npyfeed.WindowSource.from_arrays(index, factors, labels, args.window, threads=1)
    key_names = sorted(factors)
    key_of = np.array([key_names.index(k) for _, _, k in index])
    per_key = factors[key_names[0]].nbytes + labels[key_names[0]].nbytes
    rng = np.random.default_rng(123)
    eval_set = src.get(np.sort(rng.choice(len(src), min(len(src), 20000), replace=False)))
    contenders = [("no shuffle", dict(shuffle=False)), ("global shuffle", dict(shuffle=True))]
    for kpb in [float(v) for v in args.keys_per_block.split(",")]:
        budget = int(2 * kpb * per_key)
        contenders.append((f"blocks, {kpb:g} keys/block ({budget / 1e6:.1f} MB)",
                           dict(shuffle="blocks", memory_budget=budget)))
    rows, results = [], []
    for name, kwargs in contenders:
        if kwargs["shuffle"] is False:
            order = src.epoch_order(0)
        else:
            order = src.epoch_order(0, seed=1, **kwargs)
        s = stats(np.asarray(order), key_of, args.batch)
        losses = [train(src, args.batch, args.steps, args.lr, eval_set,
                        **({**kwargs, "seed": seed} if kwargs["shuffle"] is not False else kwargs))
                  for seed in range(args.seeds)]
        results.append({"name": name, **s, "loss_mean": float(np.mean(losses)), "loss_std": float(np.std(losses))})
    ex, ey = eval_set
    design = np.c_[ex[:, -1, :], np.ones(len(ex), np.float32)]
    coef = np.linalg.lstsq(design, ey[:, 0], rcond=None)[0]
    floor = float(np.mean((design @ coef - ey[:, 0]) ** 2))
    base = next(r["loss_mean"] for r in results if r["name"] == "global shuffle")
    for r in results:
        rows.append([r["name"], common.fmt(r["keys_per_batch"], ".1f"), common.fmt(r["key_span"], ".3f"),
                     common.fmt(r["displacement"], ".3f"), f"{r['loss_mean']:.4f} ± {r['loss_std']:.4f}",
                     common.fmt(r["loss_mean"] / base, ".2f")])
    print(f"{args.keys} keys x {args.rows} rows x {args.features} features, window {args.window}, batch {args.batch}, "
          f"{args.steps} SGD steps (lr {args.lr}), {args.seeds} seeds; best possible loss (least squares on the "
          f"evaluation set) {floor:.4f}")
    print(common.format_table(["order", "keys/batch", "key span", "displacement", "eval loss", "x global"], rows))
    if args.json:
        common.write_json(args.json, {"command": " ".join(sys.argv), "args": vars(args), "floor": floor,
                                      "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
