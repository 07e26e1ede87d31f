#include "npyfeed/io/file.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

#include "npyfeed/common/errors.hpp"

namespace npyfeed {

namespace {

FileIdentity identity_of(const struct stat& st) {
  return FileIdentity{static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino),
                      static_cast<std::uint64_t>(st.st_size),
                      static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec};
}

rlim_t open_files_limit() noexcept {
  struct rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return RLIM_INFINITY;
  return rl.rlim_cur;
}

}  // namespace

std::size_t descriptor_budget() noexcept {
  const rlim_t limit = open_files_limit();
  if (limit == RLIM_INFINITY || limit / 2 >= SIZE_MAX) return SIZE_MAX;
  return static_cast<std::size_t>(limit / 2);
}

File File::open(const std::string& path, bool direct) {
  // O_NONBLOCK so that opening a FIFO returns at once instead of waiting for a writer; it is
  // cleared below for regular files (it has no effect on them anyway).
  int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY;
  if (direct) flags |= O_DIRECT;
  int fd;
  do {
    fd = ::open(path.c_str(), flags);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int error = errno;
    if (error == EMFILE) {
      throw OsError(error, path,
                    "cannot open (the open-file limit RLIMIT_NOFILE is " + std::to_string(open_files_limit()) +
                        ": raise it with `ulimit -n`, or use fewer threads)");
    }
    throw OsError(error, path, "cannot open");
  }
  File file;
  file.fd_ = fd;
  file.path_ = path;
  struct stat st{};
  if (::fstat(fd, &st) != 0) throw OsError(errno, path, "cannot stat");
  if (S_ISDIR(st.st_mode)) throw OsError(EISDIR, path, "cannot read");
  if (!S_ISREG(st.st_mode)) throw NpyFormatError(path, 0, "not a regular file (a FIFO, socket or device)");
  int status_flags = ::fcntl(fd, F_GETFL);
  if (status_flags >= 0) ::fcntl(fd, F_SETFL, status_flags & ~O_NONBLOCK);
  file.size_ = static_cast<std::uint64_t>(st.st_size);
  file.identity_ = identity_of(st);
  return file;
}

File File::reopen(const FileOrigin& origin, bool direct) {
  File file;
  try {
    file = open(origin.path, direct);
  } catch (const OsError& e) {
    if (e.error_number() == ENOENT) throw OsError(ENOENT, origin.path, "deleted since it was opened");
    throw;
  }
  check_same_file(origin, file.identity());
  return file;
}

void File::check_unchanged() const {
  struct stat st{};
  if (::fstat(fd_, &st) != 0) throw OsError(errno, path_, "cannot stat");
  check_same_file(origin(), identity_of(st));
}

void check_same_file(const FileOrigin& origin, const FileIdentity& now) {
  const FileIdentity& then = origin.identity;
  if (now == then) return;
  std::string what;
  if (now.device != then.device || now.inode != then.inode) {
    what = "replaced by another file: renamed over, or deleted and written again";
  } else if (now.size != then.size) {
    what = std::string(now.size < then.size ? "truncated" : "grown") + ": " + std::to_string(then.size) +
           " bytes then, " + std::to_string(now.size) + " now";
  } else {
    what = "written in place: its modification time changed";
  }
  // What a running job is told to do about it, too.
  throw OsError(ESTALE, origin.path,
                "changed since it was opened (" + what + "; a new WindowSource reads the new data)");
}

void check_unchanged(const FileOrigin& origin) {
  struct stat st{};
  int rc;
  do {
    rc = ::stat(origin.path.c_str(), &st);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int error = errno;
    throw OsError(error, origin.path, error == ENOENT ? "deleted since it was opened" : "cannot stat");
  }
  check_same_file(origin, identity_of(st));
}

File::~File() { close(); }

File::File(File&& other) noexcept
    : fd_(other.fd_), path_(std::move(other.path_)), size_(other.size_), identity_(other.identity_) {
  other.fd_ = -1;
}

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    size_ = other.size_;
    identity_ = other.identity_;
    other.fd_ = -1;
  }
  return *this;
}

void File::close() noexcept {
  if (fd_ >= 0) {
    ::close(fd_);  // on Linux the descriptor is released even if close reports EINTR: never retry
    fd_ = -1;
  }
}

std::size_t File::read_at(void* buffer, std::size_t length, std::uint64_t offset) const {
  auto* out = static_cast<char*>(buffer);
  std::size_t done = 0;
  while (done < length) {
    // Linux transfers at most 0x7ffff000 bytes per call; ask for no more so large reads stay simple.
    std::size_t want = length - done;
    if (want > 0x40000000) want = 0x40000000;
    ssize_t got = ::pread(fd_, out + done, want, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw OsError(errno, path_, "cannot read", offset + done);
    }
    if (got == 0) break;  // end of file
    done += static_cast<std::size_t>(got);
  }
  return done;
}

void File::read_exact(void* buffer, std::size_t length, std::uint64_t offset) const {
  std::size_t got = read_at(buffer, length, offset);
  if (got < length) {
    throw NpyFormatError(path_, offset + got,
                         "file ended while reading " + std::to_string(length) + " bytes at offset " +
                             std::to_string(offset) + " (truncated, or shrunk while being read)");
  }
}

bool File::probably_cached(std::uint64_t offset) const noexcept {
  if (fd_ < 0) return true;
  char byte;
  struct iovec iov{&byte, 1};
  const ssize_t got = ::preadv2(fd_, &iov, 1, static_cast<off_t>(offset), RWF_NOWAIT);
  return !(got < 0 && errno == EAGAIN);
}

}  // namespace npyfeed
