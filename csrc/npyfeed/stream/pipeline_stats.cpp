#include "npyfeed/stream/pipeline_stats.hpp"

#include <chrono>

namespace npyfeed {

namespace {

constexpr auto kRelaxed = std::memory_order_relaxed;

void add(std::atomic<std::uint64_t>& counter, std::uint64_t value) noexcept { counter.fetch_add(value, kRelaxed); }

}  // namespace

std::uint64_t PipelineStats::now_ns() noexcept {
  const auto since = std::chrono::steady_clock::now().time_since_epoch();
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(since).count());
}

void PipelineStats::waited(std::uint64_t asked_ns, std::uint64_t got_ns) noexcept {
  add(wait_ns_, got_ns > asked_ns ? got_ns - asked_ns : 0);
  std::uint64_t unset = 0;
  first_asked_ns_.compare_exchange_strong(unset, asked_ns, kRelaxed);
  std::uint64_t last = last_got_ns_.load(kRelaxed);
  while (got_ns > last && !last_got_ns_.compare_exchange_weak(last, got_ns, kRelaxed)) {
  }
  if (parent_) parent_->waited(asked_ns, got_ns);
}

void PipelineStats::served(std::uint64_t samples, std::uint64_t bytes, std::uint64_t gather_ns,
                           std::uint64_t ready_ahead) noexcept {
  add(batches_, 1);
  add(samples_, samples);
  add(bytes_, bytes);
  add(gather_ns_, gather_ns);
  if (ready_ahead > 0) add(ready_batches_, 1);
  add(read_ahead_sum_, ready_ahead);
  if (parent_) parent_->served(samples, bytes, gather_ns, ready_ahead);
}

void PipelineStats::block_read(std::uint64_t bytes, std::uint64_t read_ns, bool last) noexcept {
  add(block_bytes_read_, bytes);
  add(block_read_ns_, read_ns);
  if (last) add(blocks_read_, 1);
  if (parent_) parent_->block_read(bytes, read_ns, last);
}

void PipelineStats::block_waited() noexcept {
  add(block_waits_, 1);
  if (parent_) parent_->block_waited();
}

void PipelineStats::uploaded(std::uint64_t bytes) noexcept {
  add(device_bytes_, bytes);
  if (parent_) parent_->uploaded(bytes);
}

PipelineCounts PipelineStats::counts() const noexcept {
  PipelineCounts c;
  c.batches = batches_.load(kRelaxed);
  c.samples = samples_.load(kRelaxed);
  c.bytes = bytes_.load(kRelaxed);
  c.wait_ns = wait_ns_.load(kRelaxed);
  const std::uint64_t first = first_asked_ns_.load(kRelaxed);
  const std::uint64_t last = last_got_ns_.load(kRelaxed);
  c.elapsed_ns = first != 0 && last > first ? last - first : 0;
  c.gather_ns = gather_ns_.load(kRelaxed);
  c.ready_batches = ready_batches_.load(kRelaxed);
  c.read_ahead_sum = read_ahead_sum_.load(kRelaxed);
  c.blocks_read = blocks_read_.load(kRelaxed);
  c.block_bytes_read = block_bytes_read_.load(kRelaxed);
  c.block_read_ns = block_read_ns_.load(kRelaxed);
  c.block_waits = block_waits_.load(kRelaxed);
  c.device_bytes = device_bytes_.load(kRelaxed);
  return c;
}

}  // namespace npyfeed
