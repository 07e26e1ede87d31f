#include "convert.hpp"

#include <algorithm>

#include "npyfeed/common/errors.hpp"

namespace npyfeed::bindings {

namespace {

py::object literal_to_python(const detail::PyLiteral& v) {
  using K = detail::PyLiteral::Kind;
  switch (v.kind) {
    case K::kNone:
      return py::none();
    case K::kBool:
      return py::bool_(v.boolean);
    case K::kInt:
      return py::int_(v.integer);
    case K::kStr:
      return py::str(v.str);
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
      for (std::size_t i = 0; i + 1 < v.items.size(); i += 2)
        d[literal_to_python(v.items[i])] = literal_to_python(v.items[i + 1]);
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
    // A Ctrl-C landing while numpy runs (KeyboardInterrupt, a BaseException) is not a bad descr.
    if (!e.matches(PyExc_Exception)) throw;
    // Only numpy's message, not pybind11's traceback lines.
    throw NpyFormatError(path, header.descr.position, "invalid dtype descr: " + py::str(e.value()).cast<std::string>());
  }
  if (static_cast<std::uint64_t>(dtype.itemsize()) != header.itemsize) {
    throw NpyFormatError(path, header.descr.position,
                         "unsupported dtype descr (numpy and npyfeed disagree on its item size)");
  }
  if (dtype.attr("hasobject").cast<bool>()) {
    throw NpyFormatError(path, header.descr.position, "object arrays cannot be loaded: npyfeed never unpickles");
  }
  return dtype;
}

// The most dimensions an array of the running numpy can have: 64 from numpy 2, 32 before (the format allows 64).
std::size_t numpy_max_dims() {
  static const std::size_t max_dims = [] {
    const auto version = py::module_::import("numpy").attr("__version__").cast<std::string>();
    return version.rfind("1.", 0) == 0 ? std::size_t{32} : std::size_t{64};
  }();
  return max_dims;
}

// A (count, *shape) float array over an owned buffer; the capsule keeps the buffer alive (and returns it
// to its pool only when numpy, and anything that adopted the memory, has let go).
py::array wrap_batch(const std::shared_ptr<AlignedBuffer>& buffer, std::size_t count,
                     const std::vector<std::int64_t>& shape, std::uint32_t out_size) {
  std::vector<py::ssize_t> full{static_cast<py::ssize_t>(count)};
  full.insert(full.end(), shape.begin(), shape.end());
  auto* owner = new std::shared_ptr<AlignedBuffer>(buffer);
  py::capsule base(owner, [](void* p) { delete static_cast<std::shared_ptr<AlignedBuffer>*>(p); });
  py::dtype dtype = out_size == 4 ? py::dtype::of<float>() : py::dtype::of<double>();
  return py::array(dtype, full, {}, buffer->data(), base);
}

}  // namespace

// Text that may hold file names: decoded as Python decodes paths (surrogateescape), so a name that is not
// utf-8 still round-trips into the message and `.filename`.
py::str os_text(const std::string& s) {
  return py::reinterpret_steal<py::str>(PyUnicode_DecodeFSDefaultAndSize(s.data(), static_cast<Py_ssize_t>(s.size())));
}

// The numpy dtype of a header, checked against what the running numpy can make of it.
py::dtype checked_dtype(const NpyHeader& h, const std::string& path) {
  if (h.shape.size() > numpy_max_dims()) {
    throw NpyFormatError(path, 0,
                         "too many dimensions: " + std::to_string(h.shape.size()) + " (this numpy allows " +
                             std::to_string(numpy_max_dims()) + ")");
  }
  return dtype_of(h, path);
}

py::array wrap_array(const LoadedArray& loaded) {
  const NpyHeader& h = loaded.header;
  py::dtype dtype = checked_dtype(h, loaded.path);
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
  auto* owner = new std::shared_ptr<const void>(loaded.owner);
  py::capsule base(owner, [](void* p) { delete static_cast<std::shared_ptr<const void>*>(p); });
  static const std::byte kEmpty[64] = {};
  const void* data = loaded.data != nullptr ? static_cast<const void*>(loaded.data) : kEmpty;
  // Zero-size items have all-zero strides, from which numpy calls an array both C and F contiguous. np.load
  // reshapes a flat array, and numpy's reshape gives a C-order array only the C flag: build it the same way.
  // (np.load's F-order arrays are transposes, both C and F contiguous, as the explicit strides give.)
  const bool flat_then_reshape = h.itemsize == 0 && !h.fortran_order;
  py::array array = flat_then_reshape
                        ? py::array(dtype, std::vector<py::ssize_t>{static_cast<py::ssize_t>(h.count)}, {0}, data, base)
                        : py::array(dtype, shape, strides, data, base);
  if (!loaded.writable || data == kEmpty) array.attr("setflags")(py::arg("write") = false);
  if (flat_then_reshape) return array.attr("reshape")(py::cast(shape));
  return array;
}

py::dict header_dict(const NpyHeader& h, const std::string& path, std::uint64_t file_size) {
  py::dict d;
  d["dtype"] = checked_dtype(h, path);
  d["shape"] = py::tuple(py::cast(h.shape));
  d["fortran_order"] = h.fortran_order;
  d["version"] = py::make_tuple(h.major_version, h.minor_version);
  d["data_offset"] = h.data_offset;
  d["nbytes"] = h.nbytes;
  d["file_size"] = file_size;
  return d;
}

// The pool placement from the Python arguments (checked by the core, once per distinct placement).
Placement placement_of(const std::vector<int>& cpus, std::optional<int> nice,
                       std::optional<std::pair<int, int>> io_priority) {
  Placement p;
  p.cpus = cpus;
  p.nice = nice;
  if (io_priority) {
    p.io_class = io_priority->first;
    p.io_level = io_priority->second;
  }
  return p;
}

// A gathered batch as the tuple (x, y) of arrays over its buffers.
py::tuple wrap_window_batch(const WindowSource& source, const WindowBatch& batch) {
  const std::uint32_t out = source.options().out_size;
  return py::make_tuple(wrap_batch(batch.x, batch.count, source.x_shape(), out),
                        wrap_batch(batch.y, batch.count, source.y_shape(), out));
}

std::vector<std::int64_t> int64_vector(const py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>& a) {
  return std::vector<std::int64_t>(a.data(), a.data() + a.size());
}

}  // namespace npyfeed::bindings
