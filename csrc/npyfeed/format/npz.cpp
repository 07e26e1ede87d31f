#include "npyfeed/format/npz.hpp"

#include <algorithm>
#include <cerrno>
#include <map>

#include "npyfeed/common/errors.hpp"

namespace npyfeed {

std::string npz_key(const std::string& member_name) {
  const std::string suffix = ".npy";
  if (member_name.size() >= suffix.size() &&
      member_name.compare(member_name.size() - suffix.size(), suffix.size(), suffix) == 0)
    return member_name.substr(0, member_name.size() - suffix.size());
  return member_name;
}

std::size_t view_alignment(std::uint64_t itemsize) noexcept {
  if (itemsize == 0) return 1;
  return static_cast<std::size_t>(std::min<std::uint64_t>(itemsize & (~itemsize + 1), 16));
}

std::shared_ptr<NpzArchive> NpzArchive::open(const std::string& path) {
  File file = File::open(path);
  std::shared_ptr<NpzArchive> archive(new NpzArchive());
  archive->path_ = path;
  archive->origin_ = file.origin();
  archive->size_ = file.size();
  try {
    archive->members_ = read_zip_directory([&file](std::byte* dest, std::size_t length,
                                                   std::uint64_t offset) { return file.read_at(dest, length, offset); },
                                           file.size());
  } catch (const NpyFormatError& e) {
    throw e.with_path(path);
  }
  std::map<std::string, const ZipMember*> keys;
  for (const ZipMember& m : archive->members_) {
    auto [it, added] = keys.emplace(npz_key(m.name), &m);
    if (!added) {
      throw NpyFormatError(path, m.header_offset,
                           member_label(m) + " and " + member_label(*it->second) + " both give the key '" + it->first +
                               "' (np.load would return only one of them)");
    }
  }
  return archive;
}

std::size_t NpzArchive::find(const std::string& key) const {
  std::string known;
  for (std::size_t i = 0; i < members_.size(); ++i) {
    if (npz_key(members_[i].name) == key) return i;
    known += (i ? ", '" : "'") + npz_key(members_[i].name) + "'";
  }
  throw InvalidArgument(path_ + ": no member '" + key + "' in the archive (it holds " + known + ")");
}

File NpzArchive::reopen() const { return File::reopen(origin_); }

std::shared_ptr<MappedFile> NpzArchive::mapping() const {
  std::lock_guard lock(mapping_mutex_);
  if (!mapping_) mapping_ = MappedFile::map(reopen());
  return mapping_;
}

void NpzArchive::rethrow_for(const ZipMember& member, const NpyFormatError& e, bool offset_in_archive) const {
  // The parser's offsets count from the member's first uncompressed byte: in the archive for a stored member,
  // and said in words for a deflated one (whose uncompressed bytes are nowhere in the file).
  if (offset_in_archive)
    throw NpyFormatError(path_, member.data_offset + e.offset(), member_label(member) + ": " + e.reason());
  throw NpyFormatError(path_, member.data_offset,
                       member_label(member) + ": " + e.reason() + " (at byte " + std::to_string(e.offset()) +
                           " of the uncompressed member)");
}

NpyHeader NpzArchive::read_header(MemberStream& stream, const ZipMember& member, std::size_t max_header_size) const {
  std::vector<std::byte> head(
      static_cast<std::size_t>(std::min<std::uint64_t>(member.uncompressed_size, kMaxPreambleSize)));
  NpyHeader header;
  try {
    stream.read(head.data(), head.size());
    const std::uint64_t need = npy_header_end(head, max_header_size);
    if (need > member.uncompressed_size) {
      throw NpyFormatError("", member.uncompressed_size,
                           "the member is truncated: its .npy header needs " + std::to_string(need) +
                               " bytes, it has " + std::to_string(member.uncompressed_size));
    }
    const std::size_t have = head.size();
    head.resize(static_cast<std::size_t>(need));
    stream.read(head.data() + have, head.size() - have);
    header = parse_npy_header(head, max_header_size);
  } catch (const NpyFormatError& e) {
    if (e.path() == path_) throw;
    rethrow_for(member, e, member.is_stored());
  }
  if (member.uncompressed_size - header.data_offset < header.nbytes || member.uncompressed_size < header.data_offset) {
    throw NpyFormatError(path_, member.data_offset,
                         member_label(member) + " is truncated: its header promises " + std::to_string(header.nbytes) +
                             " bytes of data at offset " + std::to_string(header.data_offset) + ", the member has " +
                             std::to_string(member.uncompressed_size) + " bytes in all");
  }
  return header;
}

NpyHeader NpzArchive::read_member_header(std::size_t i, std::size_t max_header_size) const {
  const ZipMember& member = members_.at(i);
  File file = reopen();
  try {
    MemberStream stream([&file](std::byte* dest, std::size_t length,
                                std::uint64_t offset) { return file.read_at(dest, length, offset); },
                        member);
    return read_header(stream, member, max_header_size);
  } catch (const NpyFormatError& e) {
    if (e.path() == path_) throw;
    throw e.with_path(path_);
  }
}

std::shared_ptr<ArrayReader> NpzArchive::open_member(std::size_t i, ReadMode mode, std::size_t max_header_size,
                                                     bool* mapped_view) const {
  const ZipMember& member = members_.at(i);
  const std::string name = path_ + " " + member_label(member);
  File file = reopen();
  if (mapped_view != nullptr) *mapped_view = false;
  try {
    MemberStream stream([&file](std::byte* dest, std::size_t length,
                                std::uint64_t offset) { return file.read_at(dest, length, offset); },
                        member);
    NpyHeader header = read_header(stream, member, max_header_size);
    const std::uint64_t at = member.data_offset + header.data_offset;  // a stored member's data in the archive
    if (mode == ReadMode::kMmap && member.is_stored() && at % view_alignment(header.itemsize) == 0) {
      std::shared_ptr<MappedFile> map = mapping();
      if (map->size() < at + header.nbytes)
        throw NpyFormatError(path_, map->size(), member_label(member) + ": the archive shrank after it was opened");
      if (mapped_view != nullptr) *mapped_view = true;
      return ArrayReader::in_memory(name, std::move(header), map, map->data() + at, /*writable=*/false, origin_);
    }
    // Everything else is read once into owned, 64-byte aligned memory: pread for a stored member, inflate for a
    // deflated one (the whole stream is read, so its end and CRC-32 are checked).
    auto buffer = std::make_shared<AlignedBuffer>(static_cast<std::size_t>(header.nbytes));
    stream.read(buffer->data(), static_cast<std::size_t>(header.nbytes));
    stream.finish();
    const std::byte* data = buffer->data();
    return ArrayReader::in_memory(name, std::move(header), std::move(buffer), data, mode != ReadMode::kMmap, origin_);
  } catch (const NpyFormatError& e) {
    if (e.path() == path_) throw;
    throw e.with_path(path_);
  }
}

// ---- NpzLoad --------------------------------------------------------------------------------------------

}  // namespace npyfeed
