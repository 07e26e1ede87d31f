#include "gil.hpp"

#include <unistd.h>

#include <chrono>

namespace npyfeed::bindings {

unsigned long main_thread_id() {
  static const unsigned long id =
      py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
  return id;
}

bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

void restore_gil(PyThreadState* state) {
#if defined(_LIBCPP_VERSION)
  try {
    PyEval_RestoreThread(state);
  } catch (...) {  // pthread_exit()'s forced unwind: a daemon thread asking for the GIL during interpreter exit
    for (;;) pause();
  }
#else
  PyEval_RestoreThread(state);
#endif
}

void wait_interruptibly(const std::shared_ptr<Job>& job, const std::function<void()>& on_tick) {
  JobGuard guard(job);  // covers every way out of here, exceptions included
  while (!without_gil([&] { return job->wait_for(std::chrono::milliseconds(50)); })) {
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (on_tick) on_tick();
  }
  job->rethrow_if_failed();
  // A Ctrl-C during the last wait: raise it now, not from whatever Python code runs next (numpy's dtype
  // parsing while the results are wrapped).
  if (PyErr_CheckSignals() != 0) throw py::error_already_set();
}

void wait_in_slices(Job& job) {
  while (!without_gil([&] { return job.wait_for(std::chrono::milliseconds(50)); })) {
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
}

}  // namespace npyfeed::bindings
