// detail::convert_to_float32 (the vector loops of convert.cpp) against the scalar conversions: every float16 bit
// pattern in both byte orders (NaN payloads kept, as numpy keeps them); float64 bit patterns at the edges of
// float32 (rounding, overflow, subnormals, NaN payloads) in both byte orders; float32 in the other byte order
// (every bit kept); bools and the 8- to 64-bit integers (the edges, float32 rounding of 32-bit ones, any bits),
// both byte orders. Written with ordinary and with streaming stores, at every destination offset within a 64-byte
// line, nothing outside the destination written. Run again without AVX-512 (NPYFEED_AVX512=0: the AVX2 loops) by
// ctest.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "check.hpp"
#include "npyfeed/gather/convert.hpp"
#include "npyfeed/gather/stream_copy.hpp"

using namespace npyfeed;

namespace {

ScalarType scalar(char kind, std::uint32_t size, bool swapped) {
  ScalarType t;
  t.kind = kind;
  t.size = size;
  t.swapped = swapped;
  return t;
}

// `want` (the scalar result) against convert_to_float32 of `src` (n elements of `type`) for every length in
// `lengths` and destination offset 0..15 elements, both kinds of stores; counts mismatches into `bad`.
void check_against(const std::vector<std::byte>& src, const ScalarType& type, const std::vector<float>& want,
                   const std::vector<std::size_t>& lengths, int& bad) {
  constexpr std::size_t kGuard = 32;
  constexpr std::uint32_t kPoison = 0xDEADBEEF;
  for (const bool streamed : {false, true}) {
    for (const std::size_t n : lengths) {
      for (std::size_t offset = 0; offset < 16; ++offset) {
        std::vector<std::uint32_t> out(n + 16 + 2 * kGuard + 16, kPoison);
        // 64-byte aligned storage, then `offset` elements on.
        auto* base = reinterpret_cast<std::uint32_t*>((reinterpret_cast<std::uintptr_t>(out.data() + kGuard) + 63) &
                                                      ~std::uintptr_t{63});
        float* dst = reinterpret_cast<float*>(base + offset);
        detail::convert_to_float32(src.data(), type, n, dst, streamed);
        bool equal = std::memcmp(dst, want.data(), n * sizeof(float)) == 0;
        bool guards = true;
        for (auto* p = out.data(); p < base + offset; ++p) guards = guards && *p == kPoison;
        for (auto* p = base + offset + n; p < out.data() + out.size(); ++p) guards = guards && *p == kPoison;
        if ((!equal || !guards) && bad++ < 5) {
          test::report(__FILE__, __LINE__,
                       "size " + std::to_string(type.size) + (type.swapped ? " swapped" : "") + ", n " +
                           std::to_string(n) + ", offset " + std::to_string(offset) + (streamed ? ", streamed" : "") +
                           (equal ? "" : ": values differ from the scalar loop") +
                           (guards ? "" : ": wrote outside the destination"));
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("convert_to_float32: every float16 bit pattern, both byte orders, as half_to_float") {
  for (const bool swapped : {false, true}) {
    std::vector<std::byte> src(2 * 65536);
    std::vector<float> want(65536);
    for (std::uint32_t h = 0; h < 65536; ++h) {
      const auto bits = static_cast<std::uint16_t>(h);
      const std::uint16_t stored = swapped ? static_cast<std::uint16_t>(__builtin_bswap16(bits)) : bits;
      std::memcpy(src.data() + 2 * h, &stored, 2);
      want[h] = detail::half_to_float(bits);
    }
    int bad = 0;
    check_against(src, scalar('f', 2, swapped), want, {0, 1, 7, 8, 9, 31, 32, 33, 100, 65536}, bad);
    CHECK_EQ(bad, 0);
  }
}

// `values` stored in native or reversed byte order, as raw bytes.
template <class T>
std::vector<std::byte> stored(const std::vector<T>& values, bool swapped) {
  std::vector<std::byte> out(sizeof(T) * values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    std::byte b[sizeof(T)];
    std::memcpy(b, &values[i], sizeof(T));
    if (swapped) std::reverse(b, b + sizeof(T));
    std::memcpy(out.data() + sizeof(T) * i, b, sizeof(T));
  }
  return out;
}

TEST_CASE("convert_to_float32: float64 at the edges of float32, both byte orders, as static_cast<float>") {
  std::vector<double> values = {0.0,
                                -0.0,
                                1.0,
                                -1.0,
                                1.0 + 0x1p-24,
                                1.0 + 3 * 0x1p-24,
                                16777217.0,
                                3.4028235677973366e38,
                                3.4028236e38,
                                -3.5e38,
                                1e300,
                                -1e300,
                                1e-46,
                                1e-310,
                                0x1p-149,
                                0x1p-150,
                                0x1.8p-150,
                                0x1p-126,
                                0x1.fffffep-127};
  for (const std::uint64_t nan : {0x7FF0000000000001ull, 0x7FF8000000000001ull, 0xFFF4000000000000ull,
                                  0x7FF0000000000000ull, 0xFFF0000000000000ull}) {
    values.push_back(std::bit_cast<double>(nan));
  }
  std::mt19937_64 rng(17);
  while (values.size() < 4099) values.push_back(std::bit_cast<double>(rng()));  // any bits, NaNs included
  std::vector<float> want(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) want[i] = static_cast<float>(values[i]);
  for (const bool swapped : {false, true}) {
    int bad = 0;
    check_against(stored(values, swapped), scalar('f', 8, swapped), want, {0, 1, 7, 8, 15, 16, 17, 100, values.size()},
                  bad);
    CHECK_EQ(bad, 0);
  }
}

TEST_CASE("convert_to_float32: float32 in the other byte order, every bit kept (NaN payloads too)") {
  std::vector<std::uint32_t> bits = {0x7F800001u, 0xFF800001u, 0x7FC00000u, 0x7F800000u, 0x80000000u, 0x00000001u};
  std::mt19937 rng(23);
  while (bits.size() < 4099) bits.push_back(static_cast<std::uint32_t>(rng()));
  std::vector<float> want(bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i) want[i] = std::bit_cast<float>(bits[i]);
  int bad = 0;
  check_against(stored(bits, true), scalar('f', 4, true), want, {0, 1, 7, 8, 15, 16, 17, 100, bits.size()}, bad);
  CHECK_EQ(bad, 0);
}

// Integers of type T: the edges, then any bits.
template <class T>
std::vector<T> integer_values(std::size_t n) {
  std::vector<T> values = {std::numeric_limits<T>::min(),
                           std::numeric_limits<T>::max(),
                           T(0),
                           T(1),
                           T(-1),
                           static_cast<T>(std::numeric_limits<T>::max() - 1)};
  if constexpr (sizeof(T) == 4) {
    // Not float32 values: rounded to nearest, ties to even (2^24 + 1, + 3; 2^31 - 64 and - 65; the unsigned top).
    for (const std::int64_t v : {16777217LL, 16777219LL, -16777217LL, 2147483583LL, 2147483584LL, 2147483585LL,
                                 4294967233LL, 4294967168LL, 4294967169LL})
      values.push_back(static_cast<T>(v));
  }
  std::mt19937_64 rng(29);
  while (values.size() < n) values.push_back(static_cast<T>(rng()));
  return values;
}

template <class T>
void check_integers(char kind, int& bad) {
  const auto values = integer_values<T>(4099);
  std::vector<float> want(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) want[i] = static_cast<float>(values[i]);
  for (const bool swapped : sizeof(T) == 1 ? std::vector<bool>{false} : std::vector<bool>{false, true}) {
    const ScalarType type = scalar(kind, sizeof(T), swapped);
    check_against(stored(values, swapped), type, want, {0, 1, 7, 8, 15, 16, 17, 31, 32, 33, 100, values.size()}, bad);
  }
}

TEST_CASE("convert_to_float32: the 8-, 16- and 32-bit integers, both byte orders, as static_cast<float>") {
  int bad = 0;
  check_integers<std::int8_t>('i', bad);
  check_integers<std::uint8_t>('u', bad);
  check_integers<std::int16_t>('i', bad);
  check_integers<std::uint16_t>('u', bad);
  check_integers<std::int32_t>('i', bad);
  check_integers<std::uint32_t>('u', bad);
  check_integers<std::int64_t>('i', bad);  // the scalar loop, through the same function
  check_integers<std::uint64_t>('u', bad);
  CHECK_EQ(bad, 0);
}

TEST_CASE("convert_to_float32: bools, any byte but 0 is 1 (as numpy's astype)") {
  std::vector<std::byte> src(4099);
  std::mt19937 rng(31);
  for (std::size_t i = 0; i < src.size(); ++i) {
    const unsigned r = rng() % 4;
    src[i] = std::byte(r == 0 ? 0 : r == 1 ? 1 : r == 2 ? 0x80 : rng() & 0xFF);
  }
  std::vector<float> want(src.size());
  for (std::size_t i = 0; i < src.size(); ++i) want[i] = src[i] != std::byte{0} ? 1.0f : 0.0f;
  int bad = 0;
  check_against(src, scalar('b', 1, false), want, {0, 1, 7, 8, 15, 16, 17, 100, src.size()}, bad);
  CHECK_EQ(bad, 0);
}

TEST_CASE("convert_to_float32: the vector loops serve every type but native float32 and the 64-bit integers") {
  CHECK(!detail::converts_to_float32_vectorised(scalar('f', 4, false)));
  CHECK(!detail::converts_to_float32_vectorised(scalar('i', 8, false)));
  CHECK(!detail::converts_to_float32_vectorised(scalar('u', 8, true)));
  // Where the CPU has AVX2 (or AVX-512), int16 and swapped float32 go together.
  CHECK_EQ(detail::converts_to_float32_vectorised(scalar('i', 2, false)),
           detail::converts_to_float32_vectorised(scalar('f', 4, true)));
  // uint32 with AVX-512 only (AVX2 has no unsigned conversion): not in the run with NPYFEED_AVX512=0.
  if (!detail::use_avx512()) CHECK(!detail::converts_to_float32_vectorised(scalar('u', 4, false)));
}
