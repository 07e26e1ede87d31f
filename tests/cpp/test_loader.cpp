// Loading whole files: .npy files written here into a temporary directory and loaded in every read mode,
// with one thread and several (large files then go in chunks), compared byte for byte with what was written.
// Also the failures: truncated files (before and after the header phase), directories, missing files,
// FIFOs, a bad file among good ones, a file replaced between the phases.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.hpp"
#include "npy_writer.hpp"
#include "npyfeed/common/aligned_buffer.hpp"
#include "npyfeed/common/errors.hpp"
#include "npyfeed/io/direct_reader.hpp"
#include "npyfeed/io/file.hpp"
#include "npyfeed/io/loader.hpp"
#include "npyfeed/io/mapped_file.hpp"

using namespace npyfeed;
using npyfeed::test::contains;
namespace fs = std::filesystem;
using namespace std::string_literals;

namespace {

constexpr std::uint64_t kMiB = 1u << 20;

using npyfeed::test::pattern;
using npyfeed::test::TempDir;

std::string header_text(const std::string& descr, const std::string& shape, bool fortran, int major,
                        std::size_t align) {
  return npyfeed::test::npy_header(descr, shape, fortran, major, align);
}

void write_bytes(const std::string& path, const std::string& head, const std::vector<std::byte>& data) {
  npyfeed::test::write_file(path, head, data);
}

struct NpyFile {
  std::string path;
  std::vector<std::byte> data;
  std::uint64_t data_offset;
};

NpyFile write_npy(const std::string& path, const std::string& descr, const std::string& shape, std::size_t nbytes,
                  std::uint64_t seed, bool fortran = false, int major = 1, std::size_t align = 64) {
  NpyFile f{path, pattern(nbytes, seed), 0};
  std::string head = header_text(descr, shape, fortran, major, align);
  f.data_offset = head.size();
  write_bytes(path, head, f.data);
  return f;
}

std::vector<LoadedArray> load(const std::vector<std::string>& paths, LoadOptions options) {
  ThreadPool pool(options.threads);
  ManyLoad many(paths, options);
  many.start_headers(pool)->wait();
  many.start_chunks(pool)->wait();
  std::vector<LoadedArray> results = many.results();
  CHECK_EQ(many.bytes_total(), [&] {
    std::uint64_t total = 0;
    for (const auto& r : results) total += r.header.nbytes;
    return total;
  }());
  if (options.mode != ReadMode::kMmap || options.populate) CHECK_EQ(many.bytes_done(), many.bytes_total());
  return results;
}

LoadOptions options_for(ReadMode mode, std::size_t threads, bool populate = false) {
  LoadOptions o;
  o.mode = mode;
  o.threads = threads;
  o.populate = populate;
  o.chunk_bytes = kMiB;  // the smallest allowed: files over 2 MiB are split
  return o;
}

const char* mode_name(ReadMode mode) {
  switch (mode) {
    case ReadMode::kMmap:
      return "mmap";
    case ReadMode::kRead:
      return "read";
    case ReadMode::kDirect:
      return "direct";
  }
  return "?";
}

struct Config {
  ReadMode mode;
  std::size_t threads;
  bool populate;
};

const Config kConfigs[] = {
    {ReadMode::kMmap, 1, false},   {ReadMode::kMmap, 4, false},   {ReadMode::kMmap, 4, true},
    {ReadMode::kMmap, 1, true},    {ReadMode::kRead, 1, false},   {ReadMode::kRead, 4, false},
    {ReadMode::kDirect, 1, false}, {ReadMode::kDirect, 4, false},
};

void check_same(const LoadedArray& got, const NpyFile& want, const Config& c) {
  std::string where = std::string(mode_name(c.mode)) + " threads=" + std::to_string(c.threads) + " " + want.path;
  if (got.path != want.path) test::report(__FILE__, __LINE__, "path differs: " + where);
  if (got.header.nbytes != want.data.size()) test::report(__FILE__, __LINE__, "nbytes differs: " + where);
  if (got.header.data_offset != want.data_offset) test::report(__FILE__, __LINE__, "data offset differs: " + where);
  if (!want.data.empty() && (got.data == nullptr || std::memcmp(got.data, want.data.data(), want.data.size()) != 0)) {
    test::report(__FILE__, __LINE__, "data differs: " + where);
  }
  if (got.writable != (c.mode != ReadMode::kMmap)) test::report(__FILE__, __LINE__, "writable flag wrong: " + where);
  if (!got.owner) test::report(__FILE__, __LINE__, "no owner: " + where);
  if (c.mode == ReadMode::kRead && reinterpret_cast<std::uintptr_t>(got.data) % kBufferAlignment != 0) {
    test::report(__FILE__, __LINE__, "read buffer not 64-byte aligned: " + where);
  }
}

}  // namespace

TEST_CASE("every mode loads small, empty, 0-d, Fortran, v2/v3 and chunked large files") {
  TempDir dir;
  std::vector<NpyFile> files = {
      write_npy(dir.file("small.npy"), "<f4", "(3, 5)", 60, 1),
      write_npy(dir.file("empty.npy"), "<f8", "(0, 3)", 0, 2),
      write_npy(dir.file("scalar.npy"), "<i8", "()", 8, 3),
      write_npy(dir.file("fortran.npy"), "<f8", "(4, 3)", 96, 4, /*fortran=*/true),
      write_npy(dir.file("v2.npy"), ">i2", "(1000,)", 2000, 5, false, 2),
      write_npy(dir.file("v3.npy"), "<c8", "(10, 10)", 800, 6, false, 3),
      // Over 2 MiB: split into 1 MiB chunks when threads > 1; odd sizes so the last chunk is partial.
      write_npy(dir.file("big.npy"), "|u1", "(5242883,)", 5 * kMiB + 3, 7),
      // An old writer's 16-byte data alignment: the data starts at neither a page nor a 64-byte boundary.
      write_npy(dir.file("big_old.npy"), "<u2", "(1572865,)", 2 * 1572865, 8, false, 1, 16),
      // Just at the chunking threshold (2 chunks' worth): read whole in the header phase.
      write_npy(dir.file("edge.npy"), "|u1", "(2097152,)", 2 * kMiB, 9),
  };
  CHECK(files[7].data_offset % 64 != 0);
  std::vector<std::string> paths;
  for (const auto& f : files) paths.push_back(f.path);
  for (const Config& c : kConfigs) {
    std::vector<LoadedArray> results = load(paths, options_for(c.mode, c.threads, c.populate));
    REQUIRE(results.size() == files.size());
    for (std::size_t i = 0; i < files.size(); ++i) check_same(results[i], files[i], c);
    CHECK(results[3].header.fortran_order);
    CHECK_EQ(results[4].header.major_version, 2);
    CHECK(results[4].header.scalar.swapped);
  }
}

TEST_CASE("many small files on many threads") {
  TempDir dir;
  std::vector<NpyFile> files;
  std::vector<std::string> paths;
  for (int i = 0; i < 300; ++i) {
    files.push_back(write_npy(dir.file("f" + std::to_string(i) + ".npy"), "<i4", "(" + std::to_string(i) + ",)",
                              4 * static_cast<std::size_t>(i), 100 + i));
    paths.push_back(files.back().path);
  }
  for (const Config& c : kConfigs) {
    LoadOptions o = options_for(c.mode, c.threads == 1 ? 1 : 8, c.populate);
    std::vector<LoadedArray> results = load(paths, o);
    REQUIRE(results.size() == files.size());
    for (std::size_t i = 0; i < files.size(); ++i) check_same(results[i], files[i], c);
  }
}

TEST_CASE("results outlive the load, the pool and the file") {
  for (ReadMode mode : {ReadMode::kMmap, ReadMode::kRead, ReadMode::kDirect}) {
    std::vector<LoadedArray> results;
    NpyFile f;
    {
      TempDir dir;
      f = write_npy(dir.file("a.npy"), "<f8", "(600000,)", 4800000, 11);
      results = load({f.path}, options_for(mode, 4));
    }  // directory and file deleted
    REQUIRE(results.size() == 1);
    CHECK(std::memcmp(results[0].data, f.data.data(), f.data.size()) == 0);
  }
}

TEST_CASE("a truncated file is an NpyFormatError naming it, in every mode") {
  TempDir dir;
  NpyFile f = write_npy(dir.file("short.npy"), "<f8", "(1000,)", 8000, 12);
  REQUIRE(::truncate(f.path.c_str(), static_cast<off_t>(f.data_offset + 7999)) == 0);
  NpyFile head_only = write_npy(dir.file("head.npy"), "<f8", "(10,)", 80, 13);
  REQUIRE(::truncate(head_only.path.c_str(), 40) == 0);  // inside the header text
  for (const Config& c : kConfigs) {
    auto e = CHECK_THROWS(NpyFormatError, load({f.path}, options_for(c.mode, c.threads, c.populate)));
    if (e) {
      CHECK_EQ(e->path(), f.path);
      CHECK_EQ(e->offset(), f.data_offset + 7999);
      CHECK(contains(e->what(), f.path));
      CHECK(contains(e->reason(), "truncated"));
    }
    auto h = CHECK_THROWS(NpyFormatError, load({head_only.path}, options_for(c.mode, c.threads)));
    if (h) CHECK_EQ(h->path(), head_only.path);
    if (h) CHECK_EQ(h->offset(), 40u);
  }
}

TEST_CASE("directories, missing files and FIFOs") {
  TempDir dir;
  std::string sub = dir.file("sub.npy");
  fs::create_directory(sub);
  std::string fifo = dir.file("fifo.npy");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  std::string empty = dir.file("empty.npy");
  write_bytes(empty, "", {});
  for (const Config& c : kConfigs) {
    auto d = CHECK_THROWS(OsError, load({sub}, options_for(c.mode, c.threads)));
    if (d) CHECK_EQ(d->error_number(), EISDIR);
    if (d) CHECK_EQ(d->path(), sub);
    auto m = CHECK_THROWS(OsError, load({dir.file("missing.npy")}, options_for(c.mode, c.threads)));
    if (m) CHECK_EQ(m->error_number(), ENOENT);
    // A FIFO with no writer must not block the open or the read.
    auto p = CHECK_THROWS(NpyFormatError, load({fifo}, options_for(c.mode, c.threads)));
    if (p) CHECK_EQ(p->path(), fifo);
    auto e = CHECK_THROWS(NpyFormatError, load({empty}, options_for(c.mode, c.threads)));
    if (e) CHECK(contains(e->reason(), "empty"));
  }
}

TEST_CASE("one bad file among big good ones: the error names it") {
  TempDir dir;
  std::vector<std::string> paths;
  for (int i = 0; i < 6; ++i) {
    paths.push_back(
        write_npy(dir.file("good" + std::to_string(i) + ".npy"), "<f4", "(786432,)", 3 * kMiB, 20 + i).path);
  }
  std::string bad = dir.file("bad.npy");
  write_bytes(bad, "\x93NUMPY\x01\x00\x20\x00{'descr': '<f4', 'shape': (1,)}      \n"s, {});
  paths.insert(paths.begin() + 3, bad);
  for (const Config& c : kConfigs) {
    auto e = CHECK_THROWS(NpyFormatError, load(paths, options_for(c.mode, c.threads, c.populate)));
    if (e) CHECK_EQ(e->path(), bad);
  }
}

TEST_CASE("a file shrunk or replaced between the header and chunk phases") {
  TempDir dir;
  for (ReadMode mode : {ReadMode::kRead, ReadMode::kDirect}) {
    NpyFile f = write_npy(dir.file("big.npy"), "|u1", "(6291456,)", 6 * kMiB, 30);
    LoadOptions o = options_for(mode, 4);
    {
      ThreadPool pool(4);
      ManyLoad many({f.path}, o);
      many.start_headers(pool)->wait();
      REQUIRE(::truncate(f.path.c_str(), static_cast<off_t>(f.data_offset + 3 * kMiB)) == 0);
      // The chunks open the file again: checked to be the file whose header was read (File::reopen).
      auto e = CHECK_THROWS(OsError, many.start_chunks(pool)->wait());
      if (e) CHECK(e->error_number() == ESTALE && e->path() == f.path && contains(e->what(), "truncated"));
    }
    f = write_npy(dir.file("big.npy"), "|u1", "(6291456,)", 6 * kMiB, 31);
    {
      ThreadPool pool(4);
      ManyLoad many({f.path}, o);
      many.start_headers(pool)->wait();
      // Atomically replaced, as os.replace does: the chunks must not mix two files' data.
      std::string other = write_npy(dir.file("new.npy"), "|u1", "(6291456,)", 6 * kMiB, 32).path;
      REQUIRE(::rename(other.c_str(), f.path.c_str()) == 0);
      auto e = CHECK_THROWS(OsError, many.start_chunks(pool)->wait());
      if (e) CHECK_EQ(e->error_number(), ESTALE);
      if (e) CHECK_EQ(e->path(), f.path);
    }
  }
}

TEST_CASE("mmap populate of a file shrunk after mapping is an error, not SIGBUS") {
  TempDir dir;
  NpyFile f = write_npy(dir.file("big.npy"), "|u1", "(6291456,)", 6 * kMiB, 33);
  ThreadPool pool(4);
  ManyLoad many({f.path}, options_for(ReadMode::kMmap, 4, /*populate=*/true));
  many.start_headers(pool)->wait();
  REQUIRE(::truncate(f.path.c_str(), 4096) == 0);
  auto e = CHECK_THROWS(NpyFormatError, many.start_chunks(pool)->wait());
  if (e) CHECK_EQ(e->path(), f.path);
}

TEST_CASE("File: a file changed since it was opened is refused, saying what changed") {
  TempDir dir;
  const std::string path = dir.file("data.bin");
  const std::vector<std::byte> data = pattern(4096, 7);
  write_bytes(path, "", data);
  // An hour old: a change now always moves the modification time, whatever the clock's tick.
  struct timespec old[2];
  REQUIRE(::clock_gettime(CLOCK_REALTIME, &old[0]) == 0);
  old[0].tv_sec -= 3600;
  old[1] = old[0];
  REQUIRE(::utimensat(AT_FDCWD, path.c_str(), old, 0) == 0);
  const FileOrigin origin = File::open(path).origin();
  CHECK_EQ(origin.identity.size, 4096u);
  File::reopen(origin);  // unchanged: no error
  check_unchanged(origin);
  auto refused = [&](const char* says) {
    auto e = CHECK_THROWS(OsError, check_unchanged(origin));
    if (e) {
      CHECK_EQ(e->error_number(), ESTALE);
      CHECK_EQ(e->path(), path);
      CHECK(contains(e->what(), says));
    }
    auto r = CHECK_THROWS(OsError, File::reopen(origin));
    if (r) CHECK(contains(r->what(), says));
  };
  {  // written in place, same size
    const int fd = ::open(path.c_str(), O_WRONLY);
    REQUIRE(fd >= 0);
    REQUIRE(::pwrite(fd, "x", 1, 100) == 1);
    ::close(fd);
    refused("written in place");
  }
  REQUIRE(::truncate(path.c_str(), 1000) == 0);
  refused("truncated: 4096 bytes then, 1000 now");
  REQUIRE(::truncate(path.c_str(), 5000) == 0);
  refused("grown: 4096 bytes then, 5000 now");
  const std::string other = dir.file("other.bin");
  write_bytes(other, "", data);
  REQUIRE(::rename(other.c_str(), path.c_str()) == 0);
  refused("replaced by another file");
  REQUIRE(::unlink(path.c_str()) == 0);
  auto gone = CHECK_THROWS(OsError, check_unchanged(origin));
  if (gone) CHECK(gone->error_number() == ENOENT && contains(gone->what(), "deleted since it was opened"));
  auto gone_reopen = CHECK_THROWS(OsError, File::reopen(origin));
  if (gone_reopen) CHECK(gone_reopen->error_number() == ENOENT && contains(gone_reopen->what(), "deleted since"));
}

TEST_CASE("File: reads, short reads at the end, identity") {
  TempDir dir;
  std::string path = dir.file("bytes.bin");
  std::vector<std::byte> data = pattern(10000, 40);
  write_bytes(path, "", data);
  File file = File::open(path);
  CHECK(file.is_open());
  CHECK_EQ(file.size(), 10000u);
  CHECK_EQ(file.path(), path);
  std::vector<std::byte> buf(20000);
  CHECK_EQ(file.read_at(buf.data(), 100, 9950), 50u);
  CHECK(std::memcmp(buf.data(), data.data() + 9950, 50) == 0);
  CHECK_EQ(file.read_at(buf.data(), 100, 20000), 0u);
  file.read_exact(buf.data(), 10000, 0);
  CHECK(std::memcmp(buf.data(), data.data(), 10000) == 0);
  auto e = CHECK_THROWS(NpyFormatError, file.read_exact(buf.data(), 200, 9900));
  if (e) CHECK_EQ(e->offset(), 10000u);
  CHECK(File::open(path).identity() == file.identity());
  File moved = std::move(file);
  CHECK(!file.is_open());
  CHECK(moved.is_open());
  moved.close();
  CHECK(!moved.is_open());
  auto d = CHECK_THROWS(OsError, File::open(dir.file("nope")));
  if (d) CHECK(contains(d->what(), dir.file("nope")));
}

TEST_CASE("read_direct_into lands unaligned ranges where asked") {
  TempDir dir;
  std::string path = dir.file("direct.bin");
  std::vector<std::byte> data = pattern(3 * 65536 + 123, 41);
  write_bytes(path, "", data);
  File file;
  try {
    file = File::open(path, /*direct=*/true);
  } catch (const OsError& e) {
    if (e.error_number() != EINVAL) throw;
    std::printf("  (O_DIRECT not supported in %s; skipped)\n", path.c_str());
    return;
  }
  std::size_t align = direct_alignment(file);
  CHECK(align >= 512);
  CHECK((align & (align - 1)) == 0);
  for (std::uint64_t offset : {std::uint64_t{0}, std::uint64_t{80}, std::uint64_t{4095}, std::uint64_t{65536 + 7}}) {
    std::uint64_t length = data.size() - offset;
    AlignedBuffer buffer(align_up(offset % align + length, align) + align, align);
    std::byte* dest = buffer.data() + offset % align;
    if (!read_direct_into(file, align, dest, offset, length)) {
      std::printf("  (O_DIRECT read refused; skipped)\n");
      return;
    }
    CHECK(std::memcmp(dest, data.data() + offset, length) == 0);
  }
  // Asking for more than the file holds: an NpyFormatError naming the file where it ends at a block
  // boundary, else `false` (the buffered fallback then reports it; see the truncation tests).
  AlignedBuffer buffer(data.size() + 4 * align, align);
  bool read_all = true;
  try {
    read_all = read_direct_into(file, align, buffer.data(), 0, data.size() + 10);
  } catch (const NpyFormatError& e) {
    CHECK_EQ(e.path(), path);
    read_all = false;
  }
  CHECK(!read_all);
  auto e = CHECK_THROWS(NpyFormatError, read_direct_into(file, align, buffer.data(), align_up(data.size(), align), 10));
  if (e) CHECK_EQ(e->path(), path);
}

TEST_CASE("MappedFile and AlignedBuffer") {
  TempDir dir;
  std::string path = dir.file("m.bin");
  std::vector<std::byte> data = pattern(100000, 42);
  write_bytes(path, "", data);
  auto mapping = MappedFile::map(File::open(path));  // the descriptor may close at once
  REQUIRE(mapping->data() != nullptr);
  CHECK_EQ(mapping->size(), 100000u);
  mapping->populate(10, 99990);
  CHECK(std::memcmp(mapping->data(), data.data(), data.size()) == 0);
  std::string empty = dir.file("e.bin");
  write_bytes(empty, "", {});
  auto none = MappedFile::map(File::open(empty));
  CHECK(none->data() == nullptr);
  none->populate(0, 0);

  for (std::size_t alignment : {std::size_t{1}, std::size_t{64}, std::size_t{4096}}) {
    AlignedBuffer b(1000, alignment);
    CHECK(reinterpret_cast<std::uintptr_t>(b.data()) % std::max<std::size_t>(alignment, 64) == 0);
    std::memset(b.data(), 1, b.size());
  }
  AlignedBuffer zero(0);
  CHECK(zero.data() != nullptr);

  auto pool = std::make_shared<BufferPool>(2);
  const std::byte* first;
  {
    auto a = pool->acquire(4096);
    first = a->data();
  }
  auto b = pool->acquire(4096);
  CHECK(b->data() == first);  // recycled once its last user let go
  auto c = pool->acquire(4096);
  CHECK(c->data() != b->data());
  pool.reset();  // buffers still held outlive their pool
  std::memset(c->data(), 2, c->size());
}

TEST_CASE("BufferPool: keeps only what its room allows, and lets the oldest go at a miss") {
  std::uint64_t room = 3 * 4096;
  std::size_t asked_for = 0;
  auto pool = std::make_shared<BufferPool>(SIZE_MAX, [&](std::size_t buffers) {
    asked_for = buffers;
    return room;
  });
  auto a = pool->acquire(4096);
  auto b = pool->acquire(4096);
  auto c = pool->acquire(8192);
  a.reset();
  b.reset();
  CHECK_EQ(asked_for, 2u);  // the buffers kept if this one is
  c.reset();                // 16 KiB would be over the room: freed
  CHECK_EQ(pool->kept_bytes(), 2 * 4096u);
  auto d = pool->acquire(4096);
  CHECK_EQ(pool->reused(), 1u);
  CHECK_EQ(pool->kept_bytes(), 4096u);
  room = 0;  // a miss now lets every kept buffer go
  auto e = pool->acquire(8192);
  CHECK_EQ(pool->kept_bytes(), 0u);
  CHECK_EQ(pool->reused(), 1u);
  room = 1 << 20;
  d.reset();
  auto g = pool->acquire(4096, 1 << 16);  // d, kept, is not aligned enough: a new buffer
  CHECK(reinterpret_cast<std::uintptr_t>(g->data()) % (1 << 16) == 0);
  CHECK_EQ(pool->reused(), 1u);
  CHECK_EQ(pool->kept_bytes(), 4096u);
}

TEST_CASE("read_header and parse_read_mode") {
  TempDir dir;
  NpyFile f = write_npy(dir.file("h.npy"), "<f8", "(4, 5)", 160, 50);
  // Trailing bytes after the data are allowed (np.load ignores them too).
  {
    std::FILE* out = std::fopen(f.path.c_str(), "ab");
    std::fputs("trailing", out);
    std::fclose(out);
  }
  NpyHeader h = read_header(File::open(f.path), kDefaultMaxHeaderSize);
  CHECK_EQ(h.nbytes, 160u);
  CHECK_EQ(h.data_offset, f.data_offset);
  // A header longer than the first 4 KiB takes a second read (spaces inside the shape tuple make it long).
  std::string padded = header_text("<u1", "(3," + std::string(5000, ' ') + ")", false, 1, 64);
  write_bytes(dir.file("long.npy"), padded, pattern(3, 51));
  NpyHeader lh = read_header(File::open(dir.file("long.npy")), kDefaultMaxHeaderSize);
  CHECK_EQ(lh.nbytes, 3u);
  CHECK(lh.data_offset > 4096);
  auto capped = CHECK_THROWS(NpyFormatError, read_header(File::open(dir.file("long.npy")), 1000));
  if (capped) CHECK_EQ(capped->path(), dir.file("long.npy"));

  CHECK(parse_read_mode("mmap") == ReadMode::kMmap);
  CHECK(parse_read_mode("read") == ReadMode::kRead);
  CHECK(parse_read_mode("direct") == ReadMode::kDirect);
  CHECK_THROWS(InvalidArgument, parse_read_mode("fast"));
}
