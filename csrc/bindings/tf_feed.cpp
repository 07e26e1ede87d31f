// The feeds npyfeed.tf's native ops read (the TensorFlow op library, csrc/tf_ops/, calls them through the C
// ABI of npyfeed/tf_feed_abi.h): a registry of feeds by id, and the table of C functions over it. Compiled
// into _core, so the op library holds no copy of the core.
//
// Lifetime: Python makes a TfFeed over its plan (EpochBatches, BlockBatches) and registers it; the TfFeed
// object unregisters it when it dies (npyfeed.tf keeps it as long as the dataset, or the graph that captured
// its id). A graph holds only the id: a call with an unregistered id fails with FAILED_PRECONDITION, and a call
// in flight holds the feed (and its plan, source, buffers) until it returns. The registry itself is never
// destroyed, so a TensorFlow thread still calling at process exit finds it.
#include <pybind11/pybind11.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include "npyfeed/block_batches.hpp"
#include "npyfeed/epoch_batches.hpp"
#include "npyfeed/errors.hpp"
#include "npyfeed/tf_feed_abi.h"
#include "npyfeed/window_source.hpp"

namespace py = pybind11;
using namespace npyfeed;

namespace {

// TF_Code values (tensorflow/c/tf_status.h): stable, they are gRPC's status codes.
enum Code : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kNotFound = 5,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kUnimplemented = 12,
};

struct IdsUnsupported {};

/// A plan as the ops see it: batch b of epoch e, its ids, and the epoch of each new pass.
class Feed {
 public:
  virtual ~Feed() = default;
  virtual WindowBatch take(std::uint64_t epoch, std::size_t batch) = 0;
  virtual std::vector<std::int64_t> ids(std::uint64_t epoch, std::size_t batch) = 0;
  virtual const WindowSource& source() const = 0;
  virtual void close() = 0;

  /// The epoch of the next pass (each call a new one), and a pass seen at `epoch` (a restored iterator).
  std::int64_t next_epoch() { return next_epoch_.fetch_add(1); }
  void seen_epoch(std::int64_t epoch) {
    std::int64_t next = next_epoch_.load();
    while (next <= epoch && !next_epoch_.compare_exchange_weak(next, epoch + 1)) {
    }
  }
  void set_first_epoch(std::int64_t epoch) { next_epoch_.store(epoch); }
  bool closed() const { return closed_.load(); }
  void mark_closed() { closed_.store(true); }

 private:
  std::atomic<std::int64_t> next_epoch_{0};
  std::atomic<bool> closed_{false};
};

/// Any plan with take(epoch, batch) -> WindowBatch, source() and close(); ids(epoch, batch) where it has them.
template <class Plan>
class FeedOf final : public Feed {
 public:
  explicit FeedOf(std::shared_ptr<Plan> plan) : plan_(std::move(plan)) {}
  WindowBatch take(std::uint64_t epoch, std::size_t batch) override { return plan_->take(epoch, batch); }
  std::vector<std::int64_t> ids(std::uint64_t epoch, std::size_t batch) override {
    if constexpr (requires(const Plan& p) { p.ids(epoch, batch); }) {
      return plan_->ids(epoch, batch);
    } else {
      throw IdsUnsupported();
    }
  }
  const WindowSource& source() const override { return plan_->source(); }
  void close() override { plan_->close(); }

 private:
  std::shared_ptr<Plan> plan_;
};

struct Registry {
  std::mutex mutex;
  std::unordered_map<std::int64_t, std::shared_ptr<Feed>> feeds;
  std::int64_t next_id = 1;  // ids are never reused in a process
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: TensorFlow's threads may call at exit
  return *r;
}

std::shared_ptr<Feed> find(std::int64_t id) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.feeds.find(id);
  return it == r.feeds.end() ? nullptr : it->second;
}

thread_local std::string t_error;

int fail(int code, std::string message) {
  t_error = std::move(message);
  return code;
}

// Runs `body` on feed `id`, mapping npyfeed's exceptions to TF_Codes with npyfeed's message.
template <class Body>
int with_feed(std::int64_t id, const Body& body) noexcept {
  try {
    std::shared_ptr<Feed> feed = find(id);
    if (!feed) {
      return fail(kFailedPrecondition, "npyfeed.tf: feed " + std::to_string(id) +
                                           " is gone (its dataset was garbage-collected while its pipeline still ran)");
    }
    if (feed->closed()) return fail(kCancelled, "npyfeed.tf: the feed was closed");
    return body(*feed);
  } catch (const OsError& e) {
    return fail(e.error_number() == ENOENT ? kNotFound : kUnknown, e.what());
  } catch (const Cancelled&) {
    return fail(kCancelled, "npyfeed.tf: the gather was cancelled");
  } catch (const Error& e) {  // NpyFormatError, InvalidArgument, IndexOutOfRange: the data or the position
    return fail(kInvalidArgument, e.what());
  } catch (const IdsUnsupported&) {
    return fail(kUnimplemented, "npyfeed.tf: sample ids are not supported yet for shuffle='blocks'");
  } catch (const std::bad_alloc&) {
    return fail(kResourceExhausted, "npyfeed.tf: out of memory");
  } catch (const std::exception& e) {
    return fail(kUnknown, e.what());
  } catch (...) {
    return fail(kUnknown, "npyfeed.tf: unknown error");
  }
}

std::atomic<std::int64_t> g_owners{0};  // owners handed out by take() and ids() and not yet released

void* own(std::shared_ptr<const void> p) {
  g_owners.fetch_add(1, std::memory_order_relaxed);
  return new std::shared_ptr<const void>(std::move(p));
}

int fill_dims(const WindowSource& source, bool label, std::size_t count, int32_t* rank, int64_t* dims) {
  const std::vector<std::int64_t> shape = label ? source.y_shape() : source.x_shape();
  if (shape.size() + 1 > NPYFEED_TF_MAX_DIMS) throw InvalidArgument("npyfeed.tf: too many dimensions");
  *rank = static_cast<int32_t>(shape.size() + 1);
  dims[0] = static_cast<int64_t>(count);
  std::copy(shape.begin(), shape.end(), dims + 1);
  return kOk;
}

extern "C" int abi_take(int64_t id, uint64_t epoch, uint64_t batch, NpyfeedTfBatch* out) {
  return with_feed(id, [&](Feed& feed) {
    WindowBatch b = feed.take(epoch, batch);
    if (feed.closed()) return fail(kCancelled, "npyfeed.tf: the feed was closed");
    const WindowSource& source = feed.source();
    *out = NpyfeedTfBatch{};
    out->item_size = static_cast<int32_t>(source.options().out_size);
    out->x = b.x->data();
    out->y = b.y->data();
    out->x_bytes = b.count * source.x_sample_bytes();
    out->y_bytes = b.count * source.y_sample_bytes();
    fill_dims(source, false, b.count, &out->x_rank, out->x_dims);
    fill_dims(source, true, b.count, &out->y_rank, out->y_dims);
    out->x_owner = own(std::move(b.x));
    out->y_owner = own(std::move(b.y));
    return static_cast<int>(kOk);
  });
}

extern "C" int abi_ids(int64_t id, uint64_t epoch, uint64_t batch, const int64_t** data, size_t* count, void** owner) {
  return with_feed(id, [&](Feed& feed) {
    auto ids = std::make_shared<const std::vector<std::int64_t>>(feed.ids(epoch, batch));
    *data = ids->data();
    *count = ids->size();
    *owner = own(std::move(ids));
    return static_cast<int>(kOk);
  });
}

extern "C" int abi_next_epoch(int64_t id, int64_t* out) {
  return with_feed(id, [&](Feed& feed) {
    *out = feed.next_epoch();
    return static_cast<int>(kOk);
  });
}

extern "C" int abi_seen_epoch(int64_t id, int64_t epoch) {
  return with_feed(id, [&](Feed& feed) {
    feed.seen_epoch(epoch);
    return static_cast<int>(kOk);
  });
}

extern "C" void abi_release(void* owner) {
  delete static_cast<std::shared_ptr<const void>*>(owner);
  g_owners.fetch_sub(1, std::memory_order_relaxed);
}

extern "C" const char* abi_last_error() { return t_error.c_str(); }

const NpyfeedTfFeedApi kApi = {
    NPYFEED_TF_FEED_ABI_VERSION,
    sizeof(NpyfeedTfFeedApi),
    abi_take,
    abi_ids,
    abi_next_epoch,
    abi_seen_epoch,
    abi_release,
    abi_last_error,
};

/// Python's handle on a registered feed: unregisters it when it dies (or at close()).
class TfFeed {
 public:
  TfFeed(std::shared_ptr<Feed> feed, std::int64_t first_epoch) {
    feed->set_first_epoch(first_epoch);
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    id_ = r.next_id++;
    r.feeds.emplace(id_, std::move(feed));
  }
  ~TfFeed() { unregister(); }
  TfFeed(const TfFeed&) = delete;
  TfFeed& operator=(const TfFeed&) = delete;
  std::int64_t id() const noexcept { return id_; }
  /// Unregisters the feed and makes calls in flight fail (CANCELLED) once their gather returns. Idempotent.
  void close() {
    if (std::shared_ptr<Feed> feed = unregister()) feed->mark_closed();
  }

 private:
  std::shared_ptr<Feed> unregister() {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    auto it = r.feeds.find(id_);
    if (it == r.feeds.end()) return nullptr;
    std::shared_ptr<Feed> feed = std::move(it->second);
    r.feeds.erase(it);
    return feed;
  }
  std::int64_t id_ = 0;
};

}  // namespace

void bind_tf_feed(py::module_& m) {
  py::class_<TfFeed>(m, "TfFeed")
      .def(py::init([](std::shared_ptr<EpochBatches> plan, std::int64_t first_epoch) {
             return new TfFeed(std::make_shared<FeedOf<EpochBatches>>(std::move(plan)), first_epoch);
           }),
           py::arg("plan"), py::arg("first_epoch"))
      .def(py::init([](std::shared_ptr<BlockBatches> plan, std::int64_t first_epoch) {
             return new TfFeed(std::make_shared<FeedOf<BlockBatches>>(std::move(plan)), first_epoch);
           }),
           py::arg("plan"), py::arg("first_epoch"))
      .def_property_readonly("id", &TfFeed::id)
      .def("close", &TfFeed::close);
  m.attr("TF_FEED_ABI_VERSION") = NPYFEED_TF_FEED_ABI_VERSION;
  m.def(
      "tf_feed_owners", [] { return g_owners.load(); },
      "Buffers (and id lists) the op library holds from take() and ids() and has not released (for tests).");
  m.def(
      "tf_feed_api", [] { return reinterpret_cast<std::uintptr_t>(&kApi); },
      "Address of the NpyfeedTfFeedApi table (npyfeed/tf_feed_abi.h) for npyfeed.tf's op library.");
}
