// WindowSource's work ahead of its gathers, on pool threads: the read-ahead hints of a cold cache (submitted in
// batch order by one drainer per source, which survives fork()) and the background populate of its mappings. The
// rest of the unit is window_source.cpp.
#include <unistd.h>

#include <chrono>
#include <deque>
#include <functional>

#include "npyfeed/common/errors.hpp"
#include "npyfeed/gather/window_source.hpp"

namespace npyfeed {

namespace {

// The background populate (WindowSource::start_populate) maps at most this share of physical memory per source,
// in steps of kPopulateStepBytes (one work item each).
constexpr std::uint64_t kPopulateMemoryDivisor = 4;
constexpr std::uint64_t kPopulateStepBytes = 8u << 20;

}  // namespace

namespace {

// Launches a prepared job when destroyed, unless orphaned by fork(): whatever happens to a queued hint (run,
// skipped, dropped), its gather starts exactly once.
struct LaunchOnExit {
  LaunchOnExit(ThreadPool* pool, std::shared_ptr<Job> job) : pool_(pool), job_(std::move(job)) {}
  LaunchOnExit(const LaunchOnExit&) = delete;  // one owner: the job is launched once
  LaunchOnExit& operator=(const LaunchOnExit&) = delete;
  ~LaunchOnExit() {
    if (!job_->orphaned()) pool_->launch(job_);
  }
  Job& job() const { return *job_; }

 private:
  ThreadPool* pool_;
  std::shared_ptr<Job> job_;
};

}  // namespace

// On a cold cache a batch's windows are asked for ahead (Gather::will_need_all) before its workers touch them,
// so that the device reads them all at once. Submitting them waits while the device's queue is full, as long
// as the reads ahead take: in the thread that starts the batch (the consumer's, as it takes the batch
// before) that stalled the training step 2-3 ms per batch (measured), and the first batch of an epoch waited
// until the hints of every batch read ahead were in. So one pool worker for device waits submits them, in
// batch order (a drainer per source), and launches each batch's gather once its hints are in: its workers
// never fault or read a window before the hint for it (readers that queue their reads start at once: the hints
// then serve the batches after). Advisory: a hint that fails is skipped, and the gather starts all the same
// (LaunchOnExit; a second launch of a job does nothing).
void WindowSource::launch_after_will_need(ThreadPool& pool, std::shared_ptr<Job> job,
                                          std::shared_ptr<const Gather> gather) {
  auto launch = std::make_shared<LaunchOnExit>(&pool, std::move(job));
  auto hint = [launch, gather = std::move(gather)] {
    Job& job = launch->job();  // a cancelled or finished (launched already) batch needs no hint
    if (!job.cancelled() && !job.wait_for(std::chrono::milliseconds(0))) gather->will_need_all();
  };  // the gather starts when the last copy of `launch` goes, once the hint ran or was dropped
  {
    std::lock_guard lock(hints_->mutex);
    if (hints_->pid != ::getpid()) {  // a forked child: the parent's drainer does not exist here
      hints_->queue.clear();
      hints_->draining = false;
      hints_->pid = ::getpid();
    }
    hints_->queue.push_back(std::move(hint));
    if (hints_->draining) return;
    hints_->draining = true;
  }
  try {
    shared_io_pool(0, options_.placement).start(1, 1, [hints = hints_](std::size_t) {
      for (;;) {
        std::function<void()> next;
        {
          std::lock_guard lock(hints->mutex);
          if (hints->queue.empty()) {
            hints->draining = false;
            return;
          }
          next = std::move(hints->queue.front());
          hints->queue.pop_front();
        }
        try {
          next();
        } catch (...) {  // advisory (e.g. bad_alloc): the batch reads its windows all the same
        }
        next = nullptr;  // launches the batch's gather
      }
    });
  } catch (...) {  // no thread for it: no hints, and every queued gather starts now (outside the lock)
    std::deque<std::function<void()>> dropped;
    {
      std::lock_guard lock(hints_->mutex);
      dropped.swap(hints_->queue);
      hints_->draining = false;
    }
  }
}

// A first pass over mapped files pays a minor page fault per few pages it touches, even when every page is
// in the page cache: this process's page tables start empty. At the first gather, one worker of the background
// pool maps the cached pages of every file ahead of the gather (MappedFile::populate_cached): a mincore look and
// one MADV_POPULATE_READ per run of cached pages, far cheaper than the faults. Not a gather worker: the pools hand
// a worker to a job until its items run out, and at the users' key count (14,000 keys) the job runs for seconds,
// in which a source of one thread would gather nothing. At the lowest priority: the populate only saves work the
// gather would do anyway, so it may take only the CPU that nothing else wants (ten training processes on a
// node share its cores). It reads nothing from the disk, so a data set larger than RAM is mapped only where it
// is cached, and it stops after a quarter of physical memory, or when the source is destroyed. Where this process
// may not lower a thread's priority, there is no populate.
void WindowSource::start_populate() {
  struct Step {
    std::weak_ptr<const ArrayReader> reader;  // the source owns its readers: a closed one unmaps at once
    std::uint64_t offset, length;
  };
  auto steps = std::make_shared<std::vector<Step>>();
  for (std::size_t k = 0; k < factors_.size(); ++k) {
    for (const ArraySource* s : {&factors_[k], &labels_[k]}) {
      if (!s->reader || s->reader->view() == nullptr) continue;  // nothing mapped (or an empty file)
      const std::uint64_t nbytes = s->header().nbytes;
      for (std::uint64_t at = 0; at < nbytes; at += kPopulateStepBytes)
        steps->push_back({s->reader, at, std::min(kPopulateStepBytes, nbytes - at)});
    }
  }
  if (steps->empty()) return;  // before the pool: a source with nothing mapped starts no thread
  ThreadPool* pool = nullptr;
  try {
    pool = &shared_background_pool(0, options_.placement);
  } catch (const Error&) {
    return;
  }
  const std::uint64_t budget = static_cast<std::uint64_t>(::sysconf(_SC_PHYS_PAGES)) *
                               static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE)) / kPopulateMemoryDivisor;
  auto mapped = std::make_shared<std::uint64_t>(0);  // one worker: no other thread touches it
  pool->start(steps->size(), 1, [steps, mapped, budget, stop = populate_stop_](std::size_t i) {
    if (stop->load(std::memory_order_relaxed) || *mapped >= budget) return;
    const Step& step = (*steps)[i];
    if (auto reader = step.reader.lock()) *mapped += reader->populate_cached(step.offset, step.length);
  });
}

}  // namespace npyfeed
