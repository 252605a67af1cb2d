// The checkpoint manifest (`manifest.json`): what a checkpoint directory holds. Rank 0 writes it
// last; resume parses it strictly before reading anything else: every key with its type, a known
// format, the step of the directory's name, each group once, the group files by their fixed
// names only (a manifest can never send resume outside its directory) and a checksum per file.
// Torch-free, so that it is fuzzed (tests/fuzz/fuzz_manifest.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace thetad::daemon {

// "thetad-checkpoint-2": with a checksum per group file. "thetad-checkpoint-1" (earlier
// releases, no checksums) is still read.
constexpr const char* kManifestFormat = "thetad-checkpoint-2";
constexpr const char* kManifestFormatV1 = "thetad-checkpoint-1";

struct ManifestGroup {
  int group = 0;
  std::string file;        // always group_file_name(group)
  uint64_t fnv1a64 = 0;    // FNV-1a 64 of the file's bytes
  bool has_checksum = false;
};

struct Manifest {
  std::string format = kManifestFormat;
  std::string job;
  std::string job_hash;    // 16 hex digits: the model's compatibility key
  int64_t step = 0;        // completed steps
  int64_t world_size = 1;
  std::vector<ManifestGroup> groups;  // group g at index g
};

// "group-0003.pt".
std::string group_file_name(int group);
// The manifest as JSON text (what torch-free tools and Python read).
std::string manifest_json(const Manifest& m);
// Parses and checks `text` read from `path`; throws ConfigError "<path>: <key>: <what is
// wrong>" on anything else than a manifest this release wrote (or a format-1 one).
Manifest parse_manifest(const std::string& text, const std::string& path);

}  // namespace thetad::daemon
