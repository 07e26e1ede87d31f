#include "npyfeed/tf/tf_feed.hpp"

#include <algorithm>
#include <cerrno>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>

#include "npyfeed/common/errors.hpp"

namespace npyfeed {

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
};

struct Registry {
  std::mutex mutex;
  std::unordered_map<std::int64_t, std::shared_ptr<TfFeed>> feeds;
  std::int64_t next_id = 1;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: TensorFlow's threads may call at exit
  return *r;
}

std::shared_ptr<TfFeed> find(std::int64_t id) {
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

int closed_error() { return fail(kCancelled, "npyfeed.tf: the feed was closed"); }

// Runs `body` on feed `id`, mapping npyfeed's exceptions to TF_Codes with npyfeed's message (it names the file,
// index line or key). Nothing escapes into the op library.
template <class Body>
int with_feed(std::int64_t id, const Body& body) noexcept {
  try {
    std::shared_ptr<TfFeed> feed = find(id);
    if (!feed) {
      return fail(kFailedPrecondition, "npyfeed.tf: feed " + std::to_string(id) +
                                           " is gone (its dataset was garbage-collected while its pipeline still ran)");
    }
    if (feed->closed()) return closed_error();
    return body(*feed);
  } catch (const OsError& e) {  // messages start with the Python type the numpy path would raise
    return e.error_number() == ENOENT ? fail(kNotFound, std::string("FileNotFoundError: ") + e.what())
                                      : fail(kUnknown, std::string("OSError: ") + e.what());
  } catch (const Cancelled&) {
    return fail(kCancelled, "npyfeed.tf: the gather was cancelled");
  } catch (const NpyFormatError& e) {
    return fail(kInvalidArgument, std::string("NpyFormatError: ") + e.what());
  } catch (const IndexOutOfRange& e) {
    return fail(kInvalidArgument, std::string("IndexError: ") + e.what());
  } catch (const Error& e) {  // InvalidArgument: data that does not fit together
    return fail(kInvalidArgument, std::string("ValueError: ") + e.what());
  } catch (const std::bad_alloc&) {
    return fail(kResourceExhausted, "npyfeed.tf: out of memory");
  } catch (const std::exception& e) {
    return fail(kUnknown, e.what());
  } catch (...) {
    return fail(kUnknown, "npyfeed.tf: unknown error");
  }
}

std::atomic<std::int64_t> g_owners{0};

void* own(std::shared_ptr<const void> p) {
  g_owners.fetch_add(1, std::memory_order_relaxed);
  return new std::shared_ptr<const void>(std::move(p));
}

void fill_dims(const std::vector<std::int64_t>& shape, std::size_t count, int32_t* rank, int64_t* dims) {
  if (shape.size() + 1 > NPYFEED_TF_MAX_DIMS) throw InvalidArgument("npyfeed.tf: too many dimensions");
  *rank = static_cast<int32_t>(shape.size() + 1);
  dims[0] = static_cast<int64_t>(count);
  std::copy(shape.begin(), shape.end(), dims + 1);
}

extern "C" int abi_take(int64_t id, uint64_t epoch, uint64_t batch, NpyfeedTfBatch* out) {
  return with_feed(id, [&](TfFeed& feed) {
    WindowBatch b = feed.take(epoch, batch);
    if (feed.closed()) return closed_error();
    const WindowSource& source = feed.source();
    *out = NpyfeedTfBatch{};
    out->item_size = static_cast<int32_t>(source.options().out_size);
    out->x = b.x->data();
    out->y = b.y->data();
    out->x_bytes = b.count * source.x_sample_bytes();
    out->y_bytes = b.count * source.y_sample_bytes();
    fill_dims(source.x_shape(), b.count, &out->x_rank, out->x_dims);
    fill_dims(source.y_shape(), b.count, &out->y_rank, out->y_dims);
    out->x_owner = own(std::move(b.x));
    out->y_owner = own(std::move(b.y));
    return static_cast<int>(kOk);
  });
}

extern "C" int abi_next_pass(int64_t id, int64_t* epoch, int64_t* batch) {
  return with_feed(id, [&](TfFeed& feed) {
    const TfFeed::Pass pass = feed.next_pass();
    *epoch = pass.epoch;
    *batch = pass.batch;
    return static_cast<int>(kOk);
  });
}

extern "C" int abi_seen_epoch(int64_t id, int64_t epoch) {
  return with_feed(id, [&](TfFeed& feed) {
    feed.seen_epoch(epoch);
    return static_cast<int>(kOk);
  });
}

const DeviceRows& device_of(const TfFeed& feed) {
  if (feed.device() == nullptr) throw InvalidArgument("npyfeed.tf: this feed forms no batches on a device");
  return *feed.device();
}

// Start rows for the op library: the vectors stay where they are, owned by the returned owner.
void hand_over(StartRows rows, NpyfeedTfRows* out) {
  auto held = std::make_shared<const StartRows>(std::move(rows));
  *out = NpyfeedTfRows{held->start.data(), held->lo.data(),    held->hi.data(),
                       held->label.data(), held->start.size(), nullptr};
  out->owner = own(std::move(held));
}

extern "C" int abi_start_rows(int64_t id, uint64_t epoch, uint64_t batch, NpyfeedTfRows* out) {
  return with_feed(id, [&](TfFeed& feed) {
    hand_over(device_of(feed).rows(epoch, batch), out);
    return static_cast<int>(kOk);
  });
}

extern "C" int abi_num_groups(int64_t id, uint64_t epoch, int64_t* out) {
  return with_feed(id, [&](TfFeed& feed) {
    *out = static_cast<int64_t>(device_of(feed).groups(epoch).size());
    return static_cast<int>(kOk);
  });
}

extern "C" int abi_group(int64_t id, uint64_t epoch, uint64_t index, NpyfeedTfGroup* out) {
  return with_feed(id, [&](TfFeed& feed) {
    const DeviceRows& device = device_of(feed);
    GroupUpload g = device.group(epoch, index);
    *out = NpyfeedTfGroup{};
    out->factors = g.factors.buffer->data();
    out->labels = g.labels.buffer->data();
    out->factor_rows = static_cast<int64_t>(g.factors.rows);
    out->factor_elems = static_cast<int64_t>(g.factors.row_elems);
    out->label_rows = static_cast<int64_t>(g.labels.rows);
    out->label_elems = static_cast<int64_t>(g.labels.row_elems);
    out->storage = static_cast<int32_t>(device.storage());
    hand_over(std::move(g.rows), &out->rows);
    auto ends = std::make_shared<const std::vector<std::int64_t>>(std::move(g.batch_ends));
    out->batch_ends = ends->data();
    out->num_batches = ends->size();
    out->batch_ends_owner = own(std::move(ends));
    out->factors_owner = own(std::move(g.factors.buffer));
    out->labels_owner = own(std::move(g.labels.buffer));
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
    abi_next_pass,
    abi_seen_epoch,
    abi_release,
    abi_last_error,
    abi_start_rows,
    abi_num_groups,
    abi_group,
};

}  // namespace

TfFeed::Pass TfFeed::next_pass() {
  std::lock_guard lock(pass_mutex_);
  const Pass pass = next_;
  next_ = {pass.epoch + 1, 0};
  return pass;
}

void TfFeed::set_next_pass(std::int64_t epoch, std::int64_t batch) {
  constexpr std::int64_t kEpochLimit = std::int64_t{1} << 62;  // npyfeed's epochs: [0, 2**62), as everywhere
  if (epoch < 0 || epoch >= kEpochLimit) {
    throw InvalidArgument("npyfeed.tf: epoch " + std::to_string(epoch) + " is outside [0, 2**62)");
  }
  const auto batches = static_cast<std::int64_t>(plan_->num_batches());
  if (batch < 0 || batch >= batches) {
    throw InvalidArgument("npyfeed.tf: batch " + std::to_string(batch) + " of an epoch of " + std::to_string(batches) +
                          " batches");
  }
  std::lock_guard lock(pass_mutex_);
  next_ = {epoch, batch};
}

void TfFeed::seen_epoch(std::int64_t epoch) {
  std::lock_guard lock(pass_mutex_);
  if (next_.epoch <= epoch) next_ = {epoch + 1, 0};
}

void TfFeed::set_first_epoch(std::int64_t epoch) {
  std::lock_guard lock(pass_mutex_);
  next_ = {epoch, 0};
}

std::int64_t register_tf_feed(std::shared_ptr<TfFeed> feed, std::int64_t first_epoch) {
  feed->set_first_epoch(first_epoch);
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  const std::int64_t id = r.next_id++;
  r.feeds.emplace(id, std::move(feed));
  return id;
}

std::shared_ptr<TfFeed> unregister_tf_feed(std::int64_t id) {
  std::shared_ptr<TfFeed> feed;
  {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    auto it = r.feeds.find(id);
    if (it == r.feeds.end()) return nullptr;
    feed = std::move(it->second);
    r.feeds.erase(it);
  }
  feed->close();
  return feed;
}

const NpyfeedTfFeedApi& tf_feed_api() noexcept { return kApi; }

std::int64_t tf_feed_owners() noexcept { return g_owners.load(); }

}  // namespace npyfeed
