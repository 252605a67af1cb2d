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

void Checker::outputs() {
  const CheckpointConfig& c = j_.checkpoint;
  at_least<int64_t>("checkpoint.every_steps", c.every_steps, 0);
  at_least<int64_t>("checkpoint.keep", c.keep, 1);
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

// Two outputs on one path would write one garbage file (or a file where a directory goes).
void Checker::distinct_outputs() {
  const std::pair<const char*, const std::string*> outs[] = {{"checkpoint.dir", &j_.checkpoint.dir},
                                                             {"metrics.path", &j_.metrics.path},
                                                             {"log.file", &j_.log.file},
                                                             {"timeline.path", &j_.timeline.path}};
  for (size_t i = 0; i < std::size(outs); ++i)
    for (size_t k = 0; k < i; ++k)
      if (!outs[i].second->empty() && *outs[i].second == *outs[k].second)
        fail(outs[i].first, "is the same path as " + std::string(outs[k].first) + " ('" + *outs[i].second +
                                "'); each output needs a path of its own", outs[k].first);
  // A file inside checkpoint.dir: a checkpoint (or --no-resume's set-aside, or pruning) would
  // replace or move it. Compared as absolute, normalized paths ({job} expanded, {rank} as is).
  if (j_.checkpoint.dir.empty()) return;
  namespace fs = std::filesystem;
  const auto norm = [&](const std::string& p) {
    std::string s = p;
    for (size_t at; (at = s.find("{job}")) != std::string::npos;) s.replace(at, 5, j_.name);
    std::error_code ec;
    const fs::path abs = fs::absolute(fs::path(s), ec);
    return (ec ? fs::path(s) : abs).lexically_normal();
  };
  const fs::path dir = norm(j_.checkpoint.dir);
  for (size_t i = 1; i < std::size(outs); ++i) {
    if (outs[i].second->empty()) continue;
    const fs::path rel = norm(*outs[i].second).lexically_relative(dir);
    if (!rel.empty() && *rel.begin() != ".." && rel != ".")
      fail(outs[i].first, "'" + *outs[i].second + "' lies inside checkpoint.dir ('" + j_.checkpoint.dir +
                              "'), whose contents checkpoints replace; put it outside", "checkpoint.dir");
  }
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
