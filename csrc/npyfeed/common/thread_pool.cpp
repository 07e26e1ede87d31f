#include "npyfeed/common/thread_pool.hpp"

#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <cfenv>
#include <map>

#include "npyfeed/common/errors.hpp"

namespace npyfeed {

Job::Job(std::size_t count, std::function<void(std::size_t)> fn)
    : count_(count), pid_(::getpid()), fn_(std::move(fn)) {}

bool Job::orphaned() const noexcept { return ::getpid() != pid_; }

void Job::throw_if_orphaned() const {
  if (orphaned()) {
    throw InvalidArgument(
        "this npyfeed job was started before fork() and cannot finish in the child process; "
        "create iterators after forking");
  }
}

namespace {
// This thread's CPU time: a worker blocked in a read (O_DIRECT's blocking readers, a page fault) or waiting
// for a core uses none, so a job's figure says how much computing it took, not how long its workers waited.
std::uint64_t thread_cpu_ns() noexcept {
  timespec ts{};
  if (::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<std::uint64_t>(ts.tv_nsec);
}
}  // namespace

void Job::run_items() {
  const std::uint64_t started = thread_cpu_ns();
  while (!cancelled()) {
    std::size_t i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= count_) break;
    try {
      fn_(i);
    } catch (...) {
      std::lock_guard lock(mutex_);
      if (!error_) error_ = std::current_exception();
      cancel();
    }
    items_done_.fetch_add(1, std::memory_order_relaxed);
  }
  // Counted before the job is seen finished, so a waiter that returned reads the whole figure.
  const std::uint64_t stopped = thread_cpu_ns();
  cpu_ns_.fetch_add(stopped > started ? stopped - started : 0, std::memory_order_relaxed);
  std::lock_guard lock(mutex_);
  if (--runners_left_ == 0) finished_.notify_all();
}

bool Job::wait_for(std::chrono::milliseconds timeout) {
  throw_if_orphaned();
  std::unique_lock lock(mutex_);
  return finished_.wait_for(lock, timeout, [this] { return runners_left_ == 0; });
}

void Job::wait() {
  throw_if_orphaned();
  {
    std::unique_lock lock(mutex_);
    finished_.wait(lock, [this] { return runners_left_ == 0; });
  }
  rethrow_if_failed();
}

void Job::rethrow_if_failed() {
  std::exception_ptr error;
  {
    std::lock_guard lock(mutex_);
    error = error_;
  }
  if (error) std::rethrow_exception(error);
  if (cancelled() && items_done_.load() < count_) throw Cancelled();
}

ThreadPool::ThreadPool(std::size_t threads, Placement placement) : placement_(std::move(placement)) {
  ensure_size(threads);
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
}

std::size_t ThreadPool::size() const {
  std::lock_guard lock(mutex_);
  return threads_.size();
}

void ThreadPool::ensure_size(std::size_t threads) {
  std::unique_lock lock(mutex_);
  while (threads_.size() < threads) threads_.emplace_back([this] { worker_loop(); });
  // Returns once every worker has placed and named itself: none is ever seen (or runs) unplaced.
  started_.wait(lock, [this] { return workers_started_ == threads_.size(); });
}

void ThreadPool::worker_loop() {
  // A new thread inherits the floating-point environment of the thread that created it, e.g. the
  // flush-to-zero mode TensorFlow sets in its threads when a gather first runs inside tf.data. Workers
  // start from the default environment so conversions keep subnormals, as numpy does.
  std::fesetenv(FE_DFL_ENV);
  if (!placement_.empty()) {
    try {
      apply_placement(placement_);
    } catch (const Error&) {
      // Checked before the pool was made (check_placement); a CPU gone offline since leaves this worker as it is.
    }
  }
  // Named for `top -H` and /proc/<pid>/task/*/comm.
  pthread_setname_np(pthread_self(), "npyfeed");
  {
    std::lock_guard lock(mutex_);
    ++workers_started_;
  }
  started_.notify_all();
  while (true) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !runners_.empty(); });
      if (runners_.empty()) return;  // stopping
      job = std::move(runners_.front());
      runners_.pop_front();
    }
    job->run_items();
  }
}

std::shared_ptr<Job> ThreadPool::prepare(std::size_t count, std::size_t max_workers,
                                         std::function<void(std::size_t)> fn) {
  auto job = std::make_shared<Job>(count, std::move(fn));
  const std::size_t runners = std::min(count, std::max<std::size_t>(max_workers, 1));
  if (runners == 0) return job;  // nothing to do: already finished
  ensure_size(runners);
  std::lock_guard job_lock(job->mutex_);
  job->runners_left_ = runners;
  job->runners_ = runners;
  return job;
}

void ThreadPool::launch(const std::shared_ptr<Job>& job) {
  if (job->launched_.exchange(true)) return;  // once: its runners count down runners_left_ exactly once each
  {
    std::lock_guard lock(mutex_);
    for (std::size_t r = 0; r < job->runners_; ++r) runners_.push_back(job);
  }
  if (job->runners_ > 0) wake_.notify_all();
}

std::shared_ptr<Job> ThreadPool::start(std::size_t count, std::size_t max_workers,
                                       std::function<void(std::size_t)> fn) {
  auto job = prepare(count, max_workers, std::move(fn));
  launch(job);
  return job;
}

void ThreadPool::run(std::size_t count, std::size_t max_workers, std::function<void(std::size_t)> fn) {
  start(count, max_workers, std::move(fn))->wait();
}

namespace {
std::mutex g_pool_mutex;
// One pool per placement, for compute, for device waits and for background work apart; leaked, as the pools are.
struct Pools {
  std::map<Placement, ThreadPool*> compute;
  std::map<Placement, ThreadPool*> io;
  std::map<Placement, ThreadPool*> background;
};
Pools* g_pools = nullptr;
pid_t g_pool_pid = 0;

// fork() while another thread holds g_pool_mutex would leave it locked forever in the child: hold it
// across fork so that both sides start with it free.
void lock_before_fork() { g_pool_mutex.lock(); }
void unlock_after_fork() { g_pool_mutex.unlock(); }
const bool g_atfork_registered = [] {
  pthread_atfork(lock_before_fork, unlock_after_fork, unlock_after_fork);
  return true;
}();

ThreadPool& pool_of(std::map<Placement, ThreadPool*> Pools::* kind, std::size_t min_threads,
                    const Placement& placement) {
  std::lock_guard lock(g_pool_mutex);
  if (g_pools == nullptr || g_pool_pid != ::getpid()) {
    // In a forked child the old pools' threads are gone and their mutexes may be held forever: abandon them.
    g_pools = new Pools();
    g_pool_pid = ::getpid();
  }
  std::map<Placement, ThreadPool*>& pools = g_pools->*kind;
  ThreadPool*& pool = pools[placement];
  if (pool == nullptr) {
    try {
      if (!placement.empty()) check_placement(placement);
    } catch (...) {
      pools.erase(placement);
      throw;
    }
    pool = new ThreadPool(0, placement);
  }
  pool->ensure_size(min_threads);
  return *pool;
}
}  // namespace

ThreadPool& shared_pool(std::size_t min_threads, const Placement& placement) {
  return pool_of(&Pools::compute, min_threads, placement);
}

ThreadPool& shared_io_pool(std::size_t min_threads, const Placement& placement) {
  return pool_of(&Pools::io, min_threads, placement);
}

ThreadPool& shared_background_pool(std::size_t min_threads, Placement placement) {
  placement.nice = kBackgroundNice;
  return pool_of(&Pools::background, min_threads, placement);
}

}  // namespace npyfeed
