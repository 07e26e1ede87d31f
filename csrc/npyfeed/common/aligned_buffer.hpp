// Owned, aligned memory. Arrays handed to Python keep one alive through a shared_ptr in their capsule.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "npyfeed/device/page_lock.hpp"

namespace npyfeed {

/// 64 bytes: a cache line, what AVX-512 wants, and what TensorFlow needs to adopt a buffer without copying.
inline constexpr std::size_t kBufferAlignment = 64;

class AlignedBuffer {
 public:
  /// `size` bytes aligned to `alignment` (a power of two, at least 64). Throws std::bad_alloc. From 1 MiB on
  /// (and alignment up to a page), or whatever the size with `own_pages`, the memory is a mapping of its own
  /// (whole pages no other allocation shares), returned to the system when freed.
  explicit AlignedBuffer(std::size_t size, std::size_t alignment = kBufferAlignment, bool own_pages = false);
  ~AlignedBuffer();
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  std::byte* data() noexcept { return data_; }
  const std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  std::size_t alignment() const noexcept { return alignment_; }
  /// Page-locks the buffer's pages through `locker` (PageLocker::lock) until it is freed. Only for a buffer
  /// made with `own_pages`: CUDA refuses to register a page twice, and malloc's memory shares its pages.
  void page_lock(std::shared_ptr<const PageLocker> locker);
  bool page_locked() const noexcept { return locker_ != nullptr; }

 private:
  std::byte* data_;
  std::size_t size_;
  std::size_t alignment_;
  std::size_t mapped_bytes_ = 0;  // a mapping of its own (large buffers, own_pages) of this many bytes, else 0
  std::shared_ptr<const PageLocker> locker_;  // set while page-locked
};

/// Recycles buffers: a buffer comes back only when its last user (a numpy array, a tensor that adopted it, a
/// block's arrays) has let go, so memory still held by anyone is never written again. Recycling avoids paying
/// page faults on fresh memory (and the unmapping of the old) for every batch or block file.
class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  /// Keeps at most `max_kept` free buffers and, with `room`, at most room(n) bytes of them when n are kept
  /// (asked as each buffer comes back and at each miss: e.g. what a memory budget leaves beside the memory in
  /// use, with an allowance per buffer). `room` is called with the pool's lock held: it must be cheap and must
  /// not call into the pool (read atomics, take no lock the pool's users may hold).
  /// With `locker`, every buffer it makes is page-locked through it (for copies to a GPU by DMA), once, for
  /// its whole life: recycling a buffer keeps its registration.
  explicit BufferPool(std::size_t max_kept, std::function<std::uint64_t(std::size_t buffers)> room = {},
                      std::shared_ptr<const PageLocker> locker = nullptr)
      : max_kept_(max_kept), room_(std::move(room)), locker_(std::move(locker)) {}
  /// A buffer of exactly `size` bytes aligned to at least `alignment`: a free one, else a new one (the oldest
  /// free ones let go first where `room` leaves no place for them). When the returned pointer's last copy
  /// dies it comes back to the pool (or is freed, with the pool gone or full).
  std::shared_ptr<AlignedBuffer> acquire(std::size_t size, std::size_t alignment = kBufferAlignment);
  /// Bytes of the free buffers kept now.
  std::uint64_t kept_bytes() const;
  /// Buffers handed out again so far (for tests and benchmarks).
  std::uint64_t reused() const;

 private:
  void give_back(AlignedBuffer* buffer);
  std::uint64_t room(std::size_t buffers) const { return room_ ? room_(buffers) : UINT64_MAX; }
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<AlignedBuffer>> free_;  // oldest first
  std::uint64_t kept_bytes_ = 0;
  std::uint64_t reused_ = 0;
  std::size_t max_kept_;
  std::function<std::uint64_t(std::size_t)> room_;
  std::shared_ptr<const PageLocker> locker_;
};

}  // namespace npyfeed
