#include "npyfeed/index.hpp"

#include <charconv>

#include "npyfeed/errors.hpp"
#include "npyfeed/file.hpp"

namespace npyfeed {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

[[noreturn]] void bad_line(const std::string& name, std::uint64_t line_no, const std::string& why,
                           std::string_view text) {
  std::string shown(text.substr(0, 80));
  throw InvalidArgument(name + ":" + std::to_string(line_no) + ": " + why + " (line: '" + shown + "')");
}

std::int64_t parse_int_field(std::string_view field, const std::string& name, std::uint64_t line_no, const char* what,
                             std::string_view line) {
  field = trim(field);
  if (!field.empty() && field.front() == '+') field.remove_prefix(1);
  std::int64_t value = 0;
  auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), value);
  if (field.empty() || ec != std::errc() || end != field.data() + field.size()) {
    bad_line(name, line_no, std::string(what) + " is not an integer", line);
  }
  return value;
}

}  // namespace

void SampleIndex::add(std::int64_t feature, std::int64_t label, std::string_view key, std::uint32_t source_id,
                      std::uint64_t line_no) {
  auto it = key_ids_.find(std::string(key));
  std::uint32_t id;
  if (it == key_ids_.end()) {
    if (key.empty() || key == "." || key == ".." || key.find('/') != std::string_view::npos ||
        key.find('\0') != std::string_view::npos) {
      throw InvalidArgument((source_id < sources.size() ? sources[source_id] : std::string("<index>")) + ":" +
                            std::to_string(line_no) + ": key '" + std::string(key) + "' cannot name a file");
    }
    id = static_cast<std::uint32_t>(keys.size());
    keys.emplace_back(key);
    key_ids_.emplace(keys.back(), id);
  } else {
    id = it->second;
  }
  feature_index.push_back(feature);
  label_index.push_back(label);
  key_id.push_back(id);
  source.push_back(source_id);
  line.push_back(line_no);
}

std::string SampleIndex::where(std::size_t i) const { return sources[source[i]] + ":" + std::to_string(line[i]); }

void parse_index_text(std::string_view text, const std::string& name, SampleIndex& index) {
  auto source_id = static_cast<std::uint32_t>(index.sources.size());
  index.sources.push_back(name);
  std::uint64_t line_no = 0;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    std::string_view content = trim(line);
    if (content.empty()) continue;
    std::size_t c1 = content.find(',');
    std::size_t c2 = c1 == std::string_view::npos ? c1 : content.find(',', c1 + 1);
    if (c2 == std::string_view::npos) bad_line(name, line_no, "expected 'feature_index,label_index,key'", content);
    std::string_view key = trim(content.substr(c2 + 1));
    if (key.find(',') != std::string_view::npos) bad_line(name, line_no, "too many fields", content);
    if (key.empty()) bad_line(name, line_no, "empty key", content);
    std::int64_t feature = parse_int_field(content.substr(0, c1), name, line_no, "feature_index", content);
    std::int64_t label = parse_int_field(content.substr(c1 + 1, c2 - c1 - 1), name, line_no, "label_index", content);
    try {
      index.add(feature, label, key, source_id, line_no);
    } catch (const InvalidArgument&) {
      bad_line(name, line_no, "key '" + std::string(key) + "' cannot name a file (empty, '.', '..' or contains '/')",
               content);
    }
  }
}

SampleIndex read_index_files(const std::vector<std::string>& paths) {
  SampleIndex index;
  for (const std::string& path : paths) {
    File file = File::open(path);
    std::string text(file.size(), '\0');
    text.resize(file.read_at(text.data(), text.size(), 0));
    if (text.find('\0') != std::string::npos) {
      throw InvalidArgument(path + ": NUL byte in index file (is it a text file?)");
    }
    parse_index_text(text, path, index);
  }
  return index;
}

}  // namespace npyfeed
