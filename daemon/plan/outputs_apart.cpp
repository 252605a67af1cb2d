// check_outputs_apart (see outputs_apart.hpp).
#include "daemon/plan/outputs_apart.hpp"

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "config/placeholders.hpp"

namespace thetad::daemon {
namespace {

namespace fs = std::filesystem;

// A path as the file system will resolve it: links followed as far as it exists, the rest folded.
std::string resolved(const std::string& path) {
  std::error_code ec;
  const fs::path abs = fs::absolute(path, ec);
  if (ec) return fs::path(path).lexically_normal().string();
  fs::path real = fs::weakly_canonical(abs, ec);
  if (ec) real = abs.lexically_normal();
  std::string s = real.string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

// One key's path as written, and what its placeholders were expanded to.
struct Named {
  std::string key;
  std::string path;
};

// `pattern` for every value of its placeholders a run of `world` ranks gives: each task of
// `tasks` where it has {task}, each rank where it has {rank}.
void expand(const config::Job& job, int world, const char* key, const std::string& pattern,
            const std::vector<int64_t>& tasks, std::vector<Named>& out) {
  if (pattern.empty()) return;
  const bool per_task = pattern.find("{task}") != std::string::npos;
  const bool per_rank = pattern.find("{rank}") != std::string::npos;
  const std::vector<int64_t> one{0};
  for (int64_t t : per_task ? tasks : one)
    for (int r = 0; r < (per_rank ? world : 1); ++r) {
      config::PathValues v;
      v.job = job.name;
      v.rank = r;
      v.task = t;
      std::string name = key;
      if (per_task) name += " (task " + std::to_string(t) + ")";
      if (per_rank) name += " (rank " + std::to_string(r) + ")";
      out.push_back({name, config::expand_placeholders(pattern, v)});
    }
}

}  // namespace

void check_outputs_apart(const config::Job& job, int world) {
  std::vector<int64_t> all_tasks;
  for (int64_t t = 0; t < job.model.tasks; ++t) all_tasks.push_back(t);
  std::vector<int64_t> merged = job.export_.merged_tasks;
  if (merged.empty()) merged.push_back(0);

  std::vector<Named> inputs, outputs;
  expand(job, world, "model.init_from", job.model.init_from, all_tasks, inputs);
  // Only the keys the job reads (a key the model or the data kind ignores names no input).
  const bool transformer = job.model.kind == config::ModelKind::Transformer;
  if (job.model.kind == config::ModelKind::Torchscript) expand(job, world, "model.path", job.model.path, all_tasks, inputs);
  if (transformer) expand(job, world, "lora.init_from", job.lora.init_from, all_tasks, inputs);
  if (job.data.kind != config::DataKind::Synthetic) expand(job, world, "data.dir", job.data.dir, all_tasks, inputs);
  expand(job, world, "eval.dir", job.eval.dir, all_tasks, inputs);
  expand(job, world, "export.adapters_dir", job.export_.adapters_dir, all_tasks, outputs);
  expand(job, world, "export.merged_dir", job.export_.merged_dir, merged, outputs);
  expand(job, world, "checkpoint.dir", job.checkpoint.dir, all_tasks, outputs);
  expand(job, world, "metrics.path", job.metrics.path, all_tasks, outputs);
  expand(job, world, "log.file", job.log.file, all_tasks, outputs);
  expand(job, world, "timeline.path", job.timeline.path, all_tasks, outputs);

  std::map<std::string, const Named*> read;  // resolved input -> its key
  for (const Named& in : inputs) read.emplace(resolved(in.path), &in);
  for (const Named& out : outputs) {
    // The output itself and each directory above it: one of them an input means the run writes
    // into what it reads.
    for (fs::path at = resolved(out.path); !at.empty(); at = at.parent_path()) {
      const auto it = read.find(at.string());
      if (it != read.end()) {
        const Named& in = *it->second;
        const bool same = at.string() == resolved(out.path);
        throw ConfigError(out.path + ": " + out.key + (same ? " is " : " lies inside ") + in.key + " ('" + in.path +
                          "'): the run would write into what it reads; give the output a directory of its own");
      }
      if (at == at.parent_path()) break;
    }
  }
}

}  // namespace thetad::daemon
