// Semantic checks of a job: required keys, ranges, enum values and contradictions (the Checker
// of checker.hpp). This file: the entry point, required keys, the top level, comm, the optimizer
// and the outputs; the model, data and offload sections have files of their own.
#include <filesystem>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <limits>
#include <string>
#include <utility>

#include "config/checker.hpp"
#include "config/validate.hpp"

namespace thetad::config::detail {

// `elems` fp32 elements as bytes with a binary unit ("64 GiB").
std::string fp32_size(double elems) {
  static const char* const units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = elems * 4;
  int u = 0;
  while (v >= 1024 && u < 6) v /= 1024, ++u;
  char buf[32];
  const bool whole = v == std::trunc(v) || v >= 10 || u == 0;
  std::snprintf(buf, sizeof buf, whole ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

void Checker::required() {
  if (!d_.given("steps")) fail("steps", "required key is missing (number of steps to run)");
  for (const char* section : {"model", "data"}) {
    if (!d_.given(section))
      fail(section, "required section is missing (see docs/configuration.md)");
  }
  if (d_.given("model") && !d_.given("model.kind"))
    fail("model.kind", "required key is missing; one of " + join(*allowed_values("model.kind")),
         "model");
}

void Checker::top_level() {
  if (d_.given("steps")) above<int64_t>("steps", j_.steps, 0);
  at_least<int64_t>("accumulate_steps", j_.accumulate_steps, 1);
  at_most<int64_t>("accumulate_steps", j_.accumulate_steps, kMaxAccumulateSteps,
                   "micro-steps of one optimizer step");
  micro_steps_fit();
  one_of("precision");
  if (!is_job_name(j_.name))
    fail("job", "must be a non-empty name of letters, digits, '.', '_' and '-', not '.' or '..' (it becomes "
                "part of paths through {job}); got '" + j_.name + "'");
}

// Micro-step m of step s has index s x accumulate_steps + m: the last one must fit an int64.
void Checker::micro_steps_fit() {
  const int64_t k = j_.accumulate_steps;
  if (!d_.given("steps") || !ok("steps") || !ok("accumulate_steps") || j_.steps <= 0 || k < 1 ||
      k > kMaxAccumulateSteps)
    return;
  const int64_t most = std::numeric_limits<int64_t>::max() / k;
  if (j_.steps > most)
    fail("steps", "steps x accumulate_steps (" + num(j_.steps) + " x " + num(k) +
                      ") micro-steps overflow the 64-bit micro-step index; with accumulate_steps " +
                      num(k) + " steps must be <= " + num(most));
}

void Checker::comm() {
  const CommConfig& c = j_.comm;
  one_of("comm.backend");
  one_of("comm.average");
  one_of("comm.active");
  one_of("comm.grad_dtype");
  one_of("comm.sole_user");
  if (is("comm.backend", c.backend, Backend::Nccl) && !opts_.cuda_build)
    fail("comm.backend", "'nccl' is not available: this build has no CUDA LibTorch "
                         "(use 'auto' or 'mpi')");
  above("comm.bucket_cap_mb", c.bucket_cap_mb, 0.0);
  above("comm.first_bucket_mb", c.first_bucket_mb, 0.0);
  if (c.first_bucket_mb > 0 && c.bucket_cap_mb > 0 && c.first_bucket_mb > c.bucket_cap_mb &&
      ok("comm.bucket_cap_mb")) {
    const bool cap_given = d_.given("comm.bucket_cap_mb") && !d_.given("comm.first_bucket_mb");
    fail(cap_given ? "comm.bucket_cap_mb" : "comm.first_bucket_mb",
         "comm.first_bucket_mb (" + num(c.first_bucket_mb) +
             ") must be <= comm.bucket_cap_mb (" + num(c.bucket_cap_mb) + ")");
  }
  // A bucket of 0 bytes (mib_to_bytes truncates) holds nothing: at least one fp32 element.
  for (const auto& [key, v] : {std::pair<const char*, double>{"comm.bucket_cap_mb", c.bucket_cap_mb},
                               {"comm.first_bucket_mb", c.first_bucket_mb}})
    if (v > 0 && double(mib_to_bytes(v)) < kMinBucketBytes)
      fail(key, "must be at least 4 bytes (one fp32 element), " + num(kMinBucketBytes / 1048576.0) +
                    " MiB; got " + num(v) + " MiB (" + std::to_string(mib_to_bytes(v)) + " bytes)");
  // Below a second a timeout measures the scheduler, not a lost peer: such a job fails as a
  // communication error (exit 3) that a supervisor would restart forever.
  if (!(c.timeout_s >= kMinTimeoutS))
    fail("comm.timeout_s", "must be >= " + num(kMinTimeoutS) + " s (a collective, a checkpoint agreement or a slow "
                           "rank's step takes longer than a shorter bound on a busy machine), got " + num(c.timeout_s));
  at_most("comm.timeout_s", c.timeout_s, 1e7, "116 days");
  at_most("comm.bucket_cap_mb", c.bucket_cap_mb, kMaxMiB, "1 PiB");
  at_most("comm.first_bucket_mb", c.first_bucket_mb, kMaxMiB, "1 PiB");
}

void Checker::optimizer() {
  const OptimizerConfig& o = j_.optimizer;
  one_of("optimizer.kind");
  one_of("optimizer.lr_schedule");
  above("optimizer.lr", o.lr, 0.0);
  const double betas[2] = {o.beta1, o.beta2};
  for (int i = 0; i < 2; ++i) {
    if (!(betas[i] >= 0 && betas[i] < 1))
      fail("optimizer.betas[" + std::to_string(i) + "]",
           "beta" + std::to_string(i + 1) + " must be in [0, 1), got " + num(betas[i]));
  }
  above("optimizer.eps", o.eps, 0.0);
  at_least("optimizer.weight_decay", o.weight_decay, 0.0);
  at_least("optimizer.clip_norm", o.clip_norm, 0.0);
  at_least<int64_t>("optimizer.warmup_steps", o.warmup_steps, 0);
  at_least("optimizer.min_lr", o.min_lr, 0.0);
  if (o.min_lr > o.lr && o.lr > 0 && ok("optimizer.lr"))
    fail("optimizer.min_lr", "must be <= optimizer.lr (" + num(o.lr) + "), got " + num(o.min_lr));
}

// train.tasks_per_pass sizes the passes that split: joint runs a micro-step's tasks in one.
void Checker::train() {
  at_least<int64_t>("train.tasks_per_pass", j_.train.tasks_per_pass, 1);
  if (ok("train.backward") && j_.train.backward == Backward::Joint && j_.train.tasks_per_pass > 1)
    fail("train.tasks_per_pass", "is " + num(j_.train.tasks_per_pass) +
                                     ", but train.backward joint runs every task of a micro-step in one pass (the key sizes "
                                     "the passes of per_task, and of auto where it splits)");
}

// Every key that names a file or directory: a NUL would cut the path short where the run opens
// it (the C library ends a path there), and other control bytes make a name nobody can type.
void Checker::path_bytes() {
  const std::pair<const char*, const std::string*> keys[] = {
      {"checkpoint.dir", &j_.checkpoint.dir}, {"metrics.path", &j_.metrics.path},
      {"log.file", &j_.log.file},             {"timeline.path", &j_.timeline.path},
      {"data.dir", &j_.data.dir},             {"model.path", &j_.model.path},
      {"model.init_from", &j_.model.init_from}, {"lora.init_from", &j_.lora.init_from},
      {"export.adapters_dir", &j_.export_.adapters_dir}, {"export.base_model", &j_.export_.base_model}};
  for (const auto& [key, v] : keys) {
    const size_t at = first_control_byte(*v);
    if (at == std::string::npos) continue;
    char byte[8];
    std::snprintf(byte, sizeof byte, "\\x%02x", static_cast<unsigned>(static_cast<unsigned char>((*v)[at])));
    fail(key, std::string("holds a control character (") + byte + " at byte " + std::to_string(at) +
                  "); a path cannot contain NUL or other control characters");
    d_.mark_bad(key);  // its other checks would only repeat the bad name
  }
}

void Checker::outputs() {
  const CheckpointConfig& c = j_.checkpoint;
  at_least<int64_t>("checkpoint.every_steps", c.every_steps, 0);
  at_least<int64_t>("checkpoint.keep", c.keep, 1);
  // Each rank writes its share of a checkpoint into one directory that rank 0 publishes, and every
  // rank reads all of it at resume: a directory per rank would split every checkpoint.
  if (c.dir.find("{rank}") != std::string::npos)
    fail("checkpoint.dir", "{rank} cannot be used here: a checkpoint is one directory that every rank writes its "
                           "share into and reads whole at resume (the same path on every rank, on a filesystem they "
                           "all mount); use {job} or a fixed path");
  else
    placeholders("checkpoint.dir", c.dir);
  if (c.every_steps > 0 && c.dir.empty())
    fail("checkpoint.dir", "checkpoint.every_steps is " + num(c.every_steps) +
                               " but there is no checkpoint.dir to write to",
         "checkpoint.every_steps");
  placeholders("metrics.path", j_.metrics.path);
  if (j_.metrics.all_ranks && !j_.metrics.path.empty() &&
      j_.metrics.path.find("{rank}") == std::string::npos)
    fail("metrics.path", "metrics.all_ranks is true, so the path needs {rank} (every rank "
                         "would write the same file)", "metrics.all_ranks");
  one_of("log.level", j_.log.level);
  placeholders("log.file", j_.log.file);
  at_least("log.progress_every_s", j_.log.progress_every_s, 0.0);
  placeholders("timeline.path", j_.timeline.path);
  distinct_outputs();
}

namespace {

namespace fs = std::filesystem;

// A path as the file system will take it: absolute, the symlinks of the part that exists resolved,
// lexically normal ("./x" and "x", or a link and its target, are one path).
fs::path resolved(const std::string& p) {
  std::error_code ec;
  fs::path abs = fs::absolute(fs::path(p), ec);
  if (ec) abs = fs::path(p);
  const fs::path canon = fs::weakly_canonical(abs, ec);
  return (ec ? abs : canon).lexically_normal();
}

// Both exist and are one file (device and inode: a hard link, a bind mount).
bool same_file(const fs::path& a, const fs::path& b) {
  std::error_code ec;
  const bool same = fs::equivalent(a, b, ec);
  return !ec && same;
}

// `p` lies inside the directory `dir` (both resolved): by its path, or where one of its existing
// parents is `dir` itself by device and inode.
bool inside(const fs::path& p, const fs::path& dir) {
  const fs::path rel = p.lexically_relative(dir);
  if (!rel.empty() && *rel.begin() != ".." && rel != ".") return true;
  for (fs::path up = p.parent_path(); !up.empty() && up != up.parent_path(); up = up.parent_path())
    if (same_file(up, dir)) return true;
  return false;
}

}  // namespace

// Two outputs on one file would write one garbage file (or a file where a directory goes). Each is
// compared as the file rank 0 writes ({job} expanded, {rank} as 0), resolved (see resolved()).
void Checker::distinct_outputs() {
  const std::pair<const char*, const std::string*> outs[] = {{"checkpoint.dir", &j_.checkpoint.dir},
                                                             {"metrics.path", &j_.metrics.path},
                                                             {"log.file", &j_.log.file},
                                                             {"timeline.path", &j_.timeline.path}};
  PathValues rank0;
  rank0.job = j_.name;
  rank0.rank = 0;
  fs::path files[std::size(outs)];
  for (size_t i = 0; i < std::size(outs); ++i)
    if (!outs[i].second->empty() && ok(outs[i].first)) files[i] = resolved(expand_placeholders(*outs[i].second, rank0));
  for (size_t i = 0; i < std::size(outs); ++i)
    for (size_t k = 0; k < i; ++k) {
      if (files[i].empty() || files[k].empty()) continue;
      const bool same_path = files[i] == files[k];
      if (!same_path && !same_file(files[i], files[k])) continue;
      const std::string& v = *outs[k].second;
      std::string how;  // why two spellings are one file
      if (!same_path)
        how = ", here '" + *outs[i].second + "': the same file by device and inode";
      else if (v != *outs[i].second)
        how = ", here '" + *outs[i].second + "': both are '" + files[i].string() + "'";
      fail(outs[i].first, "is the same path as " + std::string(outs[k].first) + " ('" + v + "'" + how +
                              "); each output needs a path of its own", outs[k].first);
    }
  // A file inside checkpoint.dir: a checkpoint (or --no-resume's set-aside, or pruning) would
  // replace or move it.
  if (files[0].empty()) return;
  for (size_t i = 1; i < std::size(outs); ++i)
    if (!files[i].empty() && files[i] != files[0] && !same_file(files[i], files[0]) && inside(files[i], files[0]))
      fail(outs[i].first, "'" + *outs[i].second + "' lies inside checkpoint.dir ('" + j_.checkpoint.dir +
                              "'), whose contents checkpoints replace; put it outside", "checkpoint.dir");
}

void validate(const Job& job, const LoadOptions& opts, Diagnostics& diag) {
  Checker(job, opts, diag).run();
}

}  // namespace thetad::config::detail

namespace thetad::config {

ParamCounts param_counts(const Job& job) {
  detail::Diagnostics diag("param_counts");
  return detail::Checker(job, LoadOptions{}, diag).counts();
}

}  // namespace thetad::config
