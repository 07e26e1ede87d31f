#include "npyfeed/read_queue.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <exception>
#include <string_view>

#include "npyfeed/errors.hpp"

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

struct ReadQueue::Request {
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
  std::uint64_t at() const { return align_down(result.done, align); }
  std::uint64_t want() const { return std::min(length - at(), kMaxPiece); }
};

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
  const char* env = std::getenv("NPYFEED_IO_URING");
  if (env != nullptr && std::string_view(env) == "0") return false;
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

ReadQueue::~ReadQueue() = default;

bool ReadQueue::uses_io_uring() const noexcept { return ring_ != nullptr; }

void ReadQueue::add(int fd, std::byte* dest, std::uint64_t offset, std::uint64_t length, std::uint64_t need,
                    std::size_t align, std::function<void(const QueuedReadResult&)> done) {
  Request r{fd, dest, offset, length, std::min(need, length), std::max<std::uint64_t>(align, 1), std::move(done), {}};
  r.finished = r.need == 0;
  requests_.push_back(std::move(r));
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

void ReadQueue::run_blocking() {
  for (Request& r : requests_) {
    while (!r.finished) {
      const std::uint64_t at = r.at();
      const std::uint64_t want = r.want();
      const ssize_t got = ::pread(r.fd, r.dest + at, want, static_cast<off_t>(r.offset + at));
      advance(r, hooked(got < 0 ? -static_cast<long>(errno) : static_cast<long>(got), want));
    }
  }
}

void ReadQueue::run_ring() {
#ifdef NPYFEED_HAVE_LIBURING
  io_uring& ring = ring_->ring;
  // Requests to submit (again), first in first out: each is at most once here or in the ring, so n slots do,
  // and nothing is allocated while reads are in flight.
  const std::size_t n = requests_.size();
  std::vector<std::size_t> ready(n);
  std::size_t head = 0, count = 0;
  for (std::size_t i = 0; i < n; ++i)
    if (!requests_[i].finished) ready[count++] = i;
  unsigned prepared = 0;   // in the submission queue, not yet taken by the kernel
  unsigned in_flight = 0;  // taken by the kernel, not yet completed
  bool broken = false;
  while (!broken && (count > 0 || prepared + in_flight > 0)) {
    while (count > 0 && prepared + in_flight < ring_->entries) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      if (sqe == nullptr) break;
      const std::size_t i = ready[head];
      head = (head + 1) % n;
      --count;
      Request& r = requests_[i];
      const std::uint64_t at = r.at();
      io_uring_prep_read(sqe, r.fd, r.dest + at, static_cast<unsigned>(r.want()), r.offset + at);
      io_uring_sqe_set_data64(sqe, i);
      ++prepared;
    }
    const int submitted = io_uring_submit_and_wait(&ring, in_flight + prepared > 0 ? 1 : 0);
    if (submitted >= 0) {
      prepared -= static_cast<unsigned>(submitted);
      in_flight += static_cast<unsigned>(submitted);
    } else if (submitted != -EINTR && submitted != -EAGAIN && submitted != -EBUSY) {
      broken = true;  // the reads the kernel took are drained below; the rest go through pread
    }
    io_uring_cqe* cqe = nullptr;
    while (in_flight > 0 && io_uring_peek_cqe(&ring, &cqe) == 0 && cqe != nullptr) {
      const std::size_t i = static_cast<std::size_t>(io_uring_cqe_get_data64(cqe));
      const long result = cqe->res;
      io_uring_cqe_seen(&ring, cqe);
      --in_flight;
      Request& r = requests_[i];
      advance(r, hooked(result, r.want()));
      if (!r.finished) ready[(head + count++) % n] = i;
    }
  }
  if (broken) {
    // Wait for every read the kernel took before its memory can go; then the ring is given up on.
    while (in_flight > 0) {
      io_uring_cqe* cqe = nullptr;
      const int rc = io_uring_wait_cqe(&ring, &cqe);
      if (rc == -EINTR) continue;
      if (rc != 0) std::abort();  // a read may still write into memory about to be freed: never carry on
      const std::size_t i = static_cast<std::size_t>(io_uring_cqe_get_data64(cqe));
      const long result = cqe->res;
      io_uring_cqe_seen(&ring, cqe);
      --in_flight;
      advance(requests_[i], hooked(result, requests_[i].want()));
    }
    ring_.reset();  // reads the kernel never took die with the ring; run_blocking finishes every request
  }
#endif
}

void ReadQueue::wait() {
  if (ring_) run_ring();
  run_blocking();  // everything, without a ring; whatever a broken ring left, with one
  std::vector<Request> requests;
  requests.swap(requests_);
  std::exception_ptr first;
  for (Request& r : requests) {
    try {
      r.done(r.result);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

void ReadQueue::clear() noexcept {
  requests_.clear();
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
  staging_.push_back(std::make_unique<AlignedBuffer>(std::max(bytes, kStagingChunk), std::max<std::size_t>(align, 4096)));
  staging_used_ = bytes;
  return staging_.back()->data();
}

}  // namespace npyfeed
