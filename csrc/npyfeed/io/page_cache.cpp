#include "npyfeed/io/page_cache.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>

#include "npyfeed/common/aligned_buffer.hpp"
#include "npyfeed/common/errors.hpp"
#include "npyfeed/io/file.hpp"
#include "npyfeed/io/mapped_file.hpp"

namespace npyfeed {

namespace {

// mincore works on a mapping: map the range in windows of at most 1 GiB (the residency vector of one window is
// 256 KiB with 4 KiB pages) and count the resident pages, clipped to [offset, end).
constexpr std::uint64_t kWindowBytes = std::uint64_t{1} << 30;

}  // namespace

std::uint64_t resident_bytes(int fd, const std::string& path, std::uint64_t file_size, std::uint64_t offset,
                             std::uint64_t length) {
  const std::uint64_t end = std::min(file_size, offset + length);
  if (offset >= end) return 0;
  const std::uint64_t page = page_size();
  std::vector<unsigned char> resident;
  std::uint64_t total = 0;
  for (std::uint64_t start = offset / page * page; start < end; start += kWindowBytes) {
    const std::uint64_t span = std::min(kWindowBytes, end - start);
    void* p = ::mmap(nullptr, span, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(start));
    if (p == MAP_FAILED) throw OsError(errno, path, "cannot map");
    resident.assign((span + page - 1) / page, 0);
    const int rc = ::mincore(p, span, resident.data());
    const int error = errno;
    ::munmap(p, span);
    if (rc != 0) throw OsError(error, path, "cannot query the page cache (mincore)");
    for (std::size_t k = 0; k < resident.size(); ++k) {
      if ((resident[k] & 1) == 0) continue;
      const std::uint64_t page_start = std::max(start + k * page, offset);
      const std::uint64_t page_end = std::min(start + (k + 1) * page, end);
      if (page_end > page_start) total += page_end - page_start;
    }
  }
  return total;
}

std::uint64_t read_into_page_cache(const File& file, std::uint64_t offset, std::uint64_t length) {
  // Fault the range in through a mapping (populate_read): the kernel reads into the page cache and nothing is
  // copied to user space. Shrunk: the file shrank meanwhile (no SIGBUS, unlike touching).
  const std::uint64_t page = page_size();
  const std::uint64_t start = offset / page * page;
  const std::uint64_t span = offset + length - start;
  void* p = ::mmap(nullptr, span, PROT_READ, MAP_SHARED, file.fd(), static_cast<off_t>(start));
  if (p == MAP_FAILED) throw OsError(errno, file.path(), "cannot map");
  const Populated populated = populate_read(static_cast<const std::byte*>(p), span);
  ::munmap(p, span);
  if (populated == Populated::kDone) return length;
  if (populated == Populated::kShrunk) return 0;
  if (populated == Populated::kIoError) throw OsError(EIO, file.path(), "cannot read");
  // Older kernels (or any other refusal): read through the cache into a buffer that is thrown away.
  AlignedBuffer scratch(static_cast<std::size_t>(std::min<std::uint64_t>(length, std::uint64_t{1} << 20)));
  std::uint64_t done = 0;
  while (done < length) {
    const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(scratch.size(), length - done));
    const std::size_t got = file.read_at(scratch.data(), want, offset + done);
    done += got;
    if (got < want) break;  // end of file
  }
  return done;
}

CacheWarm::CacheWarm(std::vector<std::string> paths, std::uint64_t chunk_bytes)
    : paths_(std::move(paths)),
      chunk_bytes_(std::max<std::uint64_t>(chunk_bytes, page_size())),
      files_(paths_.size()) {}

std::shared_ptr<Job> CacheWarm::start_measure(ThreadPool& pool, std::size_t threads, bool after) {
  return pool.start(paths_.size(), threads, [this, after](std::size_t i) {
    File file = File::open(paths_[i]);
    FileState& state = files_[i];
    if (!after) state.size = file.size();
    // A file that changed size since the first measure is measured as it is now, within its first size.
    const std::uint64_t resident = resident_bytes(file.fd(), file.path(), file.size(), 0, state.size);
    (after ? state.resident_after : state.resident_before) = resident;
  });
}

std::shared_ptr<Job> CacheWarm::start_reads(ThreadPool& pool, std::size_t threads) {
  pieces_.clear();
  for (std::size_t i = 0; i < files_.size(); ++i) {
    if (files_[i].resident_before == files_[i].size) continue;  // nothing to read
    for (std::uint64_t at = 0; at < files_[i].size; at += chunk_bytes_) {
      pieces_.push_back({i, at, std::min(chunk_bytes_, files_[i].size - at)});
    }
  }
  read_per_piece_.assign(pieces_.size(), 0);
  done_.store(0);
  return pool.start(pieces_.size(), threads, [this](std::size_t k) {
    const Piece& piece = pieces_[k];
    File file = File::open(paths_[piece.file]);
    // Only bytes that exist are read: a file that shrank since it was measured just yields less.
    const std::uint64_t length = file.size() > piece.offset ? std::min(piece.length, file.size() - piece.offset) : 0;
    if (length > 0 && resident_bytes(file.fd(), file.path(), file.size(), piece.offset, length) < length) {
      read_per_piece_[k] = read_into_page_cache(file, piece.offset, length);
    }
    done_.fetch_add(piece.length, std::memory_order_relaxed);
  });
}

std::uint64_t CacheWarm::bytes_done() const { return done_.load(std::memory_order_relaxed); }

std::uint64_t CacheWarm::bytes_read() const {
  std::uint64_t total = 0;
  for (std::uint64_t n : read_per_piece_) total += n;
  return total;
}

std::uint64_t CacheWarm::bytes_total() const {
  std::uint64_t total = 0;
  for (const Piece& piece : pieces_) total += piece.length;
  return total;
}

}  // namespace npyfeed
