// detail::cpu_features against the compiler's own answer (__builtin_cpu_supports, from GCC's libgcc or LLVM's
// compiler-rt, which these tests link) and against /proc/cpuinfo's flags, which the kernel lists only where it
// saves the registers too; use_avx512 follows it.
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "check.hpp"
#include "npyfeed/gather/cpu_features.hpp"
#include "npyfeed/gather/stream_copy.hpp"

using namespace npyfeed;

namespace {

// The first "flags" line of /proc/cpuinfo, split; empty where there is none.
std::set<std::string> cpuinfo_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::set<std::string> flags;
    for (std::string w; words >> w;) flags.insert(w);
    return flags;
  }
  return {};
}

}  // namespace

#if defined(__x86_64__) && defined(__GNUC__)
TEST_CASE("cpu_features: as __builtin_cpu_supports says") {
  __builtin_cpu_init();
  const auto& f = detail::cpu_features();
  CHECK_EQ(f.avx2, __builtin_cpu_supports("avx2") != 0);
  CHECK_EQ(f.f16c, __builtin_cpu_supports("f16c") != 0);
  CHECK_EQ(f.avx512f, __builtin_cpu_supports("avx512f") != 0);
  CHECK_EQ(f.avx512bw, __builtin_cpu_supports("avx512bw") != 0);
  CHECK(f.vendor.size() == 12);
}

TEST_CASE("cpu_features: as /proc/cpuinfo says") {
  const auto flags = cpuinfo_flags();
  if (flags.empty()) return;  // no /proc: nothing to compare with
  const auto& f = detail::cpu_features();
  CHECK_EQ(f.avx2, flags.count("avx2") == 1);
  CHECK_EQ(f.f16c, flags.count("f16c") == 1);
  CHECK_EQ(f.avx512f, flags.count("avx512f") == 1);
  CHECK_EQ(f.avx512bw, flags.count("avx512bw") == 1);
}
#endif

TEST_CASE("use_avx512: the CPU's AVX-512F unless NPYFEED_AVX512=0") {
  const char* env = std::getenv("NPYFEED_AVX512");
  const bool off = env != nullptr && std::string(env) == "0";
  CHECK_EQ(detail::use_avx512(), detail::cpu_features().avx512f && !off);
}
