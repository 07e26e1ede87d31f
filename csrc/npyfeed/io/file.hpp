// A read-only file descriptor that is safe to open on anything a user might name (FIFOs do not block,
// directories are refused), and a pread loop that survives EINTR and short reads.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace npyfeed {

/// Identity of an opened file, to notice a file changed between two opens: renamed over or re-created (another
/// device or inode), truncated or grown (size), or written in place (modification time).
struct FileIdentity {
  std::uint64_t device = 0;
  std::uint64_t inode = 0;
  std::uint64_t size = 0;
  std::int64_t mtime_ns = 0;
  bool operator==(const FileIdentity&) const = default;
};

/// A file as it was when first opened: what a later open or an epoch's check compares against.
struct FileOrigin {
  std::string path;
  FileIdentity identity;
};

/// The one check that a file is still the one first opened. Throws OsError(ESTALE) (`npyfeed.FileChangedError`)
/// naming `origin.path` and what changed between `origin.identity` and `now`; returns where they are equal.
void check_same_file(const FileOrigin& origin, const FileIdentity& now);
/// The same check by the path alone (stat, no open): a file gone since raises OsError(ENOENT) saying it was
/// deleted since it was opened.
void check_unchanged(const FileOrigin& origin);

/// Descriptors npyfeed may hold open at once: half the soft RLIMIT_NOFILE (the other half is the rest of the
/// process's), or SIZE_MAX without a limit. Read each call (a process may raise its limit).
std::size_t descriptor_budget() noexcept;

class File {
 public:
  File() = default;
  /// Opens `path` read-only. `direct` adds O_DIRECT and throws OsError(EINVAL) where the filesystem refuses it.
  /// Throws OsError (ENOENT, EACCES, EISDIR for directories, EMFILE naming the RLIMIT_NOFILE limit, ...) or
  /// NpyFormatError for non-regular files.
  static File open(const std::string& path, bool direct = false);
  /// Opens `origin.path` again (as open()), checked to be the same file (check_same_file); a file gone since
  /// raises OsError(ENOENT) saying it was deleted since it was opened.
  static File reopen(const FileOrigin& origin, bool direct = false);
  ~File();
  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  int fd() const noexcept { return fd_; }
  const std::string& path() const noexcept { return path_; }
  std::uint64_t size() const noexcept { return size_; }
  FileIdentity identity() const noexcept { return identity_; }
  FileOrigin origin() const { return {path_, identity_}; }
  bool is_open() const noexcept { return fd_ >= 0; }

  /// Reads up to `length` bytes at `offset`, looping over short reads and EINTR; returns the bytes read,
  /// which is less than `length` only at end of file. Throws OsError carrying the offset of the failed read.
  std::size_t read_at(void* buffer, std::size_t length, std::uint64_t offset) const;
  /// Like read_at, but a short read is an NpyFormatError saying the file ended early (truncated).
  void read_exact(void* buffer, std::size_t length, std::uint64_t offset) const;
  /// Whether the byte at `offset` is in the page cache, by a 1-byte RWF_NOWAIT read (EAGAIN: it is not).
  /// True where that cannot tell (a closed file, an error, a kernel or filesystem without RWF_NOWAIT).
  bool probably_cached(std::uint64_t offset) const noexcept;
  /// Checks (fstat) that the open file still has the size and modification time it had when opened: throws
  /// as check_same_file where it was written since (e.g. while it was being read).
  void check_unchanged() const;
  void close() noexcept;

 private:
  int fd_ = -1;
  std::string path_;
  std::uint64_t size_ = 0;
  FileIdentity identity_;
};

}  // namespace npyfeed
