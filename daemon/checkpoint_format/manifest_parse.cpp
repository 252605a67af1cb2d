// The manifest parser's pieces shared by its files (manifest_parse.hpp): reading keys with errors
// that name the file and the key, and the layout's object (layout.hpp) in the manifest's JSON.
#include "daemon/checkpoint_format/manifest_parse.hpp"

#include <algorithm>
#include <cctype>
#include <iomanip>
#include <sstream>

#include "common/errors.hpp"
#include "common/text.hpp"

namespace thetad::daemon::manifest_detail {

std::string hex16(uint64_t v) {
  std::ostringstream os;
  os << std::hex << std::setw(16) << std::setfill('0') << v;
  return os.str();
}

bool is_hex16(const std::string& s) {
  if (s.size() != 16) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

void Reader::fail(const std::string& key, const std::string& what) const {
  throw ConfigError(path + ": " + key + ": " + what + " (the checkpoint is damaged or not thetad's; use --no-resume or "
                    "another checkpoint.dir)");
}

YAML::Node Reader::need(const YAML::Node& map, const std::string& key, const std::string& where) const {
  const YAML::Node n = map[key];
  if (!n) fail(where + key, "missing");
  if (!n.IsScalar()) fail(where + key, "not a single value");
  return n;
}

std::string Reader::text(const YAML::Node& map, const std::string& key, const std::string& where) const {
  return need(map, key, where).Scalar();
}

int64_t Reader::integer(const YAML::Node& map, const std::string& key, int64_t lo, int64_t hi,
                        const std::string& where) const {
  return bounded(need(map, key, where).Scalar(), lo, hi, where + key);
}

int64_t Reader::bounded(const std::string& s, int64_t lo, int64_t hi, const std::string& key) const {
  int64_t v = 0;
  size_t used = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != s.size()) fail(key, "'" + s + "' is not an integer");
  if (v < lo || v > hi) fail(key, std::to_string(v) + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
}

uint64_t Reader::unsigned_integer(const YAML::Node& map, const std::string& key, const std::string& where) const {
  const std::string s = need(map, key, where).Scalar();
  uint64_t v = 0;
  size_t used = 0;
  try {
    if (!s.empty() && std::isdigit(static_cast<unsigned char>(s[0]))) v = std::stoull(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != s.size()) fail(where + key, "'" + s + "' is not an unsigned 64-bit integer");
  return v;
}

uint64_t Reader::hex(const YAML::Node& map, const std::string& key, const std::string& where) const {
  const std::string h = text(map, key, where);
  if (!is_hex16(h)) fail(where + key, "'" + h + "' is not 16 hex digits");
  return std::stoull(h, nullptr, 16);
}

int64_t Reader::element(const YAML::Node& seq, size_t i, int64_t lo, int64_t hi, const std::string& where) const {
  const std::string key = where + "[" + std::to_string(i) + "]";
  const YAML::Node n = seq[i];
  if (!n.IsScalar()) fail(key, "not a single value");
  return bounded(n.Scalar(), lo, hi, key);
}

void Reader::only(const YAML::Node& map, const char* const* known, const std::string& where) const {
  for (const auto& kv : map) {
    const std::string k = kv.first.as<std::string>("");
    bool ok = false;
    for (const char* const* p = known; *p && !ok; ++p) ok = k == *p;
    if (!ok) fail(where + k, "unknown key");
  }
}

// ",\n  \"layout\": {...}" (nothing for a manifest without one).
std::string layout_json(const ManifestLayout& l) {
  if (!l.present) return "";
  std::ostringstream os;
  os << ",\n  \"layout\": {\"digest\": \"" << hex16(l.digest) << "\",\n    \"keys\": {";
  for (size_t i = 0; i < l.keys.size(); ++i)
    os << (i ? ", " : "") << json_string(l.keys[i].first) << ": " << json_string(l.keys[i].second);
  os << "},\n    \"groups\": [";
  for (size_t g = 0; g < l.groups.size(); ++g) {
    os << (g ? ",\n      [" : "\n      [");
    for (size_t i = 0; i < l.groups[g].size(); ++i) {
      const LayoutParam& p = l.groups[g][i];
      os << (i ? ", " : "") << "{\"name\": " << json_string(p.name) << ", \"shape\": " << shape_text(p.shape) << "}";
    }
    os << "]";
  }
  os << "]}";
  return os.str();
}

// The manifest's "layout" object: the keys layout_keys() names, groups 0 and 1 described in full.
ManifestLayout parse_layout(const Reader& r, const YAML::Node& node) {
  ManifestLayout l;
  if (!node.IsMap()) r.fail("layout", "not an object");
  l.present = true;
  l.digest = r.hex(node, "digest", "layout.");
  const YAML::Node keys = node["keys"];
  if (!keys || !keys.IsMap()) r.fail("layout.keys", "missing or not an object");
  const auto& known = layout_keys();
  for (const auto& kv : keys) {
    const std::string k = kv.first.as<std::string>("");
    if (std::find(known.begin(), known.end(), k) == known.end()) r.fail("layout.keys." + k, "not a layout key");
    const std::string v = r.text(keys, k, "layout.keys.");
    if (v.size() > 4096) r.fail("layout.keys." + k, "longer than 4096 characters");
    l.keys.emplace_back(k, v);
  }
  const YAML::Node groups = node["groups"];
  if (!groups || !groups.IsSequence()) r.fail("layout.groups", "missing or not a list");
  if (groups.size() > kLayoutGroupsInFull)
    r.fail("layout.groups", std::to_string(groups.size()) + " groups described, at most " + std::to_string(kLayoutGroupsInFull));
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string wg = "layout.groups[" + std::to_string(g) + "]";
    if (!groups[g].IsSequence()) r.fail(wg, "not a list");
    l.groups.emplace_back();
    for (size_t i = 0; i < groups[g].size(); ++i) {
      const YAML::Node& p = groups[g][i];
      const std::string where = wg + "[" + std::to_string(i) + "].";
      if (!p.IsMap() || p.size() != 2) r.fail(where + "name", "not an object of name and shape");
      LayoutParam lp;
      lp.name = r.text(p, "name", where);
      if (lp.name.empty() || lp.name.size() > 1024) r.fail(where + "name", "empty or longer than 1024 characters");
      const YAML::Node shape = p["shape"];
      if (!shape || !shape.IsSequence() || shape.size() > 8) r.fail(where + "shape", "not a list of at most 8 sizes");
      for (size_t d = 0; d < shape.size(); ++d) lp.shape.push_back(r.element(shape, d, 0, int64_t{1} << 40, where + "shape"));
      l.groups.back().push_back(lp);
    }
  }
  static const char* const kKeys[] = {"digest", "keys", "groups", nullptr};
  r.only(node, kKeys, "layout.");
  return l;
}

}  // namespace thetad::daemon::manifest_detail
