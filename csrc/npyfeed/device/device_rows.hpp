// Batches formed on a device (npyfeed.tf.dataset(gather="device")): everything the host does for them. The
// arrays a pipeline reads lie one after another, per kind (factors, labels), as one (rows + 1, row elements)
// array in a storage type whose last row is zeros; a batch is sent as start rows into it (four integers per
// sample) and the device forms the windows with one gather. Two layouts:
//
// * resident: every key the plan reads (its shard's keys under shard_by keys, else all), uploaded once;
// * streamed (shuffle="blocks" over more than the device holds): an epoch is cut into groups of consecutive
//   batches. The batches inside one block of the plan share one upload of that block's keys; a batch that
//   straddles blocks is a group of its own whose upload is its windows, one after another.
//
// Arrays are read through the source's own readers (its mode, its checks of a file replaced since it was
// opened, `.npz` members; a streamed block's files as shuffle="blocks" reads them, read_block_array) and converted by
// the gather's own conversion (read_converted_rows), to double where the data or the storage is float64, else to float,
// then rounded once to the storage type as numpy's astype does (float16 from a double directly; bfloat16 as ml_dtypes
// does, through float).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "npyfeed/common/aligned_buffer.hpp"
#include "npyfeed/plan/epoch_plan.hpp"

namespace npyfeed {

/// The type arrays are held in on the device.
enum class StorageType { kFloat16 = 0, kBFloat16 = 1, kFloat32 = 2, kFloat64 = 3 };  // values: tf_feed_abi.h

/// Parses "float16" / "bfloat16" / "float32" / "float64". Throws InvalidArgument.
StorageType parse_storage_type(const std::string& name);
/// Bytes of one item: 2, 2, 4, 8.
std::uint32_t storage_size(StorageType type) noexcept;
/// IEEE half-precision bits of `value`, rounded to nearest even (overflow to infinity), as numpy's astype.
std::uint16_t half_bits(double value) noexcept;
/// bfloat16 bits of `value`, rounded to nearest even (NaN stays NaN), as ml_dtypes' astype from float.
std::uint16_t bfloat16_bits(float value) noexcept;

/// Rows of several keys' arrays one after another, then one row of zeros, in a storage type.
struct HostRows {
  std::shared_ptr<AlignedBuffer> buffer;
  std::uint64_t rows = 0;  // the zero row included
  std::uint64_t row_elems = 0;
};

/// Where each sample of a batch lies in a layout: window row j of sample i is row start[i] + j of the factor
/// rows where lo[i] <= j < hi[i], the zero row elsewhere; its label is row label[i] of the label rows.
struct StartRows {
  std::vector<std::int64_t> start, lo, hi, label;
};

/// A streamed epoch's group: batches [first_batch, end_batch), inside blocks [first_block, last_block] of the
/// epoch's shard_blocks (one block; or, for a straddling batch alone, several).
struct DeviceGroup {
  std::size_t first_batch = 0;
  std::size_t end_batch = 0;
  std::size_t first_block = 0;
  std::size_t last_block = 0;
};

/// A streamed group's upload and its samples' start rows, batch after batch: batch i of the group is samples
/// [batch_ends[i - 1] (0 for the first), batch_ends[i]) of `rows`, as many as the plan's batch holds (the
/// epoch's last may be smaller).
struct GroupUpload {
  HostRows factors;
  HostRows labels;
  StartRows rows;
  std::vector<std::int64_t> batch_ends;
};

/// The host half of batches formed on a device, for the batches of `plan`. Thread-safe.
class DeviceRows {
 public:
  /// Throws InvalidArgument where the source transforms rows (features=, label_columns=, nan=, normalize=...):
  /// the device holds the arrays as they are.
  DeviceRows(std::shared_ptr<EpochPlan> plan, StorageType storage);

  const EpochPlan& plan() const noexcept { return *plan_; }
  StorageType storage() const noexcept { return storage_; }
  /// The keys the plan reads, ascending (EpochPlan::keys): its shard's under shard_by keys, else every key.
  const std::vector<std::uint32_t>& keys() const noexcept { return plan_->keys(); }
  /// Bytes of the resident layout: the arrays of keys() in the storage type, zero rows included.
  std::uint64_t resident_bytes() const noexcept;
  /// Streamed: the most bytes one group's upload can take (a block of keys whose data fits in half the
  /// plan's memory budget, or one larger key; or a straddling batch's windows).
  std::uint64_t largest_group_bytes() const;

  /// Resident: the factor (or label) arrays of keys(), read on the source's pool. Counted as uploaded.
  HostRows read_resident(bool label) const;
  /// Resident: the start rows of batch `batch` of epoch `epoch` (no IO). Counted as served.
  StartRows rows(std::uint64_t epoch, std::size_t batch) const;

  /// Streamed: epoch `epoch`'s groups (the last epoch's are kept).
  std::vector<DeviceGroup> groups(std::uint64_t epoch) const;
  /// Streamed: the bytes epoch `epoch`'s groups upload, counted without reading (each block's rows and zero
  /// rows, each straddling batch's windows).
  std::uint64_t streamed_epoch_bytes(std::uint64_t epoch) const;
  /// Streamed: group `index` of epoch `epoch`, read. Counted as uploaded, and its batches as served.
  /// Throws IndexOutOfRange for an index past the epoch's groups.
  GroupUpload group(std::uint64_t epoch, std::size_t index) const;

 private:
  // Where the arrays of some keys lie in a layout (-1: not there), and where its zero rows are.
  struct Layout {
    std::vector<std::int64_t> factor_first, label_first;
    std::int64_t factor_zero = 0, label_zero = 0;
  };
  Layout layout_of(const std::vector<std::uint32_t>& keys) const;
  // The arrays of `keys` in this order, zero row last. `whole_files`: as a block reads them (read_block_array:
  // files read whole and checked against the source's), else through the source's readers.
  HostRows read_keys(const std::vector<std::uint32_t>& keys, bool label, bool whole_files) const;
  // The start rows of samples `ids` (checked by the caller) in `layout`.
  StartRows start_rows(const std::vector<std::int64_t>& ids, const Layout& layout) const;
  HostRows straddler_windows(const std::vector<std::int64_t>& ids, bool label) const;
  std::int64_t label_rows(std::size_t key) const;
  // A streamed epoch: its groups, and the blocks they index (EpochPlan::shard_blocks).
  struct EpochGroups {
    std::uint64_t epoch;
    std::vector<DeviceGroup> groups;
    std::vector<ShardBlock> blocks;
  };
  std::shared_ptr<const EpochGroups> groups_of(std::uint64_t epoch) const;
  // The source's files checked unchanged (WindowSource::check_files_unchanged) at position 0 of an epoch, and at
  // the first position asked of any other epoch (a resumed one).
  void check_files_at_epoch_start(std::uint64_t epoch, std::size_t position) const;

  std::shared_ptr<EpochPlan> plan_;
  StorageType storage_;
  std::uint32_t wide_size_;  // 8 where the data or the storage is float64, else 4: what the gather converts to
  Layout resident_;
  std::uint64_t x_elems_, y_elems_;
  mutable std::mutex mutex_;  // the last epoch's groups
  mutable std::shared_ptr<const EpochGroups> last_epoch_;
  mutable std::atomic<std::uint64_t> files_checked_for_{0};  // the epoch last checked, plus 1 (0: none)
};

}  // namespace npyfeed
