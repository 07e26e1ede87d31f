#include "npyfeed/plan/index_shuffle.hpp"

#include <bit>
#include <string>

#include "npyfeed/common/errors.hpp"

namespace npyfeed {

namespace {

// splitmix64's finalizer: a bijective 64-bit mix whose every output bit depends on every input bit.
std::uint64_t mix64(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

IndexShuffle::IndexShuffle(std::uint64_t n, std::uint64_t seed, std::uint64_t stream) : n_(n) {
  if (n >= (std::uint64_t{1} << 62)) {
    throw InvalidArgument("cannot shuffle " + std::to_string(n) + " samples (at most 2^62)");
  }
  // bits = ceil(log2(n)), made even and at least 2, so that the domain splits into two equal halves.
  unsigned bits = n <= 1 ? 0u : static_cast<unsigned>(std::bit_width(n - 1));
  bits = bits < 2 ? 2u : bits + (bits & 1u);
  half_bits_ = bits / 2;
  half_mask_ = (std::uint64_t{1} << half_bits_) - 1;
  std::uint64_t state = mix64(seed ^ 0x5851F42D4C957F2Dull) ^ mix64(stream + 0x9E3779B97F4A7C15ull);
  for (auto& key : keys_) {
    state += 0x9E3779B97F4A7C15ull;  // splitmix64's sequence
    key = mix64(state);
  }
}

std::uint64_t IndexShuffle::permute_domain(std::uint64_t x) const noexcept {
  std::uint64_t left = x >> half_bits_;
  std::uint64_t right = x & half_mask_;
  for (const std::uint64_t key : keys_) {
    const std::uint64_t next = left ^ (mix64(right ^ key) & half_mask_);
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

std::uint64_t IndexShuffle::operator()(std::uint64_t position) const noexcept {
  std::uint64_t x = permute_domain(position);
  while (x >= n_) x = permute_domain(x);
  return x;
}

}  // namespace npyfeed
