// Live statistics (pipeline_stats.hpp): counters add up exactly, also from racing threads (run under TSan in CI),
// a plan counts into its source's totals, elapsed time runs from the first request to the last batch received,
// and a plan's streams and take() count what they serve (a blocks epoch: every block and every file once).
// Mirrors tests/test_stats.py.
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "check.hpp"
#include "npyfeed/plan/epoch_plan.hpp"
#include "npyfeed/stream/pipeline_stats.hpp"
#include "window_files.hpp"

using namespace npyfeed;
using namespace npyfeed::test::window_files;

TEST_CASE("pipeline stats: racing threads, a parent's totals, elapsed from first request to last batch") {
  auto source_totals = std::make_shared<PipelineStats>();
  PipelineStats a(source_totals);
  PipelineStats b(source_totals);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      PipelineStats& mine = t % 2 == 0 ? a : b;
      for (int i = 0; i < 1000; ++i) {
        mine.served(3, 30, 5, i % 2);
        mine.block_read(7, 1, i % 10 == 9);
        mine.uploaded(2);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const PipelineStats* s : {&a, &b}) {
    const PipelineCounts c = s->counts();
    CHECK_EQ(c.batches, 2000u);
    CHECK_EQ(c.samples, 6000u);
    CHECK_EQ(c.bytes, 60000u);
    CHECK_EQ(c.gather_ns, 10000u);
    CHECK_EQ(c.ready_batches, 1000u);
    CHECK_EQ(c.read_ahead_sum, 1000u);
    CHECK_EQ(c.block_bytes_read, 14000u);
    CHECK_EQ(c.blocks_read, 200u);
    CHECK_EQ(c.device_bytes, 4000u);
  }
  CHECK_EQ(source_totals->counts().batches, 4000u);
  CHECK_EQ(source_totals->counts().blocks_read, 400u);

  PipelineStats waits;
  CHECK_EQ(waits.counts().elapsed_ns, 0u);
  waits.waited(1000, 1500);
  waits.waited(2000, 2100);
  waits.waited(1800, 1700);  // a clock that went backwards counts no wait
  CHECK_EQ(waits.counts().wait_ns, 600u);
  CHECK_EQ(waits.counts().elapsed_ns, 1100u);  // first asked 1000, last received 2100
}

TEST_CASE("pipeline stats: a plan's streams and take() count what they serve, and the source adds plans up") {
  TempDir dir;
  const Files files = write_files(dir);
  auto source = open_source(files, ReadMode::kMmap);
  const std::uint64_t sample_bytes = source->x_sample_bytes() + source->y_sample_bytes();
  EpochPlan global(source, EpochSpec(Shuffle::kGlobal, 5, 1, 0, 9, false, 0));
  auto stream = global.stream(0, 0, 2);
  std::uint64_t samples = 0;
  while (stream->next_job() != nullptr) samples += stream->take().count;
  CHECK_EQ(samples, source->size());
  PipelineCounts c = global.stats()->counts();
  CHECK_EQ(c.batches, global.num_batches());
  CHECK_EQ(c.samples, source->size());
  CHECK_EQ(c.bytes, source->size() * sample_bytes);
  CHECK(c.gather_ns > 0);
  CHECK(c.ready_batches <= c.batches);

  global.take(3, 0);
  global.take(3, 1);
  c = global.stats()->counts();
  CHECK_EQ(c.batches, global.num_batches() + 2);
  CHECK(c.elapsed_ns > 0);  // take() reports its waits (a stream read directly does not: its caller would)

  // Blocks of about two keys: every block once, every factor and label file's data bytes once (mode mmap reads
  // them all whole).
  const std::uint64_t key_bytes = kFactorBytes + kRows * 4;
  EpochPlan blocks(source, EpochSpec(Shuffle::kBlocks, 5, 1, 0, 9, false, 4 * key_bytes));
  for (std::size_t b = 0; b < blocks.num_batches(); ++b) blocks.take(0, b);
  c = blocks.stats()->counts();
  CHECK_EQ(c.samples, source->size());
  CHECK_EQ(c.blocks_read, blocks.shard_blocks(0).size());
  CHECK_EQ(c.block_bytes_read, source->num_keys() * key_bytes);

  const PipelineCounts total = source->stats()->counts();
  CHECK_EQ(total.batches, global.stats()->counts().batches + blocks.stats()->counts().batches);
  CHECK_EQ(total.block_bytes_read, c.block_bytes_read);
}
