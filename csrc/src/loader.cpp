#include "npyfeed/loader.hpp"

#include <cerrno>
#include <cstring>

#include "npyfeed/aligned_buffer.hpp"
#include "npyfeed/direct_reader.hpp"
#include "npyfeed/errors.hpp"
#include "npyfeed/mapped_file.hpp"

namespace npyfeed {

ReadMode parse_read_mode(const std::string& name) {
  if (name == "mmap") return ReadMode::kMmap;
  if (name == "read") return ReadMode::kRead;
  if (name == "direct") return ReadMode::kDirect;
  throw InvalidArgument("unknown read mode '" + name + "' (expected 'mmap', 'read', 'direct' or 'auto')");
}

void check_holds_data(const NpyHeader& header, const std::string& path, std::uint64_t size);

NpyHeader read_header(const File& file, std::size_t max_header_size) {
  // Most headers fit in the first 4 KiB; longer ones (up to the cap) take a second read.
  std::vector<std::byte> head(std::min<std::uint64_t>(file.size(), 4096));
  std::size_t got = file.read_at(head.data(), head.size(), 0);
  head.resize(got);
  NpyHeader header;
  try {
    std::uint64_t need = npy_header_end(std::span<const std::byte>(head.data(), std::min<std::size_t>(got, kMaxPreambleSize)),
                                        max_header_size);
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

void check_holds_data(const NpyHeader& header, const std::string& path, std::uint64_t size) {
  if (size < header.data_offset + header.nbytes) {
    throw NpyFormatError(path, size,
                         "file is truncated: the header promises " + std::to_string(header.nbytes) +
                             " bytes of data at offset " + std::to_string(header.data_offset) + ", the file has only " +
                             std::to_string(size - std::min(size, header.data_offset)));
  }
}

// Where a file's data goes, shared by its chunks.
struct ManyLoad::FileState {
  FileIdentity identity;
  std::size_t align = 1;                 // direct mode: O_DIRECT alignment
  std::shared_ptr<AlignedBuffer> buffer; // read/direct
  std::shared_ptr<MappedFile> mapping;   // mmap
  std::byte* dest = nullptr;             // where the byte at data_offset goes
  std::atomic<bool> direct_refused{false};
};

ManyLoad::ManyLoad(std::vector<std::string> paths, LoadOptions options)
    : paths_(std::move(paths)),
      options_(options),
      results_(paths_.size()),
      states_(paths_.size()),
      bytes_done_(std::make_shared<std::atomic<std::uint64_t>>(0)) {
  if (options_.chunk_bytes < (1u << 20)) options_.chunk_bytes = 1u << 20;
}

std::shared_ptr<Job> ManyLoad::start_headers(ThreadPool& pool) {
  return pool.start(paths_.size(), options_.threads, [this](std::size_t i) { load_header_and_small(i); });
}

std::shared_ptr<Job> ManyLoad::start_chunks(ThreadPool& pool) {
  bytes_total_ = 0;
  for (auto& r : results_) bytes_total_ += r.header.nbytes;
  return pool.start(chunks_.size(), options_.threads, [this](std::size_t i) { load_chunk(chunks_[i]); });
}

namespace {

// Reads file bytes [begin, end) of the data to their place, by the mode's method.
void read_range(const File& file, ReadMode mode, std::size_t align, std::byte* dest_of_data_offset,
                std::uint64_t data_offset, std::uint64_t begin, std::uint64_t end, std::atomic<bool>& refused) {
  std::byte* dest = dest_of_data_offset + (begin - data_offset);
  if (mode == ReadMode::kDirect && !refused.load()) {
    if (read_direct_into(file, align, dest, begin, end - begin)) return;
    refused.store(true);
  }
  if (mode == ReadMode::kDirect) {
    // Buffered fallback on the same descriptor would still be O_DIRECT: reopen plainly.
    File plain = File::open(file.path());
    if (!(plain.identity() == file.identity())) throw OsError(ESTALE, file.path(), "file replaced while loading");
    plain.read_exact(dest, end - begin, begin);
    return;
  }
  file.read_exact(dest, end - begin, begin);
}

// MappedFile::populate does not know the path: name the file in its error.
void populate(const MappedFile& mapping, const std::string& path, std::uint64_t offset, std::uint64_t length) {
  try {
    mapping.populate(offset, length);
  } catch (const NpyFormatError& e) {
    throw e.with_path(path);
  }
}

File open_for_mode(const std::string& path, ReadMode mode, std::atomic<bool>& refused) {
  if (mode == ReadMode::kDirect && !refused.load()) {
    try {
      return File::open(path, /*direct=*/true);
    } catch (const OsError& e) {
      if (e.error_number() != EINVAL) throw;
      refused.store(true);  // the filesystem (tmpfs, some FUSE) does not do O_DIRECT
    }
  }
  return File::open(path);
}

}  // namespace

// Small files in read/direct modes: one read of the whole file, header included, into the buffer that
// becomes the array (a separate header read would cost a second IO per file when the cache is cold).
// The data starts at data_offset in the buffer, which numpy's writers keep 64-byte aligned.
bool ManyLoad::load_whole_small_file(std::size_t i, File& file, FileState& state) {
  const std::string& path = paths_[i];
  const bool direct = options_.mode == ReadMode::kDirect;
  if (options_.mode == ReadMode::kMmap || file.size() > 2 * options_.chunk_bytes) return false;
  File direct_file;
  const File* source = &file;
  if (direct) {
    direct_file = open_for_mode(path, ReadMode::kDirect, state.direct_refused);
    if (!(direct_file.identity() == file.identity())) throw OsError(ESTALE, path, "file replaced while loading");
    if (!state.direct_refused.load()) {
      state.align = direct_alignment(direct_file);
      source = &direct_file;
    }
  }
  const std::size_t align = std::max<std::size_t>(state.align, kBufferAlignment);
  auto buffer = std::make_shared<AlignedBuffer>(align_up(std::max<std::uint64_t>(file.size(), 1), align) + align, align);
  std::uint64_t got;
  if (source == &direct_file && read_direct_into(direct_file, state.align, buffer->data(), 0, file.size())) {
    got = file.size();
  } else {
    if (source == &direct_file) state.direct_refused.store(true);
    got = file.read_at(buffer->data(), file.size(), 0);
    if (got < file.size()) {
      throw NpyFormatError(path, got, "file ended while reading its " + std::to_string(file.size()) +
                                          " bytes (truncated, or shrunk while being read)");
    }
  }
  NpyHeader header;
  try {
    header = parse_npy_header(std::span<const std::byte>(buffer->data(), got), options_.max_header_size);
  } catch (const NpyFormatError& e) {
    throw e.with_path(path);
  }
  check_holds_data(header, path, got);
  state.dest = buffer->data() + header.data_offset;
  if (header.data_offset % kBufferAlignment != 0) {
    // Data at an offset no numpy writer uses (they align it to 64, old ones to 16): copy it to an aligned
    // buffer so that "read"/"direct" arrays are always 64-byte aligned.
    auto aligned = std::make_shared<AlignedBuffer>(header.nbytes);
    std::memcpy(aligned->data(), state.dest, header.nbytes);
    buffer = aligned;
    state.dest = aligned->data();
  }
  state.buffer = buffer;
  LoadedArray& result = results_[i];
  result.path = path;
  result.owner = buffer;
  result.data = state.dest;
  result.writable = true;
  bytes_done_->fetch_add(header.nbytes);
  result.header = std::move(header);
  return true;
}

void ManyLoad::load_header_and_small(std::size_t i) {
  const std::string& path = paths_[i];
  File file = File::open(path);
  {
    auto state = std::make_shared<FileState>();
    state->identity = file.identity();
    if (load_whole_small_file(i, file, *state)) {
      states_[i] = state;
      return;
    }
  }
  NpyHeader header = read_header(file, options_.max_header_size);
  auto state = std::make_shared<FileState>();
  state->identity = file.identity();
  LoadedArray& result = results_[i];
  result.path = path;
  const std::uint64_t begin = header.data_offset;
  const std::uint64_t end = header.data_offset + header.nbytes;
  const bool small = header.nbytes <= 2 * options_.chunk_bytes || options_.threads <= 1;

  if (options_.mode == ReadMode::kMmap) {
    state->mapping = MappedFile::map(file);
    result.owner = state->mapping;
    result.data = state->mapping->data() == nullptr ? nullptr : state->mapping->data() + begin;
    result.writable = false;
    if (options_.populate) {
      if (small) {
        populate(*state->mapping, path, begin, header.nbytes);
        bytes_done_->fetch_add(header.nbytes);
      } else {
        std::lock_guard lock(chunks_mutex_);
        for (std::uint64_t at = begin; at < end; at += options_.chunk_bytes) {
          chunks_.push_back({i, at, std::min(end, at + options_.chunk_bytes)});
        }
      }
    }
  } else {
    File data_file = options_.mode == ReadMode::kDirect ? open_for_mode(path, ReadMode::kDirect, state->direct_refused)
                                                        : std::move(file);
    if (options_.mode == ReadMode::kDirect && !(data_file.identity() == state->identity)) {
      throw OsError(ESTALE, path, "file replaced while loading");
    }
    std::size_t lead = 0;
    std::size_t alloc = header.nbytes;
    if (options_.mode == ReadMode::kDirect) {
      state->align = direct_alignment(data_file);
      lead = begin % state->align;
      alloc = align_up(lead + header.nbytes, state->align) + state->align;
    }
    state->buffer = std::make_shared<AlignedBuffer>(alloc, options_.mode == ReadMode::kDirect ? state->align : kBufferAlignment);
    state->dest = state->buffer->data() + lead;
    result.owner = state->buffer;
    result.data = state->dest;
    result.writable = true;
    if (small) {
      read_range(data_file, options_.mode, state->align, state->dest, begin, begin, end, state->direct_refused);
      bytes_done_->fetch_add(header.nbytes);
    } else {
      // Chunk boundaries on multiples of the alignment so that every O_DIRECT chunk is aligned.
      std::uint64_t step = align_up(options_.chunk_bytes, std::max<std::size_t>(state->align, 4096));
      std::uint64_t at = begin;
      std::lock_guard lock(chunks_mutex_);
      while (at < end) {
        std::uint64_t next = std::min(end, align_down(at, step) + step);
        chunks_.push_back({i, at, next});
        at = next;
      }
    }
  }
  result.header = std::move(header);
  states_[i] = state;
}

std::vector<LoadedArray>& ManyLoad::results() {
  for (std::size_t i = 0; i < results_.size(); ++i) {
    if (states_[i]) results_[i].direct_fallback = states_[i]->direct_refused.load();
  }
  return results_;
}

void ManyLoad::load_chunk(const Chunk& chunk) {
  FileState& state = *states_[chunk.file];
  const LoadedArray& result = results_[chunk.file];
  if (options_.mode == ReadMode::kMmap) {
    populate(*state.mapping, result.path, chunk.begin, chunk.end - chunk.begin);
  } else {
    File file = open_for_mode(result.path, options_.mode, state.direct_refused);
    if (!(file.identity() == state.identity)) throw OsError(ESTALE, result.path, "file replaced while loading");
    read_range(file, options_.mode, state.align, state.dest, result.header.data_offset, chunk.begin, chunk.end,
               state.direct_refused);
  }
  bytes_done_->fetch_add(chunk.end - chunk.begin);
}

}  // namespace npyfeed
