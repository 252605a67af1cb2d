// The public face of config/: load_job (file or text, then `--set` overrides, then validation),
// to_yaml, fingerprint and expand_path. The work is in reader.cpp, validate.cpp and schema.cpp.
#include "config/loader.hpp"

#include <algorithm>
#include <utility>
#include <vector>

#include "common/file_read.hpp"
#include "common/text.hpp"
#include "config/diagnostics.hpp"
#include "config/hf_config.hpp"
#include "config/placeholders.hpp"
#include "config/reader.hpp"
#include "config/relevance.hpp"
#include "config/schema.hpp"
#include "config/validate.hpp"

namespace thetad::config {

namespace {

std::string join_lines(const std::vector<std::string>& lines) {
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) out += (i ? "\n" : "") + lines[i];
  return out;
}

// The typed forms derived from validated keys.
void complete(Job& job) {
  job.data.alternate_entries.clear();
  if (job.data.schedule != ScheduleKind::Alternate) return;
  for (const auto& word : job.data.alternate) {
    AlternateEntry e;
    THETAD_CHECK(AlternateEntry::parse(word, e), InternalError, "config: data.alternate entry '",
                 word, "' passed validation but does not parse");
    job.data.alternate_entries.push_back(e);
  }
}

}  // namespace

JobError::JobError(std::vector<std::string> messages)
    : ConfigError(join_lines(messages)), messages_(std::move(messages)) {}

Job load_job_from_string(const std::string& yaml, const std::string& source,
                         const LoadOptions& opts) {
  detail::Diagnostics diag(source);
  Job job;
  job.source = source;
  const bool document_ok = detail::read_document(yaml, job, diag);
  for (const auto& assignment : opts.overrides) detail::apply_override(assignment, job, diag);
  if (document_ok) detail::apply_hf_config(job, diag);  // dimensions from model.init_from's config.json
  if (document_ok) detail::validate(job, opts, diag);
  if (!diag.empty()) throw JobError(diag.messages());
  detail::warn_irrelevant(job, diag);
  job.warnings = diag.warnings();
  if (job.model.kind == ModelKind::Torchscript && job.model.trust_code)
    job.notes.push_back(diag.format(diag.where("model.trust_code"), "model.trust_code",
                                    "the code of model.path ('" + job.model.path +
                                        "') runs with your rights (it can read, write and delete your files)"));
  complete(job);
  return job;
}

std::string read_job_file(const std::string& path) {
  // Bounded, regular files only (refused before the open: a FIFO blocks open() until a writer
  // comes, a device never ends): a job is a small text.
  std::string text;
  const ReadResult read = read_regular_file(path, kMaxJobFileBytes, text);
  if (read.failure == ReadFailure::too_large)
    throw JobError({path + ": larger than " + std::to_string(kMaxJobFileBytes >> 20) +
                    " MiB: not a job file (a job is a small YAML text)"});
  if (!read)
    throw JobError({path + ": cannot read job file: " + read.why +
                    (read.failure == ReadFailure::not_regular ? "; a job is a YAML file" : "")});
  return text;
}

Job load_job(const std::string& path, const LoadOptions& opts) { return load_job_from_string(read_job_file(path), path, opts); }

std::string to_yaml(const Job& job) {
  std::string out = "# thetad job: the effective configuration (defaults included)\n";
  std::string section;
  for (const auto& f : detail::fields()) {
    if (section != f.section) {
      section = f.section;
      out += section + ":\n";
    }
    out += (section.empty() ? "" : "  ") + std::string(f.key) + ": " +
           detail::format_value(f, job) + "\n";
  }
  return out;
}

std::string fingerprint(const Job& job) {
  std::vector<std::string> lines;
  for (const auto& f : detail::fields())
    if (f.fingerprinted) lines.push_back(f.path() + "=" + detail::format_value(f, job));
  std::sort(lines.begin(), lines.end());
  std::string out;
  for (const auto& line : lines) out += line + "\n";
  return out;
}

std::string expand_path(const std::string& path, const Job& job, int rank) {
  PathValues values;
  values.job = job.name;
  values.rank = rank;
  return expand_placeholders(path, values);
}

std::string checkpoint_dir(const Job& job) {
  PathValues values;
  values.job = job.name;
  return expand_placeholders(job.checkpoint.dir, values);
}

void check_world(const Job& job, int world_size) {
  THETAD_CHECK(world_size >= 1, InternalError, "check_world: world size must be >= 1, got ", world_size);
  const std::string source = job.source.empty() ? std::string("job") : job.source;
  std::vector<std::string> errors;
  const auto& lists = job.data.per_rank;
  if (job.data.schedule == ScheduleKind::PerRank && static_cast<int64_t>(lists.size()) != world_size)
    errors.push_back(::thetad::detail::concat(source, ": data.per_rank has ", lists.size(),
                                              " task lists but the world has ", world_size,
                                              " ranks (one list per rank is required)"));
  // Every rank writes its own trace and log: one file for all would be interleaved garbage.
  for (const auto& [key, path] : {std::pair<const char*, const std::string&>{"timeline.path", job.timeline.path},
                                  {"log.file", job.log.file}})
    if (world_size > 1 && !path.empty() && path.find("{rank}") == std::string::npos)
      errors.push_back(::thetad::detail::concat(source, ": ", key, ": '", path, "' has no {rank} but the world has ",
                                                world_size, " ranks, which would all write this one file (add {rank})"));
  if (!errors.empty()) throw JobError(errors);
}

}  // namespace thetad::config
