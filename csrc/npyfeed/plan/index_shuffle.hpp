// A seeded permutation of [0, n) evaluated one position at a time in O(1) memory: what lets an epoch over tens of
// millions of samples be shuffled without materialising (and holding, in every process) an 8-byte-per-sample
// permutation.
#pragma once

#include <array>
#include <cstdint>

namespace npyfeed {

/// A bijection of [0, n) chosen by (seed, stream): a balanced Feistel network over the smallest power-of-two
/// domain of an even number of bits (at least 2) that holds n, walked back into [0, n) ("cycle walking": since
/// the network permutes the domain, following it from a position in [0, n) reaches [0, n) again, after fewer
/// than 4 steps on average). Pure integer arithmetic: the same (n, seed, stream) gives the same permutation on
/// every machine and compiler. Throws InvalidArgument for n >= 2^62.
class IndexShuffle {
 public:
  static constexpr int kRounds = 8;

  IndexShuffle(std::uint64_t n, std::uint64_t seed, std::uint64_t stream);
  std::uint64_t size() const noexcept { return n_; }
  /// The element at `position` (< size()) of the permutation.
  std::uint64_t operator()(std::uint64_t position) const noexcept;

 private:
  std::uint64_t permute_domain(std::uint64_t x) const noexcept;

  std::uint64_t n_;
  unsigned half_bits_ = 1;
  std::uint64_t half_mask_ = 1;
  std::array<std::uint64_t, kRounds> keys_{};
};

}  // namespace npyfeed
