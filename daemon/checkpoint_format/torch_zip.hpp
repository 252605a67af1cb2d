// A PyTorch zip archive (what torch.save writes and torch.load and torch::pickle_load read: records
// stored uncompressed under "archive/", data 64-byte aligned, zip64 where sizes or offsets need it)
// laid out from the records' sizes before any byte is written, so that several threads write
// and checksum its large records at their offsets (write_torch_zip). Torch-free; the pickle
// (data.pkl) is the caller's.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace thetad::daemon {

struct TorchZipEntry {
  std::string name;        // in the archive: "archive/" + the record's name
  uint64_t size = 0;
  uint64_t header_at = 0;  // the local header's offset
  uint64_t data_at = 0;    // the data's offset, a multiple of TorchZipLayout::kAlignment
};

class TorchZipLayout {
 public:
  static constexpr uint64_t kAlignment = 64;  // as PyTorch's writer: tensors load in place (mmap)
  // Records by name ("data/0", "data.pkl", "version") and size, in file order.
  explicit TorchZipLayout(const std::vector<std::pair<std::string, uint64_t>>& records);
  const std::vector<TorchZipEntry>& entries() const { return entries_; }
  uint64_t directory_at() const { return directory_at_; }  // the central directory's offset
  uint64_t file_size() const { return file_size_; }
  // Entry i's local header with its padding: the bytes [header_at, data_at), its CRC-32 known.
  std::string local_header(size_t i, uint32_t crc) const;
  // The central directory and the end records: the bytes [directory_at, file_size).
  std::string directory(const std::vector<uint32_t>& crcs) const;

 private:
  std::vector<TorchZipEntry> entries_;
  uint64_t directory_at_ = 0, directory_size_ = 0, file_size_ = 0;
};

struct TorchZipRecord {
  std::string name;  // "data/0", ...
  const void* data = nullptr;
  uint64_t size = 0;
};

struct TorchZipSink {
  int threads = 1;
  // Writes n bytes at `offset` (any thread); false on an error, which the sink keeps: the write
  // stops and write_torch_zip returns false.
  std::function<bool(const char* p, size_t n, uint64_t offset)> write_at;
  // Optional, before a record's bytes [from, from + n) are read (any thread): makes them ready,
  // e.g. copies them from a device. May throw; the write stops and the exception comes out.
  std::function<void(size_t record, uint64_t from, uint64_t n)> prepare;
  // Optional, after the bytes [offset, offset + n) of the file were written (any thread): e.g.
  // starts their writeback, so that the disk works while the CPUs do.
  std::function<void(uint64_t offset, uint64_t n)> written;
  const std::atomic<bool>* cancel = nullptr;  // set: stops at the next block, returns false
};

struct TorchZipResult {
  bool ok = false;          // false: a write failed (the sink knows why) or cancelled
  uint64_t size = 0;        // the file's bytes
  uint64_t checksum = 0;    // file_checksum.hpp's, of the whole file
};

// Writes `records` (the pickle, "data.pkl", among them) as a PyTorch archive through `sink`, in
// file blocks of kChecksumBlock on `sink.threads` threads: each data piece's CRC-32 (zlib, joined
// with crc32_combine), its block's hash and its write on the same thread; the headers, which hold
// the CRCs, written and their blocks hashed last.
TorchZipResult write_torch_zip(const std::vector<TorchZipRecord>& records, const TorchZipSink& sink);

}  // namespace thetad::daemon
