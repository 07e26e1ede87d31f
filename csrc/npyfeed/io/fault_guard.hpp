// Reading a mapping whose file shrinks underneath: the kernel raises SIGBUS at the first touch of a page
// past the file's new end (`np.save` over a file that a training job has mapped truncates it in place).
// A size check before the read is racy; instead npyfeed's own copy loops run "guarded": a SIGBUS raised
// inside one ends the copy and the caller reports the file, while every other SIGBUS (other threads,
// other code, a signal sent with kill) goes to whatever handler was installed before npyfeed's, or takes
// the default action, exactly as it would without npyfeed.
//
// The handler is installed once per process, at the first guarded copy (sigaction, SA_SIGINFO|SA_ONSTACK);
// the previous handler is kept and chained to. A handler installed later (e.g. faulthandler.enable()
// called after npyfeed's first gather) runs first and decides for itself; Python's faulthandler then
// prints a traceback before passing the signal on to npyfeed, which still recovers.
#pragma once

#include <type_traits>

namespace npyfeed {

/// Runs fn(context) on this thread with SIGBUS recovery armed. Returns true when fn ran to the end, false
/// when a read inside it raised SIGBUS (a page of a mapped file that shrank, or a failing device): fn is
/// then abandoned at the faulting instruction.
///
/// fn must be a plain copy or conversion over raw pointers: no locks, no allocation, no objects with
/// destructors, no exceptions, since the jump out skips whatever its frames would have done next.
/// Calls may nest (the innermost recovers). Async-signal-safe state only; thread-safe.
bool run_guarded(void (*fn)(void*), void* context) noexcept;

/// run_guarded() for a lambda (called by reference; it must follow the same rules).
template <class F>
bool guarded(F&& fn) noexcept {
  using Fn = std::remove_reference_t<F>;
  return run_guarded([](void* c) { (*static_cast<Fn*>(c))(); }, const_cast<std::remove_const_t<Fn>*>(&fn));
}

}  // namespace npyfeed
