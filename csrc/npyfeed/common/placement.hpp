// Where npyfeed's worker threads run: CPU affinity, niceness and IO priority. Each worker of a pool
// applies its pool's placement to itself when it starts, so a placement never reaches the caller's
// threads or another pool's (shared_pool keeps one pool per placement). Linux: sched_setaffinity,
// setpriority(PRIO_PROCESS, tid) and ioprio_set(IOPRIO_WHO_PROCESS, tid) all act on one thread.
#pragma once

#include <compare>
#include <optional>
#include <string>
#include <vector>

namespace npyfeed {

struct Placement {
  /// CPUs the workers may run on (sorted, distinct); empty: those of the thread that starts them.
  std::vector<int> cpus;
  /// Niceness of the workers, -20 (most favoured) to 19; unset: inherited.
  std::optional<int> nice;
  /// IO scheduling class of the workers: 1 realtime, 2 best-effort, 3 idle; unset: inherited.
  std::optional<int> io_class;
  /// Level within the class, 0 (highest) to 7; ignored for idle.
  int io_level = 4;

  bool empty() const noexcept { return cpus.empty() && !nice && !io_class; }
  auto operator<=>(const Placement&) const = default;
};

/// Checks `placement` once: its values, then that this process may apply it, by applying it to a
/// short-lived thread (every CPU online and in the process's cpuset; a lower niceness or the realtime
/// IO class needs privileges). Throws InvalidArgument (bad values, unavailable CPUs, naming them and the
/// available ones), OsError (EPERM, EACCES).
void check_placement(const Placement& placement);

/// Applies `placement` to the calling thread. Throws OsError where a call fails.
void apply_placement(const Placement& placement);

/// "0-3,8,10-11".
std::string cpu_list(const std::vector<int>& cpus);

}  // namespace npyfeed
