// `.npz` archives: a zip of `.npy` members (np.savez: stored, np.savez_compressed: deflated). NpzArchive is the
// one reader of members: how each is read (a zero-copy view of a shared mapping, pread, inflate) is decided here
// and only here, and each member comes out as an ArrayReader over memory, so the loader and the window gather
// use members as they use `.npy` files. NpzLoad loads many archives in parallel, one work item per member.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "npyfeed/common/errors.hpp"
#include "npyfeed/common/thread_pool.hpp"
#include "npyfeed/format/npy_header.hpp"
#include "npyfeed/format/zip_archive.hpp"
#include "npyfeed/io/array_reader.hpp"
#include "npyfeed/io/file.hpp"
#include "npyfeed/io/mapped_file.hpp"

namespace npyfeed {

/// The key np.load gives a member: its name without a final ".npy".
std::string npz_key(const std::string& member_name);

/// The alignment a zero-copy view needs: the largest power of two dividing the item size, at most 16
/// (at least what numpy's dtype alignment asks for any dtype of that size).
std::size_t view_alignment(std::uint64_t itemsize) noexcept;

class NpzArchive {
 public:
  /// Opens `path` and reads its directory (read_zip_directory), refusing two members with one key ("a" and
  /// "a.npy"). Throws OsError, NpyFormatError naming the archive (and the member).
  static std::shared_ptr<NpzArchive> open(const std::string& path);

  const std::string& path() const noexcept { return path_; }
  const std::vector<ZipMember>& members() const noexcept { return members_; }
  /// The index of the member whose key (npz_key) is `key`; throws InvalidArgument listing the keys.
  std::size_t find(const std::string& key) const;

  /// Reads and validates member `i`'s `.npy` header, inflating only the bytes it needs. Its data_offset is
  /// relative to the member's first uncompressed byte. Throws NpyFormatError naming archive and member.
  NpyHeader read_member_header(std::size_t i, std::size_t max_header_size) const;

  /// Opens member `i` as a reader whose data is in memory (view()):
  ///  - stored, mode kMmap, data aligned for its dtype (view_alignment): a read-only view of one shared
  ///    mapping of the archive, zero-copy (its CRC is not checked: that would read every byte);
  ///  - otherwise the data is read (stored) or inflated (deflated) once, straight into a 64-byte aligned buffer,
  ///    and the member's CRC-32 checked; writable unless mode is kMmap.
  /// `mapped_view` (optional) is set to whether the result is a view of the mapping.
  /// Throws NpyFormatError naming archive and member, OsError (ESTALE when the archive was replaced).
  std::shared_ptr<ArrayReader> open_member(std::size_t i, ReadMode mode, std::size_t max_header_size,
                                           bool* mapped_view = nullptr) const;
  /// The shared mapping of the archive (made on first use).
  std::shared_ptr<MappedFile> mapping() const;

 private:
  NpzArchive() = default;
  File reopen() const;
  NpyHeader read_header(MemberStream& stream, const ZipMember& member, std::size_t max_header_size) const;
  [[noreturn]] void rethrow_for(const ZipMember& member, const NpyFormatError& e, bool offset_in_archive) const;

  std::string path_;
  FileOrigin origin_;
  std::uint64_t size_ = 0;
  std::vector<ZipMember> members_;
  mutable std::mutex mapping_mutex_;
  mutable std::shared_ptr<MappedFile> mapping_;
};

}  // namespace npyfeed
