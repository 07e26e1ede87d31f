// shuffle="blocks": an epoch read block by block (block_order.hpp). Each block's files are read whole, with
// large sequential reads, several in flight, into owned memory ahead of use, on the pool for device waits
// (shared_io_pool: the gathers' workers never wait in a block read); batches are then gathered from memory on
// the compute pool; a block's memory goes once its last batch is gathered. Data sets larger than RAM are read once per
// epoch, sequentially, instead of one random read per sample.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "npyfeed/common/aligned_buffer.hpp"
#include "npyfeed/common/thread_pool.hpp"
#include "npyfeed/gather/gather.hpp"
#include "npyfeed/io/array_reader.hpp"
#include "npyfeed/plan/block_order.hpp"
#include "npyfeed/plan/epoch_spec.hpp"
#include "npyfeed/stream/batch.hpp"
#include "npyfeed/stream/pipeline_stats.hpp"

namespace npyfeed {

class WindowSource;  // window_source.hpp
struct KeyArrays;

/// Bytes of each key's arrays as plan_blocks counts them: factor plus label data bytes (not the headers), so
/// that the order is the same for files in any read mode and for the same arrays in memory.
std::vector<std::uint64_t> block_key_bytes(const WindowSource& source);

/// The samples of `source` grouped by key, as plan_blocks wants them (one pass over the index; at most 4 bytes
/// per sample, nothing per sample where the index lists each key's lines together). Throws InvalidArgument for
/// 2^32 samples or more.
std::shared_ptr<const SamplesByKey> group_samples_by_key(const WindowSource& source);

/// Key `key`'s factor (or label) array as a block holds it: a file of a file source read whole into owned memory
/// (one large read, O_DIRECT in modes "direct" and "mmap", buffered in "read"), checked against the array as the
/// source opened it; arrays in memory and members of `.npz` archives as the source holds them. `bytes_read`
/// (when given) gets the bytes read. Throws OsError, NpyFormatError naming the file (deleted, truncated, or
/// changed since the source opened it). A file read takes its memory from `buffers` when given.
ArraySource read_block_array(const WindowSource& source, std::uint32_t key, bool label,
                             std::uint64_t* bytes_read = nullptr, std::shared_ptr<BufferPool> buffers = nullptr);

/// Batches of one shard of a blocks epoch. Memory: the blocks held (read ahead, being consumed, or read by a
/// gather in flight) never exceed `memory_budget` bytes of array data (plus each file's header and O_DIRECT
/// alignment, under 8 KiB a file), except where one batch alone needs
/// more (a key larger than half the budget, a batch spanning more than two blocks): then they are the
/// blocks that batch needs. Batch buffers (prefetch + 2 batches) come on top. A block's file buffers, once it is
/// let go, are kept for the next blocks' reads (no fresh pages to fault in per file) while the blocks held and
/// the buffers kept stay within `memory_budget`.
/// Files of a file source are read whole, with O_DIRECT in modes "direct" and "mmap" (buffered in "read");
/// an error names the file (deleted, truncated, replaced by an array of another shape). Arrays in memory, and
/// members of `.npz` archives (which the source holds in memory or maps), are used in place and not counted.
/// Thread-safe as BatchStream.
class BlockStream final : public EpochStream {
 public:
  using Batch = WindowBatch;
  /// The batches of `plan` (one shard's blocks of one epoch, planned by plan_blocks over `samples` and
  /// block_key_bytes(*source) with the memory budget of `spec`), as `spec` cuts them (its batch size and
  /// remainder: the plan's geometry, checked when the spec was made), from batch `start_batch` on. Batches taken and
  /// blocks read are counted in `stats` (null: the source's). With `page_locker`, the batches' buffers are page-locked
  /// through it (BufferPool).
  BlockStream(std::shared_ptr<WindowSource> source, std::shared_ptr<const SamplesByKey> samples,
              std::shared_ptr<const BlockPlan> plan, const EpochSpec& spec, std::size_t prefetch,
              std::size_t start_batch, std::shared_ptr<PipelineStats> stats = nullptr,
              std::shared_ptr<const PageLocker> page_locker = nullptr);
  ~BlockStream() override;
  BlockStream(const BlockStream&) = delete;
  BlockStream& operator=(const BlockStream&) = delete;

  std::size_t num_batches() const noexcept override { return num_batches_; }
  /// A job to wait for before take(): the next batch's gather, or a read of a block it needs; null at the end.
  std::shared_ptr<Job> next_job() override;
  /// The next batch (waiting for what it needs). Rethrows a failed read or gather. Empty once closed.
  Batch take() override;
  /// Cancels and waits for all reads and gathers in flight. Idempotent.
  void close() override;
  /// Bytes of file data held now, and the most held at once so far (for tests and benchmarks).
  std::uint64_t buffered_bytes() const noexcept { return counters_->held.load(); }
  std::uint64_t peak_buffered_bytes() const noexcept { return counters_->peak.load(); }
  /// Bytes of block file buffers kept for the next reads now, and how many reads took one so far.
  std::uint64_t kept_file_bytes() const { return file_buffers_->kept_bytes(); }
  std::uint64_t reused_file_buffers() const { return file_buffers_->reused(); }
  const BlockPlan& plan() const noexcept { return *plan_; }

 private:
  struct Counters {
    std::atomic<std::uint64_t> held{0};
    std::atomic<std::uint64_t> peak{0};
  };
  struct Block {
    std::size_t index;
    std::shared_ptr<const KeyArrays> arrays;  // filled by `load`
    std::shared_ptr<std::vector<std::int64_t>> samples;
    std::shared_ptr<Job> load;
  };
  struct Pending {
    std::shared_ptr<Job> job;
    Batch batch;
    std::shared_ptr<const KeyArrays> arrays;  // what the gather reads, held until it finished
  };
  void fill();
  void start_load(std::size_t block);
  // Blocks [first, last] that batch `batch` reads.
  std::pair<std::size_t, std::size_t> blocks_of_batch(std::size_t batch) const;
  Block* held_block(std::size_t index);
  // The first unfinished read that the next batch needs, or null.
  std::shared_ptr<Job> pending_load();
  // Counts a wait for block read `load` in the stats, once per read.
  void count_block_wait(const std::shared_ptr<Job>& load);

  std::shared_ptr<WindowSource> source_;
  std::shared_ptr<const SamplesByKey> samples_;
  std::shared_ptr<const BlockPlan> plan_;
  EpochSpec spec_;  // the batch geometry and the memory budget
  std::size_t prefetch_;
  std::size_t num_batches_;
  std::size_t next_start_;  // next batch number to start
  std::size_t next_load_ = 0;
  std::size_t last_block_ = 0;  // one past the shard's last block
  std::deque<Block> blocks_;    // held, consecutive, from the oldest still needed
  std::deque<Pending> pending_;
  std::shared_ptr<Counters> counters_;
  std::shared_ptr<BufferPool> buffers_;       // batches
  std::shared_ptr<BufferPool> file_buffers_;  // the files of blocks (within memory_budget with the blocks held)
  std::shared_ptr<PipelineStats> stats_;
  std::optional<std::size_t> ready_when_asked_;  // for the next take(): ready_at_front() at its first next_job()
  std::shared_ptr<Job> waited_load_;             // the last block read take() waited for (each counted once)
  std::mutex mutex_;
  bool closed_ = false;
};

}  // namespace npyfeed
