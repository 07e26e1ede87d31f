// _core.testing: the one hook for what only tests ask of the core (no public API reaches it): the blocks of a
// shard's epoch under shuffle="blocks" (to count the block reads the statistics report) and the bytes a streamed
// device epoch uploads, counted without reading (to check the device statistics). Nothing in the package or the
// benchmarks calls it.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "bind.hpp"
#include "gil.hpp"
#include "npyfeed/device/device_rows.hpp"
#include "npyfeed/plan/epoch_plan.hpp"

namespace npyfeed::bindings {

void bind_testing(py::module_& m) {
  py::module_ testing = m.def_submodule("testing", "For tests only: not part of npyfeed's API.");
  testing.def(
      "shard_blocks",
      [](const EpochPlan& plan, std::uint64_t epoch) {
        std::vector<ShardBlock> blocks = without_gil([&] { return plan.shard_blocks(epoch); });
        py::list out;
        for (const ShardBlock& b : blocks) {
          out.append(py::make_tuple(
              b.begin, b.end, py::array_t<std::uint32_t>(static_cast<py::ssize_t>(b.keys.size()), b.keys.data())));
        }
        return out;
      },
      py::arg("plan"), py::arg("epoch"),
      "(first position, end position, keys) of each block of `epoch` in this shard (a shuffle='blocks' plan).");
  testing.def(
      "streamed_epoch_bytes",
      [](const DeviceRows& rows, std::uint64_t epoch) {
        return without_gil([&] { return rows.streamed_epoch_bytes(epoch); });
      },
      py::arg("device_rows"), py::arg("epoch"), "The bytes a streamed device epoch uploads over its groups.");
}

}  // namespace npyfeed::bindings
