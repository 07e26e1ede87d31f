#include "npyfeed/common/settings.hpp"

#include <array>
#include <charconv>
#include <cstdlib>

namespace npyfeed::settings {

namespace {

constexpr std::array kTable{
    Setting{"NPYFEED_MAX_MAPPINGS", "the most files mapped at once in mode=\"mmap\" (replaces vm.max_map_count)"},
    Setting{"NPYFEED_POPULATE", "0: no background populate of the mappings of mode=\"mmap\""},
    Setting{"NPYFEED_IO_URING", "0: no io_uring for mode=\"read\" and \"direct\" (one pread per read)"},
    Setting{"NPYFEED_STREAMING",
            "1: every gather streams its output past the caches, 0: none (default: by batch size)"},
    Setting{"NPYFEED_PREFETCH",
            "1: rows read once are fetched with a non-temporal prefetch, 0: never (default: on AMD)"},
    Setting{"NPYFEED_AVX512", "0: streamed copies use SSE2 and AVX2 only, on a CPU with AVX-512 (read at start-up)"},
    Setting{"NPYFEED_CUDA_RUNTIME", "the CUDA runtime library that pin_memory loads (a path or a soname)"},
};

// The raw value of `name`, or nullopt when unset or empty: the one getenv of the core.
std::optional<std::string> value(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  return std::string(text);
}

// "0" false, "1" true, anything else nullopt.
std::optional<bool> switch_value(const char* name) {
  const auto text = value(name);
  if (text == "0") return false;
  if (text == "1") return true;
  return std::nullopt;
}

// A positive decimal integer, else nullopt.
std::optional<std::size_t> count_value(const char* name) {
  const auto text = value(name);
  if (!text) return std::nullopt;
  std::size_t count = 0;
  const char* end = text->data() + text->size();
  const auto [stop, error] = std::from_chars(text->data(), end, count);
  if (error != std::errc{} || stop != end || count == 0) return std::nullopt;
  return count;
}

}  // namespace

std::span<const Setting> table() noexcept { return kTable; }

std::optional<std::size_t> max_mappings() { return count_value("NPYFEED_MAX_MAPPINGS"); }
std::optional<bool> populate() { return switch_value("NPYFEED_POPULATE"); }
std::optional<bool> io_uring() { return switch_value("NPYFEED_IO_URING"); }
std::optional<bool> streaming() { return switch_value("NPYFEED_STREAMING"); }
std::optional<bool> prefetch() { return switch_value("NPYFEED_PREFETCH"); }
std::optional<bool> avx512() { return switch_value("NPYFEED_AVX512"); }
std::optional<std::string> cuda_runtime() { return value("NPYFEED_CUDA_RUNTIME"); }

}  // namespace npyfeed::settings
