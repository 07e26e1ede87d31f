// Owned, aligned memory. Arrays handed to Python keep one alive through a shared_ptr in their capsule.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

namespace npyfeed {

/// 64 bytes: a cache line, what AVX-512 wants, and what TensorFlow needs to adopt a buffer without copying.
inline constexpr std::size_t kBufferAlignment = 64;

class AlignedBuffer {
 public:
  /// `size` bytes aligned to `alignment` (a power of two, at least 64). Throws std::bad_alloc. From 1 MiB on
  /// (and alignment up to a page) the memory is a mapping of its own, returned to the system when freed.
  explicit AlignedBuffer(std::size_t size, std::size_t alignment = kBufferAlignment);
  ~AlignedBuffer();
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  std::byte* data() noexcept { return data_; }
  const std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  std::size_t alignment() const noexcept { return alignment_; }

 private:
  std::byte* data_;
  std::size_t size_;
  std::size_t alignment_;
  bool mapped_ = false;  // a mapping of its own (large buffers), else malloc's
};

/// Recycles batch buffers: a buffer comes back only when its last user (a numpy array, a tensor that
/// adopted it) has let go, so memory still held by anyone is never written again. Recycling avoids
/// paying page faults on fresh memory for every batch.
class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  explicit BufferPool(std::size_t max_kept) : max_kept_(max_kept) {}
  /// A buffer of at least `size` bytes; when the returned pointer's last copy dies it goes back to the pool.
  std::shared_ptr<AlignedBuffer> acquire(std::size_t size);

 private:
  void give_back(AlignedBuffer* buffer);
  std::mutex mutex_;
  std::vector<std::unique_ptr<AlignedBuffer>> free_;
  std::size_t max_kept_;
};

}  // namespace npyfeed
