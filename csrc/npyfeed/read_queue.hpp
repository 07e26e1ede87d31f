// Reads in flight from one thread: a thread's ReadQueue collects reads, then wait() carries them all out
// together, through an io_uring where the build has liburing and the kernel allows it (a deep device queue
// from one thread), else one blocking pread after another. Either way each read is looped to the end as
// File::read_at and read_direct_into loop: short reads go on (O_DIRECT from the last aligned position),
// EINTR and EAGAIN completions are submitted again, and a read that stops making progress is reported as
// stalled so its reader can fall back to buffered reads.
//
// The queue only moves bytes; what a result means (an error naming the file, a fallback) is decided by the
// reader that queued the read (array_reader.cpp), in the callback it passes. Nothing is in flight outside
// wait(): it submits and drains every read before it returns or throws, so a cancelled or failed gather
// never leaves the kernel writing into freed memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "npyfeed/aligned_buffer.hpp"

namespace npyfeed {

/// Whether reads may go to an io_uring: the build has liburing, NPYFEED_IO_URING is not "0" (read at every
/// call), and a ring could be set up in this process (probed once; a kernel without io_uring, or one that
/// refuses it under seccomp or io_uring_disabled, says no).
bool io_uring_enabled();

/// How one queued read ended, handed to its callback: `done` bytes from the start of the request (past
/// `need` when complete), `error` an errno (0: none), `stalled` when reads stopped making progress short of
/// `need` without reaching the end of the file (O_DIRECT: the file ends inside a block, or the device keeps
/// returning short reads).
struct QueuedReadResult {
  std::uint64_t done = 0;
  int error = 0;
  bool stalled = false;
};

class ReadQueue {
 public:
  /// The calling thread's queue (made on first use; a new one in a child after fork).
  static ReadQueue& this_thread();

  /// A queue with a ring of its own where `io_uring` and the kernel allow (this_thread() asks for one).
  explicit ReadQueue(bool io_uring = true);
  ~ReadQueue();
  ReadQueue(const ReadQueue&) = delete;
  ReadQueue& operator=(const ReadQueue&) = delete;

  /// True when wait() uses an io_uring (else blocking preads, one after another).
  bool uses_io_uring() const noexcept;

  /// Queues a read of `length` bytes of `fd` at `offset` into `dest`; `need` (at most `length`) bytes must
  /// arrive for it to be complete (a read may stop at the end of the file after that). `align` > 1 for an
  /// O_DIRECT descriptor: offset, length and dest are aligned to it, and a short read goes on from the last
  /// aligned position. `done` is called once, from wait(), with the result; it may throw. The descriptor
  /// and `dest` must stay valid until wait() returns.
  void add(int fd, std::byte* dest, std::uint64_t offset, std::uint64_t length, std::uint64_t need,
           std::size_t align, std::function<void(const QueuedReadResult&)> done);
  /// Carries out every queued read, then calls their callbacks in the order they were added. Every read
  /// has ended when it returns or throws; the first callback exception is rethrown after all have run.
  /// Throws OsError where the ring itself fails (its reads drained first).
  void wait();
  /// Drops reads queued and not yet waited for (none is in flight), and forgets the staging memory.
  void clear() noexcept;

  /// `bytes` of staging memory aligned to `align`, valid until the next clear() (a read's destination when
  /// the data does not go straight to its user).
  std::byte* stage(std::size_t bytes, std::size_t align);

 private:
  struct Request;
  struct Ring;
  void run_blocking();
  void run_ring();
  void advance(Request& r, long result);

  std::vector<Request> requests_;
  std::unique_ptr<Ring> ring_;
  int pid_;
  std::vector<std::unique_ptr<AlignedBuffer>> staging_;
  std::size_t staging_used_ = 0;  // bytes used in staging_.back()
};

namespace detail {
/// Test hook: when set, every completion's result (bytes, or -errno) passes through it before the queue
/// looks at it, on both paths (ring and blocking), so tests can inject short reads, EINTR, EAGAIN and errors.
/// `want` is the length that read asked for. Not for production use; set it while no queue is waiting.
using CompletionHook = long (*)(long result, std::uint64_t want);
void set_completion_hook(CompletionHook hook) noexcept;
}  // namespace detail

}  // namespace npyfeed
