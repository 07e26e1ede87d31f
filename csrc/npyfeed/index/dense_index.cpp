#include "npyfeed/index/dense_index.hpp"

#include <algorithm>
#include <string>

#include "npyfeed/common/errors.hpp"

namespace npyfeed {

DenseIndex::DenseIndex(DenseOptions options, std::int64_t window) : options_(options), window_(window) {
  if (options_.stride < 1) throw InvalidArgument("stride must be at least 1, got " + std::to_string(options_.stride));
  if (options_.horizon < 0) {
    throw InvalidArgument("horizon must be at least 0, got " + std::to_string(options_.horizon));
  }
}

void DenseIndex::layout(const std::vector<std::int64_t>& rows, const std::vector<std::int64_t>& label_rows) {
  begin_.assign(1, 0);
  for (std::size_t k = 0; k < rows.size(); ++k) {
    // Window ends i = W-1 + j * stride with i < rows and i + horizon < label_rows (in 128 bits: any int64 horizon).
    const __int128 last = std::min<__int128>(rows[k] - 1, static_cast<__int128>(label_rows[k]) - 1 - options_.horizon);
    const __int128 first = window_ - 1;
    const std::uint64_t n = last < first ? 0 : static_cast<std::uint64_t>((last - first) / options_.stride + 1);
    begin_.push_back(begin_.back() + n);
  }
}

std::uint32_t DenseIndex::key_of(std::size_t i) const {
  // The last key whose range starts at or before i (keys without windows have empty ranges).
  const auto it = std::upper_bound(begin_.begin(), begin_.end(), static_cast<std::uint64_t>(i));
  return static_cast<std::uint32_t>(it - begin_.begin() - 1);
}

Sample DenseIndex::sample(std::size_t i) const {
  const std::uint32_t key = key_of(i);
  const auto j = static_cast<std::int64_t>(i - begin_[key]);
  const std::int64_t end_row = window_ - 1 + j * options_.stride;
  return {end_row, end_row + options_.horizon, key, static_cast<std::uint32_t>(i)};
}

}  // namespace npyfeed
