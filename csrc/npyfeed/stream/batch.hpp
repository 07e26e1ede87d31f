// A gathered batch, and the interface of the streams that yield an epoch's batches in order (BatchStream for
// the orders computed per position, BlockStream for shuffle="blocks").
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>

#include "npyfeed/common/aligned_buffer.hpp"
#include "npyfeed/common/thread_pool.hpp"

namespace npyfeed {

/// A batch of `count` samples: x holds count * x_sample_bytes(), y count * y_sample_bytes() of its source;
/// owned and 64-byte aligned, so a file truncated later can never fault inside a batch someone holds.
struct WindowBatch {
  std::shared_ptr<AlignedBuffer> x;
  std::shared_ptr<AlignedBuffer> y;
  std::size_t count = 0;
};

/// One epoch's batches (of one shard), in order, from a start batch on, with read-ahead. Thread-safe:
/// close() may come from another thread while one waits for a batch (take() then returns an empty batch).
class EpochStream {
 public:
  virtual ~EpochStream() = default;
  /// Batches of the whole epoch (also those before the start batch).
  virtual std::size_t num_batches() const noexcept = 0;
  /// A job to wait for before take(): the next batch's gather, or a read it needs; starts it (and the
  /// read-ahead) if not yet. Null at the end.
  virtual std::shared_ptr<Job> next_job() = 0;
  /// The next batch, complete (waiting for what it still needs). Rethrows a failed read or gather.
  virtual WindowBatch take() = 0;
  /// Cancels and waits for all reads and gathers in flight. Idempotent.
  virtual void close() = 0;
};

/// Batches complete at the front of a stream's queue of pending gathers (consecutive from the first, whose
/// `job` is the gather): the read-ahead a consumer finds when it asks for the next batch.
template <class Queue>
std::size_t ready_at_front(const Queue& pending) {
  std::size_t ready = 0;
  for (const auto& p : pending) {
    if (!p.job->wait_for(std::chrono::milliseconds(0))) break;
    ++ready;
  }
  return ready;
}

}  // namespace npyfeed
