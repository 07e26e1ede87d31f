// Loading whole `.npy` files in parallel: headers (and small files) first, then large files in chunks.
// How each file is read (the mode) is its ArrayReader's business.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "npyfeed/common/thread_pool.hpp"
#include "npyfeed/format/npy_header.hpp"
#include "npyfeed/format/npz.hpp"
#include "npyfeed/io/array_reader.hpp"

namespace npyfeed {

struct LoadOptions {
  ReadMode mode = ReadMode::kRead;
  std::size_t threads = 1;  // at least 1
  std::size_t max_header_size = kDefaultMaxHeaderSize;
  bool populate = false;                 // mmap: fault every page in now, in parallel
  std::uint64_t chunk_bytes = 8u << 20;  // files larger than this are split across threads
};

/// One loaded file: `data` points at `header.nbytes` bytes kept alive by `owner`.
struct LoadedArray {
  std::string path;
  NpyHeader header;
  std::shared_ptr<const void> owner;  // an AlignedBuffer or a MappedFile
  const std::byte* data = nullptr;
  bool writable = false;
  bool direct_fallback = false;  // O_DIRECT was refused and buffered reads were used
};

/// A load of many files in two parallel phases, so the caller can wait with its own polling (signals,
/// progress) between them: headers (and whole small files), then chunks of large files.
class ManyLoad {
 public:
  /// Throws InvalidArgument for threads of 0.
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
    std::uint64_t begin;  // data offsets
    std::uint64_t end;
  };
  struct FileState {
    std::shared_ptr<ArrayReader> reader;
    ArrayReader::Destination dest;  // owned memory being filled; empty for arrays viewed in place
  };
  void load_header_and_small(std::size_t i);
  void load_chunk(const Chunk& chunk);
  std::size_t workers() const;

  std::vector<std::string> paths_;
  LoadOptions options_;
  std::vector<LoadedArray> results_;
  std::vector<FileState> states_;
  std::mutex chunks_mutex_;
  std::vector<Chunk> chunks_;
  std::shared_ptr<std::atomic<std::uint64_t>> bytes_done_;
  std::uint64_t bytes_total_ = 0;
};

/// Loads every member of many archives in parallel: directories first (one item per archive), then members
/// (one item per member of every archive: reads, inflates and CRC checks run on all threads at once).
class NpzLoad {
 public:
  struct Member {
    std::size_t archive = 0;  // index into the paths
    std::size_t index = 0;    // index into that archive's members()
    ZipMember entry;
    LoadedArray array;  // array.path is the archive's path
  };
  /// Throws InvalidArgument for threads of 0.
  NpzLoad(std::vector<std::string> paths, LoadOptions options);
  std::shared_ptr<Job> start_directories(ThreadPool& pool);
  std::shared_ptr<Job> start_members(ThreadPool& pool);
  /// Every member of every archive, archive by archive in directory order, once both phases finished.
  std::vector<Member>& results() noexcept { return members_; }

 private:
  void load_member(std::size_t i);
  std::vector<std::string> paths_;
  LoadOptions options_;
  std::vector<std::shared_ptr<NpzArchive>> archives_;
  std::vector<Member> members_;
};

}  // namespace npyfeed
