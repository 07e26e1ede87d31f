// ReadQueue, on both of its paths (an io_uring, and blocking preads), and the readers that queue their reads:
// every read gives the file's bytes, buffered and O_DIRECT, more reads than the ring holds; short reads, EINTR
// and EAGAIN completions (injected through the completion hook) change nothing; an error or the end of the
// file reaches the reader's callback, which names the file and offset; a read that stops making progress is
// reported stalled and the O_DIRECT reader then reads buffered; gathers equal NPYFEED_IO_URING=0's.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.hpp"
#include "npy_writer.hpp"
#include "npyfeed/common/errors.hpp"
#include "npyfeed/io/array_reader.hpp"
#include "npyfeed/io/direct_reader.hpp"
#include "npyfeed/io/read_queue.hpp"
#include "window_files.hpp"

using namespace npyfeed;
using npyfeed::test::contains;
using npyfeed::test::TempDir;

namespace {

constexpr std::size_t kBytes = (1u << 20) + 777;  // not a multiple of any block size

// Completion hooks: each keeps the data correct and only changes what the queue is told.
long halve(long result, std::uint64_t) { return result > 1 ? result / 2 : result; }  // short reads
std::atomic<int> calls{0};
long interrupt_every_other(long result, std::uint64_t) { return calls++ % 2 == 0 ? -EINTR : result; }
long again_every_other(long result, std::uint64_t) { return calls++ % 2 == 0 ? -EAGAIN : result; }
long io_error(long, std::uint64_t) { return -EIO; }
long short_by_a_byte(long result, std::uint64_t want) {
  return result > 0 && static_cast<std::uint64_t>(result) == want ? result - 1 : result;
}

struct Hook {
  explicit Hook(detail::CompletionHook hook) { detail::set_completion_hook(hook); }
  ~Hook() { detail::set_completion_hook(nullptr); }
};

struct EnvIoUring : npyfeed::test::ScopedEnv {
  explicit EnvIoUring(const char* value) : ScopedEnv("NPYFEED_IO_URING", value) {}
};

std::string write_raw(const TempDir& dir, const std::string& name, const std::vector<std::byte>& data) {
  const std::string path = dir.file(name);
  npyfeed::test::write_file(path, "", data);
  return path;
}

// Reads `count` pieces of the file at scattered offsets through `queue`, buffered or O_DIRECT, and checks them.
void check_pieces(ReadQueue& queue, const std::string& path, const std::vector<std::byte>& data, bool direct,
                  std::size_t count, const std::string& where) {
  File file = File::open(path, direct);
  const std::size_t align = direct ? direct_alignment(file) : 1;
  std::vector<std::unique_ptr<AlignedBuffer>> buffers;
  std::vector<std::uint64_t> offsets;
  std::vector<QueuedReadResult> results(count);
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t length = direct ? align * (1 + i % 5) : 1 + (i * 7919) % 70000;
    const std::uint64_t offset =
        direct ? align_down((i * 104729) % (data.size() - length), align) : (i * 104729) % (data.size() - length);
    buffers.push_back(std::make_unique<AlignedBuffer>(length, 4096));
    offsets.push_back(offset);
    queue.add(file.fd(), buffers.back()->data(), offset, length, length, align,
              [&results, i](const QueuedReadResult& r) { results[i] = r; });
  }
  queue.wait();
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t length = buffers[i]->size();
    CHECK_EQ(results[i].error, 0);
    CHECK(!results[i].stalled);
    CHECK(results[i].done >= length);
    if (std::memcmp(buffers[i]->data(), data.data() + offsets[i], length) != 0)
      test::report(__FILE__, __LINE__, where + ": piece " + std::to_string(i) + " differs");
  }
}

const char* path_name(bool ring) { return ring ? "io_uring" : "blocking"; }

}  // namespace

TEST_CASE("both paths, buffered and O_DIRECT, more reads than the ring holds: the file's bytes") {
  TempDir dir;
  const auto data = npyfeed::test::pattern(kBytes, 3);
  const std::string path = write_raw(dir, "raw.bin", data);
  std::fprintf(stderr, "io_uring_enabled() = %d\n", io_uring_enabled() ? 1 : 0);
  for (bool ring : {true, false}) {
    ReadQueue queue(ring);
    if (!ring) CHECK(!queue.uses_io_uring());
    for (bool direct : {false, true}) {
      const std::string where = std::string(path_name(ring)) + (direct ? " direct" : " buffered");
      check_pieces(queue, path, data, direct, 200, where);
      for (auto hook : {&halve, &interrupt_every_other, &again_every_other}) {
        if (direct && hook == &halve) continue;  // O_DIRECT after a short read: below
        Hook h(hook);
        check_pieces(queue, path, data, direct, 70, where + " hooked");
      }
    }
  }
}

TEST_CASE("the end of the file, an error, a stalled O_DIRECT read, a throwing callback: every read still ends") {
  TempDir dir;
  const auto data = npyfeed::test::pattern(10000, 4);
  const std::string path = write_raw(dir, "raw.bin", data);
  for (bool ring : {true, false}) {
    ReadQueue queue(ring);
    File file = File::open(path);
    std::vector<std::byte> out(20000);
    QueuedReadResult end_result, error_result;
    // 5000 bytes asked at 8000: 2000 arrive, then the end of the file.
    queue.add(file.fd(), out.data(), 8000, 5000, 5000, 1, [&](const QueuedReadResult& r) { end_result = r; });
    queue.wait();
    CHECK_EQ(end_result.done, 2000u);
    CHECK_EQ(end_result.error, 0);
    CHECK(!end_result.stalled);
    CHECK(std::memcmp(out.data(), data.data() + 8000, 2000) == 0);
    {
      Hook h(&io_error);
      queue.add(file.fd(), out.data(), 0, 100, 100, 1, [&](const QueuedReadResult& r) { error_result = r; });
      queue.wait();
      CHECK_EQ(error_result.error, EIO);
    }
    // Callbacks run in order; the first exception is rethrown after all of them ran.
    int ran = 0;
    for (int k = 0; k < 3; ++k) {
      queue.add(file.fd(), out.data() + 100 * k, 100 * k, 100, 100, 1, [&ran, k](const QueuedReadResult&) {
        ++ran;
        if (k > 0) throw std::runtime_error("callback " + std::to_string(k));
      });
    }
    auto e = CHECK_THROWS(std::runtime_error, queue.wait());
    if (e) CHECK_EQ(std::string(e->what()), "callback 1");
    CHECK_EQ(ran, 3);
    // O_DIRECT: every read one byte short never gets past the first block: stalled, not a loop.
    File direct = File::open(path, true);
    const std::size_t align = direct_alignment(direct);
    AlignedBuffer buffer(2 * align, 4096);
    QueuedReadResult stalled;
    {
      Hook h(&short_by_a_byte);
      queue.add(direct.fd(), buffer.data(), 0, 2 * align, 2 * align, align,
                [&](const QueuedReadResult& r) { stalled = r; });
      queue.wait();
    }
    CHECK(stalled.stalled);
    CHECK_EQ(stalled.error, 0);
    // Queued and dropped before wait: nothing runs.
    bool called = false;
    queue.add(file.fd(), out.data(), 0, 10, 10, 1, [&](const QueuedReadResult&) { called = true; });
    queue.clear();
    queue.wait();
    CHECK(!called);
  }
}

TEST_CASE("pipelined: reads submitted, waited for up to a mark, later ones left in flight; drain drops them") {
  TempDir dir;
  const auto data = npyfeed::test::pattern(kBytes, 6);
  const std::string path = write_raw(dir, "raw.bin", data);
  File file = File::open(path);
  for (bool ring : {true, false}) {
    ReadQueue queue(ring);
    std::vector<std::vector<std::byte>> out(40, std::vector<std::byte>(5000));
    std::vector<int> done(40, 0);
    auto add = [&](std::size_t i) {
      queue.add(file.fd(), out[i].data(), i * 20000, 5000, 5000, 1, [&done, i](const QueuedReadResult&) { ++done[i]; });
    };
    for (std::size_t i = 0; i < 20; ++i) add(i);
    queue.submit();
    const std::uint64_t first = queue.mark();
    for (std::size_t i = 20; i < 40; ++i) add(i);
    queue.submit();
    queue.wait(first);
    for (std::size_t i = 0; i < 40; ++i) CHECK_EQ(done[i], i < 20 ? 1 : 0);
    queue.wait();
    for (std::size_t i = 0; i < 40; ++i) {
      CHECK_EQ(done[i], 1);
      CHECK(std::memcmp(out[i].data(), data.data() + i * 20000, 5000) == 0);
    }
    // Reads in flight, then dropped: drain waits for them (ASan would see a write into freed memory otherwise).
    {
      std::vector<std::vector<std::byte>> scratch(30, std::vector<std::byte>(5000));
      for (std::size_t i = 0; i < 30; ++i) {
        queue.add(file.fd(), scratch[i].data(), i * 30000, 5000, 5000, 1,
                  [](const QueuedReadResult&) { throw std::logic_error("a drained read's callback ran"); });
      }
      queue.submit();
      queue.drain();
    }
    queue.wait();  // nothing left
  }
}

TEST_CASE("readers that queue: the file's bytes; EINTR, EAGAIN, short reads; errors name the file and offset") {
  TempDir dir;
  const auto data = npyfeed::test::pattern(kBytes, 5);
  const std::string path = dir.file("a.npy");
  npyfeed::test::write_file(path, npyfeed::test::npy_header("|u1", "(" + std::to_string(kBytes) + ",)"), data);
  ReaderOptions o;
  for (ReadMode mode : {ReadMode::kRead, ReadMode::kDirect}) {
    o.mode = mode;
    const std::string where = mode == ReadMode::kRead ? "read" : "direct";
    auto reader = ArrayReader::open(path, o);
    CHECK_EQ(reader->queue_depth() > 0, io_uring_enabled());
    {
      EnvIoUring off("0");
      CHECK_EQ(ArrayReader::open(path, o)->queue_depth(), 0u);
    }
    o.keep_open = false;
    CHECK_EQ(ArrayReader::open(path, o)->queue_depth(), 0u);  // a descriptor per read: not queued
    o.keep_open = true;
    for (bool ring : {true, false}) {
      for (auto hook : {detail::CompletionHook{nullptr}, &halve, &interrupt_every_other, &again_every_other}) {
        Hook h(hook);
        ReadQueue queue(ring);
        auto fresh = ArrayReader::open(path, o);  // halve() may make an O_DIRECT reader fall back
        std::vector<const std::byte*> got;
        std::vector<std::vector<std::byte>> in_place;
        const std::vector<std::pair<std::size_t, std::size_t>> pieces = {
            {0, 1}, {1, 4095}, {4095, 4097}, {100000, 300000}, {kBytes - 7, 7}, {12345, 1}};
        for (auto [offset, length] : pieces) {
          got.push_back(fresh->fetch_queued(queue, offset, length));
          in_place.emplace_back(length);
          fresh->read_queued(queue, offset, length, in_place.back().data());
        }
        queue.wait();
        for (std::size_t i = 0; i < pieces.size(); ++i) {
          const auto [offset, length] = pieces[i];
          if (std::memcmp(got[i], data.data() + offset, length) != 0 ||
              std::memcmp(in_place[i].data(), data.data() + offset, length) != 0)
            test::report(__FILE__, __LINE__, where + " " + path_name(ring) + ": piece " + std::to_string(i));
        }
      }
      if (reader->queue_depth() == 0) continue;  // the rest is about queued reads
      // O_DIRECT reads that stop short inside a block stall: the reader falls back to buffered reads, same bytes.
      if (mode == ReadMode::kDirect) {
        auto fresh = ArrayReader::open(path, o);
        Hook h(&short_by_a_byte);
        ReadQueue queue(ring);
        // Up to the end of the first block, so that the byte held back is one the read needs.
        const std::size_t length = fresh->fill_alignment() - fresh->header().data_offset - 10;
        const std::byte* got = fresh->fetch_queued(queue, 10, length);
        queue.wait();
        CHECK(std::memcmp(got, data.data() + 10, length) == 0);
        CHECK(fresh->fell_back());
      }
      {
        Hook h(&io_error);
        ReadQueue queue(ring);
        reader->fetch_queued(queue, 5000, 10);
        auto e = CHECK_THROWS(OsError, queue.wait());
        if (e) {
          CHECK_EQ(e->error_number(), EIO);
          CHECK_EQ(e->path(), path);
          CHECK(e->offset().has_value());
          if (e->offset())
            CHECK_EQ(*e->offset(), align_down(reader->header().data_offset + 5000, reader->fill_alignment()));
        }
      }
    }
  }
  // A file truncated after open: the read through the descriptor kept ends early (an NpyFormatError naming the
  // file), or a read that opens the file again refuses it as changed (OsError ESTALE, "truncated").
  for (ReadMode mode : {ReadMode::kRead, ReadMode::kDirect}) {
    o.mode = mode;
    const std::string copy = dir.file("b.npy");
    std::filesystem::copy_file(path, copy, std::filesystem::copy_options::overwrite_existing);
    auto shrunk = ArrayReader::open(copy, o);
    REQUIRE(::truncate(copy.c_str(), 70000) == 0);
    ReadQueue queue;
    bool named = false;
    try {
      shrunk->fetch_queued(queue, 60000, 20000);
      queue.wait();
    } catch (const NpyFormatError& e) {
      named = e.path() == copy && contains(e.what(), "file ended while reading 20000 bytes");
    } catch (const OsError& e) {
      named = e.path() == copy && e.error_number() == ESTALE && contains(e.what(), "truncated");
    }
    CHECK(named);
  }
}

TEST_CASE("gathers through queued reads equal gathers with NPYFEED_IO_URING=0, under injected short reads") {
  using namespace npyfeed::test::window_files;
  TempDir dir;
  const Files files = write_files(dir);
  for (ReadMode mode : {ReadMode::kRead, ReadMode::kDirect}) {
    std::vector<std::int64_t> ids;
    auto plain_source = [&] {
      EnvIoUring off("0");
      return open_source(files, mode);
    }();
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(plain_source->size()); i += 3) ids.push_back(i);
    auto gather = [&](WindowSource& source) {
      auto [batch, job] = source.start_batch(shared_pool(), ids);
      job->wait();
      return std::make_pair(floats(*batch.x, ids.size() * kWindow * kCols), floats(*batch.y, ids.size()));
    };
    const auto want = gather(*plain_source);
    auto queued_source = open_source(files, mode);
    CHECK(gather(*queued_source) == want);
    for (auto hook : {&halve, &interrupt_every_other, &again_every_other}) {
      Hook h(hook);
      CHECK(gather(*queued_source) == want);
    }
  }
}
