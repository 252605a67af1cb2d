// read_zip_index (see torch_zip_read.hpp). The zip facts (APPNOTE.TXT) as torch_zip.cpp writes
// them: the end record (and the zip64 end record its locator points to), the central directory's
// headers (zip64 sizes and offsets in the 0x0001 extra field where a 32-bit field is saturated),
// and each record's local header, whose name and extra field lengths place its data.
#include "daemon/formats/torch_zip_read.hpp"

#include <zlib.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "common/errors.hpp"
#include "common/text.hpp"

namespace thetad::daemon {
namespace {

constexpr uint32_t kLocalSig = 0x04034b50, kCentralSig = 0x02014b50, kEndSig = 0x06054b50;
constexpr uint32_t kEnd64Sig = 0x06064b50, kLocatorSig = 0x07064b50;
constexpr uint64_t kLocal = 30, kCentral = 46, kEnd = 22, kLocator = 20, kEnd64 = 56;
constexpr uint64_t kMax32 = 0xFFFFFFFFu;

class Reader {
 public:
  Reader(const char* data, size_t size, const std::string& file)
      : p_(reinterpret_cast<const unsigned char*>(data)), n_(size), file_(file) {}
  [[noreturn]] void fail(const std::string& what) const {
    throw ConfigError(file_ + ": not a PyTorch archive (torch.save's zip format): " + what);
  }
  // `width` bytes at `at`, little-endian; `what` names the field where they lie past the end.
  uint64_t le(uint64_t at, unsigned width, const char* what) const {
    if (at > n_ || width > n_ - at) fail(std::string(what) + " lies past the end of the file");
    uint64_t v = 0;
    for (unsigned i = width; i-- > 0;) v = (v << 8) | p_[at + i];
    return v;
  }
  std::string text(uint64_t at, uint64_t len, const char* what) const {
    if (at > n_ || len > n_ - at) fail(std::string(what) + " lies past the end of the file");
    return std::string(reinterpret_cast<const char*>(p_ + at), len);
  }
  size_t size() const { return n_; }

 private:
  const unsigned char* p_;
  size_t n_;
  const std::string& file_;
};

struct Directory {
  uint64_t entries = 0, at = 0, size = 0, end = 0;  // end: where the end records start
};

// The end record: the last one whose comment runs exactly to the end of the file.
Directory find_directory(const Reader& r) {
  const uint64_t n = r.size();
  if (n < kEnd) r.fail(std::to_string(n) + " bytes, fewer than a zip end record");
  const uint64_t lowest = n - kEnd > 0xFFFF ? n - kEnd - 0xFFFF : 0;
  for (uint64_t at = n - kEnd + 1; at-- > lowest;) {
    if (r.le(at, 4, "the end record") != kEndSig || r.le(at + 20, 2, "the end record") != n - kEnd - at) continue;
    Directory d;
    if (r.le(at + 4, 2, "the end record") != 0 || r.le(at + 6, 2, "the end record") != 0)
      r.fail("an archive of several disks");
    d.entries = r.le(at + 10, 2, "the end record");
    d.size = r.le(at + 12, 4, "the end record");
    d.at = r.le(at + 16, 4, "the end record");
    d.end = at;
    if (at >= kLocator && r.le(at - kLocator, 4, "the zip64 locator") == kLocatorSig) {
      const uint64_t end64 = r.le(at - kLocator + 8, 8, "the zip64 locator");
      if (end64 > at - kLocator || at - kLocator - end64 < kEnd64 || r.le(end64, 4, "the zip64 end record") != kEnd64Sig)
        r.fail("the zip64 locator points to no zip64 end record");
      d.entries = r.le(end64 + 32, 8, "the zip64 end record");
      d.size = r.le(end64 + 40, 8, "the zip64 end record");
      d.at = r.le(end64 + 48, 8, "the zip64 end record");
      d.end = end64;
    }
    if (d.at > d.end || d.size > d.end - d.at) r.fail("the central directory lies outside the file");
    if (d.entries > d.size / kCentral) r.fail(std::to_string(d.entries) + " entries cannot fit its central directory");
    return d;
  }
  r.fail("no zip end record");
}

struct Entry {
  std::string name;
  uint64_t header_at = 0, size = 0;
  uint32_t crc = 0;
};

// The central header at `at` (advanced past it).
Entry central_entry(const Reader& r, uint64_t& at, uint64_t end) {
  if (end - at < kCentral || r.le(at, 4, "a central header") != kCentralSig) r.fail("a damaged central directory");
  const uint64_t flags = r.le(at + 8, 2, "a central header"), method = r.le(at + 10, 2, "a central header");
  Entry e;
  e.crc = static_cast<uint32_t>(r.le(at + 16, 4, "a central header"));
  uint64_t packed = r.le(at + 20, 4, "a central header"), size = r.le(at + 24, 4, "a central header");
  const uint64_t name_len = r.le(at + 28, 2, "a central header"), extra_len = r.le(at + 30, 2, "a central header"),
                 comment_len = r.le(at + 32, 2, "a central header");
  uint64_t header_at = r.le(at + 42, 4, "a central header");
  if (end - at - kCentral < name_len + extra_len + comment_len) r.fail("a central header runs past the directory");
  e.name = r.text(at + kCentral, name_len, "a record's name");
  const std::string where = "record '" + printable(e.name) + "': ";
  if (flags & 1) r.fail(where + "encrypted");
  if (method != 0) r.fail(where + "compressed (method " + std::to_string(method) + "); torch.save stores records");
  // Zip64: the saturated fields, in this order, in the 0x0001 extra field.
  uint64_t* wide[3] = {&size, &packed, &header_at};
  const uint64_t extra_at = at + kCentral + name_len;
  for (uint64_t x = extra_at; x + 4 <= extra_at + extra_len;) {
    const uint64_t id = r.le(x, 2, "an extra field"), len = r.le(x + 2, 2, "an extra field");
    if (len > extra_at + extra_len - x - 4) r.fail(where + "an extra field runs past its header");
    if (id == 1) {
      uint64_t y = x + 4;
      for (uint64_t* f : wide)
        if (*f == kMax32) {
          if (y + 8 > x + 4 + len) r.fail(where + "a zip64 field is missing");
          *f = r.le(y, 8, "a zip64 field");
          y += 8;
        }
    }
    x += 4 + len;
  }
  for (uint64_t* f : wide)
    if (*f == kMax32) r.fail(where + "a zip64 field is missing");
  if (packed != size) r.fail(where + "its stored and packed sizes differ");
  e.size = size;
  e.header_at = header_at;
  at += kCentral + name_len + extra_len + comment_len;
  return e;
}

}  // namespace

ZipIndex read_zip_index(const char* data, size_t size, const std::string& file) {
  const Reader r(data, size, file);
  const Directory d = find_directory(r);
  ZipIndex index;
  std::vector<std::pair<uint64_t, uint64_t>> spans;  // [header, end of data) of each record
  uint64_t at = d.at;
  for (uint64_t i = 0; i < d.entries; ++i) {
    const Entry e = central_entry(r, at, d.at + d.size);
    const std::string where = "record '" + printable(e.name) + "': ";
    const size_t slash = e.name.find('/');
    if (slash == std::string::npos || slash == 0) r.fail(where + "not within the archive's folder");
    if (i == 0) index.folder = e.name.substr(0, slash);
    else if (e.name.compare(0, slash, index.folder) != 0 || slash != index.folder.size())
      r.fail(where + "outside the folder '" + printable(index.folder) + "' of the first record");
    // The local header: its name the directory's, its data after it and before the directory.
    if (e.header_at > d.at || d.at - e.header_at < kLocal || r.le(e.header_at, 4, "a local header") != kLocalSig)
      r.fail(where + "no local header where the directory says");
    const uint64_t name_len = r.le(e.header_at + 26, 2, "a local header"),
                   extra_len = r.le(e.header_at + 28, 2, "a local header");
    const uint64_t data_at = e.header_at + kLocal + name_len + extra_len;
    if (data_at > d.at || e.size > d.at - data_at) r.fail(where + "its bytes lie past the central directory");
    if (r.text(e.header_at + kLocal, name_len, "a local header") != e.name)
      r.fail(where + "its local header names another record");
    const auto [it, fresh] = index.records.emplace(e.name.substr(slash + 1), ZipRecord{data_at, e.size, e.crc});
    if (!fresh) r.fail(where + "named twice");
    spans.emplace_back(e.header_at, data_at + e.size);
  }
  if (at != d.at + d.size) r.fail("the central directory's size is not its headers'");
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].first < spans[i - 1].second) r.fail("two records share bytes");
  return index;
}

bool zip_crc_matches(const char* data, const ZipRecord& r) {
  uLong crc = ::crc32(0, nullptr, 0);
  const auto* p = reinterpret_cast<const Bytef*>(data + r.data_at);
  for (uint64_t done = 0; done < r.size;) {  // zlib takes 32-bit lengths
    const uint64_t n = std::min<uint64_t>(r.size - done, uint64_t{1} << 30);
    crc = ::crc32(crc, p + done, static_cast<uInt>(n));
    done += n;
  }
  return static_cast<uint32_t>(crc) == r.crc;
}

}  // namespace thetad::daemon
