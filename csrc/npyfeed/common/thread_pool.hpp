// A fixed pool of worker threads and the one way work is given to it: a Job that runs fn(i) for
// i in [0, n) on at most `max_workers` threads, pulling indices from a shared counter (load balanced).
// The first exception wins: it cancels the rest of the job and is rethrown to whoever waits.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "npyfeed/common/placement.hpp"

namespace npyfeed {

class Job {
 public:
  Job(std::size_t count, std::function<void(std::size_t)> fn);
  /// Waits until every started item has finished. Rethrows the first worker exception (not Cancelled).
  void wait();
  /// Waits at most `timeout`; true when the job has finished (it does not rethrow).
  bool wait_for(std::chrono::milliseconds timeout);
  /// Stops handing out new items; items already running finish.
  void cancel() noexcept { cancelled_.store(true, std::memory_order_relaxed); }
  bool cancelled() const noexcept { return cancelled_.load(std::memory_order_relaxed); }
  /// Rethrows the first failure, if any.
  void rethrow_if_failed();
  /// Items finished so far (for progress).
  std::size_t items_done() const noexcept { return items_done_.load(std::memory_order_relaxed); }
  /// Extra progress counter that work items may bump (bytes read).
  std::atomic<std::uint64_t>& progress() noexcept { return progress_; }
  /// CPU time the job's workers have spent on it so far, in nanoseconds, summed over workers: time a worker
  /// was blocked (in a read, a page fault, a lock) or waited for a core is not counted. Each runner reads its
  /// thread's CPU clock once when it starts and once when it stops: nothing per item.
  std::uint64_t cpu_ns() const noexcept { return cpu_ns_.load(std::memory_order_relaxed); }
  /// True in a child process forked after the job started: its workers do not exist there, so the job
  /// can never finish. Waiting on such a job throws instead of hanging.
  bool orphaned() const noexcept;

 private:
  friend class ThreadPool;
  void run_items();  // one runner: pull items until none are left

  void throw_if_orphaned() const;

  std::size_t count_;
  int pid_;
  std::function<void(std::size_t)> fn_;
  std::atomic<std::size_t> next_{0};
  std::atomic<std::size_t> items_done_{0};
  std::atomic<std::uint64_t> progress_{0};
  std::atomic<std::uint64_t> cpu_ns_{0};
  std::atomic<bool> cancelled_{false};
  std::mutex mutex_;
  std::condition_variable finished_;
  std::size_t runners_left_ = 0;
  std::size_t runners_ = 0;  // workers it asked for (prepare), handed to them at launch
  std::atomic<bool> launched_{false};
  std::exception_ptr error_;
};

class ThreadPool {
 public:
  /// `placement` is applied by every worker to itself when it starts (check it first: check_placement;
  /// a worker that cannot apply it runs as it is).
  explicit ThreadPool(std::size_t threads, Placement placement = {});
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  std::size_t size() const;
  /// Grows the pool to at least `threads` workers.
  void ensure_size(std::size_t threads);
  /// Starts fn(0..count-1) on at most `max_workers` workers and returns at once.
  std::shared_ptr<Job> start(std::size_t count, std::size_t max_workers, std::function<void(std::size_t)> fn);
  /// Like start(), but the workers take the job only at launch(job), which must then be called exactly once
  /// (a wait before it waits for it; a job cancelled before it finishes at once when launched).
  std::shared_ptr<Job> prepare(std::size_t count, std::size_t max_workers, std::function<void(std::size_t)> fn);
  void launch(const std::shared_ptr<Job>& job);
  /// start() then wait().
  void run(std::size_t count, std::size_t max_workers, std::function<void(std::size_t)> fn);

 private:
  void worker_loop();

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Job>> runners_;  // one entry per runner to start
  std::vector<std::thread> threads_;
  bool stopping_ = false;
  const Placement placement_;
  std::condition_variable started_;  // a worker has placed and named itself
  std::size_t workers_started_ = 0;
};

/// The process-wide pool for `placement`, grown to at least `min_threads` (jobs grow it to the workers
/// they use anyway, never beyond their number of items). One pool per distinct placement, the first
/// created when first asked for (after check_placement, which throws InvalidArgument or OsError), so
/// workers placed for one caller never run another's jobs. After fork() the child gets fresh pools (the
/// parent's threads do not exist there); the old ones are deliberately leaked. Pools are never destroyed,
/// so interpreter exit with work in flight cannot join a thread that waits for the GIL.
ThreadPool& shared_pool(std::size_t min_threads = 0, const Placement& placement = {});

/// The process-wide pool for jobs that mostly wait on the device (shuffle="blocks" reads whole files), one per
/// placement and placed as shared_pool's, but apart from it: shared_pool hands its workers to jobs first come,
/// first served, so a job of long reads there would hold every worker a gather needs until its reads end.
/// Grows, forks and lives as shared_pool does.
ThreadPool& shared_io_pool(std::size_t min_threads = 0, const Placement& placement = {});

/// The niceness of shared_background_pool's workers: the lowest priority there is.
inline constexpr int kBackgroundNice = 19;

/// The process-wide pool for work that no caller waits for (the populate of a mapped source's cached pages), one
/// per placement, its workers at niceness kBackgroundNice whatever the placement's: they run on CPUs that nothing
/// else wants and never take one from a gather, from the consumer or from another process on the node. Apart
/// from shared_io_pool, whose block reads and read-ahead hints callers do wait for. Throws as shared_pool does,
/// and OsError where this process may not lower its threads' priority. Grows, forks and lives as shared_pool does.
ThreadPool& shared_background_pool(std::size_t min_threads = 0, Placement placement = {});

}  // namespace npyfeed
