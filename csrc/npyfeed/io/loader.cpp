#include "npyfeed/io/loader.hpp"

#include <algorithm>

#include "npyfeed/common/errors.hpp"
#include "npyfeed/io/direct_reader.hpp"
#include "npyfeed/io/file.hpp"

namespace npyfeed {

ManyLoad::ManyLoad(std::vector<std::string> paths, LoadOptions options)
    : paths_(std::move(paths)),
      options_(options),
      results_(paths_.size()),
      states_(paths_.size()),
      bytes_done_(std::make_shared<std::atomic<std::uint64_t>>(0)) {
  if (options_.threads < 1) throw InvalidArgument("threads must be at least 1");
  if (options_.chunk_bytes < (1u << 20)) options_.chunk_bytes = 1u << 20;
}

// Every worker holds at most two descriptors at once (O_DIRECT and buffered): stay within the budget.
std::size_t ManyLoad::workers() const { return std::clamp<std::size_t>(descriptor_budget() / 2, 1, options_.threads); }

std::shared_ptr<Job> ManyLoad::start_headers(ThreadPool& pool) {
  return pool.start(paths_.size(), workers(), [this](std::size_t i) { load_header_and_small(i); });
}

std::shared_ptr<Job> ManyLoad::start_chunks(ThreadPool& pool) {
  bytes_total_ = 0;
  for (auto& r : results_) bytes_total_ += r.header.nbytes;
  return pool.start(chunks_.size(), workers(), [this](std::size_t i) { load_chunk(chunks_[i]); });
}

void ManyLoad::load_header_and_small(std::size_t i) {
  ReaderOptions reader_options;
  reader_options.mode = options_.mode;
  reader_options.max_header_size = options_.max_header_size;
  // Thousands of files may be loaded at once: no descriptor is kept between the phases (each chunk opens
  // the file again, which the reader checks is the same file).
  reader_options.keep_open = false;
  reader_options.read_whole_up_to = 2 * options_.chunk_bytes;
  FileState& state = states_[i];
  state.reader = ArrayReader::open(paths_[i], reader_options);
  const ArrayReader& reader = *state.reader;
  const NpyHeader& header = reader.header();
  LoadedArray& result = results_[i];
  result.path = paths_[i];
  result.header = header;
  if (reader.view() != nullptr) {
    // A mapping, or a small file already read whole: the array is the view.
    result.owner = reader.view_owner();
    result.data = reader.view();
    result.writable = reader.view_writable();
    if (!options_.populate) {
      bytes_done_->fetch_add(header.nbytes);
      return;
    }
  } else {
    state.dest = reader.allocate();
    result.owner = state.dest.buffer;
    result.data = state.dest.data;
    result.writable = true;
  }
  const bool whole = header.nbytes <= 2 * options_.chunk_bytes || options_.threads <= 1;
  if (whole) {
    load_chunk({i, 0, header.nbytes});
    return;
  }
  // Chunk boundaries on multiples of the reader's block (file offsets) so that every O_DIRECT chunk is aligned.
  const std::uint64_t step = align_up(options_.chunk_bytes, std::max<std::size_t>(reader.fill_alignment(), 4096));
  const std::uint64_t begin = header.data_offset;
  const std::uint64_t end = header.data_offset + header.nbytes;
  std::lock_guard lock(chunks_mutex_);
  for (std::uint64_t at = begin; at < end;) {
    const std::uint64_t next = std::min(end, align_down(at, step) + step);
    chunks_.push_back({i, at - begin, next - begin});
    at = next;
  }
}

void ManyLoad::load_chunk(const Chunk& chunk) {
  const FileState& state = states_[chunk.file];
  if (state.dest.data != nullptr) {
    state.reader->fill(state.dest, chunk.begin, chunk.end - chunk.begin);
  } else {
    state.reader->populate(chunk.begin, chunk.end - chunk.begin);
  }
  bytes_done_->fetch_add(chunk.end - chunk.begin);
}

std::vector<LoadedArray>& ManyLoad::results() {
  for (std::size_t i = 0; i < results_.size(); ++i) {
    if (states_[i].reader) results_[i].direct_fallback = states_[i].reader->fell_back();
  }
  return results_;
}

NpzLoad::NpzLoad(std::vector<std::string> paths, LoadOptions options)
    : paths_(std::move(paths)), options_(options), archives_(paths_.size()) {
  if (options_.threads < 1) throw InvalidArgument("threads must be at least 1");
}

std::shared_ptr<Job> NpzLoad::start_directories(ThreadPool& pool) {
  return pool.start(paths_.size(), options_.threads,
                    [this](std::size_t i) { archives_[i] = NpzArchive::open(paths_[i]); });
}

std::shared_ptr<Job> NpzLoad::start_members(ThreadPool& pool) {
  members_.clear();
  for (std::size_t a = 0; a < archives_.size(); ++a) {
    for (std::size_t k = 0; k < archives_[a]->members().size(); ++k) {
      Member m;
      m.archive = a;
      m.index = k;
      m.entry = archives_[a]->members()[k];
      members_.push_back(std::move(m));
    }
  }
  return pool.start(members_.size(), options_.threads, [this](std::size_t i) { load_member(i); });
}

void NpzLoad::load_member(std::size_t i) {
  Member& m = members_[i];
  const NpzArchive& archive = *archives_[m.archive];
  bool view = false;
  std::shared_ptr<ArrayReader> reader = archive.open_member(m.index, options_.mode, options_.max_header_size, &view);
  if (view && options_.populate) {
    const std::uint64_t at = static_cast<std::uint64_t>(reader->view() - archive.mapping()->data());
    try {
      archive.mapping()->populate(at, reader->header().nbytes);
    } catch (const NpyFormatError& e) {
      throw NpyFormatError(archive.path(), e.offset(), member_label(m.entry) + ": " + e.reason());
    }
  }
  m.array.path = archive.path();
  m.array.header = reader->header();
  m.array.owner = reader->view_owner();
  m.array.data = reader->view();
  m.array.writable = reader->view_writable();
}

}  // namespace npyfeed
