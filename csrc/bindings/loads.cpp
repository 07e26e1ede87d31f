// Headers, whole-file and `.npz` loads (read or inflated in parallel), and page-cache warm.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <utility>

#include "bind.hpp"
#include "convert.hpp"
#include "gil.hpp"
#include "npyfeed/common/thread_pool.hpp"
#include "npyfeed/format/npy_header.hpp"
#include "npyfeed/format/npz.hpp"
#include "npyfeed/io/file.hpp"
#include "npyfeed/io/loader.hpp"
#include "npyfeed/io/page_cache.hpp"

namespace npyfeed::bindings {

namespace {

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

}  // namespace

void bind_loads(py::module_& m) {
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
}

}  // namespace npyfeed::bindings
