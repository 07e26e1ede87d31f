// Random access to the batches of any epoch: "batch b of epoch e" of one shard, gathered on demand. What a
// checkpointable input pipeline needs: its state is two integers, and any batch can be made from them again.
// Asked in order (as a tf.data pipeline asks), the batches can also come from a stream that reads ahead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "npyfeed/aligned_buffer.hpp"
#include "npyfeed/batch_stream.hpp"
#include "npyfeed/stream_at_position.hpp"
#include "npyfeed/thread_pool.hpp"
#include "npyfeed/window_source.hpp"

namespace npyfeed {

/// The batches of shard `shard_index` of `num_shards` of every epoch (EpochOrder), `batch_size` samples each
/// (the last one smaller unless `drop_remainder`). Holds no per-epoch state: batch b of epoch e is computed
/// from (e, b) alone, so several may be gathered at once, in any order, from any thread. Buffers are recycled
/// (at most `max_kept` kept free) once nobody holds their batch.
class EpochBatches {
 public:
  /// Throws InvalidArgument for a batch_size of 0 or a shard_index outside [0, num_shards). `prefetch`: the
  /// batches take() keeps in flight ahead of the one asked for.
  EpochBatches(std::shared_ptr<WindowSource> source, bool shuffle, std::uint64_t seed, std::size_t num_shards,
               std::size_t shard_index, std::size_t batch_size, bool drop_remainder, std::size_t max_kept,
               std::size_t prefetch = 2);
  ~EpochBatches();
  EpochBatches(const EpochBatches&) = delete;
  EpochBatches& operator=(const EpochBatches&) = delete;
  const WindowSource& source() const noexcept { return *source_; }
  /// Batches per epoch.
  std::size_t num_batches() const noexcept { return num_batches_; }
  /// The sample ids of batch `batch` of epoch `epoch`, in batch order. Throws IndexOutOfRange unless
  /// batch < num_batches().
  std::vector<std::int64_t> ids(std::uint64_t epoch, std::size_t batch) const;
  /// Starts gathering batch `batch` of epoch `epoch`; the batch is complete once the job finished.
  /// Throws IndexOutOfRange unless batch < num_batches().
  std::pair<WindowBatch, std::shared_ptr<Job>> start(std::uint64_t epoch, std::size_t batch);
  /// The same batch as start(epoch, batch), complete, from one BatchStream positioned at the next batch
  /// expected: in order, the gathers of the following `prefetch` batches are already in flight (the pool
  /// never waits for the caller, as with the numpy iterator); any other position starts a new stream there.
  /// Calls are served one at a time. Rethrows a failed gather (the next call starts a new stream).
  WindowBatch take(std::uint64_t epoch, std::size_t batch);
  /// Streams take() started so far (for tests).
  std::size_t streams_started() const { return stream_->streams_started(); }
  /// Cancels take()'s read-ahead (and waits for it); a take() waiting meanwhile throws Cancelled. Idempotent;
  /// take() afterwards starts a new stream.
  void close() { stream_->close(); }

 private:
  std::shared_ptr<WindowSource> source_;
  bool shuffle_;
  std::uint64_t seed_;
  std::size_t num_shards_;
  std::size_t shard_index_;
  std::size_t batch_size_;
  bool drop_remainder_;
  std::size_t prefetch_;
  std::size_t num_batches_ = 0;
  std::shared_ptr<BufferPool> buffers_;
  std::unique_ptr<StreamAtPosition<BatchStream>> stream_;  // take()'s
};

}  // namespace npyfeed
