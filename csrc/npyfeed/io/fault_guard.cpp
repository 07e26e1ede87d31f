#include "npyfeed/io/fault_guard.hpp"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <mutex>

namespace npyfeed {

namespace {

// The armed copy of this thread, or null. initial-exec TLS: reading it from the signal handler must not
// allocate (a module loaded with dlopen gets lazily allocated TLS otherwise), and a thread that never armed
// reads null without touching anything else.
__attribute__((tls_model("initial-exec"))) thread_local sigjmp_buf* t_armed = nullptr;

struct sigaction g_previous;  // written once, before our handler is installed; read only by the handler
std::once_flag g_install_once;

// Passes a SIGBUS that is not ours on, as if npyfeed's handler had never been installed.
void chain(int sig, siginfo_t* info, void* ucontext) {
  const struct sigaction& previous = g_previous;
  const bool is_handler = (previous.sa_flags & SA_SIGINFO) != 0
                              ? previous.sa_sigaction != nullptr
                              : previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN;
  if (is_handler) {
    if ((previous.sa_flags & SA_RESETHAND) != 0) {
      struct sigaction dfl = {};
      dfl.sa_handler = SIG_DFL;
      ::sigaction(sig, &dfl, nullptr);
    }
    if ((previous.sa_flags & SA_SIGINFO) != 0) {
      previous.sa_sigaction(sig, info, ucontext);
    } else {
      previous.sa_handler(sig);
    }
    return;
  }
  // The default action (or ignore): hand the signal back to the kernel with the old disposition. A fault
  // happens again when the instruction is retried on return (and the kernel kills with SIGBUS, as it would
  // have); a signal sent by kill()/raise() is raised again (pending until this handler returns).
  ::sigaction(sig, &previous, nullptr);
  if (info == nullptr || info->si_code <= 0) ::raise(sig);
}

// Whether a SIGBUS on a thread inside a guarded copy comes from that copy: a fault raised by the kernel
// (si_code > 0: BUS_ADRERR past the end of a file, BUS_OBJERR, a memory error), or the same fault raised
// again at this thread by a handler that ran before ours (Python's faulthandler, installed after npyfeed's,
// prints a traceback, puts our handler back and calls raise(): SI_TKILL from this process). A SIGBUS sent
// with kill() (SI_USER), from this process or another, is not ours.
bool from_the_copy(const siginfo_t* info) {
  if (info == nullptr) return false;
  return info->si_code > 0 || (info->si_code == SI_TKILL && info->si_pid == ::getpid());
}

void on_sigbus(int sig, siginfo_t* info, void* ucontext) {
  sigjmp_buf* armed = t_armed;
  if (armed != nullptr && from_the_copy(info)) siglongjmp(*armed, 1);
  chain(sig, info, ucontext);
}

void install() {
  struct sigaction action = {};
  action.sa_sigaction = on_sigbus;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  // The previous disposition is saved before ours goes live: the handler never sees it half written.
  ::sigaction(SIGBUS, nullptr, &g_previous);
  ::sigaction(SIGBUS, &action, nullptr);
}

}  // namespace

bool run_guarded(void (*fn)(void*), void* context) noexcept {
  std::call_once(g_install_once, install);
  sigjmp_buf here;
  sigjmp_buf* const outer = t_armed;
  // savemask 0: no sigprocmask system call per copy. The handler's SIGBUS block is lifted below instead.
  if (sigsetjmp(here, 0) != 0) {
    t_armed = outer;
    sigset_t bus;
    sigemptyset(&bus);
    sigaddset(&bus, SIGBUS);
    pthread_sigmask(SIG_UNBLOCK, &bus, nullptr);
    return false;
  }
  t_armed = &here;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  fn(context);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_armed = outer;
  return true;
}

}  // namespace npyfeed
