#include "npyfeed/window_source.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>

#include "npyfeed/detail/convert.hpp"
#include "npyfeed/direct_reader.hpp"
#include "npyfeed/errors.hpp"

namespace npyfeed {

Bounds parse_bounds(const std::string& name) {
  if (name == "error") return Bounds::kError;
  if (name == "skip") return Bounds::kSkip;
  if (name == "pad") return Bounds::kPad;
  throw InvalidArgument("bounds must be 'error', 'skip' or 'pad', not '" + name + "'");
}

std::uint64_t ArraySource::row_elems() const {
  std::uint64_t n = 1;
  for (std::size_t k = 1; k < header.shape.size(); ++k) n *= static_cast<std::uint64_t>(header.shape[k]);
  return n;
}

namespace {

// Merging: windows of one key whose rows are this close are read with one call.
constexpr std::uint64_t kMergeGapBytes = 64u << 10;
constexpr std::uint64_t kMaxSpanBytes = 16u << 20;
// Label files up to this size are read whole at open in read/direct modes.
constexpr std::uint64_t kPreloadBytes = 64u << 20;
// Reads in flight per thread in direct mode.
constexpr std::size_t kDirectDepth = 4;

// Scratch memory per worker thread, aligned for O_DIRECT; grows, never shrinks.
std::byte* scratch_buffer(std::size_t size, std::size_t align) {
  thread_local std::unique_ptr<AlignedBuffer> buffer;
  if (!buffer || buffer->size() < size || buffer->alignment() < align) {
    buffer.reset();
    buffer = std::make_unique<AlignedBuffer>(std::max<std::size_t>(size, 1u << 20), std::max<std::size_t>(align, 4096));
  }
  return buffer->data();
}

std::string int128_text(__int128 v) {
  if (v >= INT64_MIN && v <= INT64_MAX) return std::to_string(static_cast<std::int64_t>(v));
  const bool negative = v < 0;
  unsigned __int128 u = negative ? static_cast<unsigned __int128>(-(v + 1)) + 1 : static_cast<unsigned __int128>(v);
  std::string digits;
  while (u > 0) {
    digits.insert(digits.begin(), static_cast<char>('0' + static_cast<int>(u % 10)));
    u /= 10;
  }
  return (negative ? "-" : "") + digits;
}

// Opens a source's file again; a file replaced since the source was opened is refused, never read.
File reopen(const ArraySource& source, bool direct) {
  File file = File::open(source.name, direct);
  if (!(file.identity() == source.identity)) throw OsError(ESTALE, source.name, "file replaced while reading");
  return file;
}

bool fds_fit(std::size_t wanted) {
  struct rlimit rl {};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return false;
  if (rl.rlim_cur == RLIM_INFINITY) return true;
  return wanted + 64 <= rl.rlim_cur / 2;  // leave half the limit to the rest of the process
}

}  // namespace

WindowSource::WindowSource(SampleIndex index, WindowOptions options)
    : index_(std::move(index)), options_(options), window_(options.window) {
  if (window_ < 1) throw InvalidArgument("window must be at least 1, got " + std::to_string(window_));
  if (!(options_.out_kind == 'f' && (options_.out_size == 4 || options_.out_size == 8))) {
    throw InvalidArgument("output dtype must be float32 or float64");
  }
  const std::size_t keys = index_.keys.size();
  factors_.resize(keys);
  labels_.resize(keys);
  open_errors_.resize(keys);
  keep_fds_ = options_.memory || options_.mode == ReadMode::kMmap || fds_fit(2 * keys);
}

ArraySource WindowSource::open_file(const std::string& path, bool keep_fd, bool preload_small) {
  ArraySource source;
  source.name = path;
  File file = File::open(path);
  source.header = read_header(file, options_.max_header_size);
  source.identity = file.identity();
  const NpyHeader& h = source.header;
  if (!detail::convertible(h.scalar)) {
    throw InvalidArgument(path + ": dtype '" + (h.descr_text.empty() ? std::string("structured") : h.descr_text) +
                          "' cannot be converted to float (bool, integer and float16/32/64 files can)");
  }
  if (h.shape.empty()) throw InvalidArgument(path + ": a 0-d array has no rows");
  if (h.fortran_order && h.shape.size() > 2) {
    throw InvalidArgument(path + ": Fortran-order arrays with more than 2 dimensions are not supported for windows");
  }
  if (preload_small && options_.mode != ReadMode::kMmap && h.nbytes <= kPreloadBytes) {
    // A label row is a few bytes: reading one costs a whole (4 KiB, or O_DIRECT-aligned) IO per sample.
    // Small label files are read whole, once, instead.
    source.owned = std::make_shared<AlignedBuffer>(h.nbytes);
    file.read_exact(source.owned->data(), h.nbytes, h.data_offset);
    source.memory = source.owned->data();
    return source;
  }
  switch (options_.mode) {
    case ReadMode::kMmap:
      source.mapping = MappedFile::map(file);
      source.memory = source.mapping->data() == nullptr ? nullptr : source.mapping->data() + h.data_offset;
      break;
    case ReadMode::kRead:
      if (keep_fd) source.file = std::move(file);
      break;
    case ReadMode::kDirect: {
      try {
        File direct = File::open(path, /*direct=*/true);
        if (!(direct.identity() == source.identity)) throw OsError(ESTALE, path, "file replaced while opening");
        source.direct_align = direct_alignment(direct);
        if (keep_fd) {
          source.file = std::move(direct);
          source.file_is_direct = true;
        }
      } catch (const OsError& e) {
        if (e.error_number() != EINVAL) throw;
        source.direct_refused->store(true);
        if (keep_fd) source.file = std::move(file);
      }
      break;
    }
  }
  return source;
}

void WindowSource::open_key(std::size_t key, const std::string& factor_path, const std::string& label_path) {
  std::string missing;
  auto open_one = [&](const std::string& path, ArraySource& into) {
    try {
      into = open_file(path, keep_fds_, /*preload_small=*/&into == &labels_[key]);
    } catch (const OsError& e) {
      if (e.error_number() != ENOENT) throw;
      missing += (missing.empty() ? "" : ", ") + path;
    }
  };
  open_one(factor_path, factors_[key]);
  open_one(label_path, labels_[key]);
  if (!missing.empty()) open_errors_[key] = "key '" + index_.keys[key] + "': " + missing;
}

std::shared_ptr<Job> WindowSource::start_open(ThreadPool& pool, std::vector<std::string> factor_paths,
                                              std::vector<std::string> label_paths) {
  if (factor_paths.size() != index_.keys.size() || label_paths.size() != index_.keys.size()) {
    throw InvalidArgument("one factor and one label path per key are needed");
  }
  auto self = shared_from_this();
  auto f = std::make_shared<std::vector<std::string>>(std::move(factor_paths));
  auto l = std::make_shared<std::vector<std::string>>(std::move(label_paths));
  return pool.start(index_.keys.size(), options_.threads, [self, f, l](std::size_t k) { self->open_key(k, (*f)[k], (*l)[k]); });
}

void WindowSource::set_memory_source(std::size_t key, bool label, const std::byte* data, std::vector<std::int64_t> shape,
                                     const std::string& typestr) {
  ArraySource& source = label ? labels_.at(key) : factors_.at(key);
  source.name = std::string(label ? "labels" : "factors") + "['" + index_.keys.at(key) + "']";
  detail::PyLiteral descr;
  descr.kind = detail::PyLiteral::Kind::kStr;
  descr.str = typestr;
  NpyHeader& h = source.header;
  try {
    h.itemsize = descr_itemsize(descr, &h.scalar);
  } catch (const NpyFormatError&) {
    h.scalar = {};
  }
  if (!detail::convertible(h.scalar)) {
    throw InvalidArgument(source.name + ": dtype '" + typestr + "' cannot be converted to float");
  }
  if (shape.empty()) throw InvalidArgument(source.name + ": a 0-d array has no rows");
  h.descr_text = typestr;
  h.shape = std::move(shape);
  h.fortran_order = false;
  source.memory = data;
}

void WindowSource::finish_open() {
  std::vector<std::string> missing;
  for (const auto& e : open_errors_) {
    if (!e.empty()) missing.push_back(e);
  }
  if (!missing.empty()) {
    std::string msg = std::to_string(missing.size()) + " of " + std::to_string(index_.keys.size()) +
                      " keys have no data file: ";
    for (std::size_t i = 0; i < std::min<std::size_t>(missing.size(), 5); ++i) msg += (i ? "; " : "") + missing[i];
    if (missing.size() > 5) msg += "; ...";
    std::string first = missing[0].substr(missing[0].find(": ") + 2);
    first = first.substr(0, first.find(", "));
    throw OsError(ENOENT, first, msg);
  }
  if (index_.keys.empty()) {
    x_row_shape_.clear();
    y_row_shape_.clear();
  } else {
    x_row_shape_.assign(factors_[0].header.shape.begin() + 1, factors_[0].header.shape.end());
    y_row_shape_.assign(labels_[0].header.shape.begin() + 1, labels_[0].header.shape.end());
  }
  auto shape_text = [](const std::vector<std::int64_t>& s) {  // as Python prints a tuple
    std::string t = "(";
    for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
    return t + (s.size() == 1 ? ",)" : ")");
  };
  for (std::size_t k = 0; k < index_.keys.size(); ++k) {
    for (int which = 0; which < 2; ++which) {
      const ArraySource& s = which == 0 ? factors_[k] : labels_[k];
      const auto& expected = which == 0 ? x_row_shape_ : y_row_shape_;
      std::vector<std::int64_t> row(s.header.shape.begin() + 1, s.header.shape.end());
      if (row != expected) {
        const ArraySource& first = which == 0 ? factors_[0] : labels_[0];
        throw InvalidArgument(s.name + ": rows of shape " + shape_text(row) + " do not match " + first.name +
                              " (rows of shape " + shape_text(expected) + ")");
      }
    }
  }
  x_row_elems_ = 1;
  for (auto d : x_row_shape_) x_row_elems_ *= static_cast<std::uint64_t>(d);
  y_row_elems_ = 1;
  for (auto d : y_row_shape_) y_row_elems_ *= static_cast<std::uint64_t>(d);
  // One sample must be addressable: W * row * itemsize in 63 bits (the rows themselves fit, being in a file).
  unsigned __int128 sample_bytes = static_cast<unsigned __int128>(window_) * x_row_elems_ * options_.out_size;
  if (sample_bytes > static_cast<unsigned __int128>(INT64_MAX) / 65536) {
    throw InvalidArgument("window " + std::to_string(window_) + " is too large for rows of " + std::to_string(x_row_elems_) +
                          " elements");
  }
  if (index_.size() == 0) {
    std::string names;
    for (const auto& n : index_.sources) names += (names.empty() ? "" : ", ") + n;
    throw InvalidArgument("the index is empty (" + names + ")");
  }

  samples_.clear();
  samples_.reserve(index_.size());
  skipped_ = 0;
  for (std::size_t i = 0; i < index_.size(); ++i) {
    const std::uint32_t key = index_.key_id[i];
    const std::int64_t feature = index_.feature_index[i];
    const std::int64_t label = index_.label_index[i];
    const std::int64_t rows = factors_[key].rows();
    const std::int64_t label_rows = labels_[key].rows();
    // In 128 bits: index lines may hold any int64, and feature - W + 1 must not wrap.
    const __int128 first = static_cast<__int128>(feature) - window_ + 1;
    const bool window_ok = first >= 0 && feature < rows;
    const bool label_ok = label >= 0 && label < label_rows;
    if (!(window_ok && label_ok)) {
      if (options_.bounds == Bounds::kSkip) {
        ++skipped_;
        continue;
      }
      if (options_.bounds == Bounds::kError) {
        std::string what = !window_ok
            ? "window rows [" + int128_text(first) + ", " + int128_text(static_cast<__int128>(feature) + 1) + ") outside " +
                  factors_[key].name + " (" + std::to_string(rows) + " rows)"
            : "label row " + std::to_string(label) + " outside " + labels_[key].name + " (" +
                  std::to_string(label_rows) + " rows)";
        throw IndexOutOfRange(index_.where(i) + ": key '" + index_.keys[key] + "': " + what +
                              " (use bounds='skip' or bounds='pad' to accept such lines)");
      }
    }
    samples_.push_back({feature, label, key, static_cast<std::uint32_t>(i)});
  }
}

std::vector<std::int64_t> WindowSource::x_shape() const {
  std::vector<std::int64_t> s{window_};
  s.insert(s.end(), x_row_shape_.begin(), x_row_shape_.end());
  return s;
}

std::vector<std::int64_t> WindowSource::y_shape() const { return y_row_shape_; }

std::string WindowSource::describe(std::size_t sample) const {
  const Sample& s = samples_.at(sample);
  return index_.where(s.index_pos) + ": key '" + index_.keys[s.key] + "', feature_index " + std::to_string(s.feature) +
         ", label_index " + std::to_string(s.label);
}

struct WindowSource::GatherPlan {
  std::vector<std::int64_t> ids;         // sample ids, in batch order
  std::vector<std::uint32_t> order;      // batch positions grouped by key, by first row within a key
  std::vector<std::size_t> group_begin;  // groups (keys) in `order`, plus an end marker
  std::byte* x = nullptr;
  std::byte* y = nullptr;
};

std::shared_ptr<Job> WindowSource::start_gather(ThreadPool& pool, std::vector<std::int64_t> sample_ids, std::byte* x,
                                                std::byte* y) {
  auto plan = std::make_shared<GatherPlan>();
  for (std::int64_t id : sample_ids) {
    if (id < 0 || static_cast<std::uint64_t>(id) >= samples_.size()) {
      throw IndexOutOfRange("sample id " + std::to_string(id) + " out of range for " + std::to_string(samples_.size()) +
                            " samples");
    }
  }
  plan->ids = std::move(sample_ids);
  plan->x = x;
  plan->y = y;
  plan->order.resize(plan->ids.size());
  std::iota(plan->order.begin(), plan->order.end(), 0u);
  std::sort(plan->order.begin(), plan->order.end(), [&](std::uint32_t a, std::uint32_t b) {
    const Sample& sa = samples_[static_cast<std::size_t>(plan->ids[a])];
    const Sample& sb = samples_[static_cast<std::size_t>(plan->ids[b])];
    return sa.key != sb.key ? sa.key < sb.key : sa.feature < sb.feature;
  });
  for (std::size_t i = 0; i < plan->order.size(); ++i) {
    if (i == 0 || samples_[static_cast<std::size_t>(plan->ids[plan->order[i]])].key !=
                      samples_[static_cast<std::size_t>(plan->ids[plan->order[i - 1]])].key) {
      plan->group_begin.push_back(i);
    }
  }
  const std::size_t groups = plan->group_begin.size();
  plan->group_begin.push_back(plan->order.size());
  hint_will_need(*plan);
  auto self = shared_from_this();
  // O_DIRECT workers spend their time waiting for the device: more of them keep its queue deep (the page
  // cache modes get that depth from the WILLNEED hints instead).
  const std::size_t workers = options_.mode == ReadMode::kDirect && !options_.memory ? kDirectDepth * options_.threads
                                                                                      : options_.threads;
  return pool.start(groups, workers, [self, plan](std::size_t g) { self->gather_key(*plan, g); });
}

namespace {

// Whether the byte at `offset` of a factor source is in the page cache (mincore for a mapping, a 1-byte
// RWF_NOWAIT read for a descriptor). Unknown counts as resident: the hint is only an optimisation.
bool probably_cached(const ArraySource& source, std::uint64_t offset) {
  static const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  if (source.mapping && source.mapping->data() != nullptr) {
    const std::uint64_t at = offset / page * page;
    unsigned char resident = 1;
    if (::mincore(const_cast<std::byte*>(source.mapping->data()) + at, 1, &resident) != 0) return true;
    return (resident & 1) != 0;
  }
  if (source.file.is_open()) {
    char byte;
    struct iovec iov {&byte, 1};
    ssize_t got = ::preadv2(source.file.fd(), &iov, 1, static_cast<off_t>(offset), RWF_NOWAIT);
    return !(got < 0 && errno == EAGAIN);
  }
  return true;
}

}  // namespace

// On a cold cache, tells the kernel about every window of the batch before the workers touch them: it then
// reads them all concurrently (a deep device queue) instead of one page fault or pread at a time per worker.
// A few residency probes first, so a warm cache pays almost nothing (a hint costs ~10 us per window even
// when everything is cached). Skipped for O_DIRECT, which bypasses the page cache.
void WindowSource::hint_will_need(const GatherPlan& plan) const {
  if (options_.memory || options_.mode == ReadMode::kDirect || plan.ids.empty()) return;
  auto window_bytes = [&](const Sample& s, std::uint64_t& offset, std::uint64_t& length) {
    const ArraySource& factor = factors_[s.key];
    if (factor.header.fortran_order && factor.header.shape.size() == 2 && factor.header.shape[1] > 1) return false;
    const std::uint64_t row_bytes = factor.row_elems() * factor.header.itemsize;
    const std::int64_t rows = factor.rows();
    const auto first = static_cast<std::int64_t>(std::clamp<__int128>(static_cast<__int128>(s.feature) - window_ + 1, 0, rows));
    const auto end = static_cast<std::int64_t>(std::clamp<__int128>(static_cast<__int128>(s.feature) + 1, 0, rows));
    if (end <= first || row_bytes == 0) return false;
    offset = factor.header.data_offset + static_cast<std::uint64_t>(first) * row_bytes;
    length = static_cast<std::uint64_t>(end - first) * row_bytes;
    return true;
  };
  constexpr std::size_t kProbes = 8;
  bool cold = false;
  const std::size_t n = plan.ids.size();
  for (std::size_t p = 0; p < kProbes && p < n && !cold; ++p) {
    const Sample& s = samples_[static_cast<std::size_t>(plan.ids[p * n / std::min(n, kProbes)])];
    std::uint64_t offset, length;
    if (!window_bytes(s, offset, length)) continue;
    const ArraySource& factor = factors_[s.key];
    cold = !probably_cached(factor, offset) || !probably_cached(factor, offset + length - 1);
  }
  if (!cold) return;
  for (std::int64_t id : plan.ids) {
    const Sample& s = samples_[static_cast<std::size_t>(id)];
    const ArraySource& factor = factors_[s.key];
    std::uint64_t offset, length;
    if (!window_bytes(s, offset, length)) continue;
    if (factor.mapping) {
      factor.mapping->will_need(offset, length);
    } else if (factor.file.is_open()) {
      ::posix_fadvise(factor.file.fd(), static_cast<off_t>(offset), static_cast<off_t>(length), POSIX_FADV_WILLNEED);
    }
  }
}

const std::byte* WindowSource::fetch_rows(const ArraySource& source, std::int64_t first, std::int64_t last,
                                          std::vector<std::byte>& transpose_scratch) const {
  const NpyHeader& h = source.header;
  const std::uint64_t isz = h.itemsize;
  const std::uint64_t row_bytes = source.row_elems() * isz;
  const std::uint64_t count = static_cast<std::uint64_t>(last - first);
  const std::uint64_t bytes = count * row_bytes;
  const std::uint64_t rows = static_cast<std::uint64_t>(source.rows());

  if (h.fortran_order && h.shape.size() == 2 && h.shape[1] > 1) {
    // Column-major file: element (t, f) lives at (t + f * rows). Collect the rows into C order.
    const std::uint64_t cols = static_cast<std::uint64_t>(h.shape[1]);
    transpose_scratch.resize(bytes);
    std::vector<std::byte> column(count * isz);
    // Columns are short and scattered: read them buffered, through a plain descriptor.
    File plain;
    const File* file = &source.file;
    if (source.memory == nullptr && (!source.file.is_open() || source.file_is_direct)) {
      plain = reopen(source, /*direct=*/false);
      file = &plain;
    }
    for (std::uint64_t f = 0; f < cols; ++f) {
      const std::byte* src;
      const std::uint64_t elem = f * rows + static_cast<std::uint64_t>(first);
      if (source.memory != nullptr) {
        src = source.memory + elem * isz;
      } else {
        file->read_exact(column.data(), column.size(), h.data_offset + elem * isz);
        src = column.data();
      }
      for (std::uint64_t t = 0; t < count; ++t) {
        std::memcpy(transpose_scratch.data() + (t * cols + f) * isz, src + t * isz, isz);
      }
    }
    return transpose_scratch.data();
  }

  if (source.memory != nullptr) return source.memory + static_cast<std::uint64_t>(first) * row_bytes;

  const std::uint64_t offset = h.data_offset + static_cast<std::uint64_t>(first) * row_bytes;
  File reopened;
  const File* file = &source.file;
  const bool direct = options_.mode == ReadMode::kDirect && !source.direct_refused->load();
  // Descriptors are reopened when there were too many files to keep them, and when a kept O_DIRECT one
  // must serve buffered reads (after the filesystem refused an aligned read).
  if (!file->is_open() || (source.file_is_direct && !direct)) {
    reopened = reopen(source, direct);
    file = &reopened;
  }
  if (direct) {
    const std::size_t align = source.direct_align;
    const std::size_t lead = offset % align;
    std::byte* base = scratch_buffer(align_up(lead + bytes, align) + align, align);
    if (read_direct_into(*file, align, base + lead, offset, bytes)) return base + lead;
    source.direct_refused->store(true);
    file = &(reopened = reopen(source, /*direct=*/false));
  }
  std::byte* dest = scratch_buffer(bytes, kBufferAlignment);
  file->read_exact(dest, bytes, offset);
  return dest;
}

void WindowSource::read_rows_into(const ArraySource& source, std::int64_t first, std::int64_t last, std::byte* dest) const {
  const std::uint64_t row_bytes = source.row_elems() * source.header.itemsize;
  const std::uint64_t offset = source.header.data_offset + static_cast<std::uint64_t>(first) * row_bytes;
  const std::uint64_t bytes = static_cast<std::uint64_t>(last - first) * row_bytes;
  if (source.file.is_open()) {
    source.file.read_exact(dest, bytes, offset);
    return;
  }
  reopen(source, /*direct=*/false).read_exact(dest, bytes, offset);
}

namespace {

template <class Out>
void convert_rows(const std::byte* src, const ScalarType& type, std::uint64_t elems, std::byte* dst) {
  detail::convert<Out>(src, type, elems, reinterpret_cast<Out*>(dst));
}

}  // namespace

void WindowSource::gather_key(const GatherPlan& plan, std::size_t group) const {
  const std::size_t begin = plan.group_begin[group];
  const std::size_t end = plan.group_begin[group + 1];
  const std::uint32_t key = samples_[static_cast<std::size_t>(plan.ids[plan.order[begin]])].key;
  const ArraySource& factor = factors_[key];
  const ArraySource& label = labels_[key];
  const std::uint64_t out_size = options_.out_size;
  const std::uint64_t x_row_out = x_row_elems_ * out_size;
  const std::uint64_t y_row_out = y_row_elems_ * out_size;
  auto convert = [&](const std::byte* src, const ScalarType& type, std::uint64_t elems, std::byte* dst) {
    if (out_size == 4) convert_rows<float>(src, type, elems, dst);
    else convert_rows<double>(src, type, elems, dst);
  };
  const bool from_memory = factor.memory != nullptr;
  const std::uint64_t span_limit = from_memory ? UINT64_MAX : kMaxSpanBytes;
  const std::uint64_t gap_limit = from_memory ? UINT64_MAX : kMergeGapBytes;
  std::vector<std::byte> transpose_scratch;

  // Factor windows, in order of first row; nearby windows are fetched together.
  {
    const std::int64_t rows = factor.rows();
    const std::uint64_t src_row_bytes = factor.row_elems() * factor.header.itemsize;
    // Window ends in 128 bits (feature_index may be any int64 under bounds='pad'), clipped to the array.
    auto clip = [&](__int128 r) { return static_cast<std::int64_t>(std::clamp<__int128>(r, 0, rows)); };
    auto window_first = [&](const Sample& sample) { return static_cast<__int128>(sample.feature) - window_ + 1; };
    auto window_end = [&](const Sample& sample) { return static_cast<__int128>(sample.feature) + 1; };
    std::size_t i = begin;
    while (i < end) {
      const Sample& si = samples_[static_cast<std::size_t>(plan.ids[plan.order[i]])];
      std::int64_t r0 = clip(window_first(si));
      std::int64_t r1 = clip(window_end(si));
      std::size_t j = i + 1;
      for (; j < end; ++j) {
        const Sample& sj = samples_[static_cast<std::size_t>(plan.ids[plan.order[j]])];
        const std::int64_t s0 = clip(window_first(sj));
        const std::int64_t s1 = clip(window_end(sj));
        if (static_cast<std::uint64_t>(std::max<std::int64_t>(s0 - r1, 0)) * src_row_bytes > gap_limit) break;
        if (static_cast<std::uint64_t>(std::max(r1, s1) - r0) * src_row_bytes > span_limit) break;
        r1 = std::max(r1, s1);
      }
      // One window, stored exactly as the output wants it, read with pread: read it straight into place.
      const ScalarType& st = factor.header.scalar;
      if (j == i + 1 && options_.mode == ReadMode::kRead && factor.memory == nullptr && !factor.header.fortran_order &&
          st.kind == 'f' && st.size == options_.out_size && !st.swapped && r1 - r0 == window_) {
        const std::uint32_t pos = plan.order[i];
        std::byte* out = plan.x + static_cast<std::uint64_t>(pos) * static_cast<std::uint64_t>(window_) * x_row_out;
        read_rows_into(factor, r0, r1, out);
        i = j;
        continue;
      }
      const std::byte* rows_data = r1 > r0 ? fetch_rows(factor, r0, r1, transpose_scratch) : nullptr;
      for (std::size_t k = i; k < j; ++k) {
        const std::uint32_t pos = plan.order[k];
        const Sample& s = samples_[static_cast<std::size_t>(plan.ids[pos])];
        std::byte* out = plan.x + static_cast<std::uint64_t>(pos) * static_cast<std::uint64_t>(window_) * x_row_out;
        const __int128 first = window_first(s);
        const std::int64_t a = clip(first);
        const std::int64_t b = clip(window_end(s));
        // Rows before the array, the rows inside it, rows after it (zeros only under bounds='pad').
        const auto before = static_cast<std::int64_t>(std::min<__int128>(std::max<__int128>(a - first, 0), window_));
        const std::int64_t inside = std::max<std::int64_t>(b - a, 0);
        std::memset(out, 0, static_cast<std::size_t>(before) * x_row_out);
        if (inside > 0) {
          convert(rows_data + static_cast<std::uint64_t>(a - r0) * src_row_bytes, factor.header.scalar,
                  static_cast<std::uint64_t>(inside) * x_row_elems_, out + static_cast<std::uint64_t>(before) * x_row_out);
        }
        const std::int64_t after = window_ - before - inside;
        std::memset(out + static_cast<std::uint64_t>(before + inside) * x_row_out, 0, static_cast<std::size_t>(after) * x_row_out);
      }
      i = j;
    }
  }

  // Label rows: same merging, in order of label row.
  {
    std::vector<std::uint32_t> by_label(plan.order.begin() + static_cast<std::ptrdiff_t>(begin),
                                        plan.order.begin() + static_cast<std::ptrdiff_t>(end));
    std::sort(by_label.begin(), by_label.end(), [&](std::uint32_t a, std::uint32_t b) {
      return samples_[static_cast<std::size_t>(plan.ids[a])].label < samples_[static_cast<std::size_t>(plan.ids[b])].label;
    });
    const std::int64_t rows = label.rows();
    const std::uint64_t src_row_bytes = label.row_elems() * label.header.itemsize;
    const bool label_memory = label.memory != nullptr;
    std::size_t i = 0;
    while (i < by_label.size()) {
      const std::int64_t l0 = samples_[static_cast<std::size_t>(plan.ids[by_label[i]])].label;
      if (l0 < 0 || l0 >= rows) {  // only under bounds='pad'
        std::memset(plan.y + static_cast<std::uint64_t>(by_label[i]) * y_row_out, 0, y_row_out);
        ++i;
        continue;
      }
      std::int64_t l1 = l0 + 1;
      std::size_t j = i + 1;
      for (; j < by_label.size(); ++j) {
        const std::int64_t lj = samples_[static_cast<std::size_t>(plan.ids[by_label[j]])].label;
        if (lj >= rows) break;
        if (!label_memory && (static_cast<std::uint64_t>(std::max<std::int64_t>(lj - l1, 0)) * src_row_bytes > kMergeGapBytes ||
                              static_cast<std::uint64_t>(lj + 1 - l0) * src_row_bytes > kMaxSpanBytes)) {
          break;
        }
        l1 = std::max(l1, lj + 1);
      }
      const std::byte* rows_data = fetch_rows(label, l0, l1, transpose_scratch);
      for (std::size_t k = i; k < j; ++k) {
        const std::uint32_t pos = by_label[k];
        const std::int64_t l = samples_[static_cast<std::size_t>(plan.ids[pos])].label;
        convert(rows_data + static_cast<std::uint64_t>(l - l0) * src_row_bytes, label.header.scalar, y_row_elems_,
                plan.y + static_cast<std::uint64_t>(pos) * y_row_out);
      }
      i = j;
    }
  }
}

// ---- epoch order ------------------------------------------------------------------------------

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

// ---- read-ahead ---------------------------------------------------------------------------------

BatchStream::BatchStream(std::shared_ptr<WindowSource> source, std::vector<std::int64_t> order, std::size_t batch_size,
                         bool drop_remainder, std::size_t prefetch, std::size_t start_batch)
    : source_(std::move(source)),
      order_(std::move(order)),
      batch_size_(batch_size),
      prefetch_(std::max<std::size_t>(prefetch, 1)),
      buffers_(std::make_shared<BufferPool>(2 * (std::max<std::size_t>(prefetch, 1) + 2))) {
  if (batch_size_ == 0) throw InvalidArgument("batch_size must be at least 1");
  num_batches_ = drop_remainder ? order_.size() / batch_size_ : (order_.size() + batch_size_ - 1) / batch_size_;
  next_start_ = std::min(start_batch, num_batches_);
}

BatchStream::~BatchStream() { close(); }

void BatchStream::fill() {
  while (!closed_ && pending_.size() < prefetch_ && next_start_ < num_batches_) {
    const std::size_t first = next_start_ * batch_size_;
    const std::size_t count = std::min(batch_size_, order_.size() - first);
    std::vector<std::int64_t> ids(order_.begin() + static_cast<std::ptrdiff_t>(first),
                                  order_.begin() + static_cast<std::ptrdiff_t>(first + count));
    Pending p;
    p.batch.count = count;
    p.batch.x = buffers_->acquire(count * source_->x_sample_bytes());
    p.batch.y = buffers_->acquire(count * source_->y_sample_bytes());
    p.job = source_->start_gather(shared_pool(), std::move(ids), p.batch.x->data(), p.batch.y->data());
    pending_.push_back(std::move(p));
    ++next_start_;
  }
}

std::shared_ptr<Job> BatchStream::next_job() {
  std::lock_guard lock(mutex_);
  fill();
  return pending_.empty() ? nullptr : pending_.front().job;
}

BatchStream::Batch BatchStream::take() {
  std::lock_guard lock(mutex_);
  if (closed_ || pending_.empty()) return {};  // closed meanwhile (by another thread)
  Pending p = std::move(pending_.front());
  pending_.pop_front();
  p.job->wait();
  fill();  // start the next read-ahead before handing this batch out
  return std::move(p.batch);
}

void BatchStream::close() {
  std::lock_guard lock(mutex_);
  closed_ = true;
  for (auto& p : pending_) p.job->cancel();
  for (auto& p : pending_) {
    if (p.job->orphaned()) continue;  // forked child: the workers, and so the job, do not exist here
    try {
      p.job->wait();
    } catch (...) {
      // a cancelled read-ahead: nobody wants its result or its error
    }
  }
  pending_.clear();
}

}  // namespace npyfeed
