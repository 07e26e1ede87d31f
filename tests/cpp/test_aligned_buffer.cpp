// AlignedBuffer: every size at its alignment and writable from its first byte to its last, through malloc and
// as a mapping of its own (from 1 MiB, or with own_pages); a mapping of its own gives its pages back when freed.
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "check.hpp"
#include "npyfeed/common/aligned_buffer.hpp"

using namespace npyfeed;

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

// Whether the page at `at` is mapped in this process (mincore answers ENOMEM for an address outside every mapping).
bool mapped(const std::byte* at) {
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  unsigned char resident = 0;
  void* page_start = reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(at) / page * page);
  return ::mincore(page_start, page, &resident) == 0 || errno != ENOMEM;
}

}  // namespace

TEST_CASE("every size is aligned and writable from its first byte to its last") {
  for (bool own_pages : {false, true}) {
    for (std::size_t alignment : {std::size_t{64}, std::size_t{4096}}) {
      for (std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{100}, std::size_t{4096}, kMiB - 1, kMiB,
                               5 * kMiB + 3, 9 * kMiB}) {
        AlignedBuffer buffer(size, alignment, own_pages);
        CHECK_EQ(buffer.size(), size);
        CHECK(buffer.alignment() >= alignment);
        CHECK_EQ(reinterpret_cast<std::uintptr_t>(buffer.data()) % alignment, std::uintptr_t{0});
        std::memset(buffer.data(), 0x5a, size);
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < size; i += 997) wrong += buffer.data()[i] != std::byte{0x5a};
        if (size > 0) wrong += buffer.data()[size - 1] != std::byte{0x5a};
        CHECK_EQ(wrong, std::size_t{0});
      }
    }
  }
}

TEST_CASE("a buffer of its own mapping gives its pages back when freed") {
  for (std::size_t size : {kMiB, 3 * kMiB + 5}) {
    const std::byte* start = nullptr;
    {
      AlignedBuffer buffer(size);
      start = buffer.data();
      std::memset(buffer.data(), 1, buffer.size());
      CHECK(mapped(start));
      CHECK(mapped(start + size - 1));
    }
    CHECK(!mapped(start));
  }
}
