// Samples are windows: sample i is rows [feature_index - W + 1, feature_index + 1) of its key's factor
// array and row label_index of its key's label array. A WindowSource holds the index and one factor and
// one label array per key (files, each behind an ArrayReader, or arrays in memory), checks that they fit
// together (shapes, dtypes, the bounds policy), and starts gathers of batches (gather.hpp).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "npyfeed/common/aligned_buffer.hpp"
#include "npyfeed/common/thread_pool.hpp"
#include "npyfeed/format/npy_header.hpp"
#include "npyfeed/gather/gather.hpp"
#include "npyfeed/gather/transform.hpp"
#include "npyfeed/index/dense_index.hpp"
#include "npyfeed/index/index.hpp"
#include "npyfeed/io/array_reader.hpp"
#include "npyfeed/stream/batch.hpp"
#include "npyfeed/stream/pipeline_stats.hpp"

namespace npyfeed {

enum class Bounds {
  kError,  // a window or label row outside its array is an error at construction
  kSkip,   // such samples are dropped at construction
  kPad,    // rows outside the array read as zeros
};

/// Parses "error" / "skip" / "pad". Throws InvalidArgument.
Bounds parse_bounds(const std::string& name);

/// Parses an output dtype name, "float32" or "float64", into its item size. Throws InvalidArgument.
std::uint32_t parse_out_dtype(const std::string& name);

struct WindowOptions {
  std::int64_t window = 1;     // rows per sample, at least 1
  std::uint32_t out_size = 4;  // output item size: 4 (float32) or 8 (float64)
  Bounds bounds = Bounds::kError;
  ReadMode mode = ReadMode::kMmap;  // for files (arrays in memory are read in place)
  std::size_t threads = 1;  // gather threads, at least 1 (an O_DIRECT reader keeps more reads in flight per thread)
  std::size_t max_header_size = kDefaultMaxHeaderSize;
  Placement placement;  // of the pool threads that open and gather (shared_pool(0, placement))
  /// `.npz` sources: the member to read (empty: the archive must hold exactly one), and the most bytes that
  /// members held in memory (inflated, or copied because misaligned or not mapped) may take in all; 0 means
  /// half of the physical memory.
  std::string npz_member;
  std::uint64_t npz_memory_limit = 0;
  /// Column selection, NaN/inf replacement and normalisation in the gather (checked by finish_open).
  TransformOptions transform;
  /// Dense windows (dense_index.hpp) instead of the index's samples: the index then only names the keys.
  std::optional<DenseOptions> dense;
  /// Keys without a factor or label file: an error (false), or left out with their samples (missing_keys()).
  bool skip_missing = false;
};

/// Arrays that stand in for a source's own in one gather (shuffle="blocks": files read whole into memory).
/// Indexed by key; only the keys of the gathered samples need a reader.
struct KeyArrays {
  std::vector<ArraySource> factors;
  std::vector<ArraySource> labels;
};

/// Keys opened at once where the files are not in the page cache (at least; more when the source has more
/// threads): such an open waits for a read per file, and a device answers many of them in the time of one.
inline constexpr std::size_t kOpensInFlight = 16;

class WindowSource : public std::enable_shared_from_this<WindowSource> {
 public:
  /// Throws InvalidArgument for a window below 1, an output size other than 4 or 8, threads of 0, or (dense) a
  /// stride below 1 or a horizon below 0.
  WindowSource(SampleIndex index, WindowOptions options);
  /// Stops the background populate (start_populate) at its next step.
  ~WindowSource();

  /// File sources: paths per key (same order as index keys). Opening runs as a job (headers, maps) on
  /// `pool` (the pool for device waits): `threads` workers where a sample of the files is in the page cache,
  /// else (and in mode direct) at least kOpensInFlight. Call finish_open() after it finished.
  std::shared_ptr<Job> start_open(ThreadPool& pool, std::vector<std::string> factor_paths,
                                  std::vector<std::string> label_paths);
  /// In-memory sources: `shape` and `typestr` (numpy dtype.str) of C-contiguous `data`, kept alive by
  /// `owner` as long as this source (or a gather) needs it. Throws InvalidArgument.
  void set_memory_source(std::size_t key, bool label, std::shared_ptr<const void> owner, const std::byte* data,
                         std::vector<std::int64_t> shape, const std::string& typestr);
  /// Checks shapes, dtypes, the transform options against the rows (GatherTransform) and bounds (applying the
  /// policy). Throws FileNotFoundError-like OsError for missing files (listing the first few; with skip_missing
  /// only when every key lacks one), NpyFormatError, InvalidArgument, IndexOutOfRange.
  void finish_open();

  std::size_t size() const noexcept { return size_; }
  std::size_t skipped() const noexcept { return skipped_; }
  /// With skip_missing: the keys left out for want of a file (ascending), and the samples they had.
  const std::vector<std::size_t>& missing_keys() const noexcept { return missing_keys_; }
  std::size_t missing_samples() const noexcept { return missing_samples_; }
  /// Per-sample shapes: (W, row shape...) and (label row shape...); a selected row is (columns,).
  std::vector<std::int64_t> x_shape() const;
  std::vector<std::int64_t> y_shape() const;
  std::uint64_t x_sample_bytes() const noexcept { return x_row_elems_ * window_ * options_.out_size; }
  std::uint64_t y_sample_bytes() const noexcept { return y_row_elems_ * options_.out_size; }
  const WindowOptions& options() const noexcept { return options_; }
  /// For sample i (after skipping): its index file line, key, feature and label index (dense: key and rows).
  std::string describe(std::size_t sample) const;
  /// How its gathers turn the arrays' rows into the output's (checked by finish_open).
  const GatherTransform& transform() const noexcept { return transform_; }
  /// The index this source reads (its columns may be a shared mapping).
  const SampleIndex& index() const noexcept { return index_; }
  /// Sample `sample` (after skipping, valid) as the gather wants it.
  Sample sample(std::size_t sample) const;
  /// Files whose O_DIRECT reads the filesystem refused, read with buffered reads instead (so far: a refusal
  /// can also come at the first read).
  std::vector<std::string> direct_fallbacks() const;
  /// mmap mode with more files than may be mapped at once: the most mappings kept (files are mapped on
  /// demand, least recently used unmapped first); 0 when every file has its own mapping.
  std::size_t mapping_limit() const { return mappings_ ? mappings_->capacity() : 0; }

  /// The totals of every pipeline over this source (each plan counts its own and into these).
  const std::shared_ptr<PipelineStats>& stats() const noexcept { return stats_; }

  /// Keys and their arrays (for BlockStream).
  std::size_t num_keys() const noexcept { return factors_.size(); }
  const ArraySource& factor_source(std::size_t key) const { return factors_.at(key); }
  const ArraySource& label_source(std::size_t key) const { return labels_.at(key); }
  /// True for a source over files (start_open), false for arrays in memory.
  bool reads_files() const noexcept { return reads_files_; }
  /// Whether key `key`'s factor (or label) array is a member of a `.npz` archive: its data is then in memory
  /// already (inflated or read at open, or a mapping of the archive), never a file of its own to read again.
  bool in_archive(std::size_t key, bool label) const { return (in_archive_.at(key) >> (label ? 1 : 0)) & 1; }
  /// A function giving the key of sample i (after skipping, valid). Asked for 0, 1, 2, ... in order it follows
  /// the index along past dropped entries (no search per sample: 66M samples would take seconds); any other i
  /// costs a search. One caller at a time per function.
  std::function<std::uint32_t(std::size_t)> sample_keys() const;

  /// Checks that every file this source opened is still the file it opened (check_unchanged: a stat each, the
  /// archive of a `.npz` member). What every consumer's epoch starts with (EpochPlan::stream, DeviceRows), so
  /// that a file changed under a running job is refused at the next epoch on every path. Throws OsError: ESTALE
  /// (npyfeed.FileChangedError) naming the first changed file, what changed and how many changed; ENOENT for
  /// one deleted.
  void check_files_unchanged() const;
  /// Throws IndexOutOfRange naming the first id outside [0, size()).
  void check_ids(const std::vector<std::int64_t>& sample_ids) const;
  /// Starts gathering `count` samples (ids into [0, size())) into x and y, which must hold
  /// count * x_sample_bytes() and count * y_sample_bytes(). Throws IndexOutOfRange for a bad id (before starting).
  /// With `arrays`, reads those instead of the source's own; the caller keeps them alive until the job finished.
  std::shared_ptr<Job> start_gather(ThreadPool& pool, std::vector<std::int64_t> sample_ids, std::byte* x, std::byte* y,
                                    const KeyArrays* arrays = nullptr);
  /// Allocates a batch for `sample_ids` (from `buffers` when given) and starts gathering into it; the batch
  /// is complete once the job finished. Throws IndexOutOfRange for a bad id (before starting).
  std::pair<WindowBatch, std::shared_ptr<Job>> start_batch(ThreadPool& pool, std::vector<std::int64_t> sample_ids,
                                                           BufferPool* buffers = nullptr,
                                                           const KeyArrays* arrays = nullptr);

 private:
  void open_key(std::size_t key, const std::string& factor_path, const std::string& label_path);
  ArraySource open_file(const std::string& path, bool label) const;
  void apply_bounds();    // the index pass of finish_open (samples from an index)
  void start_populate();  // once, at the first gather: see window_source_ahead.cpp
  // Launches a cold batch's prepared gather once its read-ahead hints are in, off the caller's thread.
  void launch_after_will_need(ThreadPool& pool, std::shared_ptr<Job> job, std::shared_ptr<const Gather> gather);
  std::uint64_t index_position(std::size_t sample) const;
  std::shared_ptr<ArrayReader> open_npz(const std::string& path) const;

  SampleIndex index_;
  WindowOptions options_;
  std::int64_t window_;
  std::vector<ArraySource> factors_;
  std::vector<ArraySource> labels_;
  std::vector<std::string> open_errors_;  // per key: a missing-file message, else empty
  // Samples are the index's, in order, less those bounds='skip' dropped: their index positions, sorted
  // (usually few), so no per-sample memory is copied out of a shared index.
  std::size_t size_ = 0;
  std::vector<std::uint64_t> dropped_;
  std::size_t skipped_ = 0;
  std::vector<std::size_t> missing_keys_;  // skip_missing: keys without a file, read as arrays of 0 rows
  std::size_t missing_samples_ = 0;
  std::uint64_t x_row_elems_ = 0;
  std::uint64_t y_row_elems_ = 0;
  std::vector<std::int64_t> x_row_shape_;  // of the arrays' rows
  std::vector<std::int64_t> y_row_shape_;
  GatherTransform transform_;        // the arrays' rows to the output's
  std::optional<DenseIndex> dense_;  // dense windows: the samples, in place of the index's
  bool keep_fds_ = true;
  std::shared_ptr<MappingCache> mappings_;  // mmap with more files than the mapping budget, else null
  std::size_t gather_workers_ = 1;  // threads x the reads in flight any reader asks for, within the descriptor budget
  std::size_t keys_per_item_ = 1;   // keys per gather work item: twice the readers' queue depth, else 1
  bool queued_reads_ = false;       // some reader queues its reads (ArrayReader::queue_depth)
  mutable std::atomic<std::uint64_t> npz_memory_{0};  // bytes of .npz members held in memory
  bool reads_files_ = false;
  bool populate_ = false;  // mmap, a mapping per file, NPYFEED_POPULATE not "0"
  std::atomic<bool> populate_started_{false};
  std::shared_ptr<std::atomic<bool>> populate_stop_ = std::make_shared<std::atomic<bool>>(false);
  struct WillNeedQueue {  // cold batches' hints waiting for the one drainer (launch_after_will_need)
    std::mutex mutex;
    std::deque<std::function<void()>> queue;
    bool draining = false;
    int pid = 0;  // of the process whose pool runs the drainer
  };
  std::shared_ptr<WillNeedQueue> hints_ = std::make_shared<WillNeedQueue>();
  std::vector<std::uint8_t> in_archive_;  // per key: bit 0 factor, bit 1 label opened as a member of a .npz
  std::shared_ptr<PipelineStats> stats_ = std::make_shared<PipelineStats>();
};

}  // namespace npyfeed
