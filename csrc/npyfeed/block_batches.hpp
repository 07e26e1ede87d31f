// Random access to the batches of any epoch under shuffle="blocks": "batch b of epoch e" of one shard, as
// EpochBatches gives it for the other modes (npyfeed.tf's checkpointable pipeline asks by position). A blocks
// epoch can only be read in order, so the batches come from one BlockStream, positioned at the next batch
// expected: asking for exactly that batch takes it from the stream (which reads ahead within the budget); any
// other position (a restored checkpoint, a new epoch, a jump) closes the stream and starts a new one there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "npyfeed/block_stream.hpp"
#include "npyfeed/stream_at_position.hpp"
#include "npyfeed/window_source.hpp"

namespace npyfeed {

/// The batches of shard `shard_index` of `num_shards` of every blocks epoch (block_order.hpp), `batch_size`
/// samples each (the last one smaller unless `drop_remainder`); batch b of epoch e is the b-th batch of
/// BlockStream(source, memory_budget, seed, e, ...), whatever was asked before. Thread-safe: calls are served
/// one at a time. In order, each batch costs what the stream's costs; any other position costs a new stream
/// (reading that batch's block again). Memory: one stream's (BlockStream), `prefetch` batches read ahead.
class BlockBatches {
 public:
  /// Throws InvalidArgument for a batch_size or memory_budget of 0 or a shard_index outside [0, num_shards),
  /// and for 2^32 samples or more.
  BlockBatches(std::shared_ptr<WindowSource> source, std::uint64_t memory_budget, std::uint64_t seed,
               std::size_t num_shards, std::size_t shard_index, std::size_t batch_size, bool drop_remainder,
               std::size_t prefetch);
  ~BlockBatches();
  BlockBatches(const BlockBatches&) = delete;
  BlockBatches& operator=(const BlockBatches&) = delete;

  const WindowSource& source() const noexcept { return *source_; }
  /// Batches per epoch.
  std::size_t num_batches() const noexcept { return num_batches_; }
  /// Batch `batch` of epoch `epoch`, complete (waits for its reads and its gather). Throws IndexOutOfRange
  /// unless batch < num_batches(); rethrows a failed read or gather (the next call starts a new stream).
  WindowBatch take(std::uint64_t epoch, std::size_t batch);
  /// Streams started so far (the first, and one per position that was not the next one; for tests).
  std::size_t streams_started() const { return stream_->streams_started(); }
  /// Closes the stream (cancels its reads); a take() waiting meanwhile throws Cancelled. take() afterwards
  /// starts a new one.
  void close() { stream_->close(); }

 private:
  std::shared_ptr<WindowSource> source_;
  std::uint64_t memory_budget_;
  std::uint64_t seed_;
  std::size_t num_shards_;
  std::size_t shard_index_;
  std::size_t batch_size_;
  bool drop_remainder_;
  std::size_t prefetch_;
  std::size_t num_batches_ = 0;
  std::unique_ptr<StreamAtPosition<BlockStream>> stream_;
};

}  // namespace npyfeed
