// libFuzzer target: parse_manifest (the checkpoint manifest resume reads first) on arbitrary
// bytes, as they are (format 6: a checksum that does not match its text is refused) and, where
// they hold a "checksum" key, with that checksum made to match the text before it (so that the
// mutations reach the keys behind it). It may only return a manifest or throw ConfigError; an
// accepted manifest must name only its own files (group files of formats 1 and 2, shard files of
// formats 3 to 6), each once and in order, its shards (format 3) or runs (formats 4 to 6: each
// naming a listed file, initial, or model.init_from with its fingerprint; format 6: each with a
// step count within the checkpoint's, 0 for groups stored nowhere, and the initial task groups'
// lora.init_from fingerprints exactly) must cover its groups exactly (shard_of and run_of find
// them), and it must print back to text that parses again to the same manifest, its layout (the
// keys, names and shapes resume compares) and its sources included, and compare equal to itself.
// Anything else (a sanitizer report, another exception) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/errors.hpp"
#include "daemon/checkpoint_format/manifest.hpp"

namespace {

using thetad::daemon::Manifest;

void check(const Manifest& m) {
  for (size_t i = 0; i < m.groups.size(); ++i)
    if (m.groups[i].group != static_cast<int>(i) || m.groups[i].file != thetad::daemon::group_file_name(m.groups[i].group) ||
        m.groups[i].file.find('/') != std::string::npos)
      std::abort();
  int64_t next = 0;
  for (size_t i = 0; i < m.shards.size(); ++i) {
    const auto& s = m.shards[i];
    if (s.file != thetad::daemon::shard_file_name(static_cast<int64_t>(i)) || s.file.find('/') != std::string::npos ||
        s.first != next || s.count < 1)
      std::abort();
    if (thetad::daemon::shard_of(m, s.first) != i || thetad::daemon::shard_of(m, s.first + s.count - 1) != i)
      std::abort();
    next += s.count;
  }
  if (!m.shards.empty() && next != m.num_groups) std::abort();
  // Format 4: files named by the pattern (never a path), each once; runs cover the groups in
  // order, each naming a listed file or initial / init_from (with its fingerprint).
  for (size_t i = 0; i < m.files.size(); ++i) {
    if (!thetad::daemon::parse_file_name(m.files[i].file, nullptr) || m.files[i].file.find('/') != std::string::npos ||
        m.files[i].bytes % 12 != 0)
      std::abort();
    for (size_t j = 0; j < i; ++j)
      if (m.files[j].file == m.files[i].file) std::abort();
  }
  next = 0;
  bool init_from = false;
  const bool v6 = m.format == thetad::daemon::kManifestFormat;
  for (const auto& r : m.runs) {
    if (r.first != next || r.count < 1 || r.file < thetad::daemon::kRunInitFrom ||
        r.file >= static_cast<int64_t>(m.files.size()))
      std::abort();
    if (v6 ? (r.steps < 0 || r.steps > m.step || (r.file < 0 && r.steps != 0)) : r.steps != -1) std::abort();
    if (&thetad::daemon::run_of(m, r.first) != &r || &thetad::daemon::run_of(m, r.first + r.count - 1) != &r) std::abort();
    init_from |= r.file == thetad::daemon::kRunInitFrom;
    next += r.count;
  }
  if (!m.runs.empty() && next != m.num_groups) std::abort();
  if (init_from && !m.init.model.present) std::abort();
  if (!v6 && init_from != m.init.model.present) std::abort();
  if (v6 && !m.init.lora_pattern.empty()) {  // exactly the initial task groups, in order
    const std::vector<int64_t> tasks = [&] {
      std::vector<int64_t> t;
      for (const auto& r : m.runs)
        for (int64_t g = r.first; r.file == thetad::daemon::kRunInitial && g < r.first + r.count; ++g)
          if (g > 0) t.push_back(g - 1);
      return t;
    }();
    if (tasks.size() != m.init.lora.size()) std::abort();
    for (size_t i = 0; i < tasks.size(); ++i)
      if (m.init.lora[i].task != tasks[i]) std::abort();
  }
}

// `text` with its last "checksum" value replaced by the checksum of the bytes before that key.
std::string sealed(const std::string& text) {
  const size_t key = text.rfind("\"checksum\"");
  const size_t value = text.find('"', key == std::string::npos ? text.size() : key + 10);
  if (key == std::string::npos || value == std::string::npos || value + 17 > text.size()) return text;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(thetad::daemon::manifest_text_checksum(text.substr(0, key))));
  return text.substr(0, value + 1) + hex + text.substr(value + 17);
}

// Parses `text`; an accepted manifest is checked and printed back.
void one(const std::string& text) {
  try {
    const Manifest m = thetad::daemon::parse_manifest(text, "fuzz/manifest.json");
    check(m);
    const Manifest again = thetad::daemon::parse_manifest(thetad::daemon::manifest_json(m), "fuzz/again.json");
    if (again.step != m.step || again.groups.size() != m.groups.size() || again.job != m.job ||
        again.job_hash != m.job_hash || again.num_groups != m.num_groups || again.shards.size() != m.shards.size() ||
        again.format != m.format)
      std::abort();
    for (size_t i = 0; i < m.shards.size(); ++i)
      if (again.shards[i].fnv1a64 != m.shards[i].fnv1a64 || again.shards[i].count != m.shards[i].count) std::abort();
    if (again.files.size() != m.files.size() || again.runs.size() != m.runs.size() || !(again.init == m.init))
      std::abort();
    for (size_t i = 0; i < m.files.size(); ++i)
      if (again.files[i].file != m.files[i].file || again.files[i].bytes != m.files[i].bytes ||
          again.files[i].fnv1a64 != m.files[i].fnv1a64)
        std::abort();
    for (size_t i = 0; i < m.runs.size(); ++i)
      if (again.runs[i].first != m.runs[i].first || again.runs[i].count != m.runs[i].count ||
          again.runs[i].file != m.runs[i].file || again.runs[i].steps != m.runs[i].steps)
        std::abort();
    const auto& a = m.layout;
    const auto& b = again.layout;
    if (a.present != b.present || a.keys != b.keys || a.digest != b.digest || a.groups.size() != b.groups.size())
      std::abort();
    for (size_t g = 0; g < a.groups.size(); ++g)
      if (!(a.groups[g] == b.groups[g])) std::abort();
    thetad::daemon::check_layout(a, b, "fuzz/manifest.json");  // the same layout: never refused
  } catch (const thetad::ConfigError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  one(text);
  const std::string resealed = sealed(text);
  if (resealed != text) one(resealed);
  return 0;
}
