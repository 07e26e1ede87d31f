// "Batch b of epoch e" served from one stream positioned at the next batch expected (EpochPlan::take): asking for
// exactly that batch takes it from the stream, which reads ahead by itself; any other position (a restored
// checkpoint, a new epoch, a jump) closes the stream and starts a new one there.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "npyfeed/common/errors.hpp"
#include "npyfeed/common/thread_pool.hpp"
#include "npyfeed/stream/batch.hpp"
#include "npyfeed/stream/pipeline_stats.hpp"

namespace npyfeed {

/// Called between the slices of a wait (e.g. to notice Ctrl-C); it may throw to give up (the stream is then
/// dropped, and the next call starts a new one at its position). Empty: nothing between slices.
using WhileWaiting = std::function<void()>;

/// Thread-safe: calls are served one at a time; close() from another thread cuts a waiting take() short.
class StreamAtPosition {
 public:
  /// `make(epoch, batch)` makes a stream of epoch `epoch` that starts at batch `batch`. How long each take()
  /// waited is counted in `stats` (when not null).
  using Make = std::function<std::unique_ptr<EpochStream>(std::uint64_t epoch, std::size_t batch)>;
  StreamAtPosition(std::size_t num_batches, Make make, std::shared_ptr<PipelineStats> stats = nullptr)
      : num_batches_(num_batches), make_(std::move(make)), stats_(std::move(stats)) {}

  /// Batch `batch` of epoch `epoch`. Throws IndexOutOfRange unless batch < num_batches; rethrows a failed
  /// read or gather (the next call starts a new stream at its position); throws Cancelled when close() comes
  /// while it waits (within kCloseSlice, and once the gather's running items returned).
  WindowBatch take(std::uint64_t epoch, std::size_t batch, const WhileWaiting& while_waiting = {}) {
    if (batch >= num_batches_) {
      throw IndexOutOfRange("batch " + std::to_string(batch) + " out of range for " + std::to_string(num_batches_) +
                            " batches per epoch");
    }
    const std::uint64_t asked = PipelineStats::now_ns();
    std::lock_guard lock(mutex_);
    if (!stream_ || epoch != epoch_ || batch != next_) {
      if (stream_) stream_->close();
      stream_.reset();
      stream_ = make_(epoch, batch);
      epoch_ = epoch;
      next_ = batch;
      ++streams_started_;
    }
    WindowBatch out;
    try {
      wait_until_ready(while_waiting);  // starts this batch (and the read-ahead) if not yet
      out = stream_->take();
    } catch (...) {
      stream_.reset();
      throw;
    }
    if (stats_ && out.x) stats_->waited(asked, PipelineStats::now_ns());
    ++next_;
    if (next_ == num_batches_) stream_.reset();  // the epoch is over: let its memory go now
    return out;
  }
  /// Streams started so far (the first, and one per position that was not the next one; for tests).
  std::size_t streams_started() const {
    std::lock_guard lock(mutex_);
    return streams_started_;
  }
  /// Closes the stream (its destructor cancels and waits for its reads and gathers); a take() waiting meanwhile
  /// throws Cancelled. Idempotent; take() afterwards starts a new stream.
  void close() {
    closing_.store(true);
    std::lock_guard lock(mutex_);
    stream_.reset();
    closing_.store(false);
  }

  /// How often a waiting take() looks whether close() was called (an atomic load).
  static constexpr std::chrono::milliseconds kCloseSlice{5};
  /// How often a waiting take() calls its WhileWaiting (which may take the GIL: not at every close check).
  static constexpr std::chrono::milliseconds kWaitSlice{50};

 private:
  // Waits, in slices, for what the next batch needs (a read, then its gather: next_job() names each in turn)
  // until take() will not wait. Throws Cancelled once close() was called.
  void wait_until_ready(const WhileWaiting& while_waiting) {
    using Clock = std::chrono::steady_clock;
    for (;;) {
      std::shared_ptr<Job> job = stream_->next_job();
      if (!job || job->wait_for(std::chrono::milliseconds(0))) return;
      Clock::time_point next_call = Clock::now() + kWaitSlice;
      while (!job->wait_for(kCloseSlice)) {
        if (closing_.load()) throw Cancelled();
        if (while_waiting && Clock::now() >= next_call) {
          while_waiting();
          next_call = Clock::now() + kWaitSlice;
        }
      }
    }
  }

  std::size_t num_batches_;
  Make make_;
  std::shared_ptr<PipelineStats> stats_;
  mutable std::mutex mutex_;
  std::unique_ptr<EpochStream> stream_;  // positioned at (epoch_, next_), or null
  std::uint64_t epoch_ = 0;
  std::size_t next_ = 0;
  std::size_t streams_started_ = 0;
  std::atomic<bool> closing_{false};  // close() waits for the mutex: a take() holding it stops waiting
};

}  // namespace npyfeed
