// Conversions between Python and the core: text that may hold file names, numpy dtypes of .npy headers, arrays
// and batches wrapped over the core's memory (their `.base` owns it), header dicts, placement arguments.
#pragma once

#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>  // in every binding file that converts: pybind11's casters must be the same in each

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "npyfeed/common/aligned_buffer.hpp"
#include "npyfeed/common/placement.hpp"
#include "npyfeed/format/npy_header.hpp"
#include "npyfeed/gather/window_source.hpp"
#include "npyfeed/io/loader.hpp"
#include "npyfeed/stream/batch.hpp"

namespace npyfeed::bindings {

namespace py = pybind11;

/// Text that may hold file names, decoded as Python decodes paths (surrogateescape).
py::str os_text(const std::string& s);

/// The numpy dtype of a header (numpy's own descr conversion), checked against what the running numpy can
/// make of it. Throws NpyFormatError naming `path`.
py::dtype checked_dtype(const NpyHeader& h, const std::string& path);

/// A loaded array as numpy's np.load would give it, over the loader's memory (kept alive by its `.base`).
py::array wrap_array(const LoadedArray& loaded);

/// The header as a dict: dtype, shape, fortran_order, version, data_offset, nbytes, file_size.
py::dict header_dict(const NpyHeader& h, const std::string& path, std::uint64_t file_size);

/// The pool placement from the Python arguments (checked by the core, once per distinct placement).
Placement placement_of(const std::vector<int>& cpus, std::optional<int> nice,
                       std::optional<std::pair<int, int>> io_priority);

/// A gathered batch as the tuple (x, y) of arrays over its buffers (returned to their pool only when numpy,
/// and anything that adopted the memory, has let go).
py::tuple wrap_window_batch(const WindowSource& source, const WindowBatch& batch);

/// A 1-d int64 array's values.
std::vector<std::int64_t> int64_vector(const py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>& a);

}  // namespace npyfeed::bindings
