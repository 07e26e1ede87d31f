// npyfeed.tf's feeds (npyfeed/tf/tf_feed.hpp) for Python: a handle that registers a plan's feed and unregisters
// it when it dies, and the address of the C table that npyfeed.tf hands to its op library.
#include "npyfeed/tf/tf_feed.hpp"

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>

#include "bind.hpp"
#include "npyfeed/plan/epoch_plan.hpp"

namespace npyfeed::bindings {

namespace py = pybind11;

namespace {

/// Python's handle on a registered feed: unregisters it at close() or when it dies, whichever comes first.
class TfFeedHandle {
 public:
  TfFeedHandle(std::shared_ptr<TfFeed> feed, std::int64_t first_epoch)
      : feed_(feed), id_(register_tf_feed(std::move(feed), first_epoch)) {}
  ~TfFeedHandle() { close(); }
  TfFeedHandle(const TfFeedHandle&) = delete;
  TfFeedHandle& operator=(const TfFeedHandle&) = delete;
  std::int64_t id() const noexcept { return id_; }
  void set_next_pass(std::int64_t epoch, std::int64_t batch) { feed_->set_next_pass(epoch, batch); }
  void close() { unregister_tf_feed(id_); }

 private:
  std::shared_ptr<TfFeed> feed_;
  std::int64_t id_;
};

TfFeedHandle* make_handle(std::shared_ptr<EpochPlan> plan, std::int64_t first_epoch,
                          std::shared_ptr<DeviceRows> device_rows) {
  return new TfFeedHandle(std::make_shared<TfFeed>(std::move(plan), std::move(device_rows)), first_epoch);
}

}  // namespace

void bind_tf_feed(py::module_& m) {
  py::class_<TfFeedHandle>(m, "TfFeed")
      .def(py::init(&make_handle), py::arg("plan"), py::arg("first_epoch"), py::arg("device_rows") = nullptr)
      .def_property_readonly("id", &TfFeedHandle::id)
      .def("set_next_pass", &TfFeedHandle::set_next_pass, py::arg("epoch"), py::arg("batch"),
           "The next pass over the dataset starts at batch `batch` of epoch `epoch`; the one after it at epoch + 1.")
      .def("close", &TfFeedHandle::close);
  m.attr("TF_FEED_ABI_VERSION") = NPYFEED_TF_FEED_ABI_VERSION;
  m.def(
      "tf_feed_api", [] { return reinterpret_cast<std::uintptr_t>(&tf_feed_api()); },
      "Address of the NpyfeedTfFeedApi table (npyfeed/tf/tf_feed_abi.h) for npyfeed.tf's op library.");
  m.def("tf_feed_owners", &tf_feed_owners,
        "Buffers (and id lists, start rows) the op library holds from the feeds and has not released (for tests).");
}

}  // namespace npyfeed::bindings
