"""shuffle="blocks": the epoch order (every sample once, under every bounds policy, for an index that lists
keys interleaved or one after another; deterministic; shards contiguous, disjoint, covering, sizes within one;
resume), batch values against np.load and slicing in every
mode and from arrays, the memory budget (the stream's own count of bytes held), files deleted or truncated
mid-epoch, the warning that points ``shuffle=True`` users at it (tf.dataset with blocks: tests/test_tf.py,
which keeps TensorFlow's threads out of the processes of the other test files).
Mirrors tests/cpp/test_block_order.cpp and tests/cpp/test_block_stream.cpp."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import npyfeed
import numpy as np
import pytest

WINDOW = 5
KEYS = 12
FEATURES = 3


class Data:
    def __init__(self, root, bounds_cases: bool, grouped: bool = False):
        rng = np.random.default_rng(3)
        self.factors, self.labels, self.entries = {}, {}, []
        os.makedirs(root / "f", exist_ok=True)
        os.makedirs(root / "l", exist_ok=True)
        for k in range(KEYS):
            key = f"k{k:02d}"
            rows = 30 + 7 * k  # different sizes: blocks hold different numbers of keys
            self.factors[key] = rng.standard_normal((rows, FEATURES)).astype(np.float32)
            self.labels[key] = rng.standard_normal((rows, 2)).astype(np.float64)
            np.save(root / "f" / f"{key}.npy", self.factors[key])
            np.save(root / "l" / f"{key}.npy", self.labels[key])
            for r in range(WINDOW - 1, rows):
                self.entries.append((r, rows - 1 - r, key))
            if bounds_cases:  # windows and label rows outside their arrays
                self.entries += [(1, 0, key), (rows + 2, 0, key), (WINDOW, rows + 5, key)]
        rng.shuffle(self.entries)  # keys interleaved in the index
        if grouped:  # a key's lines together, keys in a shuffled order (as the users' index files)
            rank = {k: r for r, k in enumerate(rng.permutation(sorted(self.factors)))}
            self.entries.sort(key=lambda e: rank[e[2]])
        self.index = root / "index.txt"
        self.index.write_text("".join(f"{f},{lab},{k}\n" for f, lab, k in self.entries))
        self.root = root

    def open(self, mode="mmap", bounds="error"):
        if mode == "memory":
            return npyfeed.WindowSource.from_arrays(str(self.index), self.factors, self.labels, WINDOW, bounds=bounds)
        return npyfeed.WindowSource(self.index, self.root / "f", self.root / "l", WINDOW, mode=mode, bounds=bounds,
                                    threads=2)

    def kept(self, bounds):
        """Entries that are samples under `bounds` (sample id = position here)."""
        if bounds != "skip":
            return list(self.entries)
        return [(f, lab, k) for f, lab, k in self.entries
                if f - WINDOW + 1 >= 0 and f < len(self.factors[k]) and 0 <= lab < len(self.labels[k])]

    def reference(self, bounds, ids):
        """np.load and slicing, zeros outside the arrays (bounds='pad')."""
        kept = self.kept(bounds)
        xs, ys = [], []
        for i in ids:
            f, lab, k = kept[i]
            fac = np.load(self.root / "f" / f"{k}.npy")
            x = np.zeros((WINDOW, FEATURES), np.float32)
            for w, r in enumerate(range(f - WINDOW + 1, f + 1)):
                if 0 <= r < len(fac):
                    x[w] = fac[r]
            lab_arr = np.load(self.root / "l" / f"{k}.npy")
            ys.append(lab_arr[lab].astype(np.float32) if 0 <= lab < len(lab_arr) else np.zeros(2, np.float32))
            xs.append(x)
        return np.stack(xs), np.stack(ys)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return Data(tmp_path_factory.mktemp("blocks"), bounds_cases=False)


@pytest.fixture(scope="module")
def rough(tmp_path_factory):
    return Data(tmp_path_factory.mktemp("blocks-bounds"), bounds_cases=True)


@pytest.fixture(scope="module")
def grouped(tmp_path_factory):
    """Each key's lines together (the per-key sample lists are then runs, with no per-sample memory)."""
    return {bounds_cases: Data(tmp_path_factory.mktemp("blocks-grouped"), bounds_cases=bounds_cases, grouped=True)
            for bounds_cases in (False, True)}


def key_bytes(d: Data, key: str) -> int:
    return d.factors[key].nbytes + d.labels[key].nbytes  # what the budget counts: array data


def budget_of(d: Data, keys_per_block: float) -> int:
    """A budget whose half holds about this many of the largest keys."""
    return int(2 * keys_per_block * max(key_bytes(d, k) for k in d.factors))


def read_epoch(src, batch_size, **kwargs):
    it = src.batches(batch_size, shuffle="blocks", **kwargs)
    batches = list(it)
    return batches, it


@pytest.mark.parametrize("mode", ["mmap", "read", "direct", "memory"])
@pytest.mark.parametrize("bounds", ["error", "skip", "pad"])
@pytest.mark.parametrize("layout", ["interleaved", "grouped"])
def test_every_sample_once_and_values_equal_numpy(data, rough, grouped, mode, bounds, layout):
    if layout == "grouped":
        d = grouped[bounds != "error"]
    else:
        d = data if bounds == "error" else rough
    src = d.open(mode, bounds)
    budget = budget_of(d, 2.5)
    order = src.epoch_order(3, shuffle="blocks", seed=9, memory_budget=budget)
    assert sorted(order.tolist()) == list(range(len(src)))
    assert len(src) == len(d.kept(bounds))
    batches, it = read_epoch(src, 16, seed=9, epoch=3, memory_budget=budget)
    assert len(batches) == src.num_batches(16)
    x = np.concatenate([b[0] for b in batches])
    y = np.concatenate([b[1] for b in batches])
    ref_x, ref_y = d.reference(bounds, order)
    np.testing.assert_array_equal(x, ref_x, strict=True)
    np.testing.assert_array_equal(y, ref_y, strict=True)


def test_deterministic_and_different_per_epoch_seed_budget(data):
    src = data.open()
    b = budget_of(data, 2)
    first = src.epoch_order(1, shuffle="blocks", seed=4, memory_budget=b)
    # The same on another source over the same files, in another mode, and from arrays.
    for mode in ("read", "direct", "memory"):
        np.testing.assert_array_equal(data.open(mode).epoch_order(1, shuffle="blocks", seed=4, memory_budget=b), first)
    assert not np.array_equal(src.epoch_order(2, shuffle="blocks", seed=4, memory_budget=b), first)
    assert not np.array_equal(src.epoch_order(1, shuffle="blocks", seed=5, memory_budget=b), first)
    assert not np.array_equal(src.epoch_order(1, shuffle="blocks", seed=4, memory_budget=4 * b), first)
    # Batches follow the order, epoch after epoch.
    for epoch in (1, 2):
        order = src.epoch_order(epoch, shuffle="blocks", seed=4, memory_budget=b)
        batches, _ = read_epoch(src, 10, seed=4, epoch=epoch, memory_budget=b)
        np.testing.assert_array_equal(np.concatenate([y for _, y in batches]), data.reference("error", order)[1])


def test_blocks_follow_keys_and_budget(data):
    """Each file is read once: a key's samples are consecutive within its block's span, and the blocks of
    an epoch (spans of consecutive keys) are read in order, each within half the budget."""
    src = data.open()
    b = budget_of(data, 1.5)
    order = src.epoch_order(0, shuffle="blocks", seed=1, memory_budget=b)
    kept = data.kept("error")
    keys = [kept[i][2] for i in order]
    # The first and last position of every key: no key's span overlaps a span of a key in another block, so
    # the number of distinct keys "alive" at any position is bounded by one block.
    first = {k: keys.index(k) for k in set(keys)}
    last = {k: len(keys) - 1 - keys[::-1].index(k) for k in set(keys)}
    spans = sorted((first[k], last[k], k) for k in first)
    blocks, end = [], -1
    for lo, hi, k in spans:
        if lo > end:
            blocks.append([])
        blocks[-1].append(k)
        end = max(end, hi)
    assert len(blocks) > 3
    for keys_in_block in blocks:
        total = sum(key_bytes(data, k) for k in keys_in_block)
        assert total <= b // 2 or len(keys_in_block) == 1
    # Within a block, samples of its keys are mixed (not key after key).
    big = max(blocks, key=len)
    assert len(big) >= 2


@pytest.mark.parametrize("num_shards", [2, 3, 5])
def test_shards_disjoint_covering_contiguous(data, num_shards):
    src = data.open("read")
    b = budget_of(data, 2)
    parts = [src.epoch_order(2, shuffle="blocks", seed=3, memory_budget=b, num_shards=num_shards, shard_index=i)
             for i in range(num_shards)]
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(src)))  # disjoint, covering
    # Contiguous parts of one epoch: a shard reads its own keys, and of its neighbour's only the first block
    # (which holds the key that the two share); shards further apart share no key.
    kept = data.kept("error")
    keys = [{kept[i][2] for i in p} for p in parts]
    for i in range(num_shards):
        for j in range(i + 2, num_shards):
            assert not keys[i] & keys[j]
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    for i, p in enumerate(parts):
        assert src.num_batches(7, num_shards=num_shards, shard_index=i) == -(-len(p) // 7)
        batches, _ = read_epoch(src, 7, seed=3, epoch=2, memory_budget=b, num_shards=num_shards, shard_index=i)
        assert len(batches) == -(-len(p) // 7)
        np.testing.assert_array_equal(np.concatenate([y for _, y in batches]), data.reference("error", p)[1])
        # The same shard, asked again (another process would get the same).
        np.testing.assert_array_equal(
            src.epoch_order(2, shuffle="blocks", seed=3, memory_budget=b, num_shards=num_shards, shard_index=i), p)


@pytest.mark.parametrize("start_batch", [1, 7, 12])
def test_start_batch_resumes_at_the_tail(data, start_batch):
    src = data.open("direct")
    b = budget_of(data, 2)
    full, _ = read_epoch(src, 20, seed=8, epoch=5, memory_budget=b)
    tail, it = read_epoch(src, 20, seed=8, epoch=5, memory_budget=b, start_batch=start_batch)
    assert len(tail) == len(full) - start_batch
    for (ax, ay), (ex, ey) in zip(tail, full[start_batch:]):
        np.testing.assert_array_equal(ax, ex)
        np.testing.assert_array_equal(ay, ey)


@pytest.mark.parametrize("mode", ["mmap", "read", "direct"])
@pytest.mark.parametrize("keys_per_block", [1, 2.5])
def test_memory_budget_respected(data, mode, keys_per_block):
    """The stream's own count of file bytes held (blocks read ahead, consumed, or read by a gather in flight)."""
    src = data.open(mode)
    b = budget_of(data, keys_per_block)
    it = src.batches(8, shuffle="blocks", seed=2, memory_budget=b)
    stream = it._stream
    assert stream.num_blocks >= 4
    held = []
    for _ in it:
        held.append(stream.buffered_bytes)
    assert stream.peak_buffered_bytes <= b
    # Several blocks' worth went through: reading was bounded, not skipped.
    assert stream.peak_buffered_bytes >= b // 4
    assert max(held) <= b
    assert stream.buffered_bytes == 0  # all released at the end


# A fresh process: resident anonymous memory over several blocks epochs, from before the first (the stream's
# own count above cannot see memory that the allocator keeps after the stream freed it).
_RESIDENT_SCRIPT = """
import sys, numpy as np, npyfeed
root, mode, rows, cols, window, keys = sys.argv[1], sys.argv[2], 2400, 256, 16, 40
rng = np.random.default_rng(0)
with open(root + "/index.txt", "w") as index:
    for k in range(keys):
        np.save(f"{root}/f/k{k}.npy", rng.standard_normal((rows, cols), dtype=np.float32))
        np.save(f"{root}/l/k{k}.npy", rng.standard_normal((rows, 1), dtype=np.float32))
        index.writelines(f"{r},{r},k{k}\\n" for r in range(window - 1, rows))

def resident_anon():
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("RssAnon")).split()[1]) * 1024

src = npyfeed.WindowSource(root + "/index.txt", root + "/f", root + "/l", window, mode=mode, threads=2)
budget = 8 * rows * cols * 4  # 8 of the 40 files
start, peak = resident_anon(), 0
for epoch in range(4):
    for x, y in src.batches(64, shuffle="blocks", memory_budget=budget, seed=0, epoch=epoch):
        peak = max(peak, resident_anon())
print(budget, peak - start)
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["read", "direct"])
def test_resident_memory_stays_within_the_budget_over_epochs(tmp_path, mode):
    """Blocks allocate and free a file-sized array per key, all epoch long: the memory must go back to the
    system, not stay in the allocator (glibc keeps freed chunks of a few MB in its arenas once its mmap
    threshold has risen: 4 epochs here then grew 90-230 MB for a 20 MB budget)."""
    (tmp_path / "f").mkdir()
    (tmp_path / "l").mkdir()
    proc = subprocess.run([sys.executable, "-c", _RESIDENT_SCRIPT, str(tmp_path), mode], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    budget, growth = map(int, proc.stdout.split())
    batch_buffers = 8 * 64 * 16 * 256 * 4  # 2 * (prefetch + 2) batches of x
    assert growth <= budget + batch_buffers + (16 << 20), (growth, budget)


@pytest.mark.parametrize("mode", ["mmap", "read", "direct"])
@pytest.mark.parametrize("writer", ["stored", "deflated"])
def test_npz_members_are_used_where_the_source_holds_them(data, tmp_path, writer, mode):
    """.npz factor and label files (stored: mapped in mode 'mmap'; deflated: inflated at open) give the batches of
    the same arrays in .npy files; nothing is read per block (the members are in memory already)."""
    save = np.savez if writer == "stored" else np.savez_compressed
    for sub, arrays in (("f", data.factors), ("l", data.labels)):
        (tmp_path / sub).mkdir()
        for key, a in arrays.items():
            save(tmp_path / sub / f"{key}.npz", a)
    src = npyfeed.WindowSource(data.index, tmp_path / "f", tmp_path / "l", WINDOW, mode=mode, threads=2)
    assert all(f.endswith(".npz") for f in src.files)
    b = budget_of(data, 1.5)
    order = src.epoch_order(1, shuffle="blocks", seed=6, memory_budget=b)
    np.testing.assert_array_equal(order, data.open(mode).epoch_order(1, shuffle="blocks", seed=6, memory_budget=b))
    it = src.batches(16, shuffle="blocks", seed=6, epoch=1, memory_budget=b)
    stream = it._stream
    batches = list(it)
    ref_x, ref_y = data.reference("error", order)
    np.testing.assert_array_equal(np.concatenate([x for x, _ in batches]), ref_x, strict=True)
    np.testing.assert_array_equal(np.concatenate([y for _, y in batches]), ref_y, strict=True)
    assert stream.peak_buffered_bytes == 0


@pytest.mark.parametrize("damage", ["deleted", "truncated"])
@pytest.mark.parametrize("mode", ["mmap", "read", "direct"])
def test_file_damaged_mid_epoch_names_it(tmp_path, mode, damage):
    d = Data(tmp_path, bounds_cases=False)
    src = d.open(mode)
    b = budget_of(d, 1)
    order = src.epoch_order(0, shuffle="blocks", memory_budget=b)
    last_key = d.kept("error")[order[-1]][2]  # read in the last block
    it = src.batches(8, shuffle="blocks", memory_budget=b)
    next(it)
    victim = d.root / "f" / f"{last_key}.npy"
    if damage == "deleted":
        victim.unlink()
        with pytest.raises(FileNotFoundError) as info:
            list(it)
        assert info.value.filename == str(victim)
    else:
        os.truncate(victim, 200)  # refused by the block that reads it again (File::reopen): what changed, named
        with pytest.raises(npyfeed.FileChangedError, match="truncated") as info:
            list(it)
        assert info.value.filename == str(victim)
    it.close()


def test_bad_arguments(data):
    src = data.open()
    with pytest.raises(ValueError, match="shuffle"):
        src.batches(4, shuffle="bricks")
    with pytest.raises(ValueError, match="memory_budget"):
        src.batches(4, shuffle="blocks", memory_budget=0)
    with pytest.raises(ValueError, match="memory_budget"):
        src.epoch_order(shuffle="blocks", memory_budget=-1)


def test_global_shuffle_over_more_than_memory_warns_once(data, monkeypatch, caplog):
    from npyfeed import _source_warnings

    def warnings():
        return [r.getMessage() for r in caplog.records if "shuffle=\"blocks\"" in r.getMessage()]

    src = data.open()
    monkeypatch.setattr(_source_warnings, "available_memory", lambda: 1000)
    with caplog.at_level(logging.WARNING, logger="npyfeed"):
        src.batches(4, shuffle=True).close()
        src.batches(4, shuffle=True).close()
        src.batches(4, shuffle="blocks").close()
        src.batches(4).close()
    assert len(warnings()) == 1
    # Whatever reads the plan (take, npyfeed.tf, the adapters): warned when the plan is made.
    caplog.clear()
    other = data.open()
    with caplog.at_level(logging.WARNING, logger="npyfeed"):
        other.plan(4, shuffle="blocks")
        assert not warnings()
        other.plan(4, shuffle=True).take(0, 0)
    assert len(warnings()) == 1
    # Enough memory: no warning.
    caplog.clear()
    other = data.open()
    monkeypatch.setattr(_source_warnings, "available_memory", lambda: 1 << 50)
    with caplog.at_level(logging.WARNING, logger="npyfeed"):
        other.batches(4, shuffle=True).close()
    assert not caplog.records


def test_available_memory_is_positive():
    avail = npyfeed._resources.available_memory()
    assert avail is None or avail > 0


def test_drop_remainder_and_len(data):
    src = data.open("read")
    b = budget_of(data, 2)
    order = src.epoch_order(0, shuffle="blocks", seed=2, memory_budget=b)
    it = src.batches(32, shuffle="blocks", seed=2, memory_budget=b, drop_remainder=True)
    assert len(it) == len(order) // 32 == src.num_batches(32, drop_remainder=True)
    batches = list(it)
    assert len(batches) == len(order) // 32 and all(len(y) == 32 for _, y in batches)
    np.testing.assert_array_equal(np.concatenate([y for _, y in batches]),
                                  data.reference("error", order[:len(batches) * 32])[1])
