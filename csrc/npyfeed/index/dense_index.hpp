// Dense windows: every window ending at row i = W-1, W-1+stride, ... of every key, with label row i + horizon;
// windows whose label row would be past the end of the label array are left out. No index file and no memory
// per sample: the samples are one range of ids per key (key k holds ids [begin[k], begin[k + 1])), in key order,
// then row order, so the epoch orders and shards of index files apply unchanged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "npyfeed/gather/gather.hpp"

namespace npyfeed {

/// How dense windows are laid out over a key's rows.
struct DenseOptions {
  std::int64_t stride = 1;   // rows between the ends of consecutive windows, at least 1
  std::int64_t horizon = 0;  // label row = window's last row + horizon, at least 0
};

class DenseIndex {
 public:
  /// Throws InvalidArgument naming the argument and value for a stride below 1 or a horizon below 0.
  DenseIndex(DenseOptions options, std::int64_t window);

  /// Lays the windows out over keys whose factor arrays have `rows[k]` rows and label arrays `label_rows[k]`.
  void layout(const std::vector<std::int64_t>& rows, const std::vector<std::int64_t>& label_rows);
  /// Windows of key `key` (after layout()).
  std::uint64_t count(std::size_t key) const { return begin_[key + 1] - begin_[key]; }
  /// The first sample id of key `key` (after layout()).
  std::uint64_t first(std::size_t key) const { return begin_[key]; }
  std::size_t size() const noexcept { return begin_.empty() ? 0 : static_cast<std::size_t>(begin_.back()); }
  const DenseOptions& options() const noexcept { return options_; }
  /// The key holding sample `i` (< size()).
  std::uint32_t key_of(std::size_t i) const;
  /// Sample `i` (< size()): its window's last row, label row and key.
  Sample sample(std::size_t i) const;

 private:
  DenseOptions options_;
  std::int64_t window_;
  std::vector<std::uint64_t> begin_;  // per key, plus the end
};

}  // namespace npyfeed
