// What this CPU can run, asked of the CPU itself (CPUID, and XGETBV for the registers the kernel saves): the one
// place the run-time choice of the AVX-512, AVX2 and baseline kernels reads. It does not go through
// __builtin_cpu_supports, whose answer comes from the compiler's runtime library: the one of a toolchain that
// targets an old glibc (zig's, for the manylinux wheels) answers "no" to every feature, which would silently
// keep every kernel on the baseline ISA.
#pragma once

#include <string>

namespace npyfeed::detail {

/// The features the core's kernels are chosen by, each usable: the CPU has it and the kernel saves the registers
/// it needs (YMM for AVX2 and F16C, ZMM and mask registers for AVX-512), as GCC's __builtin_cpu_supports defines
/// them. All false off x86-64.
struct CpuFeatures {
  bool avx2 = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  /// CPUID's vendor string ("GenuineIntel", "AuthenticAMD"), or "" where there is none.
  std::string vendor;
};

/// This CPU's features, probed once (thread-safe).
const CpuFeatures& cpu_features() noexcept;

}  // namespace npyfeed::detail
