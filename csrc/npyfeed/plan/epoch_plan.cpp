#include "npyfeed/plan/epoch_plan.hpp"

#include <algorithm>
#include <numeric>

#include "npyfeed/common/errors.hpp"
#include "npyfeed/plan/epoch_order.hpp"
#include "npyfeed/stream/batch_stream.hpp"
#include "npyfeed/stream/block_stream.hpp"

namespace npyfeed {

namespace {

// Blocks whose shuffled samples ids() keeps: the one a batch is in and the one before (a batch may span two).
constexpr std::size_t kCachedBlocks = 2;

}  // namespace

std::vector<std::uint32_t> shard_keys(const SamplesByKey& samples, std::size_t num_shards, std::size_t shard_index) {
  if (num_shards == 0 || shard_index >= num_shards) {
    throw InvalidArgument("shard_index must be in [0, " + std::to_string(num_shards) + "), got " +
                          std::to_string(shard_index));
  }
  std::vector<std::uint32_t> keys;
  for (std::size_t k = 0; k < samples.num_keys(); ++k) {
    if (samples.count(k) > 0) keys.push_back(static_cast<std::uint32_t>(k));
  }
  std::stable_sort(keys.begin(), keys.end(),
                   [&](std::uint32_t a, std::uint32_t b) { return samples.count(a) > samples.count(b); });
  std::vector<std::uint64_t> load(num_shards, 0);
  std::vector<std::uint32_t> mine;
  for (std::uint32_t key : keys) {
    const std::size_t to = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[to] += samples.count(key);
    if (to == shard_index) mine.push_back(key);
  }
  std::sort(mine.begin(), mine.end());
  return mine;
}

EpochPlan::EpochPlan(std::shared_ptr<WindowSource> source, EpochSpec spec, std::size_t prefetch,
                     std::shared_ptr<const SamplesByKey> samples)
    : source_(std::move(source)),
      spec_(spec),
      prefetch_(std::max<std::size_t>(prefetch, 1)),
      shard_size_(spec_.shard_size(source_->size())),
      num_batches_(spec_.num_batches(shard_size_)),
      stats_(std::make_shared<PipelineStats>(source_->stats())) {
  if (spec_.shuffle == Shuffle::kBlocks || spec_.shard_by == ShardBy::kKeys) {
    samples_ = samples ? std::move(samples) : group_samples_by_key(*source_);
    if (samples_->num_keys() != source_->num_keys()) {
      throw InvalidArgument("the samples grouped by key are another source's");
    }
  }
  if (spec_.shuffle == Shuffle::kBlocks) key_bytes_ = block_key_bytes(*source_);
  if (spec_.shard_by == ShardBy::kKeys) {
    keys_ = shard_keys(*samples_, spec_.num_shards, spec_.shard_index);
    std::vector<std::uint32_t> ids;
    for (std::uint32_t key : keys_) samples_->append_ids(key, ids);
    std::sort(ids.begin(), ids.end());  // unshuffled, a shard reads its samples in index order
    shard_samples_ = std::make_shared<const std::vector<std::uint32_t>>(std::move(ids));
    shard_size_ = shard_samples_->size();
    num_batches_ = spec_.num_batches(shard_size_);
  } else {
    keys_.resize(source_->num_keys());
    std::iota(keys_.begin(), keys_.end(), 0u);
  }
  at_position_.emplace(
      num_batches_,
      [this](std::uint64_t epoch, std::size_t batch) {
        std::shared_ptr<const PageLocker> locker;
        {
          std::lock_guard lock(locker_mutex_);
          locker = take_locker_;
        }
        return stream(epoch, batch, prefetch_, std::move(locker));
      },
      stats_);
}

void EpochPlan::pin_taken_batches(std::shared_ptr<const PageLocker> locker) {
  std::lock_guard lock(locker_mutex_);
  take_locker_ = std::move(locker);
}

EpochPlan::~EpochPlan() { close(); }

std::shared_ptr<const BlockPlan> EpochPlan::block_plan(std::uint64_t epoch) const {
  std::lock_guard lock(cache_mutex_);
  if (!cached_plan_ || cached_plan_->epoch != epoch) {
    cached_plan_ = std::make_shared<const BlockPlan>(plan_blocks(*samples_, key_bytes_, spec_.memory_budget, spec_.seed,
                                                                 epoch, spec_.num_shards, spec_.shard_index));
  }
  return cached_plan_;
}

std::shared_ptr<const std::vector<std::int64_t>> EpochPlan::block_ids(const std::shared_ptr<const BlockPlan>& plan,
                                                                      std::size_t block) const {
  std::lock_guard lock(cache_mutex_);
  for (const BlockOrder& b : cached_blocks_) {
    if (b.epoch == plan->epoch && b.block == block) return b.ids;
  }
  auto ids = std::make_shared<const std::vector<std::int64_t>>(block_samples(*plan, *samples_, block));
  if (cached_blocks_.size() == kCachedBlocks) cached_blocks_.erase(cached_blocks_.begin());
  cached_blocks_.push_back({plan->epoch, block, ids});
  return ids;
}

std::vector<std::int64_t> EpochPlan::ids(std::uint64_t epoch, std::size_t batch) const {
  if (batch >= num_batches_) {
    throw IndexOutOfRange("batch " + std::to_string(batch) + " out of range for " + std::to_string(num_batches_) +
                          " batches per epoch");
  }
  if (spec_.shuffle != Shuffle::kBlocks) {
    const auto [first, end] = spec_.batch_positions(batch, shard_size_);
    return computed_order(epoch).slice(first, end - first);
  }
  const std::shared_ptr<const BlockPlan> plan = block_plan(epoch);
  const auto [first, last] = spec_.batch_positions(batch, plan->shard_size());
  const std::uint64_t begin = plan->first + first;
  const std::uint64_t end = plan->first + last;
  std::vector<std::int64_t> out;
  out.reserve(end - begin);
  for (std::uint64_t p = begin; p < end;) {
    const std::size_t block = plan->block_of(p);
    const std::uint64_t block_end = std::min(end, plan->block_begin[block + 1]);
    const auto ids = block_ids(plan, block);
    const auto at = ids->begin() + static_cast<std::ptrdiff_t>(p - plan->block_begin[block]);
    out.insert(out.end(), at, at + static_cast<std::ptrdiff_t>(block_end - p));
    p = block_end;
  }
  return out;
}

std::vector<ShardBlock> EpochPlan::shard_blocks(std::uint64_t epoch) const {
  std::vector<ShardBlock> out;
  if (spec_.shuffle != Shuffle::kBlocks) return out;
  const std::shared_ptr<const BlockPlan> plan = block_plan(epoch);
  if (plan->end == plan->first) return out;
  for (std::size_t block = plan->block_of(plan->first); block < plan->num_blocks(); ++block) {
    const std::uint64_t begin = std::max(plan->first, plan->block_begin[block]);
    const std::uint64_t end = std::min(plan->end, plan->block_begin[block + 1]);
    if (begin >= end) break;
    out.push_back(
        {begin - plan->first, end - plan->first,
         std::vector<std::uint32_t>(plan->keys.begin() + static_cast<std::ptrdiff_t>(plan->key_begin[block]),
                                    plan->keys.begin() + static_cast<std::ptrdiff_t>(plan->key_begin[block + 1]))});
  }
  return out;
}

std::vector<std::int64_t> EpochPlan::order(std::uint64_t epoch) const {
  if (spec_.shuffle == Shuffle::kBlocks) return block_epoch_order(*block_plan(epoch), *samples_);
  const EpochOrder order = computed_order(epoch);
  return order.slice(0, order.size());
}

std::unique_ptr<EpochStream> EpochPlan::stream(std::uint64_t epoch, std::size_t start_batch, std::size_t prefetch,
                                               std::shared_ptr<const PageLocker> page_locker) const {
  source_->check_files_unchanged();
  if (spec_.shuffle == Shuffle::kBlocks) {
    return std::make_unique<BlockStream>(source_, samples_, block_plan(epoch), spec_, prefetch, start_batch, stats_,
                                         std::move(page_locker));
  }
  return std::make_unique<BatchStream>(source_, computed_order(epoch), spec_, prefetch, start_batch, stats_,
                                       std::move(page_locker));
}

EpochOrder EpochPlan::computed_order(std::uint64_t epoch) const {
  const bool shuffle = spec_.shuffle == Shuffle::kGlobal;
  if (shard_samples_) return EpochOrder(shard_samples_, shuffle, spec_.seed, epoch);
  return EpochOrder(source_->size(), shuffle, spec_.seed, epoch, spec_.num_shards, spec_.shard_index);
}

WindowBatch EpochPlan::take(std::uint64_t epoch, std::size_t batch, const WhileWaiting& while_waiting) {
  return at_position_->take(epoch, batch, while_waiting);
}

}  // namespace npyfeed
