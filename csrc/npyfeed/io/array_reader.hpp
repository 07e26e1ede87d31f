// How one array's bytes are read. Every read-mode policy lives here and only here: which descriptor
// (plain or O_DIRECT) serves a read, the O_DIRECT alignment, the fallback to buffered reads where the
// filesystem refuses O_DIRECT, reopening a file (and refusing one replaced since it was opened), the
// mapping, small files read whole. Callers (the whole-file loader, the window gather) ask a reader to
// read; they never branch on the mode.
//
// One subclass per way of reading (in array_reader.cpp): memory (owned elsewhere, or a file read whole),
// a shared mapping, pread, O_DIRECT. A new way (a bounded-mapping cache, a streaming reader, a member of a
// `.npz`) is one new subclass and one line in `ArrayReader::open`.
//
// Queued reads (read_queue.hpp): the pread and O_DIRECT readers that keep their descriptor can queue their
// reads, so that one thread keeps many in flight through an io_uring; whether they do is decided at open
// (io_uring_enabled(): liburing in the build, the kernel's consent, NPYFEED_IO_URING not "0"), and
// queue_depth() says so. Otherwise reads go on exactly as before, one blocking call per read.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "npyfeed/common/aligned_buffer.hpp"
#include "npyfeed/format/npy_header.hpp"
#include "npyfeed/io/file.hpp"
#include "npyfeed/io/mapping_cache.hpp"

namespace npyfeed {

class ReadQueue;

enum class ReadMode {
  kMmap,    // zero-copy view of a shared read-only mapping
  kRead,    // pread into owned memory
  kDirect,  // O_DIRECT reads into owned memory (buffered reads where the filesystem refuses O_DIRECT)
};

/// Parses "mmap" / "read" / "direct". Throws InvalidArgument.
ReadMode parse_read_mode(const std::string& name);

/// Reads the header of one file and checks the file holds the data it announces.
/// Throws NpyFormatError (naming the file), OsError.
NpyHeader read_header(const File& file, std::size_t max_header_size);

struct ReaderOptions {
  ReadMode mode = ReadMode::kRead;
  std::size_t max_header_size = kDefaultMaxHeaderSize;
  /// Keep the descriptor open between reads; else every read opens the file again (checking it is the
  /// same file). Mappings never keep one.
  bool keep_open = true;
  /// read/direct: a file of at most this many bytes (header included) is read whole at open, with one
  /// read, and served from memory afterwards.
  std::uint64_t read_whole_up_to = 0;
  /// read/direct, a file read whole: its buffer comes from this pool (and goes back to it once the array is
  /// let go) instead of fresh memory. Null: fresh memory.
  std::shared_ptr<BufferPool> whole_file_buffers;
  /// mmap: map the file on demand through this bounded cache instead of once at open (more files than
  /// the process may map at once).
  std::shared_ptr<MappingCache> mappings;
};

/// One opened array: its header and its data bytes, addressed from the first data byte (offset 0).
/// Reads are thread-safe. Every error names the file.
class ArrayReader {
 public:
  /// Opens `path` and reads its header. Throws OsError (ENOENT, EACCES, ...), NpyFormatError.
  static std::shared_ptr<ArrayReader> open(const std::string& path, const ReaderOptions& options);
  /// Opens `origin.path` again, checked to be the file first opened (File::reopen: OsError ESTALE naming what
  /// changed, ENOENT for a file deleted since), then as open().
  static std::shared_ptr<ArrayReader> reopen(const FileOrigin& origin, const ReaderOptions& options);
  /// An array in memory: `data` holds header.nbytes bytes and stays valid while this reader (or anyone
  /// holding view_owner()) lives. `name` is used in messages; `origin`, the file it was read from, if any.
  static std::shared_ptr<ArrayReader> in_memory(std::string name, NpyHeader header, std::shared_ptr<const void> owner,
                                                const std::byte* data, bool writable,
                                                std::optional<FileOrigin> origin = std::nullopt);

  virtual ~ArrayReader() = default;
  ArrayReader(const ArrayReader&) = delete;
  ArrayReader& operator=(const ArrayReader&) = delete;

  const std::string& name() const noexcept { return name_; }
  const NpyHeader& header() const noexcept { return header_; }
  /// The file this array's bytes come from (for a `.npz` member, the archive) as it was when opened; none for
  /// arrays handed in. A source checks it at each epoch (check_unchanged), and every read that opens the file
  /// again is checked against it (File::reopen).
  const std::optional<FileOrigin>& origin() const noexcept { return origin_; }

  /// The data in memory (a mapping or a buffer), or null when reads go to the file.
  const std::byte* view() const noexcept { return view_; }
  /// Keeps view() valid: hand it to whoever keeps the pointer.
  const std::shared_ptr<const void>& view_owner() const noexcept { return owner_; }
  /// Whether view() may be written (an owned buffer; a mapping is read-only).
  bool view_writable() const noexcept { return writable_; }

  /// Copies data bytes [offset, offset + length) to `dest` (any alignment) with buffered reads.
  /// Throws OsError, NpyFormatError (the file ended early).
  virtual void read(std::uint64_t offset, std::uint64_t length, std::byte* dest) const;
  /// `count` pieces of `length` bytes at offset, offset + stride, ... copied one after another to `dest`
  /// (the columns of a Fortran-order array), opening the file at most once.
  virtual void read_strided(std::uint64_t offset, std::uint64_t length, std::uint64_t stride, std::uint64_t count,
                            std::byte* dest) const;
  /// Data bytes [offset, offset + length): inside view(), or read into this thread's scratch buffer, which
  /// the next fetch on the same thread reuses.
  virtual const std::byte* fetch(std::uint64_t offset, std::uint64_t length) const;
  /// True where read() lands the bytes in the destination with no staging copy (pread): the gather then
  /// reads a window that needs no conversion straight into the batch.
  virtual bool reads_in_place() const noexcept { return false; }

  /// Owned memory for all the data, laid out so that fill() reads straight into it (64-byte aligned at
  /// least; for O_DIRECT, placed where an aligned read lands the data). Throws std::bad_alloc.
  struct Destination {
    std::shared_ptr<AlignedBuffer> buffer;
    std::byte* data = nullptr;  // where data byte 0 goes
  };
  virtual Destination allocate() const;
  /// Reads data bytes [offset, offset + length) to `dest.data + offset` (dest from allocate()).
  /// Ranges filled concurrently must not share a block of fill_alignment() bytes.
  virtual void fill(const Destination& dest, std::uint64_t offset, std::uint64_t length) const;
  /// Block size that fill() ranges should be split on (file offsets): the O_DIRECT alignment, else 1.
  virtual std::size_t fill_alignment() const noexcept { return 1; }

  /// Faults data bytes [offset, offset + length) of a mapping in now. A no-op for other readers.
  /// Throws NpyFormatError where the file shrank below the range.
  virtual void populate(std::uint64_t offset, std::uint64_t length) const;
  /// Maps the pages of data bytes [offset, offset + length) that are in the page cache already into this
  /// process (a mapping; see MappedFile::populate_cached): reads nothing, never throws. Returns the bytes
  /// mapped; 0 for other readers.
  virtual std::uint64_t populate_cached(std::uint64_t offset, std::uint64_t length) const noexcept;
  /// Asks the kernel to read data bytes [offset, offset + length) ahead, in the background. Advisory.
  virtual void will_need(std::uint64_t offset, std::uint64_t length) const;
  /// Whether data byte `offset` is in the page cache; true when unknown or when reads bypass the cache.
  virtual bool probably_cached(std::uint64_t offset) const;
  /// Reads in flight that one worker thread should keep: O_DIRECT waits on the device, so more workers
  /// keep its queue deep (the page-cache readers get that depth from will_need() instead).
  virtual std::size_t reads_in_flight_per_thread() const noexcept { return 1; }
  /// Reads that one thread should keep in flight through a ReadQueue (queue_depth() reads at once from one
  /// worker instead of more workers each blocking in a read); 0 when this reader does not queue reads.
  virtual std::size_t queue_depth() const noexcept { return 0; }
  /// Queues read(offset, length, dest) on `queue`: the bytes are in `dest` once queue.wait() returned, which
  /// throws what read() throws (naming the file and offset). Readers that do not queue reads read at once.
  virtual void read_queued(ReadQueue& queue, std::uint64_t offset, std::uint64_t length, std::byte* dest) const;
  /// Queues fetch(offset, length): returns where data bytes [offset, offset + length) are once queue.wait()
  /// returned (the queue's staging memory, valid until its clear()).
  virtual const std::byte* fetch_queued(ReadQueue& queue, std::uint64_t offset, std::uint64_t length) const;
  /// True once the filesystem refused O_DIRECT and buffered reads were used instead.
  bool fell_back() const noexcept { return fell_back_.load(std::memory_order_relaxed); }

 protected:
  ArrayReader(std::string name, NpyHeader header) : name_(std::move(name)), header_(std::move(header)) {}
  std::string name_;
  NpyHeader header_;
  std::optional<FileOrigin> origin_;
  const std::byte* view_ = nullptr;
  std::shared_ptr<const void> owner_;
  bool writable_ = false;
  mutable std::atomic<bool> fell_back_{false};
};

}  // namespace npyfeed
