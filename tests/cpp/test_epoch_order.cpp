// The epoch order: a permutation that is the same on every machine (golden values), differs per epoch
// and seed, is close to uniform, splits into disjoint shards covering the epoch, and is computed per position
// (EpochOrder) exactly as the materialised order. Mirrors the epoch
// tests in tests/test_windows_batches.py.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <set>
#include <vector>

#include "check.hpp"
#include "npyfeed/common/errors.hpp"
#include "npyfeed/plan/epoch_order.hpp"

using namespace npyfeed;

namespace {

bool is_permutation_of_range(std::vector<std::int64_t> v) {
  std::sort(v.begin(), v.end());
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (v[i] != static_cast<std::int64_t>(i)) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("a permutation of [0, n) for every n") {
  for (std::size_t n : {0u, 1u, 2u, 3u, 10u, 1000u, 4097u}) {
    auto order = epoch_permutation(n, 42, 7);
    CHECK_EQ(order.size(), n);
    CHECK(is_permutation_of_range(order));
  }
}

TEST_CASE("the same on every machine: golden values") {
  // Recorded from this implementation (IndexShuffle: an 8-round Feistel network with cycle walking): a change
  // here reorders every user's epochs.
  CHECK(epoch_permutation(10, 0, 0) == (std::vector<std::int64_t>{8, 2, 7, 3, 0, 1, 4, 6, 9, 5}));
  CHECK(epoch_permutation(10, 12345, 3) == (std::vector<std::int64_t>{7, 5, 3, 8, 9, 1, 4, 2, 0, 6}));
  CHECK(epoch_permutation(10, UINT64_MAX, UINT64_MAX) == (std::vector<std::int64_t>{9, 8, 1, 7, 4, 0, 6, 3, 5, 2}));
}

TEST_CASE("deterministic; different per epoch and per seed") {
  CHECK(epoch_permutation(1000, 5, 1) == epoch_permutation(1000, 5, 1));
  CHECK(epoch_permutation(1000, 5, 1) != epoch_permutation(1000, 5, 2));
  CHECK(epoch_permutation(1000, 5, 1) != epoch_permutation(1000, 6, 1));
}

TEST_CASE("close to uniform: every element equally likely first") {
  // 6000 epochs of 3 elements: each comes first about 2000 times (a biased draw would be far off).
  std::vector<int> first(3, 0);
  for (std::uint64_t epoch = 0; epoch < 6000; ++epoch)
    ++first[static_cast<std::size_t>(epoch_permutation(3, 9, epoch)[0])];
  for (int count : first) CHECK(count > 1800 && count < 2200);
}

TEST_CASE("shards: every num_shards-th id, disjoint, together the whole epoch") {
  for (bool shuffle : {false, true}) {
    for (std::size_t shards : {1u, 2u, 3u, 7u, 11u}) {
      const std::vector<std::int64_t> all = epoch_order(10, shuffle, 3, 4, 1, 0);
      if (shuffle) {
        CHECK(all == epoch_permutation(10, 3, 4));
      } else {
        CHECK(all == (std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
      }
      std::multiset<std::int64_t> seen;
      for (std::size_t k = 0; k < shards; ++k) {
        const std::vector<std::int64_t> shard = epoch_order(10, shuffle, 3, 4, shards, k);
        CHECK_EQ(shard.size(), (10 - std::min<std::size_t>(k, 10) + shards - 1) / shards);
        for (std::size_t i = 0; i < shard.size(); ++i) CHECK_EQ(shard[i], all[k + i * shards]);
        seen.insert(shard.begin(), shard.end());
      }
      CHECK_EQ(seen.size(), 10u);
      CHECK_EQ(std::set<std::int64_t>(seen.begin(), seen.end()).size(), 10u);
    }
  }
  CHECK(epoch_order(0, true, 1, 1, 4, 3).empty());
  CHECK(epoch_order(2, true, 1, 1, 4, 3).empty());  // more shards than samples: the last ones are empty
  CHECK_THROWS(InvalidArgument, epoch_order(10, false, 0, 0, 2, 2));
  CHECK_THROWS(InvalidArgument, epoch_order(10, false, 0, 0, 0, 0));
}

TEST_CASE("EpochOrder per position equals the materialised order; slices clip; explicit orders") {
  for (std::size_t shards : {1u, 3u}) {
    for (std::size_t k = 0; k < shards; ++k) {
      const EpochOrder order(1000, true, 5, 2, shards, k);
      const std::vector<std::int64_t> all = epoch_order(1000, true, 5, 2, shards, k);
      REQUIRE(order.size() == all.size());
      for (std::size_t p = 0; p < all.size(); ++p) CHECK_EQ(order[p], all[p]);
      CHECK(order.slice(order.size() - 2, 10) == std::vector<std::int64_t>(all.end() - 2, all.end()));
      CHECK(order.slice(order.size(), 10).empty());
      CHECK(order.explicit_ids() == nullptr);
    }
  }
  const EpochOrder given(std::vector<std::int64_t>{4, 1, 3});
  CHECK_EQ(given.size(), 3u);
  CHECK(given.slice(1, 5) == (std::vector<std::int64_t>{1, 3}));
  CHECK(given.explicit_ids() != nullptr);
}
