#include "npyfeed/index/index.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>

#include "npyfeed/common/errors.hpp"
#include "npyfeed/common/utf8.hpp"
#include "npyfeed/io/file.hpp"
#include "npyfeed/io/mapped_file.hpp"

namespace npyfeed {

namespace {

// Text is parsed in chunks of about this size (ending at a newline), one work item each; every chunk start
// is also a checkpoint, so a message rescans at most this much text to find a line number.
constexpr std::size_t kChunkBytes = 1u << 20;

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// Lines end with "\n" or "\r\n"; a "\r" inside one is most likely a file of old Mac "\r" line endings.
constexpr const char* kCarriageReturn =
    "a carriage return inside the line: lines end with '\\n' or '\\r\\n' (a file of '\\r' line endings?)";

bool key_names_a_file(std::string_view key) {
  return !(key.empty() || key == "." || key == ".." || key.find('/') != std::string_view::npos ||
           key.find('\0') != std::string_view::npos);
}

// A malformed line as a message shows it: its first 80 bytes, a carriage return as \r (printed, it would hide
// what came before it).
std::string shown_line(std::string_view text) {
  std::string out;
  for (char ch : text.substr(0, 80)) out += ch == '\r' ? std::string("\\r") : std::string(1, ch);
  return out;
}

std::string line_message(const std::string& name, std::uint64_t line_no, const std::string& why,
                         std::string_view text) {
  return name + ":" + std::to_string(line_no) + ": " + why + " (line: '" + shown_line(text) + "')";
}

bool parse_int_field(std::string_view field, std::int64_t& value) {
  field = trim(field);
  if (!field.empty() && field.front() == '+') field.remove_prefix(1);
  auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), value);
  return !field.empty() && ec == std::errc() && end == field.data() + field.size();
}

// One line's fields, or why it is malformed (nullptr: fine, or blank when `blank`).
const char* parse_line(std::string_view line, std::int64_t& feature, std::int64_t& label, std::string_view& key,
                       bool& blank) {
  std::string_view content = trim(line);
  blank = content.empty();
  if (blank) return nullptr;
  std::size_t c1 = content.find(',');
  std::size_t c2 = c1 == std::string_view::npos ? c1 : content.find(',', c1 + 1);
  if (c2 == std::string_view::npos) return "expected 'feature_index,label_index,key'";
  key = trim(content.substr(c2 + 1));
  if (key.find(',') != std::string_view::npos) return "too many fields";
  if (key.empty()) return "empty key";
  if (!parse_int_field(content.substr(0, c1), feature)) return "feature_index is not an integer";
  if (!parse_int_field(content.substr(c1 + 1, c2 - c1 - 1), label)) return "label_index is not an integer";
  return nullptr;
}

// A malformed line a collecting parse left out: local line, why, and where the text and samples go on after it.
struct BadLine {
  std::uint64_t line;
  std::string why;
  std::size_t next_offset;  // in the file's text
  std::size_t next_sample;  // chunk-local
};

// One chunk of one index file, parsed on its own: keys get chunk-local ids (in order of first appearance)
// that are renumbered once all chunks are done.
struct Chunk {
  std::size_t file = 0;
  std::size_t begin = 0;  // bytes of the file's text
  std::size_t end = 0;
  std::uint64_t lines = 0;       // lines started in the chunk
  std::uint64_t first_line = 0;  // 1-based line of its first line in the file (set after the parse)
  std::vector<std::int32_t> feature, label;
  std::vector<std::uint32_t> key;
  std::vector<WideValue> wide_feature, wide_label;  // chunk-local sample ids
  std::vector<std::string_view> keys;               // into the file's text
  // The first error: a NUL byte anywhere, or a malformed line (local line number, reason, text).
  bool nul = false;
  const char* why = nullptr;
  std::string why_text;
  std::uint64_t error_line = 0;
  std::string_view error_text;
  // A collecting parse: the malformed lines left out, and whether there were too many (the file is left out).
  bool collect = false;
  bool garbage = false;
  std::vector<BadLine> bad;
};

std::int32_t narrow(std::int64_t v, std::size_t sample, std::vector<WideValue>& wide) {
  if (v > INT32_MIN && v <= INT32_MAX) return static_cast<std::int32_t>(v);
  wide.push_back({sample, v});
  return SampleIndex::kWide;
}

void parse_chunk(std::string_view text, Chunk& c) {
  std::string_view s = text.substr(c.begin, c.end - c.begin);
  if (std::memchr(s.data(), '\0', s.size()) != nullptr) {
    c.nul = true;
    return;
  }
  const std::size_t guess = s.size() / 16;  // lines of "row,row,key" are rarely shorter
  c.feature.reserve(guess);
  c.label.reserve(guess);
  c.key.reserve(guess);
  std::unordered_map<std::string_view, std::uint32_t> ids;
  std::string_view last_key;
  std::uint32_t last_id = 0;
  std::size_t pos = 0;
  while (pos < s.size()) {
    const char* nl = static_cast<const char*>(std::memchr(s.data() + pos, '\n', s.size() - pos));
    const std::size_t end = nl == nullptr ? s.size() : static_cast<std::size_t>(nl - s.data());
    std::string_view line = s.substr(pos, end - pos);
    pos = end + 1;
    ++c.lines;
    std::int64_t feature = 0, label = 0;
    std::string_view key;
    bool blank = false;
    // Records a malformed line; true when the parse of this chunk stops there.
    auto malformed = [&](const char* why, std::string why_text) {
      if (!c.collect) {
        c.why = why;
        c.why_text = std::move(why_text);
        c.error_line = c.lines;
        c.error_text = trim(line);
        return true;
      }
      if (c.bad.size() == kMostMalformedLinesPerChunk) return c.garbage = true;
      c.bad.push_back({c.lines, *why ? std::string(why) : why_text, c.begin + pos, c.key.size()});
      c.bad.back().why += " (line: '" + shown_line(trim(line)) + "')";
      return false;
    };
    if (const char* why = parse_line(line, feature, label, key, blank)) {
      if (trim(line).find('\r') != std::string_view::npos) why = kCarriageReturn;  // the likelier cause
      if (malformed(why, "")) return;
      continue;
    }
    if (blank) continue;
    std::uint32_t id;
    if (!last_key.empty() && key == last_key) {
      id = last_id;  // lines of one key usually follow each other
    } else {
      auto it = ids.find(key);
      if (it == ids.end()) {
        if (!key_names_a_file(key)) {
          if (malformed("", "key '" + std::string(key) + "' cannot name a file (empty, '.', '..' or contains '/')"))
            return;
          continue;
        }
        if (key.find('\r') != std::string_view::npos) {
          if (malformed(kCarriageReturn, "")) return;
          continue;
        }
        if (detail::utf8_length(key) < 0) {  // Python could not name it: a file written as GBK or Latin-1
          if (malformed("key is not UTF-8 text: index files are read as UTF-8 (save this one as UTF-8)", "")) return;
          continue;
        }
        id = static_cast<std::uint32_t>(c.keys.size());
        c.keys.push_back(key);
        ids.emplace(key, id);
      } else {
        id = it->second;
      }
      last_key = key;
      last_id = id;
    }
    const std::size_t sample = c.key.size();
    c.feature.push_back(narrow(feature, sample, c.wide_feature));
    c.label.push_back(narrow(label, sample, c.wide_label));
    c.key.push_back(id);
  }
}

// Splits `text` into chunks of about kChunkBytes ending after a newline. A UTF-8 byte-order mark at its start
// (what Windows editors and `encoding="utf-8-sig"` write) is not part of the first line.
void split(std::string_view text, std::size_t file, std::vector<Chunk>& out) {
  std::size_t begin = text.starts_with("\xEF\xBB\xBF") ? 3 : 0;
  while (begin < text.size()) {
    std::size_t end = std::min(text.size(), begin + kChunkBytes);
    if (end < text.size()) {
      const void* nl = std::memchr(text.data() + end, '\n', text.size() - end);
      end = nl == nullptr ? text.size() : static_cast<std::size_t>(static_cast<const char*>(nl) - text.data()) + 1;
    }
    Chunk c;
    c.file = file;
    c.begin = begin;
    c.end = end;
    out.push_back(std::move(c));
    begin = end;
  }
}

// Runs f(i) for i in [0, n) on up to `threads` threads; the first exception is rethrown.
template <typename F>
void parallel_for(std::size_t n, std::size_t threads, F&& f) {
  threads = std::max<std::size_t>(1, std::min(threads, n));
  std::atomic<std::size_t> next{0};
  std::exception_ptr error;
  std::atomic<bool> failed{false};
  auto work = [&] {
    for (std::size_t i; !failed.load(std::memory_order_relaxed) && (i = next.fetch_add(1)) < n;) {
      try {
        f(i);
      } catch (...) {
        if (!failed.exchange(true)) error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

// The columns of an index owned by this process.
struct OwnedColumns {
  std::unique_ptr<std::int32_t[]> feature, label;
  std::unique_ptr<std::uint32_t[]> key;
  std::vector<WideValue> wide_feature, wide_label;
  std::vector<IndexCheckpoint> checkpoints;
};

IndexColumns own(std::shared_ptr<OwnedColumns> owned, std::size_t n) {
  IndexColumns c;
  c.feature = {owned->feature.get(), n};
  c.label = {owned->label.get(), n};
  c.key = {owned->key.get(), n};
  c.wide_feature = owned->wide_feature;
  c.wide_label = owned->wide_label;
  c.checkpoints = owned->checkpoints;
  c.owner = std::move(owned);
  return c;
}

// A collecting parse: lists the malformed lines (numbered) and the files left out whole, whose chunks are emptied;
// the other chunks' malformed lines are then no error.
void collect_problems(const std::vector<std::string>& paths, std::vector<Chunk>& chunks, IndexProblems& problems) {
  auto add = [&](const std::string& path, std::uint64_t line, std::string why) {
    ++problems.total;
    if (problems.listed.size() < problems.limit || line == 0) problems.listed.push_back({path, line, std::move(why)});
  };
  std::vector<const char*> left_out(paths.size(), nullptr);
  for (const Chunk& c : chunks) {
    if (c.nul) left_out[c.file] = "NUL byte in index file (is it a text file?)";
    if (c.garbage && left_out[c.file] == nullptr) left_out[c.file] = "too many malformed lines (is it an index file?)";
  }
  for (std::size_t f = 0; f < paths.size(); ++f) {
    std::uint64_t line = 0;
    for (Chunk& c : chunks) {
      if (c.file != f) continue;
      if (left_out[f] != nullptr) {
        c = Chunk{.file = c.file, .begin = c.begin, .end = c.end};
        continue;
      }
      for (const BadLine& b : c.bad) add(paths[f], line + b.line, b.why);
      line += c.lines;
    }
    if (left_out[f] != nullptr) add(paths[f], 0, left_out[f]);
  }
}

}  // namespace

SampleIndex::SampleIndex(std::vector<std::string> keys_, std::vector<std::string> sources_,
                         std::vector<std::uint64_t> source_begin, std::vector<bool> text_sources, IndexColumns columns)
    : keys(std::move(keys_)),
      sources(std::move(sources_)),
      columns_(std::move(columns)),
      source_begin_(std::move(source_begin)),
      text_sources_(std::move(text_sources)) {}

std::int64_t SampleIndex::value(std::span<const std::int32_t> column, std::span<const WideValue> wide, std::size_t i) {
  const std::int32_t v = column[i];
  if (v != kWide) return v;
  auto it =
      std::lower_bound(wide.begin(), wide.end(), i, [](const WideValue& w, std::size_t id) { return w.sample < id; });
  return it != wide.end() && it->sample == i ? it->value : static_cast<std::int64_t>(kWide);
}

void SampleIndex::add(std::int64_t feature, std::int64_t label, std::string_view key, std::uint32_t source_id,
                      std::uint64_t line_no) {
  auto it = key_ids_.find(std::string(key));
  std::uint32_t id;
  if (it == key_ids_.end()) {
    if (!key_names_a_file(key)) {
      throw InvalidArgument((source_id < sources.size() ? sources[source_id] : std::string("<index>")) + ":" +
                            std::to_string(line_no) + ": key '" + std::string(key) + "' cannot name a file");
    }
    id = static_cast<std::uint32_t>(keys.size());
    keys.emplace_back(key);
    key_ids_.emplace(keys.back(), id);
  } else {
    id = it->second;
  }
  pending_feature_.push_back(feature);
  pending_label_.push_back(label);
  pending_key_.push_back(id);
  pending_source_.push_back(source_id);
  pending_line_.push_back(line_no);
}

void SampleIndex::finish() {
  if (pending_key_.empty()) return;
  const std::size_t old = size();
  const std::size_t n = old + pending_key_.size();
  auto owned = std::make_shared<OwnedColumns>();
  owned->feature = std::make_unique_for_overwrite<std::int32_t[]>(n);
  owned->label = std::make_unique_for_overwrite<std::int32_t[]>(n);
  owned->key = std::make_unique_for_overwrite<std::uint32_t[]>(n);
  auto lines = std::make_shared<std::vector<std::uint64_t>>();
  for (std::size_t i = 0; i < old; ++i) {
    owned->feature[i] = columns_.feature[i];
    owned->label[i] = columns_.label[i];
    owned->key[i] = columns_.key[i];
    lines->push_back(lines_ ? (*lines_)[i] : i + 1);
  }
  owned->wide_feature.assign(columns_.wide_feature.begin(), columns_.wide_feature.end());
  owned->wide_label.assign(columns_.wide_label.begin(), columns_.wide_label.end());
  for (std::size_t j = 0; j < pending_key_.size(); ++j) {
    owned->feature[old + j] = narrow(pending_feature_[j], old + j, owned->wide_feature);
    owned->label[old + j] = narrow(pending_label_[j], old + j, owned->wide_label);
    owned->key[old + j] = pending_key_[j];
    lines->push_back(pending_line_[j]);
  }
  // Sources in the order samples name them (add() is called source by source).
  source_begin_.assign(sources.size(), n);
  text_sources_.assign(sources.size(), false);
  for (std::size_t j = pending_source_.size(); j-- > 0;) {
    if (pending_source_[j] < sources.size()) source_begin_[pending_source_[j]] = old + j;
  }
  columns_ = own(std::move(owned), n);
  lines_ = std::move(lines);
  private_bytes_ = 12 * n;
  pending_feature_.clear();
  pending_label_.clear();
  pending_key_.clear();
  pending_source_.clear();
  pending_line_.clear();
}

std::string SampleIndex::where(std::size_t i) const {
  if (lines_) {
    // Built with add(): the source is the last one starting at or before i.
    std::size_t s = 0;
    for (std::size_t k = 0; k < source_begin_.size(); ++k) {
      if (source_begin_[k] <= i && source_begin_[k] >= source_begin_[s]) s = k;
    }
    return (s < sources.size() ? sources[s] : std::string("<index>")) + ":" + std::to_string((*lines_)[i]);
  }
  const auto& cps = columns_.checkpoints;
  auto it = std::upper_bound(cps.begin(), cps.end(), i,
                             [](std::size_t id, const IndexCheckpoint& c) { return id < c.sample; });
  if (it == cps.begin()) {
    // A list source: line = position in it + 1.
    auto sb = std::upper_bound(source_begin_.begin(), source_begin_.end(), i);
    const std::size_t s = sb == source_begin_.begin() ? 0 : static_cast<std::size_t>(sb - source_begin_.begin()) - 1;
    return (s < sources.size() ? sources[s] : std::string("<index>")) + ":" +
           std::to_string(i - (s < source_begin_.size() ? source_begin_[s] : 0) + 1);
  }
  const IndexCheckpoint& cp = *(it - 1);
  const std::string& name = cp.source < sources.size() ? sources[cp.source] : std::string("<index>");
  // Count non-blank lines from the checkpoint; the text may have changed since it was compiled.
  try {
    File file = File::open(name);
    auto map = MappedFile::map(file);
    std::string_view text(reinterpret_cast<const char*>(map->data()), map->size());
    std::uint64_t line = cp.line;
    std::uint64_t wanted = i - cp.sample;
    for (std::size_t pos = cp.offset; pos < text.size(); ++line) {
      std::size_t nl = text.find('\n', pos);
      if (nl == std::string_view::npos) nl = text.size();
      if (!trim(text.substr(pos, nl - pos)).empty() && wanted-- == 0) return name + ":" + std::to_string(line);
      pos = nl + 1;
    }
  } catch (const std::exception&) {
  }
  return name + ": sample " + std::to_string(i) + " (line unknown: the file changed since it was read)";
}

IndexFileIdentity index_file_identity(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) throw OsError(errno, path, "cannot open");
  IndexFileIdentity id;
  std::error_code ec;
  auto abs = std::filesystem::absolute(path, ec);
  id.path = ec ? path : abs.lexically_normal().string();
  id.size = static_cast<std::uint64_t>(st.st_size);
  id.mtime_ns = static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  id.inode = static_cast<std::uint64_t>(st.st_ino);
  id.device = static_cast<std::uint64_t>(st.st_dev);
  return id;
}

SampleIndex read_index_files(const std::vector<std::string>& paths, std::size_t threads, IndexProblems* problems) {
  // Map every file (the text stays in the page cache, not in this process's memory), then parse chunks.
  std::vector<std::shared_ptr<MappedFile>> maps;
  std::vector<std::string_view> texts;
  std::vector<Chunk> chunks;
  for (std::size_t f = 0; f < paths.size(); ++f) {
    File file = File::open(paths[f]);
    maps.push_back(MappedFile::map(file));
    texts.emplace_back(reinterpret_cast<const char*>(maps.back()->data()), maps.back()->size());
    split(texts.back(), f, chunks);
  }
  for (Chunk& c : chunks) c.collect = problems != nullptr;
  parallel_for(chunks.size(), threads, [&](std::size_t i) { parse_chunk(texts[chunks[i].file], chunks[i]); });

  // The first error, in file order: a NUL byte anywhere in a file, else its first malformed line.
  if (problems != nullptr) collect_problems(paths, chunks, *problems);
  std::size_t first = 0;
  for (std::size_t f = 0; f < paths.size(); ++f) {
    std::uint64_t line = 0;
    for (; first < chunks.size() && chunks[first].file == f; ++first) {
      if (chunks[first].nul) throw InvalidArgument(paths[f] + ": NUL byte in index file (is it a text file?)");
    }
    for (Chunk& c : chunks) {
      if (c.file != f) continue;
      if (c.why != nullptr) {
        throw InvalidArgument(
            line_message(paths[f], line + c.error_line, *c.why ? std::string(c.why) : c.why_text, c.error_text));
      }
      c.first_line = line + 1;
      line += c.lines;
    }
  }

  // Keys in order of first appearance: the chunks' own lists, in chunk order.
  std::vector<std::string> keys;
  std::unordered_map<std::string_view, std::uint32_t> key_ids;
  std::vector<std::vector<std::uint32_t>> remap(chunks.size());
  std::vector<std::uint64_t> chunk_begin(chunks.size() + 1, 0);
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    for (std::string_view k : chunks[i].keys) {
      auto [it, added] = key_ids.emplace(k, static_cast<std::uint32_t>(keys.size()));
      if (added) keys.emplace_back(k);
      remap[i].push_back(it->second);
    }
    chunk_begin[i + 1] = chunk_begin[i] + chunks[i].key.size();
  }
  const std::size_t n = chunk_begin.back();
  auto owned = std::make_shared<OwnedColumns>();
  owned->feature = std::make_unique_for_overwrite<std::int32_t[]>(n);
  owned->label = std::make_unique_for_overwrite<std::int32_t[]>(n);
  owned->key = std::make_unique_for_overwrite<std::uint32_t[]>(n);
  parallel_for(chunks.size(), threads, [&](std::size_t i) {
    Chunk& c = chunks[i];
    const std::size_t at = chunk_begin[i];
    std::copy(c.feature.begin(), c.feature.end(), owned->feature.get() + at);
    std::copy(c.label.begin(), c.label.end(), owned->label.get() + at);
    for (std::size_t j = 0; j < c.key.size(); ++j) owned->key[at + j] = remap[i][c.key[j]];
    std::vector<std::int32_t>().swap(c.feature);
    std::vector<std::int32_t>().swap(c.label);
    std::vector<std::uint32_t>().swap(c.key);
  });
  std::vector<std::uint64_t> source_begin(paths.size(), n);
  for (std::size_t i = chunks.size(); i-- > 0;) {
    const Chunk& c = chunks[i];
    source_begin[c.file] = chunk_begin[i];
    for (const WideValue& w : c.wide_feature) owned->wide_feature.push_back({chunk_begin[i] + w.sample, w.value});
    for (const WideValue& w : c.wide_label) owned->wide_label.push_back({chunk_begin[i] + w.sample, w.value});
  }
  for (std::size_t f = paths.size(); f-- > 1;) source_begin[f - 1] = std::min(source_begin[f - 1], source_begin[f]);
  auto by_sample = [](const WideValue& a, const WideValue& b) { return a.sample < b.sample; };
  std::sort(owned->wide_feature.begin(), owned->wide_feature.end(), by_sample);
  std::sort(owned->wide_label.begin(), owned->wide_label.end(), by_sample);
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    if (chunk_begin[i + 1] == chunk_begin[i]) continue;  // no samples: no checkpoint
    owned->checkpoints.push_back({chunk_begin[i], chunks[i].begin, chunks[i].first_line, chunks[i].file});
    // A line left out is not a sample: where() counts on from after it.
    for (const BadLine& b : chunks[i].bad) {
      if (b.next_sample < chunk_begin[i + 1] - chunk_begin[i])
        owned->checkpoints.push_back(
            {chunk_begin[i] + b.next_sample, b.next_offset, chunks[i].first_line + b.line, chunks[i].file});
    }
  }
  IndexColumns columns = own(std::move(owned), n);
  SampleIndex index(std::move(keys), paths, std::move(source_begin), std::vector<bool>(paths.size(), true),
                    std::move(columns));
  index.set_private_bytes(12 * n);
  return index;
}

SampleIndex index_from_columns(std::span<const std::int64_t> feature, std::span<const std::int64_t> label,
                               const std::vector<std::string>& keys, const std::string& name) {
  if (feature.size() != label.size() || feature.size() != keys.size()) {
    throw InvalidArgument("index columns differ in length");
  }
  SampleIndex index;
  index.sources.push_back(name);
  for (std::size_t i = 0; i < feature.size(); ++i) index.add(feature[i], label[i], keys[i], 0, i + 1);
  index.finish();
  return index;
}

SampleIndex keys_only_index(const std::vector<std::string>& keys, const std::string& name) {
  SampleIndex index;
  index.keys = keys;
  index.sources.push_back(name);
  index.finish();
  return index;
}

}  // namespace npyfeed
