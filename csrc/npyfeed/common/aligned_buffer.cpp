#include "npyfeed/common/aligned_buffer.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <iterator>
#include <new>
#include <stdexcept>
#include <utility>

namespace npyfeed {

namespace {

// From this size on, a buffer is its own anonymous mapping, given back to the system when freed. Through
// malloc it would not be: glibc raises its mmap threshold to the size of each large chunk freed, so after the
// first few, buffers of a few MB come from malloc's arenas, whose freed memory stays in the process. A stream
// that allocates and frees file-sized arrays all day (shuffle='blocks') then grew by hundreds of MB above what
// it held (measured: 2.3 GB resident for a 1 GiB budget after 30 s).
constexpr std::size_t kOwnMappingFrom = std::size_t{1} << 20;

std::size_t page_size() {
  static const std::size_t size = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return size;
}

}  // namespace

AlignedBuffer::AlignedBuffer(std::size_t size, std::size_t alignment, bool own_pages)
    : data_(nullptr), size_(size), alignment_(alignment < kBufferAlignment ? kBufferAlignment : alignment) {
  if ((size_ >= kOwnMappingFrom || own_pages) && alignment_ <= page_size()) {
    const std::size_t bytes = size_ == 0 ? page_size() : size_;  // a mapping is never empty
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    data_ = static_cast<std::byte*>(p);
    mapped_bytes_ = bytes;
  } else {
    void* p = nullptr;
    // Never ask for 0 bytes: a zero-size array still needs a valid, aligned pointer.
    if (posix_memalign(&p, alignment_, size == 0 ? alignment_ : size) != 0) throw std::bad_alloc();
    data_ = static_cast<std::byte*>(p);
  }
#ifdef MADV_HUGEPAGE
  // Large batch buffers fault in far faster with transparent huge pages; advisory only. Not the file-sized arrays
  // of whole-file loads (the users' 4.9 MB): advised from 2 MiB, on 2 MiB boundaries, a warm load_factor_files
  // repeated in one process took half the time, but loaded once in a fresh process, as training starts, it took
  // 0.10-0.65 s against a steady 0.22-0.26 s (2-CPU VM whose free pages go back to the host: a huge page is then
  // fresh host memory; numpy's own huge pages make np.load as erratic there).
  if (size >= (8u << 20)) ::madvise(data_, size, MADV_HUGEPAGE);
#endif
}

AlignedBuffer::~AlignedBuffer() {
  if (locker_) locker_->unlock(data_);  // before the pages go
  if (mapped_bytes_ != 0) {
    ::munmap(data_, mapped_bytes_);
  } else {
    std::free(data_);
  }
}

void AlignedBuffer::page_lock(std::shared_ptr<const PageLocker> locker) {
  if (mapped_bytes_ == 0) throw std::logic_error("AlignedBuffer::page_lock: the buffer does not own its pages");
  locker->lock(data_, mapped_bytes_);
  locker_ = std::move(locker);
}

std::shared_ptr<AlignedBuffer> BufferPool::acquire(std::size_t size, std::size_t alignment) {
  std::unique_ptr<AlignedBuffer> buffer;
  std::vector<std::unique_ptr<AlignedBuffer>> dropped;  // freed outside the lock
  {
    std::lock_guard lock(mutex_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if ((*it)->size() == size && (*it)->alignment() >= alignment) {
        buffer = std::move(*it);
        free_.erase(it);
        kept_bytes_ -= size;
        ++reused_;
        break;
      }
    }
    if (!buffer) {  // a miss: what is kept must leave room for the new buffer
      const std::uint64_t limit = room(free_.size());
      std::size_t drop = 0;
      while (drop < free_.size() && kept_bytes_ > limit) kept_bytes_ -= free_[drop++]->size();
      dropped.assign(std::make_move_iterator(free_.begin()), std::make_move_iterator(free_.begin() + drop));
      free_.erase(free_.begin(), free_.begin() + drop);
    }
  }
  dropped.clear();
  if (!buffer) {
    buffer = std::make_unique<AlignedBuffer>(size, alignment, /*own_pages=*/locker_ != nullptr);
    if (locker_) buffer->page_lock(locker_);
  }
  std::weak_ptr<BufferPool> pool = weak_from_this();
  return std::shared_ptr<AlignedBuffer>(buffer.release(), [pool](AlignedBuffer* b) {
    if (auto p = pool.lock()) {
      p->give_back(b);
    } else {
      delete b;
    }
  });
}

void BufferPool::give_back(AlignedBuffer* buffer) {
  std::unique_ptr<AlignedBuffer> owned(buffer);  // freed on return (outside the lock) unless kept
  std::lock_guard lock(mutex_);
  const std::uint64_t limit = room(free_.size() + 1);
  if (free_.size() < max_kept_ && kept_bytes_ + owned->size() <= limit) {
    kept_bytes_ += owned->size();
    free_.push_back(std::move(owned));
  }
}

std::uint64_t BufferPool::kept_bytes() const {
  std::lock_guard lock(mutex_);
  return kept_bytes_;
}

std::uint64_t BufferPool::reused() const {
  std::lock_guard lock(mutex_);
  return reused_;
}

}  // namespace npyfeed
