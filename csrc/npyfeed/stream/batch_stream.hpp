// Read-ahead over a fixed order of samples: batch gathers started ahead on the thread pool, into buffers
// recycled only when nobody holds a batch any more.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "npyfeed/common/aligned_buffer.hpp"
#include "npyfeed/common/thread_pool.hpp"
#include "npyfeed/plan/epoch_order.hpp"
#include "npyfeed/plan/epoch_spec.hpp"
#include "npyfeed/stream/batch.hpp"
#include "npyfeed/stream/pipeline_stats.hpp"

namespace npyfeed {

class WindowSource;  // window_source.hpp

/// Read-ahead over a sample order: keeps up to `prefetch` batch gathers in flight on the pool.
/// Thread-safe: close() may come from another thread while one waits for a batch (take() then returns an
/// empty batch, count 0).
class BatchStream final : public EpochStream {
 public:
  using Batch = WindowBatch;
  /// The batches of `order` as `spec` cuts them (its batch size and remainder: the plan's geometry, checked
  /// when the spec was made). Throws IndexOutOfRange for an explicit id outside the source. A computed order
  /// must be over the source's samples (ids are made per batch, never all at once).
  /// Batches taken are counted in `stats` (null: the source's). With `page_locker`, the batches' buffers are
  /// page-locked through it (BufferPool).
  BatchStream(std::shared_ptr<WindowSource> source, EpochOrder order, const EpochSpec& spec, std::size_t prefetch,
              std::size_t start_batch, std::shared_ptr<PipelineStats> stats = nullptr,
              std::shared_ptr<const PageLocker> page_locker = nullptr);
  ~BatchStream() override;
  std::size_t num_batches() const noexcept override { return num_batches_; }
  /// The job for the next batch, starting it (and the read-ahead) if needed; null at the end.
  std::shared_ptr<Job> next_job() override;
  /// Takes the next batch (waiting for its gather). Rethrows its error.
  Batch take() override;
  /// Cancels and waits for all in-flight gathers. Idempotent.
  void close() override;

 private:
  struct Pending {
    std::shared_ptr<Job> job;
    Batch batch;
  };
  void fill();
  std::shared_ptr<WindowSource> source_;
  EpochOrder order_;
  EpochSpec spec_;  // the batch geometry
  std::size_t prefetch_;
  std::size_t num_batches_;
  std::size_t next_start_;  // next batch number to start
  std::deque<Pending> pending_;
  std::shared_ptr<BufferPool> buffers_;
  std::shared_ptr<PipelineStats> stats_;
  std::optional<std::size_t> ready_when_asked_;  // for the next take(): ready_at_front() at its first next_job()
  std::mutex mutex_;
  bool closed_ = false;
};

}  // namespace npyfeed
