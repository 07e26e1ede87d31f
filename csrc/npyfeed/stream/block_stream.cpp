#include "npyfeed/stream/block_stream.hpp"

#include <algorithm>
#include <chrono>
#include <string>

#include "npyfeed/common/errors.hpp"
#include "npyfeed/gather/window_source.hpp"

namespace npyfeed {

namespace {

// What a file read whole may hold beyond its data: its header and the O_DIRECT alignment of its buffer.
constexpr std::uint64_t kFileAllowance = 8192;

// A file source's array that must be read for a block: anything not already in owned memory (a small label
// file read whole at open is; a mapping of a `.npy` is not: a block never faults pages of a mapping in).
// Members of a `.npz` are used where the source holds them (inflated or read at open, or, stored in mode
// 'mmap', a mapping of the archive): there is no file of their own to read.
bool must_read(const WindowSource& source, std::uint32_t key, bool label) {
  if (!source.reads_files() || source.in_archive(key, label)) return false;
  const ArrayReader& reader = *(label ? source.label_source(key) : source.factor_source(key)).reader;
  return !(reader.view() != nullptr && reader.view_writable());
}

std::string shape_text(const std::vector<std::int64_t>& s) {
  std::string t = "(";
  for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + (s.size() == 1 ? ",)" : ")");
}

// The file behind `opened`, read whole (one large read, O_DIRECT where asked and allowed) into owned memory,
// checked to be the file the source opened (File::reopen: not replaced, resized or written since; and again
// once read, for a write while it was read), so that an epoch never mixes two versions of the data.
ArraySource read_whole_file(const ArraySource& opened, const WindowOptions& options, ReadMode mode,
                            std::shared_ptr<BufferPool> buffers) {
  ReaderOptions reader_options;
  reader_options.whole_file_buffers = std::move(buffers);
  reader_options.mode = mode;
  reader_options.max_header_size = options.max_header_size;
  reader_options.keep_open = false;
  reader_options.read_whole_up_to = UINT64_MAX;
  const std::optional<FileOrigin>& origin = opened.reader->origin();
  if (!origin) throw InvalidArgument(opened.name() + ": not a file, nothing to read whole");
  ArraySource now{ArrayReader::reopen(*origin, reader_options)};
  // The same file has the same header; this guards the gather's bounds should a filesystem keep a file's size and
  // modification time across a rewrite.
  const NpyHeader& a = opened.header();
  const NpyHeader& b = now.header();
  if (a.shape != b.shape || a.itemsize != b.itemsize || a.fortran_order != b.fortran_order ||
      a.scalar.kind != b.scalar.kind || a.scalar.swapped != b.scalar.swapped) {
    throw NpyFormatError(opened.name(), 0,
                         "file changed since the WindowSource opened it: shape " + shape_text(a.shape) + " '" +
                             a.descr_text + "' then, " + shape_text(b.shape) + " '" + b.descr_text + "' now");
  }
  return now;
}

}  // namespace

ArraySource read_block_array(const WindowSource& source, std::uint32_t key, bool label, std::uint64_t* bytes_read,
                             std::shared_ptr<BufferPool> buffers) {
  const ArraySource& opened = label ? source.label_source(key) : source.factor_source(key);
  if (bytes_read != nullptr) *bytes_read = 0;
  if (!must_read(source, key, label)) return opened;
  const ReadMode mode = source.options().mode == ReadMode::kRead ? ReadMode::kRead : ReadMode::kDirect;
  ArraySource read = read_whole_file(opened, source.options(), mode, std::move(buffers));
  if (bytes_read != nullptr) *bytes_read = opened.header().nbytes;
  return read;
}

std::vector<std::uint64_t> block_key_bytes(const WindowSource& source) {
  std::vector<std::uint64_t> bytes(source.num_keys());
  for (std::size_t k = 0; k < bytes.size(); ++k)
    bytes[k] = source.factor_source(k).header().nbytes + source.label_source(k).header().nbytes;
  return bytes;
}

std::shared_ptr<const SamplesByKey> group_samples_by_key(const WindowSource& source) {
  return std::make_shared<const SamplesByKey>(source.num_keys(), source.size(), source.sample_keys());
}

BlockStream::BlockStream(std::shared_ptr<WindowSource> source, std::shared_ptr<const SamplesByKey> samples,
                         std::shared_ptr<const BlockPlan> plan, const EpochSpec& spec, std::size_t prefetch,
                         std::size_t start_batch, std::shared_ptr<PipelineStats> stats,
                         std::shared_ptr<const PageLocker> page_locker)
    : source_(std::move(source)),
      samples_(std::move(samples)),
      plan_(std::move(plan)),
      spec_(spec),
      prefetch_(std::max<std::size_t>(prefetch, 1)),
      counters_(std::make_shared<Counters>()),
      buffers_(std::make_shared<BufferPool>(2 * (std::max<std::size_t>(prefetch, 1) + 2),
                                            std::function<std::uint64_t(std::size_t)>{}, std::move(page_locker))),
      stats_(stats ? std::move(stats) : source_->stats()) {
  // The files of a block let go go to the next blocks' reads: kept only while the blocks held (in data bytes)
  // and the buffers kept stay within the budget, with the allowance for each file's header and O_DIRECT
  // alignment that the blocks have (under 8 KiB a file).
  file_buffers_ =
      std::make_shared<BufferPool>(SIZE_MAX, [counters = counters_, budget = spec_.memory_budget](std::size_t buffers) {
        const std::uint64_t held = counters->held.load();
        return (held < budget ? budget - held : std::uint64_t{0}) + kFileAllowance * buffers;
      });
  const std::uint64_t n = plan_->shard_size();
  num_batches_ = spec_.num_batches(n);
  next_start_ = std::min(start_batch, num_batches_);
  if (next_start_ < num_batches_) {
    next_load_ = blocks_of_batch(next_start_).first;
    last_block_ = blocks_of_batch(num_batches_ - 1).second + 1;
  }
}

BlockStream::~BlockStream() { close(); }

std::pair<std::size_t, std::size_t> BlockStream::blocks_of_batch(std::size_t batch) const {
  const auto [first, end] = spec_.batch_positions(batch, plan_->shard_size());
  return {plan_->block_of(plan_->first + first), plan_->block_of(plan_->first + end - 1)};
}

BlockStream::Block* BlockStream::held_block(std::size_t index) {
  if (blocks_.empty() || index < blocks_.front().index || index > blocks_.back().index) return nullptr;
  return &blocks_[index - blocks_.front().index];
}

void BlockStream::start_load(std::size_t index) {
  const BlockPlan& plan = *plan_;
  const WindowSource& source = *source_;
  std::uint64_t bytes = 0;
  for (std::size_t i = plan.key_begin[index]; i < plan.key_begin[index + 1]; ++i) {
    const std::uint32_t key = plan.keys[i];
    if (must_read(source, key, false)) bytes += source.factor_source(key).header().nbytes;
    if (must_read(source, key, true)) bytes += source.label_source(key).header().nbytes;
  }
  // The block's memory is counted from now until its arrays are freed: by whoever lets go last, this stream
  // or a gather still reading them.
  std::shared_ptr<Counters> counters = counters_;
  const std::uint64_t held = counters->held.fetch_add(bytes) + bytes;
  std::uint64_t peak = counters->peak.load();
  while (held > peak && !counters->peak.compare_exchange_weak(peak, held)) {
  }
  auto arrays = std::shared_ptr<KeyArrays>(new KeyArrays, [counters, bytes](KeyArrays* a) {
    counters->held.fetch_sub(bytes);  // first: the buffers then go back to the pool within the budget
    delete a;
  });
  arrays->factors.resize(source.num_keys());
  arrays->labels.resize(source.num_keys());
  auto samples = std::make_shared<std::vector<std::int64_t>>();
  const std::size_t keys = plan.key_begin[index + 1] - plan.key_begin[index];
  auto source_ptr = source_;
  auto plan_ptr = plan_;
  auto by_key = samples_;
  auto buffers = file_buffers_;
  // Items: one per key (its factor and label files), and the block's sample order. The job writes into the
  // Block's arrays through plain pointers: a finished job's function may live on a moment in a pool thread,
  // and must not keep the block's memory (nor its count) alive. The Block outlives the job: close() waits for
  // it, and fill() drops only blocks whose reads have finished.
  KeyArrays* out = arrays.get();
  std::vector<std::int64_t>* order = samples.get();
  // The stats count each key's reads as they finish, and the block once its last key's are done.
  auto keys_left = std::make_shared<std::atomic<std::size_t>>(keys);
  // On the pool for device waits, not the gathers' pool: its workers would all wait in these reads (a block
  // takes seconds) while the gathers of the block being consumed queue behind them.
  auto job = shared_io_pool(0, source.options().placement)
                 .start(keys + 1, std::max<std::size_t>(source.options().threads, 4),
                        [source_ptr, plan_ptr, by_key, buffers, out, order, index, keys, stats = stats_,
                         keys_left](std::size_t item) {
                          if (item == keys) {
                            *order = block_samples(*plan_ptr, *by_key, index);
                            return;
                          }
                          const std::uint64_t started = PipelineStats::now_ns();
                          const std::uint32_t key = plan_ptr->keys[plan_ptr->key_begin[index] + item];
                          std::uint64_t factor_bytes = 0, label_bytes = 0;
                          out->factors[key] = read_block_array(*source_ptr, key, false, &factor_bytes, buffers);
                          out->labels[key] = read_block_array(*source_ptr, key, true, &label_bytes, buffers);
                          const std::uint64_t bytes = factor_bytes + label_bytes;
                          stats->block_read(bytes, PipelineStats::now_ns() - started, keys_left->fetch_sub(1) == 1);
                        });
  blocks_.push_back({index, std::move(arrays), std::move(samples), std::move(job)});
}

void BlockStream::fill() {
  while (!closed_) {
    // Blocks that no batch still to start reads go (a gather in flight keeps its arrays until it ends).
    const std::uint64_t next_position =
        next_start_ < num_batches_ ? plan_->first + spec_.batch_positions(next_start_, plan_->shard_size()).first
                                   : plan_->end;
    while (!blocks_.empty() && plan_->block_begin[blocks_.front().index + 1] <= next_position) {
      // Its batches have all started, so its read has finished; waiting costs nothing and keeps that a rule.
      if (!blocks_.front().load->orphaned()) blocks_.front().load->wait_for(std::chrono::hours(24));
      blocks_.pop_front();
    }
    // Read ahead within the budget, one block at a time (a block read alone gets the whole disk: the first
    // batch comes sooner); what the next batch needs, whatever it costs.
    const std::size_t needed_last = next_start_ < num_batches_ ? blocks_of_batch(next_start_).second : 0;
    while (next_load_ < last_block_) {
      // Over the budget only for a batch that alone needs more (no gather in flight holds older blocks then).
      const bool needed = next_start_ < num_batches_ && next_load_ <= needed_last && pending_.empty();
      const bool fits = counters_->held.load() + plan_->block_bytes[next_load_] <= spec_.memory_budget;
      const bool reading = !blocks_.empty() && !blocks_.back().load->wait_for(std::chrono::milliseconds(0));
      if (!needed && (!fits || reading)) break;
      start_load(next_load_++);
    }
    if (pending_.size() >= prefetch_ || next_start_ >= num_batches_) return;
    const auto [first_block, last_block] = blocks_of_batch(next_start_);
    for (std::size_t b = first_block; b <= last_block; ++b) {
      Block* block = held_block(b);
      if (block == nullptr || !block->load->wait_for(std::chrono::milliseconds(0))) return;
      block->load->wait();  // rethrows a failed read
    }
    const auto [from, to] = spec_.batch_positions(next_start_, plan_->shard_size());
    const std::uint64_t first = plan_->first + from;
    const std::uint64_t end = plan_->first + to;
    std::vector<std::int64_t> ids;
    ids.reserve(end - first);
    for (std::size_t b = first_block; b <= last_block; ++b) {
      const Block& block = *held_block(b);
      const std::uint64_t begin = plan_->block_begin[b];
      const std::uint64_t lo = std::max(first, begin);
      const std::uint64_t hi = std::min(end, plan_->block_begin[b + 1]);
      ids.insert(ids.end(), block.samples->begin() + static_cast<std::ptrdiff_t>(lo - begin),
                 block.samples->begin() + static_cast<std::ptrdiff_t>(hi - begin));
    }
    std::shared_ptr<const KeyArrays> arrays = held_block(first_block)->arrays;
    if (last_block > first_block) {
      // A batch across blocks: one table of the keys of all of them, keeping each block's memory alive.
      std::vector<std::shared_ptr<const KeyArrays>> parts;
      auto merged = std::make_unique<KeyArrays>(*arrays);
      for (std::size_t b = first_block; b <= last_block; ++b) {
        parts.push_back(held_block(b)->arrays);
        for (std::size_t i = plan_->key_begin[b]; i < plan_->key_begin[b + 1]; ++i) {
          const std::uint32_t key = plan_->keys[i];
          merged->factors[key] = parts.back()->factors[key];
          merged->labels[key] = parts.back()->labels[key];
        }
      }
      arrays = std::shared_ptr<const KeyArrays>(merged.release(), [parts](const KeyArrays* a) { delete a; });
    }
    auto [batch, job] = source_->start_batch(shared_pool(0, source_->options().placement), std::move(ids),
                                             buffers_.get(), arrays.get());
    pending_.push_back({std::move(job), std::move(batch), std::move(arrays)});
    ++next_start_;
  }
}

std::shared_ptr<Job> BlockStream::pending_load() {
  if (next_start_ >= num_batches_) return nullptr;
  const auto [first_block, last_block] = blocks_of_batch(next_start_);
  for (std::size_t b = first_block; b <= last_block; ++b) {
    Block* block = held_block(b);
    if (block != nullptr && !block->load->wait_for(std::chrono::milliseconds(0))) return block->load;
  }
  return nullptr;
}

std::shared_ptr<Job> BlockStream::next_job() {
  std::lock_guard lock(mutex_);
  for (;;) {
    // Judged before fill(): a batch whose gather this very request starts was not ready (BatchStream::next_job).
    if (!ready_when_asked_) ready_when_asked_ = ready_at_front(pending_);
    fill();
    if (!pending_.empty()) return pending_.front().job;
    if (closed_ || next_start_ >= num_batches_) return nullptr;
    // A read the next batch needs; none when it finished since fill() looked (then fill() starts the batch).
    if (std::shared_ptr<Job> load = pending_load()) {
      count_block_wait(load);
      return load;
    }
  }
}

void BlockStream::count_block_wait(const std::shared_ptr<Job>& load) {
  if (load == waited_load_) return;
  waited_load_ = load;
  stats_->block_waited();
}

BlockStream::Batch BlockStream::take() {
  std::lock_guard lock(mutex_);
  for (;;) {
    if (closed_) return {};
    if (!ready_when_asked_) ready_when_asked_ = ready_at_front(pending_);
    fill();
    if (!pending_.empty()) break;
    if (next_start_ >= num_batches_) return {};  // the end
    // A read the next batch needs; none when it finished since fill() looked (then fill() starts the batch).
    if (std::shared_ptr<Job> load = pending_load()) {
      count_block_wait(load);
      load->wait();
    }
  }
  const std::size_t ready = *ready_when_asked_;
  ready_when_asked_.reset();
  Pending p = std::move(pending_.front());
  pending_.pop_front();
  p.job->wait();
  stats_->served(p.batch.count, p.batch.count * (source_->x_sample_bytes() + source_->y_sample_bytes()),
                 p.job->cpu_ns(), ready);
  p.arrays.reset();  // the last batch of a block lets the block's memory go here
  fill();            // start the next read-ahead before handing this batch out
  return std::move(p.batch);
}

void BlockStream::close() {
  std::lock_guard lock(mutex_);
  closed_ = true;
  std::vector<std::shared_ptr<Job>> jobs;
  for (auto& p : pending_) jobs.push_back(p.job);
  for (auto& b : blocks_) jobs.push_back(b.load);
  for (auto& job : jobs) job->cancel();
  for (auto& job : jobs) {
    if (job->orphaned()) continue;  // forked child: the workers, and so the job, do not exist here
    try {
      job->wait();
    } catch (...) {
      // a cancelled read-ahead: nobody wants its result or its error
    }
  }
  pending_.clear();
  blocks_.clear();
}

}  // namespace npyfeed
