#include "npyfeed/common/errors.hpp"

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

namespace {
std::string at_byte(std::optional<std::uint64_t> offset) {
  return offset ? " at byte " + std::to_string(*offset) : std::string();
}
}  // namespace

OsError::OsError(int error_number, std::string path, const std::string& operation, std::optional<std::uint64_t> offset)
    : Error(operation + " '" + path + "'" + at_byte(offset) + ": " + std::strerror(error_number)),
      operation_(operation),
      errno_(error_number),
      path_(std::move(path)),
      offset_(offset),
      text_(operation + at_byte(offset) + ": " + std::strerror(error_number)) {}

}  // namespace npyfeed
