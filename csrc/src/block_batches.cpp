#include "npyfeed/block_batches.hpp"

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
  stream_ = std::make_unique<StreamAtPosition<BlockStream>>(num_batches_);
}

BlockBatches::~BlockBatches() { close(); }

WindowBatch BlockBatches::take(std::uint64_t epoch, std::size_t batch) {
  return stream_->take(epoch, batch, [&](std::uint64_t e, std::size_t b) {
    return std::make_unique<BlockStream>(source_, memory_budget_, seed_, e, num_shards_, shard_index_, batch_size_,
                                         drop_remainder_, prefetch_, b);
  });
}

}  // namespace npyfeed
