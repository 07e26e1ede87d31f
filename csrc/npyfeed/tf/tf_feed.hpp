// The feeds npyfeed.tf's native ops read: a registry of feeds by id, and the table of C functions over it
// (npyfeed/tf/tf_feed_abi.h) that the TensorFlow op library (csrc/tf_ops/) calls. Part of the core that _core
// links, so the op library holds no copy of it.
//
// Lifetime: whoever makes a feed registers it and unregisters it when the feed may no longer be asked (npyfeed.tf:
// when the dataset, or the graph that captured its id, is gone). A graph holds only the id: a call with an
// unregistered id fails with FAILED_PRECONDITION, and a call in flight holds the feed (its plan, source and
// buffers) until it returns. The registry is never destroyed, so a TensorFlow thread still calling at process
// exit finds it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "npyfeed/device/device_rows.hpp"
#include "npyfeed/plan/epoch_plan.hpp"
#include "npyfeed/tf/tf_feed_abi.h"

namespace npyfeed {

/// A plan as the ops see it: batch b of epoch e, and the epoch of each new pass.
class TfFeed {
 public:
  /// `device`: the host half of batches formed on a device over the same plan (gather="device"), or null.
  explicit TfFeed(std::shared_ptr<EpochPlan> plan, std::shared_ptr<const DeviceRows> device = nullptr)
      : plan_(std::move(plan)), device_(std::move(device)) {}
  WindowBatch take(std::uint64_t epoch, std::size_t batch) { return plan_->take(epoch, batch); }
  const WindowSource& source() const { return plan_->source(); }
  /// The device rows, or null (gather="host").
  const DeviceRows* device() const noexcept { return device_.get(); }

  /// Where a pass over the dataset starts: an epoch and its first batch.
  struct Pass {
    std::int64_t epoch;
    std::int64_t batch;
  };
  /// Where the next pass starts (each call starts one): where `set_next_pass` put it, else at the first batch
  /// of the epoch after the last pass's (from `first_epoch` on).
  Pass next_pass();
  /// The next pass starts at batch `batch` of epoch `epoch` (a framework's epoch, restored mid-way or not), and
  /// the one after it at epoch `epoch + 1`. Throws InvalidArgument unless 0 <= epoch < 2**62 and
  /// 0 <= batch < num_batches().
  void set_next_pass(std::int64_t epoch, std::int64_t batch);
  /// A pass of epoch `epoch` was seen (a restored iterator): the next pass comes after it.
  void seen_epoch(std::int64_t epoch);
  void set_first_epoch(std::int64_t epoch);
  /// After close(), calls fail with CANCELLED; one waiting for its batch stops waiting (the plan's close()).
  bool closed() const { return closed_.load(); }
  void close() {
    closed_.store(true);
    plan_->close();
  }

 private:
  std::shared_ptr<EpochPlan> plan_;
  std::shared_ptr<const DeviceRows> device_;
  std::mutex pass_mutex_;  // guards next_: a pass starts rarely (once per epoch)
  Pass next_{0, 0};
  std::atomic<bool> closed_{false};
};

/// Registers `feed` (first pass: epoch `first_epoch`); returns its id (never reused in a process).
std::int64_t register_tf_feed(std::shared_ptr<TfFeed> feed, std::int64_t first_epoch);
/// Unregisters feed `id` and closes it (calls in flight fail once they return); null if it was not registered.
std::shared_ptr<TfFeed> unregister_tf_feed(std::int64_t id);
/// The table the op library calls (npyfeed/tf/tf_feed_abi.h).
const NpyfeedTfFeedApi& tf_feed_api() noexcept;
/// Owners that take() handed out and nobody released yet (for tests: buffers TensorFlow holds).
std::int64_t tf_feed_owners() noexcept;

}  // namespace npyfeed
