#include "npyfeed/common/placement.hpp"

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <exception>
#include <thread>

#include "npyfeed/common/errors.hpp"

namespace npyfeed {

namespace {

// <linux/ioprio.h>, which glibc does not wrap.
constexpr int kIoprioWhoProcess = 1;
constexpr int kIoprioClassShift = 13;

pid_t this_thread_id() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

std::vector<int> affinity_of_this_thread() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

void set_affinity(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  if (::sched_setaffinity(0, sizeof(set), &set) != 0) throw OsError(errno, "", "cannot set the CPU affinity");
}

}  // namespace

std::string cpu_list(const std::vector<int>& cpus) {
  std::string out;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) out += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

void apply_placement(const Placement& placement) {
  if (!placement.cpus.empty()) set_affinity(placement.cpus);
  const pid_t tid = this_thread_id();
  if (placement.nice && ::setpriority(PRIO_PROCESS, static_cast<id_t>(tid), *placement.nice) != 0) {
    throw OsError(errno, "", "cannot set the niceness of npyfeed's threads to " + std::to_string(*placement.nice));
  }
  if (placement.io_class) {
    const int level = *placement.io_class == 3 ? 0 : placement.io_level;
    const int value = (*placement.io_class << kIoprioClassShift) | level;
    if (::syscall(SYS_ioprio_set, kIoprioWhoProcess, tid, value) != 0) {
      throw OsError(errno, "", "cannot set the IO priority of npyfeed's threads");
    }
  }
}

void check_placement(const Placement& placement) {
  for (int c : placement.cpus) {
    if (c < 0 || c >= CPU_SETSIZE) {
      throw InvalidArgument("cpus must be CPU numbers from 0 to " + std::to_string(CPU_SETSIZE - 1) + ", got " +
                            std::to_string(c));
    }
  }
  if (!std::is_sorted(placement.cpus.begin(), placement.cpus.end()) ||
      std::adjacent_find(placement.cpus.begin(), placement.cpus.end()) != placement.cpus.end()) {
    throw InvalidArgument("cpus must be sorted and distinct");
  }
  if (placement.nice && (*placement.nice < -20 || *placement.nice > 19)) {
    throw InvalidArgument("nice must be from -20 to 19, got " + std::to_string(*placement.nice));
  }
  if (placement.io_class && (*placement.io_class < 1 || *placement.io_class > 3)) {
    throw InvalidArgument("the IO priority class must be 1 (realtime), 2 (best-effort) or 3 (idle)");
  }
  if (placement.io_level < 0 || placement.io_level > 7) {
    throw InvalidArgument("the IO priority level must be from 0 to 7, got " + std::to_string(placement.io_level));
  }
  // Applied for real, on a thread of its own: what the kernel allows this process is what counts.
  std::exception_ptr error;
  std::thread probe([&] {
    try {
      if (!placement.cpus.empty()) {
        // Every CPU asked for: the kernel keeps those online and in our cpuset.
        std::vector<int> all(CPU_SETSIZE);
        for (int c = 0; c < CPU_SETSIZE; ++c) all[static_cast<std::size_t>(c)] = c;
        set_affinity(all);
        const std::vector<int> available = affinity_of_this_thread();
        std::vector<int> missing;
        std::set_difference(placement.cpus.begin(), placement.cpus.end(), available.begin(), available.end(),
                            std::back_inserter(missing));
        if (!missing.empty()) {
          throw InvalidArgument(
              "cpus " + cpu_list(missing) +
              " cannot be used by this process (offline, or outside its cpuset); available: " + cpu_list(available));
        }
      }
      apply_placement(placement);
    } catch (...) {
      error = std::current_exception();
    }
  });
  probe.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace npyfeed
