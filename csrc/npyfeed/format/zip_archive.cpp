#include "npyfeed/format/zip_archive.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <set>

#include "npyfeed/common/errors.hpp"

#ifdef NPYFEED_HAVE_ZLIB
#include <zlib.h>
#endif

namespace npyfeed {

namespace {

constexpr std::uint32_t kLocalSignature = 0x04034b50;
constexpr std::uint32_t kCentralSignature = 0x02014b50;
constexpr std::uint32_t kEndSignature = 0x06054b50;
constexpr std::uint32_t kEnd64Signature = 0x06064b50;
constexpr std::uint32_t kEnd64LocatorSignature = 0x07064b50;
constexpr std::size_t kLocalSize = 30;
constexpr std::size_t kCentralSize = 46;
constexpr std::size_t kEndSize = 22;
constexpr std::size_t kEnd64Size = 56;
constexpr std::size_t kEnd64LocatorSize = 20;
constexpr std::size_t kMaxComment = 65535;
constexpr std::size_t kPiece = 1u << 20;

[[noreturn]] void fail(std::uint64_t offset, const std::string& reason) {
  throw NpyFormatError("", offset, "not a valid .npz (zip) archive: " + reason);
}

std::uint16_t le16(const std::byte* p) {
  return static_cast<std::uint16_t>(std::to_integer<unsigned>(p[0]) | std::to_integer<unsigned>(p[1]) << 8);
}
std::uint32_t le32(const std::byte* p) {
  return static_cast<std::uint32_t>(le16(p)) | static_cast<std::uint32_t>(le16(p + 2)) << 16;
}
std::uint64_t le64(const std::byte* p) {
  return static_cast<std::uint64_t>(le32(p)) | static_cast<std::uint64_t>(le32(p + 4)) << 32;
}

std::vector<std::byte> read_exactly(const ReadAt& read_at, std::uint64_t offset, std::size_t length,
                                    const std::string& what) {
  std::vector<std::byte> out(length);
  if (length > 0 && read_at(out.data(), length, offset) != length)
    fail(offset, what + " is cut off by the end of the file");
  return out;
}

// The ZIP64 extended information extra field (id 1) replaces, in this order, each of the central entry's
// values that hold all ones. Python's zipfile reads it the same way.
void apply_zip64_extra(const std::byte* extra, std::size_t length, std::uint64_t at, ZipMember& m, bool usize64,
                       bool csize64, bool offset64) {
  std::size_t pos = 0;
  while (pos + 4 <= length) {
    const std::uint16_t id = le16(extra + pos);
    const std::uint16_t size = le16(extra + pos + 2);
    if (pos + 4 + size > length) fail(at + pos, member_label(m) + ": an extra field runs past its entry");
    if (id == 1) {
      const std::byte* p = extra + pos + 4;
      std::size_t left = size;
      auto take = [&](std::uint64_t& value) {
        if (left < 8) fail(at + pos, member_label(m) + ": the ZIP64 extra field is too short");
        value = le64(p);
        p += 8;
        left -= 8;
      };
      if (usize64) take(m.uncompressed_size);
      if (csize64) take(m.compressed_size);
      if (offset64) take(m.header_offset);
      return;
    }
    pos += 4 + size;
  }
  if (usize64 || csize64 || offset64) fail(at, member_label(m) + ": sizes need a ZIP64 extra field, which is missing");
}

struct EndRecord {
  std::uint64_t entries = 0;
  std::uint64_t directory_size = 0;
  std::uint64_t directory_offset = 0;  // as recorded
  std::uint64_t directory_end = 0;     // where the directory must end in the file (the end record(s) start)
};

EndRecord read_end_record(const ReadAt& read_at, std::uint64_t size) {
  if (size < kEndSize) fail(0, "the file is too short for a zip end record");
  const std::uint64_t tail_size = std::min<std::uint64_t>(size, kEndSize + kMaxComment);
  const std::uint64_t tail_at = size - tail_size;
  std::vector<std::byte> tail = read_exactly(read_at, tail_at, tail_size, "the end of the archive");
  // The last end-record signature whose comment fits in the file (a comment may contain the signature).
  std::size_t found = tail.size();
  for (std::size_t i = tail.size() - kEndSize + 1; i-- > 0;) {
    if (le32(tail.data() + i) == kEndSignature && i + kEndSize + le16(tail.data() + i + 20) <= tail.size()) {
      found = i;
      break;
    }
  }
  if (found == tail.size()) fail(size, "no end of central directory record (a truncated or non-zip file)");
  const std::byte* e = tail.data() + found;
  const std::uint64_t end_at = tail_at + found;
  if (le16(e + 4) != 0 || le16(e + 6) != 0) fail(end_at, "split (multi-disk) archives are not supported");
  EndRecord r;
  r.entries = le16(e + 10);
  r.directory_size = le32(e + 12);
  r.directory_offset = le32(e + 16);
  r.directory_end = end_at;
  if (end_at >= kEnd64LocatorSize) {
    std::vector<std::byte> loc = read_exactly(read_at, end_at - kEnd64LocatorSize, kEnd64LocatorSize, "ZIP64 locator");
    if (le32(loc.data()) == kEnd64LocatorSignature) {
      const std::uint64_t locator_at = end_at - kEnd64LocatorSize;
      if (le32(loc.data() + 4) != 0 || le32(loc.data() + 16) > 1)
        fail(locator_at, "split (multi-disk) archives are not supported");
      // Where the ZIP64 end record must be: right before its locator (Python's zipfile reads it there too).
      if (locator_at < kEnd64Size) fail(locator_at, "the ZIP64 end record is missing");
      const std::uint64_t end64_at = locator_at - kEnd64Size;
      std::vector<std::byte> e64 = read_exactly(read_at, end64_at, kEnd64Size, "the ZIP64 end record");
      if (le32(e64.data()) != kEnd64Signature) fail(end64_at, "the ZIP64 end record is missing or misplaced");
      if (le32(e64.data() + 16) != 0 || le32(e64.data() + 20) != 0)
        fail(end64_at, "split (multi-disk) archives are not supported");
      if (le64(e64.data() + 24) != le64(e64.data() + 32))
        fail(end64_at, "split (multi-disk) archives are not supported");
      r.entries = le64(e64.data() + 32);
      r.directory_size = le64(e64.data() + 40);
      r.directory_offset = le64(e64.data() + 48);
      r.directory_end = end64_at;
    }
  }
  if (r.directory_size > r.directory_end) fail(r.directory_end, "the central directory is larger than the file");
  if (r.entries > r.directory_size / kCentralSize)
    fail(r.directory_end, "the end record announces " + std::to_string(r.entries) + " entries in a directory of " +
                              std::to_string(r.directory_size) + " bytes (truncated central directory)");
  return r;
}

}  // namespace

bool have_inflate() noexcept {
#ifdef NPYFEED_HAVE_ZLIB
  return true;
#else
  return false;
#endif
}

std::string member_label(const ZipMember& member) { return "member '" + member.name + "'"; }

std::vector<ZipMember> read_zip_directory(const ReadAt& read_at, std::uint64_t size) {
  // np.load takes a file for an archive only when it starts with a local header or (empty) end record.
  std::byte magic[4] = {};
  const std::uint32_t start = read_at(magic, 4, 0) == 4 ? le32(magic) : 0;
  if (start != kLocalSignature && start != kEndSignature)
    fail(0, "the file does not start with a zip signature (PK\\x03\\x04), as np.load requires");
  const EndRecord end = read_end_record(read_at, size);
  // Bytes prepended to the archive (a self-extractor's stub) shift every offset: Python's zipfile allows them.
  const std::uint64_t directory_at = end.directory_end - end.directory_size;
  if (end.directory_offset > directory_at)
    fail(end.directory_end, "the central directory offset points past the directory's end (truncated directory)");
  const std::uint64_t shift = directory_at - end.directory_offset;
  std::vector<std::byte> dir = read_exactly(read_at, directory_at, end.directory_size, "the central directory");

  std::vector<ZipMember> members;
  members.reserve(end.entries);
  std::set<std::string> names;
  std::size_t pos = 0;
  for (std::uint64_t n = 0; n < end.entries; ++n) {
    const std::uint64_t at = directory_at + pos;
    if (pos + kCentralSize > dir.size() || le32(dir.data() + pos) != kCentralSignature)
      fail(at, "central directory entry " + std::to_string(n) + " is missing or damaged (truncated directory)");
    const std::byte* c = dir.data() + pos;
    const std::uint16_t flags = le16(c + 8);
    const std::size_t name_length = le16(c + 28);
    const std::size_t extra_length = le16(c + 30);
    const std::size_t comment_length = le16(c + 32);
    if (pos + kCentralSize + name_length + extra_length + comment_length > dir.size())
      fail(at, "central directory entry " + std::to_string(n) + " runs past the directory (truncated directory)");
    ZipMember m;
    m.name.assign(reinterpret_cast<const char*>(c + kCentralSize), name_length);
    m.utf8_name = (flags & 0x800) != 0;
    m.method = le16(c + 10);
    m.crc32 = le32(c + 16);
    m.compressed_size = le32(c + 20);
    m.uncompressed_size = le32(c + 24);
    m.header_offset = le32(c + 42);
    if (m.name.empty()) fail(at, "a member has an empty name");
    if (m.name.find('\0') != std::string::npos) fail(at, member_label(m) + ": the name holds a NUL byte");
    if (!names.insert(m.name).second) fail(at, member_label(m) + " appears twice (duplicate member name)");
    apply_zip64_extra(c + kCentralSize + name_length, extra_length, at + kCentralSize + name_length, m,
                      m.uncompressed_size == 0xFFFFFFFFu, m.compressed_size == 0xFFFFFFFFu,
                      m.header_offset == 0xFFFFFFFFu);
    if (le16(c + 34) != 0 && le16(c + 34) != 0xFFFF) fail(at, member_label(m) + ": split archives are not supported");
    if ((flags & 0x1) != 0 || (flags & 0x40) != 0) fail(at, member_label(m) + " is encrypted");
    if (m.method != 0 && m.method != 8)
      fail(at, member_label(m) + ": compression method " + std::to_string(m.method) +
                   " is not supported (only stored and deflated, as np.savez and np.savez_compressed write)");
    if (m.is_stored() && m.compressed_size != m.uncompressed_size)
      fail(at, member_label(m) + ": a stored member whose compressed and uncompressed sizes differ");
    if (!m.is_stored() && m.uncompressed_size / kMaxDeflateRatio > m.compressed_size)
      fail(at, member_label(m) + ": announces " + std::to_string(m.uncompressed_size) + " bytes from " +
                   std::to_string(m.compressed_size) + " compressed, beyond deflate's ratio (a zip bomb?)");
    if (m.header_offset > directory_at - shift)
      fail(at, member_label(m) + ": its local header offset points past the start of the central directory");
    m.header_offset += shift;
    members.push_back(std::move(m));
    pos += kCentralSize + name_length + extra_length + comment_length;
  }

  // Local headers: the data starts after the local name and extra field, whose lengths may differ from the
  // central entry's (np.savez writes a ZIP64 extra field only in the local header).
  for (ZipMember& m : members) {
    if (m.header_offset + kLocalSize > directory_at)
      fail(m.header_offset, member_label(m) + ": its local header runs into the central directory");
    std::vector<std::byte> local =
        read_exactly(read_at, m.header_offset, kLocalSize, member_label(m) + "'s local header");
    if (le32(local.data()) != kLocalSignature) fail(m.header_offset, member_label(m) + ": bad local header signature");
    const std::size_t name_length = le16(local.data() + 26);
    const std::size_t extra_length = le16(local.data() + 28);
    if (le16(local.data() + 8) != m.method)
      fail(m.header_offset, member_label(m) + ": local header and central directory disagree on the method");
    if (name_length != m.name.size()) fail(m.header_offset, member_label(m) + ": local header names another member");
    std::vector<std::byte> name =
        read_exactly(read_at, m.header_offset + kLocalSize, name_length, member_label(m) + "'s local header");
    if (std::memcmp(name.data(), m.name.data(), name_length) != 0)
      fail(m.header_offset, member_label(m) + ": local header names another member");
    m.data_offset = m.header_offset + kLocalSize + name_length + extra_length;
    if (m.data_offset > directory_at || m.compressed_size > directory_at - m.data_offset)
      fail(m.header_offset, member_label(m) + ": its data (" + std::to_string(m.compressed_size) +
                                " bytes) runs past the start of the central directory (truncated archive?)");
  }
  // No two members may share bytes (a zip bomb trick: many entries pointing at one compressed stream).
  std::vector<const ZipMember*> by_offset;
  for (const ZipMember& m : members) by_offset.push_back(&m);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const ZipMember* a, const ZipMember* b) { return a->header_offset < b->header_offset; });
  for (std::size_t i = 1; i < by_offset.size(); ++i) {
    const ZipMember& prev = *by_offset[i - 1];
    if (prev.data_offset + prev.compressed_size > by_offset[i]->header_offset)
      fail(by_offset[i]->header_offset, member_label(*by_offset[i]) + " overlaps " + member_label(prev));
  }
  return members;
}

// ---- CRC-32 ---------------------------------------------------------------------------------------------

std::uint32_t crc32_update(std::uint32_t crc, const std::byte* data, std::size_t length) noexcept {
#ifdef NPYFEED_HAVE_ZLIB
  // zlib's is several times faster than a byte table; it takes lengths as uInt, hence the pieces.
  while (length > 0) {
    const std::size_t n = std::min<std::size_t>(length, 1u << 30);
    crc = static_cast<std::uint32_t>(::crc32(crc, reinterpret_cast<const Bytef*>(data), static_cast<uInt>(n)));
    data += n;
    length -= n;
  }
  return crc;
#else
  static const std::array<std::uint32_t, 256> table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) != 0 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (std::size_t i = 0; i < length; ++i)
    crc = table[(crc ^ std::to_integer<std::uint32_t>(data[i])) & 0xFF] ^ (crc >> 8);
  return ~crc;
#endif
}

// ---- MemberStream ---------------------------------------------------------------------------------------

#ifdef NPYFEED_HAVE_ZLIB
struct MemberStream::Inflate {
  z_stream z{};
  bool ended = false;
  Inflate() {
    // Raw deflate (no zlib header), as zip stores it.
    if (inflateInit2(&z, -MAX_WBITS) != Z_OK) throw std::bad_alloc();
  }
  ~Inflate() { inflateEnd(&z); }
};
#else
struct MemberStream::Inflate {};
#endif

MemberStream::MemberStream(ReadAt read_at, const ZipMember& member) : read_at_(std::move(read_at)), member_(member) {
  if (!member_.is_stored()) {
#ifdef NPYFEED_HAVE_ZLIB
    inflate_ = std::make_unique<Inflate>();
#else
    throw NpyFormatError("", member_.data_offset,
                         member_label(member_) +
                             " is deflated (np.savez_compressed), and this npyfeed was built without zlib: "
                             "install zlib's development files (zlib1g-dev) and reinstall npyfeed");
#endif
  }
}

MemberStream::~MemberStream() = default;

void MemberStream::fill_input() {
  const std::uint64_t left = member_.compressed_size - consumed_;
  const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(left, kPiece));
  input_.resize(n);
  if (n == 0 || read_at_(input_.data(), n, member_.data_offset + consumed_) != n)
    throw NpyFormatError("", member_.data_offset + consumed_,
                         member_label(member_) + ": the compressed data ends early (truncated or corrupt member)");
  consumed_ += n;
}

void MemberStream::read(std::byte* dest, std::size_t length) {
  if (length > member_.uncompressed_size - produced_)
    throw NpyFormatError("", member_.data_offset,
                         member_label(member_) + " is shorter than its .npy header promises (" +
                             std::to_string(member_.uncompressed_size) + " bytes)");
  if (member_.is_stored()) {
    if (length > 0 && read_at_(dest, length, member_.data_offset + produced_) != length)
      throw NpyFormatError("", member_.data_offset + produced_,
                           member_label(member_) + " is cut off (truncated archive)");
  } else {
#ifdef NPYFEED_HAVE_ZLIB
    z_stream& z = inflate_->z;
    std::size_t done = 0;
    while (done < length) {
      if (inflate_->ended)
        throw NpyFormatError("", member_.data_offset,
                             member_label(member_) + ": the deflate stream ends before its announced size");
      if (z.avail_in == 0) {
        fill_input();
        z.next_in = reinterpret_cast<Bytef*>(input_.data());
        z.avail_in = static_cast<uInt>(input_.size());
      }
      const std::size_t want = std::min<std::size_t>(length - done, 1u << 30);
      z.next_out = reinterpret_cast<Bytef*>(dest + done);
      z.avail_out = static_cast<uInt>(want);
      const int rc = ::inflate(&z, Z_NO_FLUSH);
      done += want - z.avail_out;
      if (rc == Z_STREAM_END) {
        inflate_->ended = true;
      } else if (rc != Z_OK && !(rc == Z_BUF_ERROR && z.avail_in == 0)) {
        throw NpyFormatError("", member_.data_offset + consumed_,
                             member_label(member_) + ": corrupt deflate data (" + (z.msg ? z.msg : "zlib error") + ")");
      }
    }
#endif
  }
  crc_ = crc32_update(crc_, dest, length);
  produced_ += length;
}

void MemberStream::finish() {
  std::vector<std::byte> sink(
      static_cast<std::size_t>(std::min<std::uint64_t>(member_.uncompressed_size - produced_, kPiece)));
  while (produced_ < member_.uncompressed_size) {
    const std::size_t n =
        static_cast<std::size_t>(std::min<std::uint64_t>(member_.uncompressed_size - produced_, kPiece));
    read(sink.data(), n);
  }
#ifdef NPYFEED_HAVE_ZLIB
  if (inflate_ && !inflate_->ended) {
    // Exactly the announced size came out: the stream must end here, with nothing more to give.
    std::byte extra;
    z_stream& z = inflate_->z;
    for (;;) {
      if (z.avail_in == 0 && consumed_ < member_.compressed_size) {
        fill_input();
        z.next_in = reinterpret_cast<Bytef*>(input_.data());
        z.avail_in = static_cast<uInt>(input_.size());
      }
      z.next_out = reinterpret_cast<Bytef*>(&extra);
      z.avail_out = 1;
      const int rc = ::inflate(&z, Z_NO_FLUSH);
      if (rc == Z_STREAM_END && z.avail_out == 1) break;
      if (z.avail_out == 0)
        throw NpyFormatError("", member_.data_offset,
                             member_label(member_) + " inflates to more than its announced " +
                                 std::to_string(member_.uncompressed_size) + " bytes");
      if (rc != Z_OK || (z.avail_in == 0 && consumed_ >= member_.compressed_size))
        throw NpyFormatError("", member_.data_offset + consumed_,
                             member_label(member_) + ": the deflate stream is truncated or corrupt");
    }
  }
#endif
  if (crc_ != member_.crc32)
    throw NpyFormatError("", member_.data_offset, member_label(member_) + ": CRC-32 mismatch (the data is corrupt)");
}

}  // namespace npyfeed
