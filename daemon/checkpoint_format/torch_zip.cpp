// The PyTorch zip archive laid out up front and written in parallel (torch_zip.hpp). The zip
// facts (APPNOTE.TXT): local headers, a central directory and the zip64 end records; records
// stored (method 0), CRC-32 in the local header (no data descriptor), fixed 1980-01-01 times
// so that equal values make equal files. PyTorch's own conventions: every name under "archive/",
// each record's data at a multiple of 64 through a "FB" extra field of 'Z' padding.
#include "daemon/checkpoint_format/torch_zip.hpp"

#include <zlib.h>

#include <algorithm>
#include <atomic>

#include "common/errors.hpp"
#include "daemon/checkpoint_format/file_checksum.hpp"

namespace thetad::daemon {
namespace {

constexpr uint64_t kMax32 = 0xFFFFFFFFu;  // a 32-bit field at this value: the zip64 extra field holds it
constexpr uint16_t kDosDate = (0 << 9) | (1 << 5) | 1;  // 1980-01-01, the zip epoch
constexpr size_t kLocalHeader = 30, kCentralHeader = 46, kEnd64 = 56, kLocator64 = 20, kEnd = 22;

void put16(std::string& s, uint64_t v) {
  for (int b = 0; b < 2; ++b) s.push_back(static_cast<char>((v >> (8 * b)) & 0xFF));
}
void put32(std::string& s, uint64_t v) {
  for (int b = 0; b < 4; ++b) s.push_back(static_cast<char>((v >> (8 * b)) & 0xFF));
}
void put64(std::string& s, uint64_t v) {
  for (int b = 0; b < 8; ++b) s.push_back(static_cast<char>((v >> (8 * b)) & 0xFF));
}

bool big(uint64_t v) { return v >= kMax32; }
// The local header's zip64 field: both sizes, where the size needs it (the offset is the central
// directory's business).
uint64_t local_zip64_bytes(const TorchZipEntry& e) { return big(e.size) ? 4 + 16 : 0; }
uint64_t central_zip64_bytes(const TorchZipEntry& e) {
  const uint64_t fields = (big(e.size) ? 2 : 0) + (big(e.header_at) ? 1 : 0);
  return fields ? 4 + 8 * fields : 0;
}

}  // namespace

TorchZipLayout::TorchZipLayout(const std::vector<std::pair<std::string, uint64_t>>& records) {
  uint64_t at = 0;
  for (const auto& [name, size] : records) {
    TorchZipEntry e;
    e.name = "archive/" + name;
    e.size = size;
    e.header_at = at;
    const uint64_t start = at + kLocalHeader + e.name.size() + local_zip64_bytes(e) + 4;  // 4: the "FB" field's head
    e.data_at = (start + kAlignment - 1) / kAlignment * kAlignment;
    at = e.data_at + size;
    entries_.push_back(std::move(e));
  }
  directory_at_ = at;
  for (const TorchZipEntry& e : entries_) directory_size_ += kCentralHeader + e.name.size() + central_zip64_bytes(e);
  file_size_ = directory_at_ + directory_size_ + kEnd64 + kLocator64 + kEnd;
}

std::string TorchZipLayout::local_header(size_t i, uint32_t crc) const {
  const TorchZipEntry& e = entries_.at(i);
  const uint64_t head = kLocalHeader + e.name.size() + local_zip64_bytes(e) + 4;
  const uint64_t pad = e.data_at - e.header_at - head;
  std::string s;
  s.reserve(e.data_at - e.header_at);
  put32(s, 0x04034b50);
  put16(s, big(e.size) ? 45 : 20);  // version needed: 4.5 for zip64, else 2.0
  put16(s, 0);                      // flags: no data descriptor (the CRC is known)
  put16(s, 0);                      // stored
  put16(s, 0);
  put16(s, kDosDate);
  put32(s, crc);
  put32(s, std::min(e.size, kMax32));  // compressed size: stored, the same
  put32(s, std::min(e.size, kMax32));
  put16(s, e.name.size());
  put16(s, local_zip64_bytes(e) + 4 + pad);
  s += e.name;
  if (big(e.size)) {
    put16(s, 0x0001);
    put16(s, 16);
    put64(s, e.size);
    put64(s, e.size);
  }
  s += "FB";
  put16(s, pad);
  s.append(pad, 'Z');
  THETAD_CHECK(s.size() == e.data_at - e.header_at, InternalError, "zip local header of ", e.name);
  return s;
}

std::string TorchZipLayout::directory(const std::vector<uint32_t>& crcs) const {
  THETAD_CHECK(crcs.size() == entries_.size(), InternalError, "zip directory: ", crcs.size(), " CRCs");
  std::string s;
  s.reserve(file_size_ - directory_at_);
  for (size_t i = 0; i < entries_.size(); ++i) {
    const TorchZipEntry& e = entries_[i];
    const uint64_t zip64 = central_zip64_bytes(e);
    put32(s, 0x02014b50);
    put16(s, 45);  // made by: 4.5, MS-DOS attributes
    put16(s, zip64 ? 45 : 20);
    put16(s, 0);
    put16(s, 0);
    put16(s, 0);
    put16(s, kDosDate);
    put32(s, crcs[i]);
    put32(s, std::min(e.size, kMax32));
    put32(s, std::min(e.size, kMax32));
    put16(s, e.name.size());
    put16(s, zip64);
    put16(s, 0);  // comment
    put16(s, 0);  // disk
    put16(s, 0);  // internal attributes
    put32(s, 0);  // external attributes
    put32(s, std::min(e.header_at, kMax32));
    s += e.name;
    if (zip64) {
      put16(s, 0x0001);
      put16(s, zip64 - 4);
      if (big(e.size)) {
        put64(s, e.size);
        put64(s, e.size);
      }
      if (big(e.header_at)) put64(s, e.header_at);
    }
  }
  // The zip64 end record and its locator always (as PyTorch's writer does), then the classic end
  // record with its fields saturated where they overflow.
  const uint64_t end64_at = directory_at_ + directory_size_, n = entries_.size();
  put32(s, 0x06064b50);
  put64(s, kEnd64 - 12);
  put16(s, 45);
  put16(s, 45);
  put32(s, 0);
  put32(s, 0);
  put64(s, n);
  put64(s, n);
  put64(s, directory_size_);
  put64(s, directory_at_);
  put32(s, 0x07064b50);
  put32(s, 0);
  put64(s, end64_at);
  put32(s, 1);
  put32(s, 0x06054b50);
  put16(s, 0);
  put16(s, 0);
  put16(s, std::min<uint64_t>(n, 0xFFFF));
  put16(s, std::min<uint64_t>(n, 0xFFFF));
  put32(s, std::min(directory_size_, kMax32));
  put32(s, std::min(directory_at_, kMax32));
  put16(s, 0);
  THETAD_CHECK(s.size() == file_size_ - directory_at_, InternalError, "zip directory size");
  return s;
}

}  // namespace thetad::daemon
