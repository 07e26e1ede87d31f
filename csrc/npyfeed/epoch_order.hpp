// The order of samples in an epoch: a seeded permutation that is the same on every machine, and its
// split into disjoint shards (one per worker).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace npyfeed {

/// A seeded permutation of [0, n): identical for the same (n, seed, epoch) on any machine
/// (splitmix64-seeded xoshiro256** with Lemire's unbiased bounded draws, Fisher-Yates).
std::vector<std::int64_t> epoch_permutation(std::size_t n, std::uint64_t seed, std::uint64_t epoch);

/// Sample ids of one epoch for shard `shard_index` of `num_shards`: the permutation (or 0..n-1 without
/// `shuffle`), then every num_shards-th id from shard_index on. Shards are disjoint and together cover
/// the epoch once. Throws InvalidArgument unless 0 <= shard_index < num_shards.
std::vector<std::int64_t> epoch_order(std::size_t n, bool shuffle, std::uint64_t seed, std::uint64_t epoch,
                                      std::size_t num_shards, std::size_t shard_index);

}  // namespace npyfeed
