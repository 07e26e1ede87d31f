// The zip container of `.npz` files: the central directory (ZIP64 included) parsed as hostile input, CRC-32,
// and a bounded inflater for deflated members. No file IO here: bytes come through a ReadAt callback, so
// tests and the fuzzer feed archives from memory. Spec: PKWARE APPNOTE 6.3; the behaviour to match is
// Python's zipfile (what np.load uses). Member names are only ever compared and returned, never used as paths.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace npyfeed {

/// The largest ratio of uncompressed to compressed size deflate can reach (about 1032:1); a member announcing
/// more is a zip bomb or a lie, refused before anything is allocated.
inline constexpr std::uint64_t kMaxDeflateRatio = 1032;

/// Whether deflated members can be read (npyfeed was built with zlib).
bool have_inflate() noexcept;

/// One member, from its central directory entry (sizes, CRC) and its local header (where the data starts).
struct ZipMember {
  std::string name;                   // as stored (bytes; utf-8 when utf8_name, else cp437)
  bool utf8_name = false;             // general purpose flag bit 11
  std::uint16_t method = 0;           // 0 stored, 8 deflated (others are refused)
  std::uint32_t crc32 = 0;            // of the uncompressed bytes
  std::uint64_t compressed_size = 0;  // bytes at data_offset
  std::uint64_t uncompressed_size = 0;
  std::uint64_t header_offset = 0;  // the local file header
  std::uint64_t data_offset = 0;    // first byte of the member's (compressed) data in the archive
  bool is_stored() const noexcept { return method == 0; }
};

/// Reads up to `length` bytes at `offset` into `dest`; returns the bytes read (fewer only at the end).
using ReadAt = std::function<std::size_t(std::byte* dest, std::size_t length, std::uint64_t offset)>;

/// Reads the directory of a zip archive of `size` bytes: the end record (ZIP64 too), every central entry and
/// every local header. Refuses what np.load could be tricked by or cannot read: no end record, a truncated or
/// inconsistent directory, split archives, encryption, methods other than stored and deflated, names that are
/// empty, hold a NUL or appear twice, local headers that disagree with the directory, members that overlap each
/// other or the directory, a stored member whose sizes differ, a deflated one whose sizes claim more than
/// deflate's ratio. Throws NpyFormatError (without a path; the reason names the member) at the offending byte.
std::vector<ZipMember> read_zip_directory(const ReadAt& read_at, std::uint64_t size);

/// Zip's CRC-32 of `length` bytes, continuing from `crc` (0 to start).
std::uint32_t crc32_update(std::uint32_t crc, const std::byte* data, std::size_t length) noexcept;

/// "member 'a.npy'": how messages name a member.
std::string member_label(const ZipMember& member);

/// Streams the uncompressed bytes of one member, stored or deflated, in order: compressed bytes are pulled
/// through `read_at` in pieces of at most 1 MiB, the output never exceeds the announced uncompressed size, and
/// finish() checks that the stream ends exactly there and that the CRC-32 matches. Not thread-safe; one per
/// member. Throws NpyFormatError (without a path) for a corrupt stream, a short member or a CRC mismatch, and
/// for a deflated member when npyfeed was built without zlib.
class MemberStream {
 public:
  MemberStream(ReadAt read_at, const ZipMember& member);
  ~MemberStream();
  MemberStream(const MemberStream&) = delete;
  MemberStream& operator=(const MemberStream&) = delete;

  /// The next `length` uncompressed bytes into `dest`. Throws when the member holds fewer.
  void read(std::byte* dest, std::size_t length);
  /// Reads (and discards) what is left, then checks the end of the stream and the CRC-32.
  void finish();
  /// Uncompressed bytes delivered so far.
  std::uint64_t position() const noexcept { return produced_; }

 private:
  void fill_input();
  ReadAt read_at_;
  ZipMember member_;
  std::vector<std::byte> input_;
  std::uint64_t consumed_ = 0;  // compressed bytes read from the archive so far
  std::uint64_t produced_ = 0;
  std::uint32_t crc_ = 0;
  struct Inflate;
  std::unique_ptr<Inflate> inflate_;
};

}  // namespace npyfeed
