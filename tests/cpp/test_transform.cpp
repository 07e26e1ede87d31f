// The gather's row transform (transform.hpp) against values computed here: column specs resolved with Python's
// slice semantics and numpy's negative indices; selection, NaN/inf replacement and normalisation for every
// combination of options, from float32/float64/int16 (both byte orders) sources, misaligned sources too; the
// same written past the caches (finish_streamed); mean and std broadcast to N-d rows; every construction error
// naming its argument and value. Then the whole gather in every read mode over C- and Fortran-order files.
// Mirrors tests/test_features.py.
#include <sys/mman.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "check.hpp"
#include "npy_writer.hpp"
#include "npyfeed/common/errors.hpp"
#include "npyfeed/gather/transform.hpp"
#include "npyfeed/gather/window_source.hpp"
#include "npyfeed/index/index.hpp"

using namespace npyfeed;
using npyfeed::test::contains;
using npyfeed::test::TempDir;

namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<std::int64_t> slice(std::uint64_t n, std::optional<std::int64_t> a, std::optional<std::int64_t> b,
                                std::optional<std::int64_t> c) {
  return ColumnSpec::slice(a, b, c).resolve(n, "features");
}

ScalarType scalar(char kind, std::uint32_t size, bool swapped = false) {
  ScalarType t;
  t.kind = kind;
  t.size = size;
  t.swapped = swapped;
  return t;
}

// The reference for one element: replaced (unset: kept), then normalised, in Out.
template <class Out>
Out reference(Out v, const TransformOptions& o, Out mean, Out std, bool normalize) {
  if (o.nan && std::isnan(v)) v = static_cast<Out>(*o.nan);
  if (o.posinf && v == std::numeric_limits<Out>::infinity()) v = static_cast<Out>(*o.posinf);
  if (o.neginf && v == -std::numeric_limits<Out>::infinity()) v = static_cast<Out>(*o.neginf);
  if (normalize) v = (v - mean) / std;
  return v;
}

bool same(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

// Normalised values: the gather multiplies by 1/std (rounded once), numpy divides: within a few ulp of Out.
template <class Out>
bool close(Out a, Out b) {
  const double eps = std::numeric_limits<Out>::epsilon();
  return same(a, b) ||
         std::abs(static_cast<double>(a) - b) <= 4 * eps * std::max(1.0, std::abs(static_cast<double>(b)));
}

// Source rows of 5 columns with NaN, +inf, -inf among ordinary values.
std::vector<double> poisoned_rows(std::size_t rows) {
  std::vector<double> v(rows * 5);
  for (std::size_t i = 0; i < v.size(); ++i) {
    v[i] = i % 7 == 3 ? kNan : i % 11 == 5 ? kInf : i % 13 == 8 ? -kInf : static_cast<double>(i % 17) * 0.75 - 4;
  }
  return v;
}

// Every combination of the four options, each with and without a selection, against `reference`.
template <class Out>
void check_all_combinations(const char* what, std::uint64_t misalign) {
  const std::size_t rows = 9;
  const std::vector<double> values = poisoned_rows(rows);
  std::vector<std::byte> storage(values.size() * sizeof(Out) + misalign);
  std::byte* src = storage.data() + misalign;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const Out v = static_cast<Out>(values[i]);
    std::memcpy(src + i * sizeof(Out), &v, sizeof(Out));
  }
  const ScalarType type = scalar('f', sizeof(Out));
  for (unsigned flags = 0; flags < 16; ++flags) {
    for (int select = 0; select < 3; ++select) {
      TransformOptions o;
      if (flags & 1) o.nan = -1.5;
      if (flags & 2) o.posinf = 1e6;
      if (flags & 4) o.neginf = -1e6;
      // A contiguous run, a scattered list with repeats (many short runs), or every column.
      std::vector<std::int64_t> cols = select == 0   ? std::vector<std::int64_t>{1, 2, 3}
                                       : select == 1 ? std::vector<std::int64_t>{4, 0, 0, 2}
                                                     : std::vector<std::int64_t>{0, 1, 2, 3, 4};
      if (select == 0) o.features = ColumnSpec::slice(1, 4, std::nullopt);
      if (select == 1) o.features = ColumnSpec::of(cols);
      const std::size_t n = cols.size();
      std::vector<double> mean(n), std(n);
      for (std::size_t j = 0; j < n; ++j) {
        mean[j] = 0.5 * static_cast<double>(j) - 1;
        std[j] = 0.25 + static_cast<double>(j);
      }
      if (flags & 8) {
        o.normalize = true;
        o.mean = mean;
        o.std = std;
        o.mean_shape = o.std_shape = {static_cast<std::int64_t>(n)};
      }
      const GatherTransform t(o, {5}, {}, sizeof(Out));
      CHECK_EQ(t.x().out_elems(), n);
      CHECK(t.x().identity() == (flags == 0 && select == 2));
      std::vector<Out> out(rows * n, static_cast<Out>(12345));
      t.x().apply<Out>(src, type, rows, out.data());
      // Read once (a selection fetches its next rows ahead): the same values.
      std::vector<Out> once(rows * n, static_cast<Out>(12345));
      t.x().apply<Out>(src, type, rows, once.data(), detail::SourceReuse::kOnce);
      CHECK(std::memcmp(once.data(), out.data(), out.size() * sizeof(Out)) == 0);
      int bad = 0;
      for (std::size_t r = 0; r < rows; ++r) {
        for (std::size_t j = 0; j < n; ++j) {
          const Out v = static_cast<Out>(values[r * 5 + static_cast<std::size_t>(cols[j])]);
          const Out want = reference<Out>(v, o, static_cast<Out>(mean[j]), static_cast<Out>(std[j]), flags & 8);
          if (!close<Out>(out[r * n + j], want) && bad++ < 3) {
            test::report(__FILE__, __LINE__,
                         std::string(what) + " flags " + std::to_string(flags) + " select " + std::to_string(select) +
                             " [" + std::to_string(r) + "][" + std::to_string(j) +
                             "]: " + std::to_string(out[r * n + j]) + " vs " + std::to_string(want));
          }
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("ColumnSpec: Python's slice semantics, numpy's negative indices") {
  CHECK(slice(6, std::nullopt, std::nullopt, std::nullopt) == (std::vector<std::int64_t>{0, 1, 2, 3, 4, 5}));
  CHECK(slice(6, 1, 4, std::nullopt) == (std::vector<std::int64_t>{1, 2, 3}));
  CHECK(slice(6, -2, std::nullopt, std::nullopt) == (std::vector<std::int64_t>{4, 5}));
  CHECK(slice(6, -100, 2, std::nullopt) == (std::vector<std::int64_t>{0, 1}));
  CHECK(slice(6, 2, 100, 3) == (std::vector<std::int64_t>{2, 5}));
  CHECK(slice(6, std::nullopt, std::nullopt, -2) == (std::vector<std::int64_t>{5, 3, 1}));
  CHECK(slice(6, 4, 0, -1) == (std::vector<std::int64_t>{4, 3, 2, 1}));
  CHECK(slice(6, 100, -100, -4) == (std::vector<std::int64_t>{5, 1}));
  CHECK(slice(6, -1, -3, -1) == (std::vector<std::int64_t>{5, 4}));
  CHECK(ColumnSpec::of({-1, 0, -6, 3, 3}).resolve(6, "x") == (std::vector<std::int64_t>{5, 0, 0, 3, 3}));
  auto e = CHECK_THROWS(InvalidArgument, ColumnSpec::of({0, 6}).resolve(6, "features"));
  CHECK(e && contains(e->what(), "features: column 6 (position 1) is out of range for rows of 6 columns"));
  e = CHECK_THROWS(InvalidArgument, ColumnSpec::of({-7}).resolve(6, "label_columns"));
  CHECK(e && contains(e->what(), "label_columns: column -7"));
  e = CHECK_THROWS(InvalidArgument, ColumnSpec::of({}).resolve(6, "features"));
  CHECK(e && contains(e->what(), "features: selects no columns"));
  e = CHECK_THROWS(InvalidArgument, slice(6, 3, 3, std::nullopt));
  CHECK(e && contains(e->what(), "features: slice(3, 3, None) selects no columns of rows of 6 columns"));
  e = CHECK_THROWS(InvalidArgument, slice(6, std::nullopt, std::nullopt, 0));
  CHECK(e && contains(e->what(), "features: slice step cannot be zero"));
}

TEST_CASE("RowTransform: every combination of options, float32 and float64, aligned and not") {
  check_all_combinations<float>("float32", 0);
  check_all_combinations<double>("float64", 0);
  check_all_combinations<float>("float32 misaligned", 1);
  check_all_combinations<double>("float64 misaligned", 4);
}

namespace {

// finish_streamed against finish_from over rows of `cols` columns (blocks of 256 elements and a short one) whose
// NaN and infinities sit in a few rows only (blocks with and without one): every option combination (normalised
// by multiplying by 1/std or by dividing by std), both ways
// of reading the source, the destination at every element offset mod 64 bytes, nothing outside it written, the
// source ending where its mapping does (a page that faults when read follows it).
template <class Out>
void check_streamed(std::size_t cols) {
  const std::size_t rows = 7;
  const std::size_t n = rows * cols;
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t pages = (n * sizeof(Out) + page - 1) / page;
  void* map = ::mmap(nullptr, (pages + 1) * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(map != MAP_FAILED);
  auto* src = reinterpret_cast<Out*>(static_cast<std::byte*>(map) + pages * page - n * sizeof(Out));
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t r = i / cols;
    const bool poisoned = r == 1 || r == 4;
    src[i] = static_cast<Out>(!poisoned     ? static_cast<double>(i % 19) * 0.5 - 3
                              : i % 7 == 3  ? kNan
                              : i % 11 == 5 ? kInf
                              : i % 13 == 8 ? -kInf
                                            : static_cast<double>(i % 17) * 0.75 - 4);
  }
  REQUIRE(::mprotect(static_cast<std::byte*>(map) + pages * page, page, PROT_NONE) == 0);
  constexpr std::size_t kGuard = 64 / sizeof(Out);
  int bad = 0;
  for (unsigned flags = 1; flags < 32; ++flags) {
    if ((flags & 16) && !(flags & 8)) continue;
    TransformOptions o;
    if (flags & 1) o.nan = -1.5;
    if (flags & 2) o.posinf = 1e6;
    if (flags & 4) o.neginf = -1e6;
    if (flags & 8) {
      o.normalize = true;
      for (std::size_t j = 0; j < cols; ++j) {
        o.mean.push_back(0.5 * static_cast<double>(j % 9) - 1);
        o.std.push_back(0.25 + static_cast<double>(j % 5));
      }
      // 16: a std whose reciprocal is subnormal in Out, so that every column is divided by its std.
      if (flags & 16) o.std.back() = sizeof(Out) == 4 ? 1e38 : 1e308;
      o.mean_shape = o.std_shape = {static_cast<std::int64_t>(cols)};
    }
    const GatherTransform t(o, {static_cast<std::int64_t>(cols)}, {}, sizeof(Out));
    std::vector<Out> want(n);
    t.x().finish_from<Out>(src, want.data(), rows);
    for (const auto reuse : {detail::SourceReuse::kOnce, detail::SourceReuse::kAgain}) {
      for (std::size_t offset = 0; offset < kGuard; ++offset) {
        std::vector<Out> out(n + 3 * kGuard, static_cast<Out>(12345));
        // 64-byte aligned storage: `offset` elements on, every address mod 64 an element can have.
        Out* dst =
            reinterpret_cast<Out*>((reinterpret_cast<std::uintptr_t>(out.data()) + 63) & ~std::uintptr_t{63}) + offset;
        t.x().finish_streamed<Out>(src, dst, rows, reuse);
        bool guards = true;
        for (Out* p = out.data(); p < dst; ++p) guards = guards && *p == static_cast<Out>(12345);
        for (Out* p = dst + n; p < out.data() + out.size(); ++p) guards = guards && *p == static_cast<Out>(12345);
        const bool equal = std::memcmp(dst, want.data(), n * sizeof(Out)) == 0;
        if ((!equal || !guards) && bad++ < 5) {
          test::report(__FILE__, __LINE__,
                       std::to_string(cols) + " columns, flags " + std::to_string(flags) + ", offset " +
                           std::to_string(offset) + (equal ? "" : ": values differ from finish_from") +
                           (guards ? "" : ": wrote outside the destination"));
        }
      }
    }
  }
  CHECK_EQ(bad, 0);
  ::munmap(map, (pages + 1) * page);
}

}  // namespace

TEST_CASE("RowTransform: finish_streamed writes finish_from's values, reads only its source") {
  for (std::size_t cols : {333, 256, 1024, 3}) {
    check_streamed<float>(cols);
    check_streamed<double>(cols);
  }
}

TEST_CASE("RowTransform: converting sources (int16 both orders, float64 to float32) select, replace, normalise") {
  // int16, big-endian: 3 rows of 4 columns, value r * 10 + c - 15.
  std::vector<std::byte> be(3 * 4 * 2), le(3 * 4 * 2);
  for (int i = 0; i < 12; ++i) {
    const auto v = static_cast<std::uint16_t>(static_cast<std::int16_t>((i / 4) * 10 + i % 4 - 15));
    be[2 * i] = static_cast<std::byte>(v >> 8);
    be[2 * i + 1] = static_cast<std::byte>(v & 0xff);
    le[2 * i] = static_cast<std::byte>(v & 0xff);
    le[2 * i + 1] = static_cast<std::byte>(v >> 8);
  }
  for (bool select : {false, true}) {
    TransformOptions o;
    if (select) o.features = ColumnSpec::of({3, 1});
    const std::int64_t n = select ? 2 : 4;
    o.normalize = true;
    o.mean = {2.0};  // a scalar-like (1,) broadcast
    o.mean_shape = {1};
    o.std = std::vector<double>(static_cast<std::size_t>(n), 4.0);
    o.std_shape = {n};
    const GatherTransform t(o, {4}, {}, 4);
    for (int order = 0; order < 2; ++order) {
      std::vector<float> out(static_cast<std::size_t>(3 * n));
      t.x().apply<float>(order == 0 ? be.data() : le.data(), scalar('i', 2, order == 0), 3, out.data());
      for (int r = 0; r < 3; ++r) {
        for (std::int64_t j = 0; j < n; ++j) {
          const std::int64_t c = select ? (j == 0 ? 3 : 1) : j;
          const float want = (static_cast<float>(r * 10 + c - 15) - 2.0f) / 4.0f;
          CHECK_EQ(out[static_cast<std::size_t>(r * n + j)], want);
        }
      }
    }
  }
  // float64 1e300 is +inf as a float32: replaced after the conversion, as nan_to_num on the float32 output.
  const double big[] = {1e300, -1e300, kNan, 2.5};
  TransformOptions o;
  o.posinf = 7.0;
  o.neginf = -7.0;
  o.nan = 0.0;
  const GatherTransform t(o, {4}, {}, 4);
  float out[4];
  t.x().apply<float>(reinterpret_cast<const std::byte*>(big), scalar('f', 8), 1, out);
  CHECK(out[0] == 7.0f && out[1] == -7.0f && out[2] == 0.0f && out[3] == 2.5f);
}

TEST_CASE("RowTransform: a std whose reciprocal is subnormal is divided by, exactly as numpy") {
  TransformOptions o;
  o.normalize = true;
  o.mean = {1.0};
  o.std = {1e38, 3.0};
  o.std_shape = {2};
  const GatherTransform t(o, {2}, {}, 4);
  const float row[] = {3e37f, 7.0f};
  float out[2];
  t.x().apply<float>(reinterpret_cast<const std::byte*>(row), scalar('f', 4), 1, out);
  CHECK_EQ(out[0], (3e37f - 1.0f) / 1e38f);  // 1/1e38 is below FLT_MIN: every column divides
  CHECK_EQ(out[1], (7.0f - 1.0f) / 3.0f);
}

TEST_CASE("GatherTransform: shapes, broadcasting to N-d rows, labels never normalised") {
  TransformOptions o;
  o.normalize = true;
  o.mean = {1, 2, 3};
  o.mean_shape = {3};
  o.std = {2, 4};
  o.std_shape = {2, 1};
  const GatherTransform t(o, {2, 3}, {}, 8);
  CHECK(t.x_row_shape() == (std::vector<std::int64_t>{2, 3}));
  CHECK(t.y_row_shape().empty());
  CHECK(t.y().identity());
  const double row[] = {10, 20, 30, 40, 50, 60};
  double out[6];
  t.x().apply<double>(reinterpret_cast<const std::byte*>(row), scalar('f', 8), 1, out);
  const double want[] = {(10 - 1) / 2., (20 - 2) / 2., (30 - 3) / 2., (40 - 1) / 4., (50 - 2) / 4., (60 - 3) / 4.};
  for (int i = 0; i < 6; ++i) CHECK_EQ(out[i], want[i]);

  TransformOptions sel;
  sel.features = ColumnSpec::of({5, 0});  // of the flattened (2, 3) row
  sel.label_columns = ColumnSpec::slice(std::nullopt, std::nullopt, -1);
  sel.nan = 1.0;
  const GatherTransform s(sel, {2, 3}, {3}, 4);
  CHECK(s.x_row_shape() == (std::vector<std::int64_t>{2}));
  CHECK(s.y_row_shape() == (std::vector<std::int64_t>{3}));
  CHECK(s.y().selects() && s.y().finishes());  // the replacement applies to labels too
  const float labels[] = {1, static_cast<float>(kNan), 3};
  float y[3];
  s.y().apply<float>(reinterpret_cast<const std::byte*>(labels), scalar('f', 4), 1, y);
  CHECK(y[0] == 3 && y[1] == 1 && y[2] == 1);
}

TEST_CASE("GatherTransform: bad means and stds name the argument and the value") {
  auto attempt = [](std::vector<double> mean, std::vector<std::int64_t> mean_shape, std::vector<double> std,
                    std::vector<std::int64_t> std_shape, std::uint32_t out_size = 4) {
    TransformOptions o;
    o.normalize = true;
    o.mean = std::move(mean);
    o.mean_shape = std::move(mean_shape);
    o.std = std::move(std);
    o.std_shape = std::move(std_shape);
    return GatherTransform(o, {3}, {}, out_size);
  };
  auto e = CHECK_THROWS(InvalidArgument, attempt({1, 2}, {2}, {1}, {}));
  CHECK(e && contains(e->what(), "normalize: mean of shape (2,) does not broadcast to the rows of shape (3,)"));
  e = CHECK_THROWS(InvalidArgument, attempt({1}, {}, {1, 1, 1, 1, 1, 1}, {2, 3}));
  CHECK(e && contains(e->what(), "normalize: std of shape (2, 3)"));
  e = CHECK_THROWS(InvalidArgument, attempt({1}, {}, {1, 0, 1}, {3}));
  CHECK(e && contains(e->what(), "normalize: std[1] is 0.0 (the std must be positive and finite as a float32)"));
  e = CHECK_THROWS(InvalidArgument, attempt({1}, {}, {-0.5}, {}));
  CHECK(e && contains(e->what(), "std[0] is -0.5"));
  e = CHECK_THROWS(InvalidArgument, attempt({1}, {}, {kNan}, {}));
  CHECK(e && contains(e->what(), "std[0] is nan"));
  e = CHECK_THROWS(InvalidArgument, attempt({1}, {}, {1e300}, {}));
  CHECK(e && contains(e->what(), "std[0] is 1e+300"));
  e = CHECK_THROWS(InvalidArgument, attempt({1}, {}, {1e-50}, {}));
  CHECK(e && contains(e->what(), "std[0] is 1e-50"));
  e = CHECK_THROWS(InvalidArgument, attempt({0, kInf, 0}, {3}, {1}, {}));
  CHECK(e && contains(e->what(), "normalize: mean[1] is inf (the mean must be finite"));
  attempt({0}, {}, {1e-50}, {}, 8);  // fine as a float64
  attempt({0}, {}, {1e300}, {}, 8);
}

TEST_CASE("the gather: every read mode, C and Fortran order, selection + replacement + normalisation") {
  TempDir dir;
  constexpr std::int64_t kRows = 30, kCols = 5, kWindow = 3;
  std::vector<double> factor = poisoned_rows(kRows);  // (30, 5)
  std::vector<double> label(kRows * 2);
  for (std::size_t i = 0; i < label.size(); ++i) label[i] = i % 9 == 4 ? kNan : static_cast<double>(i);
  auto write = [&](const std::string& path, const std::vector<double>& v, std::int64_t cols, bool fortran) {
    const std::int64_t rows = static_cast<std::int64_t>(v.size()) / cols;
    std::vector<std::byte> data(v.size() * 4);
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = 0; c < cols; ++c) {
        const float f = static_cast<float>(v[static_cast<std::size_t>(r * cols + c)]);
        const std::int64_t at = fortran ? c * rows + r : r * cols + c;
        std::memcpy(data.data() + at * 4, &f, 4);
      }
    }
    const std::string shape = "(" + std::to_string(rows) + ", " + std::to_string(cols) + ")";
    npyfeed::test::write_file(path, npyfeed::test::npy_header("<f4", shape, fortran), data);
  };
  for (bool fortran : {false, true}) {
    const std::string tag = fortran ? "F" : "C";
    const std::string fpath = (dir.path() / ("f" + tag + ".npy")).string();
    const std::string lpath = (dir.path() / ("l" + tag + ".npy")).string();
    write(fpath, factor, kCols, fortran);
    write(lpath, label, 2, fortran);
    for (ReadMode mode : {ReadMode::kMmap, ReadMode::kRead, ReadMode::kDirect}) {
      SampleIndex index;
      index.sources.push_back("index.txt");
      for (std::int64_t i = 0; i < 12; ++i)
        index.add(kWindow - 1 + (i * 7) % (kRows - kWindow + 1), i * 2, "k", 0, i + 1);
      WindowOptions w;
      w.window = kWindow;
      w.mode = mode;
      w.threads = 2;
      w.transform.features = ColumnSpec::of({4, 1, 1});
      w.transform.label_columns = ColumnSpec::of({1});
      w.transform.nan = 0.5;
      w.transform.posinf = 9;
      w.transform.neginf = -9;
      w.transform.normalize = true;
      w.transform.mean = {1, 2, 3};
      w.transform.mean_shape = {3};
      w.transform.std = {2};
      w.transform.std_shape = {1};
      auto source = std::make_shared<WindowSource>(index, w);
      source->start_open(shared_pool(), {fpath}, {lpath})->wait();
      source->finish_open();
      CHECK(source->x_shape() == (std::vector<std::int64_t>{kWindow, 3}));
      CHECK(source->y_shape() == (std::vector<std::int64_t>{1}));
      std::vector<std::int64_t> ids(source->size());
      for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int64_t>(i);
      std::vector<float> x(ids.size() * kWindow * 3, 12345.f), y(ids.size(), 12345.f);
      source
          ->start_gather(shared_pool(), ids, reinterpret_cast<std::byte*>(x.data()),
                         reinterpret_cast<std::byte*>(y.data()))
          ->wait();
      const std::int64_t cols[] = {4, 1, 1};
      int bad = 0;
      for (std::size_t i = 0; i < ids.size(); ++i) {
        const Sample s = source->sample(i);
        for (std::int64_t r = 0; r < kWindow; ++r) {
          for (int j = 0; j < 3; ++j) {
            const std::int64_t row = s.feature - kWindow + 1 + r;
            const float v = static_cast<float>(factor[static_cast<std::size_t>(row * kCols + cols[j])]);
            const float want = reference<float>(v, w.transform, static_cast<float>(j + 1), 2.0f, true);
            const float got = x[(i * kWindow + static_cast<std::size_t>(r)) * 3 + static_cast<std::size_t>(j)];
            if (!same(got, want) && bad++ < 3) {
              test::report(__FILE__, __LINE__,
                           tag + " mode " + std::to_string(static_cast<int>(mode)) + ": x[" + std::to_string(i) +
                               "]: " + std::to_string(got) + " vs " + std::to_string(want));
            }
          }
        }
        const float lv = static_cast<float>(label[static_cast<std::size_t>(s.label * 2 + 1)]);
        CHECK(same(y[i], std::isnan(lv) ? 0.5f : lv));
      }
    }
  }
}
