// The storage types of batches formed on a device (device_rows.hpp): every float16 and bfloat16 value survives
// the trip through double (or float) and back, and every value halfway between two neighbours rounds to the
// one with an even last bit; overflow, signed zeros, subnormals and NaN as numpy (float16) and ml_dtypes
// (bfloat16) have them. Exhaustive over the 65536 encodings of each type.
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "check.hpp"
#include "npyfeed/common/errors.hpp"
#include "npyfeed/device/device_rows.hpp"

using namespace npyfeed;

namespace {

// IEEE half-precision bits as a double, decoded from the definition (not by the code under test).
double half_value(std::uint16_t h) {
  const int sign = (h & 0x8000) ? -1 : 1;
  const int exponent = (h >> 10) & 0x1F;
  const int mantissa = h & 0x3FF;
  if (exponent == 0x1F) return mantissa ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

float bfloat16_value(std::uint16_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }

bool is_nan_half(std::uint16_t h) { return (h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0; }
bool is_nan_bfloat16(std::uint16_t b) { return (b & 0x7F80) == 0x7F80 && (b & 0x7F) != 0; }

}  // namespace

TEST_CASE("float16: every value round-trips, and halfway values round to even") {
  for (std::uint32_t h = 0; h <= 0xFFFF; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    if (is_nan_half(bits)) {
      CHECK(is_nan_half(half_bits(half_value(bits))));
      continue;
    }
    CHECK_EQ(half_bits(half_value(bits)), bits);
    // Halfway to the next value away from zero (finite neighbours of the same sign).
    const auto next = static_cast<std::uint16_t>(bits + 1);
    if ((bits & 0x7FFF) < 0x7BFF) {
      const double mid = (half_value(bits) + half_value(next)) / 2;  // exact in double
      CHECK_EQ(half_bits(mid), (bits & 1) ? next : bits);
      CHECK_EQ(half_bits(std::nextafter(mid, 0.0)), bits);
      CHECK_EQ(half_bits(std::nextafter(mid, mid * 2)), next);
    }
  }
  CHECK_EQ(half_bits(65519.99), 0x7BFF);  // below halfway to 2^16: the largest half
  CHECK_EQ(half_bits(65520.0), 0x7C00);   // halfway, even is 2^16: infinity
  CHECK_EQ(half_bits(-1e300), 0xFC00);
  CHECK_EQ(half_bits(-0.0), 0x8000);
  CHECK_EQ(half_bits(std::ldexp(1.0, -26)), 0x0000);                      // a quarter of the smallest subnormal
  CHECK_EQ(half_bits(std::ldexp(1.0, -25)), 0x0000);                      // half of it: ties to even, 0
  CHECK_EQ(half_bits(std::ldexp(3.0, -25)), 0x0002);                      // one and a half: to even, 2
  CHECK_EQ(half_bits(std::numeric_limits<double>::quiet_NaN()), 0x7E00);  // numpy's quiet NaN
  CHECK_EQ(half_bits(-std::numeric_limits<double>::infinity()), 0xFC00);
}

TEST_CASE("bfloat16: every value round-trips, and halfway values round to even") {
  for (std::uint32_t b = 0; b <= 0xFFFF; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    if (is_nan_bfloat16(bits)) {
      CHECK(is_nan_bfloat16(bfloat16_bits(bfloat16_value(bits))));
      continue;
    }
    CHECK_EQ(bfloat16_bits(bfloat16_value(bits)), bits);
    const auto next = static_cast<std::uint16_t>(bits + 1);
    if ((bits & 0x7FFF) < 0x7F7F) {
      // Halfway: the float with the next 16 bits 0x8000; just under and just over it.
      const std::uint32_t mid = (static_cast<std::uint32_t>(bits) << 16) | 0x8000u;
      CHECK_EQ(bfloat16_bits(std::bit_cast<float>(mid)), (bits & 1) ? next : bits);
      CHECK_EQ(bfloat16_bits(std::bit_cast<float>(mid - 1)), bits);
      CHECK_EQ(bfloat16_bits(std::bit_cast<float>(mid + 1)), next);
    }
  }
  CHECK_EQ(bfloat16_bits(std::numeric_limits<float>::max()), 0x7F80);  // past the largest: infinity
  CHECK_EQ(bfloat16_bits(std::numeric_limits<float>::quiet_NaN()), 0x7FC0);
  CHECK_EQ(bfloat16_bits(-std::numeric_limits<float>::quiet_NaN()), 0xFFC0);
}

TEST_CASE("storage type names") {
  CHECK(parse_storage_type("float16") == StorageType::kFloat16);
  CHECK(parse_storage_type("bfloat16") == StorageType::kBFloat16);
  CHECK(parse_storage_type("float32") == StorageType::kFloat32);
  CHECK(parse_storage_type("float64") == StorageType::kFloat64);
  CHECK_EQ(storage_size(StorageType::kBFloat16), 2u);
  CHECK_EQ(storage_size(StorageType::kFloat64), 8u);
  CHECK_THROWS(InvalidArgument, parse_storage_type("int8"));
}
