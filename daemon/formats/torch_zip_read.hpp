// Reading a PyTorch zip archive (torch.save's format, thetad's checkpoint files) from its bytes,
// strictly and torch-free: the central directory (zip64 included), each record stored
// (uncompressed), its name under the archive's one folder, its bytes within the file and before
// the directory, no two records at the same bytes or of the same name. Fuzzed
// (tests/fuzz/fuzz_pt_file.cpp, through pt_file.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

namespace thetad::daemon {

struct ZipRecord {
  uint64_t data_at = 0;  // the record's first byte in the file
  uint64_t size = 0;
  uint32_t crc = 0;      // CRC-32 of its bytes, as the directory says
};

struct ZipIndex {
  std::string folder;                        // "archive" (torch.save: the file's stem)
  std::map<std::string, ZipRecord> records;  // by name within the folder: "data.pkl", "data/0", ...
};

// The records of the archive in [data, data + size). Throws ConfigError "FILE: ..." where the
// bytes are not such an archive. Never reads outside the bytes given.
ZipIndex read_zip_index(const char* data, size_t size, const std::string& file);

// Whether a record's bytes match its CRC-32 (zlib's).
bool zip_crc_matches(const char* data, const ZipRecord& r);

}  // namespace thetad::daemon
