// The OS page cache as npyfeed sees it: how much of a file is resident (mincore), and bringing files into it
// once per machine ("npyfeed warm") with large parallel reads that skip what is already cached.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "npyfeed/common/thread_pool.hpp"
#include "npyfeed/io/file.hpp"

namespace npyfeed {

/// Bytes of [offset, offset + length) of the open file `fd` (of `file_size` bytes) that are in the page cache,
/// counted by whole pages and clipped to the range. Throws OsError (naming `path`) when it cannot be mapped.
std::uint64_t resident_bytes(int fd, const std::string& path, std::uint64_t file_size, std::uint64_t offset,
                             std::uint64_t length);

/// Brings [offset, offset + length) of `file` into the page cache without copying it out; returns the bytes
/// brought in (0 when the file shrank meanwhile). Throws OsError (EIO, ...).
std::uint64_t read_into_page_cache(const File& file, std::uint64_t offset, std::uint64_t length);

/// Warms (or only measures) a set of files: one measuring job before, one reading job, one measuring job after.
/// Reads go through the page cache in `chunk_bytes` pieces (read_into_page_cache); a piece whose pages are all resident
/// already is not read (so ten processes warming the same files one after the other read each byte once). Files are
/// opened read-only, one descriptor per running item.
class CacheWarm {
 public:
  struct FileState {
    std::uint64_t size = 0;
    std::uint64_t resident_before = 0;
    std::uint64_t resident_after = 0;
  };

  explicit CacheWarm(std::vector<std::string> paths, std::uint64_t chunk_bytes = std::uint64_t{8} << 20);

  /// Opens every file and measures what is resident (`after` chooses which field). Throws OsError/NpyFormatError
  /// (a missing or non-regular file) from the job.
  std::shared_ptr<Job> start_measure(ThreadPool& pool, std::size_t threads, bool after);
  /// Reads every piece not already resident. Call after start_measure(before) finished.
  std::shared_ptr<Job> start_reads(ThreadPool& pool, std::size_t threads);

  /// Bytes the reading job has dealt with (read or found resident) and will deal with, for a progress bar.
  std::uint64_t bytes_done() const;
  std::uint64_t bytes_total() const;
  /// Bytes actually read (pieces not resident before), after the reading job.
  std::uint64_t bytes_read() const;
  const std::vector<FileState>& files() const { return files_; }

 private:
  struct Piece {
    std::size_t file;
    std::uint64_t offset;
    std::uint64_t length;
  };

  std::vector<std::string> paths_;
  std::uint64_t chunk_bytes_;
  std::vector<FileState> files_;
  std::vector<Piece> pieces_;
  std::vector<std::uint64_t> read_per_piece_;
  std::atomic<std::uint64_t> done_{0};
};

}  // namespace npyfeed
