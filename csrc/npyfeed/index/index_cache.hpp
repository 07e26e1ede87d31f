// The compiled index cache: index files compiled once (index.hpp) into a binary file that every later
// open, in any process, maps read-only, so the page cache holds one copy per node. An entry is keyed by
// its index files' identities (absolute path, size, mtime_ns, inode, device) and the format version; a
// stale, corrupt or truncated entry is rebuilt, never trusted. Builders write a temporary file and rename
// it into place under an exclusive flock on `<entry>.lock`, so processes starting together wait for one
// builder and never read a half-written file; the holder removes the lock file before letting go, so none
// is left beside the entries.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "npyfeed/index/index.hpp"

namespace npyfeed {

/// Bumped whenever the file layout or the parse changes.
inline constexpr std::uint32_t kIndexCacheVersion = 3;

struct IndexLoad {
  SampleIndex index;
  std::string cache_path;  // the cache entry used or written; empty when none
  bool built = false;      // this call compiled the index files
  std::string warning;     // why the cache could not be used (the index is then in memory); empty when fine
};

/// Loads index files through the cache in `cache_dir` (compiling on `threads` threads when the entry is
/// missing or stale). An empty `cache_dir` compiles in memory. A cache dir that cannot be created or
/// written degrades to the in-memory index with `warning` set. Throws what read_index_files throws.
IndexLoad load_index(const std::vector<std::string>& paths, const std::string& cache_dir, std::size_t threads);

/// The cache entry's file name for `paths` inside `cache_dir`.
std::string index_cache_path(const std::string& cache_dir, const std::vector<IndexFileIdentity>& files);

/// Writes `index` (compiled from `files`, in order) to `path` atomically: a temporary file renamed into
/// place. Throws OsError.
void write_index_cache(const std::string& path, const SampleIndex& index, const std::vector<IndexFileIdentity>& files);

/// Maps the cache entry at `path` if it is complete, uncorrupted and was compiled from exactly `files`;
/// `names` become the sources' names. Returns false (and leaves `out` alone) otherwise; `why` says why.
bool open_index_cache(const std::string& path, const std::vector<IndexFileIdentity>& files,
                      const std::vector<std::string>& names, SampleIndex& out, std::string* why = nullptr);

/// The checksum the cache uses (64-bit, xxhash-style), exposed for tests.
std::uint64_t index_cache_hash(std::span<const std::byte> data, std::uint64_t seed = 0);

}  // namespace npyfeed
