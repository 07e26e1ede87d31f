#include "npyfeed/plan/epoch_order.hpp"

#include <algorithm>
#include <string>

#include "npyfeed/common/errors.hpp"

namespace npyfeed {

EpochOrder::EpochOrder(std::size_t n, bool shuffle, std::uint64_t seed, std::uint64_t epoch, std::size_t num_shards,
                       std::size_t shard_index)
    : num_shards_(num_shards), shard_index_(shard_index) {
  if (num_shards < 1 || shard_index >= num_shards) {
    throw InvalidArgument("shard_index must be in [0, " + std::to_string(num_shards) + "), got " +
                          std::to_string(shard_index));
  }
  size_ = shard_index < n ? (n - shard_index + num_shards - 1) / num_shards : 0;
  if (shuffle) shuffle_.emplace(n, seed, epoch);
}

EpochOrder::EpochOrder(std::vector<std::int64_t> ids) : size_(ids.size()), explicit_(std::move(ids)) {}

EpochOrder::EpochOrder(std::shared_ptr<const std::vector<std::uint32_t>> subset, bool shuffle, std::uint64_t seed,
                       std::uint64_t epoch)
    : size_(subset->size()), subset_(std::move(subset)) {
  if (shuffle) shuffle_.emplace(size_, seed, epoch);
}

std::int64_t EpochOrder::operator[](std::size_t position) const noexcept {
  if (explicit_) return (*explicit_)[position];
  if (subset_) return (*subset_)[shuffle_ ? (*shuffle_)(position) : position];
  const std::uint64_t at = shard_index_ + static_cast<std::uint64_t>(position) * num_shards_;
  return static_cast<std::int64_t>(shuffle_ ? (*shuffle_)(at) : at);
}

std::vector<std::int64_t> EpochOrder::slice(std::size_t first, std::size_t count) const {
  const std::size_t end = first >= size_ ? first : first + std::min(count, size_ - first);
  std::vector<std::int64_t> ids;
  ids.reserve(end - first);
  for (std::size_t p = first; p < end; ++p) ids.push_back((*this)[p]);
  return ids;
}

std::vector<std::int64_t> epoch_permutation(std::size_t n, std::uint64_t seed, std::uint64_t epoch) {
  return EpochOrder(n, true, seed, epoch, 1, 0).slice(0, n);
}

std::vector<std::int64_t> epoch_order(std::size_t n, bool shuffle, std::uint64_t seed, std::uint64_t epoch,
                                      std::size_t num_shards, std::size_t shard_index) {
  const EpochOrder order(n, shuffle, seed, epoch, num_shards, shard_index);
  return order.slice(0, order.size());
}

}  // namespace npyfeed
