// The manifest parser's pieces shared by its files (manifest.cpp: formats 4 to 6; manifest_legacy.cpp:
// formats 1 to 3; manifest_parse.cpp: reading keys, the layout's object): every failure names the
// file and the key. Internal to daemon/checkpoint_format (manifest.hpp is the interface).
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <string>

#include "daemon/checkpoint_format/manifest.hpp"

namespace thetad::daemon::manifest_detail {

// The checkpoint's largest group count: model.tasks <= 2^20, plus Θ.
constexpr int64_t kMaxGroups = int64_t{1} << 21;

std::string hex16(uint64_t v);
bool is_hex16(const std::string& s);

struct Reader {
  const std::string& path;
  // ConfigError "<path>: <key>: <what> (the checkpoint is damaged or not thetad's; ...)".
  [[noreturn]] void fail(const std::string& key, const std::string& what) const;
  // map[key], a single value (fail otherwise).
  YAML::Node need(const YAML::Node& map, const std::string& key, const std::string& where) const;
  std::string text(const YAML::Node& map, const std::string& key, const std::string& where = "") const;
  int64_t integer(const YAML::Node& map, const std::string& key, int64_t lo, int64_t hi,
                  const std::string& where = "") const;
  // `s` as an integer in lo..hi, named `key` where it is not.
  int64_t bounded(const std::string& s, int64_t lo, int64_t hi, const std::string& key) const;
  uint64_t unsigned_integer(const YAML::Node& map, const std::string& key, const std::string& where = "") const;
  // 16 lowercase hex digits.
  uint64_t hex(const YAML::Node& map, const std::string& key, const std::string& where = "") const;
  // Element i of a sequence as an integer in lo..hi (named "<where>[i]").
  int64_t element(const YAML::Node& seq, size_t i, int64_t lo, int64_t hi, const std::string& where) const;
  // Fails on a key of `map` other than `known` (a null-terminated list).
  void only(const YAML::Node& map, const char* const* known, const std::string& where) const;
};

// ",\n  \"layout\": {...}" (nothing for a manifest without one), and that object parsed.
std::string layout_json(const ManifestLayout& l);
ManifestLayout parse_layout(const Reader& r, const YAML::Node& node);

// Formats 1 to 3 (manifest_legacy.cpp): their "groups" list or "shards", and their JSON.
void parse_legacy(const Reader& r, const YAML::Node& root, Manifest& m);
void legacy_json(std::ostream& os, const Manifest& m);

}  // namespace thetad::daemon::manifest_detail
