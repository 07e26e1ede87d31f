// detail::convert_to_float32 (the vector loops of convert.cpp) against the scalar conversions: every float16 bit
// pattern in both byte orders (NaN payloads kept, as numpy keeps them), float64 bit patterns at the edges of
// float32 (rounding, overflow, subnormals, NaN payloads); written with ordinary and with streaming stores, at every
// destination offset within a 64-byte line, nothing outside the destination written. Run again without AVX-512
// (NPYFEED_AVX512=0: the AVX2 loops) by ctest.
#include <bit>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "check.hpp"
#include "npyfeed/detail/convert.hpp"

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

TEST_CASE("convert_to_float32: float64 at the edges of float32 converts as static_cast<float>") {
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
  std::vector<std::byte> src(8 * values.size());
  std::vector<float> want(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    std::memcpy(src.data() + 8 * i, &values[i], 8);
    want[i] = static_cast<float>(values[i]);
  }
  int bad = 0;
  check_against(src, scalar('f', 8, false), want, {0, 1, 7, 8, 15, 16, 17, 100, values.size()}, bad);
  CHECK_EQ(bad, 0);
}

TEST_CASE("convert_to_float32: the vector loops serve float16 and native float64 only, others the scalar loops") {
  CHECK(!detail::converts_to_float32_vectorised(scalar('f', 4, false)));
  CHECK(!detail::converts_to_float32_vectorised(scalar('f', 8, true)));
  CHECK(!detail::converts_to_float32_vectorised(scalar('i', 2, false)));
  // Big-endian float64 through the scalar loop, the same function.
  const double v[] = {1.5, -2.25, 1e300};
  std::vector<std::byte> src(sizeof v);
  for (std::size_t i = 0; i < 3; ++i) {
    const std::uint64_t swapped = __builtin_bswap64(std::bit_cast<std::uint64_t>(v[i]));
    std::memcpy(src.data() + 8 * i, &swapped, 8);
  }
  float out[3];
  detail::convert_to_float32(src.data(), scalar('f', 8, true), 3, out, true);
  CHECK_EQ(out[0], 1.5f);
  CHECK_EQ(out[1], -2.25f);
  CHECK_EQ(out[2], static_cast<float>(1e300));
}
