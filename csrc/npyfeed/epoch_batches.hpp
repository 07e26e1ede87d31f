// Random access to the batches of any epoch: "batch b of epoch e" of one shard, gathered on demand. What a
// checkpointable input pipeline needs: its state is two integers, and any batch can be made from them again.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include "npyfeed/aligned_buffer.hpp"
#include "npyfeed/thread_pool.hpp"
#include "npyfeed/window_source.hpp"

namespace npyfeed {

/// The batches of shard `shard_index` of `num_shards` of every epoch (EpochOrder), `batch_size` samples each
/// (the last one smaller unless `drop_remainder`). Holds no per-epoch state: batch b of epoch e is computed
/// from (e, b) alone, so several may be gathered at once, in any order, from any thread. Buffers are recycled
/// (at most `max_kept` kept free) once nobody holds their batch.
class EpochBatches {
 public:
  /// Throws InvalidArgument for a batch_size of 0 or a shard_index outside [0, num_shards).
  EpochBatches(std::shared_ptr<WindowSource> source, bool shuffle, std::uint64_t seed, std::size_t num_shards,
               std::size_t shard_index, std::size_t batch_size, bool drop_remainder, std::size_t max_kept);
  const WindowSource& source() const noexcept { return *source_; }
  /// Batches per epoch.
  std::size_t num_batches() const noexcept { return num_batches_; }
  /// Starts gathering batch `batch` of epoch `epoch`; the batch is complete once the job finished.
  /// Throws IndexOutOfRange unless batch < num_batches().
  std::pair<WindowBatch, std::shared_ptr<Job>> start(std::uint64_t epoch, std::size_t batch);

 private:
  std::shared_ptr<WindowSource> source_;
  bool shuffle_;
  std::uint64_t seed_;
  std::size_t num_shards_;
  std::size_t shard_index_;
  std::size_t batch_size_;
  std::size_t num_batches_ = 0;
  std::shared_ptr<BufferPool> buffers_;
};

}  // namespace npyfeed
