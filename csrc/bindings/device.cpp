// Batches formed on a device (npyfeed.tf.dataset(gather="device")): the host's half, DeviceRows, for
// npyfeed._device. Host rows come back as numpy arrays over the core's buffers (bfloat16 as uint16: numpy has
// no such type; the caller views them as TensorFlow's), start rows as int64 arrays.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <utility>

#include "bind.hpp"
#include "convert.hpp"
#include "gil.hpp"
#include "npyfeed/common/errors.hpp"
#include "npyfeed/device/device_rows.hpp"
#include "npyfeed/device/page_lock.hpp"

namespace npyfeed::bindings {

namespace {

py::dtype storage_dtype(StorageType type) {
  switch (type) {
    case StorageType::kFloat16:
      return py::dtype("float16");
    case StorageType::kBFloat16:
      return py::dtype("uint16");
    case StorageType::kFloat32:
      return py::dtype("float32");
    case StorageType::kFloat64:
      return py::dtype("float64");
  }
  return py::dtype("float32");
}

// (rows, row elements) over the buffer, which the array's `.base` keeps alive.
py::array wrap_rows(const HostRows& rows, StorageType type) {
  auto* owner = new std::shared_ptr<AlignedBuffer>(rows.buffer);
  py::capsule base(owner, [](void* p) { delete static_cast<std::shared_ptr<AlignedBuffer>*>(p); });
  const auto item = static_cast<py::ssize_t>(storage_size(type));
  const auto elems = static_cast<py::ssize_t>(rows.row_elems);
  return py::array(storage_dtype(type), {static_cast<py::ssize_t>(rows.rows), elems}, {elems * item, item},
                   rows.buffer->data(), base);
}

py::array_t<std::int64_t> int64_array(const std::vector<std::int64_t>& v) {
  return py::array_t<std::int64_t>(static_cast<py::ssize_t>(v.size()), v.data());
}

py::tuple wrap_start_rows(const StartRows& r) {
  return py::make_tuple(int64_array(r.start), int64_array(r.lo), int64_array(r.hi), int64_array(r.label));
}

}  // namespace

void bind_device(py::module_& m) {
  m.def(
      "cuda_runtime_library",
      []() -> py::object {
        try {
          return py::str(without_gil([] { return find_cuda_runtime("").library; }));
        } catch (const Error&) {
          return py::none();
        }
      },
      "The CUDA runtime library that pin_memory uses (find_cuda_runtime: NPYFEED_CUDA_RUNTIME, else one already "
      "loaded, else one that loads), as dlopen names it; None when there is none.");
  py::class_<DeviceRows, std::shared_ptr<DeviceRows>>(m, "DeviceRows")
      .def(py::init([](std::shared_ptr<EpochPlan> plan, const std::string& storage) {
             const StorageType type = parse_storage_type(storage);
             return without_gil([&] { return std::make_shared<DeviceRows>(std::move(plan), type); });
           }),
           py::arg("plan"), py::arg("storage_dtype"))
      .def_property_readonly("storage_dtype",
                             [](const DeviceRows& d) {
                               static const char* const kNames[] = {"float16", "bfloat16", "float32", "float64"};
                               return std::string(kNames[static_cast<int>(d.storage())]);
                             })
      .def_property_readonly("keys", [](const DeviceRows& d) { return py::cast(d.keys()); })
      .def_property_readonly("resident_bytes", &DeviceRows::resident_bytes)
      .def_property_readonly("largest_group_bytes", [](const DeviceRows& d) { return d.largest_group_bytes(); })
      .def(
          "read_resident",
          [](const DeviceRows& d, bool label) {
            HostRows rows = without_gil([&] { return d.read_resident(label); });
            return wrap_rows(rows, d.storage());
          },
          py::arg("label"))
      .def(
          "rows",
          [](const DeviceRows& d, std::uint64_t epoch, std::size_t batch) {
            StartRows rows = without_gil([&] { return d.rows(epoch, batch); });
            return wrap_start_rows(rows);
          },
          py::arg("epoch"), py::arg("batch"))
      .def(
          "groups",
          [](const DeviceRows& d, std::uint64_t epoch) {
            std::vector<DeviceGroup> groups = without_gil([&] { return d.groups(epoch); });
            py::array_t<std::int64_t> out({static_cast<py::ssize_t>(groups.size()), py::ssize_t{4}});
            auto a = out.mutable_unchecked<2>();
            for (std::size_t i = 0; i < groups.size(); ++i) {
              const auto r = static_cast<py::ssize_t>(i);
              a(r, 0) = static_cast<std::int64_t>(groups[i].first_batch);
              a(r, 1) = static_cast<std::int64_t>(groups[i].end_batch);
              a(r, 2) = static_cast<std::int64_t>(groups[i].first_block);
              a(r, 3) = static_cast<std::int64_t>(groups[i].last_block);
            }
            return out;
          },
          py::arg("epoch"))
      .def(
          "group",
          [](const DeviceRows& d, std::uint64_t epoch, std::size_t index) {
            GroupUpload g = without_gil([&] { return d.group(epoch, index); });
            const StartRows& r = g.rows;
            return py::make_tuple(wrap_rows(g.factors, d.storage()), wrap_rows(g.labels, d.storage()),
                                  int64_array(r.start), int64_array(r.lo), int64_array(r.hi), int64_array(r.label),
                                  int64_array(g.batch_ends));
          },
          py::arg("epoch"), py::arg("index"));
}

}  // namespace npyfeed::bindings
