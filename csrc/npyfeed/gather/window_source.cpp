#include "npyfeed/gather/window_source.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "npyfeed/common/errors.hpp"
#include "npyfeed/common/settings.hpp"
#include "npyfeed/format/npz.hpp"
#include "npyfeed/gather/convert.hpp"
#include "npyfeed/io/file.hpp"

namespace npyfeed {

Bounds parse_bounds(const std::string& name) {
  if (name == "error") return Bounds::kError;
  if (name == "skip") return Bounds::kSkip;
  if (name == "pad") return Bounds::kPad;
  throw InvalidArgument("bounds must be 'error', 'skip' or 'pad', not '" + name + "'");
}

std::uint32_t parse_out_dtype(const std::string& name) {
  if (name == "float32") return 4;
  if (name == "float64") return 8;
  throw InvalidArgument("dtype must be float32 or float64, not '" + name + "'");
}

namespace {

// Label files up to this size are read whole at open in read/direct modes: a label row is a few bytes,
// and reading one costs a whole (4 KiB, or O_DIRECT-aligned) IO per sample.
constexpr std::uint64_t kReadWholeLabelBytes = 64u << 20;

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

bool fds_fit(std::size_t wanted) { return wanted + 64 <= descriptor_budget(); }

bool populate_enabled() { return settings::populate().value_or(true); }

}  // namespace

WindowSource::~WindowSource() { populate_stop_->store(true, std::memory_order_relaxed); }

WindowSource::WindowSource(SampleIndex index, WindowOptions options)
    : index_(std::move(index)), options_(options), window_(options.window) {
  index_.finish();
  if (window_ < 1) throw InvalidArgument("window must be at least 1, got " + std::to_string(window_));
  if (options_.out_size != 4 && options_.out_size != 8)
    throw InvalidArgument("output dtype must be float32 or float64");
  if (options_.threads < 1) throw InvalidArgument("threads must be at least 1");
  if (options_.dense) dense_.emplace(*options_.dense, window_);
  const std::size_t keys = index_.keys.size();
  factors_.resize(keys);
  labels_.resize(keys);
  open_errors_.resize(keys);
  in_archive_.resize(keys);
  keep_fds_ = fds_fit(2 * keys);
  if (options_.mode == ReadMode::kMmap) {
    // One mapping per file while they fit in the budget; beyond it, files are mapped on demand through a
    // bounded cache (a data set of 33,000 keys would need more than the default vm.max_map_count).
    const std::size_t budget = mapping_budget();
    if (2 * keys > budget) mappings_ = std::make_shared<MappingCache>(budget);
  }
}

std::shared_ptr<ArrayReader> WindowSource::open_npz(const std::string& path) const {
  auto archive = NpzArchive::open(path);
  std::size_t member = 0;
  if (!options_.npz_member.empty()) {
    member = archive->find(options_.npz_member);
  } else if (archive->members().size() != 1) {
    throw InvalidArgument(path + ": the archive holds " + std::to_string(archive->members().size()) +
                          " arrays; name the one to read (member=)");
  }
  bool view = false;
  auto reader = archive->open_member(member, options_.mode, options_.max_header_size, &view);
  if (!view) {
    // Inflated (or copied) once per open and held for the source's life: bounded, so that a data set of
    // compressed archives cannot silently take more memory than the machine has.
    std::uint64_t limit = options_.npz_memory_limit;
    if (limit == 0) {
      limit = static_cast<std::uint64_t>(::sysconf(_SC_PHYS_PAGES)) *
              static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE)) / 2;
    }
    const std::uint64_t total = npz_memory_.fetch_add(reader->header().nbytes) + reader->header().nbytes;
    if (total > limit) {
      throw InvalidArgument(path + ": .npz members held in memory would take " + std::to_string(total) +
                            " bytes, over the limit of " + std::to_string(limit) +
                            " (npz_memory_limit; stored members in mode 'mmap' are mapped, not held)");
    }
  }
  return reader;
}

ArraySource WindowSource::open_file(const std::string& path, bool label) const {
  ReaderOptions reader_options;
  reader_options.mode = options_.mode;
  reader_options.max_header_size = options_.max_header_size;
  reader_options.keep_open = keep_fds_;
  reader_options.mappings = mappings_;
  reader_options.read_whole_up_to = label ? kReadWholeLabelBytes : 0;
  ArraySource source{path.ends_with(".npz") ? open_npz(path) : ArrayReader::open(path, reader_options)};
  const NpyHeader& h = source.header();
  if (!detail::convertible(h.scalar)) {
    throw InvalidArgument(path + ": dtype '" + (h.descr_text.empty() ? std::string("structured") : h.descr_text) +
                          "' cannot be converted to float (bool, integer and float16/32/64 files can)");
  }
  if (h.shape.empty()) throw InvalidArgument(path + ": a 0-d array has no rows");
  if (h.fortran_order && h.shape.size() > 2) {
    throw InvalidArgument(path + ": Fortran-order arrays with more than 2 dimensions are not supported for windows");
  }
  return source;
}

namespace {

// Whether the first page of every file of a few keys spread over the data set is in the page cache (files
// that cannot be opened, e.g. a `.npz` in place of a `.npy`, are left to the open to report).
bool sample_looks_cached(const std::vector<std::string>& factor_paths, const std::vector<std::string>& label_paths) {
  constexpr std::size_t kSampledKeys = 8;
  const std::size_t keys = factor_paths.size();
  const std::size_t sampled = std::min(keys, kSampledKeys);
  for (std::size_t i = 0; i < sampled; ++i) {
    const std::size_t key = i * keys / sampled;
    for (const std::string* path : {&factor_paths[key], &label_paths[key]}) {
      try {
        if (!File::open(*path).probably_cached(0)) return false;
      } catch (const Error&) {
      }
    }
  }
  return true;
}

}  // namespace

void WindowSource::open_key(std::size_t key, const std::string& factor_path, const std::string& label_path) {
  std::string missing;
  // `<key>.npy`, else `<key>.npz` beside it.
  auto open_one = [&](const std::string& path, ArraySource& into, bool label) {
    const std::uint8_t bit = label ? 2 : 1;
    try {
      into = open_file(path, label);
      if (path.ends_with(".npz")) in_archive_[key] |= bit;
      return;
    } catch (const OsError& e) {
      if (e.error_number() != ENOENT) throw;
    }
    const bool npy = path.ends_with(".npy");
    try {
      if (npy) {
        into = open_file(path.substr(0, path.size() - 4) + ".npz", label);
        in_archive_[key] |= bit;
        return;
      }
    } catch (const OsError& e) {
      if (e.error_number() != ENOENT) throw;
    }
    missing += (missing.empty() ? "" : ", ") + path + (npy ? " (or .npz)" : "");
  };
  open_one(factor_path, factors_[key], false);
  open_one(label_path, labels_[key], true);
  if (!missing.empty()) open_errors_[key] = "key '" + index_.keys[key] + "': " + missing;
}

std::shared_ptr<Job> WindowSource::start_open(ThreadPool& pool, std::vector<std::string> factor_paths,
                                              std::vector<std::string> label_paths) {
  if (factor_paths.size() != index_.keys.size() || label_paths.size() != index_.keys.size()) {
    throw InvalidArgument("one factor and one label path per key are needed");
  }
  reads_files_ = true;
  auto self = shared_from_this();
  auto f = std::make_shared<std::vector<std::string>>(std::move(factor_paths));
  auto l = std::make_shared<std::vector<std::string>>(std::move(label_paths));
  // Where its files are not in the page cache, an open waits for a read (the header; in "read" and "direct"
  // modes a small label file, read whole): then many in flight, which a device answers together. Where they
  // are, it is CPU and memory work (a label file read whole into fresh pages), done best by `threads`
  // workers: more only contend for the page tables (measured: a warm "read" open of 14,000 keys took 1.5-2.5x
  // as long with 16). O_DIRECT reads never come from the cache.
  const bool waits_for_device = options_.mode == ReadMode::kDirect || !sample_looks_cached(*f, *l);
  const std::size_t workers = waits_for_device ? std::max(options_.threads, kOpensInFlight) : options_.threads;
  return pool.start(index_.keys.size(), workers, [self, f, l](std::size_t k) { self->open_key(k, (*f)[k], (*l)[k]); });
}

void WindowSource::set_memory_source(std::size_t key, bool label, std::shared_ptr<const void> owner,
                                     const std::byte* data, std::vector<std::int64_t> shape,
                                     const std::string& typestr) {
  const std::string name = std::string(label ? "labels" : "factors") + "['" + index_.keys.at(key) + "']";
  NpyHeader h;
  try {
    h.itemsize = dtype_str_itemsize(typestr, &h.scalar);
  } catch (const NpyFormatError&) {
    h.scalar = {};
  }
  if (!detail::convertible(h.scalar)) {
    throw InvalidArgument(name + ": dtype '" + typestr + "' cannot be converted to float");
  }
  if (shape.empty()) throw InvalidArgument(name + ": a 0-d array has no rows");
  h.descr_text = typestr;
  h.nbytes = h.itemsize;
  for (std::int64_t d : shape) h.nbytes *= static_cast<std::uint64_t>(d);
  h.shape = std::move(shape);
  h.fortran_order = false;
  (label ? labels_ : factors_).at(key).reader =
      ArrayReader::in_memory(name, std::move(h), std::move(owner), data, false);
}

void WindowSource::finish_open() {
  std::vector<std::string> missing;
  for (const auto& e : open_errors_) {
    if (!e.empty()) missing.push_back(e);
  }
  if (!missing.empty() && (!options_.skip_missing || missing.size() == index_.keys.size())) {
    std::string msg =
        std::to_string(missing.size()) + " of " + std::to_string(index_.keys.size()) + " keys have no data file: ";
    for (std::size_t i = 0; i < std::min<std::size_t>(missing.size(), 5); ++i) msg += (i ? "; " : "") + missing[i];
    if (missing.size() > 5) msg += "; ...";
    msg += options_.skip_missing ? " (no key is left to read)"
                                 : " (missing='skip' leaves such keys out, with their samples, and warns)";
    std::string first = missing[0].substr(missing[0].find(": ") + 2);
    first = first.substr(0, first.find(", "));
    throw OsError(ENOENT, first, msg);
  }
  // skip_missing: a key without a file reads as arrays of 0 rows shaped as the first whole key's (so the shape
  // checks pass and a dense layout gives it no window); apply_bounds drops its samples.
  missing_keys_.clear();
  for (std::size_t k = 0, whole = 0; !missing.empty() && k < open_errors_.size(); ++k) {
    if (open_errors_[k].empty()) continue;
    while (!open_errors_[whole].empty()) ++whole;
    missing_keys_.push_back(k);
    for (int which = 0; which < 2; ++which) {
      NpyHeader h = (which == 0 ? factors_[whole] : labels_[whole]).header();
      h.shape[0] = 0;
      h.nbytes = 0;
      (which == 0 ? factors_[k] : labels_[k]).reader =
          ArrayReader::in_memory(open_errors_[k], h, nullptr, nullptr, false);
    }
  }
  if (index_.keys.empty()) {
    x_row_shape_.clear();
    y_row_shape_.clear();
  } else {
    x_row_shape_.assign(factors_[0].header().shape.begin() + 1, factors_[0].header().shape.end());
    y_row_shape_.assign(labels_[0].header().shape.begin() + 1, labels_[0].header().shape.end());
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
      std::vector<std::int64_t> row(s.header().shape.begin() + 1, s.header().shape.end());
      if (row != expected) {
        const ArraySource& first = which == 0 ? factors_[0] : labels_[0];
        throw InvalidArgument(s.name() + ": rows of shape " + shape_text(row) + " do not match " + first.name() +
                              " (rows of shape " + shape_text(expected) + ")");
      }
    }
  }
  if (!dense_ && index_.size() == 0) {
    std::string names;
    for (const auto& n : index_.sources) names += (names.empty() ? "" : ", ") + n;
    throw InvalidArgument("the index is empty (" + names + ")");
  }
  transform_ = GatherTransform(options_.transform, x_row_shape_, y_row_shape_, options_.out_size);
  x_row_elems_ = transform_.x().out_elems();
  y_row_elems_ = transform_.y().out_elems();
  // One sample must be addressable: W * row * itemsize in 63 bits (the rows themselves fit, being in a file).
  unsigned __int128 sample_bytes = static_cast<unsigned __int128>(window_) * x_row_elems_ * options_.out_size;
  if (sample_bytes > static_cast<unsigned __int128>(INT64_MAX) / 65536) {
    throw InvalidArgument("window " + std::to_string(window_) + " is too large for rows of " +
                          std::to_string(x_row_elems_) + " elements");
  }
  if (dense_) {
    std::vector<std::int64_t> rows(factors_.size()), label_rows(labels_.size());
    for (std::size_t k = 0; k < factors_.size(); ++k) {
      rows[k] = factors_[k].rows();
      label_rows[k] = labels_[k].rows();
    }
    dense_->layout(rows, label_rows);
    size_ = dense_->size();
    if (size_ == 0) {
      throw InvalidArgument("no window of " + std::to_string(window_) + " rows (label row + horizon " +
                            std::to_string(dense_->options().horizon) + ") fits in any of the " +
                            std::to_string(factors_.size()) + " keys' arrays");
    }
  } else {
    apply_bounds();
  }
  std::size_t reads_in_flight = 1;
  std::size_t queue_depth = 0;
  for (const auto* sources : {&factors_, &labels_}) {
    for (const ArraySource& s : *sources) {
      reads_in_flight = std::max(reads_in_flight, s.reader->reads_in_flight_per_thread());
      queue_depth = std::max(queue_depth, s.reader->queue_depth());
    }
  }
  // Readers that queue their reads keep them in flight from one worker per thread (a work item of that many
  // keys); the others get their reads in flight from more workers, each blocking in its read.
  keys_per_item_ = std::max<std::size_t>(2 * queue_depth, 1);
  queued_reads_ = queue_depth > 0;
  populate_ = reads_files_ && options_.mode == ReadMode::kMmap && !mappings_ && populate_enabled();
  gather_workers_ = (queue_depth > 0 ? 1 : reads_in_flight) * options_.threads;
  if (!keep_fds_) {
    // Every worker may open a file for its read (O_DIRECT: a buffered descriptor too, on a fallback): stay
    // within the descriptor budget whatever the thread count.
    const std::size_t per_worker = options_.mode == ReadMode::kDirect ? 2 : 1;
    gather_workers_ = std::clamp<std::size_t>(descriptor_budget() / per_worker, 1, gather_workers_);
  }
}

// One pass over the index, which stays where it is (a shared mapping, usually): only dropped positions
// are remembered. The common case (int32 rows inside their arrays) is a few compares per sample.
void WindowSource::apply_bounds() {
  dropped_.clear();
  skipped_ = 0;
  missing_samples_ = 0;
  const std::size_t n = index_.size();
  const std::size_t nkeys = index_.keys.size();
  std::vector<std::int64_t> key_rows(nkeys), key_label_rows(nkeys);
  for (std::size_t k = 0; k < nkeys; ++k) {
    key_rows[k] = factors_[k].rows();
    key_label_rows[k] = labels_[k].rows();
  }
  const IndexColumns& columns = index_.columns();
  const std::int32_t* feature_column = columns.feature.data();
  const std::int32_t* label_column = columns.label.data();
  const std::uint32_t* key_column = columns.key.data();
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t key = key_column[i];
    if (key >= nkeys) {
      throw InvalidArgument(index_.where(i) + ": the compiled index names key id " + std::to_string(key) + " of " +
                            std::to_string(nkeys) + " (corrupt index cache)");
    }
    const std::int32_t f32 = feature_column[i];
    const std::int32_t l32 = label_column[i];
    if (f32 != SampleIndex::kWide && l32 != SampleIndex::kWide && f32 >= window_ - 1 && f32 < key_rows[key] &&
        l32 >= 0 && l32 < key_label_rows[key])
      continue;
    if (!missing_keys_.empty() && std::binary_search(missing_keys_.begin(), missing_keys_.end(), key)) {
      ++missing_samples_;
      dropped_.push_back(i);
      continue;
    }
    const std::int64_t feature = index_.feature(i);
    const std::int64_t label = index_.label(i);
    const std::int64_t rows = key_rows[key];
    const std::int64_t label_rows = key_label_rows[key];
    // In 128 bits: index lines may hold any int64, and feature - W + 1 must not wrap.
    const __int128 first = static_cast<__int128>(feature) - window_ + 1;
    const bool window_ok = first >= 0 && feature < rows;
    const bool label_ok = label >= 0 && label < label_rows;
    if (!(window_ok && label_ok)) {
      if (options_.bounds == Bounds::kSkip) {
        ++skipped_;
        dropped_.push_back(i);
        continue;
      }
      if (options_.bounds == Bounds::kError) {
        std::string what = !window_ok ? "window rows [" + int128_text(first) + ", " +
                                            int128_text(static_cast<__int128>(feature) + 1) + ") outside " +
                                            factors_[key].name() + " (" + std::to_string(rows) + " rows)"
                                      : "label row " + std::to_string(label) + " outside " + labels_[key].name() +
                                            " (" + std::to_string(label_rows) + " rows)";
        throw IndexOutOfRange(index_.where(i) + ": key '" + index_.keys[key] + "': " + what +
                              " (use bounds='skip' or bounds='pad' to accept such lines)");
      }
    }
  }
  dropped_.shrink_to_fit();
  size_ = n - dropped_.size();
}

std::vector<std::int64_t> WindowSource::x_shape() const {
  std::vector<std::int64_t> s{window_};
  s.insert(s.end(), transform_.x_row_shape().begin(), transform_.x_row_shape().end());
  return s;
}

std::vector<std::int64_t> WindowSource::y_shape() const { return transform_.y_row_shape(); }

// Sample p is index position p + j, where j counts the dropped positions before it: dropped_[k] has k dropped
// before it and dropped_[k] - k kept ones, so j is the number of k with dropped_[k] - k <= p.
std::uint64_t WindowSource::index_position(std::size_t sample) const {
  std::size_t lo = 0, hi = dropped_.size();
  while (lo < hi) {
    const std::size_t mid = lo + (hi - lo) / 2;
    if (dropped_[mid] - mid <= sample) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return sample + lo;
}

std::function<std::uint32_t(std::size_t)> WindowSource::sample_keys() const {
  struct Cursor {
    std::size_t next = SIZE_MAX;
    std::uint64_t position = 0;
    std::size_t dropped = 0;      // entries of dropped_ before `position`
    std::uint32_t dense_key = 0;  // dense: the key of the last sample asked for (asked in order: a walk, no search)
  };
  return [this, at = Cursor{}](std::size_t i) mutable {
    if (dense_) {
      if (i != at.next) at.dense_key = dense_->key_of(i);
      while (i >= dense_->first(at.dense_key) + dense_->count(at.dense_key)) ++at.dense_key;  // past empty keys
      at.next = i + 1;
      return at.dense_key;
    }
    if (i != at.next) {
      at.position = index_position(i);
      at.dropped =
          static_cast<std::size_t>(std::lower_bound(dropped_.begin(), dropped_.end(), at.position) - dropped_.begin());
    }
    const std::uint32_t key = index_.key(at.position);
    at.next = i + 1;
    for (++at.position; at.dropped < dropped_.size() && dropped_[at.dropped] == at.position; ++at.dropped)
      ++at.position;
    return key;
  };
}

Sample WindowSource::sample(std::size_t sample) const {
  if (dense_) return dense_->sample(sample);
  const std::uint64_t i = index_position(sample);
  return {index_.feature(i), index_.label(i), index_.key(i), static_cast<std::uint32_t>(i)};
}

std::string WindowSource::describe(std::size_t sample) const {
  if (sample >= size_) {
    throw IndexOutOfRange("sample " + std::to_string(sample) + " out of range for " + std::to_string(size_) +
                          " samples");
  }
  if (dense_) {
    const Sample s = dense_->sample(sample);
    return "dense sample " + std::to_string(sample) + ": key '" + index_.keys[s.key] + "', window rows [" +
           std::to_string(s.feature - window_ + 1) + ", " + std::to_string(s.feature + 1) + ") of " +
           factors_[s.key].name() + ", label row " + std::to_string(s.label) + " of " + labels_[s.key].name();
  }
  const std::uint64_t i = index_position(sample);
  return index_.where(i) + ": key '" + index_.keys[index_.key(i)] + "', feature_index " +
         std::to_string(index_.feature(i)) + ", label_index " + std::to_string(index_.label(i));
}

std::vector<std::string> WindowSource::direct_fallbacks() const {
  std::vector<std::string> names;
  for (const auto* sources : {&factors_, &labels_}) {
    for (const ArraySource& source : *sources) {
      if (source.reader && source.reader->fell_back()) names.push_back(source.name());
    }
  }
  return names;
}

void WindowSource::check_files_unchanged() const {
  if (!reads_files_) return;
  std::optional<OsError> first;
  std::size_t changed = 0;
  for (const auto* arrays : {&factors_, &labels_}) {
    for (const ArraySource& array : *arrays) {
      if (!array.reader || !array.reader->origin()) continue;
      try {
        check_unchanged(*array.reader->origin());
      } catch (const OsError& e) {
        if (changed++ == 0) first = e;
      }
    }
  }
  if (changed == 1) throw *first;
  if (changed > 1) throw first->with_note("; " + std::to_string(changed) + " files of this source changed in all");
}

void WindowSource::check_ids(const std::vector<std::int64_t>& sample_ids) const {
  for (std::int64_t id : sample_ids) {
    if (id < 0 || static_cast<std::uint64_t>(id) >= size_) {
      throw IndexOutOfRange("sample id " + std::to_string(id) + " out of range for " + std::to_string(size_) +
                            " samples");
    }
  }
}

std::shared_ptr<Job> WindowSource::start_gather(ThreadPool& pool, std::vector<std::int64_t> sample_ids, std::byte* x,
                                                std::byte* y, const KeyArrays* arrays) {
  check_ids(sample_ids);
  // The batch's samples, looked up once: the gather reads them by batch position.
  auto samples = std::make_shared<std::vector<Sample>>(sample_ids.size());
  for (std::size_t b = 0; b < sample_ids.size(); ++b) {
    (*samples)[b] = sample(static_cast<std::size_t>(sample_ids[b]));
    sample_ids[b] = static_cast<std::int64_t>(b);
  }
  GatherInput input{&factors_, &labels_, samples.get(), window_, options_.out_size, &transform_};
  if (arrays != nullptr) {
    input.factors = &arrays->factors;
    input.labels = &arrays->labels;
  }
  auto gather = std::make_shared<Gather>(input, std::move(sample_ids), x, y);
  auto self = shared_from_this();  // the gather reads this source's arrays: keep them alive while it runs
  // Arrays in memory need no reads in flight (nor descriptors): one worker per thread.
  const std::size_t workers = arrays != nullptr ? options_.threads : gather_workers_;
  // Queued reads: items of four waves of half the queue depth each, the next wave's reads in flight while one
  // is converted (gather.cpp): between a half and a whole queue depth in flight per worker.
  const std::size_t per_item = arrays != nullptr ? 1 : keys_per_item_;
  gather->set_keys_per_wave(std::max<std::size_t>(per_item / 4, 1));
  const std::size_t keys = gather->keys();
  auto job =
      pool.prepare((keys + per_item - 1) / per_item, workers, [self, samples, gather, per_item, keys](std::size_t i) {
        gather->run_keys(i * per_item, std::min(keys, (i + 1) * per_item));
      });
  if (arrays == nullptr && gather->looks_cold()) {
    // Readers that queue their reads keep the device busy by themselves: their gather starts at once.
    if (queued_reads_) pool.launch(job);
    launch_after_will_need(pool, job, gather);
  } else {
    pool.launch(job);
  }
  if (arrays == nullptr && populate_ && !populate_started_.exchange(true)) start_populate();
  return job;
}

std::pair<WindowBatch, std::shared_ptr<Job>> WindowSource::start_batch(ThreadPool& pool,
                                                                       std::vector<std::int64_t> sample_ids,
                                                                       BufferPool* buffers, const KeyArrays* arrays) {
  auto allocate = [&](std::size_t bytes) {
    return buffers != nullptr ? buffers->acquire(bytes) : std::make_shared<AlignedBuffer>(bytes);
  };
  WindowBatch batch;
  batch.count = sample_ids.size();
  batch.x = allocate(batch.count * x_sample_bytes());
  batch.y = allocate(batch.count * y_sample_bytes());
  auto job = start_gather(pool, std::move(sample_ids), batch.x->data(), batch.y->data(), arrays);
  return {std::move(batch), std::move(job)};
}

}  // namespace npyfeed
