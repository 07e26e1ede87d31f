#include "npyfeed/gather/stream_copy.hpp"

#include <cstring>

#include "npyfeed/common/settings.hpp"
#include "npyfeed/gather/cpu_features.hpp"

namespace npyfeed::detail {

bool stream_batch(std::uint64_t batch_bytes) {
  return settings::streaming().value_or(batch_bytes >= kStreamedBatchBytes);
}

bool prefetch_read_once() {
  static const bool on_this_cpu = cpu_features().vendor == "AuthenticAMD";
  return settings::prefetch().value_or(on_this_cpu);
}

#if NPYFEED_STREAMING_STORES
namespace {

// The source is read a few lines ahead with a non-temporal prefetch: its lines come in for this copy alone,
// without displacing what the caches hold for other threads (a training step's working set: Keras' Python ran
// 1.6x slower per step beside a gather whose source went through the caches), and the copy itself runs faster
// (measured in docs/benchmarks.md). Only lines of the source are fetched.
constexpr std::size_t kPrefetchAhead = kSourcePrefetchBytes;

template <bool kPrefetch>
inline void prefetch_source(const std::byte* src, std::size_t i, std::size_t n) noexcept {
  if (kPrefetch && i + kPrefetchAhead < n)
    _mm_prefetch(reinterpret_cast<const char*>(src + i + kPrefetchAhead), _MM_HINT_NTA);
}

// `n` a multiple of 64, `dst` 64-byte aligned.
template <bool kPrefetch>
void stream_sse2(std::byte* dst, const std::byte* src, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; i += 64) {
    prefetch_source<kPrefetch>(src, i, n);
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
}

template <bool kPrefetch>
__attribute__((target("avx512f"))) void stream_avx512(std::byte* dst, const std::byte* src, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; i += 64) {
    prefetch_source<kPrefetch>(src, i, n);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i), _mm512_loadu_si512(src + i));
  }
}

}  // namespace
#endif

bool use_avx512() noexcept {
#if NPYFEED_STREAMING_STORES
  // cpu_features() checks that the kernel saves the AVX-512 registers too (XGETBV).
  static const bool on = cpu_features().avx512f && settings::avx512().value_or(true);
  return on;
#else
  return false;
#endif
}

void streaming_copy(std::byte* dst, const std::byte* src, std::size_t n, SourceReuse reuse) noexcept {
#if NPYFEED_STREAMING_STORES
  if (n >= 128) {
    // Head to the first 64-byte boundary of dst and the tail after the last one through memcpy, the lines
    // between them streamed whole.
    const std::size_t head = bytes_to_boundary(dst, 64);
    const std::size_t body = (n - head) & ~std::size_t{63};
    std::memcpy(dst, src, head);
    const bool once = reuse == SourceReuse::kOnce;
    if (use_avx512()) {
      (once ? stream_avx512<true> : stream_avx512<false>)(dst + head, src + head, body);
    } else {
      (once ? stream_sse2<true> : stream_sse2<false>)(dst + head, src + head, body);
    }
    std::memcpy(dst + head + body, src + head + body, n - head - body);
    _mm_sfence();  // streaming stores are weakly ordered: visible before whatever this thread stores next
    return;
  }
#endif
  (void)reuse;
  std::memcpy(dst, src, n);
}

}  // namespace npyfeed::detail
