// Placement of pool threads: check_placement refuses bad values and CPUs this process cannot use; a pool
// made for a placement runs every job on workers with that affinity, niceness and IO priority, while the
// calling thread and the pool of another placement (the default one included) keep theirs.
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <set>
#include <vector>

#include "check.hpp"
#include "npyfeed/common/errors.hpp"
#include "npyfeed/common/placement.hpp"
#include "npyfeed/common/thread_pool.hpp"

using namespace npyfeed;
using npyfeed::test::contains;

namespace {

struct ThreadState {
  std::vector<int> cpus;
  int nice = 0;
  int ioprio = 0;
  bool operator<(const ThreadState& o) const {
    return std::tie(cpus, nice, ioprio) < std::tie(o.cpus, o.nice, o.ioprio);
  }
  bool operator==(const ThreadState& o) const = default;
};

ThreadState this_thread_state() {
  ThreadState s;
  cpu_set_t set;
  CPU_ZERO(&set);
  sched_getaffinity(0, sizeof(set), &set);
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) s.cpus.push_back(c);
  }
  const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
  errno = 0;
  s.nice = ::getpriority(PRIO_PROCESS, tid);
  s.ioprio = static_cast<int>(::syscall(SYS_ioprio_get, 1, tid));
  return s;
}

// The distinct states of the workers that ran `items` items on `pool`.
std::set<ThreadState> worker_states(ThreadPool& pool, std::size_t workers) {
  std::mutex mutex;
  std::set<ThreadState> states;
  pool.run(64, workers, [&](std::size_t) {
    ThreadState s = this_thread_state();
    std::lock_guard lock(mutex);
    states.insert(s);
  });
  return states;
}

Placement on_cpus(std::vector<int> cpus) {
  Placement p;
  p.cpus = std::move(cpus);
  return p;
}
Placement with_nice(int nice) {
  Placement p;
  p.nice = nice;
  return p;
}
Placement with_io(int io_class, int level) {
  Placement p;
  p.io_class = io_class;
  p.io_level = level;
  return p;
}

}  // namespace

TEST_CASE("bad placements are InvalidArgument") {
  auto refused = [](Placement p, const char* words) {
    auto e = CHECK_THROWS(InvalidArgument, check_placement(p));
    if (e) CHECK(contains(e->what(), words));
  };
  refused(on_cpus({-1}), "CPU numbers");
  refused(on_cpus({CPU_SETSIZE}), "CPU numbers");
  refused(on_cpus({1, 0}), "sorted");
  refused(on_cpus({0, 0}), "distinct");
  refused(with_nice(20), "nice");
  refused(with_nice(-21), "nice");
  refused(with_io(0, 4), "class");
  refused(with_io(2, 8), "level");
  // A CPU this machine does not have (or this process may not use): named, with the available ones.
  auto e = CHECK_THROWS(InvalidArgument, check_placement(on_cpus({0, CPU_SETSIZE - 1})));
  if (e) {
    CHECK(contains(e->what(), std::to_string(CPU_SETSIZE - 1)));
    CHECK(contains(e->what(), "available: "));
  }
  CHECK_THROWS(InvalidArgument, shared_pool(1, on_cpus({CPU_SETSIZE - 1})));
}

TEST_CASE("a placed pool's workers, and only they, are placed") {
  const ThreadState caller = this_thread_state();
  const int cpu = caller.cpus.back();
  const int nice = std::min(caller.nice + 3, 19);
  Placement placement = on_cpus({cpu});
  placement.nice = nice;
  placement.io_class = 3;
  ThreadPool& placed = shared_pool(3, placement);
  CHECK(&placed == &shared_pool(0, placement));       // one pool per placement
  CHECK(&placed != &shared_pool(0));                  // not the default pool
  CHECK(&placed != &shared_pool(0, on_cpus({cpu})));  // nor another placement's
  const ThreadState want{{cpu}, nice, 3 << 13};
  const std::set<ThreadState> states = worker_states(placed, 3);
  CHECK_EQ(states.size(), 1u);
  CHECK(*states.begin() == want);
  CHECK(this_thread_state() == caller);  // the caller is untouched
  // The default pool's workers run as the caller does.
  for (const ThreadState& s : worker_states(shared_pool(3), 3)) {
    CHECK(s.cpus == caller.cpus);
    CHECK_EQ(s.nice, caller.nice);
  }
  // Best-effort level 6 (and a pool grown later: new workers are placed too).
  ThreadPool& be = shared_pool(1, with_io(2, 6));
  be.ensure_size(4);
  for (const ThreadState& s : worker_states(be, 4)) CHECK_EQ(s.ioprio, (2 << 13) | 6);
}
