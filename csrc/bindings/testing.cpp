// _core.testing: the one hook for what only tests ask of the core (no public API reaches it): the blocks of a
// shard's epoch under shuffle="blocks" (to count the block reads the statistics report), the bytes a streamed
// device epoch uploads, counted without reading (to check the device statistics), and every worker of the
// background pool held until released (to prove that the populate runs there, never holding up a gather).
// Nothing in the package or the benchmarks calls it.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "bind.hpp"
#include "gil.hpp"
#include "npyfeed/common/thread_pool.hpp"
#include "npyfeed/device/device_rows.hpp"
#include "npyfeed/plan/epoch_plan.hpp"

namespace npyfeed::bindings {

namespace {

// Every worker of the default placement's background pool blocked in a job of its own until release() (or
// destruction).
class BackgroundPoolHold {
 public:
  BackgroundPoolHold() {
    ThreadPool& pool = shared_background_pool(1);
    const std::size_t workers = pool.size();
    job_ = pool.start(workers, workers, [this](std::size_t) {
      std::unique_lock lock(mutex_);
      ++holding_;
      changed_.notify_all();
      changed_.wait(lock, [this] { return released_; });
    });
    std::unique_lock lock(mutex_);
    if (!changed_.wait_for(lock, std::chrono::seconds(30), [this, workers] { return holding_ == workers; })) {
      lock.unlock();
      release();
      throw std::runtime_error("BackgroundPoolHold: a worker of the background pool stayed busy for 30 s");
    }
  }
  ~BackgroundPoolHold() { release(); }
  void release() {
    {
      std::lock_guard lock(mutex_);
      released_ = true;
    }
    changed_.notify_all();
    job_->wait();
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::size_t holding_ = 0;
  bool released_ = false;
  std::shared_ptr<Job> job_;
};

}  // namespace

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
  py::class_<BackgroundPoolHold>(
      testing, "BackgroundPoolHold",
      "Every worker of the background pool (default placement) held from construction to release().")
      .def(py::init([] { return without_gil([] { return std::make_unique<BackgroundPoolHold>(); }); }))
      .def("release", [](BackgroundPoolHold& hold) { without_gil([&] { hold.release(); }); });
}

}  // namespace npyfeed::bindings
