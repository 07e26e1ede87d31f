#include "npyfeed/mapped_file.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include "npyfeed/errors.hpp"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

namespace npyfeed {

std::shared_ptr<MappedFile> MappedFile::map(const File& file) {
  if (file.size() == 0) return std::shared_ptr<MappedFile>(new MappedFile(nullptr, 0));
  void* p = ::mmap(nullptr, file.size(), PROT_READ, MAP_SHARED, file.fd(), 0);
  if (p == MAP_FAILED) {
    const int error = errno;
    if (error == ENOMEM) {
      throw OsError(error, file.path(),
                    "cannot map (a process may hold vm.max_map_count mappings, one per file mapped: use "
                    "mode=\"read\" to load this many files)");
    }
    throw OsError(error, file.path(), "cannot map");
  }
  return std::shared_ptr<MappedFile>(new MappedFile(static_cast<const std::byte*>(p), file.size()));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
}

void MappedFile::populate(std::uint64_t offset, std::uint64_t length) const {
  if (length == 0 || data_ == nullptr) return;
  static const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  std::uint64_t start = offset / page * page;
  std::uint64_t end = offset + length;
  if (::madvise(const_cast<std::byte*>(data_) + start, end - start, MADV_POPULATE_READ) == 0) return;
  if (errno == EFAULT) {
    // A page cannot be read: the file shrank after it was mapped (or the device failed). Touching it
    // would raise SIGBUS, so report it instead.
    throw NpyFormatError("", offset,
                         "cannot read bytes " + std::to_string(offset) + " to " + std::to_string(end) +
                             " of the mapping: the file shrank after it was opened (truncated while loading)");
  }
  // Older kernels (EINVAL): touch one byte per page.
  volatile std::byte sink{};
  for (std::uint64_t at = start; at < end; at += page) sink = data_[at];
  (void)sink;
}

void MappedFile::will_need(std::uint64_t offset, std::uint64_t length) const {
  if (length == 0 || data_ == nullptr) return;
  static const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  std::uint64_t start = offset / page * page;
  ::madvise(const_cast<std::byte*>(data_) + start, offset + length - start, MADV_WILLNEED);  // advisory only
}

}  // namespace npyfeed
