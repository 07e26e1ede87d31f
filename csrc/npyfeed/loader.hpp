// Loading whole `.npy` files in parallel, in one of three read modes.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "npyfeed/file.hpp"
#include "npyfeed/npy_header.hpp"
#include "npyfeed/thread_pool.hpp"

namespace npyfeed {

enum class ReadMode {
  kMmap,    // zero-copy view of a shared read-only mapping
  kRead,    // owned buffer filled by parallel pread
  kDirect,  // owned buffer filled by O_DIRECT reads (falls back to pread where refused)
};

/// Parses "mmap" / "read" / "direct". Throws InvalidArgument.
ReadMode parse_read_mode(const std::string& name);

struct LoadOptions {
  ReadMode mode = ReadMode::kRead;
  std::size_t threads = 1;
  std::size_t max_header_size = kDefaultMaxHeaderSize;
  bool populate = false;                   // mmap: fault every page in now, in parallel
  std::uint64_t chunk_bytes = 8u << 20;    // files larger than this are split across threads
};

/// One loaded file: `data` points at `header.nbytes` bytes kept alive by `owner`.
struct LoadedArray {
  std::string path;
  NpyHeader header;
  std::shared_ptr<void> owner;  // an AlignedBuffer or a MappedFile
  const std::byte* data = nullptr;
  bool writable = false;
  bool direct_fallback = false;  // O_DIRECT was refused and buffered reads were used
};

/// Reads the header of one file and checks the file holds the data it announces. Throws.
NpyHeader read_header(const File& file, std::size_t max_header_size);

/// A load of many files in two parallel phases, so the caller can wait with its own polling (signals,
/// progress) between them: headers (and whole small files), then chunks of large files.
class ManyLoad {
 public:
  ManyLoad(std::vector<std::string> paths, LoadOptions options);
  std::shared_ptr<Job> start_headers(ThreadPool& pool);
  std::shared_ptr<Job> start_chunks(ThreadPool& pool);
  /// Bytes of array data read (or populated) so far, and in all (known after the header phase).
  std::uint64_t bytes_done() const noexcept { return bytes_done_->load(std::memory_order_relaxed); }
  std::uint64_t bytes_total() const noexcept { return bytes_total_; }
  /// The loaded arrays, once both phases have finished.
  std::vector<LoadedArray>& results();

 private:
  struct Chunk {
    std::size_t file;
    std::uint64_t begin;  // file offsets
    std::uint64_t end;
  };
  struct FileState;
  void load_header_and_small(std::size_t i);
  bool load_whole_small_file(std::size_t i, File& file, FileState& state);
  void load_chunk(const Chunk& chunk);

  std::vector<std::string> paths_;
  LoadOptions options_;
  std::vector<LoadedArray> results_;
  std::vector<std::shared_ptr<FileState>> states_;
  std::mutex chunks_mutex_;
  std::vector<Chunk> chunks_;
  std::shared_ptr<std::atomic<std::uint64_t>> bytes_done_;
  std::uint64_t bytes_total_ = 0;
};

}  // namespace npyfeed
