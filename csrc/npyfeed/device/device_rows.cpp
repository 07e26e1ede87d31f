#include "npyfeed/device/device_rows.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "npyfeed/common/errors.hpp"
#include "npyfeed/common/thread_pool.hpp"
#include "npyfeed/gather/gather.hpp"
#include "npyfeed/stream/block_stream.hpp"

namespace npyfeed {

namespace {

// Converted rows are staged this many bytes at a time on their way to a narrower storage type.
constexpr std::uint64_t kStageBytes = 8u << 20;

std::uint64_t product(const std::vector<std::int64_t>& shape, std::size_t from) {
  std::uint64_t n = 1;
  for (std::size_t k = from; k < shape.size(); ++k) n *= static_cast<std::uint64_t>(shape[k]);
  return n;
}

// The type the gather converts an array to on its way to `storage`: double where either is float64 (so a
// float64 value is rounded once, to the storage type), else float (as numpy's astype from an integer or a
// narrower float).
std::uint32_t wide_size(const ArraySource& source, StorageType storage) {
  const ScalarType& t = source.header().scalar;
  return storage == StorageType::kFloat64 || (t.kind == 'f' && t.size > 4) ? 8 : 4;
}

template <class Wide>
void narrow(const Wide* src, std::uint64_t n, StorageType storage, std::byte* dst) {
  switch (storage) {
    case StorageType::kFloat64: {
      auto* out = reinterpret_cast<double*>(dst);
      for (std::uint64_t i = 0; i < n; ++i) out[i] = static_cast<double>(src[i]);
      break;
    }
    case StorageType::kFloat32: {
      auto* out = reinterpret_cast<float*>(dst);
      for (std::uint64_t i = 0; i < n; ++i) out[i] = static_cast<float>(src[i]);
      break;
    }
    case StorageType::kFloat16: {
      auto* out = reinterpret_cast<std::uint16_t*>(dst);
      for (std::uint64_t i = 0; i < n; ++i) out[i] = half_bits(static_cast<double>(src[i]));
      break;
    }
    case StorageType::kBFloat16: {
      auto* out = reinterpret_cast<std::uint16_t*>(dst);
      for (std::uint64_t i = 0; i < n; ++i) out[i] = bfloat16_bits(static_cast<float>(src[i]));
      break;
    }
  }
}

// Rows [first, end) of `source` into `dst` in the storage type: converted by the gather's conversion, then
// rounded to the storage type (straight into `dst` where the two are the same type).
void read_storage_rows(const ArraySource& source, const RowTransform& t, std::int64_t first, std::int64_t end,
                       StorageType storage, std::byte* dst) {
  if (end <= first) return;
  const std::uint32_t wide = wide_size(source, storage);
  const std::uint64_t elems = t.out_elems();
  if (wide == storage_size(storage)) {
    read_converted_rows(source, t, first, end, wide, dst);
    return;
  }
  const auto rows_per_stage =
      static_cast<std::int64_t>(std::max<std::uint64_t>(kStageBytes / std::max<std::uint64_t>(elems * wide, 1), 1));
  std::vector<std::byte> stage(static_cast<std::size_t>(std::min<std::int64_t>(rows_per_stage, end - first)) * elems *
                               wide);
  const std::uint64_t out_row = elems * storage_size(storage);
  for (std::int64_t a = first; a < end; a += rows_per_stage) {
    const std::int64_t b = std::min(end, a + rows_per_stage);
    read_converted_rows(source, t, a, b, wide, stage.data());
    const std::uint64_t n = static_cast<std::uint64_t>(b - a) * elems;
    std::byte* out = dst + static_cast<std::uint64_t>(a - first) * out_row;
    if (wide == 8) {
      narrow(reinterpret_cast<const double*>(stage.data()), n, storage, out);
    } else {
      narrow(reinterpret_cast<const float*>(stage.data()), n, storage, out);
    }
  }
}

HostRows allocate_rows(std::uint64_t rows, std::uint64_t row_elems, StorageType storage) {
  HostRows out;
  out.rows = rows;
  out.row_elems = row_elems;
  out.buffer = std::make_shared<AlignedBuffer>(std::max<std::uint64_t>(rows * row_elems * storage_size(storage), 1));
  return out;
}

std::int64_t clamp_row(__int128 row, std::int64_t lo, std::int64_t hi) {
  return static_cast<std::int64_t>(std::clamp<__int128>(row, lo, hi));
}

}  // namespace

StorageType parse_storage_type(const std::string& name) {
  if (name == "float16") return StorageType::kFloat16;
  if (name == "bfloat16") return StorageType::kBFloat16;
  if (name == "float32") return StorageType::kFloat32;
  if (name == "float64") return StorageType::kFloat64;
  throw InvalidArgument("storage_dtype must be one of ('float16', 'bfloat16', 'float32', 'float64'), got '" + name +
                        "'");
}

std::uint32_t storage_size(StorageType type) noexcept {
  switch (type) {
    case StorageType::kFloat16:
    case StorageType::kBFloat16:
      return 2;
    case StorageType::kFloat32:
      return 4;
    case StorageType::kFloat64:
      return 8;
  }
  return 0;
}

std::uint16_t half_bits(double value) noexcept {
  const std::uint16_t sign = std::signbit(value) ? 0x8000 : 0;
  if (std::isnan(value)) {
    // numpy keeps the top of the payload, and a NaN whose kept payload is 0 becomes 0x7c01 (not infinity).
    const auto payload =
        static_cast<std::uint16_t>((std::bit_cast<std::uint64_t>(value) & 0x000FFFFFFFFFFFFFull) >> 42);
    return static_cast<std::uint16_t>(sign | (payload == 0 ? 0x7C01 : 0x7C00 | payload));
  }
  const double a = std::fabs(value);
  if (a >= 65520.0) return sign | 0x7C00;  // past halfway between the largest half (65504) and 2^16: infinity
  // Both scalings below are by powers of two (exact), and nearbyint rounds to nearest even (the default mode).
  if (a < 0x1p-14) {
    // Subnormal: the count of 2^-24 steps, up to 1024, which is the smallest normal's encoding.
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(std::nearbyint(a * 0x1p24)));
  }
  int exp = 0;
  std::frexp(a, &exp);  // a = f * 2^exp, f in [0.5, 1): a in [2^e, 2^(e+1)) for e = exp - 1, in [-14, 15]
  const int e = exp - 1;
  const auto mantissa = static_cast<int>(std::nearbyint(std::ldexp(a, 10 - e)));  // [1024, 2048]: 2048 carries
  return static_cast<std::uint16_t>(sign | (((e + 15) << 10) + mantissa - 1024));
}

std::uint16_t bfloat16_bits(float value) noexcept {
  if (std::isnan(value)) return std::signbit(value) ? 0xFFC0 : 0x7FC0;
  std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  bits += 0x7FFFu + ((bits >> 16) & 1u);  // to nearest even; the largest finite values round to infinity
  return static_cast<std::uint16_t>(bits >> 16);
}

DeviceRows::DeviceRows(std::shared_ptr<EpochPlan> plan, StorageType storage)
    : plan_(std::move(plan)), storage_(storage) {
  const WindowSource& source = plan_->source();
  if (!source.transform().x().identity() || !source.transform().y().identity()) {
    throw InvalidArgument(
        "gather='device' does not apply features=, label_columns=, nan=, posinf=, neginf= or normalize= yet (the "
        "device holds the arrays as they are): use gather='host'");
  }
  x_elems_ = product(source.x_shape(), 1);
  y_elems_ = product(source.y_shape(), 0);
  resident_ = layout_of(plan_->keys());
}

std::int64_t DeviceRows::label_rows(std::size_t key) const { return plan_->source().label_source(key).rows(); }

DeviceRows::Layout DeviceRows::layout_of(const std::vector<std::uint32_t>& keys) const {
  const WindowSource& source = plan_->source();
  Layout layout;
  layout.factor_first.assign(source.num_keys(), -1);
  layout.label_first.assign(source.num_keys(), -1);
  for (const std::uint32_t k : keys) {
    layout.factor_first[k] = layout.factor_zero;
    layout.label_first[k] = layout.label_zero;
    layout.factor_zero += source.factor_source(k).rows();
    layout.label_zero += label_rows(k);
  }
  return layout;
}

std::uint64_t DeviceRows::resident_bytes() const noexcept {
  return (static_cast<std::uint64_t>(resident_.factor_zero + 1) * x_elems_ +
          static_cast<std::uint64_t>(resident_.label_zero + 1) * y_elems_) *
         storage_size(storage_);
}

std::uint64_t DeviceRows::largest_group_bytes() const {
  const WindowSource& source = plan_->source();
  const std::uint64_t item = storage_size(storage_);
  const std::vector<std::uint64_t>& key_bytes = plan_->key_bytes();
  // A block holds keys whose data bytes (as the plan counts them) fit in half the memory budget, or one larger
  // key: its device bytes are at most that cap times the largest device/data ratio of a key, or the largest key's.
  double largest_key = 0, largest_ratio = 0;
  for (std::size_t k = 0; k < source.num_keys(); ++k) {
    const double device = static_cast<double>(static_cast<std::uint64_t>(source.factor_source(k).rows()) * x_elems_ +
                                              static_cast<std::uint64_t>(label_rows(k)) * y_elems_) *
                          static_cast<double>(item);
    largest_key = std::max(largest_key, device);
    const double data = k < key_bytes.size() ? static_cast<double>(std::max<std::uint64_t>(key_bytes[k], 1)) : 1.0;
    largest_ratio = std::max(largest_ratio, device / data);
  }
  const double half_budget = static_cast<double>(plan_->spec().memory_budget / 2);
  const auto block = static_cast<std::uint64_t>(std::max(largest_key, half_budget * largest_ratio)) +
                     (x_elems_ + y_elems_) * item;  // and the zero rows
  const std::uint64_t batch = plan_->spec().batch_size;
  const auto window = static_cast<std::uint64_t>(source.options().window);
  const std::uint64_t straddler = ((batch * window + 1) * x_elems_ + (batch + 1) * y_elems_) * item;
  return std::max(block, straddler);
}

HostRows DeviceRows::read_keys(const std::vector<std::uint32_t>& keys, bool label, bool whole_files) const {
  const WindowSource& source = plan_->source();
  const Layout layout = layout_of(keys);
  const std::uint64_t elems = label ? y_elems_ : x_elems_;
  HostRows out =
      allocate_rows(static_cast<std::uint64_t>((label ? layout.label_zero : layout.factor_zero) + 1), elems, storage_);
  const std::uint64_t row_bytes = elems * storage_size(storage_);
  std::byte* data = out.buffer->data();
  std::memset(data + (out.rows - 1) * row_bytes, 0, row_bytes);
  const RowTransform& t = label ? source.transform().y() : source.transform().x();
  // Whole files wait on the device: on the pool for that, as a block's reads (the gathers' workers never wait
  // in them), with several in flight.
  ThreadPool& pool =
      whole_files ? shared_io_pool(0, source.options().placement) : shared_pool(0, source.options().placement);
  const std::size_t workers =
      whole_files ? std::max<std::size_t>(source.options().threads, 4) : source.options().threads;
  pool.run(keys.size(), workers, [&](std::size_t i) {
    const std::uint32_t k = keys[i];
    const ArraySource array =
        whole_files ? read_block_array(source, k, label) : (label ? source.label_source(k) : source.factor_source(k));
    const std::int64_t first = label ? layout.label_first[k] : layout.factor_first[k];
    read_storage_rows(array, t, 0, label ? label_rows(k) : array.rows(), storage_,
                      data + static_cast<std::uint64_t>(first) * row_bytes);
  });
  plan_->stats()->uploaded(out.rows * row_bytes);
  return out;
}

HostRows DeviceRows::read_resident(bool label) const {
  plan_->source().check_files_unchanged();  // the upload serves every epoch: of the files the source opened
  return read_keys(keys(), label, false);
}

StartRows DeviceRows::start_rows(const std::vector<std::int64_t>& ids, const Layout& layout) const {
  const WindowSource& source = plan_->source();
  const std::int64_t window = source.options().window;
  const bool pad = source.options().bounds == Bounds::kPad;
  StartRows out;
  const std::size_t n = ids.size();
  out.start.resize(n);
  out.lo.assign(n, 0);
  out.hi.assign(n, window);
  out.label.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const Sample s = source.sample(static_cast<std::size_t>(ids[i]));
    if (layout.factor_first[s.key] < 0) {
      throw IndexOutOfRange("gather='device': sample " + std::to_string(ids[i]) + " (" +
                            source.describe(static_cast<std::size_t>(ids[i])) +
                            ") is of a key this pipeline did not upload");
    }
    const __int128 first = static_cast<__int128>(s.feature) - window + 1;
    const std::int64_t rows = source.factor_source(s.key).rows();
    if (pad) {
      out.lo[i] = clamp_row(-first, 0, window);
      out.hi[i] = clamp_row(static_cast<__int128>(rows) - first, 0, window);
    }
    // A window wholly outside its array reads the zero row only: its start is never used (and stays in range).
    out.start[i] = out.lo[i] < out.hi[i] ? static_cast<std::int64_t>(layout.factor_first[s.key] + first) : 0;
    const bool label_inside = s.label >= 0 && s.label < label_rows(s.key);
    out.label[i] = label_inside || !pad ? layout.label_first[s.key] + s.label : layout.label_zero;
  }
  return out;
}

void DeviceRows::check_files_at_epoch_start(std::uint64_t epoch, std::size_t position) const {
  if (position != 0 && files_checked_for_.load(std::memory_order_acquire) == epoch + 1) return;
  plan_->source().check_files_unchanged();
  files_checked_for_.store(epoch + 1, std::memory_order_release);
}

StartRows DeviceRows::rows(std::uint64_t epoch, std::size_t batch) const {
  check_files_at_epoch_start(epoch, batch);
  const std::vector<std::int64_t> ids = plan_->ids(epoch, batch);
  plan_->source().check_ids(ids);
  StartRows out = start_rows(ids, resident_);
  const WindowSource& source = plan_->source();
  plan_->stats()->served(ids.size(), ids.size() * (source.x_sample_bytes() + source.y_sample_bytes()), 0, 0);
  return out;
}

std::shared_ptr<const DeviceRows::EpochGroups> DeviceRows::groups_of(std::uint64_t epoch) const {
  {
    std::lock_guard lock(mutex_);
    if (last_epoch_ && last_epoch_->epoch == epoch) return last_epoch_;
  }
  if (plan_->spec().shuffle != Shuffle::kBlocks)
    throw InvalidArgument("gather='device' streams groups of blocks only with shuffle='blocks'");
  auto out = std::make_shared<EpochGroups>();
  out->epoch = epoch;
  out->blocks = plan_->shard_blocks(epoch);
  const std::vector<ShardBlock>& shard_blocks = out->blocks;
  const std::size_t num_batches = plan_->num_batches();
  const std::uint64_t size = plan_->shard_size();
  // The block holding shard position p: the first whose end is past it.
  auto block_of = [&](std::uint64_t p) {
    return static_cast<std::size_t>(std::upper_bound(shard_blocks.begin(), shard_blocks.end(), p,
                                                     [](std::uint64_t v, const ShardBlock& b) { return v < b.end; }) -
                                    shard_blocks.begin());
  };
  std::vector<DeviceGroup>& groups = out->groups;
  for (std::size_t b = 0; b < num_batches; ++b) {
    const auto [first, end] = plan_->spec().batch_positions(b, size);
    const std::size_t first_block = block_of(first);
    const std::size_t last_block = block_of(end - 1);
    const bool straddles = first_block != last_block;
    // A group starts at every straddling batch, after one, and where the block changes.
    const bool starts = groups.empty() || straddles || groups.back().first_block != groups.back().last_block ||
                        groups.back().first_block != first_block;
    if (starts) {
      groups.push_back({b, b + 1, first_block, last_block});
    } else {
      groups.back().end_batch = b + 1;
    }
  }
  std::lock_guard lock(mutex_);
  last_epoch_ = std::move(out);
  return last_epoch_;
}

std::vector<DeviceGroup> DeviceRows::groups(std::uint64_t epoch) const { return groups_of(epoch)->groups; }

std::uint64_t DeviceRows::streamed_epoch_bytes(std::uint64_t epoch) const {
  const auto epoch_groups = groups_of(epoch);
  const WindowSource& source = plan_->source();
  const auto window = static_cast<std::uint64_t>(source.options().window);
  std::uint64_t rows_x = 0, rows_y = 0;
  for (const DeviceGroup& g : epoch_groups->groups) {
    if (g.first_block == g.last_block) {
      const Layout layout = layout_of(epoch_groups->blocks.at(g.first_block).keys);
      rows_x += static_cast<std::uint64_t>(layout.factor_zero) + 1;
      rows_y += static_cast<std::uint64_t>(layout.label_zero) + 1;
    } else {
      // One batch: its samples' windows and label rows (the last batch may be smaller).
      const auto [first, end] = plan_->spec().batch_positions(g.first_batch, plan_->shard_size());
      const std::uint64_t n = end - first;
      rows_x += n * window + 1;
      rows_y += n + 1;
    }
  }
  return (rows_x * x_elems_ + rows_y * y_elems_) * storage_size(storage_);
}

HostRows DeviceRows::straddler_windows(const std::vector<std::int64_t>& ids, bool label) const {
  const WindowSource& source = plan_->source();
  const std::int64_t window = label ? 1 : source.options().window;
  const std::uint64_t elems = label ? y_elems_ : x_elems_;
  const std::uint64_t row_bytes = elems * storage_size(storage_);
  HostRows out = allocate_rows(ids.size() * static_cast<std::uint64_t>(window) + 1, elems, storage_);
  std::byte* data = out.buffer->data();
  std::memset(data, 0, out.rows * row_bytes);  // rows outside their array (bounds="pad") and the zero row
  const RowTransform& t = label ? source.transform().y() : source.transform().x();
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const Sample s = source.sample(static_cast<std::size_t>(ids[i]));
    const ArraySource& array = label ? source.label_source(s.key) : source.factor_source(s.key);
    const std::int64_t rows = label ? label_rows(s.key) : array.rows();
    const __int128 first = label ? static_cast<__int128>(s.label) : static_cast<__int128>(s.feature) - window + 1;
    const std::int64_t a = clamp_row(first, 0, rows);
    const std::int64_t b = clamp_row(first + window, 0, rows);
    if (b <= a) continue;
    const auto at = static_cast<std::uint64_t>(static_cast<__int128>(i) * window + (a - first));
    read_storage_rows(array, t, a, b, storage_, data + at * row_bytes);
  }
  plan_->stats()->uploaded(out.rows * row_bytes);
  return out;
}

GroupUpload DeviceRows::group(std::uint64_t epoch, std::size_t index) const {
  check_files_at_epoch_start(epoch, index);
  const auto epoch_groups = groups_of(epoch);
  const std::vector<DeviceGroup>& groups = epoch_groups->groups;
  if (index >= groups.size()) {
    throw IndexOutOfRange("group " + std::to_string(index) + " of an epoch of " + std::to_string(groups.size()) +
                          " groups");
  }
  const DeviceGroup& g = groups[index];
  GroupUpload out;
  std::vector<std::int64_t> ids;
  for (std::size_t b = g.first_batch; b < g.end_batch; ++b) {
    const std::vector<std::int64_t> one = plan_->ids(epoch, b);
    ids.insert(ids.end(), one.begin(), one.end());
    out.batch_ends.push_back(static_cast<std::int64_t>(ids.size()));
  }
  plan_->source().check_ids(ids);
  if (g.first_block == g.last_block) {
    const std::vector<std::uint32_t>& keys = epoch_groups->blocks.at(g.first_block).keys;
    out.rows = start_rows(ids, layout_of(keys));
    out.factors = read_keys(keys, false, true);
    out.labels = read_keys(keys, true, true);
  } else {
    // A batch over several blocks: its windows one after another (W rows each, zeros outside the array), and
    // its label rows, so that sample i starts at row i * W and reads label row i.
    out.factors = straddler_windows(ids, false);
    out.labels = straddler_windows(ids, true);
    const std::size_t n = ids.size();
    const std::int64_t window = plan_->source().options().window;
    out.rows.start.resize(n);
    out.rows.lo.assign(n, 0);
    out.rows.hi.assign(n, window);
    out.rows.label.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      out.rows.start[i] = static_cast<std::int64_t>(i) * window;
      out.rows.label[i] = static_cast<std::int64_t>(i);
    }
  }
  const WindowSource& source = plan_->source();
  std::int64_t begin = 0;
  for (const std::int64_t end : out.batch_ends) {
    const auto n = static_cast<std::size_t>(end - begin);
    plan_->stats()->served(n, n * (source.x_sample_bytes() + source.y_sample_bytes()), 0, 0);
    begin = end;
  }
  return out;
}

}  // namespace npyfeed
