// The blocks order (shuffle="blocks"): every sample once per epoch, blocks within half the budget (a larger
// key alone), same arguments the same order, another epoch another order, contiguous shards that are
// disjoint, cover the epoch and differ in size by at most one. Mirrors tests/test_blocks.py.
#include <algorithm>
#include <cstdint>
#include <set>
#include <vector>

#include "check.hpp"
#include "npyfeed/block_order.hpp"
#include "npyfeed/errors.hpp"

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

SamplesByKey by_key(const Data& d) {
  return SamplesByKey(20, d.key_of.size(), [&](std::size_t i) { return d.key_of[i]; });
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

TEST_CASE("blocks: samples grouped by key") {
  const Data d = make_data();
  const SamplesByKey s = by_key(d);
  CHECK_EQ(s.ids.size(), d.key_of.size());
  for (std::uint32_t k = 0; k < 20; ++k) {
    CHECK_EQ(s.count(k), static_cast<std::size_t>(k % 7));
    for (std::uint64_t i = s.begin[k]; i < s.begin[k + 1]; ++i) CHECK_EQ(d.key_of[s.ids[i]], k);
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

TEST_CASE("blocks: shards are contiguous, disjoint, cover the epoch, sizes within one") {
  const Data d = make_data();
  const SamplesByKey s = by_key(d);
  const auto whole = block_epoch_order(plan_blocks(s, d.bytes, 1000, 9, 1, 1, 0), s);
  for (std::size_t shards : {1u, 2u, 3u, 7u, 200u}) {
    std::vector<std::int64_t> joined;
    std::size_t smallest = SIZE_MAX, largest = 0;
    for (std::size_t i = 0; i < shards; ++i) {
      const BlockPlan plan = plan_blocks(s, d.bytes, 1000, 9, 1, shards, i);
      const auto part = block_epoch_order(plan, s);
      CHECK_EQ(part.size(), plan.shard_size());
      // The same sizes as an every-n-th split: ceil((n - i) / shards).
      const std::size_t n = whole.size();
      CHECK_EQ(part.size(), i < n ? (n - i + shards - 1) / shards : 0u);
      smallest = std::min(smallest, part.size());
      largest = std::max(largest, part.size());
      joined.insert(joined.end(), part.begin(), part.end());
    }
    CHECK(joined == whole);
    CHECK(largest - smallest <= 1);
  }
  CHECK_THROWS(InvalidArgument, plan_blocks(s, d.bytes, 1000, 9, 1, 2, 2));
  CHECK_THROWS(InvalidArgument, plan_blocks(s, d.bytes, 0, 9, 1, 1, 0));
}

TEST_CASE("blocks: an empty data set") {
  const SamplesByKey s(3, 0, [](std::size_t) { return 0u; });
  const BlockPlan plan = plan_blocks(s, {1, 2, 3}, 100, 0, 0, 2, 1);
  CHECK_EQ(plan.num_blocks(), 0u);
  CHECK(block_epoch_order(plan, s).empty());
}
