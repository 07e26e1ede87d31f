#include "npyfeed/io/array_reader.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <span>

#include "npyfeed/common/errors.hpp"
#include "npyfeed/io/direct_reader.hpp"
#include "npyfeed/io/fault_guard.hpp"
#include "npyfeed/io/mapped_file.hpp"
#include "npyfeed/io/read_queue.hpp"

namespace npyfeed {

ReadMode parse_read_mode(const std::string& name) {
  if (name == "mmap") return ReadMode::kMmap;
  if (name == "read") return ReadMode::kRead;
  if (name == "direct") return ReadMode::kDirect;
  throw InvalidArgument("mode must be 'mmap', 'read' or 'direct', not '" + name + "'");
}

namespace {

// A file's first read: most headers fit in it (read_header), and a buffered whole-file read starts with it.
constexpr std::uint64_t kFirstReadBytes = 4096;

void check_holds_data(const NpyHeader& header, const std::string& path, std::uint64_t size) {
  if (size < header.data_offset + header.nbytes) {
    throw NpyFormatError(path, size,
                         "file is truncated: the header promises " + std::to_string(header.nbytes) +
                             " bytes of data at offset " + std::to_string(header.data_offset) + ", the file has only " +
                             std::to_string(size - std::min(size, header.data_offset)));
  }
}

// Scratch memory per thread for fetch(), aligned for O_DIRECT; grows, never shrinks.
std::byte* scratch_buffer(std::size_t size, std::size_t align) {
  thread_local std::unique_ptr<AlignedBuffer> buffer;
  if (!buffer || buffer->size() < size || buffer->alignment() < align) {
    buffer.reset();
    buffer = std::make_unique<AlignedBuffer>(std::max<std::size_t>(size, 1u << 20), std::max<std::size_t>(align, 4096));
  }
  return buffer->data();
}

// Reads one thread keeps in flight through its ReadQueue: the depth at which the disk's random reads top out
// (the limit probe's best: 16 per thread), without one thread per read.
constexpr std::size_t kQueuedReadsPerThread = 16;

NpyFormatError ended_early(const std::string& path, std::uint64_t at, std::uint64_t length, std::uint64_t offset) {
  return NpyFormatError(path, at,
                        "file ended while reading " + std::to_string(length) + " bytes at offset " +
                            std::to_string(offset) + " (truncated, or shrunk while being read)");
}

// Opens the file of `origin` with O_DIRECT, checked to be the same file (File::reopen). Returns a closed File
// where the filesystem refuses O_DIRECT (tmpfs, some FUSE): the caller reads buffered then.
File open_direct(const FileOrigin& origin) {
  try {
    return File::reopen(origin, /*direct=*/true);
  } catch (const OsError& e) {
    if (e.error_number() != EINVAL) throw;
    return File();
  }
}

// An array in memory: owned elsewhere (arrays handed in), or a small file read whole at open.
class MemoryReader final : public ArrayReader {
 public:
  MemoryReader(std::string name, NpyHeader header, std::shared_ptr<const void> owner, const std::byte* data,
               bool writable, bool fell_back, std::optional<FileOrigin> origin)
      : ArrayReader(std::move(name), std::move(header)) {
    origin_ = std::move(origin);
    view_ = data;
    owner_ = std::move(owner);
    writable_ = writable;
    fell_back_.store(fell_back);
  }
};

// A shared read-only mapping of the whole file: N processes mapping one file share one copy in the page cache.
class MappedReader final : public ArrayReader {
 public:
  MappedReader(const File& file, NpyHeader header) : ArrayReader(file.path(), std::move(header)) {
    origin_ = file.origin();
    mapping_ = MappedFile::map(file);
    view_ = mapping_->data() == nullptr ? nullptr : mapping_->data() + header_.data_offset;
    owner_ = mapping_;
  }
  void populate(std::uint64_t offset, std::uint64_t length) const override {
    try {
      mapping_->populate(header_.data_offset + offset, length);
    } catch (const NpyFormatError& e) {
      throw e.with_path(name_);  // MappedFile does not know the path
    }
  }
  void will_need(std::uint64_t offset, std::uint64_t length) const override {
    mapping_->will_need(header_.data_offset + offset, length);
  }
  std::uint64_t populate_cached(std::uint64_t offset, std::uint64_t length) const noexcept override {
    return mapping_->populate_cached(header_.data_offset + offset, length);
  }
  bool probably_cached(std::uint64_t offset) const override {
    if (mapping_->data() == nullptr) return true;
    static const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
    const std::uint64_t at = (header_.data_offset + offset) / page * page;
    unsigned char resident = 1;
    if (::mincore(const_cast<std::byte*>(mapping_->data()) + at, 1, &resident) != 0) return true;
    return (resident & 1) != 0;
  }

 private:
  std::shared_ptr<MappedFile> mapping_;
};

// A file mapped on demand through a bounded MappingCache, for sources with more files than the process may
// map at once. Reads copy out of the mapping while holding it (a pointer into it could outlive its stay in
// the cache), so fetch() goes through this thread's scratch buffer.
class OnDemandMappedReader final : public ArrayReader {
 public:
  OnDemandMappedReader(const File& file, NpyHeader header, std::shared_ptr<MappingCache> cache)
      : ArrayReader(file.path(), std::move(header)), cache_(std::move(cache)) {
    origin_ = file.origin();
  }
  void read(std::uint64_t offset, std::uint64_t length, std::byte* dest) const override {
    if (length == 0) return;
    std::shared_ptr<const MappedFile> mapping;
    try {
      mapping = cache_->acquire(*origin_);
    } catch (const OsError& e) {
      if (e.error_number() != ENOMEM) throw;
      // The process ran out of mappings (others hold them): read this piece with pread instead.
      File file = File::reopen(*origin_);
      file.read_exact(dest, length, header_.data_offset + offset);
      return;
    }
    if (mapping->size() < header_.data_offset + offset + length) {
      throw NpyFormatError(name_, mapping->size(), "file is shorter than when it was opened (truncated)");
    }
    const std::byte* src = mapping->data() + header_.data_offset + offset;
    if (!guarded([&] { std::memcpy(dest, src, length); }))  // the file may shrink after the check above
      throw shrunk_mapping_error(name_, header_.data_offset + offset, length);
  }
  const std::byte* fetch(std::uint64_t offset, std::uint64_t length) const override {
    std::byte* dest = scratch_buffer(length, kBufferAlignment);
    read(offset, length, dest);
    return dest;
  }
  void populate(std::uint64_t offset, std::uint64_t length) const override {
    try {
      cache_->acquire(*origin_)->populate(header_.data_offset + offset, length);
    } catch (const NpyFormatError& e) {
      throw e.with_path(name_);
    } catch (const OsError& e) {
      if (e.error_number() != ENOMEM) throw;  // out of mappings: nothing to populate (reads use pread)
    }
  }

 private:
  std::shared_ptr<MappingCache> cache_;
};

// A file read through descriptors: the one kept open, or the file opened again per call when the process
// cannot keep a descriptor per file (always checked to be the same file: a replaced file is never read).
class FileReader : public ArrayReader {
 public:
  void read(std::uint64_t offset, std::uint64_t length, std::byte* dest) const override {
    File reopened;
    plain(reopened).read_exact(dest, length, header_.data_offset + offset);
  }
  void read_strided(std::uint64_t offset, std::uint64_t length, std::uint64_t stride, std::uint64_t count,
                    std::byte* dest) const override {
    File reopened;
    const File& file = plain(reopened);
    for (std::uint64_t k = 0; k < count; ++k)
      file.read_exact(dest + k * length, length, header_.data_offset + offset + k * stride);
  }

 protected:
  FileReader(const File& file, NpyHeader header) : ArrayReader(file.path(), std::move(header)) {
    origin_ = file.origin();
  }
  // A buffered descriptor for one call: the kept one if it is plain, else the file opened again (checked).
  const File& plain(File& reopened) const {
    if (file_.is_open() && !file_is_direct_) return file_;
    reopened = File::reopen(*origin_);
    return reopened;
  }
  File file_;  // kept open (keep_open), else closed
  bool file_is_direct_ = false;
};

// pread into the caller's memory; the page cache keeps what was read for the next epoch.
class PreadReader final : public FileReader {
 public:
  PreadReader(File file, NpyHeader header, bool keep_open) : FileReader(file, std::move(header)) {
    if (keep_open) file_ = std::move(file);
    queued_ = file_.is_open() && io_uring_enabled();
  }
  std::size_t queue_depth() const noexcept override { return queued_ ? kQueuedReadsPerThread : 0; }
  // The same loop as File::read_exact, its errors worded alike.
  void read_queued(ReadQueue& queue, std::uint64_t offset, std::uint64_t length, std::byte* dest) const override {
    if (!queued_) return read(offset, length, dest);
    const std::uint64_t at = header_.data_offset + offset;
    queue.add(file_.fd(), dest, at, length, length, 1, [this, at, length](const QueuedReadResult& r) {
      if (r.error != 0) throw OsError(r.error, name_, "cannot read", at + r.done);
      if (r.done < length) throw ended_early(name_, at + r.done, length, at);
    });
  }
  const std::byte* fetch_queued(ReadQueue& queue, std::uint64_t offset, std::uint64_t length) const override {
    std::byte* dest = queue.stage(length, kBufferAlignment);
    read_queued(queue, offset, length, dest);
    return dest;
  }
  const std::byte* fetch(std::uint64_t offset, std::uint64_t length) const override {
    std::byte* dest = scratch_buffer(length, kBufferAlignment);
    read(offset, length, dest);
    return dest;
  }
  bool reads_in_place() const noexcept override { return true; }
  void will_need(std::uint64_t offset, std::uint64_t length) const override {
    if (!file_.is_open()) return;
    ::posix_fadvise(file_.fd(), static_cast<off_t>(header_.data_offset + offset), static_cast<off_t>(length),
                    POSIX_FADV_WILLNEED);
  }
  // Unknown (no descriptor kept) counts as cached.
  bool probably_cached(std::uint64_t offset) const override {
    return file_.probably_cached(header_.data_offset + offset);
  }

 private:
  bool queued_ = false;  // reads may be queued (a kept descriptor, io_uring enabled at open)
};

// O_DIRECT: reads bypass the page cache (one copy from the device, nothing evicted). Buffers, offsets and
// lengths must be aligned (see direct_reader.hpp). Where the filesystem refuses it, at open or on a read,
// the reader falls back to buffered reads for good, through a plain descriptor (a buffered read on the
// O_DIRECT one would still be O_DIRECT).
class DirectReader final : public FileReader {
 public:
  DirectReader(File file, NpyHeader header, bool keep_open) : FileReader(file, std::move(header)) {
    File direct = open_direct(*origin_);
    if (direct.is_open()) {
      align_ = direct_alignment(direct);
      if (keep_open) {
        file_ = std::move(direct);
        file_is_direct_ = true;
      }
    } else {
      fell_back_.store(true);
      align_ = direct_alignment(file);
      if (keep_open) file_ = std::move(file);
    }
    queued_ = file_is_direct_ && io_uring_enabled();
  }
  std::size_t queue_depth() const noexcept override { return queued_ ? kQueuedReadsPerThread : 0; }
  // The same as fetch(): the aligned range around the bytes read into staging memory laid out so that the data
  // lands in place; where O_DIRECT is refused or stalls (read_direct_into's cases), buffered reads instead.
  const std::byte* fetch_queued(ReadQueue& queue, std::uint64_t offset, std::uint64_t length) const override {
    if (!queued_ || fell_back()) return ArrayReader::fetch_queued(queue, offset, length);
    const std::uint64_t at = header_.data_offset + offset;
    const std::uint64_t start = align_down(at, align_);
    const std::uint64_t end = align_up(at + length, align_);
    std::byte* dest = queue.stage(end - start, align_) + (at - start);
    const std::uint64_t need = at + length - start;
    queue.add(file_.fd(), dest - (at - start), start, end - start, need, align_,
              [this, dest, offset, length, at, start, need](const QueuedReadResult& r) {
                if (r.error == EINVAL || r.stalled) {
                  fell_back_.store(true);
                  read(offset, length, dest);
                  return;
                }
                if (r.error != 0)
                  throw OsError(r.error, name_, "cannot read (O_DIRECT)", start + align_down(r.done, align_));
                if (r.done < need) throw ended_early(name_, start + r.done, length, at);
              });
    return dest;
  }
  const std::byte* fetch(std::uint64_t offset, std::uint64_t length) const override {
    const std::uint64_t at = header_.data_offset + offset;
    const std::size_t lead = at % align_;
    std::byte* base = scratch_buffer(align_up(lead + length, align_) + align_, align_);
    if (read_direct(base + lead, at, length)) return base + lead;
    std::byte* dest = scratch_buffer(length, kBufferAlignment);
    read(offset, length, dest);
    return dest;
  }
  // Data at data_offset % align in a buffer aligned to align: aligned reads land it in place.
  Destination allocate() const override {
    const std::size_t lead = header_.data_offset % align_;
    auto buffer = std::make_shared<AlignedBuffer>(align_up(lead + header_.nbytes, align_) + align_, align_);
    return {buffer, buffer->data() + lead};
  }
  void fill(const Destination& dest, std::uint64_t offset, std::uint64_t length) const override {
    if (!read_direct(dest.data + offset, header_.data_offset + offset, length))
      read(offset, length, dest.data + offset);
  }
  std::size_t fill_alignment() const noexcept override { return align_; }
  std::size_t reads_in_flight_per_thread() const noexcept override { return 4; }

 private:
  // File bytes [at, at + length) to `dest` with O_DIRECT; false (and buffered reads from now on) where refused.
  bool read_direct(std::byte* dest, std::uint64_t at, std::uint64_t length) const {
    if (fell_back()) return false;
    File reopened;
    const File* file = &file_;
    if (!file_is_direct_) {
      reopened = open_direct(*origin_);
      file = &reopened;
    }
    if (file->is_open() && read_direct_into(*file, align_, dest, at, length)) return true;
    fell_back_.store(true);
    return false;
  }
  std::size_t align_ = 4096;
  bool queued_ = false;  // reads may be queued (a kept O_DIRECT descriptor, io_uring enabled at open)
};

// Buffered reads of a whole file into `dest`, as numpy reads it: its first page (the header), then the rest; a file
// of at most kOneReadUpTo bytes in one read. Measured from a cold page cache (Linux 6.18, virtio disk, read-ahead
// 128 KiB and 8 MiB alike): one read of a whole file of 256 KiB to 8 MiB took 1.3x to 1.6x as long as the two
// reads (the kernel's read-ahead ramps up from the first read); up to 64 KiB one read was faster. Returns the
// bytes read: fewer than `size` only where the file ended first.
std::uint64_t read_buffered(const File& file, std::byte* dest, std::uint64_t size) {
  constexpr std::uint64_t kOneReadUpTo = 128u << 10;
  std::uint64_t got = 0;
  if (size > kOneReadUpTo) {
    got = file.read_at(dest, kFirstReadBytes, 0);
    if (got < kFirstReadBytes) return got;
  }
  return got + file.read_at(dest + got, size - got, got);
}

// A small file in read/direct mode: the whole file, header included, into the buffer that then holds the array
// (one read with O_DIRECT; buffered, read_buffered's one or two).
std::shared_ptr<ArrayReader> read_whole(const File& file, ReadMode mode, std::size_t max_header_size,
                                        BufferPool* buffers) {
  const std::string& path = file.path();
  const std::uint64_t size = file.size();
  File direct_file;
  bool fell_back = false;
  std::size_t align = 1;
  if (mode == ReadMode::kDirect) {
    direct_file = open_direct(file.origin());
    fell_back = !direct_file.is_open();
    if (direct_file.is_open()) align = direct_alignment(direct_file);
  }
  const std::size_t buffer_align = std::max<std::size_t>(align, kBufferAlignment);
  const std::size_t buffer_size = align_up(std::max<std::uint64_t>(size, 1), buffer_align) + buffer_align;
  std::shared_ptr<AlignedBuffer> buffer = buffers != nullptr
                                              ? buffers->acquire(buffer_size, buffer_align)
                                              : std::make_shared<AlignedBuffer>(buffer_size, buffer_align);
  std::uint64_t got = size;
  if (!direct_file.is_open() || !read_direct_into(direct_file, align, buffer->data(), 0, size)) {
    fell_back = direct_file.is_open() || fell_back;
    got = read_buffered(file, buffer->data(), size);
    if (got < size) {
      throw NpyFormatError(
          path, got,
          "file ended while reading its " + std::to_string(size) + " bytes (truncated, or shrunk while being read)");
    }
  }
  file.check_unchanged();  // written while it was read: the bytes may mix two versions
  NpyHeader header;
  try {
    header = parse_npy_header(std::span<const std::byte>(buffer->data(), got), max_header_size);
  } catch (const NpyFormatError& e) {
    throw e.with_path(path);
  }
  check_holds_data(header, path, got);
  std::byte* data = buffer->data() + header.data_offset;
  if (header.data_offset % kBufferAlignment != 0) {
    // Data at an offset no numpy writer uses (they align it to 64, old ones to 16): copy it to an aligned
    // buffer so that owned arrays are always 64-byte aligned.
    auto aligned = std::make_shared<AlignedBuffer>(header.nbytes);
    std::memcpy(aligned->data(), data, header.nbytes);
    buffer = aligned;
    data = aligned->data();
  }
  return std::make_shared<MemoryReader>(path, std::move(header), buffer, data, /*writable=*/true, fell_back,
                                        file.origin());
}

}  // namespace

NpyHeader read_header(const File& file, std::size_t max_header_size) {
  // Most headers fit in the first 4 KiB; longer ones (up to the cap) take a second read.
  std::vector<std::byte> head(std::min(file.size(), kFirstReadBytes));
  std::size_t got = file.read_at(head.data(), head.size(), 0);
  head.resize(got);
  NpyHeader header;
  try {
    std::uint64_t need = npy_header_end(
        std::span<const std::byte>(head.data(), std::min<std::size_t>(got, kMaxPreambleSize)), max_header_size);
    if (need > head.size() && need <= file.size()) {
      head.resize(need);
      head.resize(file.read_at(head.data(), need, 0));
    }
    header = parse_npy_header(head, max_header_size);
  } catch (const NpyFormatError& e) {
    throw e.with_path(file.path());
  }
  check_holds_data(header, file.path(), file.size());
  return header;
}

namespace {

std::shared_ptr<ArrayReader> open_reader(File file, const ReaderOptions& options) {
  if (options.mode != ReadMode::kMmap && file.size() <= options.read_whole_up_to) {
    return read_whole(file, options.mode, options.max_header_size, options.whole_file_buffers.get());
  }
  NpyHeader header = read_header(file, options.max_header_size);
  switch (options.mode) {
    case ReadMode::kMmap:
      if (options.mappings) return std::make_shared<OnDemandMappedReader>(file, std::move(header), options.mappings);
      return std::make_shared<MappedReader>(file, std::move(header));
    case ReadMode::kRead:
      return std::make_shared<PreadReader>(std::move(file), std::move(header), options.keep_open);
    case ReadMode::kDirect:
      return std::make_shared<DirectReader>(std::move(file), std::move(header), options.keep_open);
  }
  throw InvalidArgument("unknown read mode");
}

}  // namespace

std::shared_ptr<ArrayReader> ArrayReader::open(const std::string& path, const ReaderOptions& options) {
  return open_reader(File::open(path), options);
}

std::shared_ptr<ArrayReader> ArrayReader::reopen(const FileOrigin& origin, const ReaderOptions& options) {
  return open_reader(File::reopen(origin), options);
}

std::shared_ptr<ArrayReader> ArrayReader::in_memory(std::string name, NpyHeader header,
                                                    std::shared_ptr<const void> owner, const std::byte* data,
                                                    bool writable, std::optional<FileOrigin> origin) {
  return std::make_shared<MemoryReader>(std::move(name), std::move(header), std::move(owner), data, writable, false,
                                        std::move(origin));
}

// ---- defaults, for readers whose data is in view() ----------------------------------------------

void ArrayReader::read(std::uint64_t offset, std::uint64_t length, std::byte* dest) const {
  if (length == 0) return;
  // The view may be a mapping whose file shrank since: copy guarded (fault_guard.hpp).
  const std::byte* src = view_ + offset;
  if (!guarded([&] { std::memcpy(dest, src, length); }))
    throw shrunk_mapping_error(name_, header_.data_offset + offset, length);
}

void ArrayReader::read_strided(std::uint64_t offset, std::uint64_t length, std::uint64_t stride, std::uint64_t count,
                               std::byte* dest) const {
  for (std::uint64_t k = 0; k < count; ++k) read(offset + k * stride, length, dest + k * length);
}

const std::byte* ArrayReader::fetch(std::uint64_t offset, std::uint64_t) const { return view_ + offset; }

void ArrayReader::read_queued(ReadQueue&, std::uint64_t offset, std::uint64_t length, std::byte* dest) const {
  read(offset, length, dest);
}

const std::byte* ArrayReader::fetch_queued(ReadQueue& queue, std::uint64_t offset, std::uint64_t length) const {
  std::byte* dest = queue.stage(length, kBufferAlignment);
  read(offset, length, dest);
  return dest;
}

ArrayReader::Destination ArrayReader::allocate() const {
  auto buffer = std::make_shared<AlignedBuffer>(header_.nbytes);
  return {buffer, buffer->data()};
}

void ArrayReader::fill(const Destination& dest, std::uint64_t offset, std::uint64_t length) const {
  read(offset, length, dest.data + offset);
}

void ArrayReader::populate(std::uint64_t, std::uint64_t) const {}

void ArrayReader::will_need(std::uint64_t, std::uint64_t) const {}

std::uint64_t ArrayReader::populate_cached(std::uint64_t, std::uint64_t) const noexcept { return 0; }

bool ArrayReader::probably_cached(std::uint64_t) const { return true; }

}  // namespace npyfeed
