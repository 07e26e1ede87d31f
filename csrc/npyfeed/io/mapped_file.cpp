#include "npyfeed/io/mapped_file.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "npyfeed/common/errors.hpp"
#include "npyfeed/io/fault_guard.hpp"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

namespace npyfeed {

NpyFormatError shrunk_mapping_error(const std::string& path, std::uint64_t offset, std::uint64_t length) {
  return NpyFormatError(path, offset,
                        "cannot read bytes " + std::to_string(offset) + " to " + std::to_string(offset + length) +
                            " of the mapping: the file shrank after it was opened (truncated while in use; "
                            "replace files by renaming a new one over them instead)");
}

std::uint64_t page_size() noexcept {
  static const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

Populated populate_read(const std::byte* addr, std::uint64_t length) noexcept {
  if (::madvise(const_cast<std::byte*>(addr), length, MADV_POPULATE_READ) == 0) return Populated::kDone;
  switch (errno) {
    case EINVAL:
      return Populated::kUnsupported;
    case EFAULT:
      return Populated::kShrunk;
    case EIO:
      return Populated::kIoError;
    default:
      return Populated::kFailed;
  }
}

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
  const std::uint64_t page = page_size();
  const std::uint64_t start = offset / page * page;
  const std::uint64_t end = offset + length;
  const Populated populated = populate_read(data_ + start, end - start);
  if (populated == Populated::kDone) return;
  // A page that cannot be read: the file shrank after it was mapped.
  if (populated == Populated::kShrunk) throw shrunk_mapping_error("", offset, length);
  // Older kernels (or any other refusal): touch one byte per page, guarded (a lost page raises SIGBUS, a device
  // error too; see fault_guard.hpp).
  const std::byte* data = data_;
  auto touch = [&] {
    volatile std::byte sink{};
    for (std::uint64_t at = start; at < end; at += page) sink = data[at];
    (void)sink;
  };
  if (!guarded(touch)) throw shrunk_mapping_error("", offset, length);
}

void MappedFile::will_need(std::uint64_t offset, std::uint64_t length) const {
  if (length == 0 || data_ == nullptr) return;
  const std::uint64_t page = page_size();
  const std::uint64_t start = offset / page * page;
  ::madvise(const_cast<std::byte*>(data_) + start, offset + length - start, MADV_WILLNEED);  // advisory only
}

std::uint64_t MappedFile::populate_cached(std::uint64_t offset, std::uint64_t length) const noexcept {
  if (data_ == nullptr || offset >= size_) return 0;
  const std::uint64_t page = page_size();
  // mincore in steps of this many pages: its vector stays small, and a step's look is fresh when mapped.
  constexpr std::uint64_t kStepPages = 512;
  const std::uint64_t begin = offset / page;
  const std::uint64_t end = (std::min(offset + length, size_) + page - 1) / page;
  unsigned char resident[kStepPages];
  std::uint64_t mapped = 0;
  for (std::uint64_t step = begin; step < end; step += kStepPages) {
    const std::uint64_t pages = std::min(kStepPages, end - step);
    std::byte* at = const_cast<std::byte*>(data_) + step * page;
    if (::mincore(at, pages * page, resident) != 0) return mapped;
    for (std::uint64_t i = 0; i < pages;) {
      if ((resident[i] & 1) == 0) {
        ++i;
        continue;
      }
      std::uint64_t j = i + 1;
      while (j < pages && (resident[j] & 1) != 0) ++j;
      // Unsupported (touching the pages here would only move the faults), shrunk (the gather's guarded read
      // reports it), failed (the mapping went away): stop on any of them.
      if (populate_read(at + i * page, (j - i) * page) != Populated::kDone) return mapped;
      mapped += (j - i) * page;
      i = j;
    }
  }
  return mapped;
}

}  // namespace npyfeed
