#include "npyfeed/plan/epoch_spec.hpp"

#include <algorithm>

#include "npyfeed/common/errors.hpp"

namespace npyfeed {

Shuffle parse_shuffle(const std::string& name) {
  if (name == "none") return Shuffle::kNone;
  if (name == "global") return Shuffle::kGlobal;
  if (name == "blocks") return Shuffle::kBlocks;
  throw InvalidArgument("shuffle must be 'none', 'global' or 'blocks', got '" + name + "'");
}

ShardBy parse_shard_by(const std::string& name) {
  if (name == "samples") return ShardBy::kSamples;
  if (name == "keys") return ShardBy::kKeys;
  throw InvalidArgument("shard_by must be 'samples' or 'keys', got '" + name + "'");
}

EpochSpec::EpochSpec(Shuffle shuffle_, std::uint64_t seed_, std::size_t num_shards_, std::size_t shard_index_,
                     std::size_t batch_size_, bool drop_remainder_, std::uint64_t memory_budget_, ShardBy shard_by_)
    : shuffle(shuffle_),
      seed(shuffle_ == Shuffle::kNone ? 0 : seed_),
      num_shards(num_shards_),
      shard_index(shard_index_),
      batch_size(batch_size_),
      drop_remainder(drop_remainder_),
      memory_budget(shuffle_ == Shuffle::kBlocks ? memory_budget_ : 0),
      shard_by(shard_by_) {
  if (batch_size == 0) throw InvalidArgument("batch_size must be a positive integer, got 0");
  if (num_shards == 0) throw InvalidArgument("num_shards must be a positive integer, got 0");
  if (shard_index >= num_shards) {
    throw InvalidArgument("shard_index must be in [0, " + std::to_string(num_shards) + "), got " +
                          std::to_string(shard_index));
  }
  if (shuffle == Shuffle::kBlocks && memory_budget == 0) {
    throw InvalidArgument("memory_budget must be a positive number of bytes, got 0");
  }
  if (shuffle == Shuffle::kBlocks && shard_by == ShardBy::kKeys) {
    throw InvalidArgument(
        "shard_by='keys' does not combine with shuffle='blocks': blocks already give each shard a contiguous run "
        "of keys (a new one each epoch)");
  }
}

std::size_t EpochSpec::shard_size(std::size_t n) const noexcept {
  return n / num_shards + (shard_index < n % num_shards ? 1 : 0);
}

std::size_t EpochSpec::num_batches(std::size_t samples) const noexcept {
  return drop_remainder ? samples / batch_size : samples / batch_size + (samples % batch_size != 0 ? 1 : 0);
}

std::pair<std::uint64_t, std::uint64_t> EpochSpec::batch_positions(std::size_t batch,
                                                                   std::uint64_t samples) const noexcept {
  const std::uint64_t first = static_cast<std::uint64_t>(batch) * batch_size;
  return {first, std::min<std::uint64_t>(first + batch_size, samples)};
}

}  // namespace npyfeed
