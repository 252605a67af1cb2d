// The checkpoint manifest (`manifest.json`): what a checkpoint directory holds. Rank 0 writes it
// last; resume parses it strictly before reading anything else: its own checksum first (format 6),
// every key with its type, a known format, the step of the directory's name, each group once with
// its step count, the files by their fixed names only (a manifest can never send resume outside
// its directory), a checksum per file and a fingerprint of every source the values of groups not
// stored in it come from. Torch-free, so that it is fuzzed (tests/fuzz/fuzz_manifest.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "daemon/checkpoint_format/layout.hpp"

namespace thetad::daemon {

// "thetad-checkpoint-6": groups packed into shard files, each run of groups mapped to the file that
// holds its current values and to its step count (`runs`), so that a checkpoint shares the files
// of unchanged groups with the one before it (hard links: checkpoint.hpp) and resume checks each
// group's step against its file's; a checksum per file, of its blocks (file_checksum.hpp), so
// that the threads writing a file checksum it; the sources of the groups not stored (`init`);
// and a checksum of the manifest's own text (`checksum`, its last key), so that a damaged map of
// groups to files is refused instead of resuming a group from another file. Still read:
// "thetad-checkpoint-5" (the same without the manifest's checksum, the runs' step counts and the
// sources of initial groups: resume says what it cannot check), "thetad-checkpoint-4" (as 5, its
// files' checksum FNV-1a 64 over their 64-bit words), "thetad-checkpoint-3" (shards of
// consecutive groups), "thetad-checkpoint-2" (a file per group, a checksum each) and
// "thetad-checkpoint-1" (a file per group, no checksums).
constexpr const char* kManifestFormat = "thetad-checkpoint-6";
constexpr const char* kManifestFormatV5 = "thetad-checkpoint-5";
constexpr const char* kManifestFormatV4 = "thetad-checkpoint-4";
constexpr const char* kManifestFormatV3 = "thetad-checkpoint-3";
constexpr const char* kManifestFormatV2 = "thetad-checkpoint-2";
constexpr const char* kManifestFormatV1 = "thetad-checkpoint-1";
// Formats 4 to 6: files and runs.
bool has_file_runs(const std::string& format);
// Formats 5 and 6: the files' checksums of blocks (file_checksum.hpp).
bool has_block_checksums(const std::string& format);

// The largest step count a checkpoint records (its directory's name and manifest).
constexpr int64_t kMaxStep = int64_t{1} << 62;
// "step-00000040": the checkpoint directory after `step` completed steps (8 digits at least, more
// as needed: step 10^8 is "step-100000000").
std::string step_dir_name(int64_t step);
// The step of a directory named step_dir_name(step) for a step in 0..kMaxStep, or -1 (any other
// name: "step-1", "step-000000001" and "step-00000040x" are no checkpoint's).
int64_t step_of_dir_name(const std::string& name);

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

struct ManifestFile {      // formats 4 to 6: one file of the directory (written now or shared)
  std::string file;        // shard-NNNNN.pt (5 to 9 digits), each name once
  int64_t bytes = 0;       // bytes of the values it holds (parameters and moments, 12 per value),
                           // stale groups' included: what makes a mostly stale file be rewritten
  uint64_t fnv1a64 = 0;    // the file's checksum (formats 5, 6: file_checksum.hpp; 4: FNV-1a 64 of its words)
};

// Formats 4 to 6: groups first .. first + count - 1 have their values in files[file], or hold none.
constexpr int64_t kRunInitial = -1;   // at their initial values (checkpoint.hpp)
constexpr int64_t kRunInitFrom = -2;  // as model.init_from gives them (never trained; `init`)
struct ManifestRun {
  int64_t first = 0;
  int64_t count = 0;
  int64_t file = kRunInitial;
  int64_t steps = -1;  // format 6: each group's optimizer steps (the same for the run's groups;
                       // 0 where file < 0); -1 where not recorded (formats 4 and 5)
};

// A source of initial values as a checkpoint relies on it: its path and a fingerprint (a file's
// size and mtime; a directory's regular files' sizes summed and newest mtime), compared at
// resume. `present` false: the path did not exist (a task without a lora.init_from directory,
// drawn from the seed instead).
struct InitFromPrint {
  bool present = false;
  std::string path;
  int64_t size = 0;
  int64_t mtime_ns = 0;
  bool operator==(const InitFromPrint& o) const {
    return present == o.present && path == o.path && size == o.size && mtime_ns == o.mtime_ns;
  }
};

// The task of a lora.init_from directory and that directory's fingerprint.
struct TaskPrint {
  int64_t task = 0;
  InitFromPrint print;
  bool operator==(const TaskPrint& o) const { return task == o.task && print == o.print; }
};

// Where the groups a checkpoint does not store get their values at resume (format 6's "init",
// present where a run is kRunInitial or kRunInitFrom; formats 4 and 5 record `model` only, as
// "init_from", where a run is kRunInitFrom). Resume refuses a checkpoint whose sources differ
// from the job's now (init_sources.hpp).
struct InitSources {
  bool has_seed = false;   // format 6
  uint64_t seed = 0;       // what draws initial values: model.init_seed, else seed
  InitFromPrint model;     // model.init_from, where the job sets it
  std::string lora_pattern;  // lora.init_from, where the job sets it
  std::vector<TaskPrint> lora;  // with lora_pattern: every initial task group's task (group - 1),
                                // ascending, with its directory's fingerprint
  bool operator==(const InitSources& o) const {
    return has_seed == o.has_seed && seed == o.seed && model == o.model && lora_pattern == o.lora_pattern &&
           lora == o.lora;
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
  std::vector<ManifestFile> files;    // formats 4 to 6: every file the checkpoint uses
  std::vector<ManifestRun> runs;      // formats 4 to 6: in group order, covering 0..num_groups-1 once
  InitSources init;                   // formats 4 to 6, where a run is initial or init_from
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

// Formats 4 to 6: the run holding group g (g must be in range).
const ManifestRun& run_of(const Manifest& m, int64_t group);
// Whether `name` is a format-4 to 6 file name (shard-NNNNN.pt, 5 to 9 digits); its number in `*n`.
bool parse_file_name(const std::string& name, int64_t* n);

// A format-4 to 6 file's index as its file holds it ("groups": the groups it holds, ascending, stale
// ones included; "offsets": where each starts, and the end; "steps": each one's optimizer steps),
// checked against its manifest entry `f` (12 bytes per value), the length of its value tensors
// `values`, the manifest's group count and the checkpoint's step. ConfigError naming `file` and
// the key otherwise. (Torch-free, fuzzed: tests/fuzz/fuzz_shard_index.cpp.)
void check_file_index(const ManifestFile& f, int64_t values, const std::vector<int64_t>& groups,
                      const std::vector<int64_t>& offsets, const std::vector<int64_t>& steps, int64_t num_groups,
                      int64_t checkpoint_step, const std::string& file);

// "group-0003.pt".
std::string group_file_name(int group);
// The manifest as JSON text (what torch-free tools and Python read); format 6 ends with its
// checksum.
std::string manifest_json(const Manifest& m);
// Format 6's checksum of its own text: FNV-1a 64 of every byte before its last key, "checksum"
// (tests/integration/rechecksum.py computes the same).
uint64_t manifest_text_checksum(const std::string& before_checksum_key);
// Parses and checks `text` read from `path`; throws ConfigError "<path>: <key>: <what is
// wrong>" on anything else than a manifest this release wrote (or an earlier format's): format
// 6's checksum is checked before any other key is believed.
Manifest parse_manifest(const std::string& text, const std::string& path);

}  // namespace thetad::daemon
