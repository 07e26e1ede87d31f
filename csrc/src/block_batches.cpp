#include "npyfeed/block_batches.hpp"

#include <string>

#include "npyfeed/errors.hpp"

namespace npyfeed {

BlockBatches::BlockBatches(std::shared_ptr<WindowSource> source, std::uint64_t memory_budget, std::uint64_t seed,
                           std::size_t num_shards, std::size_t shard_index, std::size_t batch_size, bool drop_remainder,
                           std::size_t prefetch)
    : source_(std::move(source)),
      memory_budget_(memory_budget),
      seed_(seed),
      num_shards_(num_shards),
      shard_index_(shard_index),
      batch_size_(batch_size),
      drop_remainder_(drop_remainder),
      prefetch_(prefetch) {
  // Checks every argument, and gives the shard's batches (the same in every epoch). Reads nothing.
  num_batches_ = BlockStream(source_, memory_budget_, seed_, 0, num_shards_, shard_index_, batch_size_, drop_remainder_,
                             prefetch_, 0)
                     .num_batches();
}

BlockBatches::~BlockBatches() { close(); }

WindowBatch BlockBatches::get(std::uint64_t epoch, std::size_t batch) {
  if (batch >= num_batches_) {
    throw IndexOutOfRange("batch " + std::to_string(batch) + " out of range for " + std::to_string(num_batches_) +
                          " batches per epoch");
  }
  std::lock_guard lock(mutex_);
  if (!stream_ || epoch != epoch_ || batch != next_) {
    if (stream_) stream_->close();
    stream_.reset();
    stream_ = std::make_unique<BlockStream>(source_, memory_budget_, seed_, epoch, num_shards_, shard_index_,
                                            batch_size_, drop_remainder_, prefetch_, batch);
    epoch_ = epoch;
    next_ = batch;
    ++streams_started_;
  }
  WindowBatch out;
  try {
    out = stream_->take();
  } catch (...) {
    stream_.reset();  // a failed read or gather: the next call starts again at its position
    throw;
  }
  ++next_;
  if (next_ == num_batches_) stream_.reset();  // the epoch is over: let its memory go now
  return out;
}

std::size_t BlockBatches::streams_started() const {
  std::lock_guard lock(mutex_);
  return streams_started_;
}

void BlockBatches::close() {
  std::lock_guard lock(mutex_);
  stream_.reset();  // BlockStream's destructor cancels and waits for its reads and gathers
}

}  // namespace npyfeed
