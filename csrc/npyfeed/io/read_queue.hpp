// Reads in flight from one thread: a thread's ReadQueue collects reads, then wait() carries them all out
// together, through an io_uring where the build has liburing and the kernel allows it (a deep device queue
// from one thread), else one blocking pread after another. Either way each read is looped to the end as
// File::read_at and read_direct_into loop: short reads go on (O_DIRECT from the last aligned position),
// EINTR and EAGAIN completions are submitted again, and a read that stops making progress is reported as
// stalled so its reader can fall back to buffered reads.
//
// The queue only moves bytes; what a result means (an error naming the file, a fallback) is decided by the
// reader that queued the read (array_reader.cpp), in the callback it passes. Reads put in flight by submit()
// stay there until wait() or drain(): a caller that leaves early (an exception, a cancelled job) calls
// drain() or clear() first, so the kernel never writes into freed memory; wait() drains when it throws.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "npyfeed/common/aligned_buffer.hpp"

struct io_uring_cqe;  // liburing.h

namespace npyfeed {

/// Whether reads may go to an io_uring: the build has liburing, NPYFEED_IO_URING is not "0" (read at every
/// call), and a ring could be set up in this process (probed once; a kernel without io_uring, or one that
/// refuses it under seccomp or io_uring_disabled, says no).
bool io_uring_enabled();

/// Whether this build has liburing (io_uring_enabled() is false without it, whatever the kernel allows).
bool io_uring_built() noexcept;

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
  void add(int fd, std::byte* dest, std::uint64_t offset, std::uint64_t length, std::uint64_t need, std::size_t align,
           std::function<void(const QueuedReadResult&)> done);
  /// Puts the queued reads in flight (io_uring) and returns at once; without a ring, nothing happens until
  /// wait().
  void submit();
  /// The position after the last read queued so far: wait(mark()) waits for those reads, not later ones.
  std::uint64_t mark() const noexcept;
  /// Carries out the reads queued before position `until` (all by default; later ones may stay in flight),
  /// then calls their callbacks in the order they were added. Those reads have all ended when it returns or
  /// throws; the first callback exception is rethrown after all have run.
  void wait(std::uint64_t until = UINT64_MAX);
  /// Waits for every read in flight, without callbacks, and drops every queued read (for error paths: then
  /// no read writes into memory that is about to be freed). Also done by clear() and the destructor.
  void drain() noexcept;
  /// drain(), and forgets the staging memory.
  void clear() noexcept;

  /// `bytes` of staging memory aligned to `align`, valid until the next clear() (a read's destination when
  /// the data does not go straight to its user).
  std::byte* stage(std::size_t bytes, std::size_t align);

 private:
  // Defined here, not only declared: std::deque, unlike std::vector, needs a complete element type (libc++
  // refuses an incomplete one).
  struct Request {
    int fd;
    std::byte* dest;
    std::uint64_t offset;
    std::uint64_t length;
    std::uint64_t need;
    std::uint64_t align;
    std::function<void(const QueuedReadResult&)> done;
    QueuedReadResult result;
    bool finished = false;
    int again = 0;
    // The piece the next (or the running) read asks for: [at, at + want) from the start of the request.
    std::uint64_t at() const;
    std::uint64_t want() const;
  };
  struct Ring;
  void run_blocking(std::uint64_t until);
  bool pump(unsigned wait_nr);
  void complete(::io_uring_cqe* cqe);
  void advance(Request& r, long result);

  std::deque<Request> requests_;  // requests_[0] is position base_
  std::uint64_t base_ = 0;
  std::deque<std::uint64_t> ready_;  // positions to put into the ring (again)
  unsigned prepared_ = 0;            // in the submission queue, not yet taken by the kernel
  unsigned in_flight_ = 0;           // taken by the kernel, not yet completed
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
