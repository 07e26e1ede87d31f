#include "npyfeed/gather/cpu_features.hpp"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

namespace npyfeed::detail {

namespace {

#if defined(__x86_64__) && defined(__GNUC__)
// XCR0, the register state the kernel saves on a context switch. Inline assembly rather than _xgetbv, which needs
// the function compiled for XSAVE; only called where CPUID says the OS enabled XGETBV (OSXSAVE).
std::uint64_t xgetbv0() {
  std::uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (std::uint64_t{hi} << 32) | lo;
}

CpuFeatures probe() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d) == 0) return f;
  const unsigned max_leaf = a;
  char vendor[12];
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  f.vendor.assign(vendor, sizeof vendor);

  __get_cpuid(1, &a, &b, &c, &d);
  const bool osxsave = (c & bit_OSXSAVE) != 0;
  const std::uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  const bool ymm_saved = (xcr0 & 0x6) == 0x6;    // SSE and AVX state
  const bool zmm_saved = (xcr0 & 0xe6) == 0xe6;  // and opmask, upper ZMM halves, ZMM16-31
  const bool avx = ymm_saved && (c & bit_AVX) != 0;
  f.f16c = avx && (c & bit_F16C) != 0;
  if (max_leaf >= 7) {
    __get_cpuid_count(7, 0, &a, &b, &c, &d);
    f.avx2 = avx && (b & bit_AVX2) != 0;
    f.avx512f = avx && zmm_saved && (b & bit_AVX512F) != 0;
    f.avx512bw = f.avx512f && (b & bit_AVX512BW) != 0;
  }
  return f;
}
#else
CpuFeatures probe() { return {}; }
#endif

}  // namespace

const CpuFeatures& cpu_features() noexcept {
  static const CpuFeatures features = probe();
  return features;
}

}  // namespace npyfeed::detail
