#include "npyfeed/stream/batch_stream.hpp"

#include <algorithm>

#include "npyfeed/gather/window_source.hpp"

namespace npyfeed {

BatchStream::BatchStream(std::shared_ptr<WindowSource> source, EpochOrder order, const EpochSpec& spec,
                         std::size_t prefetch, std::size_t start_batch, std::shared_ptr<PipelineStats> stats,
                         std::shared_ptr<const PageLocker> page_locker)
    : source_(std::move(source)),
      order_(std::move(order)),
      spec_(spec),
      prefetch_(std::max<std::size_t>(prefetch, 1)),
      buffers_(std::make_shared<BufferPool>(2 * (std::max<std::size_t>(prefetch, 1) + 2),
                                            std::function<std::uint64_t(std::size_t)>{}, std::move(page_locker))),
      stats_(stats ? std::move(stats) : source_->stats()) {
  if (const auto* ids = order_.explicit_ids()) source_->check_ids(*ids);
  num_batches_ = spec_.num_batches(order_.size());
  next_start_ = std::min(start_batch, num_batches_);
}

BatchStream::~BatchStream() { close(); }

void BatchStream::fill() {
  while (!closed_ && pending_.size() < prefetch_ && next_start_ < num_batches_) {
    const auto [first, end] = spec_.batch_positions(next_start_, order_.size());
    std::vector<std::int64_t> ids = order_.slice(first, end - first);
    auto [batch, job] =
        source_->start_batch(shared_pool(0, source_->options().placement), std::move(ids), buffers_.get());
    pending_.push_back({std::move(job), std::move(batch)});
    ++next_start_;
  }
}

std::shared_ptr<Job> BatchStream::next_job() {
  std::lock_guard lock(mutex_);
  // Judged before fill(): a batch whose gather this very request starts was not ready, however fast it is (on a
  // busy machine it could finish before this thread looks).
  if (!ready_when_asked_) ready_when_asked_ = ready_at_front(pending_);
  fill();
  return pending_.empty() ? nullptr : pending_.front().job;
}

BatchStream::Batch BatchStream::take() {
  std::lock_guard lock(mutex_);
  if (closed_ || pending_.empty()) return {};  // closed meanwhile (by another thread)
  const std::size_t ready = ready_when_asked_ ? *ready_when_asked_ : ready_at_front(pending_);
  ready_when_asked_.reset();
  Pending p = std::move(pending_.front());
  pending_.pop_front();
  p.job->wait();
  stats_->served(p.batch.count, p.batch.count * (source_->x_sample_bytes() + source_->y_sample_bytes()),
                 p.job->cpu_ns(), ready);
  fill();  // start the next read-ahead before handing this batch out
  return std::move(p.batch);
}

void BatchStream::close() {
  std::lock_guard lock(mutex_);
  closed_ = true;
  for (auto& p : pending_) p.job->cancel();
  for (auto& p : pending_) {
    if (p.job->orphaned()) continue;  // forked child: the workers, and so the job, do not exist here
    try {
      p.job->wait();
    } catch (...) {
      // a cancelled read-ahead: nobody wants its result or its error
    }
  }
  pending_.clear();
}

}  // namespace npyfeed
