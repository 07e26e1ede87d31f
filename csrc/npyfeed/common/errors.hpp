// Exception types of the core. The binding maps each to the Python type users already catch.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace npyfeed {

/// Base of every error the core throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A file that is not a valid `.npy` file. `offset` is the byte where the problem was found.
/// Maps to `npyfeed.NpyFormatError` (a `ValueError`).
class NpyFormatError : public Error {
 public:
  NpyFormatError(std::string path, std::uint64_t offset, std::string reason);
  const std::string& path() const noexcept { return path_; }
  std::uint64_t offset() const noexcept { return offset_; }
  const std::string& reason() const noexcept { return reason_; }
  /// The same error, naming `path` (the parser works on bytes and does not know it).
  NpyFormatError with_path(const std::string& path) const;

 private:
  std::string path_;
  std::uint64_t offset_;
  std::string reason_;
};

/// A failed system call. Maps to `OSError` (and so to `FileNotFoundError`, ...) with errno, filename and
/// `offset`: the byte offset of a failed read (in the message too), or None where there is none (open, stat).
class OsError : public Error {
 public:
  /// `operation` says what failed ("cannot open"); `offset` is the file offset of a failed read.
  OsError(int error_number, std::string path, const std::string& operation,
          std::optional<std::uint64_t> offset = std::nullopt);
  int error_number() const noexcept { return errno_; }
  const std::string& path() const noexcept { return path_; }
  std::optional<std::uint64_t> offset() const noexcept { return offset_; }
  /// "cannot read at byte 4096: Input/output error": the message without the path (Python adds it).
  const std::string& strerror_text() const noexcept { return text_; }
  /// The same error with `note` added to what failed.
  OsError with_note(const std::string& note) const { return OsError(errno_, path_, operation_ + note, offset_); }

 private:
  std::string operation_;
  int errno_;
  std::string path_;
  std::optional<std::uint64_t> offset_;
  std::string text_;
};

/// Rows or samples outside a file or array. Maps to `IndexError`.
class IndexOutOfRange : public Error {
 public:
  using Error::Error;
};

/// A bad argument or data that does not fit together (mismatched shapes, a malformed index line).
/// Maps to `ValueError`.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

/// A job cancelled on purpose (Ctrl-C, shutdown). Never escapes to users as itself.
class Cancelled : public Error {
 public:
  Cancelled() : Error("cancelled") {}
};

}  // namespace npyfeed
