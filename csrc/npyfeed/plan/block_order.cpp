#include "npyfeed/plan/block_order.hpp"

#include <algorithm>
#include <string>

#include "npyfeed/common/errors.hpp"
#include "npyfeed/plan/index_shuffle.hpp"

namespace npyfeed {

namespace {

// Seeds the in-block shuffles apart from the key permutation (which uses (seed, epoch) itself).
constexpr std::uint64_t kBlockSeedSalt = 0xB10C5A17ED5EED01ull;

std::uint64_t block_stream_id(std::uint64_t epoch, std::size_t block) {
  // Distinct (epoch, block) pairs give distinct streams for any realistic number of blocks (< 2^32).
  return (epoch << 32) ^ (epoch >> 32) ^ (static_cast<std::uint64_t>(block) * 0x9E3779B97F4A7C15ull);
}

}  // namespace

SamplesByKey::SamplesByKey(std::size_t num_keys, std::size_t n, const std::function<std::uint32_t(std::size_t)>& key_of)
    : begin(num_keys + 1, 0), run_first(num_keys, 0) {
  if (n >= (std::uint64_t{1} << 32)) {
    throw InvalidArgument("shuffle='blocks' supports fewer than 2^32 samples, got " + std::to_string(n));
  }
  // One pass counts, and checks whether each key's samples are one run (no key seen again after another's).
  bool one_run_each = true;
  std::uint32_t previous = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t key = key_of(i);
    if (begin[key + 1]++ == 0) {
      run_first[key] = static_cast<std::uint32_t>(i);
    } else if (previous != key) {
      one_run_each = false;
    }
    previous = key;
  }
  for (std::size_t k = 0; k < num_keys; ++k) begin[k + 1] += begin[k];
  if (one_run_each) return;
  run_first = {};
  ids.resize(n);
  std::vector<std::uint64_t> at(begin.begin(), begin.end() - 1);
  for (std::size_t i = 0; i < n; ++i) ids[at[key_of(i)]++] = static_cast<std::uint32_t>(i);
}

void SamplesByKey::append_ids(std::size_t key, std::vector<std::uint32_t>& out) const {
  if (ids.empty()) {
    for (std::uint64_t j = 0; j < count(key); ++j) out.push_back(run_first[key] + static_cast<std::uint32_t>(j));
    return;
  }
  out.insert(out.end(), ids.begin() + static_cast<std::ptrdiff_t>(begin[key]),
             ids.begin() + static_cast<std::ptrdiff_t>(begin[key + 1]));
}

std::size_t BlockPlan::block_of(std::uint64_t position) const {
  auto it = std::upper_bound(block_begin.begin(), block_begin.end(), position);
  return static_cast<std::size_t>(it - block_begin.begin()) - 1;
}

BlockPlan plan_blocks(const SamplesByKey& samples, const std::vector<std::uint64_t>& key_bytes,
                      std::uint64_t memory_budget, std::uint64_t seed, std::uint64_t epoch, std::size_t num_shards,
                      std::size_t shard_index) {
  if (num_shards < 1 || shard_index >= num_shards) {
    throw InvalidArgument("shard_index must be in [0, " + std::to_string(num_shards) + "), got " +
                          std::to_string(shard_index));
  }
  if (memory_budget == 0) throw InvalidArgument("memory_budget must be at least 1 byte");
  if (key_bytes.size() != samples.num_keys()) throw InvalidArgument("one byte count per key is needed");
  BlockPlan plan;
  plan.seed = seed;
  plan.epoch = epoch;
  const std::size_t num_keys = samples.num_keys();
  const IndexShuffle key_order(num_keys, seed, epoch);
  for (std::size_t p = 0; p < num_keys; ++p) {
    const auto key = static_cast<std::uint32_t>(key_order(p));
    if (samples.count(key) > 0) plan.keys.push_back(key);  // a key without samples is never read
  }
  std::uint64_t n = 0, total_bytes = 0;
  for (const std::uint32_t key : plan.keys) {
    n += samples.count(key);
    total_bytes += key_bytes[key];
  }
  // Shard i's positions start at s_i = i * q + min(i, r).
  const std::uint64_t q = n / num_shards;
  const std::uint64_t r = n % num_shards;
  auto shard_start = [&](std::uint64_t i) { return i * q + std::min<std::uint64_t>(i, r); };
  plan.first = shard_start(shard_index);
  plan.end = plan.first + q + (shard_index < r ? 1 : 0);

  const std::uint64_t half = std::max<std::uint64_t>(memory_budget / 2, 1);
  // Ramp up after each shard start only where a shard's share is more than one full block: a data set that
  // fits stays one block (the best mix).
  const bool ramp = total_bytes / num_shards > half;
  std::uint64_t position = 0;
  std::uint64_t next_shard = 1;  // the next shard start not yet placed
  std::size_t since_start = 0;   // blocks since the current block's shard start
  std::uint64_t cap = half;
  for (std::size_t i = 0; i < plan.keys.size(); ++i) {
    const std::uint32_t key = plan.keys[i];
    const std::uint64_t count = samples.count(key);
    bool starts_shard = i == 0;
    for (; next_shard < num_shards && shard_start(next_shard) < position + count; ++next_shard) starts_shard = true;
    const bool fits = !starts_shard && plan.block_bytes.back() + key_bytes[key] <= cap;
    if (!fits) {
      since_start = starts_shard ? 0 : since_start + 1;
      cap = ramp && since_start < kRampBlocks ? std::max<std::uint64_t>(half >> (kRampBlocks - since_start), 1) : half;
      plan.key_begin.push_back(i);
      plan.block_begin.push_back(position);
      plan.block_bytes.push_back(0);
    }
    plan.block_bytes.back() += key_bytes[key];
    position += count;
  }
  plan.key_begin.push_back(plan.keys.size());
  plan.block_begin.push_back(position);
  return plan;
}

std::vector<std::int64_t> block_samples(const BlockPlan& plan, const SamplesByKey& samples, std::size_t block) {
  std::vector<std::uint32_t> grouped;
  grouped.reserve(plan.block_begin[block + 1] - plan.block_begin[block]);
  for (std::size_t i = plan.key_begin[block]; i < plan.key_begin[block + 1]; ++i)
    samples.append_ids(plan.keys[i], grouped);
  const IndexShuffle shuffle(grouped.size(), plan.seed ^ kBlockSeedSalt, block_stream_id(plan.epoch, block));
  std::vector<std::int64_t> out(grouped.size());
  for (std::size_t j = 0; j < grouped.size(); ++j) out[j] = grouped[shuffle(j)];
  return out;
}

std::vector<std::int64_t> block_epoch_order(const BlockPlan& plan, const SamplesByKey& samples) {
  std::vector<std::int64_t> order;
  order.reserve(plan.shard_size());
  if (plan.first >= plan.end) return order;
  for (std::size_t b = plan.block_of(plan.first); b < plan.num_blocks() && plan.block_begin[b] < plan.end; ++b) {
    const std::vector<std::int64_t> ids = block_samples(plan, samples, b);
    const std::uint64_t lo = std::max(plan.first, plan.block_begin[b]) - plan.block_begin[b];
    const std::uint64_t hi = std::min(plan.end, plan.block_begin[b + 1]) - plan.block_begin[b];
    order.insert(order.end(), ids.begin() + static_cast<std::ptrdiff_t>(lo),
                 ids.begin() + static_cast<std::ptrdiff_t>(hi));
  }
  return order;
}

}  // namespace npyfeed
