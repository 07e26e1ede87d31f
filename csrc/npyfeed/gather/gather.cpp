#include "npyfeed/gather/gather.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "npyfeed/gather/convert.hpp"
#include "npyfeed/gather/stream_copy.hpp"
#include "npyfeed/io/fault_guard.hpp"
#include "npyfeed/io/mapped_file.hpp"
#include "npyfeed/io/read_queue.hpp"

namespace npyfeed {

namespace {

// Merging: ranges of one key whose rows are this close are read with one call (file readers; an array in
// memory merges everything, there is no call to save).
constexpr std::uint64_t kMergeGapBytes = 64u << 10;
constexpr std::uint64_t kMaxSpanBytes = 16u << 20;

// Column-major 2-d arrays with more than one column need a transpose; one column is already row order.
bool transposed(const NpyHeader& h) { return h.fortran_order && h.shape.size() == 2 && h.shape[1] > 1; }

// Staged bytes of one wave of queued reads at most (a wave holds one key at least): bounds the staging memory
// of a thread when a batch's windows of one key merge into long runs.
constexpr std::uint64_t kMaxStagedBytes = 32u << 20;

// A window stored exactly as the output wants it, from a reader that reads in place: read straight into the
// batch (replaced and normalised there).
bool windows_in_place(const ArraySource& factor, const RowTransform& t, std::uint32_t out_size) {
  const NpyHeader& h = factor.header();
  const ScalarType& st = h.scalar;
  return factor.reader->reads_in_place() && !h.fortran_order && st.kind == 'f' && st.size == out_size && !st.swapped &&
         !t.selects();
}

// Runs `copy`, which reads data bytes [offset, offset + length) of `source` from memory that may be a mapping,
// guarded: where the file shrank since it was mapped the read raises SIGBUS (fault_guard.hpp), and the
// copy is abandoned and reported naming the file. `copy` must only copy over raw pointers (no allocation).
template <class F>
void copy_guarded(const ArraySource& source, std::uint64_t offset, std::uint64_t length, F&& copy) {
  if (!guarded(copy)) throw shrunk_mapping_error(source.name(), source.header().data_offset + offset, length);
}

// `rows` source rows of `type` at `src` into output rows at `dst`: items of `out_size` bytes (4 float, 8 double).
void convert_to(const RowTransform& t, const std::byte* src, const ScalarType& type, std::uint64_t rows,
                std::uint32_t out_size, std::byte* dst, detail::SourceReuse reuse = detail::SourceReuse::kAgain) {
  if (out_size == 4) {
    t.apply<float>(src, type, rows, reinterpret_cast<float*>(dst), reuse);
  } else {
    t.apply<double>(src, type, rows, reinterpret_cast<double*>(dst), reuse);
  }
}

// Rows [first, last) of `source` in C order: from its reader (or a view), transposed from a Fortran-order
// file into `scratch`. Valid until the next fetch on this thread.
// Where `t` selects columns, only those are read and transposed (the others are left unset in `scratch`).
const std::byte* fetch_rows(const ArraySource& source, std::int64_t first, std::int64_t last,
                            std::vector<std::byte>& scratch, const RowTransform& t) {
  const NpyHeader& h = source.header();
  const ArrayReader& reader = *source.reader;
  const std::uint64_t isz = h.itemsize;
  const std::uint64_t row_bytes = source.row_elems() * isz;
  const std::uint64_t count = static_cast<std::uint64_t>(last - first);
  const std::uint64_t bytes = count * row_bytes;
  if (!transposed(h)) return reader.fetch(static_cast<std::uint64_t>(first) * row_bytes, bytes);

  // Column-major: element (t, f) lives at (t + f * rows). Read the rows' piece of every column (short and
  // scattered: buffered reads), then collect them into C order.
  const std::uint64_t rows = static_cast<std::uint64_t>(source.rows());
  const std::uint64_t cols = static_cast<std::uint64_t>(h.shape[1]);
  const std::uint64_t piece = count * isz;
  // The columns to read: all, or the selected ones (runs of neighbours read with one strided call).
  std::vector<std::uint64_t> all;
  if (!t.selects()) {
    all.resize(cols);
    for (std::uint64_t f = 0; f < cols; ++f) all[f] = f;
  }
  const std::vector<std::uint64_t>& wanted = t.selects() ? t.needed_columns() : all;
  std::vector<std::byte> columns;
  const std::byte* base = reader.view();
  std::uint64_t stride = rows * isz;
  std::uint64_t start = static_cast<std::uint64_t>(first) * isz;
  if (base == nullptr) {
    // Column f's piece lands at f * piece: unread columns leave holes that nothing reads.
    columns.resize(bytes);
    for (std::size_t i = 0; i < wanted.size();) {
      std::size_t j = i + 1;
      while (j < wanted.size() && wanted[j] == wanted[j - 1] + 1) ++j;
      reader.read_strided(start + wanted[i] * stride, piece, stride, j - i, columns.data() + wanted[i] * piece);
      i = j;
    }
    base = columns.data();
    stride = piece;
    start = 0;
  }
  scratch.resize(bytes);
  std::byte* out = scratch.data();
  copy_guarded(source, 0, h.nbytes, [&] {
    for (const std::uint64_t f : wanted) {
      const std::byte* src = base + start + f * stride;
      for (std::uint64_t r = 0; r < count; ++r) std::memcpy(out + (r * cols + f) * isz, src + r * isz, isz);
    }
  });
  return out;
}

}  // namespace

std::uint64_t ArraySource::row_elems() const {
  std::uint64_t n = 1;
  for (std::size_t k = 1; k < header().shape.size(); ++k) n *= static_cast<std::uint64_t>(header().shape[k]);
  return n;
}

std::vector<Run> merge_runs(std::span<const RowRange> ranges, std::uint64_t row_bytes, std::uint64_t max_gap_bytes,
                            std::uint64_t max_span_bytes) {
  std::vector<Run> runs;
  std::size_t i = 0;
  while (i < ranges.size()) {
    Run run{i, i + 1, ranges[i].first, ranges[i].end};
    for (; run.end < ranges.size(); ++run.end) {
      const RowRange& next = ranges[run.end];
      const std::int64_t gap = std::max<std::int64_t>(next.first - run.end_row, 0);
      const std::int64_t end_row = std::max(run.end_row, next.end);
      if (static_cast<std::uint64_t>(gap) * row_bytes > max_gap_bytes) break;
      if (static_cast<std::uint64_t>(end_row - run.first) * row_bytes > max_span_bytes) break;
      run.end_row = end_row;
    }
    runs.push_back(run);
    i = run.end;
  }
  return runs;
}

void read_converted_rows(const ArraySource& source, const RowTransform& t, std::int64_t first, std::int64_t end,
                         std::uint32_t out_size, std::byte* dst) {
  const std::uint64_t src_row_bytes = source.row_elems() * source.header().itemsize;
  const std::uint64_t out_row_bytes = t.out_elems() * out_size;
  const auto rows_per_piece =
      static_cast<std::int64_t>(std::max<std::uint64_t>(kMaxSpanBytes / std::max<std::uint64_t>(src_row_bytes, 1), 1));
  std::vector<std::byte> scratch;
  for (std::int64_t a = first; a < end; a += rows_per_piece) {
    const std::int64_t b = std::min(end, a + rows_per_piece);
    const std::byte* rows = fetch_rows(source, a, b, scratch, t);
    const auto count = static_cast<std::uint64_t>(b - a);
    std::byte* out = dst + static_cast<std::uint64_t>(a - first) * out_row_bytes;
    copy_guarded(source, static_cast<std::uint64_t>(a) * src_row_bytes, count * src_row_bytes,
                 [&] { convert_to(t, rows, source.header().scalar, count, out_size, out); });
  }
}

Gather::Gather(const GatherInput& input, std::vector<std::int64_t> ids, std::byte* x, std::byte* y)
    : in_(input), ids_(std::move(ids)), x_(x), y_(y) {
  order_.resize(ids_.size());
  std::iota(order_.begin(), order_.end(), 0u);
  std::sort(order_.begin(), order_.end(), [&](std::uint32_t a, std::uint32_t b) {
    const Sample& sa = sample_at(a);
    const Sample& sb = sample_at(b);
    return sa.key != sb.key ? sa.key < sb.key : sa.feature < sb.feature;
  });
  for (std::size_t i = 0; i < order_.size(); ++i) {
    if (i == 0 || sample_at(order_[i]).key != sample_at(order_[i - 1]).key) key_begin_.push_back(i);
  }
  key_begin_.push_back(order_.size());
  const std::uint64_t x_row_out = in_.transform->x().out_elems() * in_.out_size;
  stream_x_ = detail::stream_batch(ids_.size() * static_cast<std::uint64_t>(in_.window) * x_row_out);
  prefetch_once_ = detail::prefetch_read_once();
}

// On a cold cache, tells the kernel about every window of the batch before the workers touch them: it then
// reads them all concurrently (a deep device queue) instead of one page fault or pread at a time per worker.
// A few residency probes first (looks_cold), so a warm cache pays almost nothing (a hint costs ~10 us per
// window even when everything is cached). Readers that bypass the page cache, or hold the data in memory,
// report everything cached and take no hints.
bool Gather::window_bytes(std::size_t pos, std::uint64_t& offset, std::uint64_t& length) const {
  const Sample& s = sample_at(static_cast<std::uint32_t>(pos));
  const ArraySource& factor = (*in_.factors)[s.key];
  if (transposed(factor.header())) return false;
  const std::uint64_t row_bytes = factor.row_elems() * factor.header().itemsize;
  const std::int64_t rows = factor.rows();
  const auto first =
      static_cast<std::int64_t>(std::clamp<__int128>(static_cast<__int128>(s.feature) - in_.window + 1, 0, rows));
  const auto end = static_cast<std::int64_t>(std::clamp<__int128>(static_cast<__int128>(s.feature) + 1, 0, rows));
  if (end <= first || row_bytes == 0) return false;
  offset = static_cast<std::uint64_t>(first) * row_bytes;
  length = static_cast<std::uint64_t>(end - first) * row_bytes;
  return true;
}

bool Gather::looks_cold() const {
  constexpr std::size_t kProbes = 8;
  const std::size_t n = ids_.size();
  for (std::size_t p = 0; p < kProbes && p < n; ++p) {
    const std::size_t pos = p * n / std::min(n, kProbes);
    std::uint64_t offset, length;
    if (!window_bytes(pos, offset, length)) continue;
    const ArrayReader& reader = *(*in_.factors)[sample_at(static_cast<std::uint32_t>(pos)).key].reader;
    if (!reader.probably_cached(offset) || !reader.probably_cached(offset + length - 1)) return true;
  }
  return false;
}

void Gather::will_need_all() const {
  for (std::size_t pos = 0; pos < ids_.size(); ++pos) {
    std::uint64_t offset, length;
    if (!window_bytes(pos, offset, length)) continue;
    (*in_.factors)[sample_at(static_cast<std::uint32_t>(pos)).key].reader->will_need(offset, length);
  }
}

void Gather::convert_rows(const RowTransform& t, const std::byte* src, const ScalarType& type, std::uint64_t rows,
                          std::byte* dst, detail::SourceReuse reuse) const {
  convert_to(t, src, type, rows, in_.out_size, dst, reuse);
}

void Gather::finish_rows(const RowTransform& t, std::byte* dst, std::uint64_t rows) const {
  if (in_.out_size == 4) {
    t.finish<float>(reinterpret_cast<float*>(dst), rows);
  } else {
    t.finish<double>(reinterpret_cast<double*>(dst), rows);
  }
}

void Gather::finish_streamed(const RowTransform& t, const std::byte* src, std::uint64_t rows, std::byte* dst,
                             detail::SourceReuse reuse) const {
  if (in_.out_size == 4) {
    t.finish_streamed<float>(reinterpret_cast<const float*>(src), reinterpret_cast<float*>(dst), rows, reuse);
  } else {
    t.finish_streamed<double>(reinterpret_cast<const double*>(src), reinterpret_cast<double*>(dst), rows, reuse);
  }
}

void Gather::run_keys(std::size_t first, std::size_t last) const {
  std::vector<std::byte> transpose_scratch;
  std::vector<std::vector<Run>> runs(last - first);
  std::vector<std::vector<const std::byte*>> staged(last - first);
  ReadQueue* queue = nullptr;
  // Waves of keys, pipelined: the reads of the next wave go in flight before the current wave is waited for
  // and converted, so the device queue never runs dry while this thread converts.
  struct Wave {
    std::size_t begin, end;
    std::uint64_t mark;
  };
  auto plan_wave = [&](std::size_t begin) {
    Wave wave{begin, begin, 0};
    std::uint64_t staged_bytes = 0;
    std::size_t queued_keys = 0;
    for (; wave.end < last && queued_keys < keys_per_wave_ && staged_bytes < kMaxStagedBytes; ++wave.end) {
      const std::size_t k = key_begin_[wave.end];
      runs[wave.end - first] = factor_runs(k, key_begin_[wave.end + 1]);
      const ArraySource& factor = (*in_.factors)[sample_at(order_[k]).key];
      if (factor.reader->queue_depth() == 0 || transposed(factor.header())) continue;
      if (queue == nullptr) {
        queue = &ReadQueue::this_thread();
        queue->clear();
      }
      staged_bytes += queue_factor_reads(k, runs[wave.end - first], *queue, staged[wave.end - first]);
      ++queued_keys;
    }
    if (queue != nullptr) {
      queue->submit();
      wave.mark = queue->mark();
    }
    return wave;
  };
  try {
    Wave wave = plan_wave(first);
    while (wave.begin < last) {
      const Wave next = wave.end < last ? plan_wave(wave.end) : Wave{last, last, 0};
      if (queue != nullptr) queue->wait(wave.mark);
      for (std::size_t g = wave.begin; g < wave.end; ++g) {
        gather_factors(key_begin_[g], transpose_scratch, runs[g - first], staged[g - first]);
        gather_labels(key_begin_[g], key_begin_[g + 1], transpose_scratch);
      }
      wave = next;
    }
  } catch (...) {
    if (queue != nullptr) queue->clear();  // waits for every read still in flight into this batch or the staging
    throw;
  }
  if (queue != nullptr) queue->clear();
}

// The runs of one key's factor windows (order_[begin, end), in order of first row): nearby windows read together.
std::vector<Run> Gather::factor_runs(std::size_t begin, std::size_t end) const {
  const ArraySource& factor = (*in_.factors)[sample_at(order_[begin]).key];
  const std::int64_t rows = factor.rows();
  auto clip = [&](__int128 r) { return static_cast<std::int64_t>(std::clamp<__int128>(r, 0, rows)); };
  std::vector<RowRange> ranges(end - begin);
  for (std::size_t k = begin; k < end; ++k) {
    const Sample& s = sample_at(order_[k]);
    // Window ends in 128 bits (feature_index may be any int64 under bounds='pad'), clipped to the array.
    ranges[k - begin] = {clip(static_cast<__int128>(s.feature) - in_.window + 1),
                         clip(static_cast<__int128>(s.feature) + 1)};
  }
  const bool in_memory = factor.reader->view() != nullptr;
  return merge_runs(ranges, factor.row_elems() * factor.header().itemsize, in_memory ? UINT64_MAX : kMergeGapBytes,
                    in_memory ? UINT64_MAX : kMaxSpanBytes);
}

std::uint64_t Gather::queue_factor_reads(std::size_t begin, const std::vector<Run>& runs, ReadQueue& queue,
                                         std::vector<const std::byte*>& staged) const {
  const ArraySource& factor = (*in_.factors)[sample_at(order_[begin]).key];
  const ArrayReader& reader = *factor.reader;
  const std::uint64_t row_bytes = factor.row_elems() * factor.header().itemsize;
  const std::uint64_t x_row_out = in_.transform->x().out_elems() * in_.out_size;
  const bool in_place = windows_in_place(factor, in_.transform->x(), in_.out_size);
  std::uint64_t staged_bytes = 0;
  staged.assign(runs.size(), nullptr);
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const Run& run = runs[i];
    if (run.end_row <= run.first) continue;
    const std::uint64_t offset = static_cast<std::uint64_t>(run.first) * row_bytes;
    const std::uint64_t bytes = static_cast<std::uint64_t>(run.end_row - run.first) * row_bytes;
    if (in_place && run.end == run.begin + 1 && run.end_row - run.first == in_.window) {
      const std::uint32_t pos = order_[begin + run.begin];
      std::byte* out = x_ + static_cast<std::uint64_t>(pos) * static_cast<std::uint64_t>(in_.window) * x_row_out;
      reader.read_queued(queue, offset, bytes, out);
      staged[i] = out;
    } else {
      staged[i] = reader.fetch_queued(queue, offset, bytes);
      staged_bytes += bytes;
    }
  }
  return staged_bytes;
}

// Factor windows of one key, in order of first row (order_[begin, end)), by run: fetched now, or already
// where `staged` says (a queued read; for a window read in place, in the batch already).
void Gather::gather_factors(std::size_t begin, std::vector<std::byte>& scratch, const std::vector<Run>& runs,
                            const std::vector<const std::byte*>& staged) const {
  const ArraySource& factor = (*in_.factors)[sample_at(order_[begin]).key];
  const ArrayReader& reader = *factor.reader;
  const NpyHeader& h = factor.header();
  const std::int64_t window = in_.window;
  const std::int64_t rows = factor.rows();
  const RowTransform& t = in_.transform->x();
  const std::uint64_t src_row_bytes = factor.row_elems() * h.itemsize;
  const std::uint64_t x_row_out = t.out_elems() * in_.out_size;
  auto clip = [&](__int128 r) { return static_cast<std::int64_t>(std::clamp<__int128>(r, 0, rows)); };
  auto window_first = [&](const Sample& s) { return static_cast<__int128>(s.feature) - window + 1; };
  auto window_end = [&](const Sample& s) { return static_cast<__int128>(s.feature) + 1; };
  auto out_of = [&](std::uint32_t pos) {
    return x_ + static_cast<std::uint64_t>(pos) * static_cast<std::uint64_t>(window) * x_row_out;
  };
  const ScalarType& st = h.scalar;
  const bool read_in_place = windows_in_place(factor, t, in_.out_size);
  // Rows stored as the output wants them (no conversion, no transform) into a batch past the caches: copied
  // with streaming stores.
  const bool native = st.kind == 'f' && st.size == in_.out_size && !st.swapped;
  const bool stream_rows = stream_x_ && t.identity() && native;
  // Replaced or normalised on the way, written past the caches just the same.
  const bool stream_finished = stream_x_ && !t.selects() && t.finishes() && native;
  // Converted on the way to float32 by a vector loop (detail::converts_to_float32_vectorised), written past the
  // caches as well.
  const bool stream_converted =
      stream_x_ && t.identity() && in_.out_size == 4 && detail::converts_to_float32_vectorised(st);
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const Run& run = runs[i];
    const std::byte* ready = staged.empty() ? nullptr : staged[i];
    if (read_in_place && run.end == run.begin + 1 && run.end_row - run.first == window) {
      std::byte* out = out_of(order_[begin + run.begin]);
      if (ready == nullptr) {
        reader.read(static_cast<std::uint64_t>(run.first) * src_row_bytes,
                    static_cast<std::uint64_t>(window) * src_row_bytes, out);
      }
      finish_rows(t, out, static_cast<std::uint64_t>(window));
      continue;
    }
    const std::byte* rows_data = ready;
    if (rows_data == nullptr && run.end_row > run.first)
      rows_data = fetch_rows(factor, run.first, run.end_row, scratch, t);
    // The rows may be a mapping's pages: read them guarded (copy_guarded), with nothing allocated inside.
    const std::uint64_t run_offset = static_cast<std::uint64_t>(run.first) * src_row_bytes;
    const std::uint64_t run_bytes =
        static_cast<std::uint64_t>(std::max<std::int64_t>(run.end_row - run.first, 0)) * src_row_bytes;
    copy_guarded(factor, run_offset, run_bytes, [&] {
      for (std::size_t k = begin + run.begin; k < begin + run.end; ++k) {
        const Sample& s = sample_at(order_[k]);
        std::byte* out = out_of(order_[k]);
        const __int128 first = window_first(s);
        const std::int64_t a = clip(first);
        const std::int64_t b = clip(window_end(s));
        // Rows before the array, the rows inside it, rows after it (zeros only under bounds='pad').
        const auto before = static_cast<std::int64_t>(std::min<__int128>(std::max<__int128>(a - first, 0), window));
        const std::int64_t inside = std::max<std::int64_t>(b - a, 0);
        std::memset(out, 0, static_cast<std::size_t>(before) * x_row_out);
        if (inside > 0) {
          const std::byte* from = rows_data + static_cast<std::uint64_t>(a - run.first) * src_row_bytes;
          std::byte* to = out + static_cast<std::uint64_t>(before) * x_row_out;
          const std::uint64_t bytes = static_cast<std::uint64_t>(inside) * x_row_out;
          // Windows are sorted by first row: the next one of the run reads some of these rows again when it
          // starts before this one ends (they go through the caches).
          const bool again = k + 1 < begin + run.end && clip(window_first(sample_at(order_[k + 1]))) < b;
          const auto reuse = again || !prefetch_once_ ? detail::SourceReuse::kAgain : detail::SourceReuse::kOnce;
          const bool streamed = bytes >= detail::kStreamedCopyBytes &&
                                (stream_rows || stream_converted ||
                                 (stream_finished && reinterpret_cast<std::uintptr_t>(from) % in_.out_size == 0));
          if (streamed && stream_rows) {
            detail::streaming_copy(to, from, bytes, reuse);  // what convert_rows would do, past the caches
          } else if (streamed && stream_converted) {
            detail::convert_to_float32(from, st, static_cast<std::size_t>(inside) * t.out_elems(),
                                       reinterpret_cast<float*>(to), true);
          } else if (streamed) {
            finish_streamed(t, from, static_cast<std::uint64_t>(inside), to, reuse);
          } else {
            convert_rows(t, from, st, static_cast<std::uint64_t>(inside), to, reuse);
          }
        }
        const std::int64_t after = window - before - inside;
        std::memset(out + static_cast<std::uint64_t>(before + inside) * x_row_out, 0,
                    static_cast<std::size_t>(after) * x_row_out);
      }
    });
  }
}

// Label rows of one key: the same merging, in order of label row. Rows outside the array (only under
// bounds='pad') sort to both ends and read as zeros.
void Gather::gather_labels(std::size_t begin, std::size_t end, std::vector<std::byte>& scratch) const {
  const ArraySource& label = (*in_.labels)[sample_at(order_[begin]).key];
  std::vector<std::uint32_t> by_label(order_.begin() + static_cast<std::ptrdiff_t>(begin),
                                      order_.begin() + static_cast<std::ptrdiff_t>(end));
  std::sort(by_label.begin(), by_label.end(),
            [&](std::uint32_t a, std::uint32_t b) { return sample_at(a).label < sample_at(b).label; });
  const std::int64_t rows = label.rows();
  const RowTransform& t = in_.transform->y();
  const std::uint64_t src_row_bytes = label.row_elems() * label.header().itemsize;
  const std::uint64_t y_row_out = t.out_elems() * in_.out_size;
  auto out_of = [&](std::uint32_t pos) { return y_ + static_cast<std::uint64_t>(pos) * y_row_out; };

  std::size_t inside_begin = 0;
  while (inside_begin < by_label.size() && sample_at(by_label[inside_begin]).label < 0) ++inside_begin;
  std::size_t inside_end = inside_begin;
  while (inside_end < by_label.size() && sample_at(by_label[inside_end]).label < rows) ++inside_end;
  for (std::size_t k = 0; k < by_label.size(); ++k) {
    if (k < inside_begin || k >= inside_end) std::memset(out_of(by_label[k]), 0, y_row_out);
  }
  std::vector<RowRange> ranges;
  ranges.reserve(inside_end - inside_begin);
  for (std::size_t k = inside_begin; k < inside_end; ++k) {
    const std::int64_t l = sample_at(by_label[k]).label;
    ranges.push_back({l, l + 1});
  }
  const bool in_memory = label.reader->view() != nullptr;
  const std::uint64_t gap = in_memory ? UINT64_MAX : kMergeGapBytes;
  const std::uint64_t span = in_memory ? UINT64_MAX : kMaxSpanBytes;
  for (const Run& run : merge_runs(ranges, src_row_bytes, gap, span)) {
    const std::byte* rows_data = fetch_rows(label, run.first, run.end_row, scratch, t);
    copy_guarded(label, static_cast<std::uint64_t>(run.first) * src_row_bytes,
                 static_cast<std::uint64_t>(run.end_row - run.first) * src_row_bytes, [&] {
                   for (std::size_t k = inside_begin + run.begin; k < inside_begin + run.end; ++k) {
                     const std::int64_t l = sample_at(by_label[k]).label;
                     convert_rows(t, rows_data + static_cast<std::uint64_t>(l - run.first) * src_row_bytes,
                                  label.header().scalar, 1, out_of(by_label[k]));
                   }
                 });
  }
}

}  // namespace npyfeed
