// The GIL and waits: running core work with the GIL released, and waiting for the core's jobs so that Ctrl-C
// still interrupts and interpreter exit never deadlocks.
#pragma once

#include <pybind11/pybind11.h>

#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <type_traits>

#include "npyfeed/common/thread_pool.hpp"

namespace npyfeed::bindings {

namespace py = pybind11;

/// Takes the GIL back (PyEval_RestoreThread). While the interpreter finalizes, CPython < 3.14 ends a thread that
/// asks for the GIL with pthread_exit(): with libstdc++ that forced unwind runs through ordinary frames and
/// pybind11 rethrows it, so the daemon thread just ends. libc++ has no abi::__forced_unwind, so pybind11 would
/// swallow it (and the process abort): there the unwind is caught here and the thread parks, as CPython 3.14
/// itself does with such threads. (The wheels link the system's libgcc_s unwinder, the one pthread_exit uses.)
void restore_gil(PyThreadState* state);

// Runs `fn` with the GIL released. Unlike py::gil_scoped_release it takes the GIL back outside any
// destructor: a forced unwind (above) must not cross a noexcept frame (std::terminate, SIGABRT).
template <class F>
auto without_gil(F&& fn) -> decltype(fn()) {
  using R = decltype(fn());
  PyThreadState* state = PyEval_SaveThread();
  std::exception_ptr error;
  if constexpr (std::is_void_v<R>) {
    try {
      fn();
    } catch (...) {
      error = std::current_exception();
    }
    restore_gil(state);
    if (error) std::rethrow_exception(error);
  } else {
    std::optional<R> result;
    try {
      result.emplace(fn());
    } catch (...) {
      error = std::current_exception();
    }
    restore_gil(state);
    if (error) std::rethrow_exception(error);
    return std::move(*result);
  }
}

/// The thread that runs Python's signal handlers (threading.main_thread()'s ident, asked once).
unsigned long main_thread_id();

/// Whether the interpreter is finalizing (a thread asking for the GIL now would be ended).
bool interpreter_finalizing();

// Cancels a job and waits for its running items when the frame that owns the job's memory unwinds
// (an exception, KeyboardInterrupt, or a thread ended during interpreter exit): workers never write
// into memory that is gone.
class JobGuard {
 public:
  explicit JobGuard(std::shared_ptr<Job> job) : job_(std::move(job)) {}
  ~JobGuard() {
    if (!job_ || job_->orphaned()) return;
    job_->cancel();
    while (!job_->wait_for(std::chrono::milliseconds(1000))) {
    }
  }
  JobGuard(const JobGuard&) = delete;
  JobGuard& operator=(const JobGuard&) = delete;

 private:
  std::shared_ptr<Job> job_;
};

/// Waits for `job` with the GIL released, waking every 50 ms to run Python signal handlers (Ctrl-C) and
/// `on_tick`. A KeyboardInterrupt cancels the job, waits for running items, and propagates.
void wait_interruptibly(const std::shared_ptr<Job>& job, const std::function<void()>& on_tick = {});

/// Waits for `job` with the GIL released, in slices, running Python's signal handlers between them: a Ctrl-C
/// raises KeyboardInterrupt here. For jobs whose memory a stream owns (the stream cancels them when dropped).
void wait_in_slices(Job& job);

}  // namespace npyfeed::bindings
