// The order of samples in an epoch: a seeded permutation that is the same on every machine, split into
// disjoint shards (one per worker), and evaluated position by position in O(1) memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "npyfeed/plan/index_shuffle.hpp"

namespace npyfeed {

/// The sample ids of one epoch for one shard. Position p of shard `shard_index` of `num_shards` is element
/// shard_index + p * num_shards of the epoch: IndexShuffle(n, seed, epoch) with `shuffle`, the identity without.
/// Shards are disjoint and together cover the epoch once. Holds no per-sample state (a shuffled epoch of 66M
/// samples costs nothing to set up and no memory); or, built from a vector, an explicit order.
class EpochOrder {
 public:
  /// Throws InvalidArgument unless 0 <= shard_index < num_shards.
  EpochOrder(std::size_t n, bool shuffle, std::uint64_t seed, std::uint64_t epoch, std::size_t num_shards,
             std::size_t shard_index);
  /// An explicit order of sample ids (checked by whoever gathers them).
  EpochOrder(std::vector<std::int64_t> ids);  // NOLINT: implicit on purpose, an order is its ids
  /// The ids of `subset` (a shard's own samples, e.g. whole keys), in its order, or with `shuffle` permuted by
  /// IndexShuffle(subset size, seed, epoch). Holds no per-sample state of its own (the subset is shared).
  EpochOrder(std::shared_ptr<const std::vector<std::uint32_t>> subset, bool shuffle, std::uint64_t seed,
             std::uint64_t epoch);

  std::size_t size() const noexcept { return size_; }
  std::int64_t operator[](std::size_t position) const noexcept;
  /// Ids at positions [first, first + count), clipped to size().
  std::vector<std::int64_t> slice(std::size_t first, std::size_t count) const;
  /// The explicit ids, or null for a computed order.
  const std::vector<std::int64_t>* explicit_ids() const noexcept { return explicit_ ? &*explicit_ : nullptr; }

 private:
  std::size_t size_ = 0;
  std::size_t num_shards_ = 1;
  std::size_t shard_index_ = 0;
  std::optional<IndexShuffle> shuffle_;
  std::optional<std::vector<std::int64_t>> explicit_;
  std::shared_ptr<const std::vector<std::uint32_t>> subset_;
};

/// A seeded permutation of [0, n), whole: EpochOrder(n, true, seed, epoch, 1, 0) materialised.
std::vector<std::int64_t> epoch_permutation(std::size_t n, std::uint64_t seed, std::uint64_t epoch);

/// EpochOrder(...) materialised (for callers that want every id, such as `WindowSource.epoch_order`).
std::vector<std::int64_t> epoch_order(std::size_t n, bool shuffle, std::uint64_t seed, std::uint64_t epoch,
                                      std::size_t num_shards, std::size_t shard_index);

}  // namespace npyfeed
