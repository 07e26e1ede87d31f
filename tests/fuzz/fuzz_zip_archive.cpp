// libFuzzer target for the `.npz` container (zip_archive): each input is a whole archive, read from memory.
// Its directory is parsed; then every member (at most 16, at most 1 MiB uncompressed) is streamed to its end,
// which checks the stream's end and CRC-32. Only npyfeed::NpyFormatError may come out; anything else (another
// exception, a crash, a sanitizer report, a broken invariant below) is a finding.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "npyfeed/common/errors.hpp"
#include "npyfeed/format/zip_archive.hpp"

using namespace npyfeed;

#define NPYFEED_FUZZ_CHECK(cond)                                                 \
  do {                                                                           \
    if (!(cond)) {                                                               \
      std::fprintf(stderr, "invariant broken: %s (line %d)\n", #cond, __LINE__); \
      std::abort();                                                              \
    }                                                                            \
  } while (0)

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  ReadAt read_at = [&](std::byte* dest, std::size_t length, std::uint64_t offset) -> std::size_t {
    if (offset >= size || length == 0) return 0;
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(length, size - offset));
    std::memcpy(dest, bytes + offset, n);
    return n;
  };
  std::vector<ZipMember> members;
  try {
    members = read_zip_directory(read_at, size);
  } catch (const NpyFormatError&) {
    return 0;
  }
  // What readers rely on for every directory the parser accepts: members inside the file, not overlapping.
  for (const ZipMember& m : members) {
    NPYFEED_FUZZ_CHECK(m.data_offset <= size && m.compressed_size <= size - m.data_offset);
    NPYFEED_FUZZ_CHECK(!m.name.empty());
    NPYFEED_FUZZ_CHECK(m.method == 0 || m.method == 8);
    NPYFEED_FUZZ_CHECK(!m.is_stored() || m.compressed_size == m.uncompressed_size);
    NPYFEED_FUZZ_CHECK(m.is_stored() || m.uncompressed_size / kMaxDeflateRatio <= m.compressed_size);
  }
  std::size_t streamed = 0;
  for (const ZipMember& m : members) {
    if (streamed++ == 16 || m.uncompressed_size > (1u << 20)) break;
    try {
      MemberStream stream(read_at, m);
      std::vector<std::byte> head(std::min<std::uint64_t>(m.uncompressed_size, 64));
      stream.read(head.data(), head.size());
      stream.finish();
      NPYFEED_FUZZ_CHECK(stream.position() == m.uncompressed_size);
    } catch (const NpyFormatError&) {
    }
  }
  return 0;
}
