// The blocks order (shuffle="blocks"): samples grouped by key (as runs or as ids), every sample once per
// epoch, blocks within their caps (a larger key alone; smaller caps after each shard start), same arguments
// the same order, another epoch another order, contiguous shards that are disjoint, cover the epoch, differ
// in size by at most one and start blocks of their own. Mirrors tests/test_blocks.py.
#include <algorithm>
#include <cstdint>
#include <set>
#include <vector>

#include "check.hpp"
#include "npyfeed/common/errors.hpp"
#include "npyfeed/plan/block_order.hpp"

using namespace npyfeed;

namespace {

// 20 keys, key k has k % 7 samples (some none), interleaved as an index may list them.
struct Data {
  std::vector<std::uint32_t> key_of;
  std::vector<std::uint64_t> bytes;
};

Data make_data() {
  Data d;
  for (std::uint32_t round = 0; round < 7; ++round) {
    for (std::uint32_t k = 0; k < 20; ++k) {
      if (round < k % 7) d.key_of.push_back(k);
    }
  }
  for (std::uint32_t k = 0; k < 20; ++k) d.bytes.push_back(100 + 10 * k);
  d.bytes[13] = 5000;  // larger than half of every budget below
  return d;
}

// 64 keys of 100 bytes and 5 samples each, listed key after key (as the users' index files do).
Data make_grouped_data() {
  Data d;
  for (std::uint32_t k = 0; k < 64; ++k) {
    for (int j = 0; j < 5; ++j) d.key_of.push_back(k);
    d.bytes.push_back(100);
  }
  return d;
}

SamplesByKey by_key(const Data& d) {
  return SamplesByKey(d.bytes.size(), d.key_of.size(), [&](std::size_t i) { return d.key_of[i]; });
}

bool is_permutation_of_range(std::vector<std::int64_t> v, std::size_t n) {
  std::sort(v.begin(), v.end());
  if (v.size() != n) return false;
  for (std::size_t i = 0; i < n; ++i) {
    if (v[i] != static_cast<std::int64_t>(i)) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("blocks: samples grouped by key, as ids (keys interleaved) or runs (keys one after another)") {
  Data reversed = make_grouped_data();  // runs, in another order than the keys' numbers
  std::reverse(reversed.key_of.begin(), reversed.key_of.end());
  const std::vector<std::pair<Data, bool>> cases = {
      {make_data(), false}, {make_grouped_data(), true}, {reversed, true}};
  for (const auto& [d, runs] : cases) {
    const SamplesByKey s = by_key(d);
    CHECK_EQ(s.runs(), runs);
    CHECK_EQ(s.ids.size(), s.runs() ? 0u : d.key_of.size());
    for (std::uint32_t k = 0; k < d.bytes.size(); ++k) {
      std::vector<std::uint32_t> want, got;
      for (std::uint32_t i = 0; i < d.key_of.size(); ++i) {
        if (d.key_of[i] == k) want.push_back(i);
      }
      s.append_ids(k, got);
      CHECK(got == want);
      CHECK_EQ(s.count(k), want.size());
    }
  }
}

TEST_CASE("blocks: every sample exactly once, blocks within half the budget") {
  const Data d = make_data();
  const SamplesByKey s = by_key(d);
  for (std::uint64_t budget : {1ull, 600ull, 1000ull, 3000ull, 1ull << 40}) {
    const BlockPlan plan = plan_blocks(s, d.bytes, budget, 5, 2, 1, 0);
    CHECK(is_permutation_of_range(block_epoch_order(plan, s), d.key_of.size()));
    CHECK_EQ(plan.first, 0u);
    CHECK_EQ(plan.end, d.key_of.size());
    for (std::size_t b = 0; b < plan.num_blocks(); ++b) {
      const std::size_t keys = plan.key_begin[b + 1] - plan.key_begin[b];
      CHECK(keys >= 1);
      CHECK(plan.block_bytes[b] <= std::max<std::uint64_t>(budget / 2, 1) || keys == 1);
      // Each block's samples are exactly its keys' samples.
      const auto ids = block_samples(plan, s, b);
      CHECK_EQ(ids.size(), plan.block_begin[b + 1] - plan.block_begin[b]);
      std::set<std::uint32_t> block_keys(plan.keys.begin() + static_cast<std::ptrdiff_t>(plan.key_begin[b]),
                                         plan.keys.begin() + static_cast<std::ptrdiff_t>(plan.key_begin[b + 1]));
      for (auto id : ids) CHECK(block_keys.count(d.key_of[static_cast<std::size_t>(id)]) == 1);
    }
    // Keys without samples are never read.
    for (auto k : plan.keys) CHECK(k % 7 != 0);
  }
  // A budget that holds everything is one block; budget 1 is one key per block.
  CHECK_EQ(plan_blocks(s, d.bytes, 1ull << 40, 5, 2, 1, 0).num_blocks(), 1u);
  CHECK_EQ(plan_blocks(s, d.bytes, 1, 5, 2, 1, 0).num_blocks(), 17u);
}

TEST_CASE("blocks: deterministic per (seed, epoch, budget); epochs and seeds differ") {
  const Data d = make_data();
  const SamplesByKey s = by_key(d);
  auto order = [&](std::uint64_t seed, std::uint64_t epoch, std::uint64_t budget) {
    return block_epoch_order(plan_blocks(s, d.bytes, budget, seed, epoch, 1, 0), s);
  };
  CHECK(order(5, 2, 1000) == order(5, 2, 1000));
  CHECK(order(5, 2, 1000) != order(5, 3, 1000));
  CHECK(order(5, 2, 1000) != order(6, 2, 1000));
  CHECK(order(5, 2, 1000) != order(5, 2, 3000));
  // Not the source order, even with everything in one block.
  std::vector<std::int64_t> identity(d.key_of.size());
  for (std::size_t i = 0; i < identity.size(); ++i) identity[i] = static_cast<std::int64_t>(i);
  CHECK(order(5, 2, 1ull << 40) != identity);
}

TEST_CASE("blocks: shards are contiguous, disjoint, cover the epoch, sizes within one, start blocks") {
  for (const Data& d : {make_data(), make_grouped_data()}) {
    const SamplesByKey s = by_key(d);
    const std::size_t n = d.key_of.size();
    for (std::size_t shards : {1u, 2u, 3u, 7u, 200u}) {
      // The epoch for this number of shards: the same plan with every position.
      BlockPlan all = plan_blocks(s, d.bytes, 1000, 9, 1, shards, 0);
      all.first = 0;
      all.end = n;
      const auto whole = block_epoch_order(all, s);
      CHECK(is_permutation_of_range(whole, n));
      std::vector<std::int64_t> joined;
      std::size_t smallest = SIZE_MAX, largest = 0;
      for (std::size_t i = 0; i < shards; ++i) {
        const BlockPlan plan = plan_blocks(s, d.bytes, 1000, 9, 1, shards, i);
        CHECK(plan.block_begin == all.block_begin);  // one plan, whichever shard asks
        const auto part = block_epoch_order(plan, s);
        CHECK_EQ(part.size(), plan.shard_size());
        // The same sizes as an every-n-th split: ceil((n - i) / shards).
        CHECK_EQ(part.size(), i < n ? (n - i + shards - 1) / shards : 0u);
        smallest = std::min(smallest, part.size());
        largest = std::max(largest, part.size());
        joined.insert(joined.end(), part.begin(), part.end());
        if (plan.first < plan.end) {
          // The shard's first block starts with the key holding its first position.
          const std::size_t b = plan.block_of(plan.first);
          CHECK(plan.block_begin[b] + s.count(plan.keys[plan.key_begin[b]]) > plan.first);
        }
      }
      CHECK(joined == whole);
      CHECK(largest - smallest <= 1);
    }
  }
  const Data d = make_data();
  const SamplesByKey s = by_key(d);
  CHECK_THROWS(InvalidArgument, plan_blocks(s, d.bytes, 1000, 9, 1, 2, 2));
  CHECK_THROWS(InvalidArgument, plan_blocks(s, d.bytes, 0, 9, 1, 1, 0));
}

TEST_CASE("blocks: smaller blocks after each shard start, where a shard holds more than one block") {
  const Data d = make_grouped_data();  // 64 keys of 100 bytes
  const SamplesByKey s = by_key(d);
  auto keys_per_block = [&](const BlockPlan& plan) {
    std::vector<std::size_t> keys;
    for (std::size_t b = 0; b < plan.num_blocks(); ++b) keys.push_back(plan.key_begin[b + 1] - plan.key_begin[b]);
    return keys;
  };
  // Budget 2000: full blocks of 1000 bytes (10 keys), ramping up from 125, 250, 500 bytes (1, 2, 5 keys).
  CHECK(keys_per_block(plan_blocks(s, d.bytes, 2000, 3, 0, 1, 0)) ==
        std::vector<std::size_t>({1, 2, 5, 10, 10, 10, 10, 10, 6}));
  // Two shards of 32 keys each (160 samples): the ramp again from the second shard's first key.
  CHECK(keys_per_block(plan_blocks(s, d.bytes, 2000, 3, 0, 2, 0)) ==
        std::vector<std::size_t>({1, 2, 5, 10, 10, 4, 1, 2, 5, 10, 10, 4}));
  // A shard that fits in one block is one block: the whole data set (6,400 bytes) in a budget of 12,800;
  // 2 shards of 3,200 bytes in a budget of 6,400.
  CHECK(keys_per_block(plan_blocks(s, d.bytes, 12800, 3, 0, 1, 0)) == std::vector<std::size_t>({64}));
  CHECK(keys_per_block(plan_blocks(s, d.bytes, 6400, 3, 0, 2, 0)) == std::vector<std::size_t>({32, 32}));
  // Every block within its cap (half the budget >> 3, 2, 1, 0 after a shard start), a larger key alone.
  const Data mixed = make_data();
  const SamplesByKey ms = by_key(mixed);
  for (std::uint64_t budget : {600ull, 1000ull, 3000ull}) {
    const BlockPlan plan = plan_blocks(ms, mixed.bytes, budget, 5, 2, 1, 0);
    for (std::size_t b = 0; b < plan.num_blocks(); ++b) {
      const std::uint64_t cap = (budget / 2) >> (b < kRampBlocks ? kRampBlocks - b : 0);
      CHECK(plan.block_bytes[b] <= cap || plan.key_begin[b + 1] - plan.key_begin[b] == 1);
    }
  }
}

TEST_CASE("blocks: an empty data set") {
  const SamplesByKey s(3, 0, [](std::size_t) { return 0u; });
  const BlockPlan plan = plan_blocks(s, {1, 2, 3}, 100, 0, 0, 2, 1);
  CHECK_EQ(plan.num_blocks(), 0u);
  CHECK(block_epoch_order(plan, s).empty());
}
