// Indexes (compiled, cached, or from columns) and window sources over files or arrays in memory.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bind.hpp"
#include "convert.hpp"
#include "gil.hpp"
#include "npyfeed/common/thread_pool.hpp"
#include "npyfeed/gather/stream_copy.hpp"
#include "npyfeed/gather/window_source.hpp"
#include "npyfeed/index/index.hpp"
#include "npyfeed/index/index_cache.hpp"

namespace npyfeed::bindings {

namespace {

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
                             std::optional<std::pair<std::int64_t, std::int64_t>> dense = std::nullopt,
                             const std::string& missing = "error") {
  if (missing != "error" && missing != "skip")
    throw InvalidArgument("missing must be 'error' or 'skip', not '" + missing + "'");
  WindowOptions o;
  o.skip_missing = missing == "skip";
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

std::shared_ptr<WindowSource> open_window_files(
    SampleIndex& index, const std::vector<std::string>& factor_paths, const std::vector<std::string>& label_paths,
    std::int64_t window, const std::string& dtype, const std::string& bounds, const std::string& mode,
    std::size_t threads, std::size_t max_header_size, const Placement& placement, const std::string& npz_member,
    std::uint64_t npz_memory_limit, const py::object& transform,
    std::optional<std::pair<std::int64_t, std::int64_t>> dense, const std::string& missing) {
  auto source = std::make_shared<WindowSource>(
      index, window_options(window, dtype, bounds, mode, threads, max_header_size, placement, npz_member,
                            npz_memory_limit, transform, dense, missing));
  wait_interruptibly(without_gil([&] {
    return source->start_open(shared_io_pool(0, placement), factor_paths, label_paths);  // checks the placement first
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

void bind_windows(py::module_& m) {
  py::class_<SampleIndex>(m, "SampleIndex")
      .def("__len__", &SampleIndex::size)
      .def_property_readonly("keys", [](const SampleIndex& i) { return i.keys; })
      // (feature, label, key) as read-only int32/int32/uint32 views kept alive by the index (a feature or label
      // of INT32_MIN is in the side table), then the side tables as (sample, value) int64 arrays of shape (n, 2).
      .def("columns",
           [](const py::object& self) {
             const IndexColumns& c = self.cast<const SampleIndex&>().columns();
             auto view = [&](auto span) {
               using T = std::remove_cv_t<typename decltype(span)::element_type>;
               py::array a(py::dtype::of<T>(), {static_cast<py::ssize_t>(span.size())}, {}, span.data(), self);
               a.attr("setflags")(py::arg("write") = false);
               return a;
             };
             auto wide = [](std::span<const WideValue> values) {
               py::array_t<std::int64_t> a({static_cast<py::ssize_t>(values.size()), py::ssize_t{2}});
               auto w = a.mutable_unchecked<2>();
               for (std::size_t i = 0; i < values.size(); ++i) {
                 w(static_cast<py::ssize_t>(i), 0) = static_cast<std::int64_t>(values[i].sample);
                 w(static_cast<py::ssize_t>(i), 1) = values[i].value;
               }
               return a;
             };
             return py::make_tuple(view(c.feature), view(c.label), view(c.key), wide(c.wide_feature),
                                   wide(c.wide_label));
           })
      .def("where", &SampleIndex::where, py::arg("sample"), py::call_guard<py::gil_scoped_release>());

  // An index for checking: malformed lines (and files that are not text) left out and listed, as
  // (index, [(path, line, why)], how many in all); at most `limit` lines are listed, and every file left out
  // (line 0).
  m.def(
      "check_index_files",
      [](const std::vector<std::string>& paths, std::size_t threads, std::size_t limit) {
        IndexProblems problems;
        problems.limit = limit;
        SampleIndex index = without_gil([&] { return read_index_files(paths, threads, &problems); });
        py::list listed;
        for (const IndexLineProblem& p : problems.listed)
          listed.append(py::make_tuple(os_text(p.path), p.line, os_text(p.why)));
        return py::make_tuple(std::move(index), listed, problems.total);
      },
      py::arg("paths"), py::arg("threads"), py::arg("limit"));

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
        return index_from_columns({feature.data(), static_cast<std::size_t>(feature.size())},
                                  {label.data(), static_cast<std::size_t>(label.size())}, keys, name);
      },
      py::arg("feature_index"), py::arg("label_index"), py::arg("keys"), py::arg("name"));

  // The index of a dense source (WindowSource.dense): its keys, no samples (the windows are per-key ranges).
  m.def("dense_index", &keys_only_index, py::arg("keys"), py::arg("name"));

  py::class_<WindowSource, std::shared_ptr<WindowSource>>(m, "WindowSourceCore")
      .def("__len__", &WindowSource::size)
      .def_property_readonly("skipped", &WindowSource::skipped)
      .def_property_readonly("missing_keys", &WindowSource::missing_keys)
      .def_property_readonly("missing_samples", &WindowSource::missing_samples)
      .def_property_readonly("direct_fallbacks", &WindowSource::direct_fallbacks)
      .def_property_readonly("mapping_limit", &WindowSource::mapping_limit)
      .def_property_readonly("stats", &WindowSource::stats)
      .def_property_readonly("x_shape", [](const WindowSource& s) { return py::tuple(py::cast(s.x_shape())); })
      .def_property_readonly("y_shape", [](const WindowSource& s) { return py::tuple(py::cast(s.y_shape())); })
      .def("describe", &WindowSource::describe)
      // (key, feature_index, label_index) of each sample id: WindowSource.locate.
      .def("sample_fields",
           [](const WindowSource& s, const py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>& ids) {
             const std::vector<std::int64_t> wanted = int64_vector(ids);
             s.check_ids(wanted);
             py::array_t<std::uint32_t> keys(static_cast<py::ssize_t>(wanted.size()));
             py::array_t<std::int64_t> features(static_cast<py::ssize_t>(wanted.size()));
             py::array_t<std::int64_t> labels(static_cast<py::ssize_t>(wanted.size()));
             auto k = keys.mutable_unchecked<1>();
             auto f = features.mutable_unchecked<1>();
             auto l = labels.mutable_unchecked<1>();
             for (std::size_t i = 0; i < wanted.size(); ++i) {
               const Sample sample = s.sample(static_cast<std::size_t>(wanted[i]));
               const auto at = static_cast<py::ssize_t>(i);
               k(at) = sample.key;
               f(at) = sample.feature;
               l(at) = sample.label;
             }
             return py::make_tuple(keys, features, labels);
           })
      .def("get", [](const std::shared_ptr<WindowSource>& s,
                     const py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>& ids) {
        auto [batch, job] = s->start_batch(shared_pool(0, s->options().placement), int64_vector(ids));
        wait_interruptibly(job);
        return wrap_window_batch(*s, batch);
      });

  m.def("prefetch_read_once", &detail::prefetch_read_once,
        "Whether gathers fetch the source rows they read once with a non-temporal prefetch (NPYFEED_PREFETCH).");
  m.def("uses_avx512", &detail::use_avx512,
        "Whether streamed copies and options use AVX-512 (the CPU has it; NPYFEED_AVX512=0 at start-up keeps them "
        "to SSE2/AVX2).");
  m.def(
      "open_window_files",
      [](SampleIndex& index, const std::vector<std::string>& factor_paths, const std::vector<std::string>& label_paths,
         std::int64_t window, const std::string& dtype, const std::string& bounds, const std::string& mode,
         std::size_t threads, std::size_t max_header_size, const std::vector<int>& cpus, std::optional<int> nice,
         std::optional<std::pair<int, int>> io_priority, const std::string& npz_member, std::uint64_t npz_memory_limit,
         const py::object& transform, std::optional<std::pair<std::int64_t, std::int64_t>> dense,
         const std::string& missing) {
        return open_window_files(index, factor_paths, label_paths, window, dtype, bounds, mode, threads,
                                 max_header_size, placement_of(cpus, nice, io_priority), npz_member, npz_memory_limit,
                                 transform, dense, missing);
      },
      py::arg("index"), py::arg("factor_paths"), py::arg("label_paths"), py::arg("window"), py::arg("dtype"),
      py::arg("bounds"), py::arg("mode"), py::arg("threads"), py::arg("max_header_size"),
      py::arg("cpus") = std::vector<int>(), py::arg("nice") = py::none(), py::arg("io_priority") = py::none(),
      py::arg("npz_member") = "", py::arg("npz_memory_limit") = 0, py::arg("transform") = py::none(),
      py::arg("dense") = py::none(), py::arg("missing") = "error");
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
}

}  // namespace npyfeed::bindings
