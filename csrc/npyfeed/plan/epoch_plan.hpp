// The one owner of "batch b of epoch e": an epoch specification (order, seed, shards, batch size), checked
// once, and the plan that answers, for any epoch and batch, which samples it holds (ids), what they are
// (take, served from a stream that reads ahead when asked in order), and the whole epoch's order. The numpy
// iterator, tf.data and every other consumer ask a plan; none recomputes shards or batch counts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "npyfeed/device/page_lock.hpp"
#include "npyfeed/gather/window_source.hpp"
#include "npyfeed/plan/block_order.hpp"
#include "npyfeed/plan/epoch_order.hpp"
#include "npyfeed/plan/epoch_spec.hpp"
#include "npyfeed/stream/batch.hpp"
#include "npyfeed/stream/pipeline_stats.hpp"
#include "npyfeed/stream/stream_at_position.hpp"

namespace npyfeed {

/// The keys of shard `shard_index` of `num_shards` under ShardBy::kKeys, ascending: keys with samples, largest
/// first, each to the shard holding the fewest samples so far (the lowest index among equals), so shards differ
/// by at most the largest key's sample count. The same on every machine.
std::vector<std::uint32_t> shard_keys(const SamplesByKey& samples, std::size_t num_shards, std::size_t shard_index);

/// One block of an epoch under shuffle="blocks", as one shard reads it: positions [begin, end) of the shard's
/// epoch (0 is the shard's first sample) and the block's keys, in the epoch's order.
struct ShardBlock {
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  std::vector<std::uint32_t> keys;
};

/// The batches of one shard of every epoch of `source` under `spec`. ids() and order() do no IO; take() is
/// safe from several threads (calls are served one at a time) and, asked for the batch after the last one it
/// gave, takes it from a stream that keeps the next `prefetch` batches in flight; any other position starts a
/// new stream there, so a batch depends on its position only.
class EpochPlan {
 public:
  /// `samples`: the source's samples grouped by key (shuffle="blocks"), shared between the plans of one
  /// source; made here (one pass over the index) when null. Throws InvalidArgument (see EpochSpec), and for
  /// blocks over 2^32 samples or more.
  EpochPlan(std::shared_ptr<WindowSource> source, EpochSpec spec, std::size_t prefetch = 2,
            std::shared_ptr<const SamplesByKey> samples = nullptr);
  ~EpochPlan();
  EpochPlan(const EpochPlan&) = delete;
  EpochPlan& operator=(const EpochPlan&) = delete;

  const WindowSource& source() const noexcept { return *source_; }
  const EpochSpec& spec() const noexcept { return spec_; }
  /// Batches per epoch, and samples per epoch (this shard's).
  std::size_t num_batches() const noexcept { return num_batches_; }
  std::size_t shard_size() const noexcept { return shard_size_; }
  /// With shuffle="blocks" or shard_by keys: the samples grouped by key this plan uses (null otherwise).
  const std::shared_ptr<const SamplesByKey>& samples_by_key() const noexcept { return samples_; }
  /// The keys this shard reads, ascending: under shard_by keys its own (shard_keys), else every key of the
  /// source. Computed once, here; what DeviceRows holds on a device.
  const std::vector<std::uint32_t>& keys() const noexcept { return keys_; }

  /// The sample ids of batch `batch` of epoch `epoch`. Throws IndexOutOfRange unless batch < num_batches().
  /// O(batch_size) for the computed orders; under blocks, the first call for a block shuffles that block's
  /// samples (kept for the next calls: the plan keeps its epoch's plan and the last two blocks' orders).
  std::vector<std::int64_t> ids(std::uint64_t epoch, std::size_t batch) const;
  /// Under shuffle="blocks": the blocks of epoch `epoch` that hold this shard's positions, in order, each
  /// clipped to the shard (they cover [0, shard_size()) once); empty under the other orders. No IO.
  std::vector<ShardBlock> shard_blocks(std::uint64_t epoch) const;
  /// Under shuffle="blocks": each key's bytes of array data, as the blocks count them (empty otherwise).
  const std::vector<std::uint64_t>& key_bytes() const noexcept { return key_bytes_; }
  /// The whole epoch's ids, in batch order (shard_size() of them; with drop_remainder, also the samples of
  /// the dropped last batch).
  std::vector<std::int64_t> order(std::uint64_t epoch) const;
  /// A stream of epoch `epoch`'s batches from batch `start_batch` on (clipped to num_batches()), keeping
  /// `prefetch` (at least 1) batches in flight: what the numpy iterator reads. With `page_locker`, its batches
  /// are in page-locked memory (for copies to a GPU by DMA).
  std::unique_ptr<EpochStream> stream(std::uint64_t epoch, std::size_t start_batch, std::size_t prefetch,
                                      std::shared_ptr<const PageLocker> page_locker = nullptr) const;
  /// Batch `batch` of epoch `epoch`, complete (see the class comment); `while_waiting` runs between the slices
  /// of its wait. Throws IndexOutOfRange unless batch < num_batches(); rethrows a failed read or gather; throws
  /// Cancelled when close() comes from another thread while it waits.
  WindowBatch take(std::uint64_t epoch, std::size_t batch, const WhileWaiting& while_waiting = {});
  /// From now on, the streams take() starts gather into memory page-locked through `locker` (null: ordinary
  /// memory again); a stream already started keeps what it has. What npyfeed.tf's pin_memory sets.
  void pin_taken_batches(std::shared_ptr<const PageLocker> locker);
  /// This plan's statistics: what take() and its streams served (also counted into the source's).
  const std::shared_ptr<PipelineStats>& stats() const noexcept { return stats_; }
  /// Streams take() started so far (for tests).
  std::size_t streams_started() const { return at_position_->streams_started(); }
  /// Cancels take()'s read-ahead (and waits for it). Idempotent; take() afterwards starts a new stream.
  void close() { at_position_->close(); }

 private:
  // The order of epoch `epoch` under shuffle none or global (of this shard's samples).
  EpochOrder computed_order(std::uint64_t epoch) const;
  std::shared_ptr<const BlockPlan> block_plan(std::uint64_t epoch) const;
  std::shared_ptr<const std::vector<std::int64_t>> block_ids(const std::shared_ptr<const BlockPlan>& plan,
                                                             std::size_t block) const;

  std::shared_ptr<WindowSource> source_;
  EpochSpec spec_;
  std::size_t prefetch_;
  std::size_t shard_size_;
  std::size_t num_batches_;
  std::shared_ptr<const SamplesByKey> samples_;                      // kBlocks, kKeys
  std::shared_ptr<const std::vector<std::uint32_t>> shard_samples_;  // kKeys: this shard's sample ids, ascending
  std::vector<std::uint32_t> keys_;                                  // keys()
  std::vector<std::uint64_t> key_bytes_;                             // kBlocks: block_key_bytes(source)
  std::shared_ptr<PipelineStats> stats_;
  // kBlocks: the last epoch's block plan and the last blocks' shuffled samples, for ids().
  struct BlockOrder {
    std::uint64_t epoch;
    std::size_t block;
    std::shared_ptr<const std::vector<std::int64_t>> ids;
  };
  mutable std::mutex cache_mutex_;
  mutable std::shared_ptr<const BlockPlan> cached_plan_;
  mutable std::vector<BlockOrder> cached_blocks_;
  mutable std::mutex locker_mutex_;
  std::shared_ptr<const PageLocker> take_locker_;  // the page locker of take()'s streams, if any
  std::optional<StreamAtPosition> at_position_;    // made once the batch count is known
};

}  // namespace npyfeed
