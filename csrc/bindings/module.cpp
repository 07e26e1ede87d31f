// The only file that knows about Python. It converts arguments with the GIL held, runs the core with the
// GIL released, and wraps results as numpy arrays whose `.base` owns the C++ memory.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <optional>
#include <type_traits>

#include "npyfeed/batch_stream.hpp"
#include "npyfeed/block_batches.hpp"
#include "npyfeed/block_stream.hpp"
#include "npyfeed/epoch_batches.hpp"
#include "npyfeed/epoch_order.hpp"
#include "npyfeed/errors.hpp"
#include "npyfeed/index.hpp"
#include "npyfeed/index_cache.hpp"
#include "npyfeed/loader.hpp"
#include "npyfeed/npy_header.hpp"
#include "npyfeed/npz.hpp"
#include "npyfeed/page_cache.hpp"
#include "npyfeed/thread_pool.hpp"
#include "npyfeed/window_source.hpp"

namespace py = pybind11;
using namespace npyfeed;

namespace {

// Text that may hold file names: decoded as Python decodes paths (surrogateescape), so a name that is not
// utf-8 still round-trips into the message and `.filename`.
py::str os_text(const std::string& s) {
  return py::reinterpret_steal<py::str>(PyUnicode_DecodeFSDefaultAndSize(s.data(), static_cast<Py_ssize_t>(s.size())));
}

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

// Runs `fn` with the GIL released. Unlike py::gil_scoped_release it takes the GIL back outside any
// destructor: while the interpreter finalizes, CPython < 3.14 ends a thread that asks for the GIL with
// pthread_exit(), and that forced unwind must not cross a noexcept frame (std::terminate, SIGABRT).
// Here it unwinds through ordinary frames (and pybind11 rethrows it), so the daemon thread just ends.
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
    PyEval_RestoreThread(state);
    if (error) std::rethrow_exception(error);
  } else {
    std::optional<R> result;
    try {
      result.emplace(fn());
    } catch (...) {
      error = std::current_exception();
    }
    PyEval_RestoreThread(state);
    if (error) std::rethrow_exception(error);
    return std::move(*result);
  }
}

bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

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

// Waits for `job` with the GIL released, waking every 50 ms to run Python signal handlers (Ctrl-C) and
// `on_tick`. A KeyboardInterrupt cancels the job, waits for running items, and propagates.
void wait_interruptibly(const std::shared_ptr<Job>& job, const std::function<void()>& on_tick = {}) {
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

LoadOptions load_options(const std::string& mode, std::size_t threads, std::size_t max_header_size, bool populate) {
  LoadOptions options;
  options.mode = parse_read_mode(mode);
  options.threads = threads;
  options.max_header_size = max_header_size;
  options.populate = populate;
  return options;
}

py::list load_many(const std::vector<std::string>& paths, const std::string& mode, std::size_t threads,
                   std::size_t max_header_size, bool populate,
                   const std::function<void(std::uint64_t, std::uint64_t)>& progress, const Placement& placement) {
  ManyLoad load(paths, load_options(mode, threads, max_header_size, populate));
  ThreadPool& pool = *without_gil([&] { return &shared_pool(0, placement); });
  auto tick = [&] {
    if (progress) progress(load.bytes_done(), load.bytes_total());
  };
  wait_interruptibly(load.start_headers(pool));
  wait_interruptibly(load.start_chunks(pool), tick);
  tick();
  py::list out;
  for (const LoadedArray& loaded : load.results()) {
    out.append(py::make_tuple(wrap_array(loaded), loaded.direct_fallback));
  }
  return out;
}

// A member's key as np.load names it: the name decoded as zipfile decodes it (utf-8 when flagged, else
// cp437), without ".npy".
py::str npz_member_key(const ZipMember& member, const std::string& archive) {
  const std::string key = npz_key(member.name);
  PyObject* text =
      PyUnicode_Decode(key.data(), static_cast<Py_ssize_t>(key.size()), member.utf8_name ? "utf-8" : "cp437", "strict");
  if (text == nullptr) {
    PyErr_Clear();
    throw NpyFormatError(archive, member.header_offset, member_label(member) + ": the name is not valid utf-8");
  }
  return py::reinterpret_steal<py::str>(text);
}

// [[(key, array), ...] per archive]: every member of every archive, read or inflated in parallel.
py::list load_npz_many(const std::vector<std::string>& paths, const std::string& mode, std::size_t threads,
                       std::size_t max_header_size, bool populate, const Placement& placement) {
  NpzLoad load(paths, load_options(mode, threads, max_header_size, populate));
  ThreadPool& pool = *without_gil([&] { return &shared_pool(0, placement); });
  wait_interruptibly(load.start_directories(pool));
  wait_interruptibly(load.start_members(pool));
  py::list out;
  for (std::size_t a = 0; a < paths.size(); ++a) out.append(py::list());
  for (const NpzLoad::Member& m : load.results()) {
    py::object array;
    try {
      array = wrap_array(m.array);
    } catch (const NpyFormatError& e) {
      throw NpyFormatError(e.path(), e.offset(), member_label(m.entry) + ": " + e.reason());
    }
    out[m.archive].cast<py::list>().append(py::make_tuple(npz_member_key(m.entry, m.array.path), array));
  }
  return out;
}

// [(key, header dict, method, compressed size), ...] for one archive: its directory and every member's header.
py::list read_npz_headers(const std::string& path, std::size_t max_header_size) {
  auto [archive, headers] = without_gil([&] {
    auto archive = NpzArchive::open(path);
    std::vector<NpyHeader> headers;
    for (std::size_t i = 0; i < archive->members().size(); ++i)
      headers.push_back(archive->read_member_header(i, max_header_size));
    return std::make_pair(archive, headers);
  });
  py::list out;
  for (std::size_t i = 0; i < headers.size(); ++i) {
    const ZipMember& m = archive->members()[i];
    py::dict h;
    try {
      h = header_dict(headers[i], path, m.uncompressed_size);
    } catch (const NpyFormatError& e) {
      throw NpyFormatError(path, e.offset(), member_label(m) + ": " + e.reason());
    }
    out.append(py::make_tuple(npz_member_key(m, path), h, m.is_stored() ? "stored" : "deflated", m.compressed_size));
  }
  return out;
}

// Measures (and with `read`, first warms) the page-cache residency of `paths`: ([(size, resident_before,
// resident_after) per file], bytes read).
py::tuple warm_files(const std::vector<std::string>& paths, std::size_t threads, bool read,
                     const std::function<void(std::uint64_t, std::uint64_t)>& progress) {
  threads = std::max<std::size_t>(threads, 1);
  CacheWarm warm(paths);
  ThreadPool& pool = shared_pool();
  wait_interruptibly(warm.start_measure(pool, threads, /*after=*/false));
  if (read) {
    auto tick = [&] {
      if (progress) progress(warm.bytes_done(), warm.bytes_total());
    };
    wait_interruptibly(warm.start_reads(pool, threads), tick);
    tick();
    wait_interruptibly(warm.start_measure(pool, threads, /*after=*/true));
  }
  py::list files;
  for (const CacheWarm::FileState& f : warm.files()) {
    files.append(py::make_tuple(f.size, f.resident_before, read ? f.resident_after : f.resident_before));
  }
  return py::make_tuple(files, read ? warm.bytes_read() : 0);
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

// A gathered batch as the tuple (x, y) of arrays over its buffers.
py::tuple wrap_window_batch(const WindowSource& source, const WindowBatch& batch) {
  const std::uint32_t out = source.options().out_size;
  return py::make_tuple(wrap_batch(batch.x, batch.count, source.x_shape(), out),
                        wrap_batch(batch.y, batch.count, source.y_shape(), out));
}

std::vector<std::int64_t> int64_vector(const py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>& a) {
  return std::vector<std::int64_t>(a.data(), a.data() + a.size());
}

// features= / label_columns=: None (all), a slice, or a sequence of integers (types checked in Python).
ColumnSpec column_spec(const py::handle& value) {
  if (value.is_none()) return ColumnSpec::all();
  if (py::isinstance<py::slice>(value)) {
    auto part = [&](const char* name) -> std::optional<std::int64_t> {
      py::object v = value.attr(name);
      if (v.is_none()) return std::nullopt;
      return v.cast<std::int64_t>();
    };
    return ColumnSpec::slice(part("start"), part("stop"), part("step"));
  }
  return ColumnSpec::of(value.cast<std::vector<std::int64_t>>());
}

// The dict windows.py builds from features=, label_columns=, nan=, posinf=, neginf=, normalize= (or None).
TransformOptions transform_options(const py::object& spec) {
  TransformOptions o;
  if (spec.is_none()) return o;
  const py::dict d = spec;
  o.features = column_spec(d["features"]);
  o.label_columns = column_spec(d["label_columns"]);
  o.nan = d["nan"].cast<std::optional<double>>();
  o.posinf = d["posinf"].cast<std::optional<double>>();
  o.neginf = d["neginf"].cast<std::optional<double>>();
  if (!d["mean"].is_none()) {
    using Array = py::array_t<double, py::array::c_style | py::array::forcecast>;
    auto take = [](const py::handle& h, std::vector<double>& values, std::vector<std::int64_t>& shape) {
      const Array a = py::reinterpret_borrow<py::object>(h);
      values.assign(a.data(), a.data() + a.size());
      shape.assign(a.shape(), a.shape() + a.ndim());
    };
    o.normalize = true;
    take(d["mean"], o.mean, o.mean_shape);
    take(d["std"], o.std, o.std_shape);
  }
  return o;
}

WindowOptions window_options(std::int64_t window, const std::string& dtype, const std::string& bounds,
                             const std::string& mode, std::size_t threads, std::size_t max_header_size,
                             const Placement& placement, const std::string& npz_member = "",
                             std::uint64_t npz_memory_limit = 0, const py::object& transform = py::none(),
                             std::optional<std::pair<std::int64_t, std::int64_t>> dense = std::nullopt) {
  WindowOptions o;
  o.transform = transform_options(transform);
  if (dense) o.dense = DenseOptions{dense->first, dense->second};  // (stride, horizon)
  o.window = window;
  o.out_size = parse_out_dtype(dtype);
  o.bounds = parse_bounds(bounds);
  o.mode = parse_read_mode(mode);
  o.threads = threads;
  o.max_header_size = max_header_size;
  o.placement = placement;
  o.npz_member = npz_member;
  o.npz_memory_limit = npz_memory_limit;
  return o;
}

// A BatchStream (or a BlockStream, shuffle="blocks") as a Python iterator.
template <class Stream>
class PyStream {
 public:
  PyStream(std::shared_ptr<WindowSource> source, std::unique_ptr<Stream> stream)
      : source_(std::move(source)), stream_(std::move(stream)) {}
  ~PyStream() {
    // Waiting for read-ahead in flight takes a few ms; during interpreter exit keep the GIL for it
    // (this may be a thread that could not take it back).
    if (interpreter_finalizing()) {
      stream_.reset();
    } else {
      without_gil([&] { stream_.reset(); });
    }
  }
  py::tuple next() {
    if (!stream_) throw py::stop_iteration();
    std::shared_ptr<Job> job = without_gil([&] { return stream_->next_job(); });
    if (!job) throw py::stop_iteration();
    wait_for_batch(*job);
    WindowBatch batch = without_gil([&] { return stream_->take(); });
    if (!batch.x) throw py::stop_iteration();  // closed by another thread while we waited
    return wrap_window_batch(*source_, batch);
  }
  void close() {
    if (stream_) without_gil([&] { stream_->close(); });
  }
  std::size_t num_batches() const { return stream_ ? stream_->num_batches() : 0; }
  Stream& stream() { return *stream_; }

 private:
  // Like wait_interruptibly, but the stream owns the batch memory: an interrupt leaves the job to it.
  static void wait_for_batch(Job& job) {
    while (!without_gil([&] { return job.wait_for(std::chrono::milliseconds(50)); })) {
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
  }

  std::shared_ptr<WindowSource> source_;
  std::unique_ptr<Stream> stream_;
};
using PyBatchStream = PyStream<BatchStream>;
using PyBlockStream = PyStream<BlockStream>;

std::shared_ptr<WindowSource> open_window_files(SampleIndex& index, const std::vector<std::string>& factor_paths,
                                                const std::vector<std::string>& label_paths, std::int64_t window,
                                                const std::string& dtype, const std::string& bounds,
                                                const std::string& mode, std::size_t threads,
                                                std::size_t max_header_size, const Placement& placement,
                                                const std::string& npz_member, std::uint64_t npz_memory_limit,
                                                const py::object& transform,
                                                std::optional<std::pair<std::int64_t, std::int64_t>> dense) {
  auto source =
      std::make_shared<WindowSource>(index, window_options(window, dtype, bounds, mode, threads, max_header_size,
                                                           placement, npz_member, npz_memory_limit, transform, dense));
  wait_interruptibly(without_gil([&] {
    return source->start_open(shared_pool(0, placement), factor_paths, label_paths);  // checks the placement first
  }));
  without_gil([&] { source->finish_open(); });
  return source;
}

// A Python object kept alive from C++: a new reference, dropped by whichever thread lets go last. A thread
// holding the GIL drops it at once; any other thread (a pool worker finishing a gather) never takes the GIL
// (which could block it, or end it while the interpreter exits) but leaves it to the interpreter's next
// check (Py_AddPendingCall, callable from any thread). While the interpreter finalizes it is left alone.
std::shared_ptr<const void> keep_alive(const py::object& object) {
  PyObject* ref = object.ptr();
  Py_INCREF(ref);
  return std::shared_ptr<const void>(ref, [](const void* p) {
    PyObject* ref = static_cast<PyObject*>(const_cast<void*>(p));
    if (!Py_IsInitialized() || interpreter_finalizing()) return;
    if (PyGILState_Check() != 0) {
      Py_DECREF(ref);
      return;
    }
    // One call per source (its arrays share one owner): the queue of pending calls is short, and a full one
    // leaks the arrays rather than block a worker.
    Py_AddPendingCall(
        [](void* q) {
          Py_DECREF(static_cast<PyObject*>(q));
          return 0;
        },
        ref);
  });
}

std::shared_ptr<WindowSource> window_source_from_arrays(SampleIndex& index, const std::vector<py::array>& factors,
                                                        const std::vector<py::array>& labels, std::int64_t window,
                                                        const std::string& dtype, const std::string& bounds,
                                                        std::size_t threads, const Placement& placement,
                                                        const py::object& transform) {
  without_gil([&] { shared_pool(0, placement); });  // checks the placement
  auto source = std::make_shared<WindowSource>(
      index,
      window_options(window, dtype, bounds, "mmap", threads, kDefaultMaxHeaderSize, placement, "", 0, transform));
  if (factors.size() != index.keys.size() || labels.size() != index.keys.size()) {
    throw InvalidArgument("one factor and one label array per key are needed");
  }
  // All the arrays, kept alive together by the memory sources (one reference to drop at the end).
  py::tuple arrays(2 * index.keys.size());
  for (std::size_t k = 0; k < index.keys.size(); ++k) {
    arrays[2 * k] = factors[k];
    arrays[2 * k + 1] = labels[k];
  }
  const std::shared_ptr<const void> owner = keep_alive(arrays);
  for (std::size_t k = 0; k < index.keys.size(); ++k) {
    for (int which = 0; which < 2; ++which) {
      const py::array& a = which == 0 ? factors[k] : labels[k];
      if (!(a.flags() & py::array::c_style))
        throw InvalidArgument("arrays must be C-contiguous (the caller makes them so)");
      std::vector<std::int64_t> shape(a.shape(), a.shape() + a.ndim());
      std::string typestr = a.dtype().attr("str").cast<std::string>();
      source->set_memory_source(k, which == 1, owner, static_cast<const std::byte*>(a.data()), shape, typestr);
    }
  }
  source->finish_open();
  return source;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "npyfeed's C++ core. Use the public names in `npyfeed`, not this module.";

  static auto& npy_format_error = *new py::exception<NpyFormatError>(m, "NpyFormatError", PyExc_ValueError);
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
      py::object error = py::reinterpret_steal<py::object>(
          PyObject_CallFunction(PyExc_OSError, "iOO", e.error_number(), os_text(e.strerror_text()).ptr(),
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

  m.def(
      "read_header",
      [](const std::string& path, std::size_t max_header_size) {
        auto [h, size] = without_gil([&] {
          File file = File::open(path);
          return std::make_pair(read_header(file, max_header_size), file.size());
        });
        return header_dict(h, path, size);
      },
      py::arg("path"), py::arg("max_header_size") = kDefaultMaxHeaderSize);

  m.def(
      "parse_header_bytes",
      [](py::bytes data, std::size_t max_header_size) {
        std::string s = data;
        NpyHeader h = parse_npy_header(
            std::span<const std::byte>(reinterpret_cast<const std::byte*>(s.data()), s.size()), max_header_size);
        return header_dict(h, "<bytes>", s.size());
      },
      py::arg("data"), py::arg("max_header_size") = kDefaultMaxHeaderSize);

  m.def("warm_files", &warm_files, py::arg("paths"), py::arg("threads"), py::arg("read"),
        py::arg("progress") = nullptr);
  m.def(
      "load_many",
      [](const std::vector<std::string>& paths, const std::string& mode, std::size_t threads,
         std::size_t max_header_size, bool populate, const std::function<void(std::uint64_t, std::uint64_t)>& progress,
         const std::vector<int>& cpus, std::optional<int> nice, std::optional<std::pair<int, int>> io_priority) {
        return load_many(paths, mode, threads, max_header_size, populate, progress,
                         placement_of(cpus, nice, io_priority));
      },
      py::arg("paths"), py::arg("mode"), py::arg("threads"), py::arg("max_header_size"), py::arg("populate"),
      py::arg("progress") = nullptr, py::arg("cpus") = std::vector<int>(), py::arg("nice") = py::none(),
      py::arg("io_priority") = py::none());

  m.def(
      "load_npz_many",
      [](const std::vector<std::string>& paths, const std::string& mode, std::size_t threads,
         std::size_t max_header_size, bool populate, const std::vector<int>& cpus, std::optional<int> nice,
         std::optional<std::pair<int, int>> io_priority) {
        return load_npz_many(paths, mode, threads, max_header_size, populate, placement_of(cpus, nice, io_priority));
      },
      py::arg("paths"), py::arg("mode"), py::arg("threads"), py::arg("max_header_size"), py::arg("populate"),
      py::arg("cpus") = std::vector<int>(), py::arg("nice") = py::none(), py::arg("io_priority") = py::none());
  m.def("read_npz_headers", &read_npz_headers, py::arg("path"), py::arg("max_header_size"));
  m.attr("have_inflate") = have_inflate();

  py::class_<SampleIndex>(m, "SampleIndex")
      .def("__len__", &SampleIndex::size)
      .def_property_readonly("keys", [](const SampleIndex& i) { return i.keys; });

  m.def(
      "read_index_files",
      [](const std::vector<std::string>& paths, std::size_t threads) {
        return without_gil([&] { return read_index_files(paths, threads); });
      },
      py::arg("paths"), py::arg("threads") = 1);

  m.def(
      "load_index",
      [](const std::vector<std::string>& paths, const std::string& cache_dir, std::size_t threads) {
        IndexLoad load = without_gil([&] { return load_index(paths, cache_dir, threads); });
        py::object cache_path = load.cache_path.empty() ? py::object(py::none()) : py::object(os_text(load.cache_path));
        return py::make_tuple(std::move(load.index), cache_path, load.built, os_text(load.warning));
      },
      py::arg("paths"), py::arg("cache_dir"), py::arg("threads"));

  m.def(
      "index_from_columns",
      [](const py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>& feature,
         const py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>& label,
         const std::vector<std::string>& keys, const std::string& name) {
        if (feature.size() != label.size() || feature.size() != static_cast<py::ssize_t>(keys.size())) {
          throw InvalidArgument("index columns differ in length");
        }
        SampleIndex index;
        index.sources.push_back(name);
        for (py::ssize_t i = 0; i < feature.size(); ++i) {
          index.add(feature.data()[i], label.data()[i], keys[static_cast<std::size_t>(i)], 0,
                    static_cast<std::uint64_t>(i + 1));
        }
        index.finish();
        return index;
      },
      py::arg("feature_index"), py::arg("label_index"), py::arg("keys"), py::arg("name"));

  // The index of a dense source (WindowSource.dense): its keys, no samples (the windows are per-key ranges).
  m.def(
      "dense_index",
      [](const std::vector<std::string>& keys, const std::string& name) {
        SampleIndex index;
        index.keys = keys;
        index.sources.push_back(name);
        index.finish();
        return index;
      },
      py::arg("keys"), py::arg("name"));

  py::class_<WindowSource, std::shared_ptr<WindowSource>>(m, "WindowSourceCore")
      .def("__len__", &WindowSource::size)
      .def_property_readonly("skipped", &WindowSource::skipped)
      .def_property_readonly("direct_fallbacks", &WindowSource::direct_fallbacks)
      .def_property_readonly("mapping_limit", &WindowSource::mapping_limit)
      .def_property_readonly("x_shape", [](const WindowSource& s) { return py::tuple(py::cast(s.x_shape())); })
      .def_property_readonly("y_shape", [](const WindowSource& s) { return py::tuple(py::cast(s.y_shape())); })
      .def("describe", &WindowSource::describe)
      .def("get",
           [](const std::shared_ptr<WindowSource>& s,
              const py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>& ids) {
             auto [batch, job] = s->start_batch(shared_pool(0, s->options().placement), int64_vector(ids));
             wait_interruptibly(job);
             return wrap_window_batch(*s, batch);
           })
      .def("stream",
           [](const std::shared_ptr<WindowSource>& s, bool shuffle, std::uint64_t seed, std::uint64_t epoch,
              std::size_t num_shards, std::size_t shard_index, std::size_t batch_size, bool drop_remainder,
              std::size_t prefetch, std::size_t start_batch) {
             EpochOrder order(s->size(), shuffle, seed, epoch, num_shards, shard_index);
             return std::make_unique<PyBatchStream>(
                 s,
                 std::make_unique<BatchStream>(s, std::move(order), batch_size, drop_remainder, prefetch, start_batch));
           })
      .def("block_stream",
           [](const std::shared_ptr<WindowSource>& s, std::uint64_t memory_budget, std::uint64_t seed,
              std::uint64_t epoch, std::size_t num_shards, std::size_t shard_index, std::size_t batch_size,
              bool drop_remainder, std::size_t prefetch, std::size_t start_batch) {
             auto stream = without_gil([&] {
               return std::make_unique<BlockStream>(s, memory_budget, seed, epoch, num_shards, shard_index, batch_size,
                                                    drop_remainder, prefetch, start_batch);
             });
             return std::make_unique<PyBlockStream>(s, std::move(stream));
           })
      .def("block_epoch_order", [](const std::shared_ptr<WindowSource>& s, std::uint64_t memory_budget,
                                   std::uint64_t seed, std::uint64_t epoch, std::size_t num_shards,
                                   std::size_t shard_index) {
        std::vector<std::int64_t> order =
            without_gil([&] { return block_epoch_order(*s, memory_budget, seed, epoch, num_shards, shard_index); });
        return py::array_t<std::int64_t>(order.size(), order.data());
      });

  py::class_<PyBatchStream>(m, "BatchStream")
      .def("__next__", &PyBatchStream::next)
      .def("close", &PyBatchStream::close)
      .def_property_readonly("num_batches", &PyBatchStream::num_batches);

  py::class_<PyBlockStream>(m, "BlockStream")
      .def("__next__", &PyBlockStream::next)
      .def("close", &PyBlockStream::close)
      .def_property_readonly("num_batches", &PyBlockStream::num_batches)
      .def_property_readonly("buffered_bytes", [](PyBlockStream& s) { return s.stream().buffered_bytes(); })
      .def_property_readonly("peak_buffered_bytes", [](PyBlockStream& s) { return s.stream().peak_buffered_bytes(); })
      .def_property_readonly("num_blocks", [](PyBlockStream& s) { return s.stream().plan().num_blocks(); });

  // Batch b of epoch e on demand: get gathers it on its own (several threads may each wait for one); take
  // serves it from a stream that reads ahead (npyfeed.tf's checkpointable pipeline, one call at a time). The
  // GIL is released while either waits.
  py::class_<EpochBatches, std::shared_ptr<EpochBatches>>(m, "EpochBatches")
      .def(py::init<std::shared_ptr<WindowSource>, bool, std::uint64_t, std::size_t, std::size_t, std::size_t, bool,
                    std::size_t, std::size_t>(),
           py::arg("source"), py::arg("shuffle"), py::arg("seed"), py::arg("num_shards"), py::arg("shard_index"),
           py::arg("batch_size"), py::arg("drop_remainder"), py::arg("max_kept"), py::arg("prefetch") = 2)
      .def_property_readonly("num_batches", &EpochBatches::num_batches)
      .def_property_readonly("streams_started", &EpochBatches::streams_started)
      .def("close", [](EpochBatches& batches) { without_gil([&] { batches.close(); }); })
      .def("get",
           [](EpochBatches& batches, std::uint64_t epoch, std::size_t batch) {
             auto [b, job] = without_gil([&] { return batches.start(epoch, batch); });
             wait_interruptibly(job);
             return wrap_window_batch(batches.source(), b);
           })
      .def("take", [](EpochBatches& batches, std::uint64_t epoch, std::size_t batch) {
        return wrap_window_batch(batches.source(), without_gil([&] { return batches.take(epoch, batch); }));
      });

  // The same for shuffle="blocks": one stream positioned at the next batch; any other position starts a new one.
  // The constructor groups the samples by key (once per source): without the GIL.
  py::class_<BlockBatches, std::shared_ptr<BlockBatches>>(m, "BlockBatches")
      .def(py::init([](std::shared_ptr<WindowSource> source, std::uint64_t memory_budget, std::uint64_t seed,
                       std::size_t num_shards, std::size_t shard_index, std::size_t batch_size, bool drop_remainder,
                       std::size_t prefetch) {
             return without_gil([&] {
               return std::make_shared<BlockBatches>(std::move(source), memory_budget, seed, num_shards, shard_index,
                                                     batch_size, drop_remainder, prefetch);
             });
           }),
           py::arg("source"), py::arg("memory_budget"), py::arg("seed"), py::arg("num_shards"), py::arg("shard_index"),
           py::arg("batch_size"), py::arg("drop_remainder"), py::arg("prefetch"))
      .def_property_readonly("num_batches", &BlockBatches::num_batches)
      .def_property_readonly("streams_started", &BlockBatches::streams_started)
      .def("close", [](BlockBatches& batches) { without_gil([&] { batches.close(); }); })
      .def("take", [](BlockBatches& batches, std::uint64_t epoch, std::size_t batch) {
        return wrap_window_batch(batches.source(), without_gil([&] { return batches.take(epoch, batch); }));
      });

  m.def(
      "open_window_files",
      [](SampleIndex& index, const std::vector<std::string>& factor_paths, const std::vector<std::string>& label_paths,
         std::int64_t window, const std::string& dtype, const std::string& bounds, const std::string& mode,
         std::size_t threads, std::size_t max_header_size, const std::vector<int>& cpus, std::optional<int> nice,
         std::optional<std::pair<int, int>> io_priority, const std::string& npz_member, std::uint64_t npz_memory_limit,
         const py::object& transform, std::optional<std::pair<std::int64_t, std::int64_t>> dense) {
        return open_window_files(index, factor_paths, label_paths, window, dtype, bounds, mode, threads,
                                 max_header_size, placement_of(cpus, nice, io_priority), npz_member, npz_memory_limit,
                                 transform, dense);
      },
      py::arg("index"), py::arg("factor_paths"), py::arg("label_paths"), py::arg("window"), py::arg("dtype"),
      py::arg("bounds"), py::arg("mode"), py::arg("threads"), py::arg("max_header_size"),
      py::arg("cpus") = std::vector<int>(), py::arg("nice") = py::none(), py::arg("io_priority") = py::none(),
      py::arg("npz_member") = "", py::arg("npz_memory_limit") = 0, py::arg("transform") = py::none(),
      py::arg("dense") = py::none());
  m.def(
      "window_source_from_arrays",
      [](SampleIndex& index, const std::vector<py::array>& factors, const std::vector<py::array>& labels,
         std::int64_t window, const std::string& dtype, const std::string& bounds, std::size_t threads,
         const std::vector<int>& cpus, std::optional<int> nice, std::optional<std::pair<int, int>> io_priority,
         const py::object& transform) {
        return window_source_from_arrays(index, factors, labels, window, dtype, bounds, threads,
                                         placement_of(cpus, nice, io_priority), transform);
      },
      py::arg("index"), py::arg("factors"), py::arg("labels"), py::arg("window"), py::arg("dtype"), py::arg("bounds"),
      py::arg("threads"), py::arg("cpus") = std::vector<int>(), py::arg("nice") = py::none(),
      py::arg("io_priority") = py::none(), py::arg("transform") = py::none());
  m.def(
      "epoch_order",
      [](std::size_t n, bool shuffle, std::uint64_t seed, std::uint64_t epoch, std::size_t num_shards,
         std::size_t shard_index) {
        std::vector<std::int64_t> order =
            without_gil([&] { return epoch_order(n, shuffle, seed, epoch, num_shards, shard_index); });
        return py::array_t<std::int64_t>(order.size(), order.data());
      },
      py::arg("n"), py::arg("shuffle"), py::arg("seed"), py::arg("epoch"), py::arg("num_shards"),
      py::arg("shard_index"));
}
