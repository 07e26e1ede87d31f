// streaming_copy against memcpy: every destination alignment, source alignments, lengths around the 64-byte
// lines it streams, the source read once or again; nothing outside the destination written; no byte read
// outside the source (one that ends at an inaccessible page). stream_batch's switch and threshold;
// prefetch_read_once's switch.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "check.hpp"
#include "npy_writer.hpp"
#include "npyfeed/gather/stream_copy.hpp"

using namespace npyfeed;

namespace {

struct EnvStreaming : test::ScopedEnv {
  explicit EnvStreaming(const char* value) : ScopedEnv("NPYFEED_STREAMING", value) {}
};

struct EnvPrefetch : test::ScopedEnv {
  explicit EnvPrefetch(const char* value) : ScopedEnv("NPYFEED_PREFETCH", value) {}
};

}  // namespace

TEST_CASE("streaming_copy: memcpy's bytes at every alignment and length, nothing outside written") {
  constexpr std::size_t kGuard = 128;
  const std::size_t lengths[] = {0, 1, 63, 64, 65, 127, 128, 129, 191, 192, 255, 1000, 4096 + 5, 65536 + 77};
  const std::size_t src_offsets[] = {0, 1, 3, 8, 13, 32, 63};
  std::vector<std::byte> src(65536 + 77 + 64 + 2 * kGuard);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>((i * 131 + 7) % 251);
  std::vector<std::byte> dst(src.size() + 64 + 2 * kGuard);
  int bad = 0;
  for (const auto reuse : {detail::SourceReuse::kOnce, detail::SourceReuse::kAgain}) {
    for (std::size_t n : lengths) {
      for (std::size_t dst_offset = 0; dst_offset < 64; ++dst_offset) {
        for (std::size_t src_offset : src_offsets) {
          std::memset(dst.data(), 0xA5, dst.size());
          // dst_offset 0..63 puts the destination at every address mod 64.
          const std::size_t base = kGuard + dst_offset;
          detail::streaming_copy(dst.data() + base, src.data() + src_offset, n, reuse);
          const bool same = std::memcmp(dst.data() + base, src.data() + src_offset, n) == 0;
          bool guards = true;
          for (std::size_t i = 0; i < base; ++i) guards = guards && dst[i] == std::byte{0xA5};
          for (std::size_t i = base + n; i < dst.size(); ++i) guards = guards && dst[i] == std::byte{0xA5};
          if ((!same || !guards) && bad++ < 5) {
            test::report(__FILE__, __LINE__,
                         "n " + std::to_string(n) + " dst offset " + std::to_string(dst_offset) + " src offset " +
                             std::to_string(src_offset) + (same ? "" : ": bytes differ") +
                             (guards ? "" : ": wrote outside the destination"));
          }
        }
      }
    }
  }
  CHECK_EQ(bad, 0);
}

TEST_CASE("streaming_copy: a source that ends where its mapping does is read to its last byte and no further") {
  // Two pages of source data, then a page that faults when read: a copy that read (not prefetched) past the
  // source's end would crash here. Every length up to two pages, ending at the inaccessible page.
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  void* map = ::mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(map != MAP_FAILED);
  auto* base = static_cast<std::byte*>(map);
  for (std::size_t i = 0; i < 2 * page; ++i) base[i] = static_cast<std::byte>((i * 37 + 11) % 253);
  REQUIRE(::mprotect(base + 2 * page, page, PROT_NONE) == 0);
  std::vector<std::byte> dst(2 * page + 64);
  int bad = 0;
  for (std::size_t n = 0; n <= 2 * page; n += (n < 256 ? 1 : 61)) {
    const std::byte* src = base + 2 * page - n;
    // Every destination alignment too, both ways of reading the source.
    for (const auto reuse : {detail::SourceReuse::kOnce, detail::SourceReuse::kAgain})
      detail::streaming_copy(dst.data() + 64 - (n % 64), src, n, reuse);
    if (std::memcmp(dst.data() + 64 - (n % 64), src, n) != 0 && bad++ < 5)
      test::report(__FILE__, __LINE__, "n " + std::to_string(n) + ": bytes differ");
  }
  CHECK_EQ(bad, 0);
  ::munmap(map, 3 * page);
}

TEST_CASE("stream_batch: from 16 MiB by default, NPYFEED_STREAMING=0 never, =1 always") {
  {
    EnvStreaming env(nullptr);
    CHECK(!detail::stream_batch(0));
    CHECK(!detail::stream_batch(detail::kStreamedBatchBytes - 1));
    CHECK(detail::stream_batch(detail::kStreamedBatchBytes));
  }
  {
    EnvStreaming env("0");
    CHECK(!detail::stream_batch(std::uint64_t{1} << 40));
  }
  {
    EnvStreaming env("1");
    CHECK(detail::stream_batch(1));
  }
  {
    EnvStreaming env("yes");  // anything else: the default
    CHECK(!detail::stream_batch(1));
    CHECK(detail::stream_batch(detail::kStreamedBatchBytes));
  }
}

TEST_CASE("prefetch_read_once: NPYFEED_PREFETCH=0 never, =1 always, else the CPU's default (the same each call)") {
  bool by_default = false;
  {
    EnvPrefetch env(nullptr);
    by_default = detail::prefetch_read_once();
    CHECK_EQ(detail::prefetch_read_once(), by_default);
  }
  {
    EnvPrefetch env("0");
    CHECK(!detail::prefetch_read_once());
  }
  {
    EnvPrefetch env("1");
    CHECK(detail::prefetch_read_once());
  }
  {
    EnvPrefetch env("nta");  // anything else: the default
    CHECK_EQ(detail::prefetch_read_once(), by_default);
  }
}
