// The checkpoint manifest (`manifest.json`): what a checkpoint directory holds. Rank 0 writes it
// last; resume parses it strictly before reading anything else: every key with its type, a known
// format, the step of the directory's name, each group once, the files by their fixed names only
// (a manifest can never send resume outside its directory) and a checksum per file.
// Torch-free, so that it is fuzzed (tests/fuzz/fuzz_manifest.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "daemon/core/layout.hpp"

namespace thetad::daemon {

// "thetad-checkpoint-5": groups packed into shard files, each group mapped to the file that holds
// its current values (`runs`), so that a checkpoint shares the files of unchanged groups with the
// one before it (hard links: checkpoint.hpp); a checksum per file, of its blocks
// (file_checksum.hpp), so that the threads writing a file checksum it. "thetad-checkpoint-4" (the
// same, its checksum FNV-1a 64 over the file's 64-bit words), "thetad-checkpoint-3" (shards
// of consecutive groups), "thetad-checkpoint-2" (a file per group, a checksum each) and
// "thetad-checkpoint-1" (a file per group, no checksums) are still read.
constexpr const char* kManifestFormat = "thetad-checkpoint-5";
constexpr const char* kManifestFormatV4 = "thetad-checkpoint-4";
constexpr const char* kManifestFormatV3 = "thetad-checkpoint-3";
constexpr const char* kManifestFormatV2 = "thetad-checkpoint-2";
constexpr const char* kManifestFormatV1 = "thetad-checkpoint-1";
// Formats 4 and 5: files and runs (they differ in the files' checksum only).
bool has_file_runs(const std::string& format);

// A shard file holds at most this many groups and, unless one group alone is larger, at most
// this many bytes of parameters and moments: 1,048,577 tiny groups become 129 files; files stay
// small enough for torch.load and for the ranks to share the writing.
constexpr int64_t kShardMaxGroups = 8192;
constexpr int64_t kShardMaxBytes = int64_t{64} << 20;
// Formats 4 and 5's files: fewer and larger (a full checkpoint of 32 GB is ~128 files; the writes are
// large and sequential), still bounded for torch.load and for sharing the writing among ranks.
constexpr int64_t kFileMaxBytes = int64_t{256} << 20;

struct ManifestGroup {     // formats 1 and 2
  int group = 0;
  std::string file;        // always group_file_name(group)
  uint64_t fnv1a64 = 0;    // FNV-1a 64 of the file's bytes
  bool has_checksum = false;
};

struct ManifestShard {     // format 3: groups first .. first + count - 1
  std::string file;        // always shard_file_name(index)
  int64_t first = 0;
  int64_t count = 0;
  uint64_t fnv1a64 = 0;    // FNV-1a 64 of the file's bytes
};

struct ManifestFile {      // formats 4 and 5: one file of the directory (written now or shared)
  std::string file;        // shard-NNNNN.pt (5 to 9 digits), each name once
  int64_t bytes = 0;       // bytes of the values it holds (parameters and moments, 12 per value),
                           // stale groups' included: what makes a mostly stale file be rewritten
  uint64_t fnv1a64 = 0;    // the file's checksum (format 5: file_checksum.hpp; 4: FNV-1a 64 of its words)
};

// Formats 4 and 5: groups first .. first + count - 1 have their values in files[file], or hold none.
constexpr int64_t kRunInitial = -1;   // at their initial values (checkpoint.hpp)
constexpr int64_t kRunInitFrom = -2;  // as model.init_from gives them (never trained; `init_from`)
struct ManifestRun {
  int64_t first = 0;
  int64_t count = 0;
  int64_t file = kRunInitial;
};

// Formats 4 and 5: the model.init_from a checkpoint relies on (kRunInitFrom groups): its path and a
// fingerprint (a file's size and mtime; a directory's regular files' sizes summed and newest
// mtime), compared at resume.
struct InitFromPrint {
  bool present = false;
  std::string path;
  int64_t size = 0;
  int64_t mtime_ns = 0;
  bool operator==(const InitFromPrint& o) const {
    return present == o.present && path == o.path && size == o.size && mtime_ns == o.mtime_ns;
  }
};

struct Manifest {
  std::string format = kManifestFormat;
  std::string job;
  std::string job_hash;    // 16 hex digits: the model's compatibility key
  int64_t step = 0;        // completed steps
  int64_t world_size = 1;
  int64_t num_groups = 0;
  std::vector<ManifestGroup> groups;  // formats 1 and 2: group g at index g
  std::vector<ManifestShard> shards;  // format 3: in group order, covering 0..num_groups-1 once
  std::vector<ManifestFile> files;    // formats 4 and 5: every file the checkpoint uses
  std::vector<ManifestRun> runs;      // formats 4 and 5: in group order, covering 0..num_groups-1 once
  InitFromPrint init_from;            // formats 4 and 5, where a run is kRunInitFrom
  ManifestLayout layout;  // "layout" (any format; absent before this release): see layout.hpp
};

// "shard-00012.pt".
std::string shard_file_name(int64_t shard);
// Cuts groups 0..n-1 (`group_bytes[g]`: their bytes in a checkpoint) into consecutive shards of
// at most kShardMaxGroups groups and kShardMaxBytes bytes (a larger group alone). Checksums 0.
std::vector<ManifestShard> plan_shards(const std::vector<int64_t>& group_bytes);
// The index of the shard holding group g (g must be in range).
size_t shard_of(const Manifest& m, int64_t group);

// A format-3 shard's index as its file holds it ("offsets": where each group starts, and the end;
// "steps": each group's optimizer steps) checked against its manifest entry `sh`, the length of
// its value tensors `values` and the checkpoint's step: count + 1 offsets from 0 to `values`,
// never decreasing; count step counts within 0..checkpoint_step. ConfigError naming `file` and
// the key otherwise. (Torch-free, fuzzed with the manifest: tests/fuzz/fuzz_shard_index.cpp.)
void check_shard_index(const ManifestShard& sh, int64_t values, const std::vector<int64_t>& offsets,
                       const std::vector<int64_t>& steps, int64_t checkpoint_step, const std::string& file);

// Formats 4 and 5: the run holding group g (g must be in range).
const ManifestRun& run_of(const Manifest& m, int64_t group);
// Whether `name` is a format-4/5 file name (shard-NNNNN.pt, 5 to 9 digits); its number in `*n`.
bool parse_file_name(const std::string& name, int64_t* n);

// A format-4/5 file's index as its file holds it ("groups": the groups it holds, ascending, stale
// ones included; "offsets": where each starts, and the end; "steps": each one's optimizer steps),
// checked against its manifest entry `f` (12 bytes per value), the length of its value tensors
// `values`, the manifest's group count and the checkpoint's step. ConfigError naming `file` and
// the key otherwise. (Torch-free, fuzzed: tests/fuzz/fuzz_shard_index.cpp.)
void check_file_index(const ManifestFile& f, int64_t values, const std::vector<int64_t>& groups,
                      const std::vector<int64_t>& offsets, const std::vector<int64_t>& steps, int64_t num_groups,
                      int64_t checkpoint_step, const std::string& file);

// "group-0003.pt".
std::string group_file_name(int group);
// The manifest as JSON text (what torch-free tools and Python read).
std::string manifest_json(const Manifest& m);
// Parses and checks `text` read from `path`; throws ConfigError "<path>: <key>: <what is
// wrong>" on anything else than a manifest this release wrote (or a format-1 one).
Manifest parse_manifest(const std::string& text, const std::string& path);

}  // namespace thetad::daemon
