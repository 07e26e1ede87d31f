// The gather against values computed here: every source dtype in both byte orders, C and Fortran order,
// every read mode and arrays in memory, descriptors kept or reopened (and a file replaced meanwhile),
// the bounds policies error/skip/pad (int64 extremes included), float32 and float64 output, several
// threads; merge_runs on its own; the read-ahead stream. Mirrors tests/test_windows_gather.py.
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "check.hpp"
#include "npy_writer.hpp"
#include "npyfeed/common/errors.hpp"
#include "npyfeed/gather/gather.hpp"
#include "npyfeed/gather/window_source.hpp"
#include "npyfeed/index/index.hpp"
#include "npyfeed/plan/epoch_plan.hpp"
#include "npyfeed/stream/batch_stream.hpp"

using namespace npyfeed;
using npyfeed::test::contains;
using npyfeed::test::TempDir;

namespace {

constexpr std::int64_t kRows = 40;
constexpr std::int64_t kCols = 3;
constexpr std::int64_t kLabelCols = 2;
constexpr std::int64_t kWindow = 4;
const char* const kKeys[] = {"a", "b", "c"};

// Every dtype the gather converts, in both byte orders where it has one.
const char* const kDescrs[] = {"|b1", "|i1", "|u1", "<i2", ">i2", "<u2", ">u2", "<i4", ">i4", "<u4", ">u4",
                               "<i8", ">i8", "<u8", ">u8", "<f2", ">f2", "<f4", ">f4", "<f8", ">f8"};

// Small integers: exact in every dtype (float16 included), so the expected output is the value itself.
double factor_value(std::size_t key, std::int64_t row, std::int64_t col, bool boolean) {
  const std::int64_t v = (row * 7 + col * 3 + static_cast<std::int64_t>(key) * 11) % 100;
  return boolean ? static_cast<double>(v % 2) : static_cast<double>(v);
}
double label_value(std::size_t key, std::int64_t row, std::int64_t col, bool boolean) {
  const std::int64_t v = (row * 5 + col + static_cast<std::int64_t>(key) * 13 + 1) % 100;
  return boolean ? static_cast<double>(v % 2) : static_cast<double>(v);
}

std::uint16_t half_of_small_int(std::uint32_t v) {
  if (v == 0) return 0;
  const int e = std::bit_width(v) - 1;
  return static_cast<std::uint16_t>(((e + 15) << 10) | ((v << (10 - e)) & 0x3FFu));
}

// One element of `descr` holding `value`, in the descr's byte order.
void encode(const std::string& descr, double value, std::byte* out) {
  const char kind = descr[1];
  const int size = std::stoi(descr.substr(2));
  std::uint64_t bits = 0;
  if (kind == 'f' && size == 2) bits = half_of_small_int(static_cast<std::uint32_t>(value));
  if (kind == 'f' && size == 4) bits = std::bit_cast<std::uint32_t>(static_cast<float>(value));
  if (kind == 'f' && size == 8) bits = std::bit_cast<std::uint64_t>(value);
  if (kind == 'i' || kind == 'u' || kind == 'b') bits = static_cast<std::uint64_t>(static_cast<std::int64_t>(value));
  for (int k = 0; k < size; ++k) {
    const int at = descr[0] == '>' ? size - 1 - k : k;
    out[at] = static_cast<std::byte>((bits >> (8 * k)) & 0xff);
  }
}

// A (rows, cols) array (1-d where cols == 0) of `descr`, in C or Fortran order: element (r, c) = value(r, c).
template <class Value>
void write_array(const std::string& path, const std::string& descr, std::int64_t rows, std::int64_t cols, bool fortran,
                 Value value) {
  const std::int64_t width = std::max<std::int64_t>(cols, 1);
  const std::size_t size = static_cast<std::size_t>(std::stoi(descr.substr(2)));
  std::vector<std::byte> data(static_cast<std::size_t>(rows * width) * size);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < width; ++c) {
      const std::int64_t at = fortran ? c * rows + r : r * width + c;
      encode(descr, value(r, c), data.data() + static_cast<std::size_t>(at) * size);
    }
  }
  const std::string shape =
      cols == 0 ? "(" + std::to_string(rows) + ",)" : "(" + std::to_string(rows) + ", " + std::to_string(cols) + ")";
  npyfeed::test::write_file(path, npyfeed::test::npy_header(descr, shape, fortran), data);
}

struct Entry {
  std::int64_t feature;
  std::int64_t label;
  std::size_t key;
};

SampleIndex make_index(const std::vector<Entry>& entries) {
  SampleIndex index;
  index.sources.push_back("index.txt");
  for (std::size_t i = 0; i < entries.size(); ++i)
    index.add(entries[i].feature, entries[i].label, kKeys[entries[i].key], 0, i + 1);
  return index;
}

// Entries inside the arrays, keys interleaved, windows close together and far apart, repeats.
std::vector<Entry> inside_entries() {
  std::vector<Entry> out;
  for (std::int64_t i = 0; i < 30; ++i) {
    out.push_back({kWindow - 1 + (i * 13) % (kRows - kWindow + 1), (i * 17) % kRows, static_cast<std::size_t>(i % 3)});
  }
  out.push_back(out[4]);
  out.push_back({kRows - 1, 0, 1});
  out.push_back({kWindow - 1, kRows - 1, 1});
  return out;
}

// Writes factor and label files of one dtype for every key: dir/<descr>/{factor,label}/<key>.npy.
struct Files {
  std::vector<std::string> factors;
  std::vector<std::string> labels;
};

Files write_files(const TempDir& dir, const std::string& tag, const std::string& descr, bool fortran) {
  const bool boolean = descr[1] == 'b';
  const std::filesystem::path root = dir.path() / tag;
  std::filesystem::create_directories(root);
  Files files;
  for (std::size_t k = 0; k < std::size(kKeys); ++k) {
    files.factors.push_back((root / (std::string("f_") + kKeys[k] + ".npy")).string());
    files.labels.push_back((root / (std::string("l_") + kKeys[k] + ".npy")).string());
    write_array(files.factors.back(), descr, kRows, kCols, fortran,
                [&](std::int64_t r, std::int64_t c) { return factor_value(k, r, c, boolean); });
    write_array(files.labels.back(), descr, kRows, kLabelCols, fortran,
                [&](std::int64_t r, std::int64_t c) { return label_value(k, r, c, boolean); });
  }
  return files;
}

WindowOptions options_for(ReadMode mode, std::uint32_t out_size, Bounds bounds = Bounds::kError,
                          std::size_t threads = 2) {
  WindowOptions o;
  o.window = kWindow;
  o.out_size = out_size;
  o.bounds = bounds;
  o.mode = mode;
  o.threads = threads;
  return o;
}

std::shared_ptr<WindowSource> open_files(const std::vector<Entry>& entries, const Files& files,
                                         const WindowOptions& o) {
  auto source = std::make_shared<WindowSource>(make_index(entries), o);
  source->start_open(shared_pool(), files.factors, files.labels)->wait();
  source->finish_open();
  return source;
}

struct Batch {
  std::vector<std::byte> x;
  std::vector<std::byte> y;
};

Batch gather(WindowSource& source, const std::vector<std::int64_t>& ids) {
  // Garbage (NaN bytes) first, as in a recycled batch buffer: every output byte must be written.
  Batch b{std::vector<std::byte>(ids.size() * source.x_sample_bytes(), std::byte{0xff}),
          std::vector<std::byte>(ids.size() * source.y_sample_bytes(), std::byte{0xff})};
  source.start_gather(shared_pool(), ids, b.x.data(), b.y.data())->wait();
  return b;
}

double element(const std::vector<std::byte>& data, std::uint32_t out_size, std::size_t i) {
  if (out_size == 4) {
    float f;
    std::memcpy(&f, data.data() + i * 4, 4);
    return f;
  }
  double d;
  std::memcpy(&d, data.data() + i * 8, 8);
  return d;
}

// Compares a batch of `kept[ids[i]]` with the values the files hold (zeros outside the arrays).
void check_batch(const Batch& b, const std::vector<Entry>& kept, const std::vector<std::int64_t>& ids,
                 std::uint32_t out_size, bool boolean, const std::string& where) {
  int bad = 0;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const Entry& e = kept[static_cast<std::size_t>(ids[i])];
    for (std::int64_t w = 0; w < kWindow; ++w) {
      const __int128 row = static_cast<__int128>(e.feature) - kWindow + 1 + w;
      for (std::int64_t c = 0; c < kCols; ++c) {
        const double want =
            row >= 0 && row < kRows ? factor_value(e.key, static_cast<std::int64_t>(row), c, boolean) : 0.0;
        const double got =
            element(b.x, out_size, (i * kWindow + static_cast<std::size_t>(w)) * kCols + static_cast<std::size_t>(c));
        if (got != want && bad++ < 3) {
          test::report(__FILE__, __LINE__,
                       where + ": x[" + std::to_string(i) + "][" + std::to_string(w) + "][" + std::to_string(c) +
                           "] = " + std::to_string(got) + ", want " + std::to_string(want));
        }
      }
    }
    for (std::int64_t c = 0; c < kLabelCols; ++c) {
      const double want = e.label >= 0 && e.label < kRows ? label_value(e.key, e.label, c, boolean) : 0.0;
      const double got = element(b.y, out_size, i * kLabelCols + static_cast<std::size_t>(c));
      if (got != want && bad++ < 3) {
        test::report(__FILE__, __LINE__,
                     where + ": y[" + std::to_string(i) + "][" + std::to_string(c) + "] = " + std::to_string(got) +
                         ", want " + std::to_string(want));
      }
    }
  }
}

// Every sample in a scattered order (for n prime to 7).
std::vector<std::int64_t> all_ids_shuffled(std::size_t n) {
  std::vector<std::int64_t> ids(n);
  for (std::size_t i = 0; i < n; ++i) ids[i] = static_cast<std::int64_t>((i * 7 + 3) % n);  // repeats where 7 divides n
  return ids;
}

const char* mode_name(ReadMode mode) {
  return mode == ReadMode::kMmap ? "mmap" : mode == ReadMode::kRead ? "read" : "direct";
}

constexpr ReadMode kModes[] = {ReadMode::kMmap, ReadMode::kRead, ReadMode::kDirect};

}  // namespace

TEST_CASE("merge_runs: gaps, spans, empty ranges, every item once") {
  CHECK(merge_runs({}, 4, 100, 100).empty());
  const std::vector<RowRange> r{{0, 3}, {1, 4}, {9, 12}, {9, 9}, {30, 31}};
  auto runs = merge_runs(r, 1, 4, 100);  // 5 rows between [1, 4) and [9, 12): too far
  REQUIRE(runs.size() == 3u);
  CHECK(runs[0].begin == 0u && runs[0].end == 2u && runs[0].first == 0 && runs[0].end_row == 4);
  CHECK(runs[1].begin == 2u && runs[1].end == 4u && runs[1].first == 9 && runs[1].end_row == 12);
  CHECK(runs[2].begin == 4u && runs[2].end == 5u && runs[2].first == 30 && runs[2].end_row == 31);
  CHECK_EQ(merge_runs(r, 1, 5, 100).size(), 2u);
  CHECK_EQ(merge_runs(r, 1, 18, 100).size(), 1u);
  CHECK_EQ(merge_runs(r, 1, 18, 30).size(), 2u);  // [0, 31) would span 31 rows
  // A gap of exactly the limit merges; one byte more does not (the limit is in bytes: rows * row_bytes).
  CHECK_EQ(merge_runs(std::vector<RowRange>{{0, 2}, {7, 8}}, 4, 20, 1000).size(), 1u);
  CHECK_EQ(merge_runs(std::vector<RowRange>{{0, 2}, {7, 8}}, 4, 19, 1000).size(), 2u);
  // The span limit: 4 rows of 8 bytes fit in 32, a fifth does not.
  runs = merge_runs(std::vector<RowRange>{{0, 2}, {2, 4}, {4, 5}}, 8, 1000, 32);
  REQUIRE(runs.size() == 2u);
  CHECK(runs[0].end == 2u && runs[0].end_row == 4 && runs[1].first == 4);
  // Nested and repeated windows: one run covering them all.
  runs = merge_runs(std::vector<RowRange>{{5, 20}, {6, 8}, {6, 8}, {10, 25}}, 1, 0, 1000);
  REQUIRE(runs.size() == 1u);
  CHECK(runs[0].first == 5 && runs[0].end_row == 25 && runs[0].end == 4u);
  // Many ranges: every item in exactly one run, in order, its rows inside the run's.
  std::vector<RowRange> many;
  for (std::int64_t i = 0; i < 500; ++i) many.push_back({i * 3 + (i % 7), i * 3 + (i % 7) + 1 + i % 5});
  std::sort(many.begin(), many.end(), [](const RowRange& a, const RowRange& b) { return a.first < b.first; });
  runs = merge_runs(many, 16, 40, 400);
  std::size_t next = 0;
  for (const Run& run : runs) {
    CHECK_EQ(run.begin, next);
    CHECK(run.end > run.begin);
    CHECK(static_cast<std::uint64_t>(run.end_row - run.first) * 16 <= 400 || run.end == run.begin + 1);
    for (std::size_t k = run.begin; k < run.end; ++k) CHECK(many[k].first >= run.first && many[k].end <= run.end_row);
    next = run.end;
  }
  CHECK_EQ(next, many.size());
}

TEST_CASE("every dtype and byte order, C and Fortran order, every read mode, float32 and float64") {
  TempDir dir;
  const std::vector<Entry> entries = inside_entries();
  const std::vector<std::int64_t> ids = all_ids_shuffled(entries.size());
  for (const char* descr : kDescrs) {
    for (bool fortran : {false, true}) {
      const std::string tag = std::string(descr + 1) + (descr[0] == '>' ? "_be" : "") + (fortran ? "_F" : "_C");
      const Files files = write_files(dir, tag, descr, fortran);
      for (ReadMode mode : kModes) {
        for (std::uint32_t out : {4u, 8u}) {
          const std::string where =
              std::string(descr) + (fortran ? " F " : " C ") + mode_name(mode) + " out " + std::to_string(out);
          auto source = open_files(entries, files, options_for(mode, out));
          CHECK_EQ(source->size(), entries.size());
          CHECK(source->x_shape() == (std::vector<std::int64_t>{kWindow, kCols}));
          CHECK(source->y_shape() == (std::vector<std::int64_t>{kLabelCols}));
          check_batch(gather(*source, ids), entries, ids, out, descr[1] == 'b', where);
          const std::vector<std::int64_t> few{5, 5, 0, static_cast<std::int64_t>(entries.size() - 1)};
          check_batch(gather(*source, few), entries, few, out, descr[1] == 'b', where + " (few)");
        }
      }
    }
  }
}

TEST_CASE("windows copied with streaming stores: the same batches, every read mode, float32 and float64, pad") {
  // Windows of 17 rows x 61 columns: 4,148 bytes as float32, 8,296 as float64 (streamed from 4 KiB on), at
  // every offset mod 64 in the batch. ">f4" is converted, never streamed: the same answer either way.
  constexpr std::int64_t kWideRows = 300, kWideCols = 61, kWideWindow = 17;
  TempDir dir;
  std::vector<Entry> entries;
  for (std::int64_t i = 0; i < 64; ++i)
    entries.push_back({kWideWindow - 1 + (i * 37) % (kWideRows - kWideWindow + 1), (i * 11) % kWideRows,
                       static_cast<std::size_t>(i % 3)});
  entries.push_back({5, 0, 0});              // starts before the array: padded
  entries.push_back({kWideRows + 3, 1, 1});  // ends after it
  std::vector<std::int64_t> ids(entries.size());
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int64_t>((i * 7 + 3) % ids.size());
  for (const char* descr : {"<f4", "<f8", ">f4"}) {
    Files files;
    for (std::size_t k = 0; k < std::size(kKeys); ++k) {
      files.factors.push_back(dir.file(std::string(descr + 1) + "_f" + kKeys[k] + ".npy"));
      files.labels.push_back(dir.file(std::string(descr + 1) + "_l" + kKeys[k] + ".npy"));
      write_array(files.factors.back(), descr, kWideRows, kWideCols, false,
                  [&](std::int64_t r, std::int64_t c) { return factor_value(k, r, c, false); });
      write_array(files.labels.back(), descr, kWideRows, kLabelCols, false,
                  [&](std::int64_t r, std::int64_t c) { return label_value(k, r, c, false); });
    }
    for (ReadMode mode : kModes) {
      for (std::uint32_t out : {4u, 8u}) {
        const std::string where = std::string(descr) + " " + mode_name(mode) + " out " + std::to_string(out);
        WindowOptions o = options_for(mode, out, Bounds::kPad);
        o.window = kWideWindow;
        auto source = open_files(entries, files, o);
        Batch plain, streamed;
        {
          test::ScopedEnv streaming("NPYFEED_STREAMING", "0");
          plain = gather(*source, ids);
        }
        for (const char* prefetch : {"0", "1"}) {  // the source read once fetched ahead or not: the same bytes
          test::ScopedEnv streaming("NPYFEED_STREAMING", "1");
          test::ScopedEnv fetched_ahead("NPYFEED_PREFETCH", prefetch);
          streamed = gather(*source, ids);
          if (plain.x != streamed.x || plain.y != streamed.y)
            test::report(__FILE__, __LINE__, where + " prefetch " + prefetch + ": batches differ");
        }
        int bad = 0;
        for (std::size_t i = 0; i < ids.size(); ++i) {
          const Entry& e = entries[static_cast<std::size_t>(ids[i])];
          for (std::int64_t w = 0; w < kWideWindow; ++w) {
            const std::int64_t row = e.feature - kWideWindow + 1 + w;
            for (std::int64_t c = 0; c < kWideCols; ++c) {
              const double want = row >= 0 && row < kWideRows ? factor_value(e.key, row, c, false) : 0.0;
              const std::size_t at = (i * kWideWindow + static_cast<std::size_t>(w)) * kWideCols + c;
              if (element(streamed.x, out, at) != want && bad++ < 3)
                test::report(__FILE__, __LINE__, where + ": x[" + std::to_string(i) + "] differs");
            }
          }
        }
        CHECK_EQ(bad, 0);
      }
    }
  }
}

TEST_CASE("1-d labels and one-column Fortran factors") {
  TempDir dir;
  std::vector<std::string> factors, labels;
  for (std::size_t k = 0; k < std::size(kKeys); ++k) {
    factors.push_back(dir.file(std::string("f") + kKeys[k] + ".npy"));
    labels.push_back(dir.file(std::string("l") + kKeys[k] + ".npy"));
    write_array(factors.back(), "<f4", kRows, 1, true,
                [&](std::int64_t r, std::int64_t) { return factor_value(k, r, 0, false); });
    write_array(labels.back(), "<i8", kRows, 0, false,
                [&](std::int64_t r, std::int64_t) { return label_value(k, r, 0, false); });
  }
  const std::vector<Entry> entries = inside_entries();
  for (ReadMode mode : kModes) {
    auto source = std::make_shared<WindowSource>(make_index(entries), options_for(mode, 8));
    source->start_open(shared_pool(), factors, labels)->wait();
    source->finish_open();
    CHECK(source->y_shape().empty());
    Batch b = gather(*source, all_ids_shuffled(entries.size()));
    const std::vector<std::int64_t> ids = all_ids_shuffled(entries.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const Entry& e = entries[static_cast<std::size_t>(ids[i])];
      CHECK_EQ(element(b.y, 8, i), label_value(e.key, e.label, 0, false));
      for (std::int64_t w = 0; w < kWindow; ++w) {
        CHECK_EQ(element(b.x, 8, i * kWindow + static_cast<std::size_t>(w)),
                 factor_value(e.key, e.feature - kWindow + 1 + w, 0, false));
      }
    }
  }
}

TEST_CASE("bounds: error names file, line, key and rows; skip drops; pad reads zeros, int64 extremes included") {
  TempDir dir;
  const Files files = write_files(dir, "f4", "<f4", false);
  const std::int64_t kMin = std::numeric_limits<std::int64_t>::min();
  const std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  std::vector<Entry> entries = inside_entries();
  const std::size_t inside = entries.size();
  const std::vector<Entry> outside{{1, 0, 0},       {kRows, 3, 1},  {kRows + 2, 3, 2},
                                   {10, -1, 0},     {10, kRows, 1}, {kMin, kMin, 2},
                                   {kMax, kMax, 0}, {0, 5, 1},      {kRows + kWindow - 2, 2, 2}};
  entries.insert(entries.begin() + 3, outside.begin(), outside.end());
  for (ReadMode mode : kModes) {
    auto error = CHECK_THROWS(IndexOutOfRange, open_files(entries, files, options_for(mode, 4, Bounds::kError)));
    if (error) {
      const std::string m = error->what();
      CHECK(contains(m, "index.txt:4: key 'a'"));
      CHECK(contains(m, "window rows [-2, 2) outside"));
      CHECK(contains(m, files.factors[0]));
      CHECK(contains(m, "(40 rows)"));
      CHECK(contains(m, "bounds='skip'"));
    }
    auto skip = open_files(entries, files, options_for(mode, 4, Bounds::kSkip));
    CHECK_EQ(skip->size(), inside);
    CHECK_EQ(skip->skipped(), outside.size());
    const std::vector<Entry> kept = inside_entries();
    const std::vector<std::int64_t> ids = all_ids_shuffled(kept.size());
    check_batch(gather(*skip, ids), kept, ids, 4, false, std::string("skip ") + mode_name(mode));
    CHECK(contains(skip->describe(3), "index.txt:" + std::to_string(3 + outside.size() + 1) + ": key 'a'"));

    for (std::uint32_t out : {4u, 8u}) {
      auto pad = open_files(entries, files, options_for(mode, out, Bounds::kPad));
      CHECK_EQ(pad->size(), entries.size());
      CHECK_EQ(pad->skipped(), 0u);
      const std::vector<std::int64_t> all = all_ids_shuffled(entries.size());
      check_batch(gather(*pad, all), entries, all, out, false, std::string("pad ") + mode_name(mode));
      // Only the samples outside, alone and together (a run may then hold nothing but padding).
      std::vector<std::int64_t> out_ids;
      for (std::size_t k = 0; k < outside.size(); ++k) out_ids.push_back(static_cast<std::int64_t>(3 + k));
      check_batch(gather(*pad, out_ids), entries, out_ids, out, false, std::string("pad outside ") + mode_name(mode));
    }
  }
  const std::vector<Entry> bad_label{{10, 0, 0}, {10, kRows, 1}, {10, 0, 2}};
  auto label_error = CHECK_THROWS(IndexOutOfRange, open_files(bad_label, files, options_for(ReadMode::kRead, 4)));
  if (label_error)
    CHECK(
        contains(label_error->what(), "index.txt:2: key 'b': label row 40 outside " + files.labels[1] + " (40 rows)"));
}

TEST_CASE("arrays in memory: read in place, kept alive by their owner until the source is gone") {
  const std::vector<Entry> entries = inside_entries();
  auto released = std::make_shared<std::atomic<int>>(0);  // a pool worker may drop the last reference
  std::vector<std::vector<std::byte>> data;
  auto source = std::make_shared<WindowSource>(make_index(entries), options_for(ReadMode::kMmap, 4));
  for (std::size_t k = 0; k < std::size(kKeys); ++k) {
    for (bool label : {false, true}) {
      const std::int64_t cols = label ? kLabelCols : kCols;
      auto bytes = std::make_shared<std::vector<std::byte>>(static_cast<std::size_t>(kRows * cols) * 2);
      for (std::int64_t r = 0; r < kRows; ++r) {
        for (std::int64_t c = 0; c < cols; ++c) {
          encode(">i2", label ? label_value(k, r, c, false) : factor_value(k, r, c, false),
                 bytes->data() + static_cast<std::size_t>(r * cols + c) * 2);
        }
      }
      const std::byte* p = bytes->data();
      std::shared_ptr<const void> owner(bytes.get(), [bytes, released](const void*) mutable {
        bytes.reset();
        released->fetch_add(1);
      });
      source->set_memory_source(k, label, std::move(owner), p, {kRows, cols}, ">i2");
    }
  }
  source->finish_open();
  const std::vector<std::int64_t> ids = all_ids_shuffled(entries.size());
  check_batch(gather(*source, ids), entries, ids, 4, false, "memory");
  CHECK_EQ(released->load(), 0);
  source.reset();
  // A pool worker may still hold the finished gather (and so the source) for a moment.
  for (int i = 0; i < 5000 && released->load() < 6; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK_EQ(released->load(), 6);

  auto bad = std::make_shared<WindowSource>(make_index(entries), options_for(ReadMode::kMmap, 4));
  static const std::byte kData[16] = {};
  auto e = CHECK_THROWS(InvalidArgument, bad->set_memory_source(0, false, nullptr, kData, {2, 1}, "<c8"));
  if (e) CHECK(contains(e->what(), "factors['a']: dtype '<c8' cannot be converted"));
  CHECK_THROWS(InvalidArgument, bad->set_memory_source(0, true, nullptr, kData, {}, "<f4"));
}

TEST_CASE("more files than descriptors kept: each read reopens the file, and a replaced file is refused") {
  TempDir dir;
  const Files files = write_files(dir, "f8", "<f8", false);
  const std::vector<Entry> entries = inside_entries();
  struct rlimit old{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &old) == 0);
  struct rlimit low = old;
  low.rlim_cur = 128;  // keeping 6 descriptors needs 2 * (6 + 64) = 140
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  try {
    for (ReadMode mode : {ReadMode::kRead, ReadMode::kDirect}) {
      auto source = open_files(entries, files, options_for(mode, 8));
      const std::vector<std::int64_t> ids = all_ids_shuffled(entries.size());
      check_batch(gather(*source, ids), entries, ids, 8, false, std::string("reopened ") + mode_name(mode));
    }
    // Factor "b" replaced by another file under the same name after opening.
    auto source = open_files(entries, files, options_for(ReadMode::kRead, 8));
    const std::string replacement = dir.file("new.npy");
    write_array(replacement, "<f8", kRows, kCols, false, [](std::int64_t, std::int64_t) { return -1.0; });
    std::filesystem::rename(replacement, files.factors[1]);
    std::vector<std::int64_t> b_ids, other_ids;
    for (std::size_t i = 0; i < entries.size(); ++i)
      (entries[i].key == 1 ? b_ids : other_ids).push_back(static_cast<std::int64_t>(i));
    auto e = CHECK_THROWS(OsError, gather(*source, b_ids));
    if (e) {
      CHECK_EQ(e->error_number(), ESTALE);
      CHECK_EQ(e->path(), files.factors[1]);
    }
    check_batch(gather(*source, other_ids), entries, other_ids, 8, false, "other keys after a replacement");
  } catch (...) {
    ::setrlimit(RLIMIT_NOFILE, &old);
    throw;
  }
  ::setrlimit(RLIMIT_NOFILE, &old);
}

TEST_CASE("thread counts give the same batches; several gathers at once on one source") {
  TempDir dir;
  const Files files = write_files(dir, "u2", ">u2", true);
  const std::vector<Entry> entries = inside_entries();
  const std::vector<std::int64_t> ids = all_ids_shuffled(entries.size());
  for (ReadMode mode : kModes) {
    for (std::size_t threads : {1u, 3u, 8u}) {
      auto source = open_files(entries, files, options_for(mode, 4, Bounds::kError, threads));
      std::vector<Batch> batches(4);
      std::vector<std::shared_ptr<Job>> jobs;
      for (auto& b : batches) {
        b.x.resize(ids.size() * source->x_sample_bytes());
        b.y.resize(ids.size() * source->y_sample_bytes());
        jobs.push_back(source->start_gather(shared_pool(), ids, b.x.data(), b.y.data()));
      }
      for (auto& job : jobs) job->wait();
      for (const auto& b : batches) check_batch(b, entries, ids, 4, false, std::string("threads ") + mode_name(mode));
    }
  }
}

TEST_CASE("opening errors: missing files, mismatched rows, unconvertible dtypes, bad arguments and ids") {
  TempDir dir;
  Files files = write_files(dir, "f4", "<f4", false);
  const std::vector<Entry> entries = inside_entries();
  for (ReadMode mode : kModes) {
    Files missing = files;
    missing.labels[2] = dir.file("nope.npy");
    auto e = CHECK_THROWS(OsError, open_files(entries, missing, options_for(mode, 4)));
    if (e) {
      CHECK_EQ(e->error_number(), ENOENT);
      CHECK(contains(e->what(), "1 of 3 keys have no data file: key 'c': " + missing.labels[2]));
    }
  }
  write_array(dir.file("wide.npy"), "<f4", kRows, kCols + 1, false, [](std::int64_t, std::int64_t) { return 0.0; });
  Files wide = files;
  wide.factors[1] = dir.file("wide.npy");
  auto shape_error = CHECK_THROWS(InvalidArgument, open_files(entries, wide, options_for(ReadMode::kRead, 4)));
  if (shape_error)
    CHECK(
        contains(shape_error->what(), "rows of shape (4,) do not match " + files.factors[0] + " (rows of shape (3,))"));
  write_array(dir.file("complex.npy"), "<c8", kRows, kCols, false, [](std::int64_t, std::int64_t) { return 0.0; });
  Files complex_files = files;
  complex_files.factors[0] = dir.file("complex.npy");
  auto dtype_error = CHECK_THROWS(InvalidArgument, open_files(entries, complex_files, options_for(ReadMode::kMmap, 4)));
  if (dtype_error) CHECK(contains(dtype_error->what(), "dtype '<c8' cannot be converted"));

  WindowOptions zero_window = options_for(ReadMode::kRead, 4);
  zero_window.window = 0;
  CHECK_THROWS(InvalidArgument, WindowSource(make_index(entries), zero_window));
  WindowOptions bad_out = options_for(ReadMode::kRead, 2);
  CHECK_THROWS(InvalidArgument, WindowSource(make_index(entries), bad_out));
  CHECK_THROWS(InvalidArgument, WindowSource(make_index(entries), options_for(ReadMode::kRead, 4, Bounds::kError, 0)));
  CHECK_THROWS(InvalidArgument, parse_out_dtype("float16"));
  CHECK_THROWS(InvalidArgument, parse_bounds("clip"));
  CHECK(parse_bounds("pad") == Bounds::kPad);

  auto source = open_files(entries, files, options_for(ReadMode::kRead, 4));
  auto id_error = CHECK_THROWS(IndexOutOfRange, gather(*source, {0, static_cast<std::int64_t>(entries.size())}));
  if (id_error) CHECK(contains(id_error->what(), "sample id 33 out of range for 33 samples"));
  CHECK_THROWS(IndexOutOfRange, gather(*source, {-1}));
  Batch empty = gather(*source, {});
  CHECK(empty.x.empty() && empty.y.empty());
}

TEST_CASE("BatchStream: batches in order, the remainder, read-ahead closed from another thread") {
  TempDir dir;
  const Files files = write_files(dir, "i4", "<i4", false);
  const std::vector<Entry> entries = inside_entries();
  auto source = open_files(entries, files, options_for(ReadMode::kRead, 4));
  const std::vector<std::int64_t> order = all_ids_shuffled(entries.size());
  for (bool drop : {false, true}) {
    BatchStream stream(source, order, EpochSpec(Shuffle::kNone, 0, 1, 0, 5, drop, 0), 3, 1);
    CHECK_EQ(stream.num_batches(), drop ? entries.size() / 5 : (entries.size() + 4) / 5);
    std::size_t batch = 1;
    while (auto job = stream.next_job()) {
      job->wait();
      BatchStream::Batch b = stream.take();
      const std::size_t first = batch * 5;
      std::vector<std::int64_t> ids(order.begin() + static_cast<std::ptrdiff_t>(first),
                                    order.begin() + static_cast<std::ptrdiff_t>(first + b.count));
      Batch copy{std::vector<std::byte>(b.x->data(), b.x->data() + b.count * source->x_sample_bytes()),
                 std::vector<std::byte>(b.y->data(), b.y->data() + b.count * source->y_sample_bytes())};
      check_batch(copy, entries, ids, 4, false, "stream batch " + std::to_string(batch));
      ++batch;
    }
    CHECK_EQ(batch, stream.num_batches());
  }
  const EpochSpec by_two(Shuffle::kNone, 0, 1, 0, 2, false, 0);
  CHECK_THROWS(IndexOutOfRange, BatchStream(source, std::vector<std::int64_t>{0, 99}, by_two, 2, 0));

  BatchStream stream(source, order, by_two, 4, 0);
  auto job = stream.next_job();
  REQUIRE(job != nullptr);
  std::thread closer([&] { stream.close(); });
  closer.join();
  CHECK(stream.take().count == 0u);
  CHECK(stream.next_job() == nullptr);
}
