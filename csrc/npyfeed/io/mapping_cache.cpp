#include "npyfeed/io/mapping_cache.hpp"

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <iterator>
#include <string>

#include "npyfeed/common/errors.hpp"
#include "npyfeed/common/settings.hpp"

namespace npyfeed {

namespace {

std::size_t max_map_count() {
  if (const auto limit = settings::max_mappings()) return *limit;
  std::ifstream in("/proc/sys/vm/max_map_count");
  std::size_t value = 0;
  if (in >> value && value > 0) return value;
  return 65530;  // the kernel's default
}

std::size_t mappings_now() {
  std::ifstream in("/proc/self/maps");
  std::size_t lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  return lines;
}

}  // namespace

std::size_t mapping_budget() {
  const std::size_t limit = max_map_count();
  const std::size_t used = mappings_now();
  return used >= limit ? 0 : (limit - used) / 2;
}

MappingCache::MappingCache(std::size_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {}

std::shared_ptr<const MappedFile> MappingCache::acquire(const FileOrigin& origin) {
  const std::string& path = origin.path;
  {
    std::lock_guard lock(mutex_);
    if (auto it = by_path_.find(path); it != by_path_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->mapping;
    }
  }
  // Map outside the lock (opening and mapping may wait on the disk); two threads may map one file at
  // once: the second keeps the first's mapping.
  File file = File::reopen(origin);
  std::shared_ptr<const MappedFile> mapping;
  try {
    mapping = MappedFile::map(file);
  } catch (const OsError& e) {
    if (e.error_number() == ENOMEM) give_back_half();
    throw;
  }
  std::shared_ptr<const MappedFile> evicted;  // unmapped after the lock is released
  std::lock_guard lock(mutex_);
  ++maps_made_;
  if (auto it = by_path_.find(path); it != by_path_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second);
    return it->second->mapping;
  }
  lru_.push_front({path, mapping});
  by_path_[path] = lru_.begin();
  if (lru_.size() > capacity_) {
    evicted = std::move(lru_.back().mapping);
    by_path_.erase(lru_.back().path);
    lru_.pop_back();
  }
  return mapping;
}

void MappingCache::give_back_half() {
  std::list<Entry> evicted;  // unmapped after the lock is released; splicing into it allocates nothing (the
                             // process is out of mappings, and malloc may need one)
  std::lock_guard lock(mutex_);
  // Once per shortage: threads refused together, or again before any mapping succeeded, halve nothing more.
  if (gave_back_at_ == maps_made_) return;
  gave_back_at_ = maps_made_;
  evicted.splice(evicted.end(), lru_, std::next(lru_.begin(), static_cast<std::ptrdiff_t>(lru_.size() / 2)),
                 lru_.end());
  for (const Entry& entry : evicted) by_path_.erase(entry.path);
  capacity_ = std::max<std::size_t>(1, capacity_ / 2);  // still at least what is kept (size <= capacity)
}

std::size_t MappingCache::capacity() const {
  std::lock_guard lock(mutex_);
  return capacity_;
}

std::size_t MappingCache::size() const {
  std::lock_guard lock(mutex_);
  return lru_.size();
}

std::uint64_t MappingCache::maps_made() const {
  std::lock_guard lock(mutex_);
  return maps_made_;
}

}  // namespace npyfeed
