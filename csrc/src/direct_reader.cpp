#include "npyfeed/direct_reader.hpp"

#include <fcntl.h>
#include <linux/stat.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include "npyfeed/errors.hpp"

#ifndef STATX_DIOALIGN
#define STATX_DIOALIGN 0x00002000U
#endif

namespace npyfeed {

std::size_t direct_alignment(const File& file) {
  constexpr std::size_t kDefault = 4096;
  struct statx stx {};
  long rc = ::syscall(SYS_statx, file.fd(), "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx);
  if (rc != 0 || (stx.stx_mask & STATX_DIOALIGN) == 0) return kDefault;
  std::size_t a = std::max<std::size_t>(stx.stx_dio_mem_align, stx.stx_dio_offset_align);
  if (a == 0 || (a & (a - 1)) != 0) return kDefault;  // 0: O_DIRECT unsupported there; keep the safe default
  return std::max<std::size_t>(a, 512);
}

bool read_direct_into(const File& file, std::size_t align, std::byte* dest, std::uint64_t offset, std::uint64_t length) {
  if (length == 0) return true;
  const std::uint64_t start = align_down(offset, align);
  const std::uint64_t end = align_up(offset + length, align);
  std::byte* base = dest - (offset - start);
  std::uint64_t done = 0;
  while (start + done < end) {
    std::uint64_t want = std::min<std::uint64_t>(end - start - done, 1u << 30);
    ssize_t got = ::pread(file.fd(), base + done, want, static_cast<off_t>(start + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno == EINVAL) return false;
      throw OsError(errno, file.path(), "cannot read (O_DIRECT)");
    }
    if (got == 0) break;
    done += static_cast<std::uint64_t>(got);
    if (got % static_cast<ssize_t>(align) != 0) break;  // a short, unaligned read only happens at end of file
  }
  if (start + done < offset + length) {
    throw NpyFormatError(file.path(), start + done,
                         "file ended while reading " + std::to_string(length) + " bytes at offset " +
                             std::to_string(offset) + " (truncated, or shrunk while being read)");
  }
  return true;
}

}  // namespace npyfeed
