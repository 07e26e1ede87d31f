// Copies into memory that is written once and read later by someone else (a batch being filled): stores that
// bypass the cache, so that a batch larger than the caches neither reads its destination in before
// overwriting it nor evicts the data still to be copied, and loads that leave the caches to the other threads.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define NPYFEED_STREAMING_STORES 1
#endif

namespace npyfeed::detail {

/// Output bytes of one batch from which a gather writes its windows with streaming_copy: beyond what the
/// caches keep between the gather and its consumer (measured in docs/benchmarks.md).
inline constexpr std::uint64_t kStreamedBatchBytes = std::uint64_t{16} << 20;
/// Copies shorter than this go through memcpy (streaming pays a fence each).
inline constexpr std::uint64_t kStreamedCopyBytes = std::uint64_t{4} << 10;

/// Whether gathers of `batch_bytes` output bytes stream them: NPYFEED_STREAMING=0 never, =1 always (tests,
/// benchmarks), else from kStreamedBatchBytes. Read from the environment at each call.
bool stream_batch(std::uint64_t batch_bytes);

/// Whether gathers fetch the source rows they read once with a non-temporal prefetch (SourceReuse::kOnce) or
/// leave them to the hardware's prefetchers (they pass kAgain): NPYFEED_PREFETCH=0 never, =1 always (tests,
/// benchmarks), else on AMD CPUs only. On AMD's Zen 2 the prefetch made the numpy iterator 1.11x and Keras
/// `fit` 1.28x faster; on an Intel Xeon it made every read-once path slower (streamed copies 0.6x, a selection
/// of every 4th column 0.67x): measured in docs/benchmarks.md. Read from the environment at each call.
bool prefetch_read_once();

/// Whether this process's streamed copies (streaming_copy) and the transform's streamed loops use AVX-512, where
/// the CPU has it and the kernel saves its registers: a whole 64-byte line a store. NPYFEED_AVX512=0 in the
/// environment at start-up keeps them to SSE2 and AVX2 (the other CPUs' path, on one that has AVX-512; older Intel
/// CPUs lower their clock for AVX-512). Decided once, at the first call.
bool use_avx512() noexcept;

/// Bytes from `p` to the next multiple of `align` (a power of two): where aligned stores can start; 0 when `p` is
/// aligned.
inline std::size_t bytes_to_boundary(const void* p, std::size_t align) noexcept {
  return (align - (reinterpret_cast<std::uintptr_t>(p) & (align - 1))) & (align - 1);
}

/// How soon the source of a copy is read again: kOnce (by nothing soon: its lines are fetched ahead with a
/// non-temporal hint, so they do not displace what the caches hold for other threads) or kAgain (the next
/// copies read some of the same bytes, e.g. overlapping windows: it goes through the caches).
enum class SourceReuse { kOnce, kAgain };

/// memcpy's result, written with non-temporal stores where the CPU has them (x86-64: SSE2, AVX-512F as
/// use_avx512() says), fenced: the bytes are visible to other threads once it returns, ordered as
/// memcpy's. No byte outside the source is read or fetched. Any alignment, any length; memcpy elsewhere.
void streaming_copy(std::byte* dst, const std::byte* src, std::size_t n, SourceReuse reuse) noexcept;

/// Bytes ahead of the one being read at which a streamed read fetches its source (see streaming_copy).
inline constexpr std::size_t kSourcePrefetchBytes = 1024;

/// Fetches the cache lines of [from, to) with a non-temporal hint, where the CPU has one (streaming_copy's
/// prefetch, for loops that read their source themselves). Touches no byte: the range may be past the data.
/// Inline (as stream_unfenced), for loops that call it once a row.
inline void prefetch_once(const std::byte* from, const std::byte* to) noexcept {
#if NPYFEED_STREAMING_STORES
  for (const std::byte* p = from; p < to; p += 64) _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_NTA);
#else
  (void)from;
  (void)to;
#endif
}

/// streaming_copy without the fence and without any prefetch: for a source just written by this thread (a block in
/// L1), many such stores fenced once by stream_fence().
inline void stream_unfenced(std::byte* dst, const std::byte* src, std::size_t n) noexcept {
#if NPYFEED_STREAMING_STORES
  const std::size_t head = std::min(n, bytes_to_boundary(dst, 64));
  const std::size_t body = (n - head) & ~std::size_t{63};
  std::memcpy(dst, src, head);
  for (std::size_t i = head; i < head + body; i += 16) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
  }
  std::memcpy(dst + head + body, src + head + body, n - head - body);
#else
  std::memcpy(dst, src, n);
#endif
}

/// Orders the stream_unfenced stores before this thread's next stores, and makes them visible.
inline void stream_fence() noexcept {
#if NPYFEED_STREAMING_STORES
  _mm_sfence();
#endif
}

}  // namespace npyfeed::detail
