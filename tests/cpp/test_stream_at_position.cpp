// StreamAtPosition (stream_at_position.hpp) over a fake stream that records what it was asked: the batch after
// the last one given comes from the same stream; any other position, a new epoch, a failed batch or close()
// starts a new one at that position; the last batch of an epoch lets the stream go; a throwing wait drops the
// stream; close() from another thread cuts a waiting take() short; racing threads are served one at a time,
// each with its batch.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "check.hpp"
#include "npyfeed/common/thread_pool.hpp"
#include "npyfeed/stream/stream_at_position.hpp"

using namespace npyfeed;

namespace {

constexpr std::size_t kBatches = 5;

// Batch b of epoch e is a batch of count e * 100 + b. Fails at (fail_epoch, fail_batch) once.
struct Log {
  std::atomic<int> alive{0};
  std::uint64_t fail_epoch = UINT64_MAX;
  std::size_t fail_batch = 0;
  std::atomic<bool> stall{false};  // next_job() hands out a job that never finishes
};

class FakeStream final : public EpochStream {
 public:
  FakeStream(Log& log, std::uint64_t epoch, std::size_t next) : log_(log), epoch_(epoch), next_(next) { ++log_.alive; }
  ~FakeStream() override {
    if (stalled_) stalled_->wait_for(std::chrono::milliseconds(0));
    --log_.alive;
  }
  std::size_t num_batches() const noexcept override { return kBatches; }
  std::shared_ptr<Job> next_job() override {
    if (next_ >= kBatches || !log_.stall.load()) return nullptr;  // nothing to wait for
    if (!stalled_) {                                              // a pool job that runs until the test lets it go
      Log* log = &log_;
      stalled_ = shared_pool().start(1, 1, [log](std::size_t) {
        while (log->stall.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      });
    }
    return stalled_;
  }
  WindowBatch take() override {
    if (epoch_ == log_.fail_epoch && next_ == log_.fail_batch) {
      log_.fail_epoch = UINT64_MAX;
      throw std::runtime_error("read failed");
    }
    WindowBatch b;
    b.count = static_cast<std::size_t>(epoch_ * 100 + next_++);
    return b;
  }
  void close() override {}

 private:
  Log& log_;
  std::uint64_t epoch_;
  std::size_t next_;
  std::shared_ptr<Job> stalled_;
};

StreamAtPosition::Make maker(Log& log) {
  return [&log](std::uint64_t epoch, std::size_t batch) { return std::make_unique<FakeStream>(log, epoch, batch); };
}

std::size_t count(const WindowBatch& b) { return b.count; }

}  // namespace

TEST_CASE("stream at position: in order from one stream, any other position from a new one") {
  static Log log;  // static: a stalled pool job may read it a moment after the test returns
  StreamAtPosition at(kBatches, maker(log));
  for (std::size_t b = 0; b < kBatches; ++b) CHECK_EQ(count(at.take(2, b)), 200 + b);
  CHECK_EQ(at.streams_started(), 1u);
  CHECK_EQ(log.alive.load(), 0);         // the epoch's last batch let its stream go
  CHECK_EQ(count(at.take(3, 2)), 302u);  // a jump: a new stream
  CHECK_EQ(count(at.take(3, 3)), 303u);  // the next batch: the same stream
  CHECK_EQ(count(at.take(3, 1)), 301u);  // back: a new one
  CHECK_EQ(count(at.take(4, 2)), 402u);  // another epoch at the "next" batch number: a new one
  CHECK_EQ(at.streams_started(), 4u);
  CHECK_EQ(log.alive.load(), 1);
  at.close();
  CHECK_EQ(log.alive.load(), 0);
  CHECK_EQ(count(at.take(4, 3)), 403u);  // after close: a new stream
  CHECK_EQ(at.streams_started(), 5u);
  CHECK_THROWS(IndexOutOfRange, at.take(4, kBatches));
}

TEST_CASE("stream at position: a failed batch or a throwing wait drops the stream") {
  static Log log;  // static: a stalled pool job may read it a moment after the test returns
  log.fail_epoch = 1;
  log.fail_batch = 2;
  StreamAtPosition at(kBatches, maker(log));
  CHECK_EQ(count(at.take(1, 1)), 101u);
  CHECK_THROWS(std::runtime_error, at.take(1, 2));
  CHECK_EQ(log.alive.load(), 0);
  CHECK_EQ(count(at.take(1, 2)), 102u);  // asked again: a new stream there, which succeeds
  CHECK_EQ(at.streams_started(), 2u);
  int waits = 0;
  const WhileWaiting interrupted = [&] {
    if (++waits == 3) throw std::runtime_error("interrupted");
  };
  log.stall = true;
  CHECK_THROWS(std::runtime_error, at.take(1, 3, interrupted));  // after three slices of waiting
  log.stall = false;
  CHECK_EQ(waits, 3);
  CHECK_EQ(log.alive.load(), 0);
  CHECK_EQ(count(at.take(1, 3)), 103u);
  CHECK_EQ(at.streams_started(), 3u);
}

TEST_CASE("stream at position: close() from another thread cuts a waiting take() short") {
  static Log log;  // static: a stalled pool job may read it a moment after the test returns
  StreamAtPosition at(kBatches, maker(log));
  log.stall = true;
  std::thread closer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(120));
    at.close();
  });
  CHECK_THROWS(Cancelled, at.take(0, 0));
  log.stall = false;
  closer.join();
  CHECK_EQ(log.alive.load(), 0);
  CHECK_EQ(count(at.take(0, 0)), 0u);  // later calls work again
}

TEST_CASE("stream at position: racing threads each get the batch they asked for") {
  static Log log;  // static: a stalled pool job may read it a moment after the test returns
  StreamAtPosition at(kBatches, maker(log));
  std::vector<int> ok(4, 1);
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < ok.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 50; ++round) {
        for (std::size_t b = t % 2; b < kBatches; b += 2) {
          if (count(at.take(round % 3, b)) != static_cast<std::size_t>(round % 3) * 100 + b) ok[t] = 0;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int v : ok) CHECK_EQ(v, 1);
}
