// The one `.npy` writer of the C++ tests: header text as numpy writes it (any version, alignment and
// dtype text, so tests can also write what numpy never would), files in a temporary directory, and
// deterministic data; an environment variable set for a scope.
#pragma once

#include <stdlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace npyfeed::test {

/// Magic, version and the header length (2 bytes in version 1, 4 in versions 2 and 3), little-endian.
inline std::string preamble(int major, int minor, std::uint64_t text_len) {
  std::string p = "\x93NUMPY";
  p += static_cast<char>(major);
  p += static_cast<char>(minor);
  p += static_cast<char>(text_len & 0xff);
  p += static_cast<char>((text_len >> 8) & 0xff);
  if (major != 1) {
    p += static_cast<char>((text_len >> 16) & 0xff);
    p += static_cast<char>((text_len >> 24) & 0xff);
  }
  return p;
}

/// A header as numpy writes it: the dict, spaces, '\n', so that the data starts at a multiple of `align`.
inline std::string npy_text(const std::string& dict, int major = 1, std::size_t align = 64) {
  std::size_t pre = major == 1 ? 10 : 12;
  std::string text = dict;
  while ((pre + text.size() + 1) % align != 0) text += ' ';
  text += '\n';
  return preamble(major, 0, text.size()) + text;
}

/// The header dict; `descr` and `fortran` are literal text ("'<f4'", "False").
inline std::string dict_of(const std::string& descr, const std::string& shape, const std::string& fortran = "False") {
  return "{'descr': " + descr + ", 'fortran_order': " + fortran + ", 'shape': " + shape + ", }";
}

/// A whole header for dtype string `descr` ("<f4") and shape text ("(3, 4)").
inline std::string npy_header(const std::string& descr, const std::string& shape, bool fortran = false, int major = 1,
                              std::size_t align = 64) {
  return npy_text(dict_of("'" + descr + "'", shape, fortran ? "True" : "False"), major, align);
}

/// Deterministic bytes (a seeded LCG), different per seed.
inline std::vector<std::byte> pattern(std::size_t n, std::uint64_t seed) {
  std::vector<std::byte> out(n);
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& b : out) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    b = static_cast<std::byte>(x >> 56);
  }
  return out;
}

/// Writes `head` then `data` to `path`. Throws std::runtime_error.
inline void write_file(const std::string& path, const std::string& head, const std::vector<std::byte>& data) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) throw std::runtime_error("cannot write " + path);
  bool ok = std::fwrite(head.data(), 1, head.size(), f) == head.size();
  if (!data.empty()) ok = ok && std::fwrite(data.data(), 1, data.size(), f) == data.size();
  if (std::fclose(f) != 0 || !ok) throw std::runtime_error("cannot write " + path);
}

/// An environment variable set (or unset, for nullptr) for the scope, unset after it (the library's switches:
/// NPYFEED_STREAMING, NPYFEED_PREFETCH, NPYFEED_IO_URING).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (value == nullptr) {
      ::unsetenv(name);
    } else {
      ::setenv(name, value, 1);
    }
  }
  ~ScopedEnv() { ::unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

/// A directory removed with everything in it at the end of the scope.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "npyfeed-cpp-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace npyfeed::test
