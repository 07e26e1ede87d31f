#include "npyfeed/gather/convert.hpp"

#include <cstring>
#include <type_traits>

#include "npyfeed/gather/cpu_features.hpp"
#include "npyfeed/gather/stream_copy.hpp"

namespace npyfeed::detail {

namespace {

// The scalar loops of convert.hpp, for the elements before a vector loop's first aligned store and after its last.
void half_rows(const std::byte* src, std::size_t n, float* dst, bool swapped) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = half_to_float(load_element<std::uint16_t>(src + 2 * i, swapped));
}
void double_rows(const std::byte* src, std::size_t n, float* dst, bool swapped) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(load_element<double>(src + 8 * i, swapped));
}
void swapped_float_rows(const std::byte* src, std::size_t n, float* dst) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = load_element<float>(src + 4 * i, true);
}
// Integers (T) and bools (T = bool: any byte but 0 is 1, as numpy's).
template <class T>
void integer_rows(const std::byte* src, std::size_t n, float* dst, bool swapped) {
  if constexpr (std::is_same_v<T, bool>) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = src[i] != std::byte{0} ? 1.0f : 0.0f;
  } else {
    convert_loop<T>(src, n, dst, swapped);
  }
}

#if NPYFEED_STREAMING_STORES
// Elements of float at `dst` before its first `align`-byte boundary (at most n).
std::size_t head_elems(const float* dst, std::size_t n, std::size_t align) {
  return std::min(n, bytes_to_boundary(dst, align) / sizeof(float));
}

// One vector to `p`: streamed past the caches (kStream) or stored as usual; any alignment without kStream, 64- or
// 32-byte aligned with it.
template <bool kStream>
[[gnu::target("avx512f"), gnu::always_inline]] inline void store(float* p, __m512 v) {
  if constexpr (kStream) {
    _mm512_stream_ps(p, v);
  } else {
    _mm512_storeu_ps(p, v);
  }
}
template <bool kStream>
[[gnu::target("avx"), gnu::always_inline]] inline void store(float* p, __m256 v) {
  if constexpr (kStream) {
    _mm256_stream_ps(p, v);
  } else {
    _mm256_storeu_ps(p, v);
  }
}

// Byte indices that reverse each element of `size` bytes in a 16-byte lane (pshufb works lane by lane).
__m128i reversal(int size) {
  alignas(16) std::uint8_t order[16];
  for (int b = 0; b < 16; ++b) order[b] = static_cast<std::uint8_t>(b - b % size + (size - 1 - b % size));
  return _mm_load_si128(reinterpret_cast<const __m128i*>(order));
}

// 8 doubles at `p`, their bytes reversed first when `swapped` (by `swap`).
[[gnu::target("avx512f,avx512bw"), gnu::always_inline]] inline __m512d load_doubles(const std::byte* p, bool swapped,
                                                                                    __m512i swap) {
  const __m512i v = _mm512_loadu_si512(p);
  return _mm512_castsi512_pd(swapped ? _mm512_shuffle_epi8(v, swap) : v);
}
[[gnu::target("avx2"), gnu::always_inline]] inline __m256d load_doubles(const std::byte* p, bool swapped,
                                                                        __m256i swap) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm256_castsi256_pd(swapped ? _mm256_shuffle_epi8(v, swap) : v);
}

// A float16 NaN's float32 bits, as half_to_float builds them: sign << 16 | 0x7F800000 | mantissa << 13.
[[gnu::target("avx512f"), gnu::always_inline]] inline __m512 exact_half_nan(__m512i w) {
  const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(w, _mm512_set1_epi32(0x8000)), 16);
  const __m512i mantissa = _mm512_slli_epi32(_mm512_and_si512(w, _mm512_set1_epi32(0x3FF)), 13);
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_or_si512(sign, _mm512_set1_epi32(0x7F800000)), mantissa));
}

// float16 to float32. The hardware's conversion (F16C) is exact, as half_to_float, except for the NaNs: it may
// quiet a signalling NaN, where numpy (and half_to_float) keeps every payload bit. Lanes holding a NaN, rare in
// data, are rebuilt from their bits when there is one.
template <bool kStream>
[[gnu::target("avx512f,avx512bw,f16c")]] void half_avx512(const std::byte* src, std::size_t n, float* dst,
                                                          bool swapped) {
  const std::size_t head = kStream ? head_elems(dst, n, 64) : 0;
  half_rows(src, head, dst, swapped);
  const __m512i swap = _mm512_broadcast_i32x4(reversal(2));
  const __m512i exponent = _mm512_set1_epi32(0x7C00), mantissa = _mm512_set1_epi32(0x3FF);
  std::size_t i = head;
  for (; i + 32 <= n; i += 32) {
    __m512i h = _mm512_loadu_si512(src + 2 * i);  // 32 halves
    if (swapped) h = _mm512_shuffle_epi8(h, swap);
    const __m256i lo = _mm512_castsi512_si256(h), hi = _mm512_extracti64x4_epi64(h, 1);
    __m512 a = _mm512_cvtph_ps(lo), b = _mm512_cvtph_ps(hi);
    const __m512i wa = _mm512_cvtepu16_epi32(lo), wb = _mm512_cvtepu16_epi32(hi);
    // NaN: all exponent bits set and a mantissa.
    const __mmask16 na =
        _mm512_cmpeq_epi32_mask(_mm512_and_si512(wa, exponent), exponent) & _mm512_test_epi32_mask(wa, mantissa);
    const __mmask16 nb =
        _mm512_cmpeq_epi32_mask(_mm512_and_si512(wb, exponent), exponent) & _mm512_test_epi32_mask(wb, mantissa);
    if ((na | nb) != 0) [[unlikely]] {
      a = _mm512_mask_mov_ps(a, na, exact_half_nan(wa));
      b = _mm512_mask_mov_ps(b, nb, exact_half_nan(wb));
    }
    store<kStream>(dst + i, a);
    store<kStream>(dst + i + 16, b);
  }
  half_rows(src + 2 * i, n - i, dst + i, swapped);
}

template <bool kStream>
[[gnu::target("avx512f,avx512bw")]] void double_avx512(const std::byte* src, std::size_t n, float* dst, bool swapped) {
  const std::size_t head = kStream ? head_elems(dst, n, 64) : 0;
  double_rows(src, head, dst, swapped);
  const __m512i swap = _mm512_broadcast_i32x4(reversal(8));
  std::size_t i = head;
  for (; i + 16 <= n; i += 16) {
    // Rounded to nearest, as the scalar conversion (cvtsd2ss) under the same MXCSR.
    const __m256 lo = _mm512_cvtpd_ps(load_doubles(src + 8 * i, swapped, swap));
    const __m256 hi = _mm512_cvtpd_ps(load_doubles(src + 8 * i + 64, swapped, swap));
    const __m512 v =
        _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
    store<kStream>(dst + i, v);
  }
  double_rows(src + 8 * i, n - i, dst + i, swapped);
}

template <bool kStream>
[[gnu::target("avx2,f16c")]] void half_avx2(const std::byte* src, std::size_t n, float* dst, bool swapped) {
  const std::size_t head = kStream ? head_elems(dst, n, 32) : 0;
  half_rows(src, head, dst, swapped);
  const __m128i swap = reversal(2);
  const __m256i exponent = _mm256_set1_epi32(0x7C00), mantissa = _mm256_set1_epi32(0x3FF);
  std::size_t i = head;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
    if (swapped) h = _mm_shuffle_epi8(h, swap);
    __m256 v = _mm256_cvtph_ps(h);
    const __m256i w = _mm256_cvtepu16_epi32(h);
    const __m256i nan = _mm256_andnot_si256(_mm256_cmpeq_epi32(_mm256_and_si256(w, mantissa), _mm256_setzero_si256()),
                                            _mm256_cmpeq_epi32(_mm256_and_si256(w, exponent), exponent));
    if (!_mm256_testz_si256(nan, nan)) [[unlikely]] {
      const __m256i exact =
          _mm256_or_si256(_mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x8000)), 16),
                                          _mm256_set1_epi32(0x7F800000)),
                          _mm256_slli_epi32(_mm256_and_si256(w, mantissa), 13));
      v = _mm256_blendv_ps(v, _mm256_castsi256_ps(exact), _mm256_castsi256_ps(nan));
    }
    store<kStream>(dst + i, v);
  }
  half_rows(src + 2 * i, n - i, dst + i, swapped);
}

template <bool kStream>
[[gnu::target("avx2")]] void double_avx2(const std::byte* src, std::size_t n, float* dst, bool swapped) {
  const std::size_t head = kStream ? head_elems(dst, n, 32) : 0;
  double_rows(src, head, dst, swapped);
  const __m256i swap = _mm256_broadcastsi128_si256(reversal(8));
  std::size_t i = head;
  for (; i + 8 <= n; i += 8) {
    const __m128 lo = _mm256_cvtpd_ps(load_doubles(src + 8 * i, swapped, swap));
    const __m128 hi = _mm256_cvtpd_ps(load_doubles(src + 8 * i + 32, swapped, swap));
    const __m256 v = _mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1);
    store<kStream>(dst + i, v);
  }
  double_rows(src + 8 * i, n - i, dst + i, swapped);
}

// float32 in the other byte order: the bytes of each element reversed, nothing else.
template <bool kStream>
[[gnu::target("avx512f,avx512bw")]] void swapped_float_avx512(const std::byte* src, std::size_t n, float* dst) {
  const std::size_t head = kStream ? head_elems(dst, n, 64) : 0;
  swapped_float_rows(src, head, dst);
  const __m512i swap = _mm512_broadcast_i32x4(reversal(4));
  std::size_t i = head;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_castsi512_ps(_mm512_shuffle_epi8(_mm512_loadu_si512(src + 4 * i), swap));
    store<kStream>(dst + i, v);
  }
  swapped_float_rows(src + 4 * i, n - i, dst + i);
}

template <bool kStream>
[[gnu::target("avx2")]] void swapped_float_avx2(const std::byte* src, std::size_t n, float* dst) {
  const std::size_t head = kStream ? head_elems(dst, n, 32) : 0;
  swapped_float_rows(src, head, dst);
  const __m256i swap = _mm256_broadcastsi128_si256(reversal(4));
  std::size_t i = head;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_castsi256_ps(
        _mm256_shuffle_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 4 * i)), swap));
    store<kStream>(dst + i, v);
  }
  swapped_float_rows(src + 4 * i, n - i, dst + i);
}

// Integers and bools to float32: widened to 32-bit lanes, then converted (exact up to 16 bits; int32 and uint32
// rounded to nearest, as the scalar conversion under the same MXCSR).
template <class T>
[[gnu::target("avx512f,avx512bw"), gnu::always_inline]] inline __m512 integers_avx512(const std::byte* p, bool swapped,
                                                                                      __m512i swap) {
  if constexpr (sizeof(T) == 1) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if constexpr (std::is_same_v<T, bool>) {
      const __mmask16 set = _mm512_test_epi32_mask(_mm512_cvtepu8_epi32(b), _mm512_set1_epi32(0xFF));
      return _mm512_maskz_mov_ps(set, _mm512_set1_ps(1.0f));
    } else if constexpr (std::is_signed_v<T>) {
      return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
    } else {
      return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b));
    }
  } else if constexpr (sizeof(T) == 2) {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    if (swapped) h = _mm256_shuffle_epi8(h, _mm512_castsi512_si256(swap));
    return _mm512_cvtepi32_ps(std::is_signed_v<T> ? _mm512_cvtepi16_epi32(h) : _mm512_cvtepu16_epi32(h));
  } else {
    __m512i w = _mm512_loadu_si512(p);
    if (swapped) w = _mm512_shuffle_epi8(w, swap);
    return std::is_signed_v<T> ? _mm512_cvtepi32_ps(w) : _mm512_cvtepu32_ps(w);
  }
}

template <class T, bool kStream>
[[gnu::target("avx512f,avx512bw")]] void integer_avx512(const std::byte* src, std::size_t n, float* dst, bool swapped) {
  const std::size_t head = kStream ? head_elems(dst, n, 64) : 0;
  integer_rows<T>(src, head, dst, swapped);
  const __m512i swap = _mm512_broadcast_i32x4(reversal(sizeof(T)));
  std::size_t i = head;
  for (; i + 16 <= n; i += 16) store<kStream>(dst + i, integers_avx512<T>(src + sizeof(T) * i, swapped, swap));
  integer_rows<T>(src + sizeof(T) * i, n - i, dst + i, swapped);
}

// The same with 8 lanes; no uint32 (AVX2 has no unsigned conversion).
template <class T>
[[gnu::target("avx2"), gnu::always_inline]] inline __m256 integers_avx2(const std::byte* p, bool swapped,
                                                                        __m128i swap) {
  if constexpr (sizeof(T) == 1) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    if constexpr (std::is_same_v<T, bool>) {
      const __m256i zero = _mm256_cmpeq_epi32(_mm256_cvtepu8_epi32(b), _mm256_setzero_si256());
      return _mm256_andnot_ps(_mm256_castsi256_ps(zero), _mm256_set1_ps(1.0f));
    } else if constexpr (std::is_signed_v<T>) {
      return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    } else {
      return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
    }
  } else if constexpr (sizeof(T) == 2) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if (swapped) h = _mm_shuffle_epi8(h, swap);
    return _mm256_cvtepi32_ps(std::is_signed_v<T> ? _mm256_cvtepi16_epi32(h) : _mm256_cvtepu16_epi32(h));
  } else {
    static_assert(std::is_same_v<T, std::int32_t>);
    __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    if (swapped) w = _mm256_shuffle_epi8(w, _mm256_broadcastsi128_si256(swap));
    return _mm256_cvtepi32_ps(w);
  }
}

template <class T, bool kStream>
[[gnu::target("avx2")]] void integer_avx2(const std::byte* src, std::size_t n, float* dst, bool swapped) {
  const std::size_t head = kStream ? head_elems(dst, n, 32) : 0;
  integer_rows<T>(src, head, dst, swapped);
  const __m128i swap = reversal(sizeof(T));
  std::size_t i = head;
  for (; i + 8 <= n; i += 8) store<kStream>(dst + i, integers_avx2<T>(src + sizeof(T) * i, swapped, swap));
  integer_rows<T>(src + sizeof(T) * i, n - i, dst + i, swapped);
}

// The integer loop for `type` and the chosen ISA (streamed or not); nullptr where there is none.
using IntegerLoop = void (*)(const std::byte*, std::size_t, float*, bool);

template <class T>
IntegerLoop integer_loop(bool wide, bool streamed) {
  if (wide) return streamed ? integer_avx512<T, true> : integer_avx512<T, false>;
  if constexpr (std::is_same_v<T, std::uint32_t>) {
    return nullptr;
  } else {
    return streamed ? integer_avx2<T, true> : integer_avx2<T, false>;
  }
}

IntegerLoop integer_loop(const ScalarType& type, bool wide, bool streamed) {
  switch (type.kind) {
    case 'b':
      return type.size == 1 ? integer_loop<bool>(wide, streamed) : nullptr;
    case 'i':
      if (type.size == 1) return integer_loop<std::int8_t>(wide, streamed);
      if (type.size == 2) return integer_loop<std::int16_t>(wide, streamed);
      if (type.size == 4) return integer_loop<std::int32_t>(wide, streamed);
      return nullptr;
    case 'u':
      if (type.size == 1) return integer_loop<std::uint8_t>(wide, streamed);
      if (type.size == 2) return integer_loop<std::uint16_t>(wide, streamed);
      if (type.size == 4) return integer_loop<std::uint32_t>(wide, streamed);
      return nullptr;
    default:
      return nullptr;
  }
}

enum class Isa { kBaseline, kAvx2, kAvx512 };

Isa isa() {
  static const Isa chosen = [] {
    if (use_avx512() && cpu_features().avx512bw) return Isa::kAvx512;
    if (cpu_features().avx2 && cpu_features().f16c) return Isa::kAvx2;
    return Isa::kBaseline;
  }();
  return chosen;
}
#endif

}  // namespace

bool converts_to_float32_vectorised(const ScalarType& type) {
#if NPYFEED_STREAMING_STORES
  if (isa() == Isa::kBaseline) return false;
  // float32 stored as float32 wants is a copy (convert's memcpy, streaming_copy), not a conversion.
  if (type.kind == 'f') return type.size != 4 || type.swapped;
  return integer_loop(type, isa() == Isa::kAvx512, false) != nullptr;
#else
  (void)type;
  return false;
#endif
}

void convert_to_float32(const std::byte* src, const ScalarType& type, std::size_t n, float* dst, bool streamed) {
#if NPYFEED_STREAMING_STORES
  if (converts_to_float32_vectorised(type)) {
    const bool wide = isa() == Isa::kAvx512;
    if (type.kind != 'f') {
      integer_loop(type, wide, streamed)(src, n, dst, type.swapped);
    } else if (type.size == 2) {
      if (wide) {
        (streamed ? half_avx512<true> : half_avx512<false>)(src, n, dst, type.swapped);
      } else {
        (streamed ? half_avx2<true> : half_avx2<false>)(src, n, dst, type.swapped);
      }
    } else if (type.size == 4) {
      if (wide) {
        (streamed ? swapped_float_avx512<true> : swapped_float_avx512<false>)(src, n, dst);
      } else {
        (streamed ? swapped_float_avx2<true> : swapped_float_avx2<false>)(src, n, dst);
      }
    } else if (wide) {
      (streamed ? double_avx512<true> : double_avx512<false>)(src, n, dst, type.swapped);
    } else {
      (streamed ? double_avx2<true> : double_avx2<false>)(src, n, dst, type.swapped);
    }
    if (streamed) stream_fence();
    return;
  }
#endif
  (void)streamed;
  convert(src, type, n, dst);
}

}  // namespace npyfeed::detail
