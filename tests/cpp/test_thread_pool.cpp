// The thread pool and its jobs: every item exactly once, the worker limit, first-exception-wins with
// cancellation, cancel(), wait_for, many jobs from many threads, empty jobs, fork, and the CPU time a job
// counts. No test depends on timing: where a test needs workers to be at a certain point, a gate holds them
// there.
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "check.hpp"
#include "npyfeed/common/errors.hpp"
#include "npyfeed/common/thread_pool.hpp"

using namespace npyfeed;
using namespace std::chrono_literals;

namespace {

// Holds items until opened; counts who arrived so the test can wait for exactly N of them.
class Gate {
 public:
  void arrive_and_wait() {
    std::unique_lock lock(mutex_);
    ++arrived_;
    changed_.notify_all();
    changed_.wait(lock, [this] { return open_; });
  }
  void wait_for_arrivals(int n) {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return arrived_ >= n; });
  }
  void open() {
    std::lock_guard lock(mutex_);
    open_ = true;
    changed_.notify_all();
  }
  int arrived() {
    std::lock_guard lock(mutex_);
    return arrived_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  int arrived_ = 0;
  bool open_ = false;
};

}  // namespace

TEST_CASE("every item runs exactly once") {
  ThreadPool pool(4);
  constexpr std::size_t kCount = 20000;
  std::vector<std::atomic<int>> hits(kCount);
  pool.run(kCount, 4, [&](std::size_t i) { hits[i].fetch_add(1); });
  std::size_t once = 0;
  for (auto& h : hits) once += h.load() == 1 ? 1 : 0;
  CHECK_EQ(once, kCount);
}

TEST_CASE("a job uses at most max_workers threads") {
  ThreadPool pool(8);
  for (std::size_t max_workers : {1u, 3u, 8u}) {
    std::mutex mutex;
    std::set<std::thread::id> ids;
    std::atomic<int> running{0};
    std::atomic<int> peak{0};
    pool.run(5000, max_workers, [&](std::size_t) {
      int now = running.fetch_add(1) + 1;
      int p = peak.load();
      while (now > p && !peak.compare_exchange_weak(p, now)) {
      }
      {
        std::lock_guard lock(mutex);
        ids.insert(std::this_thread::get_id());
      }
      running.fetch_sub(1);
    });
    CHECK(ids.size() <= max_workers);
    CHECK(peak.load() <= static_cast<int>(max_workers));
    CHECK(ids.count(std::this_thread::get_id()) == 0);  // the caller only waits
  }
  // max_workers larger than the pool grows it; 0 means one worker.
  ThreadPool small(1);
  small.run(100, 6, [](std::size_t) {});
  CHECK(small.size() >= 6u);
  std::atomic<int> n{0};
  small.run(10, 0, [&](std::size_t) { n.fetch_add(1); });
  CHECK_EQ(n.load(), 10);
}

TEST_CASE("all workers are used when items block") {
  // Four items that each wait until all four have started: only possible if four threads run them.
  ThreadPool pool(4);
  Gate gate;
  auto job = pool.start(4, 4, [&](std::size_t) { gate.arrive_and_wait(); });
  gate.wait_for_arrivals(4);
  gate.open();
  job->wait();
  CHECK_EQ(job->items_done(), 4u);
}

TEST_CASE("cpu_ns counts the workers' CPU time, not the time they were blocked") {
  // Four workers held at a gate while this thread sleeps: blocked all along, they use next to no CPU. A clock
  // of the workers' wall time would count at least 4 x 200 ms.
  ThreadPool pool(4);
  Gate gate;
  auto blocked = pool.start(4, 4, [&](std::size_t) { gate.arrive_and_wait(); });
  gate.wait_for_arrivals(4);
  std::this_thread::sleep_for(200ms);
  gate.open();
  blocked->wait();
  CHECK(blocked->cpu_ns() < 200'000'000u);
  // Two items that each compute until their own thread's CPU clock has moved 20 ms: at least 40 ms counted.
  auto busy = pool.start(2, 2, [](std::size_t) {
    timespec start{}, now{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start);
    do {
      ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    } while ((now.tv_sec - start.tv_sec) * 1'000'000'000L + (now.tv_nsec - start.tv_nsec) < 20'000'000L);
  });
  busy->wait();
  CHECK(busy->cpu_ns() >= 40'000'000u);
}

TEST_CASE("with one worker, the first exception stops the job at once") {
  ThreadPool pool(2);
  std::atomic<int> ran{0};
  auto job = pool.start(100, 1, [&](std::size_t i) {
    ran.fetch_add(1);
    if (i >= 5) throw std::runtime_error("boom " + std::to_string(i));
  });
  auto e = CHECK_THROWS(std::runtime_error, job->wait());
  if (e) CHECK_EQ(std::string(e->what()), std::string("boom 5"));
  CHECK_EQ(ran.load(), 6);
  CHECK(job->cancelled());
  CHECK(job->wait_for(std::chrono::milliseconds(0)));
  // The error stays: waiting again rethrows the same one.
  auto again = CHECK_THROWS(std::runtime_error, job->wait());
  if (again) CHECK_EQ(std::string(again->what()), std::string("boom 5"));
}

TEST_CASE("first exception wins and cancels the rest") {
  ThreadPool pool(4);
  constexpr std::size_t kCount = 100000;
  constexpr std::size_t kFailFrom = 100;
  std::atomic<std::size_t> started{0};
  auto job = pool.start(kCount, 4, [&](std::size_t i) {
    started.fetch_add(1);
    if (i >= kFailFrom) throw std::runtime_error(std::to_string(i));
  });
  auto e = CHECK_THROWS(std::runtime_error, job->wait());
  if (e) CHECK(std::stoul(e->what()) >= kFailFrom);
  // Every failing item cancels its own runner, so each of the 4 runners runs at most one of them.
  CHECK(started.load() <= kFailFrom + 4);
  CHECK(started.load() >= kFailFrom + 1);
  // npyfeed's own errors pass through unchanged.
  auto os = CHECK_THROWS(OsError, pool.run(10, 2, [](std::size_t i) {
    if (i == 3) throw OsError(5, "/data/x.npy", "cannot read");
  }));
  if (os) CHECK_EQ(os->error_number(), 5);
  if (os) CHECK_EQ(os->path(), std::string("/data/x.npy"));
}

TEST_CASE("cancel stops handing out items; running ones finish") {
  ThreadPool pool(3);
  Gate gate;
  std::atomic<int> finished{0};
  auto job = pool.start(1000, 3, [&](std::size_t) {
    gate.arrive_and_wait();
    finished.fetch_add(1);
  });
  gate.wait_for_arrivals(3);
  CHECK(!job->wait_for(std::chrono::milliseconds(0)));
  job->cancel();
  gate.open();
  CHECK_THROWS(Cancelled, job->wait());
  CHECK_EQ(finished.load(), 3);
  CHECK_EQ(job->items_done(), 3u);
  CHECK_EQ(gate.arrived(), 3);
  // A job cancelled after all its items ran is not an error.
  auto full = pool.start(5, 2, [](std::size_t) {});
  full->wait();
  full->cancel();
  full->rethrow_if_failed();
}

TEST_CASE("wait_for reports whether the job finished") {
  ThreadPool pool(2);
  Gate gate;
  auto job = pool.start(2, 2, [&](std::size_t) { gate.arrive_and_wait(); });
  gate.wait_for_arrivals(2);
  CHECK(!job->wait_for(1ms));  // both items are held at the gate
  CHECK(!job->wait_for(std::chrono::milliseconds(0)));
  gate.open();
  while (!job->wait_for(10min)) {
  }
  CHECK(job->wait_for(std::chrono::milliseconds(0)));
  CHECK_EQ(job->items_done(), 2u);
  // wait_for does not rethrow; rethrow_if_failed does.
  auto failing = pool.start(1, 1, [](std::size_t) { throw std::runtime_error("late"); });
  while (!failing->wait_for(10min)) {
  }
  CHECK_THROWS(std::runtime_error, failing->rethrow_if_failed());
}

TEST_CASE("a prepared job runs nothing until launched, then every item once; a second launch does nothing") {
  ThreadPool pool(2);
  std::atomic<int> calls{0};
  auto job = pool.prepare(8, 2, [&](std::size_t) { calls.fetch_add(1); });
  // Nothing is handed to the workers: a job that would finish in microseconds is still not done.
  for (int i = 0; i < 20; ++i) {
    CHECK(!job->wait_for(1ms));
    CHECK_EQ(calls.load(), 0);
  }
  pool.launch(job);
  pool.launch(job);           // once only: a second would hand out runners again and never see the job finish
  CHECK(job->wait_for(60s));  // (a minute: only a broken launch comes near it)
  CHECK_EQ(calls.load(), 8);
  CHECK_EQ(job->items_done(), 8u);
  // The workers are all free again: a job that needs both finishes.
  Gate gate;
  auto both = pool.start(2, 2, [&](std::size_t) { gate.arrive_and_wait(); });
  gate.wait_for_arrivals(2);
  gate.open();
  both->wait();
}

TEST_CASE("a prepared job cancelled before its launch finishes at launch without running an item") {
  ThreadPool pool(2);
  std::atomic<int> calls{0};
  auto job = pool.prepare(4, 2, [&](std::size_t) { calls.fetch_add(1); });
  job->cancel();
  CHECK(!job->wait_for(0ms));  // its runners have not been handed out yet
  pool.launch(job);
  while (!job->wait_for(10min)) {
  }
  CHECK_EQ(calls.load(), 0);
  CHECK_THROWS(Cancelled, job->rethrow_if_failed());
  auto empty = pool.prepare(0, 2, [&](std::size_t) { calls.fetch_add(1); });
  CHECK(empty->wait_for(0ms));  // 0 items: finished before any launch
  pool.launch(empty);
  CHECK_EQ(calls.load(), 0);
}

TEST_CASE("progress counters") {
  ThreadPool pool(4);
  std::shared_ptr<Job> job;
  std::mutex mutex;
  {
    // Items bump the job's own progress counter (as the loader counts bytes); the job is published
    // to them under a lock before they can run past it.
    std::unique_lock lock(mutex);
    job = pool.start(1000, 4, [&](std::size_t i) {
      std::shared_ptr<Job> self;
      {
        std::lock_guard item_lock(mutex);
        self = job;
      }
      self->progress().fetch_add(i);
    });
  }
  job->wait();
  CHECK_EQ(job->items_done(), 1000u);
  CHECK_EQ(job->progress().load(), 999u * 1000u / 2);
}

TEST_CASE("a job of 0 items is finished at once") {
  ThreadPool pool(2);
  std::atomic<int> calls{0};
  auto job = pool.start(0, 4, [&](std::size_t) { calls.fetch_add(1); });
  CHECK(job->wait_for(std::chrono::milliseconds(0)));
  CHECK(job->wait_for(0ms));
  job->wait();
  CHECK_EQ(calls.load(), 0);
  CHECK_EQ(job->items_done(), 0u);
  pool.run(0, 1, [&](std::size_t) { calls.fetch_add(1); });
  CHECK_EQ(calls.load(), 0);
}

TEST_CASE("many jobs started from several threads at once") {
  ThreadPool pool(4);
  constexpr int kThreads = 8;
  constexpr int kJobsEach = 40;
  constexpr std::size_t kItems = 200;
  std::atomic<std::uint64_t> total{0};
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int j = 0; j < kJobsEach; ++j) {
        std::atomic<std::uint64_t> sum{0};
        std::size_t workers = static_cast<std::size_t>(1 + (t + j) % 4);
        if (j % 5 == 4) {
          // Some jobs fail; their error must reach this thread's waiter and no other.
          auto job = pool.start(kItems, workers, [&, t](std::size_t i) {
            if (i == 17) throw std::runtime_error("thread " + std::to_string(t));
          });
          try {
            job->wait();
            wrong.fetch_add(1);
          } catch (const std::runtime_error& e) {
            if (std::string(e.what()) != "thread " + std::to_string(t)) wrong.fetch_add(1);
          }
          continue;
        }
        pool.run(kItems, workers, [&](std::size_t i) { sum.fetch_add(i + 1); });
        if (sum.load() != kItems * (kItems + 1) / 2) wrong.fetch_add(1);
        total.fetch_add(sum.load());
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK_EQ(wrong.load(), 0);
  CHECK_EQ(total.load(), std::uint64_t{kThreads} * (kJobsEach - kJobsEach / 5) * (kItems * (kItems + 1) / 2));
}

TEST_CASE("shared_pool grows and is one pool") {
  ThreadPool& a = shared_pool(2);
  ThreadPool& b = shared_pool(3);
  CHECK(&a == &b);
  CHECK(b.size() >= 3u);
  std::atomic<int> n{0};
  b.run(50, 3, [&](std::size_t) { n.fetch_add(1); });
  CHECK_EQ(n.load(), 50);
}

TEST_CASE("shared_io_pool is apart from shared_pool: jobs that hold every worker of one leave the other free") {
  ThreadPool& compute = shared_pool(2);
  ThreadPool& io = shared_io_pool(2);
  CHECK(&compute != &io);
  CHECK(&io == &shared_io_pool(3));  // one pool, grown
  CHECK(io.size() >= 3u);
  // Every worker of the io pool waits (as in long reads), and more runners queue behind them.
  Gate gate;
  const std::size_t held = io.size() + 2;
  auto waiting = io.start(held, held, [&](std::size_t) { gate.arrive_and_wait(); });
  gate.wait_for_arrivals(static_cast<int>(held));
  std::atomic<int> n{0};
  compute.run(50, 2, [&](std::size_t) { n.fetch_add(1); });  // the compute pool is not held
  CHECK_EQ(n.load(), 50);
  gate.open();
  waiting->wait();
  CHECK_EQ(waiting->items_done(), held);
}

TEST_CASE("shared_background_pool: apart from the others, its workers at the lowest priority whatever the placement") {
  ThreadPool& background = shared_background_pool(1);
  CHECK(&background != &shared_pool());
  CHECK(&background != &shared_io_pool());
  CHECK(&background == &shared_background_pool(2));  // one pool, grown
  Placement niced;
  niced.nice = 5;
  CHECK(&shared_background_pool(1, niced) == &background);  // the niceness asked for is not the pool's
  Placement idle_io;
  idle_io.io_class = 3;  // idle: allowed to any process
  ThreadPool& other = shared_background_pool(1, idle_io);
  CHECK(&other != &background);  // one per placement
  for (ThreadPool* pool : {&background, &other}) {
    std::mutex mutex;
    std::set<int> seen;
    pool->run(pool->size(), pool->size(), [&](std::size_t) {
      errno = 0;
      const int nice = ::getpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)));
      std::lock_guard lock(mutex);
      seen.insert(errno == 0 ? nice : -100);
    });
    CHECK(seen == std::set<int>{kBackgroundNice});
  }
}

TEST_CASE("a forked child gets a working shared_pool") {
  // The parent's pool has running threads; in the child they do not exist.
  ThreadPool& parent = shared_pool(4);
  std::atomic<int> n{0};
  parent.run(100, 4, [&](std::size_t) { n.fetch_add(1); });
  REQUIRE(n.load() == 100);
  std::fflush(nullptr);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int code = 0;
    try {
      ThreadPool& child = shared_pool(3);
      if (&child == &parent) code = 2;
      std::atomic<std::uint64_t> sum{0};
      child.run(1000, 3, [&](std::size_t i) { sum.fetch_add(i); });
      if (sum.load() != 999u * 1000u / 2) code = 3;
      auto failing = child.start(10, 2, [](std::size_t i) {
        if (i == 4) throw std::runtime_error("child");
      });
      try {
        failing->wait();
        code = 4;
      } catch (const std::runtime_error&) {
      }
    } catch (...) {
      code = 5;
    }
    std::_Exit(code);  // no atexit handlers or static destructors in the child
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK_EQ(WEXITSTATUS(status), 0);
  // The parent's pool is untouched.
  n = 0;
  shared_pool(4).run(100, 4, [&](std::size_t) { n.fetch_add(1); });
  CHECK_EQ(n.load(), 100);
}

TEST_CASE("a job started before fork raises in the child instead of hanging") {
  // Its workers exist only in the parent: in the child nothing would ever finish it.
  ThreadPool& pool = shared_pool(2);
  Gate gate;
  auto job = pool.start(2, 2, [&](std::size_t) { gate.arrive_and_wait(); });
  gate.wait_for_arrivals(2);
  std::fflush(nullptr);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int code = 0;
    if (!job->orphaned()) code = 2;
    try {
      job->wait();
      code = 3;
    } catch (const InvalidArgument&) {
    } catch (...) {
      code = 4;
    }
    std::_Exit(code);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK_EQ(WEXITSTATUS(status), 0);
  CHECK(!job->orphaned());
  gate.open();
  job->wait();
  CHECK_EQ(job->items_done(), 2u);
}

TEST_CASE("destroying an idle pool joins its threads") {
  for (int round = 0; round < 20; ++round) {
    ThreadPool pool(static_cast<std::size_t>(1 + round % 4));
    std::atomic<int> n{0};
    pool.run(static_cast<std::size_t>(round), 4, [&](std::size_t) { n.fetch_add(1); });
    CHECK_EQ(n.load(), round);
  }
}
