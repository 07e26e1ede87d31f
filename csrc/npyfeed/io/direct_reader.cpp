#include "npyfeed/io/direct_reader.hpp"

#include <fcntl.h>
#include <linux/stat.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include "npyfeed/common/errors.hpp"

#ifndef STATX_DIOALIGN
#define STATX_DIOALIGN 0x00002000U
#endif

namespace npyfeed {

std::size_t direct_alignment(const File& file) {
  constexpr std::size_t kDefault = 4096;
  struct statx stx{};
  long rc = ::syscall(SYS_statx, file.fd(), "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx);
  if (rc != 0 || (stx.stx_mask & STATX_DIOALIGN) == 0) return kDefault;
  std::size_t a = std::max<std::size_t>(stx.stx_dio_mem_align, stx.stx_dio_offset_align);
  if (a == 0 || (a & (a - 1)) != 0) return kDefault;  // 0: O_DIRECT unsupported there; keep the safe default
  return std::max<std::size_t>(a, 512);
}

bool read_direct_into(const File& file, std::size_t align, std::byte* dest, std::uint64_t offset,
                      std::uint64_t length) {
  if (length == 0) return true;
  const std::uint64_t start = align_down(offset, align);
  const std::uint64_t end = align_up(offset + length, align);
  std::byte* base = dest - (offset - start);
  std::uint64_t done = 0;  // bytes read from `start` on
  while (start + done < offset + length) {
    // A short read may stop anywhere, but O_DIRECT can only go on from an aligned position: read the
    // partial block again. Where that brings nothing new, the file ends inside that block or the reads
    // keep stopping short: buffered reads, which go on from any offset, finish or find the end.
    const std::uint64_t at = align_down(done, align);
    std::uint64_t want = std::min<std::uint64_t>(end - start - at, 1u << 30);
    ssize_t got = ::pread(file.fd(), base + at, want, static_cast<off_t>(start + at));
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno == EINVAL) return false;
      throw OsError(errno, file.path(), "cannot read (O_DIRECT)", start + at);
    }
    if (got == 0 && at == done) break;  // end of file at a block boundary
    if (at + static_cast<std::uint64_t>(got) <= done) return false;
    done = at + static_cast<std::uint64_t>(got);
  }
  if (start + done < offset + length) {
    throw NpyFormatError(file.path(), start + done,
                         "file ended while reading " + std::to_string(length) + " bytes at offset " +
                             std::to_string(offset) + " (truncated, or shrunk while being read)");
  }
  return true;
}

}  // namespace npyfeed
