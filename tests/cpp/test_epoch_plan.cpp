// The plan (epoch_plan.hpp), the one owner of "batch b of epoch e": for every order kind, ids(e, b) is what
// take(e, b) gathers and what the stream of the epoch yields at b; order(e) is the ids one batch after another;
// shards together cover each epoch exactly once; take serves any position (a restore, a jump back, a repeat)
// from a stream positioned at the next batch, one stream per epoch when asked in order, and racing threads
// each get the batch they asked for. EpochSpec checks its arguments once and counts batches with one formula.
// Mirrors tests/test_plan.py.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <thread>
#include <tuple>
#include <vector>

#include "check.hpp"
#include "npyfeed/common/errors.hpp"
#include "npyfeed/plan/epoch_plan.hpp"
#include "npyfeed/stream/block_stream.hpp"
#include "window_files.hpp"

using namespace npyfeed;
using namespace npyfeed::test::window_files;

namespace {

constexpr std::uint64_t kKeyBytes = kFactorBytes + kRows * 4;
const Shuffle kKinds[] = {Shuffle::kNone, Shuffle::kGlobal, Shuffle::kBlocks};

using Floats = std::pair<std::vector<float>, std::vector<float>>;
Floats floats_of(const WindowBatch& b) { return {floats(*b.x, b.count * kWindow * kCols), floats(*b.y, b.count)}; }

EpochSpec spec(Shuffle shuffle, std::size_t shards, std::size_t shard, std::size_t batch, bool drop) {
  return EpochSpec(shuffle, 5, shards, shard, batch, drop, 2 * kKeyBytes);
}

Floats gathered(WindowSource& source, const std::vector<std::int64_t>& ids) {
  auto [batch, job] = source.start_batch(shared_pool(), ids);
  job->wait();
  return floats_of(batch);
}

// Every batch of epoch `epoch` from the plan's own stream.
std::vector<Floats> streamed(const EpochPlan& plan, std::uint64_t epoch) {
  std::vector<Floats> out;
  auto stream = plan.stream(epoch, 0, 2);
  while (stream->next_job() != nullptr) out.push_back(floats_of(stream->take()));
  return out;
}

// Four threads take every batch of `epoch` at once, two on each half of the positions (interleaved): true when
// each got the batch it asked for.
bool racing_threads_get_their_batches(EpochPlan& plan, std::uint64_t epoch, const std::vector<Floats>& want) {
  std::vector<int> ok(4, 1);
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < ok.size(); ++t) {
    threads.emplace_back([&, t] {
      for (std::size_t b = t; b < want.size(); b += 2) {
        if (floats_of(plan.take(epoch, b)) != want[b]) ok[t] = 0;
      }
    });
  }
  for (auto& t : threads) t.join();
  return std::all_of(ok.begin(), ok.end(), [](int v) { return v == 1; });
}

}  // namespace

TEST_CASE("epoch spec: one check of every argument, one batch count") {
  CHECK_THROWS(InvalidArgument, EpochSpec(Shuffle::kGlobal, 0, 1, 0, 0, false, 0));  // batch_size 0
  CHECK_THROWS(InvalidArgument, EpochSpec(Shuffle::kGlobal, 0, 0, 0, 4, false, 0));  // no shards
  CHECK_THROWS(InvalidArgument, EpochSpec(Shuffle::kGlobal, 0, 2, 2, 4, false, 0));  // shard outside
  CHECK_THROWS(InvalidArgument, EpochSpec(Shuffle::kBlocks, 0, 1, 0, 4, false, 0));  // no budget
  CHECK_THROWS(InvalidArgument, parse_shuffle("bricks"));
  CHECK(parse_shuffle("blocks") == Shuffle::kBlocks);
  CHECK_EQ(EpochSpec(Shuffle::kNone, 9, 1, 0, 4, false, 7).seed, 0u);  // not shuffling: the seed decides nothing
  CHECK_EQ(EpochSpec(Shuffle::kGlobal, 9, 1, 0, 4, false, 7).memory_budget, 0u);
  for (std::size_t n : {0, 1, 9, 10, 11, 100}) {
    for (std::size_t shards : {1, 3, 7}) {
      std::size_t total = 0;
      for (std::size_t shard = 0; shard < shards; ++shard) {
        const EpochSpec keep(Shuffle::kGlobal, 0, shards, shard, 4, false, 0);
        const EpochSpec drop(Shuffle::kGlobal, 0, shards, shard, 4, true, 0);
        std::size_t every_nth = 0;
        for (std::size_t i = shard; i < n; i += shards) ++every_nth;
        CHECK_EQ(keep.shard_size(n), every_nth);
        CHECK_EQ(keep.num_batches(keep.shard_size(n)), (every_nth + 3) / 4);
        CHECK_EQ(drop.num_batches(drop.shard_size(n)), every_nth / 4);
        total += every_nth;
      }
      CHECK_EQ(total, n);
    }
  }
}

TEST_CASE("epoch spec: batch positions tile the epoch, batch_size each, the last what is left") {
  for (std::uint64_t n : {0, 1, 9, 10, 11, 100}) {
    for (bool drop : {false, true}) {
      const EpochSpec spec(Shuffle::kGlobal, 0, 1, 0, 4, drop, 0);
      std::uint64_t next = 0;
      for (std::size_t b = 0; b < spec.num_batches(n); ++b) {
        const auto [first, end] = spec.batch_positions(b, n);
        CHECK_EQ(first, next);
        CHECK_EQ(end - first, std::min<std::uint64_t>(4, n - first));
        next = end;
      }
      CHECK_EQ(next, drop ? n / 4 * 4 : n);  // every sample once; dropped: the short remainder only
    }
  }
}

TEST_CASE("epoch plan: ids, take, the stream and order agree for every order kind") {
  TempDir dir;
  const Files files = write_files(dir);
  for (ReadMode mode : {ReadMode::kMmap, ReadMode::kRead}) {
    auto source = open_source(files, mode);
    for (Shuffle kind : kKinds) {
      for (auto [shards, shard, drop] : {std::tuple{1, 0, false}, std::tuple{3, 2, true}}) {
        EpochPlan plan(source, spec(kind, shards, shard, 9, drop));
        CHECK_EQ(plan.num_batches(), plan.spec().num_batches(plan.spec().shard_size(source->size())));
        for (std::uint64_t epoch : {4, 5}) {
          const auto want = streamed(plan, epoch);
          REQUIRE(plan.num_batches() == want.size());
          std::vector<std::int64_t> concatenated;
          for (std::size_t b = 0; b < want.size(); ++b) {
            const auto ids = plan.ids(epoch, b);
            CHECK(gathered(*source, ids) == want[b]);
            CHECK(floats_of(plan.take(epoch, b)) == want[b]);
            concatenated.insert(concatenated.end(), ids.begin(), ids.end());
          }
          const auto order = plan.order(epoch);
          CHECK_EQ(order.size(), plan.shard_size());
          CHECK(std::equal(concatenated.begin(), concatenated.end(), order.begin()));
        }
        CHECK_EQ(plan.streams_started(), 2u);  // in order: one stream per epoch, none restarted
        CHECK_THROWS(IndexOutOfRange, plan.take(4, plan.num_batches()));
        CHECK_THROWS(IndexOutOfRange, plan.ids(4, plan.num_batches()));
      }
    }
  }
}

TEST_CASE("epoch plan: shards together cover each epoch exactly once") {
  TempDir dir;
  auto source = open_source(write_files(dir), ReadMode::kMmap);
  for (Shuffle kind : kKinds) {
    for (std::size_t shards : {1, 2, 5}) {
      std::vector<std::int64_t> seen;
      for (std::size_t shard = 0; shard < shards; ++shard) {
        EpochPlan plan(source, spec(kind, shards, shard, 7, false));
        for (std::size_t b = 0; b < plan.num_batches(); ++b) {
          const auto ids = plan.ids(3, b);
          seen.insert(seen.end(), ids.begin(), ids.end());
        }
      }
      std::sort(seen.begin(), seen.end());
      std::vector<std::int64_t> all(source->size());
      for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::int64_t>(i);
      CHECK(seen == all);
    }
  }
}

TEST_CASE("epoch plan: a blocks epoch's shard blocks cover the shard once, each position a sample of its keys") {
  TempDir dir;
  auto source = open_source(write_files(dir), ReadMode::kMmap);
  const auto key_of = source->sample_keys();
  for (std::size_t shards : {1, 3}) {
    for (std::size_t shard = 0; shard < shards; ++shard) {
      EpochPlan plan(source, spec(Shuffle::kBlocks, shards, shard, 7, false));
      CHECK_EQ(plan.key_bytes().size(), source->num_keys());
      const auto order = plan.order(2);
      const auto blocks = plan.shard_blocks(2);
      REQUIRE(!blocks.empty());
      std::uint64_t next = 0;
      for (const ShardBlock& b : blocks) {
        CHECK_EQ(b.begin, next);
        CHECK(b.end > b.begin);
        for (std::uint64_t p = b.begin; p < b.end; ++p) {
          const std::uint32_t key = key_of(static_cast<std::size_t>(order[p]));
          CHECK(std::find(b.keys.begin(), b.keys.end(), key) != b.keys.end());
        }
        next = b.end;
      }
      CHECK_EQ(next, plan.shard_size());
    }
  }
  EpochPlan global(source, spec(Shuffle::kGlobal, 1, 0, 7, false));
  CHECK(global.shard_blocks(2).empty());
  CHECK(global.key_bytes().empty());
}

TEST_CASE("epoch plan: any position (a restore, a jump back, a repeat) gives the stream's batch") {
  TempDir dir;
  auto source = open_source(write_files(dir), ReadMode::kRead);
  for (Shuffle kind : {Shuffle::kGlobal, Shuffle::kBlocks}) {
    EpochPlan plan(source, spec(kind, 1, 0, 7, false));
    const auto e0 = streamed(plan, 0);
    const auto e1 = streamed(plan, 1);
    REQUIRE(e0.size() > 20);
    const std::vector<std::pair<std::uint64_t, std::size_t>> positions{
        {1, 13}, {1, 14}, {0, 3}, {0, 3}, {1, 0}, {0, e0.size() - 1}, {1, 14}, {1, 15}, {0, 2}};
    for (auto [epoch, b] : positions) CHECK(floats_of(plan.take(epoch, b)) == (epoch == 0 ? e0 : e1)[b]);
    // A new stream for every position but those that followed the previous one ((1, 14) after (1, 13), ...).
    CHECK_EQ(plan.streams_started(), 7u);
  }
}

TEST_CASE("epoch plan: threads asking at once each get the batch they asked for") {
  TempDir dir;
  auto source = open_source(write_files(dir), ReadMode::kMmap);
  for (Shuffle kind : kKinds) {
    EpochPlan plan(source, spec(kind, 2, 1, 6, false));
    const auto want = streamed(plan, 2);
    CHECK(racing_threads_get_their_batches(plan, 2, want));
    plan.close();
    CHECK(floats_of(plan.take(2, 0)) == want[0]);  // usable after close
  }
}

TEST_CASE("epoch plan: the plans of one source share its samples grouped by key") {
  TempDir dir;
  auto source = open_source(write_files(dir), ReadMode::kMmap);
  EpochPlan first(source, spec(Shuffle::kBlocks, 1, 0, 4, false));
  EpochPlan second(source, spec(Shuffle::kBlocks, 2, 0, 8, false), 2, first.samples_by_key());
  CHECK(first.samples_by_key() == second.samples_by_key());
  CHECK(!first.samples_by_key()->runs());  // this index interleaves its keys
  CHECK(EpochPlan(source, spec(Shuffle::kGlobal, 1, 0, 4, false)).samples_by_key() == nullptr);
  // Sharded by samples, every shard reads every key.
  std::vector<std::uint32_t> all(source->num_keys());
  std::iota(all.begin(), all.end(), 0u);
  CHECK(EpochPlan(source, spec(Shuffle::kGlobal, 2, 1, 4, false)).keys() == all);
  CHECK(second.keys() == all);
}

TEST_CASE("epoch plan: shards of whole keys, balanced, together every sample once, ids agree with take") {
  TempDir dir;
  auto source = open_source(write_files(dir), ReadMode::kMmap);
  const auto samples = group_samples_by_key(*source);
  std::uint64_t largest = 0;
  for (std::size_t k = 0; k < samples->num_keys(); ++k) largest = std::max<std::uint64_t>(largest, samples->count(k));
  for (std::size_t shards : {1, 2, 4, 7}) {
    for (bool shuffle : {false, true}) {
      std::vector<std::int64_t> seen;
      std::vector<int> owner(kKeys, -1);
      std::size_t most = 0, fewest = SIZE_MAX;
      for (std::size_t shard = 0; shard < shards; ++shard) {
        const EpochSpec s(shuffle ? Shuffle::kGlobal : Shuffle::kNone, 5, shards, shard, 7, false, 0, ShardBy::kKeys);
        EpochPlan plan(source, s, 2, samples);
        most = std::max(most, plan.shard_size());
        fewest = std::min(fewest, plan.shard_size());
        const auto want = streamed(plan, 3);
        REQUIRE(want.size() == plan.num_batches());
        std::vector<std::int64_t> mine;
        for (std::size_t b = 0; b < plan.num_batches(); ++b) {
          const auto ids = plan.ids(3, b);
          CHECK(gathered(*source, ids) == want[b]);
          CHECK(floats_of(plan.take(3, b)) == want[b]);
          mine.insert(mine.end(), ids.begin(), ids.end());
        }
        CHECK(mine == plan.order(3));
        CHECK_EQ(std::is_sorted(mine.begin(), mine.end()), !shuffle || mine.size() < 2);
        for (std::int64_t id : mine) {
          const std::uint32_t key = source->sample(static_cast<std::size_t>(id)).key;
          CHECK(owner[key] == -1 || owner[key] == static_cast<int>(shard));  // a key belongs to one shard
          owner[key] = static_cast<int>(shard);
        }
        seen.insert(seen.end(), mine.begin(), mine.end());
        // The keys the shard reads, kept by the plan (DeviceRows holds these on a device): those of its samples.
        std::vector<std::uint32_t> keys_read;
        for (std::int64_t id : mine) keys_read.push_back(source->sample(static_cast<std::size_t>(id)).key);
        std::sort(keys_read.begin(), keys_read.end());
        keys_read.erase(std::unique(keys_read.begin(), keys_read.end()), keys_read.end());
        CHECK(plan.keys() == keys_read);
        CHECK(plan.keys() == shard_keys(*samples, shards, shard));
      }
      std::sort(seen.begin(), seen.end());
      CHECK_EQ(seen.size(), source->size());
      CHECK(std::adjacent_find(seen.begin(), seen.end()) == seen.end());
      CHECK(most - fewest <= largest);
    }
  }
  CHECK_THROWS(InvalidArgument, EpochSpec(Shuffle::kBlocks, 0, 2, 0, 4, false, 1000, ShardBy::kKeys));
  CHECK_THROWS(InvalidArgument, parse_shard_by("rows"));
}
