// libFuzzer target: parse_manifest (the checkpoint manifest resume reads first) on arbitrary
// bytes. It may only return a manifest or throw ConfigError; an accepted manifest must name
// only its own group files, each once and in order, and print back to text it parses again to
// the same manifest. Anything else (a sanitizer report, another exception) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/errors.hpp"
#include "daemon/core/manifest.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const thetad::daemon::Manifest m = thetad::daemon::parse_manifest(text, "fuzz/manifest.json");
    for (size_t i = 0; i < m.groups.size(); ++i)
      if (m.groups[i].group != static_cast<int>(i) || m.groups[i].file != thetad::daemon::group_file_name(m.groups[i].group) ||
          m.groups[i].file.find('/') != std::string::npos)
        std::abort();
    const thetad::daemon::Manifest again =
        thetad::daemon::parse_manifest(thetad::daemon::manifest_json(m), "fuzz/again.json");
    if (again.step != m.step || again.groups.size() != m.groups.size() || again.job != m.job ||
        again.job_hash != m.job_hash)
      std::abort();
  } catch (const thetad::ConfigError&) {
  }
  return 0;
}
