// IndexShuffle: a bijection of [0, n) for every n tried, fixed by (seed, stream), and shuffled enough.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "check.hpp"
#include "npyfeed/common/errors.hpp"
#include "npyfeed/plan/index_shuffle.hpp"

using npyfeed::IndexShuffle;

namespace {

std::vector<std::uint64_t> all_of(const IndexShuffle& shuffle) {
  std::vector<std::uint64_t> out(shuffle.size());
  for (std::uint64_t i = 0; i < shuffle.size(); ++i) out[i] = shuffle(i);
  return out;
}

}  // namespace

TEST_CASE("a permutation of [0, n) for small, odd, power-of-two and just-past-power sizes") {
  for (std::uint64_t n : {1ull, 2ull, 3ull, 4ull, 5ull, 7ull, 15ull, 16ull, 17ull, 100ull, 255ull, 256ull, 257ull,
                          1000ull, 4095ull, 4097ull, 65536ull, 65537ull, 100003ull}) {
    for (std::uint64_t seed : {0ull, 1ull, 12345ull}) {
      std::vector<std::uint64_t> seen = all_of(IndexShuffle(n, seed, 0));
      std::sort(seen.begin(), seen.end());
      std::vector<std::uint64_t> expected(n);
      std::iota(expected.begin(), expected.end(), 0ull);
      CHECK(seen == expected);
    }
  }
}

TEST_CASE("the same seed and stream give the same order; others give other orders") {
  const std::uint64_t n = 10007;
  CHECK(all_of(IndexShuffle(n, 7, 3)) == all_of(IndexShuffle(n, 7, 3)));
  CHECK(all_of(IndexShuffle(n, 7, 3)) != all_of(IndexShuffle(n, 8, 3)));
  CHECK(all_of(IndexShuffle(n, 7, 3)) != all_of(IndexShuffle(n, 7, 4)));
}

TEST_CASE("the order is fixed across machines (golden values)") {
  // Pure 64-bit integer arithmetic: these values may only change with a deliberate, documented change of order.
  IndexShuffle shuffle(1000, 0, 0);
  std::vector<std::uint64_t> first;
  for (std::uint64_t i = 0; i < 8; ++i) first.push_back(shuffle(i));
  const std::vector<std::uint64_t> golden = {37, 595, 434, 108, 573, 164, 769, 196};
  CHECK(first == golden);
}

TEST_CASE("shuffled: few fixed points, positions move about n/3, halves mix") {
  const std::uint64_t n = 100000;
  IndexShuffle shuffle(n, 42, 0);
  std::uint64_t fixed = 0, in_first_half = 0;
  double displacement = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint64_t v = shuffle(i);
    fixed += v == i;
    displacement += v > i ? double(v - i) : double(i - v);
    if (i < n / 2) in_first_half += v < n / 2;
  }
  CHECK(fixed < 20);                   // about 1 expected
  CHECK(displacement / n > 0.30 * n);  // n/3 expected for a uniform permutation
  CHECK(displacement / n < 0.37 * n);
  CHECK(in_first_half > 0.48 * (n / 2));  // half expected
  CHECK(in_first_half < 0.52 * (n / 2));
}

TEST_CASE("sizes beyond 2^62 are refused") {
  CHECK_THROWS(npyfeed::InvalidArgument, IndexShuffle(std::uint64_t{1} << 62, 0, 0));
  CHECK(IndexShuffle((std::uint64_t{1} << 62) - 1, 0, 0)(12345) < (std::uint64_t{1} << 62));
  CHECK(IndexShuffle(0, 0, 0).size() == 0);
}
