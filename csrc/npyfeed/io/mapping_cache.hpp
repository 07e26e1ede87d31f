// A bounded set of file mappings, for sources with more files than the process may map at once (Linux
// allows vm.max_map_count mappings per process, 65,530 by default; one per file would refuse a data set of
// 33,000 keys). Files are mapped when first read and unmapped least recently used first; a mapping in use
// (a reader holds it) stays valid after it leaves the cache and is unmapped when its last holder lets go.
// Where the kernel refuses a mapping all the same (others in the process took what was left), the cache gives
// back half of what it keeps and halves its capacity, once per shortage (until a mapping succeeds again): the
// rest of the process (malloc, threads' stacks) needs mappings too, and the refused reads go through pread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "npyfeed/io/file.hpp"
#include "npyfeed/io/mapped_file.hpp"

namespace npyfeed {

/// Mappings the process may still make: half of (vm.max_map_count - the mappings it has now), the other
/// half left to the rest of the process. NPYFEED_MAX_MAPPINGS, when set, replaces vm.max_map_count.
std::size_t mapping_budget();

class MappingCache {
 public:
  /// Keeps at most `capacity` (at least 1) mappings.
  explicit MappingCache(std::size_t capacity);
  /// The mapping of `origin.path`, mapping it now if it is not kept (and checking it is still the file first
  /// opened: File::reopen). Throws OsError (ESTALE for a changed file, ENOENT for a deleted one, ENOMEM where the
  /// mapping is refused: then, once per shortage, half of the mappings kept are let go and the capacity is
  /// halved, to at least 1).
  std::shared_ptr<const MappedFile> acquire(const FileOrigin& origin);
  /// The most mappings kept: the constructor's, or less after a refused mapping.
  std::size_t capacity() const;
  /// Mappings kept now (those in use but evicted not counted).
  std::size_t size() const;
  /// Mappings made so far (a measure of churn).
  std::uint64_t maps_made() const;

 private:
  struct Entry {
    std::string path;
    std::shared_ptr<const MappedFile> mapping;
  };
  void give_back_half();

  std::size_t capacity_;  // guarded by mutex_
  mutable std::mutex mutex_;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<std::string, std::list<Entry>::iterator> by_path_;
  std::uint64_t maps_made_ = 0;
  std::uint64_t gave_back_at_ = ~std::uint64_t{0};  // maps_made_ at the last give-back (none yet)
};

}  // namespace npyfeed
