// The blocks stream (shuffle="blocks") over files in every read mode and over arrays in memory: batches equal
// a plain gather of the ids of block_epoch_order, resumed streams equal the tail, the memory held stays
// within the budget, and a file deleted or truncated after open is an error naming it (no hang).
// BlockBatches (block_batches.hpp, "batch b of epoch e" over one stream): any order of positions, from any
// thread, gives the stream's batches; in order it needs one stream per epoch. EpochBatches::take (the same
// over a BatchStream, for the global order) likewise, against EpochBatches::start.
// Mirrors tests/test_blocks.py.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "check.hpp"
#include "npy_writer.hpp"
#include "npyfeed/block_batches.hpp"
#include "npyfeed/block_stream.hpp"
#include "npyfeed/epoch_batches.hpp"
#include "npyfeed/errors.hpp"
#include "npyfeed/index.hpp"
#include "npyfeed/window_source.hpp"

using namespace npyfeed;
using npyfeed::test::contains;
using npyfeed::test::TempDir;

namespace {

constexpr std::int64_t kRows = 50;
constexpr std::int64_t kCols = 3;
constexpr std::int64_t kWindow = 4;
constexpr std::size_t kKeys = 6;
constexpr std::uint64_t kFactorBytes = kRows * kCols * 4;  // per key; labels add kRows * 4

struct Files {
  std::vector<std::string> factors;
  std::vector<std::string> labels;
};

Files write_files(const TempDir& dir) {
  Files f;
  for (std::size_t k = 0; k < kKeys; ++k) {
    std::vector<float> x(kRows * kCols), y(kRows);
    for (std::int64_t r = 0; r < kRows; ++r) {
      for (std::int64_t c = 0; c < kCols; ++c) x[r * kCols + c] = static_cast<float>(k * 1000 + r * 10 + c);
      y[r] = static_cast<float>(k * 100 + r);
    }
    auto bytes = [](const std::vector<float>& v) {
      std::vector<std::byte> b(v.size() * 4);
      std::memcpy(b.data(), v.data(), b.size());
      return b;
    };
    f.factors.push_back(dir.file("f" + std::to_string(k) + ".npy"));
    f.labels.push_back(dir.file("l" + std::to_string(k) + ".npy"));
    npyfeed::test::write_file(f.factors.back(), npyfeed::test::npy_header("<f4", "(50, 3)"), bytes(x));
    npyfeed::test::write_file(f.labels.back(), npyfeed::test::npy_header("<f4", "(50,)"), bytes(y));
  }
  return f;
}

// Every window of every key, keys interleaved (as an index may list them).
SampleIndex make_index() {
  SampleIndex index;
  index.sources.push_back("index.txt");
  std::uint64_t line = 0;
  for (std::int64_t r = kWindow - 1; r < kRows; ++r) {
    for (std::size_t k = 0; k < kKeys; ++k) index.add(r, kRows - 1 - r, std::string(1, char('a' + k)), 0, ++line);
  }
  return index;
}

std::shared_ptr<WindowSource> open_source(const Files& files, ReadMode mode) {
  WindowOptions o;
  o.window = kWindow;
  o.mode = mode;
  o.threads = 2;
  auto source = std::make_shared<WindowSource>(make_index(), o);
  source->start_open(shared_pool(), files.factors, files.labels)->wait();
  source->finish_open();
  return source;
}

std::vector<float> floats(const AlignedBuffer& b, std::size_t count) {
  std::vector<float> v(count);
  std::memcpy(v.data(), b.data(), count * 4);
  return v;
}

// The batches of a stream, as (x, y) floats, checked against a plain gather of the planned ids.
void check_stream(const std::shared_ptr<WindowSource>& source, std::uint64_t budget, std::size_t shards,
                  std::size_t shard, std::size_t batch, std::size_t start_batch) {
  const auto order = block_epoch_order(*source, budget, 3, 1, shards, shard);
  BlockStream stream(source, budget, 3, 1, shards, shard, batch, false, 2, start_batch);
  CHECK_EQ(stream.num_batches(), (order.size() + batch - 1) / batch);
  std::size_t at = start_batch * batch;
  for (std::size_t b = start_batch; b < stream.num_batches(); ++b) {
    REQUIRE(stream.next_job() != nullptr);
    WindowBatch got = stream.take();
    const std::size_t count = std::min(batch, order.size() - at);
    REQUIRE(got.count == count);
    std::vector<std::int64_t> ids(order.begin() + static_cast<std::ptrdiff_t>(at),
                                  order.begin() + static_cast<std::ptrdiff_t>(at + count));
    auto [want, job] = source->start_batch(shared_pool(), ids);
    job->wait();
    CHECK(floats(*got.x, count * kWindow * kCols) == floats(*want.x, count * kWindow * kCols));
    CHECK(floats(*got.y, count) == floats(*want.y, count));
    at += count;
  }
  CHECK(stream.next_job() == nullptr);
  CHECK_EQ(stream.take().count, 0u);
  if (source->reads_files()) {
    // Each block holds at most budget / 2 (every key fits): the budget holds two at once; a batch that spans
    // more blocks than that holds those (and only those).
    const BlockPlan& plan = stream.plan();
    std::uint64_t bound = budget;
    for (std::size_t b = start_batch; b < stream.num_batches(); ++b) {
      const std::uint64_t first = plan.first + b * batch;
      const std::uint64_t last = std::min<std::uint64_t>(first + batch, plan.end) - 1;
      std::uint64_t bytes = 0;
      for (std::size_t k = plan.block_of(first); k <= plan.block_of(last); ++k) bytes += plan.block_bytes[k];
      bound = std::max(bound, bytes);
    }
    CHECK(stream.peak_buffered_bytes() <= bound);
    CHECK(stream.peak_buffered_bytes() > 0 || start_batch == stream.num_batches());
  }
  stream.close();
  CHECK_EQ(stream.buffered_bytes(), 0u);
}

}  // namespace

TEST_CASE("block stream: batches equal a gather of the planned ids, every mode, shards, resume") {
  TempDir dir;
  const Files files = write_files(dir);
  const std::uint64_t key_file = kFactorBytes + 128 + kRows * 4 + 128;  // data and headers of one key
  for (ReadMode mode : {ReadMode::kMmap, ReadMode::kRead, ReadMode::kDirect}) {
    auto source = open_source(files, mode);
    for (std::uint64_t budget : {2 * key_file, 5 * key_file, std::uint64_t{1} << 30}) {
      check_stream(source, budget, 1, 0, 7, 0);
      check_stream(source, budget, 3, 1, 5, 0);
      check_stream(source, budget, 1, 0, 64, 2);
      check_stream(source, budget, 2, 0, 1000, 0);  // a batch across every block
    }
  }
}

TEST_CASE("block stream: a file deleted or truncated after open is an error naming it") {
  TempDir dir;
  const Files files = write_files(dir);
  for (ReadMode mode : {ReadMode::kMmap, ReadMode::kRead, ReadMode::kDirect}) {
    for (int damage = 0; damage < 2; ++damage) {
      const Files copy = write_files(dir);  // fresh files each round
      auto source = open_source(copy, mode);
      const std::string victim = copy.factors[4];
      if (damage == 0) {
        std::filesystem::remove(victim);
      } else {
        REQUIRE(::truncate(victim.c_str(), 200) == 0);
      }
      BlockStream stream(source, 4000, 0, 0, 1, 0, 16, false, 2, 0);
      bool thrown = false;
      try {
        while (stream.next_job() != nullptr) stream.take();
      } catch (const OsError& e) {
        thrown = damage == 0 && e.error_number() == ENOENT && e.path() == victim;
      } catch (const NpyFormatError& e) {
        thrown = damage == 1 && e.path() == victim && contains(e.what(), "truncated");
      }
      CHECK(thrown);
      stream.close();
    }
  }
}

namespace {

// Every batch of epoch `epoch` of a blocks stream: (x, y) floats.
using Floats = std::pair<std::vector<float>, std::vector<float>>;
std::vector<Floats> stream_batches(const std::shared_ptr<WindowSource>& source, std::uint64_t budget,
                                   std::uint64_t epoch, std::size_t shards, std::size_t shard, std::size_t batch,
                                   bool drop_remainder) {
  BlockStream stream(source, budget, 5, epoch, shards, shard, batch, drop_remainder, 2, 0);
  std::vector<Floats> out;
  while (stream.next_job() != nullptr) {
    WindowBatch b = stream.take();
    out.emplace_back(floats(*b.x, b.count * kWindow * kCols), floats(*b.y, b.count));
  }
  return out;
}

Floats floats_of(const WindowBatch& b) { return {floats(*b.x, b.count * kWindow * kCols), floats(*b.y, b.count)}; }

}  // namespace

TEST_CASE("block batches: batch b of epoch e is the stream's, in order with one stream per epoch") {
  TempDir dir;
  const Files files = write_files(dir);
  const std::uint64_t budget = 3 * (kFactorBytes + kRows * 4);
  for (ReadMode mode : {ReadMode::kMmap, ReadMode::kDirect}) {
    auto source = open_source(files, mode);
    for (auto [shards, shard, drop] : {std::tuple{1, 0, false}, std::tuple{3, 2, true}}) {
      BlockBatches batches(source, budget, 5, shards, shard, 9, drop, 2);
      for (std::uint64_t epoch : {4, 5}) {
        const auto want = stream_batches(source, budget, epoch, shards, shard, 9, drop);
        REQUIRE(batches.num_batches() == want.size());
        for (std::size_t b = 0; b < want.size(); ++b) CHECK(floats_of(batches.take(epoch, b)) == want[b]);
      }
      CHECK_EQ(batches.streams_started(), 2u);  // in order: one stream per epoch, none restarted
      CHECK_THROWS(IndexOutOfRange, batches.take(4, batches.num_batches()));
    }
  }
}

TEST_CASE("block batches: any position (a restore, a jump back, a repeat) gives the stream's batch") {
  TempDir dir;
  const Files files = write_files(dir);
  const std::uint64_t budget = 2 * (kFactorBytes + kRows * 4);
  auto source = open_source(files, ReadMode::kRead);
  BlockBatches batches(source, budget, 5, 1, 0, 7, false, 2);
  const auto e0 = stream_batches(source, budget, 0, 1, 0, 7, false);
  const auto e1 = stream_batches(source, budget, 1, 1, 0, 7, false);
  REQUIRE(e0.size() > 20);
  const std::vector<std::pair<std::uint64_t, std::size_t>> positions{
      {1, 13}, {1, 14}, {0, 3}, {0, 3}, {1, 0}, {0, e0.size() - 1}, {1, 14}, {1, 15}, {0, 2}};
  for (auto [epoch, b] : positions) CHECK(floats_of(batches.take(epoch, b)) == (epoch == 0 ? e0 : e1)[b]);
  // A new stream for every position but those that followed the previous one ((1, 14) after (1, 13), ...).
  CHECK_EQ(batches.streams_started(), 7u);
  CHECK_THROWS(InvalidArgument, BlockBatches(source, 0, 5, 1, 0, 7, false, 2));
  CHECK_THROWS(InvalidArgument, BlockBatches(source, budget, 5, 2, 2, 7, false, 2));
  CHECK_THROWS(InvalidArgument, BlockBatches(source, budget, 5, 1, 0, 0, false, 2));
}

// Four threads take every batch of `epoch` at once, two on each half of the positions (interleaved): true when
// each got the batch it asked for.
template <class Batches>
bool racing_threads_get_their_batches(Batches& batches, std::uint64_t epoch, const std::vector<Floats>& want) {
  std::vector<int> ok(4, 1);
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < ok.size(); ++t) {
    threads.emplace_back([&, t] {
      for (std::size_t b = t; b < want.size(); b += 2) {
        if (floats_of(batches.take(epoch, b)) != want[b]) ok[t] = 0;
      }
    });
  }
  for (auto& t : threads) t.join();
  return std::all_of(ok.begin(), ok.end(), [](int v) { return v == 1; });
}

TEST_CASE("block batches: threads asking at once each get the batch they asked for") {
  TempDir dir;
  const Files files = write_files(dir);
  const std::uint64_t budget = 2 * (kFactorBytes + kRows * 4);
  auto source = open_source(files, ReadMode::kMmap);
  BlockBatches batches(source, budget, 5, 1, 0, 6, false, 2);
  const auto want = stream_batches(source, budget, 2, 1, 0, 6, false);
  CHECK(racing_threads_get_their_batches(batches, 2, want));
  batches.close();
  CHECK(floats_of(batches.take(2, 0)) == want[0]);  // usable after close
}

TEST_CASE("epoch batches: take in order, out of order and from threads equals start") {
  TempDir dir;
  const Files files = write_files(dir);
  auto source = open_source(files, ReadMode::kMmap);
  EpochBatches batches(source, true, 5, 2, 1, 7, false, 4, 2);
  auto started = [&](std::uint64_t epoch, std::size_t b) {
    auto [batch, job] = batches.start(epoch, b);
    job->wait();
    return floats_of(batch);
  };
  std::vector<Floats> want;
  for (std::size_t b = 0; b < batches.num_batches(); ++b) want.push_back(started(3, b));
  for (std::size_t b = 0; b < want.size(); ++b) CHECK(floats_of(batches.take(3, b)) == want[b]);
  CHECK_EQ(batches.streams_started(), 1u);
  CHECK(floats_of(batches.take(3, 2)) == want[2]);  // a jump back: a new stream
  CHECK(floats_of(batches.take(3, 3)) == want[3]);
  CHECK_EQ(batches.streams_started(), 2u);
  CHECK(floats_of(batches.take(4, 0)) == started(4, 0));
  CHECK(racing_threads_get_their_batches(batches, 3, want));
  batches.close();
  CHECK(floats_of(batches.take(3, 1)) == want[1]);  // usable after close
  CHECK_THROWS(IndexOutOfRange, batches.take(3, want.size()));
}
