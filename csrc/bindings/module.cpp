// The module: the core's errors as the Python exceptions users catch, then each concept's names (bind.hpp).
// csrc/bindings/ is the only code that knows about Python: it converts arguments with the GIL held, runs the
// core with the GIL released, and wraps results as numpy arrays whose `.base` owns the C++ memory.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cerrno>

#include "bind.hpp"
#include "convert.hpp"
#include "npyfeed/common/errors.hpp"

namespace py = pybind11;
using namespace npyfeed;
using namespace npyfeed::bindings;

PYBIND11_MODULE(_core, m) {
  m.doc() = "npyfeed's C++ core. Use the public names in `npyfeed`, not this module.";

  static auto& npy_format_error = *new py::exception<NpyFormatError>(m, "NpyFormatError", PyExc_ValueError);
  // ESTALE from the core: a file changed since it was opened (file.hpp's check_same_file).
  static auto& file_changed_error = *new py::exception<void>(m, "FileChangedError", PyExc_OSError);
  file_changed_error.attr("__doc__") =
      "A file changed since the source opened it (renamed over, written in place, truncated or grown): an OSError "
      "with errno ESTALE whose filename is the file and whose message says what changed. Raised at the next "
      "epoch's start, or by a read that opens the file again; a new WindowSource reads the new data.";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const NpyFormatError& e) {
      py::object error = py::reinterpret_borrow<py::object>(npy_format_error)(os_text(e.what()));
      error.attr("path") = os_text(e.path());
      error.attr("offset") = e.offset();
      error.attr("reason") = os_text(e.reason());
      PyErr_SetObject(npy_format_error.ptr(), error.ptr());
    } catch (const OsError& e) {
      PyObject* type = e.error_number() == ESTALE ? file_changed_error.ptr() : PyExc_OSError;
      py::object error = py::reinterpret_steal<py::object>(
          PyObject_CallFunction(type, "iOO", e.error_number(), os_text(e.strerror_text()).ptr(),
                                e.path().empty() ? Py_None : os_text(e.path()).ptr()));
      if (error) {
        error.attr("offset") = e.offset() ? py::object(py::int_(*e.offset())) : py::object(py::none());
        PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
      }
    } catch (const IndexOutOfRange& e) {
      PyErr_SetObject(PyExc_IndexError, os_text(e.what()).ptr());
    } catch (const InvalidArgument& e) {
      PyErr_SetObject(PyExc_ValueError, os_text(e.what()).ptr());
    } catch (const Cancelled& e) {
      PyErr_SetString(PyExc_KeyboardInterrupt, "cancelled");
    }
  });

  bind_loads(m);
  bind_windows(m);
  bind_plans(m);
  bind_device(m);
  bind_tf_feed(m);
  bind_build_info(m);
  bind_testing(m);
}
