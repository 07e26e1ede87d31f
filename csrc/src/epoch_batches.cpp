#include "npyfeed/epoch_batches.hpp"

#include <string>
#include <vector>

#include "npyfeed/epoch_order.hpp"
#include "npyfeed/errors.hpp"

namespace npyfeed {

EpochBatches::EpochBatches(std::shared_ptr<WindowSource> source, bool shuffle, std::uint64_t seed,
                           std::size_t num_shards, std::size_t shard_index, std::size_t batch_size, bool drop_remainder,
                           std::size_t max_kept, std::size_t prefetch)
    : source_(std::move(source)),
      shuffle_(shuffle),
      seed_(shuffle ? seed : 0),
      num_shards_(num_shards),
      shard_index_(shard_index),
      batch_size_(batch_size),
      drop_remainder_(drop_remainder),
      prefetch_(prefetch),
      buffers_(std::make_shared<BufferPool>(max_kept)) {
  if (batch_size_ == 0) throw InvalidArgument("batch_size must be at least 1");
  // Checks the shard arguments, and gives the shard's size (the same in every epoch).
  const EpochOrder order(source_->size(), false, 0, 0, num_shards_, shard_index_);
  num_batches_ = drop_remainder ? order.size() / batch_size_ : (order.size() + batch_size_ - 1) / batch_size_;
  stream_ = std::make_unique<StreamAtPosition<BatchStream>>(num_batches_);
}

std::vector<std::int64_t> EpochBatches::ids(std::uint64_t epoch, std::size_t batch) const {
  if (batch >= num_batches_) {
    throw IndexOutOfRange("batch " + std::to_string(batch) + " out of range for " + std::to_string(num_batches_) +
                          " batches per epoch");
  }
  // O(1) to set up: the order is evaluated only at this batch's positions.
  const EpochOrder order(source_->size(), shuffle_, seed_, shuffle_ ? epoch : 0, num_shards_, shard_index_);
  return order.slice(batch * batch_size_, batch_size_);
}

std::pair<WindowBatch, std::shared_ptr<Job>> EpochBatches::start(std::uint64_t epoch, std::size_t batch) {
  return source_->start_batch(shared_pool(0, source_->options().placement), ids(epoch, batch), buffers_.get());
}

EpochBatches::~EpochBatches() { close(); }

WindowBatch EpochBatches::take(std::uint64_t epoch, std::size_t batch) {
  return stream_->take(epoch, batch, [&](std::uint64_t e, std::size_t b) {
    EpochOrder order(source_->size(), shuffle_, seed_, shuffle_ ? e : 0, num_shards_, shard_index_);
    return std::make_unique<BatchStream>(source_, std::move(order), batch_size_, drop_remainder_, prefetch_, b);
  });
}

}  // namespace npyfeed
