// What decides the batches of one shard in every epoch, checked once: the order (Shuffle), the sharding
// (ShardBy), the batch size and remainder, and the geometry every consumer cuts batches with (how many a shard's
// epoch has, and which positions each holds). EpochPlan (epoch_plan.hpp) answers for it; the streams and
// DeviceRows cut their batches with it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace npyfeed {

/// How an epoch's samples are ordered: as the index lists them, a seeded permutation of all of them
/// (epoch_order.hpp), or blocks of files read whole (block_order.hpp).
enum class Shuffle { kNone, kGlobal, kBlocks };

/// Parses "none" / "global" / "blocks". Throws InvalidArgument.
Shuffle parse_shuffle(const std::string& name);

/// How an epoch is split between shards: every num_shards-th sample of the epoch's order (each shard reads
/// from every key), or whole keys (each shard reads only its own keys' files: a tenth of the data for one of
/// ten processes), balanced by sample count.
enum class ShardBy { kSamples, kKeys };

/// Parses "samples" / "keys". Throws InvalidArgument.
ShardBy parse_shard_by(const std::string& name);

/// Everything that decides the batches of one shard in every epoch.
struct EpochSpec {
  Shuffle shuffle = Shuffle::kNone;
  std::uint64_t seed = 0;  // 0 unless shuffling (any seed gives the same unshuffled order)
  std::size_t num_shards = 1;
  std::size_t shard_index = 0;
  std::size_t batch_size = 1;
  bool drop_remainder = false;
  std::uint64_t memory_budget = 0;  // bytes of array data held at once (kBlocks only; it decides the order)
  ShardBy shard_by = ShardBy::kSamples;

  /// Throws InvalidArgument for a batch_size of 0, a num_shards of 0, a shard_index outside
  /// [0, num_shards), (kBlocks) a memory_budget of 0, and kKeys with kBlocks (blocks already give each shard
  /// a contiguous run of keys).
  EpochSpec(Shuffle shuffle, std::uint64_t seed, std::size_t num_shards, std::size_t shard_index,
            std::size_t batch_size, bool drop_remainder, std::uint64_t memory_budget,
            ShardBy shard_by = ShardBy::kSamples);
  /// Samples this shard reads per epoch out of `n`, sharded by samples: every order gives shard i of N the
  /// same count, n / N + (i < n % N). (By keys, it is the shard's keys' samples: EpochPlan::shard_size().)
  std::size_t shard_size(std::size_t n) const noexcept;
  /// Batches per epoch for a shard of `samples` samples (the last one smaller unless drop_remainder).
  std::size_t num_batches(std::size_t samples) const noexcept;
  /// Positions [first, end) of batch `batch` (< num_batches(samples)) in the shard's epoch order of `samples`
  /// samples: batch_size each, the last one what is left. Every stream and DeviceRows cut batches with it.
  std::pair<std::uint64_t, std::uint64_t> batch_positions(std::size_t batch, std::uint64_t samples) const noexcept;
};

}  // namespace npyfeed
