// The order of an epoch read in blocks of files (shuffle="blocks"): a seeded permutation of the keys,
// grouped in that order into blocks whose files fit in half a memory budget (one block is consumed while the
// next is read), each block's samples in a seeded shuffle; the epoch is the blocks one after another, each
// shard a contiguous part of it that starts a block of its own, and ramps up to full blocks (the first batch
// waits for a small block only). A pure function of (samples' keys, file sizes, budget, seed, epoch, number
// of shards): the same on every machine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace npyfeed {

/// Sample ids grouped by key. Where every key's samples are one run of consecutive ids (an index that lists
/// a key's rows together, as the users' files do), only each run's first id is kept; otherwise the ids
/// themselves (CSR: key k's are ids[begin[k], begin[k + 1]), ascending; 4 bytes per sample).
struct SamplesByKey {
  /// `key_of(i)` for i in [0, n) is sample i's key, < num_keys; asked in that order, and a second time in
  /// that order where keys' samples interleave. Throws InvalidArgument for n >= 2^32 (ids are 4 bytes).
  SamplesByKey(std::size_t num_keys, std::size_t n, const std::function<std::uint32_t(std::size_t)>& key_of);
  std::size_t num_keys() const noexcept { return begin.size() - 1; }
  std::size_t count(std::size_t key) const noexcept { return begin[key + 1] - begin[key]; }
  /// Key k's sample ids, ascending, appended to `out`.
  void append_ids(std::size_t key, std::vector<std::uint32_t>& out) const;
  /// Whether the ids are kept as runs (no per-sample memory).
  bool runs() const noexcept { return ids.empty(); }

  std::vector<std::uint64_t> begin;
  std::vector<std::uint32_t> run_first;  // with runs: key k's ids are run_first[k] + [0, count(k))
  std::vector<std::uint32_t> ids;        // without: key k's ids are ids[begin[k], begin[k + 1])
};

/// Blocks with a smaller cap after each shard start (memory_budget / 2 >> (kRampBlocks - j) for block j).
inline constexpr std::size_t kRampBlocks = 3;

/// One epoch's blocks, and the positions [first, end) of that epoch that one shard reads.
struct BlockPlan {
  std::vector<std::uint32_t> keys;         // keys with samples, in the epoch's (permuted) order
  std::vector<std::size_t> key_begin;      // block b holds keys[key_begin[b], key_begin[b + 1])
  std::vector<std::uint64_t> block_begin;  // block b holds epoch positions [block_begin[b], block_begin[b + 1])
  std::vector<std::uint64_t> block_bytes;  // bytes of block b's files
  std::uint64_t seed = 0;
  std::uint64_t epoch = 0;
  std::uint64_t first = 0;  // this shard's positions
  std::uint64_t end = 0;

  std::size_t num_blocks() const noexcept { return block_bytes.size(); }
  std::uint64_t shard_size() const noexcept { return end - first; }
  /// The block holding epoch position `position` (< block_begin.back()).
  std::size_t block_of(std::uint64_t position) const;
};

/// Plans one epoch. Keys (those with samples) are permuted with IndexShuffle(keys, seed, epoch) and cut into
/// blocks greedily: a key joins the current block while the block's bytes (`key_bytes`, the factor plus label
/// files to read) stay within its cap; a key larger than that forms a block of its own. Shard i of N takes
/// the contiguous positions [s_i, s_i + c_i) where c_i = n / N + (i < n % N): the same sizes as an
/// every-N-th split, but each shard reads only about 1/N of the files (plus the first block of the next
/// shard, for the key they share). The key holding s_i starts a new block, and where a shard's share of the
/// bytes is more than one block, the caps ramp up from there: memory_budget / 16, / 8, / 4, then / 2 for
/// every further block (kRampBlocks), so a shard's first batch waits for an eighth of a full block.
/// Throws InvalidArgument unless 0 <= shard_index < num_shards and memory_budget > 0.
BlockPlan plan_blocks(const SamplesByKey& samples, const std::vector<std::uint64_t>& key_bytes,
                      std::uint64_t memory_budget, std::uint64_t seed, std::uint64_t epoch, std::size_t num_shards,
                      std::size_t shard_index);

/// Block `block`'s samples in epoch order: its keys' samples (key by key) permuted by
/// IndexShuffle(count, seed, stream) with a stream derived from (epoch, block).
std::vector<std::int64_t> block_samples(const BlockPlan& plan, const SamplesByKey& samples, std::size_t block);

/// The shard's whole order, materialised (for `WindowSource.epoch_order` and tests).
std::vector<std::int64_t> block_epoch_order(const BlockPlan& plan, const SamplesByKey& samples);

}  // namespace npyfeed
