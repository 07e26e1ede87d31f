// A whole file mapped read-only and shared: N processes mapping one file share one copy in the page cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "npyfeed/common/errors.hpp"
#include "npyfeed/io/file.hpp"

namespace npyfeed {

/// The error for file bytes [offset, offset + length) of a mapping of `path` that could not be read: the
/// file shrank after it was mapped (truncated in place while in use), or the device failed.
NpyFormatError shrunk_mapping_error(const std::string& path, std::uint64_t offset, std::uint64_t length);

/// The size of a page of memory (sysconf, asked once).
std::uint64_t page_size() noexcept;

/// What the kernel said to populate_read.
enum class Populated {
  kDone,         ///< every page of the range is in the page cache and mapped
  kUnsupported,  ///< EINVAL: no MADV_POPULATE_READ (Linux < 5.14)
  kShrunk,       ///< EFAULT: a page past the end of the file (it shrank after it was mapped)
  kIoError,      ///< EIO: the device could not read a page
  kFailed,       ///< anything else (ENOMEM: the mapping went away, EINTR, ...)
};

/// Faults the pages of [addr, addr + length) of a shared file mapping into the page cache and this process's
/// page tables with one MADV_POPULATE_READ (`addr` page-aligned): the one place the core asks for it. It never
/// touches the memory itself, so it raises no SIGBUS; what to do with each answer is the caller's policy.
Populated populate_read(const std::byte* addr, std::uint64_t length) noexcept;

class MappedFile {
 public:
  /// Maps all of `file` (which may be closed afterwards). Throws OsError.
  static std::shared_ptr<MappedFile> map(const File& file);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const noexcept { return data_; }
  std::uint64_t size() const noexcept { return size_; }
  /// Faults in [offset, offset + length) now (MADV_POPULATE_READ, or touching each page, guarded, on old
  /// kernels), so that later reads never wait on the disk. Throws NpyFormatError (without a path) where the
  /// file has shrunk below the range since it was mapped.
  void populate(std::uint64_t offset, std::uint64_t length) const;
  /// Asks the kernel to start reading [offset, offset + length) in the background (MADV_WILLNEED); returns at once.
  void will_need(std::uint64_t offset, std::uint64_t length) const;
  /// Maps into this process's page tables the pages of [offset, offset + length) that are in the page cache
  /// already (asked with mincore, mapped in runs with MADV_POPULATE_READ), so that the first reads of them
  /// take no page fault. Reads nothing from the disk (but a page evicted between the two calls) and never
  /// throws: it stops early where the kernel lacks MADV_POPULATE_READ (< 5.14) or the file shrank (a read of
  /// the lost pages reports that, guarded). Returns the bytes of the pages mapped.
  std::uint64_t populate_cached(std::uint64_t offset, std::uint64_t length) const noexcept;

 private:
  MappedFile(const std::byte* data, std::uint64_t size) : data_(data), size_(size) {}
  const std::byte* data_;
  std::uint64_t size_;
};

}  // namespace npyfeed
