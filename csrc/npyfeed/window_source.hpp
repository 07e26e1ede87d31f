// Samples are windows: sample i is rows [feature_index - W + 1, feature_index + 1) of its key's factor
// array and row label_index of its key's label array. A WindowSource holds the index and one factor and
// one label array per key (files in a read mode, or arrays in memory), and gathers batches of samples
// into contiguous (B, W, ...) and (B, ...) buffers, converting the element type on the way.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "npyfeed/aligned_buffer.hpp"
#include "npyfeed/file.hpp"
#include "npyfeed/index.hpp"
#include "npyfeed/loader.hpp"
#include "npyfeed/mapped_file.hpp"
#include "npyfeed/npy_header.hpp"
#include "npyfeed/thread_pool.hpp"

namespace npyfeed {

enum class Bounds {
  kError,  // a window or label row outside its array is an error at construction
  kSkip,   // such samples are dropped at construction
  kPad,    // rows outside the array read as zeros
};

/// Parses "error" / "skip" / "pad". Throws InvalidArgument.
Bounds parse_bounds(const std::string& name);

/// One factor or label array: a file (in some read mode) or memory owned elsewhere.
struct ArraySource {
  std::string name;        // path, or "factors['key']" for arrays
  NpyHeader header;        // shape, element type, order (synthesised for arrays)
  const std::byte* memory = nullptr;      // mmap and in-memory sources: the data
  std::shared_ptr<MappedFile> mapping;    // keeps `memory` valid in mmap mode
  std::shared_ptr<AlignedBuffer> owned;   // small label files read whole in read/direct modes
  File file;                              // read/direct, when descriptors are kept open
  bool file_is_direct = false;            // `file` was opened with O_DIRECT
  FileIdentity identity;
  std::size_t direct_align = 4096;
  std::shared_ptr<std::atomic<bool>> direct_refused = std::make_shared<std::atomic<bool>>(false);

  std::int64_t rows() const { return header.shape.empty() ? 0 : header.shape[0]; }
  std::uint64_t row_elems() const;
};

struct WindowOptions {
  std::int64_t window = 1;
  char out_kind = 'f';
  std::uint32_t out_size = 4;  // float32 or float64
  Bounds bounds = Bounds::kError;
  ReadMode mode = ReadMode::kMmap;
  std::size_t threads = 1;
  std::size_t max_header_size = kDefaultMaxHeaderSize;
  bool memory = false;  // sources are arrays in memory, set with set_memory_source
};

class WindowSource : public std::enable_shared_from_this<WindowSource> {
 public:
  WindowSource(SampleIndex index, WindowOptions options);

  /// File sources: paths per key (same order as index keys). Opening runs as a job (headers, maps);
  /// call finish_open() after it finished.
  std::shared_ptr<Job> start_open(ThreadPool& pool, std::vector<std::string> factor_paths, std::vector<std::string> label_paths);
  /// In-memory sources: `shape` and `typestr` (numpy dtype.str) of C-contiguous data kept alive by the caller.
  void set_memory_source(std::size_t key, bool label, const std::byte* data, std::vector<std::int64_t> shape,
                         const std::string& typestr);
  /// Checks shapes, dtypes and bounds (applying the policy). Throws FileNotFoundError-like OsError for
  /// missing files (listing the first few), NpyFormatError, InvalidArgument, IndexOutOfRange.
  void finish_open();

  std::size_t size() const noexcept { return samples_.size(); }
  std::size_t skipped() const noexcept { return skipped_; }
  /// Per-sample shapes: (W, row shape...) and (label row shape...).
  std::vector<std::int64_t> x_shape() const;
  std::vector<std::int64_t> y_shape() const;
  std::uint64_t x_sample_bytes() const noexcept { return x_row_elems_ * window_ * options_.out_size; }
  std::uint64_t y_sample_bytes() const noexcept { return y_row_elems_ * options_.out_size; }
  const WindowOptions& options() const noexcept { return options_; }
  /// For sample i (after skipping): its index file line, key, feature and label index.
  std::string describe(std::size_t sample) const;

  /// Starts gathering `count` samples (ids into [0, size())) into x and y, which must hold
  /// count * x_sample_bytes() and count * y_sample_bytes(). Throws IndexOutOfRange for a bad id (before starting).
  std::shared_ptr<Job> start_gather(ThreadPool& pool, std::vector<std::int64_t> sample_ids, std::byte* x, std::byte* y);

 private:
  struct Sample {
    std::int64_t feature;
    std::int64_t label;
    std::uint32_t key;
    std::uint32_t index_pos;  // position in index_ (for messages)
  };
  struct GatherPlan;
  void open_key(std::size_t key, const std::string& factor_path, const std::string& label_path);
  ArraySource open_file(const std::string& path, bool keep_fd, bool preload_small);
  void hint_will_need(const GatherPlan& plan) const;
  void gather_key(const GatherPlan& plan, std::size_t group) const;
  void read_rows_into(const ArraySource& source, std::int64_t first, std::int64_t last, std::byte* dest) const;
  const std::byte* fetch_rows(const ArraySource& source, std::int64_t first, std::int64_t last, std::vector<std::byte>& scratch) const;

  SampleIndex index_;
  WindowOptions options_;
  std::int64_t window_;
  std::vector<ArraySource> factors_;
  std::vector<ArraySource> labels_;
  std::vector<std::string> open_errors_;  // per key: a missing-file message, else empty
  std::vector<Sample> samples_;
  std::size_t skipped_ = 0;
  std::uint64_t x_row_elems_ = 0;
  std::uint64_t y_row_elems_ = 0;
  std::vector<std::int64_t> x_row_shape_;
  std::vector<std::int64_t> y_row_shape_;
  bool keep_fds_ = true;
};

/// A seeded permutation of [0, n): identical for the same (n, seed, epoch) on any machine
/// (splitmix64-seeded xoshiro256** with Lemire's unbiased bounded draws, Fisher-Yates).
std::vector<std::int64_t> epoch_permutation(std::size_t n, std::uint64_t seed, std::uint64_t epoch);

/// Read-ahead over a fixed sample order: keeps up to `prefetch` batch gathers in flight on the pool.
/// Thread-safe: close() may come from another thread while one waits for a batch (take() then returns an
/// empty batch, count 0).
class BatchStream {
 public:
  struct Batch {
    std::shared_ptr<AlignedBuffer> x;
    std::shared_ptr<AlignedBuffer> y;
    std::size_t count = 0;
  };
  BatchStream(std::shared_ptr<WindowSource> source, std::vector<std::int64_t> order, std::size_t batch_size,
              bool drop_remainder, std::size_t prefetch, std::size_t start_batch);
  ~BatchStream();
  std::size_t num_batches() const noexcept { return num_batches_; }
  /// The job for the next batch, starting it (and the read-ahead) if needed; null at the end.
  std::shared_ptr<Job> next_job();
  /// Takes the finished next batch (after next_job()'s job finished). Rethrows its error.
  Batch take();
  /// Cancels and waits for all in-flight gathers. Idempotent.
  void close();

 private:
  struct Pending {
    std::shared_ptr<Job> job;
    Batch batch;
  };
  void fill();
  std::shared_ptr<WindowSource> source_;
  std::vector<std::int64_t> order_;
  std::size_t batch_size_;
  std::size_t prefetch_;
  std::size_t num_batches_;
  std::size_t next_start_;  // next batch number to start
  std::deque<Pending> pending_;
  std::shared_ptr<BufferPool> buffers_;
  std::mutex mutex_;
  bool closed_ = false;
};

}  // namespace npyfeed
