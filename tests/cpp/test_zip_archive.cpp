// The zip container of `.npz` (zip_archive) and the member reader (npz): archives built here in memory, good
// and hostile (duplicates, overlaps, truncation, bombs, bad CRC, ZIP64, data descriptors), and deflated members
// inflated with zlib where npyfeed was built with it (else a clear error).
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "check.hpp"
#include "npy_writer.hpp"
#include "npyfeed/common/errors.hpp"
#include "npyfeed/common/thread_pool.hpp"
#include "npyfeed/format/npz.hpp"
#include "npyfeed/format/zip_archive.hpp"
#include "npyfeed/io/loader.hpp"

#ifdef NPYFEED_TEST_HAVE_ZLIB
#include <zlib.h>
#endif

using namespace npyfeed;
using npyfeed::test::contains;
using npyfeed::test::TempDir;

namespace {

using Bytes = std::vector<std::byte>;

void put16(Bytes& b, std::uint32_t v) {
  b.push_back(std::byte(v & 0xff));
  b.push_back(std::byte((v >> 8) & 0xff));
}
void put32(Bytes& b, std::uint32_t v) {
  put16(b, v & 0xffff);
  put16(b, v >> 16);
}
void put64(Bytes& b, std::uint64_t v) {
  put32(b, static_cast<std::uint32_t>(v));
  put32(b, static_cast<std::uint32_t>(v >> 32));
}
void put(Bytes& b, const std::string& s) {
  for (char c : s) b.push_back(std::byte(static_cast<unsigned char>(c)));
}

Bytes deflate_bytes(const Bytes& data) {
#ifdef NPYFEED_TEST_HAVE_ZLIB
  z_stream z{};
  deflateInit2(&z, 6, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
  Bytes out(deflateBound(&z, data.size()));
  z.next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(data.data()));
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
#else
  // Stored deflate blocks (no zlib to compress with): still a valid deflate stream.
  Bytes out;
  std::size_t at = 0;
  do {
    const std::size_t n = std::min<std::size_t>(data.size() - at, 65535);
    out.push_back(std::byte(at + n == data.size() ? 1 : 0));
    put16(out, static_cast<std::uint32_t>(n));
    put16(out, static_cast<std::uint32_t>(~n & 0xffff));
    out.insert(out.end(), data.begin() + at, data.begin() + at + n);
    at += n;
  } while (at < data.size());
  return out;
#endif
}

struct Entry {
  std::string name;
  Bytes content;  // uncompressed
  bool deflate = false;
  bool zip64_local = false;      // a ZIP64 extra field in the local header, as np.savez writes (force_zip64)
  bool zip64_central = false;    // sizes and offset only in the central ZIP64 extra field
  bool descriptor = false;       // flag bit 3: zero sizes in the local header, a data descriptor after the data
  std::int64_t crc_delta = 0;    // corrupt the recorded CRC
  std::int64_t usize_delta = 0;  // lie about the uncompressed size
};

// An archive as Python's zipfile writes it; `entries_override` / `cut` make broken ones.
Bytes zip_of(const std::vector<Entry>& entries, std::uint64_t second_at = 0) {
  Bytes out, central;
  std::vector<std::uint64_t> offsets;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    Bytes data = e.deflate ? deflate_bytes(e.content) : e.content;
    const std::uint32_t crc =
        static_cast<std::uint32_t>(crc32_update(0, e.content.data(), e.content.size()) + e.crc_delta);
    const std::uint64_t usize = e.content.size() + e.usize_delta;
    std::uint64_t offset = out.size();
    if (i == 1 && second_at != 0) offset = second_at;  // the second entry lives inside the first one's bytes
    offsets.push_back(offset);
    if (!(i == 1 && second_at != 0)) {
      put32(out, 0x04034b50);
      put16(out, 45);
      put16(out, e.descriptor ? 8 : 0);
      put16(out, e.deflate ? 8 : 0);
      put32(out, 0);
      put32(out, e.descriptor ? 0 : crc);
      put32(out, e.descriptor ? 0 : (e.zip64_local ? 0xFFFFFFFFu : static_cast<std::uint32_t>(data.size())));
      put32(out, e.descriptor ? 0 : (e.zip64_local ? 0xFFFFFFFFu : static_cast<std::uint32_t>(usize)));
      put16(out, static_cast<std::uint32_t>(e.name.size()));
      put16(out, e.zip64_local ? 20 : 0);
      put(out, e.name);
      if (e.zip64_local) {
        put16(out, 1);
        put16(out, 16);
        put64(out, usize);
        put64(out, data.size());
      }
      out.insert(out.end(), data.begin(), data.end());
      if (e.descriptor) {
        put32(out, 0x08074b50);
        put32(out, crc);
        put32(out, static_cast<std::uint32_t>(data.size()));
        put32(out, static_cast<std::uint32_t>(usize));
      }
    }
    put32(central, 0x02014b50);
    put16(central, 45);
    put16(central, 45);
    put16(central, e.descriptor ? 8 : 0);
    put16(central, e.deflate ? 8 : 0);
    put32(central, 0);
    put32(central, crc);
    put32(central, e.zip64_central ? 0xFFFFFFFFu : static_cast<std::uint32_t>(data.size()));
    put32(central, e.zip64_central ? 0xFFFFFFFFu : static_cast<std::uint32_t>(usize));
    put16(central, static_cast<std::uint32_t>(e.name.size()));
    put16(central, e.zip64_central ? 28 : 0);
    put16(central, 0);
    put16(central, 0);
    put16(central, 0);
    put32(central, 0);
    put32(central, e.zip64_central ? 0xFFFFFFFFu : static_cast<std::uint32_t>(offset));
    put(central, e.name);
    if (e.zip64_central) {
      put16(central, 1);
      put16(central, 24);
      put64(central, usize);
      put64(central, data.size());
      put64(central, offset);
    }
  }
  const std::uint64_t cd_at = out.size();
  out.insert(out.end(), central.begin(), central.end());
  put32(out, 0x06054b50);
  put16(out, 0);
  put16(out, 0);
  put16(out, static_cast<std::uint32_t>(entries.size()));
  put16(out, static_cast<std::uint32_t>(entries.size()));
  put32(out, static_cast<std::uint32_t>(central.size()));
  put32(out, static_cast<std::uint32_t>(cd_at));
  put16(out, 0);
  return out;
}

ReadAt reader_of(const Bytes& bytes) {
  return [&bytes](std::byte* dest, std::size_t length, std::uint64_t offset) -> std::size_t {
    if (offset >= bytes.size() || length == 0) return 0;
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(length, bytes.size() - offset));
    std::memcpy(dest, bytes.data() + offset, n);
    return n;
  };
}

Bytes npy_bytes(std::size_t n_floats, std::uint64_t seed) {
  std::string shape = std::to_string(n_floats);  // built by appending: GCC 12 warns (falsely) on "(" + string
  shape.insert(shape.begin(), '(');
  shape += ",)";
  std::string head = npyfeed::test::npy_header("<f4", shape);
  Bytes b;
  put(b, head);
  Bytes data = npyfeed::test::pattern(n_floats * 4, seed);
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

Bytes read_all(const Bytes& zip, const ZipMember& m) {
  MemberStream s(reader_of(zip), m);
  Bytes out(m.uncompressed_size);
  s.read(out.data(), out.size());
  s.finish();
  return out;
}

std::string refusal(const Bytes& zip) {
  auto e = CHECK_THROWS(NpyFormatError, read_zip_directory(reader_of(zip), zip.size()));
  return e ? e->reason() : std::string();
}

}  // namespace

TEST_CASE("a stored archive: members, names, offsets and contents") {
  Bytes a = npy_bytes(100, 1), b = npy_bytes(7, 2);
  Bytes zip = zip_of({{"a.npy", a}, {"dir/b.npy", b, false, true}});
  auto members = read_zip_directory(reader_of(zip), zip.size());
  REQUIRE(members.size() == 2);
  CHECK_EQ(members[0].name, std::string("a.npy"));
  CHECK_EQ(members[0].data_offset, std::uint64_t{30 + 5});
  CHECK_EQ(members[1].name, std::string("dir/b.npy"));
  CHECK(members[1].data_offset == members[1].header_offset + 30 + 9 + 20);  // the local ZIP64 extra counts
  CHECK(read_all(zip, members[0]) == a);
  CHECK(read_all(zip, members[1]) == b);
  CHECK_EQ(npz_key("a.npy"), std::string("a"));
  CHECK_EQ(npz_key("dir/b.npy"), std::string("dir/b"));
  CHECK_EQ(npz_key("c.txt"), std::string("c.txt"));
}

TEST_CASE("ZIP64 central fields and data descriptors") {
  Bytes a = npy_bytes(50, 3), b = npy_bytes(60, 4);
  Entry e1{"a.npy", a};
  e1.zip64_central = true;
  Entry e2{"b.npy", b};
  e2.descriptor = true;
  Bytes zip = zip_of({e1, e2});
  auto members = read_zip_directory(reader_of(zip), zip.size());
  REQUIRE(members.size() == 2);
  CHECK(read_all(zip, members[0]) == a);
  CHECK(read_all(zip, members[1]) == b);
}

TEST_CASE("deflated members inflate, or say that zlib is missing") {
  Bytes a = npy_bytes(5000, 5);
  for (std::size_t i = 0; i < 2000; ++i) a[200 + i] = std::byte(0);  // something to compress
  Entry e{"a.npy", a, true};
  Bytes zip = zip_of({e});
  auto members = read_zip_directory(reader_of(zip), zip.size());
  REQUIRE(members.size() == 1);
  CHECK_EQ(members[0].method, std::uint16_t{8});
  if (have_inflate()) {
    CHECK(read_all(zip, members[0]) == a);
  } else {
    auto error = CHECK_THROWS(NpyFormatError, MemberStream(reader_of(zip), members[0]));
    CHECK(error && contains(error->reason(), "without zlib") && contains(error->reason(), "a.npy"));
  }
}

TEST_CASE("CRC-32 mismatches are refused after the last byte") {
  Entry stored{"a.npy", npy_bytes(10, 6)};
  stored.crc_delta = 1;
  Bytes zip = zip_of({stored});
  auto members = read_zip_directory(reader_of(zip), zip.size());
  auto error = CHECK_THROWS(NpyFormatError, read_all(zip, members[0]));
  CHECK(error && contains(error->reason(), "CRC-32") && contains(error->reason(), "'a.npy'"));
  CHECK_EQ(crc32_update(0, reinterpret_cast<const std::byte*>("123456789"), 9), 0xCBF43926u);
}

TEST_CASE("deflated streams that lie about their size are refused") {
  if (!have_inflate()) return;
  Entry longer{"a.npy", npy_bytes(100, 7), true};
  longer.usize_delta = -10;  // the stream inflates to more than announced
  Bytes zip = zip_of({longer});
  auto members = read_zip_directory(reader_of(zip), zip.size());
  auto error = CHECK_THROWS(NpyFormatError, read_all(zip, members[0]));
  CHECK(error && contains(error->reason(), "more than its announced"));
  Entry shorter{"b.npy", npy_bytes(100, 7), true};
  shorter.usize_delta = 10;  // fewer bytes than announced
  zip = zip_of({shorter});
  members = read_zip_directory(reader_of(zip), zip.size());
  error = CHECK_THROWS(NpyFormatError, read_all(zip, members[0]));
  CHECK(error && contains(error->reason(), "'b.npy'"));
}

TEST_CASE("hostile directories are refused with the member named") {
  Bytes a = npy_bytes(10, 8);
  CHECK(contains(refusal(zip_of({{"a.npy", a}, {"a.npy", a}})), "appears twice"));
  // Overlap: b.npy's local header and data lie inside a.npy's data (which is a whole zip of b.npy).
  Bytes inner = zip_of({{"b.npy", a}});
  CHECK(contains(refusal(zip_of({{"a.npy", inner}, {"b.npy", a}}, /*second_at=*/30 + 5)), "overlaps"));
  CHECK(contains(refusal(zip_of({{"", a}})), "empty name"));
  CHECK(contains(refusal(zip_of({{std::string("a\0b", 3), a}})), "NUL"));
  Entry bomb{"bomb.npy", a};
  bomb.deflate = true;
  bomb.usize_delta = 100000000;
  CHECK(contains(refusal(zip_of({bomb})), "zip bomb"));
  Entry stored_lie{"s.npy", a};
  stored_lie.usize_delta = 5;
  CHECK(contains(refusal(zip_of({stored_lie})), "sizes differ"));
  Bytes zip = zip_of({{"a.npy", a}, {"b.npy", a}});
  // Truncated: every cut through the directory and end record is refused, never read past.
  for (std::size_t cut = 1; cut < 80; ++cut) {
    Bytes part(zip.begin(), zip.end() - static_cast<std::ptrdiff_t>(cut));
    CHECK_THROWS(NpyFormatError, read_zip_directory(reader_of(part), part.size()));
  }
  // One entry fewer in the directory than the end record announces.
  Bytes fewer = zip;
  fewer[fewer.size() - 22 + 10] = std::byte(3);
  fewer[fewer.size() - 22 + 8] = std::byte(3);
  CHECK(contains(refusal(fewer), "truncated"));
  CHECK(contains(refusal(Bytes(100, std::byte(0))), "does not start with a zip signature"));
  Bytes local_only;
  put32(local_only, 0x04034b50);
  local_only.resize(100);
  CHECK(contains(refusal(local_only), "no end of central directory"));
  local_only.resize(10);
  CHECK(contains(refusal(local_only), "too short"));
}

TEST_CASE("NpzArchive: views for aligned stored members, copies otherwise, keys and errors") {
  TempDir dir;
  Bytes a = npy_bytes(1000, 9);
  // "align1.npy": its data at 30 + 10 + 128, 8-aligned in the archive; the second is stored and misaligned
  // (at 4168 + 30 + 9 + 128); the third deflated.
  Bytes zip = zip_of({{"align1.npy", a}, {"odd_s.npy", a}, {"odd.npy", a, have_inflate()}});
  const std::string path = dir.file("x.npz");
  npyfeed::test::write_file(path, std::string(), zip);
  auto archive = NpzArchive::open(path);
  REQUIRE(archive->members().size() == 3);
  CHECK_EQ(archive->find("odd"), std::size_t{2});
  auto missing = CHECK_THROWS(InvalidArgument, archive->find("nope"));
  CHECK(missing && contains(missing->what(), "'align1'") && contains(missing->what(), path));
  CHECK_EQ(archive->members()[0].data_offset + 128, std::uint64_t{168});
  CHECK((archive->members()[1].data_offset + 128) % 4 != 0);
  for (std::size_t i = 0; i < 3; ++i) {
    for (ReadMode mode : {ReadMode::kMmap, ReadMode::kRead}) {
      bool view = false;
      auto reader = archive->open_member(i, mode, kDefaultMaxHeaderSize, &view);
      const NpyHeader& h = reader->header();
      CHECK_EQ(h.nbytes, std::uint64_t{4000});
      CHECK(std::memcmp(reader->view(), a.data() + h.data_offset, 4000) == 0);
      const std::uint64_t at = archive->members()[i].data_offset + h.data_offset;
      if (mode == ReadMode::kRead || !archive->members()[i].is_stored()) {
        CHECK(!view);
        CHECK(reinterpret_cast<std::uintptr_t>(reader->view()) % 64 == 0);
      } else {
        CHECK_EQ(view, i == 0);
        CHECK_EQ(view, at % 4 == 0);
      }
      CHECK_EQ(reader->view_writable(), mode == ReadMode::kRead);
    }
  }
  // A member that is not a .npy array: refused, naming archive and member.
  npyfeed::test::write_file(path, std::string(), zip_of({{"notes.txt", Bytes(100, std::byte('x'))}}));
  auto error = CHECK_THROWS(NpyFormatError, NpzArchive::open(path)->open_member(0, ReadMode::kRead, 10000));
  CHECK(error && error->path() == path && contains(error->reason(), "'notes.txt'"));
  // Two members with one key.
  npyfeed::test::write_file(path, std::string(), zip_of({{"a", a}, {"a.npy", a}}));
  error = CHECK_THROWS(NpyFormatError, NpzArchive::open(path));
  CHECK(error && contains(error->reason(), "both give the key 'a'"));
}

TEST_CASE("NpzLoad: every member of several archives, in directory order, equal to what was written") {
  TempDir dir;
  const Bytes a = npy_bytes(1000, 3), b = npy_bytes(10, 4), c = npy_bytes(4097, 5);
  std::vector<std::string> paths{dir.file("one.npz"), dir.file("two.npz")};
  npyfeed::test::write_file(paths[0], std::string(), zip_of({{"a.npy", a}, {"b.npy", b, have_inflate()}}));
  npyfeed::test::write_file(paths[1], std::string(), zip_of({{"c.npy", c, have_inflate()}}));
  for (ReadMode mode : {ReadMode::kMmap, ReadMode::kRead}) {
    LoadOptions options;
    options.mode = mode;
    options.threads = 3;
    NpzLoad load(paths, options);
    load.start_directories(shared_pool())->wait();
    load.start_members(shared_pool())->wait();
    const auto& members = load.results();
    REQUIRE(members.size() == 3u);
    const Bytes* written[] = {&a, &b, &c};
    const std::size_t archive_of[] = {0, 0, 1};
    for (std::size_t i = 0; i < 3; ++i) {
      const NpzLoad::Member& m = members[i];
      CHECK_EQ(m.archive, archive_of[i]);
      CHECK_EQ(m.array.path, paths[archive_of[i]]);
      const NpyHeader& h = m.array.header;
      REQUIRE(h.nbytes + h.data_offset == written[i]->size());
      CHECK(std::memcmp(m.array.data, written[i]->data() + h.data_offset, h.nbytes) == 0);
    }
  }
  // A missing archive fails the directory phase, naming it.
  std::vector<std::string> missing{paths[0], dir.file("gone.npz")};
  NpzLoad broken(missing, LoadOptions{});
  auto error = CHECK_THROWS(OsError, broken.start_directories(shared_pool())->wait());
  CHECK(error && error->path() == missing[1]);
}
