// The gather: one batch of window samples copied from per-key arrays into contiguous (B, W, ...) and
// (B, ...) buffers, converting the element type on the way. A batch is planned once (samples grouped by
// key, in order of first row), then each key is one work item: nearby rows are merged into runs read with
// one call each (merge_runs), fetched from the key's ArrayReader, transposed when the file is in Fortran
// order, converted (with the source's column selection, replacement and normalisation: transform.hpp), and
// zero-padded where a window (or label row) lies outside its array. Where the readers queue their reads
// (ArrayReader::queue_depth, read_queue.hpp), a work item of several keys queues every window read of its
// keys first, waits for them together, then converts: one thread keeps many reads in flight.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "npyfeed/gather/transform.hpp"
#include "npyfeed/io/array_reader.hpp"

namespace npyfeed {

/// One factor or label array of a key.
struct ArraySource {
  std::shared_ptr<ArrayReader> reader;

  const std::string& name() const { return reader->name(); }
  const NpyHeader& header() const { return reader->header(); }
  std::int64_t rows() const { return header().shape.empty() ? 0 : header().shape[0]; }
  /// Elements per row (the product of the dimensions after the first).
  std::uint64_t row_elems() const;
};

/// A sample kept after the bounds policy: window rows [feature - W + 1, feature + 1) of its key's factor
/// array and row `label` of its key's label array (rows outside an array read as zeros).
struct Sample {
  std::int64_t feature;
  std::int64_t label;
  std::uint32_t key;
  std::uint32_t index_pos;  // line in the index (for messages)
};

/// Rows [first, end) of one array that one item of a sorted list needs.
struct RowRange {
  std::int64_t first;
  std::int64_t end;
};

/// Items [begin, end) of the list, whose rows all lie in [first, end_row): read with one call.
struct Run {
  std::size_t begin;
  std::size_t end;
  std::int64_t first;
  std::int64_t end_row;
};

/// Merges `ranges` (sorted by first row) into runs: the next range joins a run while the gap before it is
/// at most `max_gap_bytes` and the run would span at most `max_span_bytes` (rows of `row_bytes` bytes).
/// Every item is in exactly one run, in order.
std::vector<Run> merge_runs(std::span<const RowRange> ranges, std::uint64_t row_bytes, std::uint64_t max_gap_bytes,
                            std::uint64_t max_span_bytes);

/// Rows [first, end) of `source` (within its rows) converted as a gather converts a window's rows (`t`, into
/// output items of `out_size` bytes: 4 float, 8 double) into `dst`, `t.out_elems()` items a row, C order: whole
/// arrays through the same reader and conversion (batches formed on a device upload them, device_rows.hpp).
/// Read in pieces of at most 16 MiB. Throws what the reader throws, naming the file.
void read_converted_rows(const ArraySource& source, const RowTransform& t, std::int64_t first, std::int64_t end,
                         std::uint32_t out_size, std::byte* dst);

/// What a gather reads and how it lays out its output; owned by the WindowSource.
struct GatherInput {
  const std::vector<ArraySource>* factors = nullptr;
  const std::vector<ArraySource>* labels = nullptr;
  const std::vector<Sample>* samples = nullptr;
  std::int64_t window = 1;
  std::uint32_t out_size = 4;                  // float32 or float64
  const GatherTransform* transform = nullptr;  // source rows to output rows (required)
};

/// One batch: samples `ids` (valid indices into *input.samples) gathered into `x` and `y`, which hold
/// ids.size() samples each. Work items are keys; run_key() may run concurrently for different keys.
class Gather {
 public:
  Gather(const GatherInput& input, std::vector<std::int64_t> ids, std::byte* x, std::byte* y);
  std::size_t keys() const noexcept { return key_begin_.size() - 1; }
  /// True when a few residency probes find windows of the batch outside the page cache (gather.cpp); readers
  /// that bypass the cache or hold their data in memory always look cached.
  bool looks_cold() const;
  /// Asks the kernel to read every window of the batch ahead (ArrayReader::will_need). Submitting them blocks
  /// while the device's queue is full, as long as the reads ahead of them take: call it off the consumer's
  /// thread. Reads the batch's samples and the source's readers: keep both alive meanwhile.
  void will_need_all() const;
  /// Gathers the samples of the `group`-th key of the batch. Throws what its readers throw.
  void run_key(std::size_t group) const { run_keys(group, group + 1); }
  /// Gathers the samples of keys [first, last) of the batch, their queued reads in flight together: in waves
  /// of `keys_per_wave` keys (set_keys_per_wave), the next wave's reads in flight while one is converted.
  void run_keys(std::size_t first, std::size_t last) const;
  void set_keys_per_wave(std::size_t keys) noexcept { keys_per_wave_ = std::max<std::size_t>(keys, 1); }

 private:
  std::vector<Run> factor_runs(std::size_t begin, std::size_t end) const;
  // Queues the reads of `runs` (of the key at order_[begin, end)): per run, where its rows will be once the
  // queue is waited for (null: fetched as before). Returns the bytes staged.
  std::uint64_t queue_factor_reads(std::size_t begin, const std::vector<Run>& runs, ReadQueue& queue,
                                   std::vector<const std::byte*>& staged) const;
  void gather_factors(std::size_t begin, std::vector<std::byte>& scratch, const std::vector<Run>& runs,
                      const std::vector<const std::byte*>& staged) const;
  // Data bytes of the factor window of the sample at batch position `pos`; false when it has none to hint
  // (empty, or a Fortran-order array).
  bool window_bytes(std::size_t pos, std::uint64_t& offset, std::uint64_t& length) const;
  const Sample& sample_at(std::uint32_t pos) const { return (*in_.samples)[static_cast<std::size_t>(ids_[pos])]; }
  void gather_labels(std::size_t begin, std::size_t end, std::vector<std::byte>& scratch) const;
  void convert_rows(const RowTransform& t, const std::byte* src, const ScalarType& type, std::uint64_t rows,
                    std::byte* dst, detail::SourceReuse reuse = detail::SourceReuse::kAgain) const;
  void finish_rows(const RowTransform& t, std::byte* dst, std::uint64_t rows) const;
  void finish_streamed(const RowTransform& t, const std::byte* src, std::uint64_t rows, std::byte* dst,
                       detail::SourceReuse reuse) const;

  GatherInput in_;
  std::vector<std::int64_t> ids_;       // sample ids, in batch order
  std::vector<std::uint32_t> order_;    // batch positions grouped by key, by first row within a key
  std::vector<std::size_t> key_begin_;  // groups (keys) in `order_`, plus an end marker
  std::byte* x_;
  std::byte* y_;
  std::size_t keys_per_wave_ = 1;
  bool stream_x_ = false;       // windows copied into x_ with streaming stores (detail/stream_copy.hpp)
  bool prefetch_once_ = false;  // rows read once fetched with a non-temporal prefetch (detail::prefetch_read_once)
};

}  // namespace npyfeed
