// O_DIRECT reads: they bypass the page cache, so a cold read costs one copy (disk -> user buffer) and
// does not evict what the training job keeps cached. Buffer address, file offset and length must be
// aligned to the device's requirement; `.npy` data starts at a 64-byte (16 in old writers) boundary,
// never a page boundary, so callers lay buffers out to put the data where an aligned read lands it:
//
//   file:    |....page....|....page....|....page....|
//                  ^ data_offset                ^ data end
//   buffer:  |<-lead->|<--------- data -------->|<-tail->|   base aligned to `align`
//            base     base + data_offset % align
#pragma once

#include <cstddef>
#include <cstdint>

#include "npyfeed/io/file.hpp"

namespace npyfeed {

/// The alignment O_DIRECT needs for `file` (statx STATX_DIOALIGN where the kernel reports it; else 4096,
/// which satisfies every common device). The larger of the memory and offset requirements.
std::size_t direct_alignment(const File& file);

inline std::uint64_t align_down(std::uint64_t x, std::uint64_t a) { return x / a * a; }
inline std::uint64_t align_up(std::uint64_t x, std::uint64_t a) { return (x + a - 1) / a * a; }

/// Reads file bytes [offset, offset + length) with O_DIRECT so that they land at `dest`. The aligned
/// range around them is read: `dest - offset % align` must be aligned to `align`, and that much head
/// room and `align` bytes of tail room must be writable. Returns false (nothing promised about `dest`)
/// when the filesystem refuses the aligned read (EINVAL), or when reads stop short inside a block (the file
/// ends there, or the device returns short reads), so the caller can fall back to buffered IO.
/// Throws OsError, or NpyFormatError when the file ends early.
bool read_direct_into(const File& file, std::size_t align, std::byte* dest, std::uint64_t offset, std::uint64_t length);

}  // namespace npyfeed
