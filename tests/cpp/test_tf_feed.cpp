// npyfeed.tf's feeds through the C table the op library calls (tf_feed.hpp, tf_feed_abi.h): batches equal
// the plan's, every owner handed out comes back, errors are TF_Codes with npyfeed's message, and threads taking
// batches while the feed is unregistered under them get a batch or a clean error (run under the sanitizers).
// Mirrors the native-path tests of tests/test_tf.py.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "check.hpp"
#include "npy_writer.hpp"
#include "npyfeed/common/errors.hpp"
#include "npyfeed/common/thread_pool.hpp"
#include "npyfeed/gather/window_source.hpp"
#include "npyfeed/index/index.hpp"
#include "npyfeed/plan/epoch_order.hpp"
#include "npyfeed/plan/epoch_plan.hpp"
#include "npyfeed/tf/tf_feed.hpp"

using namespace npyfeed;
using npyfeed::test::contains;
using npyfeed::test::TempDir;

namespace {

constexpr std::int64_t kRows = 40;
constexpr std::int64_t kCols = 3;
constexpr std::int64_t kWindow = 4;

std::shared_ptr<WindowSource> open_source(const TempDir& dir) {
  std::vector<float> x(kRows * kCols), y(kRows);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<float>(1000 + i);
  auto bytes = [](const std::vector<float>& v) {
    std::vector<std::byte> b(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
    return b;
  };
  const std::string f = dir.file("f.npy"), l = dir.file("l.npy");
  npyfeed::test::write_file(f, npyfeed::test::npy_header("<f4", "(40, 3)"), bytes(x));
  npyfeed::test::write_file(l, npyfeed::test::npy_header("<f4", "(40,)"), bytes(y));
  SampleIndex index;
  index.sources.push_back("index.txt");
  for (std::int64_t r = kWindow - 1; r < kRows; ++r) index.add(r, r, "a", 0, static_cast<std::uint64_t>(r));
  WindowOptions o;
  o.window = kWindow;
  o.threads = 2;
  auto source = std::make_shared<WindowSource>(std::move(index), o);
  source->start_open(shared_pool(), {f}, {l})->wait();
  source->finish_open();
  return source;
}

std::vector<float> floats(const void* data, std::size_t bytes) {
  std::vector<float> v(bytes / 4);
  std::memcpy(v.data(), data, bytes);
  return v;
}

std::vector<float> floats(const AlignedBuffer& b, std::size_t bytes) { return floats(b.data(), bytes); }

}  // namespace

TEST_CASE("tf feed: take through the table equals the plan's batches, and every owner comes back") {
  TempDir dir;
  auto source = open_source(dir);
  auto plan = std::make_shared<EpochPlan>(source, EpochSpec(Shuffle::kGlobal, 7, 1, 0, 8, false, 0));
  const NpyfeedTfFeedApi& api = tf_feed_api();
  CHECK_EQ(api.abi_version, static_cast<uint32_t>(NPYFEED_TF_FEED_ABI_VERSION));
  const std::int64_t owners = tf_feed_owners();
  auto feed = std::make_shared<TfFeed>(plan);
  const std::int64_t id = register_tf_feed(feed, 2);
  for (std::size_t b = 0; b < plan->num_batches(); ++b) {
    NpyfeedTfBatch got;
    REQUIRE(api.take(id, 3, b, &got) == 0);
    auto [want, job] = source->start_batch(shared_pool(), plan->ids(3, b));
    job->wait();
    CHECK_EQ(got.x_rank, 3);
    CHECK_EQ(got.x_dims[0], static_cast<int64_t>(want.count));
    CHECK_EQ(got.x_dims[1], kWindow);
    CHECK_EQ(got.x_dims[2], kCols);
    CHECK_EQ(got.y_rank, 1);
    CHECK_EQ(got.item_size, 4);
    CHECK_EQ(reinterpret_cast<std::uintptr_t>(got.x) % kBufferAlignment, 0u);
    CHECK(floats(got.x, got.x_bytes) == floats(*want.x, got.x_bytes));
    CHECK(floats(got.y, got.y_bytes) == floats(*want.y, got.y_bytes));
    CHECK_EQ(tf_feed_owners(), owners + 2);
    api.release(got.x_owner);
    api.release(got.y_owner);
    const EpochOrder order(source->size(), true, 7, 3, 1, 0);
    CHECK(plan->ids(3, b) == order.slice(b * 8, 8));  // the batch compared with is epoch 3's, batch b
  }
  CHECK_EQ(tf_feed_owners(), owners);
  int64_t epoch = -1;
  int64_t batch = -1;
  CHECK(api.next_pass(id, &epoch, &batch) == 0 && epoch == 2 && batch == 0);
  CHECK(api.seen_epoch(id, 5) == 0);
  CHECK(api.next_pass(id, &epoch, &batch) == 0 && epoch == 6 && batch == 0);
  CHECK(api.next_pass(id, &epoch, &batch) == 0 && epoch == 7 && batch == 0);
  // A framework's epoch restored mid-way: the next pass starts there (earlier epochs too), the one after it at
  // the following epoch's first batch; a restored iterator's epoch still moves it on.
  feed->set_next_pass(3, 2);
  CHECK(api.next_pass(id, &epoch, &batch) == 0 && epoch == 3 && batch == 2);
  CHECK(api.next_pass(id, &epoch, &batch) == 0 && epoch == 4 && batch == 0);
  feed->set_next_pass(1, 0);
  CHECK(api.seen_epoch(id, 0) == 0);
  CHECK(api.next_pass(id, &epoch, &batch) == 0 && epoch == 1 && batch == 0);
  const auto batches = static_cast<std::int64_t>(plan->num_batches());
  CHECK_THROWS(InvalidArgument, feed->set_next_pass(0, batches));
  CHECK_THROWS(InvalidArgument, feed->set_next_pass(0, -1));
  CHECK_THROWS(InvalidArgument, feed->set_next_pass(-1, 0));
  CHECK_THROWS(InvalidArgument, feed->set_next_pass(std::int64_t{1} << 62, 0));
  feed->set_next_pass((std::int64_t{1} << 62) - 1, batches - 1);
  NpyfeedTfBatch out;
  CHECK_EQ(api.take(id, 0, plan->num_batches(), &out), 3);  // INVALID_ARGUMENT, npyfeed's message
  CHECK(contains(api.last_error(), "out of range"));
  REQUIRE(unregister_tf_feed(id) != nullptr);
  CHECK_EQ(api.take(id, 0, 0, &out), 9);  // FAILED_PRECONDITION: a stale id
  CHECK(contains(api.last_error(), "is gone"));
  CHECK(unregister_tf_feed(id) == nullptr);
}

TEST_CASE("tf feed: shuffle='blocks' through the table: take agrees with the plan") {
  TempDir dir;
  auto source = open_source(dir);
  auto plan = std::make_shared<EpochPlan>(source, EpochSpec(Shuffle::kBlocks, 7, 1, 0, 8, false, 1 << 20));
  const std::int64_t id = register_tf_feed(std::make_shared<TfFeed>(plan), 0);
  for (std::size_t b : {std::size_t{1}, std::size_t{0}}) {
    NpyfeedTfBatch got;
    REQUIRE(tf_feed_api().take(id, 0, b, &got) == 0);
    auto [want, job] = source->start_batch(shared_pool(), plan->ids(0, b));
    job->wait();
    CHECK(floats(got.x, got.x_bytes) == floats(*want.x, got.x_bytes));
    CHECK(floats(got.y, got.y_bytes) == floats(*want.y, got.y_bytes));
    tf_feed_api().release(got.x_owner);
    tf_feed_api().release(got.y_owner);
  }
  unregister_tf_feed(id);
}

TEST_CASE("tf feed: threads taking while the feed is unregistered get a batch or a clean error") {
  TempDir dir;
  auto source = open_source(dir);
  const std::int64_t owners = tf_feed_owners();
  auto plan = std::make_shared<EpochPlan>(source, EpochSpec(Shuffle::kGlobal, 7, 1, 0, 4, false, 0));
  const std::size_t batches = plan->num_batches();
  const std::int64_t id = register_tf_feed(std::make_shared<TfFeed>(std::move(plan)), 0);
  std::atomic<int> taken{0}, refused{0}, wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (std::size_t i = 0; i < 1000000; ++i) {  // until the feed is gone
        NpyfeedTfBatch got;
        const int code = tf_feed_api().take(id, i % 3, (i + static_cast<std::size_t>(t)) % batches, &got);
        if (code == 0) {
          ++taken;
          tf_feed_api().release(got.x_owner);
          tf_feed_api().release(got.y_owner);
        } else if (code == 1 || code == 9) {
          ++refused;
          return;
        } else {
          ++wrong;
        }
      }
    });
  }
  while (taken.load() < 20) std::this_thread::yield();
  unregister_tf_feed(id);  // the plan lives on in calls in flight, then goes
  for (auto& t : threads) t.join();
  CHECK_EQ(wrong.load(), 0);
  CHECK(taken.load() >= 20);
  CHECK_EQ(refused.load(), 4);  // every thread saw the feed go
  CHECK_EQ(tf_feed_owners(), owners);
}

TEST_CASE("tf feed: closing the feed cuts a take waiting for its gather short") {
  TempDir dir;
  auto source = open_source(dir);
  ThreadPool& pool = shared_pool();
  // Hold every worker of the gather's pool, so that the take below waits for a gather that cannot run yet.
  std::atomic<bool> release{false};
  std::atomic<std::size_t> holding{0};
  const std::size_t workers = std::max<std::size_t>(pool.size(), 2);
  auto blocker = pool.start(workers, workers, [&](std::size_t) {
    ++holding;
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  while (holding.load() < workers) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto plan = std::make_shared<EpochPlan>(source, EpochSpec(Shuffle::kGlobal, 7, 1, 0, 8, false, 0));
  const std::int64_t id = register_tf_feed(std::make_shared<TfFeed>(plan), 0);
  std::atomic<int> code{-1};
  std::thread taker([&] {
    NpyfeedTfBatch got;
    code = tf_feed_api().take(id, 0, 0, &got);
    if (code == 0) {
      tf_feed_api().release(got.x_owner);
      tf_feed_api().release(got.y_owner);
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the take is waiting now
  std::thread closer([&] { unregister_tf_feed(id); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // it has seen the close
  release = true;  // the cancelled gather's runners can now start, see the cancel and return
  closer.join();
  taker.join();
  blocker->wait();
  CHECK_EQ(code.load(), 1);  // CANCELLED, not the batch the gather would have made
  NpyfeedTfBatch got;
  CHECK(plan->take(0, 0).count == 8);               // the plan works again after close
  CHECK_EQ(tf_feed_api().take(id, 0, 0, &got), 9);  // the feed is gone
}
