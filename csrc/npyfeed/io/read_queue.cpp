#include "npyfeed/io/read_queue.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <deque>
#include <exception>

#include "npyfeed/common/errors.hpp"
#include "npyfeed/common/settings.hpp"

#ifdef NPYFEED_HAVE_LIBURING
#include <liburing.h>
#endif

namespace npyfeed {

namespace {

std::atomic<detail::CompletionHook> completion_hook{nullptr};

long hooked(long result, std::uint64_t want) {
  const detail::CompletionHook hook = completion_hook.load(std::memory_order_relaxed);
  return hook != nullptr ? hook(result, want) : result;
}

// Linux transfers at most 0x7ffff000 bytes per call (and an io_uring read takes a 32-bit length).
constexpr std::uint64_t kMaxPiece = 1u << 30;
// A read answered EAGAIN this many times in a row fails with EAGAIN instead of spinning forever.
constexpr int kMaxAgain = 1000;
// Submission queue entries per ring: reads in flight from one thread at most.
constexpr unsigned kRingEntries = 64;
constexpr std::size_t kStagingChunk = 8u << 20;

std::uint64_t align_down(std::uint64_t x, std::uint64_t a) { return x / a * a; }

}  // namespace

namespace detail {
void set_completion_hook(CompletionHook hook) noexcept { completion_hook.store(hook, std::memory_order_relaxed); }
}  // namespace detail

std::uint64_t ReadQueue::Request::at() const { return align_down(result.done, align); }
std::uint64_t ReadQueue::Request::want() const { return std::min(length - at(), kMaxPiece); }

#ifdef NPYFEED_HAVE_LIBURING
struct ReadQueue::Ring {
  io_uring ring{};
  unsigned entries = 0;
  ~Ring() { io_uring_queue_exit(&ring); }
};

namespace {
// A ring, or null where the kernel refuses one (no io_uring, seccomp, io_uring_disabled, ENOMEM).
int init_ring(io_uring& ring, unsigned entries) {
#ifdef IORING_SETUP_COOP_TASKRUN
  // Completions are only reaped when this thread waits for them: no interrupt to run their task work.
  if (io_uring_queue_init(entries, &ring, IORING_SETUP_COOP_TASKRUN) == 0) return 0;
#endif
  return io_uring_queue_init(entries, &ring, 0);
}
}  // namespace

bool io_uring_enabled() {
  if (!settings::io_uring().value_or(true)) return false;
  static const bool works = [] {
    io_uring ring{};
    if (init_ring(ring, 4) != 0) return false;
    io_uring_queue_exit(&ring);
    return true;
  }();
  return works;
}
#else
struct ReadQueue::Ring {};
bool io_uring_enabled() { return false; }
#endif

bool io_uring_built() noexcept {
#ifdef NPYFEED_HAVE_LIBURING
  return true;
#else
  return false;
#endif
}

ReadQueue& ReadQueue::this_thread() {
  thread_local std::unique_ptr<ReadQueue> queue;
  // After fork() a child has its own copy of the parent's ring mappings: give it a ring of its own.
  if (!queue || queue->pid_ != ::getpid()) queue = std::make_unique<ReadQueue>();
  return *queue;
}

ReadQueue::ReadQueue(bool io_uring) : pid_(::getpid()) {
#ifdef NPYFEED_HAVE_LIBURING
  if (!io_uring) return;
  auto ring = std::make_unique<Ring>();
  if (init_ring(ring->ring, kRingEntries) == 0) {
    ring->entries = kRingEntries;
    ring_ = std::move(ring);
  }
#else
  (void)io_uring;
#endif
}

ReadQueue::~ReadQueue() { drain(); }

bool ReadQueue::uses_io_uring() const noexcept { return ring_ != nullptr; }

std::uint64_t ReadQueue::mark() const noexcept { return base_ + requests_.size(); }

void ReadQueue::add(int fd, std::byte* dest, std::uint64_t offset, std::uint64_t length, std::uint64_t need,
                    std::size_t align, std::function<void(const QueuedReadResult&)> done) {
  Request r{fd, dest, offset, length, std::min(need, length), std::max<std::uint64_t>(align, 1), std::move(done), {}};
  r.finished = r.need == 0;
  requests_.push_back(std::move(r));
  if (ring_ && !requests_.back().finished) ready_.push_back(mark() - 1);
}

// One completion of request `r` (bytes read, or -errno), as read_direct_into and File::read_at loop: a short
// read goes on from the last aligned position; a read that brings nothing new ends the request (the end of
// the file at `at`, or stalled).
void ReadQueue::advance(Request& r, long result) {
  if (result == -EINTR) return;  // asked again
  if (result == -EAGAIN && ++r.again < kMaxAgain) return;
  if (result < 0) {
    r.result.error = static_cast<int>(-result);
    r.finished = true;
    return;
  }
  r.again = 0;
  const std::uint64_t at = r.at();
  const std::uint64_t got = std::min<std::uint64_t>(static_cast<std::uint64_t>(result), r.want());
  if (got == 0 && at == r.result.done) {  // the end of the file
    r.finished = true;
    return;
  }
  if (at + got <= r.result.done) {  // nothing new: the file ends inside this block, or reads keep stopping short
    r.result.stalled = true;
    r.finished = true;
    return;
  }
  r.result.done = at + got;
  r.finished = r.result.done >= r.need;
}

void ReadQueue::run_blocking(std::uint64_t until) {
  for (std::uint64_t seq = base_; seq < until; ++seq) {
    Request& r = requests_[seq - base_];
    while (!r.finished) {
      const std::uint64_t at = r.at();
      const std::uint64_t want = r.want();
      const ssize_t got = ::pread(r.fd, r.dest + at, want, static_cast<off_t>(r.offset + at));
      advance(r, hooked(got < 0 ? -static_cast<long>(errno) : static_cast<long>(got), want));
    }
  }
}

#ifdef NPYFEED_HAVE_LIBURING
// One completion: the request goes on (back to ready_) or has ended.
void ReadQueue::complete(::io_uring_cqe* cqe) {
  const std::uint64_t seq = io_uring_cqe_get_data64(cqe);
  const long result = cqe->res;
  io_uring_cqe_seen(&ring_->ring, cqe);
  --in_flight_;
  Request& r = requests_[seq - base_];
  advance(r, hooked(result, r.want()));
  if (!r.finished) ready_.push_back(seq);
}
#endif

// Puts ready requests into the ring (as many as it holds), submits them, waits for `wait_nr` completions and
// takes every completion there is. False where the ring failed (its reads drained: the ring is gone).
bool ReadQueue::pump(unsigned wait_nr) {
#ifdef NPYFEED_HAVE_LIBURING
  io_uring& ring = ring_->ring;
  while (!ready_.empty() && prepared_ + in_flight_ < ring_->entries) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    if (sqe == nullptr) break;
    const std::uint64_t seq = ready_.front();
    ready_.pop_front();
    Request& r = requests_[seq - base_];
    const std::uint64_t at = r.at();
    io_uring_prep_read(sqe, r.fd, r.dest + at, static_cast<unsigned>(r.want()), r.offset + at);
    io_uring_sqe_set_data64(sqe, seq);
    ++prepared_;
  }
  const int submitted = io_uring_submit_and_wait(&ring, prepared_ + in_flight_ > 0 ? wait_nr : 0);
  if (submitted >= 0) {
    prepared_ -= static_cast<unsigned>(submitted);
    in_flight_ += static_cast<unsigned>(submitted);
  } else if (submitted != -EINTR && submitted != -EAGAIN && submitted != -EBUSY) {
    // Wait for every read the kernel took before its memory can go, then give the ring up: the reads it never
    // took die with it, and every unfinished request is read with pread instead.
    while (in_flight_ > 0) {
      io_uring_cqe* cqe = nullptr;
      const int rc = io_uring_wait_cqe(&ring, &cqe);
      if (rc == -EINTR) continue;
      if (rc != 0) std::abort();  // a read may still write into memory about to be freed: never carry on
      complete(cqe);
    }
    ring_.reset();
    ready_.clear();
    prepared_ = 0;
    return false;
  }
  io_uring_cqe* cqe = nullptr;
  while (in_flight_ > 0 && io_uring_peek_cqe(&ring, &cqe) == 0 && cqe != nullptr) complete(cqe);
#else
  (void)wait_nr;
#endif
  return true;
}

void ReadQueue::submit() {
  if (ring_ && !ready_.empty()) pump(0);
}

void ReadQueue::wait(std::uint64_t until) {
  until = std::min<std::uint64_t>(until, mark());
  auto unfinished = [&] {
    for (std::uint64_t seq = base_; seq < until; ++seq)
      if (!requests_[seq - base_].finished) return true;
    return false;
  };
  try {
    while (ring_ && unfinished())
      if (!pump(1)) break;
    run_blocking(until);  // everything, without a ring; whatever a failed ring left, with one
  } catch (...) {
    drain();
    throw;
  }
  std::exception_ptr first;
  while (base_ < until) {
    Request r = std::move(requests_.front());
    requests_.pop_front();
    ++base_;
    try {
      r.done(r.result);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

void ReadQueue::drain() noexcept {
#ifdef NPYFEED_HAVE_LIBURING
  while (ring_ && prepared_ + in_flight_ > 0) {
    const int submitted = io_uring_submit_and_wait(&ring_->ring, 1);
    if (submitted > 0) {
      prepared_ -= static_cast<unsigned>(submitted);
      in_flight_ += static_cast<unsigned>(submitted);
    } else if (submitted < 0 && submitted != -EINTR && submitted != -EAGAIN && submitted != -EBUSY) {
      std::abort();  // reads in flight into memory about to be freed, and no way to wait for them
    }
    io_uring_cqe* cqe = nullptr;
    while (in_flight_ > 0 && io_uring_peek_cqe(&ring_->ring, &cqe) == 0 && cqe != nullptr) {
      io_uring_cqe_seen(&ring_->ring, cqe);
      --in_flight_;
    }
  }
#endif
  ready_.clear();
  base_ += requests_.size();
  requests_.clear();
}

void ReadQueue::clear() noexcept {
  drain();
  // Keep one chunk for the next batch; larger staging (a long merged run) goes back to the system.
  if (staging_.size() > 1 || (!staging_.empty() && staging_.front()->size() > kStagingChunk)) staging_.clear();
  staging_used_ = 0;
}

std::byte* ReadQueue::stage(std::size_t bytes, std::size_t align) {
  align = std::max<std::size_t>(align, kBufferAlignment);
  if (!staging_.empty()) {
    const std::size_t at = (staging_used_ + align - 1) / align * align;
    AlignedBuffer& chunk = *staging_.back();
    if (chunk.alignment() >= align && at + bytes <= chunk.size()) {
      staging_used_ = at + bytes;
      return chunk.data() + at;
    }
  }
  staging_.push_back(
      std::make_unique<AlignedBuffer>(std::max(bytes, kStagingChunk), std::max<std::size_t>(align, 4096)));
  staging_used_ = bytes;
  return staging_.back()->data();
}

}  // namespace npyfeed
