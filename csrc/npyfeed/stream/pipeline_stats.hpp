// Live statistics of a pipeline: what its consumer took, how long it waited for it, how long the gathers worked,
// how far the read-ahead was, what shuffle="blocks" read, and what a device path uploaded. Each plan counts its own
// and into its source's totals. Relaxed atomic adds per batch and per block, never per sample, and the clock read
// twice per wait and twice per gather worker: cheap enough to be always on.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

namespace npyfeed {

/// The counters at one moment (PipelineStats::counts()).
struct PipelineCounts {
  std::uint64_t batches = 0;  // batches handed to the consumer
  std::uint64_t samples = 0;  // their samples
  std::uint64_t bytes = 0;    // their bytes (x and y, in the output dtype)
  std::uint64_t wait_ns = 0;  // time the consumer waited for them (from asking to having)
  // Time from the consumer's first request to the last batch it received (0 before the first batch).
  std::uint64_t elapsed_ns = 0;
  std::uint64_t gather_ns = 0;         // CPU time the gathers of those batches took, summed over workers
  std::uint64_t ready_batches = 0;     // batches that were complete when the consumer asked for them
  std::uint64_t read_ahead_sum = 0;    // complete batches waiting when one was asked for, summed over the batches
  std::uint64_t blocks_read = 0;       // shuffle="blocks": blocks whose files were all read
  std::uint64_t block_bytes_read = 0;  // their bytes (every file read whole)
  std::uint64_t block_read_ns = 0;     // worker time those reads took
  std::uint64_t block_waits = 0;       // blocks whose read the consumer had to wait for
  std::uint64_t device_bytes = 0;      // bytes uploaded to a device (gather="device")
};

/// Counters of one pipeline, optionally also counting into a parent's (a plan into its source's). Thread-safe.
class PipelineStats {
 public:
  explicit PipelineStats(std::shared_ptr<PipelineStats> parent = nullptr) : parent_(std::move(parent)) {}
  PipelineStats(const PipelineStats&) = delete;
  PipelineStats& operator=(const PipelineStats&) = delete;

  /// The steady clock, in nanoseconds: what a consumer passes to waited().
  static std::uint64_t now_ns() noexcept;
  /// The consumer asked for a batch at `asked_ns` and had it at `got_ns` (now_ns() values).
  void waited(std::uint64_t asked_ns, std::uint64_t got_ns) noexcept;
  /// A batch of `samples` samples and `bytes` bytes was handed out; its gather took `gather_ns` of CPU time;
  /// `ready_ahead` batches were complete when it was asked for (itself included: 0 when it was not).
  void served(std::uint64_t samples, std::uint64_t bytes, std::uint64_t gather_ns, std::uint64_t ready_ahead) noexcept;
  /// `bytes` of a block's files read, in `read_ns` of worker time; `last` for the last file of its block.
  void block_read(std::uint64_t bytes, std::uint64_t read_ns, bool last) noexcept;
  /// The consumer waited for a block's read.
  void block_waited() noexcept;
  /// `bytes` uploaded to a device.
  void uploaded(std::uint64_t bytes) noexcept;
  /// A consistent-enough copy (each counter read once; no lock, so counters of a batch in progress may differ).
  PipelineCounts counts() const noexcept;

 private:
  using Counter = std::atomic<std::uint64_t>;
  Counter batches_{0}, samples_{0}, bytes_{0}, wait_ns_{0}, first_asked_ns_{0}, last_got_ns_{0}, gather_ns_{0},
      ready_batches_{0}, read_ahead_sum_{0}, blocks_read_{0}, block_bytes_read_{0}, block_read_ns_{0}, block_waits_{0},
      device_bytes_{0};
  std::shared_ptr<PipelineStats> parent_;
};

}  // namespace npyfeed
