// The environment variables the C++ core reads, read here and nowhere else: their table (name, what it does) and
// one accessor each, all parsed by the same three rules. The Python package reads its own variables in one place
// too (python/npyfeed/_resources.py); npyfeed.settings() lists both tables with their current values.
//
// Each accessor reads the environment when called (a test or a benchmark may change a variable between two
// calls); a caller that decides once, at start-up, says so. A value that does not parse is ignored: the default
// applies, as when the variable is unset.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>

namespace npyfeed::settings {

/// One environment variable the core reads.
struct Setting {
  const char* name;
  const char* meaning;
};

/// Every environment variable the core reads, in the order of docs/one-node.md's table.
std::span<const Setting> table() noexcept;

/// NPYFEED_MAX_MAPPINGS: the most mappings the process may hold (replaces vm.max_map_count); a positive integer.
std::optional<std::size_t> max_mappings();
/// NPYFEED_POPULATE: "0" turns off the background populate of the mappings of mode="mmap".
std::optional<bool> populate();
/// NPYFEED_IO_URING: "0" keeps reads off io_uring (one pread per read).
std::optional<bool> io_uring();
/// NPYFEED_STREAMING: "1" streams every gather's output (non-temporal stores), "0" none; unset: by batch size.
std::optional<bool> streaming();
/// NPYFEED_PREFETCH: "1" fetches the rows read once with a non-temporal prefetch, "0" never; unset: by CPU.
std::optional<bool> prefetch();
/// NPYFEED_AVX512: "0" keeps streamed copies to SSE2 and AVX2 on a CPU with AVX-512.
std::optional<bool> avx512();
/// NPYFEED_CUDA_RUNTIME: the CUDA runtime library pin_memory loads (a path or a soname).
std::optional<std::string> cuda_runtime();

}  // namespace npyfeed::settings
