// A small data set in the users' layout for the C++ tests of streams and plans: six keys of (50, 3) float32
// factor files and (50,) label files whose values name their key and row, and an index of every window of
// every key, the keys interleaved (as an index may list them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "check.hpp"
#include "npy_writer.hpp"
#include "npyfeed/common/thread_pool.hpp"
#include "npyfeed/gather/window_source.hpp"
#include "npyfeed/index/index.hpp"

namespace npyfeed::test::window_files {

using npyfeed::test::TempDir;

constexpr std::int64_t kRows = 50;
constexpr std::int64_t kCols = 3;
constexpr std::int64_t kWindow = 4;
constexpr std::size_t kKeys = 6;
constexpr std::uint64_t kFactorBytes = kRows * kCols * 4;  // per key; labels add kRows * 4

struct Files {
  std::vector<std::string> factors;
  std::vector<std::string> labels;
};

inline Files write_files(const TempDir& dir) {
  Files f;
  for (std::size_t k = 0; k < kKeys; ++k) {
    std::vector<float> x(kRows * kCols), y(kRows);
    for (std::int64_t r = 0; r < kRows; ++r) {
      for (std::int64_t c = 0; c < kCols; ++c) x[r * kCols + c] = static_cast<float>(k * 1000 + r * 10 + c);
      y[r] = static_cast<float>(k * 100 + r);
    }
    auto bytes = [](const std::vector<float>& v) {
      std::vector<std::byte> b(v.size() * 4);
      std::memcpy(b.data(), v.data(), b.size());
      return b;
    };
    f.factors.push_back(dir.file("f" + std::to_string(k) + ".npy"));
    f.labels.push_back(dir.file("l" + std::to_string(k) + ".npy"));
    npyfeed::test::write_file(f.factors.back(), npyfeed::test::npy_header("<f4", "(50, 3)"), bytes(x));
    npyfeed::test::write_file(f.labels.back(), npyfeed::test::npy_header("<f4", "(50,)"), bytes(y));
  }
  return f;
}

// Every window of every key, keys interleaved (as an index may list them).
inline SampleIndex make_index() {
  SampleIndex index;
  index.sources.push_back("index.txt");
  std::uint64_t line = 0;
  for (std::int64_t r = kWindow - 1; r < kRows; ++r) {
    for (std::size_t k = 0; k < kKeys; ++k) index.add(r, kRows - 1 - r, std::string(1, char('a' + k)), 0, ++line);
  }
  return index;
}

inline std::shared_ptr<WindowSource> open_source(const Files& files, ReadMode mode) {
  WindowOptions o;
  o.window = kWindow;
  o.mode = mode;
  o.threads = 2;
  auto source = std::make_shared<WindowSource>(make_index(), o);
  source->start_open(shared_pool(), files.factors, files.labels)->wait();
  source->finish_open();
  return source;
}

inline std::vector<float> floats(const AlignedBuffer& b, std::size_t count) {
  std::vector<float> v(count);
  std::memcpy(v.data(), b.data(), count * 4);
  return v;
}

}  // namespace npyfeed::test::window_files
