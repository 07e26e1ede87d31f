#include "npyfeed/epoch_order.hpp"

#include <numeric>
#include <string>

#include "npyfeed/errors.hpp"

namespace npyfeed {

namespace {

std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

class Xoshiro256 {
 public:
  Xoshiro256(std::uint64_t seed, std::uint64_t stream) {
    std::uint64_t sm = seed ^ (0xD1B54A32D192ED03ull * (stream + 1));
    for (auto& word : s_) word = splitmix64(sm);
  }
  std::uint64_t next() {
    const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, range), unbiased (Lemire).
  std::uint64_t below(std::uint64_t range) {
    __uint128_t m = static_cast<__uint128_t>(next()) * range;
    auto low = static_cast<std::uint64_t>(m);
    if (low < range) {
      const std::uint64_t threshold = (0 - range) % range;
      while (low < threshold) {
        m = static_cast<__uint128_t>(next()) * range;
        low = static_cast<std::uint64_t>(m);
      }
    }
    return static_cast<std::uint64_t>(m >> 64);
  }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::uint64_t s_[4];
};

}  // namespace

std::vector<std::int64_t> epoch_permutation(std::size_t n, std::uint64_t seed, std::uint64_t epoch) {
  std::vector<std::int64_t> order(n);
  std::iota(order.begin(), order.end(), std::int64_t{0});
  Xoshiro256 rng(seed, epoch);
  for (std::size_t i = n; i > 1; --i) {
    std::size_t j = static_cast<std::size_t>(rng.below(i));
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

std::vector<std::int64_t> epoch_order(std::size_t n, bool shuffle, std::uint64_t seed, std::uint64_t epoch,
                                      std::size_t num_shards, std::size_t shard_index) {
  if (num_shards < 1 || shard_index >= num_shards) {
    throw InvalidArgument("shard_index must be in [0, " + std::to_string(num_shards) + "), got " +
                          std::to_string(shard_index));
  }
  std::vector<std::int64_t> all;
  if (shuffle) {
    all = epoch_permutation(n, seed, epoch);
  } else {
    all.resize(n);
    std::iota(all.begin(), all.end(), std::int64_t{0});
  }
  std::vector<std::int64_t> shard;
  shard.reserve(n / num_shards + 1);
  for (std::size_t i = shard_index; i < n; i += num_shards) shard.push_back(all[i]);
  return shard;
}

}  // namespace npyfeed
