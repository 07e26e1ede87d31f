// CacheWarm (page_cache.hpp), what `npyfeed warm` runs: residency measured per file, every byte not resident
// read (each piece once), progress counters that end at the total, the files left in the page cache
// afterwards, and a missing or non-regular file reported from the measuring job, named.
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "check.hpp"
#include "npy_writer.hpp"
#include "npyfeed/common/errors.hpp"
#include "npyfeed/common/thread_pool.hpp"
#include "npyfeed/io/page_cache.hpp"

using namespace npyfeed;
using npyfeed::test::TempDir;

namespace {

// Drops a file's pages from the page cache where the filesystem allows it (not tmpfs).
void evict(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

}  // namespace

TEST_CASE("cache warm: measures, reads what is not resident, and leaves every file resident") {
  TempDir dir;
  const std::vector<std::uint64_t> sizes{0, 1, 4096, 3 * 1024 * 1024 + 17, 300000};
  std::vector<std::string> paths;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    paths.push_back(dir.file("f" + std::to_string(i) + ".bin"));
    npyfeed::test::write_file(paths.back(), std::string(), npyfeed::test::pattern(sizes[i], i));
    evict(paths.back());
  }
  CacheWarm warm(paths, /*chunk_bytes=*/1 << 20);  // several pieces for the large file
  warm.start_measure(shared_pool(), 3, /*after=*/false)->wait();
  std::uint64_t total = 0, resident_before = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    CHECK_EQ(warm.files()[i].size, sizes[i]);
    CHECK(warm.files()[i].resident_before <= sizes[i]);
    total += sizes[i];
    resident_before += warm.files()[i].resident_before;
  }
  warm.start_reads(shared_pool(), 3)->wait();
  CHECK_EQ(warm.bytes_done(), warm.bytes_total());
  CHECK(warm.bytes_total() <= total);
  CHECK(warm.bytes_read() <= total - resident_before + 4096 * sizes.size());  // page rounding at each file's end
  warm.start_measure(shared_pool(), 3, /*after=*/true)->wait();
  for (std::size_t i = 0; i < sizes.size(); ++i) CHECK_EQ(warm.files()[i].resident_after, sizes[i]);
  // A second warm finds everything resident and reads nothing.
  CacheWarm again(paths);
  again.start_measure(shared_pool(), 2, false)->wait();
  again.start_reads(shared_pool(), 2)->wait();
  CHECK_EQ(again.bytes_read(), 0u);
}

TEST_CASE("cache warm: a missing file or a directory is an error naming it") {
  TempDir dir;
  const std::string good = dir.file("good.bin");
  npyfeed::test::write_file(good, std::string(), npyfeed::test::pattern(100, 1));
  for (const std::string& bad : {dir.file("missing.bin"), dir.path().string()}) {
    CacheWarm warm({good, bad});
    auto error = CHECK_THROWS(OsError, warm.start_measure(shared_pool(), 2, false)->wait());
    CHECK(error && error->path() == bad);
  }
}
