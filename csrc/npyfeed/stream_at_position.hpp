// "Batch b of epoch e" served from one stream positioned at the next batch expected (EpochBatches::take,
// BlockBatches): asking for exactly that batch takes it from the stream, which reads ahead by itself; any other
// position (a restored checkpoint, a new epoch, a jump) closes the stream and starts a new one there.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "npyfeed/errors.hpp"
#include "npyfeed/thread_pool.hpp"
#include "npyfeed/window_source.hpp"

namespace npyfeed {

/// `Stream` has next_job() (starts the next batch and its read-ahead), take() (the next batch, complete) and
/// close(); `make(epoch, batch)` makes a stream of epoch `epoch` that starts at batch `batch`.
/// Thread-safe: calls are served one at a time; close() from another thread cuts a waiting take() short.
template <class Stream>
class StreamAtPosition {
 public:
  explicit StreamAtPosition(std::size_t num_batches) : num_batches_(num_batches) {}

  /// Batch `batch` of epoch `epoch`. Throws IndexOutOfRange unless batch < num_batches; rethrows a failed
  /// read or gather (the next call starts a new stream at its position); throws Cancelled when close() comes
  /// while it waits (within kCancelSlice, and once the gather's running items returned).
  template <class Make>
  WindowBatch take(std::uint64_t epoch, std::size_t batch, const Make& make) {
    if (batch >= num_batches_) {
      throw IndexOutOfRange("batch " + std::to_string(batch) + " out of range for " + std::to_string(num_batches_) +
                            " batches per epoch");
    }
    std::lock_guard lock(mutex_);
    if (!stream_ || epoch != epoch_ || batch != next_) {
      if (stream_) stream_->close();
      stream_.reset();
      stream_ = make(epoch, batch);
      epoch_ = epoch;
      next_ = batch;
      ++streams_started_;
    }
    WindowBatch out;
    try {
      wait_until_ready();  // starts this batch (and the read-ahead) if not yet
      out = stream_->take();
    } catch (...) {
      stream_.reset();
      throw;
    }
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

  /// How often a waiting take() looks whether close() was called.
  static constexpr std::chrono::milliseconds kCancelSlice{50};

 private:
  // Waits, in slices, for what the next batch needs (a read, then its gather: next_job() names each in turn)
  // until take() will not wait. Throws Cancelled once close() was called.
  void wait_until_ready() {
    for (;;) {
      std::shared_ptr<Job> job = stream_->next_job();
      if (!job || job->wait_for(std::chrono::milliseconds(0))) return;
      while (!job->wait_for(kCancelSlice)) {
        if (closing_.load()) throw Cancelled();
      }
    }
  }

  std::size_t num_batches_;
  mutable std::mutex mutex_;
  std::unique_ptr<Stream> stream_;  // positioned at (epoch_, next_), or null
  std::uint64_t epoch_ = 0;
  std::size_t next_ = 0;
  std::size_t streams_started_ = 0;
  std::atomic<bool> closing_{false};  // close() waits for the mutex: a take() holding it stops waiting
};

}  // namespace npyfeed
