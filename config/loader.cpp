// The public face of config/: load_job (file or text, then `--set` overrides, then validation),
// to_yaml, fingerprint and expand_path. The work is in reader.cpp, validate.cpp and schema.cpp.
#include "config/loader.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

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
  if (document_ok) detail::apply_hf_config(job, diag);  // issue 35: dimensions from model.init_from's config.json
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

namespace {

// What a path that is not a regular file is, for the message.
std::string file_kind(std::filesystem::file_type t) {
  switch (t) {
    case std::filesystem::file_type::fifo: return "a FIFO";
    case std::filesystem::file_type::socket: return "a socket";
    case std::filesystem::file_type::character: return "a character device";
    case std::filesystem::file_type::block: return "a block device";
    case std::filesystem::file_type::directory: return "a directory";
    default: return "not a plain file";
  }
}

}  // namespace

Job load_job(const std::string& path, const LoadOptions& opts) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw JobError({path + ": cannot read job file: it is a directory"});
  // Before opening: a FIFO blocks open() until a writer comes, a device never ends.
  const auto st = std::filesystem::status(path, ec);
  if (!ec && std::filesystem::exists(st) && !std::filesystem::is_regular_file(st))
    throw JobError({path + ": cannot read job file: not a regular file (" + file_kind(st.type()) +
                    "); a job is a YAML file"});
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    throw JobError({path + ": cannot read job file: " + std::strerror(err)});
  }
  // Bounded: a job is a small text; /dev/zero or a data file given by mistake must not be read
  // without end.
  std::string text(kMaxJobFileBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) throw JobError({path + ": cannot read job file: read error"});
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxJobFileBytes)
    throw JobError({path + ": larger than " + std::to_string(kMaxJobFileBytes >> 20) +
                    " MiB: not a job file (a job is a small YAML text)"});
  return load_job_from_string(text, path, opts);
}

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
