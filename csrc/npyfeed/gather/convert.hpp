// Element conversion for the gather: any bool/int/uint/float source (either byte order) to float32 or
// float64, with the same results as numpy's `astype` (C casts; float16 widened exactly).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "npyfeed/format/npy_header.hpp"

namespace npyfeed::detail {

inline float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exponent = (h >> 10) & 0x1Fu;
  std::uint32_t mantissa = h & 0x3FFu;
  std::uint32_t bits;
  if (exponent == 0x1F) {
    bits = sign | 0x7F800000u | (mantissa << 13);  // inf / nan (payload kept)
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {
    // Subnormal half: normalise.
    exponent = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    bits = sign | (exponent << 23) | ((mantissa & 0x3FFu) << 13);
  }
  return std::bit_cast<float>(bits);
}

template <class T>
inline T load_element(const std::byte* p, bool swapped) {
  using U = std::conditional_t<sizeof(T) == 1, std::uint8_t,
                               std::conditional_t<sizeof(T) == 2, std::uint16_t,
                                                  std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>>;
  U u;
  std::memcpy(&u, p, sizeof(T));
  if constexpr (sizeof(T) > 1) {
    if (swapped) {
      if constexpr (sizeof(T) == 2) u = __builtin_bswap16(u);
      if constexpr (sizeof(T) == 4) u = __builtin_bswap32(u);
      if constexpr (sizeof(T) == 8) u = __builtin_bswap64(u);
    }
  }
  return std::bit_cast<T>(u);
}

template <class Src, class Out>
inline void convert_loop(const std::byte* src, std::size_t n, Out* dst, bool swapped) {
  if (!swapped) {
    const Src* s = reinterpret_cast<const Src*>(src);
    if (reinterpret_cast<std::uintptr_t>(src) % alignof(Src) == 0) {
      for (std::size_t i = 0; i < n; ++i) dst[i] = static_cast<Out>(s[i]);
      return;
    }
  }
  for (std::size_t i = 0; i < n; ++i) dst[i] = static_cast<Out>(load_element<Src>(src + i * sizeof(Src), swapped));
}

/// True when `convert` can convert from `type`.
inline bool convertible(const ScalarType& type) {
  switch (type.kind) {
    case 'b':
      return type.size == 1;
    case 'i':
    case 'u':
      return type.size == 1 || type.size == 2 || type.size == 4 || type.size == 8;
    case 'f':
      return type.size == 2 || type.size == 4 || type.size == 8;
    default:
      return false;
  }
}

/// Whether convert_to_float32 has a vector loop for `type` on this CPU: float16 and float64 (either byte order),
/// float32 in the other byte order, bool, the 8-, 16- and 32-bit integers (either byte order; uint32 with
/// AVX-512 only); with AVX2 and F16C, or AVX-512 (as use_avx512() says). In convert.cpp.
bool converts_to_float32_vectorised(const ScalarType& type);

/// convert<float>'s result, bit for bit (float16 NaNs keep their payload, as numpy's), by those vector loops where
/// there is one; `streamed`: written with streaming stores, fenced (detail::streaming_copy's terms), for a batch
/// past the caches. Any alignment.
void convert_to_float32(const std::byte* src, const ScalarType& type, std::size_t n, float* dst, bool streamed);

/// Converts `n` elements of `type` at `src` to Out (float or double) at `dst`.
template <class Out>
void convert(const std::byte* src, const ScalarType& type, std::size_t n, Out* dst) {
  if (type.kind == 'f' && type.size == sizeof(Out) && !type.swapped) {
    std::memcpy(dst, src, n * sizeof(Out));
    return;
  }
  if constexpr (std::is_same_v<Out, float>) {
    if (converts_to_float32_vectorised(type)) return convert_to_float32(src, type, n, dst, false);
  }
  switch (type.kind) {
    case 'b':
      for (std::size_t i = 0; i < n; ++i) dst[i] = src[i] != std::byte{0} ? Out(1) : Out(0);
      return;
    case 'i':
      switch (type.size) {
        case 1:
          return convert_loop<std::int8_t>(src, n, dst, false);
        case 2:
          return convert_loop<std::int16_t>(src, n, dst, type.swapped);
        case 4:
          return convert_loop<std::int32_t>(src, n, dst, type.swapped);
        case 8:
          return convert_loop<std::int64_t>(src, n, dst, type.swapped);
      }
      break;
    case 'u':
      switch (type.size) {
        case 1:
          return convert_loop<std::uint8_t>(src, n, dst, false);
        case 2:
          return convert_loop<std::uint16_t>(src, n, dst, type.swapped);
        case 4:
          return convert_loop<std::uint32_t>(src, n, dst, type.swapped);
        case 8:
          return convert_loop<std::uint64_t>(src, n, dst, type.swapped);
      }
      break;
    case 'f':
      switch (type.size) {
        case 2:
          for (std::size_t i = 0; i < n; ++i)
            dst[i] = static_cast<Out>(half_to_float(load_element<std::uint16_t>(src + 2 * i, type.swapped)));
          return;
        case 4:
          return convert_loop<float>(src, n, dst, type.swapped);
        case 8:
          return convert_loop<double>(src, n, dst, type.swapped);
      }
      break;
  }
}

}  // namespace npyfeed::detail
