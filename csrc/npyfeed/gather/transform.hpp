// What the gather does to a row besides converting its element type, all in the same pass over the output:
// a selection of the row's columns (features= / label_columns=), NaN and infinity replaced as numpy's
// nan_to_num does, and a per-column normalisation (x - mean) / std in the output dtype. The options are
// checked once, against the rows' shapes, when a GatherTransform is built (WindowSource::finish_open).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "npyfeed/format/npy_header.hpp"
#include "npyfeed/gather/stream_copy.hpp"

namespace npyfeed {

/// Columns of a (flattened) row: all, a list (any order, repeats allowed, negative values count from the
/// end as in numpy), or a slice with Python's semantics (unset start/stop/step are Python's None).
struct ColumnSpec {
  enum class Kind { kAll, kList, kSlice };
  Kind kind = Kind::kAll;
  std::vector<std::int64_t> list;
  std::optional<std::int64_t> start, stop, step;

  static ColumnSpec all() { return {}; }
  static ColumnSpec of(std::vector<std::int64_t> columns) { return {Kind::kList, std::move(columns), {}, {}, {}}; }
  static ColumnSpec slice(std::optional<std::int64_t> start, std::optional<std::int64_t> stop,
                          std::optional<std::int64_t> step) {
    return {Kind::kSlice, {}, start, stop, step};
  }
  /// The columns selected from rows of `length` elements. Throws InvalidArgument naming `argument` for a
  /// column out of range, a zero step, or an empty selection.
  std::vector<std::int64_t> resolve(std::uint64_t length, const std::string& argument) const;
};

/// The options of a source's gathers; the defaults change nothing.
struct TransformOptions {
  ColumnSpec features;       // of the factor rows
  ColumnSpec label_columns;  // of the label rows
  // Replacements of NaN, +inf, -inf (unset: kept), for factor and label rows alike.
  std::optional<double> nan;
  std::optional<double> posinf;
  std::optional<double> neginf;
  // normalize=(mean, std) for factor rows, each a C-order array of `*_shape` (empty shape: a scalar);
  // broadcast to the (selected) row as numpy does.
  bool normalize = false;
  std::vector<double> mean, std;
  std::vector<std::int64_t> mean_shape, std_shape;
};

/// Source columns [src, src + len) of a row to output columns [dst, dst + len).
struct ColumnRun {
  std::uint64_t src;
  std::uint64_t dst;
  std::uint64_t len;
};

/// How one source row (of `src_elems` elements) becomes one output row (of `out_elems`).
class RowTransform {
 public:
  RowTransform() = default;
  /// Rows of `src_elems` elements; `columns` (when `select`) the resolved selection; `mean` and `std` (empty: none)
  /// one value per output column.
  RowTransform(std::uint64_t src_elems, std::vector<std::int64_t> columns, bool select, const TransformOptions& o,
               std::vector<double> mean, std::vector<double> std);

  std::uint64_t src_elems() const noexcept { return src_elems_; }
  std::uint64_t out_elems() const noexcept { return out_elems_; }
  /// Nothing to do but convert: the gather's plain path.
  bool identity() const noexcept { return !select_ && !finishes(); }
  /// Whether a column subset is taken.
  bool selects() const noexcept { return select_; }
  /// Whether the output rows need a pass after conversion (replacement or normalisation).
  bool finishes() const noexcept { return flags_ != 0; }
  /// The source columns read, sorted and distinct (a Fortran-order file reads only these).
  const std::vector<std::uint64_t>& needed_columns() const noexcept { return needed_; }

  /// Converts `rows` source rows of `type` at `src` (`src_elems` each, contiguous) into `rows` output rows at `dst`
  /// (Out = float or double), selected, replaced and normalised. `reuse`: whether the next call reads some of these
  /// rows again (kAgain: they go through the caches) or not (kOnce: a selection reads its next rows ahead with a
  /// non-temporal prefetch); the values are the same either way.
  template <class Out>
  void apply(const std::byte* src, const ScalarType& type, std::uint64_t rows, Out* dst,
             detail::SourceReuse reuse = detail::SourceReuse::kAgain) const;
  /// Replacement and normalisation over `rows` output rows already converted (and selected) at `dst`.
  template <class Out>
  void finish(Out* dst, std::uint64_t rows) const;
  /// The same from `src` (rows already in the output type and layout) into `dst`: one pass, no copy first.
  template <class Out>
  void finish_from(const Out* src, Out* dst, std::uint64_t rows) const;
  /// finish_from's result written past the caches, on detail::streaming_copy's terms (a source read once fetched
  /// ahead with a non-temporal hint; fenced): for a batch larger than the caches. Rows not selected.
  template <class Out>
  void finish_streamed(const Out* src, Out* dst, std::uint64_t rows, detail::SourceReuse reuse) const;

 private:
  template <class Out>
  void finish_rows_from(const Out* src, Out* dst, std::uint64_t rows, bool streamed,
                        const std::byte* prefetch_end) const;

  std::uint64_t src_elems_ = 0;
  std::uint64_t out_elems_ = 0;
  bool select_ = false;
  std::vector<ColumnRun> runs_;
  std::vector<std::uint32_t> gather_;  // per output column: its source column (many short runs)
  std::vector<std::uint64_t> needed_;
  unsigned flags_ = 0;  // kNan | kPosinf | kNeginf | kNormalize
  double nan_ = 0, posinf_ = 0, neginf_ = 0;
  std::vector<float> mean32_, scale32_;  // scale: 1/std per column (std itself where divide)
  std::vector<double> mean64_, scale64_;
  bool divide32_ = false, divide64_ = false;
};

/// The checked options of a source: a RowTransform for factor rows and one for label rows.
class GatherTransform {
 public:
  GatherTransform() = default;
  /// Checks `options` against rows of `x_row_shape` (factors) and `y_row_shape` (labels). Throws InvalidArgument
  /// naming the argument and the value: a column out of range, an empty selection, a mean or std that does not
  /// broadcast to the selected row, a non-finite mean, a std that is not positive and finite (in the
  /// output dtype, `out_size` bytes).
  GatherTransform(const TransformOptions& options, const std::vector<std::int64_t>& x_row_shape,
                  const std::vector<std::int64_t>& y_row_shape, std::uint32_t out_size);

  const RowTransform& x() const noexcept { return x_; }
  const RowTransform& y() const noexcept { return y_; }
  /// Output row shapes: (len(features),) where columns are selected, else the source's.
  const std::vector<std::int64_t>& x_row_shape() const noexcept { return x_shape_; }
  const std::vector<std::int64_t>& y_row_shape() const noexcept { return y_shape_; }

 private:
  RowTransform x_, y_;
  std::vector<std::int64_t> x_shape_, y_shape_;
};

}  // namespace npyfeed
