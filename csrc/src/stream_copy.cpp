#include "npyfeed/detail/stream_copy.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <string>

namespace npyfeed::detail {

namespace {

// "491520K", "16M", "32768": bytes, or 0 where the text is not a size.
std::uint64_t parse_cache_size(const std::string& text) {
  std::size_t end = 0;
  std::uint64_t value = 0;
  try {
    value = std::stoull(text, &end);
  } catch (const std::exception&) {
    return 0;
  }
  std::string unit = text.substr(end);
  while (!unit.empty() && std::isspace(static_cast<unsigned char>(unit.back()))) unit.pop_back();
  if (unit.empty()) return value;
  if (unit == "K") return value << 10;
  if (unit == "M") return value << 20;
  if (unit == "G") return value << 30;
  return 0;
}

std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return in || in.eof() ? line : std::string();
}

}  // namespace

std::uint64_t last_level_cache_bytes(const std::string& cache_dir) noexcept {
  try {
    long best_level = 0;
    std::uint64_t best_bytes = 0;
    for (int i = 0; i < 16; ++i) {
      const std::string index = cache_dir + "/index" + std::to_string(i) + "/";
      const std::string type = first_line(index + "type");
      if (type != "Data" && type != "Unified") continue;
      const std::string level_text = first_line(index + "level");
      char* end = nullptr;
      const long level = std::strtol(level_text.c_str(), &end, 10);
      const std::uint64_t bytes = parse_cache_size(first_line(index + "size"));
      if (end == level_text.c_str() || bytes == 0) continue;
      if (level > best_level || (level == best_level && bytes > best_bytes)) {
        best_level = level;
        best_bytes = bytes;
      }
    }
    return best_bytes;
  } catch (...) {  // allocation failure: nothing known
    return 0;
  }
}

std::uint64_t last_level_cache_bytes() noexcept {
  const std::uint64_t cache = last_level_cache_bytes("/sys/devices/system/cpu/cpu0/cache");
#ifdef _SC_LEVEL3_CACHE_SIZE
  if (cache == 0) {
    const long l3 = ::sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (l3 > 0) return static_cast<std::uint64_t>(l3);
  }
#endif
  return cache;
}

std::uint64_t streamed_batch_bytes() noexcept {
  static const std::uint64_t bytes = std::max(kStreamedBatchBytes, last_level_cache_bytes() / 4);
  return bytes;
}

bool stream_batch(std::uint64_t batch_bytes) {
  const char* env = std::getenv("NPYFEED_STREAMING");
  if (env != nullptr && std::strcmp(env, "0") == 0) return false;
  if (env != nullptr && std::strcmp(env, "1") == 0) return true;
  return batch_bytes >= streamed_batch_bytes();
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

// __builtin_cpu_supports checks that the kernel saves the AVX-512 registers too (XGETBV); __builtin_cpu_init
// because this runs among the library's constructors.
const bool kHaveAvx512 = [] {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") != 0;
}();

}  // namespace
#endif

void streaming_copy(std::byte* dst, const std::byte* src, std::size_t n, SourceReuse reuse) noexcept {
#if NPYFEED_STREAMING_STORES
  if (n >= 128) {
    // Head to the first 64-byte boundary of dst and the tail after the last one through memcpy, the lines
    // between them streamed whole.
    const std::size_t head = (64 - (reinterpret_cast<std::uintptr_t>(dst) & 63u)) & 63u;
    const std::size_t body = (n - head) & ~std::size_t{63};
    std::memcpy(dst, src, head);
    const bool once = reuse == SourceReuse::kOnce;
    if (kHaveAvx512) {
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
