// The blocks stream (shuffle="blocks") over files in every read mode and over arrays in memory: batches equal
// a plain gather of the ids of block_epoch_order, resumed streams equal the tail, the memory held stays
// within the budget, and a file deleted or truncated after open is an error naming it (no hang).
// "Batch b of epoch e" over such streams is the plan's (tests/cpp/test_epoch_plan.cpp).
// Mirrors tests/test_blocks.py.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "check.hpp"
#include "npy_writer.hpp"
#include "npyfeed/common/errors.hpp"
#include "npyfeed/gather/window_source.hpp"
#include "npyfeed/index/index.hpp"
#include "npyfeed/plan/epoch_plan.hpp"
#include "npyfeed/stream/block_stream.hpp"
#include "window_files.hpp"

using namespace npyfeed;
using npyfeed::test::contains;
using npyfeed::test::TempDir;
using namespace npyfeed::test::window_files;

namespace {

// The blocks of epoch `epoch` of one shard, as the plan makes them.
std::shared_ptr<const BlockPlan> plan_epoch(const WindowSource& source, std::uint64_t budget, std::uint64_t seed,
                                            std::uint64_t epoch, std::size_t shards, std::size_t shard) {
  return std::make_shared<const BlockPlan>(
      plan_blocks(*group_samples_by_key(source), block_key_bytes(source), budget, seed, epoch, shards, shard));
}

std::vector<std::int64_t> block_epoch_order(const WindowSource& source, std::uint64_t budget, std::uint64_t seed,
                                            std::uint64_t epoch, std::size_t shards, std::size_t shard) {
  return block_epoch_order(*plan_epoch(source, budget, seed, epoch, shards, shard), *group_samples_by_key(source));
}

BlockStream make_stream(const std::shared_ptr<WindowSource>& source, std::uint64_t budget, std::uint64_t seed,
                        std::uint64_t epoch, std::size_t shards, std::size_t shard, std::size_t batch,
                        bool drop_remainder, std::size_t prefetch, std::size_t start_batch) {
  return BlockStream(source, group_samples_by_key(*source), plan_epoch(*source, budget, seed, epoch, shards, shard),
                     EpochSpec(Shuffle::kBlocks, seed, shards, shard, batch, drop_remainder, budget), prefetch,
                     start_batch);
}

// The batches of a stream, as (x, y) floats, checked against a plain gather of the planned ids.
void check_stream(const std::shared_ptr<WindowSource>& source, std::uint64_t budget, std::size_t shards,
                  std::size_t shard, std::size_t batch, std::size_t start_batch) {
  const auto order = block_epoch_order(*source, budget, 3, 1, shards, shard);
  BlockStream stream = make_stream(source, budget, 3, 1, shards, shard, batch, false, 2, start_batch);
  CHECK_EQ(stream.num_batches(), (order.size() + batch - 1) / batch);
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
  std::size_t at = start_batch * batch;
  for (std::size_t b = start_batch; b < stream.num_batches(); ++b) {
    REQUIRE(stream.next_job() != nullptr);
    WindowBatch got = stream.take();
    // Buffers kept for the next blocks' reads stay within the budget beside the blocks held (with the
    // allowance of 8 KiB a file, for its header and O_DIRECT alignment).
    CHECK(stream.buffered_bytes() + stream.kept_file_bytes() <= bound + 2 * kKeys * 8192);
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

TEST_CASE("block stream: the files of a block let go are read into again, within the budget") {
  TempDir dir;
  const Files files = write_files(dir);
  const std::uint64_t key_file = kFactorBytes + 128 + kRows * 4 + 128;
  for (ReadMode mode : {ReadMode::kMmap, ReadMode::kRead, ReadMode::kDirect}) {
    auto source = open_source(files, mode);
    // Blocks of one key (two at once): from the third block on, a read finds the buffers of a block let go.
    BlockStream stream = make_stream(source, 2 * key_file, 3, 1, 1, 0, 7, false, 2, 0);
    std::size_t batches = 0;
    while (stream.next_job() != nullptr) {
      batches += stream.take().count > 0;
      CHECK(stream.buffered_bytes() + stream.kept_file_bytes() <= 2 * key_file + 2 * kKeys * 8192);
    }
    CHECK_EQ(batches, stream.num_batches());
    CHECK(stream.plan().block_bytes.size() >= 4);
    CHECK(stream.reused_file_buffers() >= 2);  // a factor and a label file, at least once
    stream.close();
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
      BlockStream stream = make_stream(source, 4000, 0, 0, 1, 0, 16, false, 2, 0);
      bool thrown = false;
      try {
        while (stream.next_job() != nullptr) stream.take();
      } catch (const OsError& e) {  // the block's read opens the file again: checked (File::reopen)
        thrown = e.path() == victim && (damage == 0 ? e.error_number() == ENOENT && contains(e.what(), "deleted")
                                                    : e.error_number() == ESTALE && contains(e.what(), "truncated"));
      }
      CHECK(thrown);
      stream.close();
    }
  }
}

TEST_CASE("block stream: block reads do not wait for the gathers' workers") {
  // Reads run on shared_io_pool, so that a block read (seconds on a large block) never holds the workers that
  // gather the batches of the block before it. Here every worker of the gathers' pool is held, with more of
  // its jobs queued behind: the block read finishes all the same.
  TempDir dir;
  const Files files = write_files(dir);
  for (ReadMode mode : {ReadMode::kRead, ReadMode::kDirect}) {
    auto source = open_source(files, mode);
    std::mutex mutex;
    std::condition_variable changed;
    bool open = false;
    std::size_t arrived = 0;
    ThreadPool& gathers = shared_pool(0, source->options().placement);
    const std::size_t held = std::max<std::size_t>(gathers.size(), 8);
    auto holding = gathers.start(held, held, [&](std::size_t) {
      std::unique_lock lock(mutex);
      ++arrived;
      changed.notify_all();
      changed.wait(lock, [&] { return open; });
    });
    {
      std::unique_lock lock(mutex);
      changed.wait(lock, [&] { return arrived == held; });
    }
    BlockStream stream = make_stream(source, std::uint64_t{1} << 30, 3, 1, 1, 0, 7, false, 2, 0);
    const std::uint64_t before = source->stats()->counts().blocks_read;
    REQUIRE(stream.next_job() != nullptr);  // starts the first block's read (then its first gather, held)
    bool read = false;
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!read && std::chrono::steady_clock::now() < give_up) {
      read = source->stats()->counts().blocks_read > before;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    {
      std::lock_guard lock(mutex);
      open = true;
    }
    changed.notify_all();
    holding->wait();
    CHECK(read);
    while (stream.next_job() != nullptr) stream.take();
    stream.close();
  }
}
