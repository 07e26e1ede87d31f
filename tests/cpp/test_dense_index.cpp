// DenseIndex against a plain enumeration: strides, horizons, keys without windows, label arrays shorter than
// factor arrays, extreme horizons; the argument checks. Mirrors tests/test_dense.py.
#include <cstdint>
#include <limits>
#include <vector>

#include "check.hpp"
#include "npyfeed/common/errors.hpp"
#include "npyfeed/index/dense_index.hpp"

using namespace npyfeed;
using npyfeed::test::contains;

TEST_CASE("DenseIndex: every window of every key, in key then row order") {
  const std::vector<std::int64_t> rows{40, 3, 0, 23, 31};
  const std::vector<std::int64_t> label_rows{37, 3, 0, 23, 40};
  for (std::int64_t window : {1, 4, 10}) {
    for (std::int64_t stride : {1, 2, 5}) {
      for (std::int64_t horizon : {0, 1, 7}) {
        DenseIndex index({stride, horizon}, window);
        index.layout(rows, label_rows);
        std::vector<Sample> want;
        for (std::uint32_t k = 0; k < rows.size(); ++k) {
          for (std::int64_t i = window - 1; i < rows[k] && i + horizon < label_rows[k]; i += stride)
            want.push_back({i, i + horizon, k, 0});
        }
        REQUIRE(index.size() == want.size());
        for (std::size_t s = 0; s < want.size(); ++s) {
          const Sample got = index.sample(s);
          CHECK(got.feature == want[s].feature && got.label == want[s].label && got.key == want[s].key);
          CHECK_EQ(index.key_of(s), want[s].key);
        }
      }
    }
  }
}

TEST_CASE("DenseIndex: no window, extreme horizons, bad arguments") {
  DenseIndex none({1, 0}, 5);
  none.layout({4, 0}, {4, 0});
  CHECK_EQ(none.size(), 0u);
  DenseIndex far({1, std::numeric_limits<std::int64_t>::max()}, 1);
  far.layout({10}, {10});
  CHECK_EQ(far.size(), 0u);
  auto e = CHECK_THROWS(InvalidArgument, DenseIndex({0, 0}, 4));
  CHECK(e && contains(e->what(), "stride must be at least 1, got 0"));
  e = CHECK_THROWS(InvalidArgument, DenseIndex({1, -3}, 4));
  CHECK(e && contains(e->what(), "horizon must be at least 0, got -3"));
}
