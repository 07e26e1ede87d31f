// The only file that knows about Python. It converts arguments with the GIL held, runs the core with the
// GIL released, and wraps results as numpy arrays whose `.base` owns the C++ memory.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>

#include "npyfeed/errors.hpp"
#include "npyfeed/loader.hpp"
#include "npyfeed/npy_header.hpp"
#include "npyfeed/thread_pool.hpp"

namespace py = pybind11;
using namespace npyfeed;

namespace {

py::object literal_to_python(const detail::PyLiteral& v) {
  using K = detail::PyLiteral::Kind;
  switch (v.kind) {
    case K::kNone: return py::none();
    case K::kBool: return py::bool_(v.boolean);
    case K::kInt: return py::int_(v.integer);
    case K::kStr: return py::str(v.str);
    case K::kTuple: {
      py::tuple t(v.items.size());
      for (std::size_t i = 0; i < v.items.size(); ++i) t[i] = literal_to_python(v.items[i]);
      return t;
    }
    case K::kList: {
      py::list l;
      for (const auto& item : v.items) l.append(literal_to_python(item));
      return l;
    }
    case K::kDict: {
      py::dict d;
      for (std::size_t i = 0; i + 1 < v.items.size(); i += 2) d[literal_to_python(v.items[i])] = literal_to_python(v.items[i + 1]);
      return d;
    }
  }
  return py::none();
}

// numpy's own descr -> dtype conversion, so dtypes match np.load exactly (padding fields and all).
py::dtype dtype_of(const NpyHeader& header, const std::string& path) {
  // Leaked on purpose: a static py::object would be destroyed after the interpreter has finalized.
  static py::object& descr_to_dtype = *new py::object(py::module_::import("numpy.lib.format").attr("descr_to_dtype"));
  py::dtype dtype;
  try {
    dtype = py::reinterpret_borrow<py::dtype>(descr_to_dtype(literal_to_python(header.descr)));
  } catch (py::error_already_set& e) {
    throw NpyFormatError(path, 0, std::string("invalid dtype descr: ") + e.what());
  }
  if (static_cast<std::uint64_t>(dtype.itemsize()) != header.itemsize) {
    throw NpyFormatError(path, 0, "unsupported dtype descr (numpy and npyfeed disagree on its item size)");
  }
  if (dtype.attr("hasobject").cast<bool>()) {
    throw NpyFormatError(path, 0, "object arrays cannot be loaded: npyfeed never unpickles");
  }
  return dtype;
}

py::array wrap_array(const LoadedArray& loaded) {
  const NpyHeader& h = loaded.header;
  py::dtype dtype = dtype_of(h, loaded.path);
  std::vector<py::ssize_t> shape(h.shape.begin(), h.shape.end());
  std::vector<py::ssize_t> strides(shape.size());
  py::ssize_t stride = static_cast<py::ssize_t>(h.itemsize);
  if (h.fortran_order) {
    for (std::size_t k = 0; k < shape.size(); ++k) {
      strides[k] = stride;
      stride *= std::max<py::ssize_t>(shape[k], 1);
    }
  } else {
    for (std::size_t k = shape.size(); k-- > 0;) {
      strides[k] = stride;
      stride *= std::max<py::ssize_t>(shape[k], 1);
    }
  }
  // The capsule holds a shared_ptr to the buffer or mapping: the array's `.base` keeps it alive.
  auto* owner = new std::shared_ptr<void>(loaded.owner);
  py::capsule base(owner, [](void* p) { delete static_cast<std::shared_ptr<void>*>(p); });
  static const std::byte kEmpty[64] = {};
  const void* data = loaded.data != nullptr ? static_cast<const void*>(loaded.data) : kEmpty;
  py::array array(dtype, shape, strides, data, base);
  if (!loaded.writable || data == kEmpty) {
    py::detail::array_proxy(array.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  }
  return array;
}

// Waits for `job` with the GIL released, waking every 50 ms to run Python signal handlers (Ctrl-C) and
// `on_tick`. A KeyboardInterrupt cancels the job, waits for running items, and propagates.
void wait_interruptibly(Job& job, const std::function<void()>& on_tick = {}) {
  while (true) {
    bool finished;
    {
      py::gil_scoped_release release;
      finished = job.wait_for(std::chrono::milliseconds(50));
    }
    if (finished) break;
    if (PyErr_CheckSignals() != 0) {
      job.cancel();
      {
        py::gil_scoped_release release;
        while (!job.wait_for(std::chrono::milliseconds(1000))) {
        }
      }
      throw py::error_already_set();
    }
    if (on_tick) on_tick();
  }
  job.rethrow_if_failed();
}

py::dict header_dict(const NpyHeader& h, const std::string& path, std::uint64_t file_size) {
  py::dict d;
  d["dtype"] = dtype_of(h, path);
  d["shape"] = py::tuple(py::cast(h.shape));
  d["fortran_order"] = h.fortran_order;
  d["version"] = py::make_tuple(h.major_version, h.minor_version);
  d["data_offset"] = h.data_offset;
  d["nbytes"] = h.nbytes;
  d["file_size"] = file_size;
  return d;
}

py::list load_many(const std::vector<std::string>& paths, const std::string& mode, std::size_t threads,
                   std::size_t max_header_size, bool populate, const std::function<void(std::uint64_t, std::uint64_t)>& progress) {
  LoadOptions options;
  options.mode = parse_read_mode(mode);
  options.threads = std::max<std::size_t>(threads, 1);
  options.max_header_size = max_header_size;
  options.populate = populate;
  ManyLoad load(paths, options);
  ThreadPool& pool = shared_pool(options.threads);
  auto tick = [&] {
    if (progress) progress(load.bytes_done(), load.bytes_total());
  };
  wait_interruptibly(*load.start_headers(pool), {});
  auto chunks = load.start_chunks(pool);
  tick();
  wait_interruptibly(*chunks, tick);
  tick();
  py::list out;
  for (const LoadedArray& loaded : load.results()) {
    out.append(py::make_tuple(wrap_array(loaded), loaded.direct_fallback));
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "npyfeed's C++ core. Use the public names in `npyfeed`, not this module.";

  static auto& npy_format_error = *new py::exception<NpyFormatError>(m, "NpyFormatError", PyExc_ValueError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const NpyFormatError& e) {
      py::object error = py::reinterpret_borrow<py::object>(npy_format_error)(e.what());
      error.attr("path") = e.path();
      error.attr("offset") = e.offset();
      error.attr("reason") = e.reason();
      PyErr_SetObject(npy_format_error.ptr(), error.ptr());
    } catch (const OsError& e) {
      py::object error = py::reinterpret_steal<py::object>(
          PyObject_CallFunction(PyExc_OSError, "isO", e.error_number(), e.strerror_text().c_str(), py::str(e.path()).ptr()));
      if (error) PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
    } catch (const IndexOutOfRange& e) {
      PyErr_SetString(PyExc_IndexError, e.what());
    } catch (const InvalidArgument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const Cancelled& e) {
      PyErr_SetString(PyExc_KeyboardInterrupt, "cancelled");
    }
  });

  m.def("available_cpus", &available_cpus, "CPUs this process may run on.");

  m.def(
      "read_header",
      [](const std::string& path, std::size_t max_header_size) {
        NpyHeader h;
        std::uint64_t size;
        {
          py::gil_scoped_release release;
          File file = File::open(path);
          h = read_header(file, max_header_size);
          size = file.size();
        }
        return header_dict(h, path, size);
      },
      py::arg("path"), py::arg("max_header_size") = kDefaultMaxHeaderSize);

  m.def(
      "parse_header_bytes",
      [](py::bytes data, std::size_t max_header_size) {
        std::string s = data;
        NpyHeader h = parse_npy_header(std::span<const std::byte>(reinterpret_cast<const std::byte*>(s.data()), s.size()),
                                       max_header_size);
        return header_dict(h, "<bytes>", s.size());
      },
      py::arg("data"), py::arg("max_header_size") = kDefaultMaxHeaderSize);

  m.def("load_many", &load_many, py::arg("paths"), py::arg("mode"), py::arg("threads"), py::arg("max_header_size"),
        py::arg("populate"), py::arg("progress") = nullptr);
}
