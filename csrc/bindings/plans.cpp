// Plans of epochs ("batch b of epoch e": ids, order, take) and their streams of batches as Python iterators.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <optional>
#include <string>

#include "bind.hpp"
#include "convert.hpp"
#include "gil.hpp"
#include "npyfeed/common/errors.hpp"
#include "npyfeed/device/page_lock.hpp"
#include "npyfeed/plan/block_order.hpp"
#include "npyfeed/plan/epoch_plan.hpp"
#include "npyfeed/stream/block_stream.hpp"

namespace npyfeed::bindings {

namespace {

// npyfeed.ClosedError: a call that waited for a batch when another thread closed what it waited on (the iterator,
// or the plan's read-ahead). One outcome for every consumer; never KeyboardInterrupt, which is Ctrl-C's.
py::handle closed_error_type;

[[noreturn]] void raise_closed(const char* message) {
  PyErr_SetString(closed_error_type.ptr(), message);
  throw py::error_already_set();
}

// An epoch's stream of batches (EpochPlan::stream) as a Python iterator.
class PyStream {
 public:
  PyStream(std::shared_ptr<const EpochPlan> plan, std::unique_ptr<EpochStream> stream)
      : plan_(std::move(plan)), stream_(std::move(stream)) {}
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
    const std::uint64_t asked = PipelineStats::now_ns();
    std::shared_ptr<Job> job = without_gil([&] { return stream_->next_job(); });
    if (!job) throw py::stop_iteration();
    wait_in_slices(*job);
    WindowBatch batch = without_gil([&] { return stream_->take(); });
    if (!batch.x) {  // closed by another thread while we waited
      raise_closed(
          "npyfeed: the iterator was closed (BatchIterator.close() from another thread) while next() "
          "waited for its batch");
    }
    plan_->stats()->waited(asked, PipelineStats::now_ns());
    return wrap_window_batch(plan_->source(), batch);
  }
  void close() {
    if (stream_) without_gil([&] { stream_->close(); });
  }
  std::size_t num_batches() const { return stream_ ? stream_->num_batches() : 0; }
  // shuffle="blocks": the stream's memory accounting (null otherwise).
  const BlockStream* blocks() const { return dynamic_cast<const BlockStream*>(stream_.get()); }

 private:
  std::shared_ptr<const EpochPlan> plan_;
  std::unique_ptr<EpochStream> stream_;
};

}  // namespace

void bind_plans(py::module_& m) {
  closed_error_type = *new py::exception<Cancelled>(m, "ClosedError", PyExc_RuntimeError);
  closed_error_type.attr("__doc__") =
      "A read that was waiting for its batch when another thread closed what it waited on: ``next()`` of a "
      "`BatchIterator` (`BatchIterator.close`), `Plan.take` (`Plan.close`), and so the framework adapters that read "
      "through them. A ``RuntimeError``. A read that starts after ``close()`` finds an iterator exhausted "
      "(``StopIteration``), and `Plan.take` starts a new stream.";

  // Live counters: raw integers (nanoseconds, bytes); npyfeed.stats turns them into the public dict.
  py::class_<PipelineStats, std::shared_ptr<PipelineStats>>(m, "PipelineStats")
      .def("counts",
           [](const PipelineStats& s) {
             const PipelineCounts c = s.counts();
             py::dict d;
             d["batches"] = c.batches;
             d["samples"] = c.samples;
             d["bytes"] = c.bytes;
             d["wait_ns"] = c.wait_ns;
             d["elapsed_ns"] = c.elapsed_ns;
             d["gather_ns"] = c.gather_ns;
             d["ready_batches"] = c.ready_batches;
             d["read_ahead_sum"] = c.read_ahead_sum;
             d["blocks_read"] = c.blocks_read;
             d["block_bytes_read"] = c.block_bytes_read;
             d["block_read_ns"] = c.block_read_ns;
             d["block_waits"] = c.block_waits;
             d["device_bytes"] = c.device_bytes;
             return d;
           })
      .def("served", &PipelineStats::served, py::arg("samples"), py::arg("bytes"), py::arg("gather_ns"),
           py::arg("ready_ahead"));

  py::class_<PyStream>(m, "BatchStream")
      .def("__next__", &PyStream::next)
      .def("close", &PyStream::close)
      .def_property_readonly("num_batches", &PyStream::num_batches)
      .def_property_readonly("buffered_bytes",
                             [](const PyStream& s) { return s.blocks() ? s.blocks()->buffered_bytes() : 0; })
      .def_property_readonly("peak_buffered_bytes",
                             [](const PyStream& s) { return s.blocks() ? s.blocks()->peak_buffered_bytes() : 0; })
      .def_property_readonly("num_blocks",
                             [](const PyStream& s) { return s.blocks() ? s.blocks()->plan().num_blocks() : 0; });

  // shuffle="blocks" groups a source's samples by key once (one pass over the index); its plans share it.
  py::class_<SamplesByKey, std::shared_ptr<SamplesByKey>>(m, "SamplesByKey")
      .def_property_readonly("runs", &SamplesByKey::runs);

  // "Batch b of epoch e": ids and order without IO; take from a stream positioned at the next batch (one call
  // at a time, from any thread; GIL released while it waits, Ctrl-C interrupts it); stream for an iterator.
  py::class_<EpochPlan, std::shared_ptr<EpochPlan>>(m, "Plan")
      .def(py::init([](std::shared_ptr<WindowSource> source, const std::string& shuffle, std::uint64_t seed,
                       std::size_t num_shards, std::size_t shard_index, std::size_t batch_size, bool drop_remainder,
                       std::uint64_t memory_budget, std::size_t prefetch, std::shared_ptr<SamplesByKey> samples,
                       const std::string& shard_by) {
             const EpochSpec spec(parse_shuffle(shuffle), seed, num_shards, shard_index, batch_size, drop_remainder,
                                  memory_budget, parse_shard_by(shard_by));
             return without_gil(
                 [&] { return std::make_shared<EpochPlan>(std::move(source), spec, prefetch, std::move(samples)); });
           }),
           py::arg("source"), py::arg("shuffle"), py::arg("seed"), py::arg("num_shards"), py::arg("shard_index"),
           py::arg("batch_size"), py::arg("drop_remainder"), py::arg("memory_budget"), py::arg("prefetch"),
           py::arg("samples_by_key") = nullptr, py::arg("shard_by") = "samples")
      .def("__len__", &EpochPlan::num_batches)
      .def_property_readonly("shard_size", &EpochPlan::shard_size)
      .def_property_readonly(
          "samples_by_key",
          [](const EpochPlan& p) { return std::const_pointer_cast<SamplesByKey>(p.samples_by_key()); })
      .def_property_readonly("streams_started", &EpochPlan::streams_started)
      .def_property_readonly("stats", &EpochPlan::stats)
      .def("ids",
           [](const EpochPlan& p, std::uint64_t epoch, std::size_t batch) {
             std::vector<std::int64_t> ids = without_gil([&] { return p.ids(epoch, batch); });
             return py::array_t<std::int64_t>(static_cast<py::ssize_t>(ids.size()), ids.data());
           })
      .def("order",
           [](const EpochPlan& p, std::uint64_t epoch) {
             std::vector<std::int64_t> ids = without_gil([&] { return p.order(epoch); });
             return py::array_t<std::int64_t>(static_cast<py::ssize_t>(ids.size()), ids.data());
           })
      .def("take",
           [](EpochPlan& p, std::uint64_t epoch, std::size_t batch) {
             // The thread that handles signals (the main one) runs them between the slices of its wait: Ctrl-C
             // interrupts it. Other threads never take the GIL while they wait.
             WhileWaiting check_signals;
             if (PyThread_get_thread_ident() == main_thread_id()) {
               check_signals = [] {
                 py::gil_scoped_acquire gil;
                 if (PyErr_CheckSignals() != 0) throw py::error_already_set();
               };
             }
             WindowBatch b;
             try {
               b = without_gil([&] { return p.take(epoch, batch, check_signals); });
             } catch (const Cancelled&) {
               raise_closed(
                   "npyfeed: the plan was closed (Plan.close() from another thread) while take() waited "
                   "for its batch");
             }
             return wrap_window_batch(p.source(), b);
           })
      .def(
          "stream",
          [](const std::shared_ptr<EpochPlan>& p, std::uint64_t epoch, std::size_t start_batch, std::size_t prefetch,
             std::optional<int> pin_device) {
            auto stream = without_gil([&] {
              auto locker = pin_device ? PageLocker::open("", *pin_device) : nullptr;
              return p->stream(epoch, start_batch, prefetch, std::move(locker));
            });
            return std::make_unique<PyStream>(p, std::move(stream));
          },
          py::arg("epoch"), py::arg("start_batch"), py::arg("prefetch"), py::arg("pin_device") = std::nullopt)
      .def(
          "pin_taken_batches",
          [](EpochPlan& p, int device) { without_gil([&] { p.pin_taken_batches(PageLocker::open("", device)); }); },
          py::arg("device"))
      .def("close", [](EpochPlan& p) { without_gil([&] { p.close(); }); });
}

}  // namespace npyfeed::bindings
