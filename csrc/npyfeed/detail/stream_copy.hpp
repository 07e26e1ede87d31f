// Copies into memory that is written once and read later by someone else (a batch being filled): stores that
// bypass the cache, so that a batch larger than the caches neither reads its destination in before
// overwriting it nor evicts the data still to be copied, and loads that leave the caches to the other threads.
#pragma once

#include <cstddef>
#include <cstdint>

namespace npyfeed::detail {

/// Output bytes of one batch from which a gather writes its windows with streaming_copy: beyond what the
/// caches keep between the gather and its consumer (measured in docs/benchmarks.md).
inline constexpr std::uint64_t kStreamedBatchBytes = std::uint64_t{16} << 20;
/// Copies shorter than this go through memcpy (streaming pays a fence each).
inline constexpr std::uint64_t kStreamedCopyBytes = std::uint64_t{4} << 10;

/// Whether gathers of `batch_bytes` output bytes stream them: NPYFEED_STREAMING=0 never, =1 always (tests,
/// benchmarks), else from kStreamedBatchBytes. Read from the environment at each call.
bool stream_batch(std::uint64_t batch_bytes);

/// How soon the source of a copy is read again: kOnce (by nothing soon: its lines are fetched ahead with a
/// non-temporal hint, so they do not displace what the caches hold for other threads) or kAgain (the next
/// copies read some of the same bytes, e.g. overlapping windows: it goes through the caches).
enum class SourceReuse { kOnce, kAgain };

/// memcpy's result, written with non-temporal stores where the CPU has them (x86-64: SSE2, AVX-512F when the
/// CPU and the kernel allow it), fenced: the bytes are visible to other threads once it returns, ordered as
/// memcpy's. No byte outside the source is read or fetched. Any alignment, any length; memcpy elsewhere.
void streaming_copy(std::byte* dst, const std::byte* src, std::size_t n, SourceReuse reuse) noexcept;

}  // namespace npyfeed::detail
