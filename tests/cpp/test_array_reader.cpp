// ArrayReader, the one owner of the read modes: every reader (mmap, pread, O_DIRECT, a file read whole,
// memory) gives the file's bytes through read, fetch, read_strided and allocate + fill, with descriptors
// kept or reopened; a file replaced under a reader that reopens is refused; a file shrunk under one is an
// NpyFormatError naming it. The loader and gather tests use the readers through their callers. Also
// File::probably_cached, the page-cache look that sizes opens and tells a cold batch (RWF_NOWAIT).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "check.hpp"
#include "npy_writer.hpp"
#include "npyfeed/common/errors.hpp"
#include "npyfeed/io/array_reader.hpp"

using namespace npyfeed;
using npyfeed::test::contains;
using npyfeed::test::TempDir;

namespace {

constexpr std::size_t kBytes = (3u << 20) + 1000;  // not a multiple of any block size

struct Written {
  std::string path;
  std::vector<std::byte> data;
};

Written write(const TempDir& dir, const std::string& name, std::size_t bytes, std::uint64_t seed,
              std::size_t align = 64) {
  Written w{dir.file(name), npyfeed::test::pattern(bytes, seed)};
  npyfeed::test::write_file(
      w.path, npyfeed::test::npy_header("|u1", "(" + std::to_string(bytes) + ",)", false, 1, align), w.data);
  return w;
}

bool same(const std::byte* got, const std::vector<std::byte>& want, std::size_t offset, std::size_t length) {
  return std::memcmp(got, want.data() + offset, length) == 0;
}

ReaderOptions options(ReadMode mode, bool keep_open, std::uint64_t whole = 0) {
  ReaderOptions o;
  o.mode = mode;
  o.keep_open = keep_open;
  o.read_whole_up_to = whole;
  return o;
}

const char* name_of(ReadMode mode) {
  return mode == ReadMode::kMmap ? "mmap" : mode == ReadMode::kRead ? "read" : "direct";
}

}  // namespace

TEST_CASE("parse_read_mode") {
  CHECK(parse_read_mode("mmap") == ReadMode::kMmap);
  CHECK(parse_read_mode("read") == ReadMode::kRead);
  CHECK(parse_read_mode("direct") == ReadMode::kDirect);
  auto e = CHECK_THROWS(InvalidArgument, parse_read_mode("auto"));  // "auto" is each API's business
  if (e) CHECK_EQ(std::string(e->what()), "mode must be 'mmap', 'read' or 'direct', not 'auto'");
}

TEST_CASE(
    "every mode, descriptors kept or reopened: read, fetch, read_strided, allocate + fill give the file's bytes") {
  TempDir dir;
  const Written w = write(dir, "a.npy", kBytes, 1);
  for (ReadMode mode : {ReadMode::kMmap, ReadMode::kRead, ReadMode::kDirect}) {
    for (bool keep : {true, false}) {
      const std::string where = std::string(name_of(mode)) + (keep ? " kept" : " reopened");
      auto reader = ArrayReader::open(w.path, options(mode, keep));
      CHECK_EQ(reader->name(), w.path);
      CHECK_EQ(reader->header().nbytes, kBytes);
      CHECK_EQ(reader->view() != nullptr, mode == ReadMode::kMmap);
      CHECK(!reader->view_writable());
      CHECK_EQ(reader->reads_in_place(), mode == ReadMode::kRead);
      CHECK_EQ(reader->reads_in_flight_per_thread(), mode == ReadMode::kDirect ? 4u : 1u);
      if (mode != ReadMode::kDirect) CHECK(!reader->fell_back());
      for (std::size_t offset : {std::size_t{0}, std::size_t{1}, std::size_t{4095}, std::size_t{4096}, kBytes - 7}) {
        for (std::size_t length : {std::size_t{1}, std::size_t{7}, std::size_t{5000}}) {
          if (offset + length > kBytes) continue;
          std::vector<std::byte> out(length);
          reader->read(offset, length, out.data());
          if (!same(out.data(), w.data, offset, length))
            test::report(__FILE__, __LINE__, where + ": read " + std::to_string(offset));
          if (!same(reader->fetch(offset, length), w.data, offset, length)) {
            test::report(__FILE__, __LINE__, where + ": fetch " + std::to_string(offset));
          }
        }
      }
      // Three pieces of 10 bytes, 1000 apart (the columns of a Fortran-order array).
      std::vector<std::byte> pieces(30);
      reader->read_strided(123, 10, 1000, 3, pieces.data());
      for (std::size_t k = 0; k < 3; ++k) CHECK(same(pieces.data() + 10 * k, w.data, 123 + 1000 * k, 10));
      // The whole array in chunks split on the reader's block, as the loader does.
      ArrayReader::Destination dest = reader->allocate();
      REQUIRE(dest.buffer != nullptr);
      CHECK(reinterpret_cast<std::uintptr_t>(dest.data) % 64 == 0 || mode == ReadMode::kDirect);
      const std::uint64_t step = std::max<std::size_t>(reader->fill_alignment(), 4096) * 64;
      const std::uint64_t begin = reader->header().data_offset;
      for (std::uint64_t at = begin; at < begin + kBytes;) {
        const std::uint64_t next = std::min(begin + kBytes, at / step * step + step);
        reader->fill(dest, at - begin, next - at);
        at = next;
      }
      if (!same(dest.data, w.data, 0, kBytes)) test::report(__FILE__, __LINE__, where + ": fill");
      reader->populate(0, kBytes);
      reader->will_need(0, kBytes);
      (void)reader->probably_cached(kBytes - 1);
    }
  }
}

TEST_CASE("small files read whole in read/direct modes: an owned, writable, 64-byte aligned view") {
  TempDir dir;
  const Written aligned = write(dir, "a.npy", 5000, 2);
  const Written odd = write(dir, "odd.npy", 5000, 3, 16);  // data at a 16-byte boundary, as old writers did
  for (const Written* w : {&aligned, &odd}) {
    for (ReadMode mode : {ReadMode::kRead, ReadMode::kDirect}) {
      auto reader = ArrayReader::open(w->path, options(mode, true, 1u << 20));
      REQUIRE(reader->view() != nullptr);
      CHECK(reader->view_writable());
      CHECK(reinterpret_cast<std::uintptr_t>(reader->view()) % 64 == 0);
      CHECK(same(reader->view(), w->data, 0, 5000));
      CHECK(same(reader->fetch(100, 50), w->data, 100, 50));
      CHECK(reader->view_owner() != nullptr);
    }
    // A mapping is never "read whole": still the shared read-only view.
    auto mapped = ArrayReader::open(w->path, options(ReadMode::kMmap, true, 1u << 20));
    CHECK(mapped->view() != nullptr && !mapped->view_writable());
    CHECK(same(mapped->view(), w->data, 0, 5000));
  }
  const Written big = write(dir, "big.npy", 9000, 4);
  CHECK(ArrayReader::open(big.path, options(ReadMode::kRead, true, 8999))->view() == nullptr);
}

TEST_CASE("a replaced file: refused where the reader reopens it, the old file where it kept a descriptor") {
  TempDir dir;
  const Written w = write(dir, "a.npy", kBytes, 5);
  for (ReadMode mode : {ReadMode::kRead, ReadMode::kDirect}) {
    auto kept = ArrayReader::open(w.path, options(mode, true));
    auto reopening = ArrayReader::open(w.path, options(mode, false));
    const Written other = write(dir, "b.npy", kBytes, 6);
    std::filesystem::rename(other.path, w.path);
    std::vector<std::byte> out(100);
    auto e = CHECK_THROWS(OsError, reopening->read(10, 100, out.data()));
    if (e) {
      CHECK_EQ(e->error_number(), ESTALE);
      CHECK_EQ(e->path(), w.path);
    }
    CHECK_THROWS(OsError, reopening->fetch(0, 100));
    // A kept descriptor still reads the old file (a kept O_DIRECT one serves direct reads only).
    if (mode == ReadMode::kRead) {
      kept->read(10, 100, out.data());
      CHECK(same(out.data(), w.data, 10, 100));
    } else if (!kept->fell_back()) {
      CHECK(same(kept->fetch(10, 100), w.data, 10, 100));
    }
    // Back to the original for the next mode.
    npyfeed::test::write_file(dir.file("c.npy"), npyfeed::test::npy_header("|u1", "(" + std::to_string(kBytes) + ",)"),
                              w.data);
    std::filesystem::rename(dir.file("c.npy"), w.path);
  }
}

TEST_CASE("a file shrunk under a reader: an error naming it, never a short answer") {
  TempDir dir;
  const Written w = write(dir, "a.npy", kBytes, 7);
  for (ReadMode mode : {ReadMode::kRead, ReadMode::kDirect}) {
    for (bool keep : {true, false}) {
      auto reader = ArrayReader::open(w.path, options(mode, keep));
      REQUIRE(::truncate(w.path.c_str(), static_cast<off_t>(reader->header().data_offset + 1000)) == 0);
      std::vector<std::byte> out(5000);
      // A read through a kept descriptor comes short; a file opened again for a read is refused as changed
      // (File::reopen); only a reopen is possible without a kept descriptor.
      auto refused = [&](const std::function<void()>& call) {
        try {
          call();
        } catch (const NpyFormatError& e) {
          return keep && e.path() == w.path;
        } catch (const OsError& e) {
          return e.error_number() == ESTALE && e.path() == w.path && contains(e.what(), "truncated");
        }
        return false;
      };
      CHECK(refused([&] { reader->read(500, 5000, out.data()); }));
      CHECK(refused([&] { reader->fetch(500, 5000); }));
      npyfeed::test::write_file(w.path, npyfeed::test::npy_header("|u1", "(" + std::to_string(kBytes) + ",)"), w.data);
    }
  }
}

TEST_CASE("arrays in memory: the view is the caller's memory, kept alive by its owner") {
  auto bytes = std::make_shared<std::vector<std::byte>>(npyfeed::test::pattern(256, 8));
  NpyHeader h;
  h.nbytes = 256;
  h.itemsize = 1;
  h.shape = {256};
  std::weak_ptr<std::vector<std::byte>> watch = bytes;
  auto reader = ArrayReader::in_memory("arr['k']", h, bytes, bytes->data(), false);
  const std::vector<std::byte> copy = *bytes;
  bytes.reset();
  CHECK(!watch.expired());
  CHECK_EQ(reader->name(), "arr['k']");
  CHECK(reader->fetch(10, 5) == reader->view() + 10);
  std::vector<std::byte> out(20);
  reader->read(200, 20, out.data());
  CHECK(same(out.data(), copy, 200, 20));
  std::vector<std::byte> pieces(6);
  reader->read_strided(1, 2, 100, 3, pieces.data());
  for (std::size_t k = 0; k < 3; ++k) CHECK(same(pieces.data() + 2 * k, copy, 1 + 100 * k, 2));
  reader.reset();
  CHECK(watch.expired());
}

TEST_CASE("mmap through a bounded MappingCache: the file's bytes, at most `capacity` mappings kept, LRU") {
  TempDir dir;
  std::vector<Written> files;
  for (int k = 0; k < 5; ++k) files.push_back(write(dir, "m" + std::to_string(k) + ".npy", 10000, 10 + k));
  auto cache = std::make_shared<MappingCache>(2);
  ReaderOptions o = options(ReadMode::kMmap, false);
  o.mappings = cache;
  std::vector<std::shared_ptr<ArrayReader>> readers;
  for (const Written& w : files) readers.push_back(ArrayReader::open(w.path, o));
  CHECK_EQ(cache->size(), 0u);  // nothing mapped at open
  for (std::size_t k = 0; k < files.size(); ++k) {
    CHECK(readers[k]->view() == nullptr);  // reads go through the cache, never a pointer that could go stale
    std::vector<std::byte> out(700);
    readers[k]->read(300, 700, out.data());
    CHECK(same(out.data(), files[k].data, 300, 700));
    CHECK(same(readers[k]->fetch(9000, 1000), files[k].data, 9000, 1000));
    std::vector<std::byte> pieces(30);
    readers[k]->read_strided(5, 10, 1000, 3, pieces.data());
    for (std::size_t p = 0; p < 3; ++p) CHECK(same(pieces.data() + 10 * p, files[k].data, 5 + 1000 * p, 10));
    CHECK(cache->size() <= 2u);
  }
  CHECK_EQ(cache->maps_made(), 5u);  // one mapping per file while it stays in the cache
  // The most recently used two are kept: reading file 4 again maps nothing; file 0 was evicted.
  std::vector<std::byte> out(10);
  readers[4]->read(0, 10, out.data());
  CHECK_EQ(cache->maps_made(), 5u);
  readers[0]->read(0, 10, out.data());
  CHECK_EQ(cache->maps_made(), 6u);
  // A mapping held by someone stays valid after it leaves the cache.
  auto held = cache->acquire(File::open(files[1].path).origin());
  for (int k : {2, 3, 4}) readers[static_cast<std::size_t>(k)]->read(0, 10, out.data());
  CHECK(held->size() >= 10000 && same(held->data() + held->size() - 10000, files[1].data, 0, 10000));
}

TEST_CASE("on-demand mappings: a replaced or shrunk file is refused (ESTALE), saying which") {
  TempDir dir;
  const Written a = write(dir, "a.npy", 10000, 20);
  const Written b = write(dir, "b.npy", 10000, 21);
  ReaderOptions o = options(ReadMode::kMmap, false);
  o.mappings = std::make_shared<MappingCache>(1);
  auto ra = ArrayReader::open(a.path, o);
  auto rb = ArrayReader::open(b.path, o);
  const Written replacement = write(dir, "new.npy", 10000, 22);
  REQUIRE(std::rename(replacement.path.c_str(), a.path.c_str()) == 0);
  std::vector<std::byte> out(100);
  auto e = CHECK_THROWS(OsError, ra->read(0, 100, out.data()));
  if (e) CHECK(e->error_number() == ESTALE && contains(e->what(), "replaced by another file"));
  REQUIRE(::truncate(b.path.c_str(), 5000) == 0);  // b is mapped again (a bound of one mapping): checked
  auto f = CHECK_THROWS(OsError, rb->read(8000, 100, out.data()));
  if (f) CHECK(f->error_number() == ESTALE && contains(f->what(), b.path) && contains(f->what(), "truncated"));
}

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
namespace {

// While alive, the process may take only `headroom` more bytes of address space (RLIMIT_AS): a larger mmap
// fails with ENOMEM, as at vm.max_map_count.
struct AddressSpaceLimit {
  explicit AddressSpaceLimit(std::uint64_t headroom) {
    REQUIRE(::getrlimit(RLIMIT_AS, &saved_) == 0);
    std::uint64_t pages = 0;
    std::ifstream("/proc/self/statm") >> pages;
    REQUIRE(pages > 0);
    rlimit lowered = saved_;
    lowered.rlim_cur = pages * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE)) + headroom;
    REQUIRE(::setrlimit(RLIMIT_AS, &lowered) == 0);
  }
  ~AddressSpaceLimit() { ::setrlimit(RLIMIT_AS, &saved_); }
  AddressSpaceLimit(const AddressSpaceLimit&) = delete;
  AddressSpaceLimit& operator=(const AddressSpaceLimit&) = delete;
  rlimit saved_{};
};

}  // namespace

TEST_CASE("a refused mapping (ENOMEM): half the kept mappings let go and the bound halved, once per shortage") {
  TempDir dir;
  std::vector<Written> files;
  for (int k = 0; k < 6; ++k) files.push_back(write(dir, "e" + std::to_string(k) + ".npy", 4u << 20, 30 + k));
  MappingCache cache(8);
  auto acquire = [&](std::size_t k) { return cache.acquire(File::open(files[k].path).origin()); };
  auto refused = [&](std::size_t k) {
    try {
      acquire(k);
      return false;
    } catch (const OsError& e) {
      return e.error_number() == ENOMEM;
    }
  };
  for (std::size_t k = 0; k < 4; ++k) acquire(k);
  CHECK_EQ(cache.size(), 4u);
  {
    AddressSpaceLimit limit(1u << 20);  // no room for a 4 MiB mapping
    CHECK(refused(4));
  }
  CHECK_EQ(cache.size(), 2u);  // the least recently used two were let go (and unmapped: nobody held them)
  CHECK_EQ(cache.capacity(), 4u);
  {
    AddressSpaceLimit limit(1u << 20);  // still short, no mapping made since: nothing more given back
    CHECK(refused(5));
  }
  CHECK_EQ(cache.size(), 2u);
  CHECK_EQ(cache.capacity(), 4u);
  auto mapped = acquire(4);  // room again: mapped, kept
  CHECK(same(mapped->data() + mapped->size() - files[4].data.size(), files[4].data, 0, files[4].data.size()));
  mapped.reset();
  CHECK_EQ(cache.size(), 3u);
  {
    AddressSpaceLimit limit(1u << 20);  // a new shortage
    CHECK(refused(5));
  }
  CHECK_EQ(cache.size(), 1u);
  CHECK_EQ(cache.capacity(), 2u);
}
#endif

TEST_CASE("File::probably_cached: true for a byte just read, false once evicted (where the kernel evicts it)") {
  TempDir dir;
  const Written w = write(dir, "c.npy", kBytes, 7);
  File file = File::open(w.path);
  std::vector<std::byte> head(4096);
  file.read_exact(head.data(), head.size(), 0);
  CHECK(file.probably_cached(0));
  CHECK(file.probably_cached(kBytes + 100));  // past the end: nothing to wait for
  // Evicted (written back first: dirty pages stay), a byte is not cached any more, unless this filesystem keeps
  // everything in memory (tmpfs) or the kernel cannot tell (no RWF_NOWAIT): seen through mincore on a mapping.
  ::fdatasync(file.fd());
  ::posix_fadvise(file.fd(), 0, 0, POSIX_FADV_DONTNEED);
  void* map = ::mmap(nullptr, 4096, PROT_READ, MAP_SHARED, file.fd(), 0);
  REQUIRE(map != MAP_FAILED);
  unsigned char resident = 1;
  REQUIRE(::mincore(map, 4096, &resident) == 0);
  ::munmap(map, 4096);
  if ((resident & 1) == 0) {
    // Whether this kernel and filesystem take RWF_NOWAIT for buffered reads at all, asked 2 MiB away (such a
    // read starts read-ahead from where it asks, which must not reach offset 0 before the check below).
    char byte;
    struct iovec iov{&byte, 1};
    const bool nowait_taken = ::preadv2(file.fd(), &iov, 1, 2 << 20, RWF_NOWAIT) >= 0 || errno != EOPNOTSUPP;
    if (nowait_taken) CHECK(!file.probably_cached(0));
  }
  file.read_exact(head.data(), head.size(), 0);
  CHECK(file.probably_cached(0));
  file.close();
  CHECK(file.probably_cached(0));  // a closed file cannot tell: assumed cached
}
