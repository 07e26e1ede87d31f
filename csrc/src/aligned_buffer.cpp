#include "npyfeed/aligned_buffer.hpp"

#include <sys/mman.h>

#include <cstdlib>
#include <new>

namespace npyfeed {

AlignedBuffer::AlignedBuffer(std::size_t size, std::size_t alignment)
    : data_(nullptr), size_(size), alignment_(alignment < kBufferAlignment ? kBufferAlignment : alignment) {
  void* p = nullptr;
  // Never ask for 0 bytes: a zero-size array still needs a valid, aligned pointer.
  if (posix_memalign(&p, alignment_, size == 0 ? alignment_ : size) != 0) throw std::bad_alloc();
  data_ = static_cast<std::byte*>(p);
#ifdef MADV_HUGEPAGE
  // Large batch buffers fault in far faster with transparent huge pages; advisory only.
  if (size >= (8u << 20)) ::madvise(data_, size, MADV_HUGEPAGE);
#endif
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

std::shared_ptr<AlignedBuffer> BufferPool::acquire(std::size_t size) {
  std::unique_ptr<AlignedBuffer> buffer;
  {
    std::lock_guard lock(mutex_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if ((*it)->size() == size) {
        buffer = std::move(*it);
        free_.erase(it);
        break;
      }
    }
  }
  if (!buffer) buffer = std::make_unique<AlignedBuffer>(size);
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
  std::unique_ptr<AlignedBuffer> owned(buffer);
  std::lock_guard lock(mutex_);
  if (free_.size() < max_kept_) free_.push_back(std::move(owned));
}

}  // namespace npyfeed
