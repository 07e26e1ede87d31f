#include "npyfeed/errors.hpp"

#include <cstring>

namespace npyfeed {

namespace {
std::string format_message(const std::string& path, std::uint64_t offset, const std::string& reason) {
  std::string where = path.empty() ? std::string("<bytes>") : path;
  return where + ": " + reason + " (at byte " + std::to_string(offset) + ")";
}
}  // namespace

NpyFormatError::NpyFormatError(std::string path, std::uint64_t offset, std::string reason)
    : Error(format_message(path, offset, reason)),
      path_(std::move(path)),
      offset_(offset),
      reason_(std::move(reason)) {}

NpyFormatError NpyFormatError::with_path(const std::string& path) const {
  return NpyFormatError(path, offset_, reason_);
}

OsError::OsError(int error_number, std::string path, const std::string& operation)
    : Error(operation + " '" + path + "': " + std::strerror(error_number)),
      errno_(error_number),
      path_(std::move(path)),
      text_(operation + ": " + std::strerror(error_number)) {}

}  // namespace npyfeed
