// libFuzzer target for the `.npy` header parser (run_fuzz.sh builds and runs it).
//
// Each input is used twice:
//   1. as the first bytes of a file, given to npy_header_end and parse_npy_header;
//   2. unless it starts with the magic's first byte, as the text of one value ('descr', 'shape' or
//      'fortran_order', chosen by the first byte) inside an otherwise valid v1 or v3 header, so that the
//      literal parser and the descr/itemsize helpers see arbitrary text without first having to find the
//      magic and a consistent length field.
// Only npyfeed::NpyFormatError may come out of the parser; anything else (another exception, a crash, a
// sanitizer report, a broken invariant below) is a finding.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>

#include "npyfeed/common/errors.hpp"
#include "npyfeed/format/npy_header.hpp"

using namespace npyfeed;

#define NPYFEED_FUZZ_CHECK(cond)                                                 \
  do {                                                                           \
    if (!(cond)) {                                                               \
      std::fprintf(stderr, "invariant broken: %s (line %d)\n", #cond, __LINE__); \
      std::abort();                                                              \
    }                                                                            \
  } while (0)

namespace {

std::span<const std::byte> as_bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

// What the loader relies on for every header the parser accepts.
void check_invariants(const NpyHeader& h, std::span<const std::byte> bytes, std::size_t cap) {
  NPYFEED_FUZZ_CHECK(h.major_version >= 1 && h.major_version <= 3 && h.minor_version == 0);
  NPYFEED_FUZZ_CHECK(h.data_offset <= bytes.size());
  NPYFEED_FUZZ_CHECK(h.data_offset == npy_header_end(bytes.first(std::min(bytes.size(), kMaxPreambleSize)), cap));
  NPYFEED_FUZZ_CHECK(h.shape.size() <= 64);
  bool zero = false;
  unsigned __int128 count = 1;
  for (std::int64_t d : h.shape) {
    NPYFEED_FUZZ_CHECK(d >= 0);
    if (d == 0)
      zero = true;
    else
      count *= static_cast<std::uint64_t>(d);
    NPYFEED_FUZZ_CHECK(count <= UINT64_MAX);  // else the parser should have refused it
  }
  if (zero) count = 0;
  NPYFEED_FUZZ_CHECK(h.count == count);
  NPYFEED_FUZZ_CHECK(static_cast<unsigned __int128>(h.count) * h.itemsize == h.nbytes);
  NPYFEED_FUZZ_CHECK(h.nbytes <= static_cast<std::uint64_t>(INT64_MAX));
  NPYFEED_FUZZ_CHECK(descr_itemsize(h.descr) == h.itemsize);
  if (!h.descr_text.empty())
    NPYFEED_FUZZ_CHECK(h.descr.kind == detail::PyLiteral::Kind::kStr && h.descr.str == h.descr_text);
  if (h.scalar.kind != '\0') NPYFEED_FUZZ_CHECK(h.scalar.size == h.itemsize);
  // Every value of the descr knows where it starts in the file: inside the header text.
  const std::uint64_t text_start = h.major_version == 1 ? 10 : 12;
  auto check_positions = [&](const auto& self, const detail::PyLiteral& v) -> void {
    NPYFEED_FUZZ_CHECK(v.position >= text_start && v.position < h.data_offset);
    for (const auto& item : v.items) self(self, item);
  };
  check_positions(check_positions, h.descr);
}

// Parses `bytes` under `cap`; on success checks the invariants and that a larger cap agrees.
void parse_and_check(std::span<const std::byte> bytes, std::size_t cap) {
  try {
    (void)npy_header_end(bytes.first(std::min(bytes.size(), kMaxPreambleSize)), cap);
  } catch (const NpyFormatError& e) {
    NPYFEED_FUZZ_CHECK(e.path().empty());
  }
  NpyHeader h;
  try {
    h = parse_npy_header(bytes, cap);
  } catch (const NpyFormatError& e) {
    NPYFEED_FUZZ_CHECK(e.path().empty());  // the parser knows no path; the loader adds it
    NPYFEED_FUZZ_CHECK(!e.reason().empty());
    NPYFEED_FUZZ_CHECK(e.offset() <= bytes.size());  // it points into the bytes (or just past them)
    return;
  }
  check_invariants(h, bytes, cap);
  NpyHeader wider = parse_npy_header(bytes, cap * 4);  // must not throw: a larger cap accepts more
  NPYFEED_FUZZ_CHECK(wider.data_offset == h.data_offset && wider.nbytes == h.nbytes && wider.shape == h.shape);
}

// Puts `value` in place of one value of a valid header.
std::string wrap(unsigned char selector, std::string_view value) {
  std::string v(value);
  std::string dict;
  switch (selector % 3) {
    case 0:
      dict = "{'descr': " + v + ", 'fortran_order': False, 'shape': (2, 3)}";
      break;
    case 1:
      dict = "{'descr': '<f8', 'fortran_order': False, 'shape': " + v + "}";
      break;
    default:
      dict = "{'descr': '<i2', 'fortran_order': " + v + ", 'shape': ()}";
      break;
  }
  int major = (selector & 4) != 0 ? 3 : 1;
  std::size_t pre = major == 1 ? 10 : 12;
  while ((pre + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  std::size_t n = dict.size();
  out += static_cast<char>(n & 0xff);
  out += static_cast<char>((n >> 8) & 0xff);
  if (major != 1) {
    out += static_cast<char>((n >> 16) & 0xff);
    out += static_cast<char>((n >> 24) & 0xff);
  }
  return out + dict;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  parse_and_check(bytes, kDefaultMaxHeaderSize);
  parse_and_check(bytes, 128);  // a small cap: the cap checks see both sides of their limit
  if (size >= 1 && data[0] != 0x93 && size < 60000) {
    std::string text = wrap(data[0], std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
    parse_and_check(as_bytes(text), kDefaultMaxHeaderSize);
  }
  return 0;
}
