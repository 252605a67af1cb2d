// The manifest's pieces shared by its files (manifest_parse.hpp): reading keys with errors that
// name the file and the key, the text's layout, and the layout's object (layout.hpp).
#include "daemon/checkpoint_format/manifest_parse.hpp"

#include <algorithm>
#include <iomanip>
#include <limits>
#include <sstream>

#include "common/errors.hpp"
#include "common/json_read.hpp"
#include "daemon/checkpoint_format/manifest.hpp"

namespace thetad::daemon::manifest_detail {
namespace {

// A scalar as nlohmann writes it; bytes that are not UTF-8 replaced (U+FFFD), so that the text
// stays JSON for every reader (a path is bytes on Linux).
std::string scalar_text(const OrderedJson& v) { return v.dump(-1, ' ', false, OrderedJson::error_handler_t::replace); }

void append_value(std::string& out, const OrderedJson& v);

// An object's items as "key": value, `first` before the first and `between` before each other.
void append_items(std::string& out, const OrderedJson& object, const char* first, const char* between) {
  for (auto it = object.begin(); it != object.end(); ++it) {
    out += it == object.begin() ? first : between;
    out += scalar_text(OrderedJson(it.key()));
    out += ": ";
    append_value(out, it.value());
  }
}

// `v` on one line, ", " and ": " between items. The manifest's own values: a few levels deep.
void append_value(std::string& out, const OrderedJson& v) {
  if (v.is_object()) {
    out += '{';
    append_items(out, v, "", ", ");
    out += '}';
  } else if (v.is_array()) {
    out += '[';
    for (size_t i = 0; i < v.size(); ++i) {
      out += i ? ", " : "";
      append_value(out, v[i]);
    }
    out += ']';
  } else {
    out += scalar_text(v);
  }
}

// A value as a message quotes it (json_brief: scalars, or a container's kind and size).
std::string brief(const Json& v) { return json_brief(v); }

}  // namespace

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

std::string open_text(const OrderedJson& root) {
  std::string out = "{";
  append_items(out, root, "\n  ", ",\n  ");
  return out;
}

void Reader::fail(const std::string& key, const std::string& what) const {
  throw ConfigError(path + ": " + key + ": " + what + " (the checkpoint is damaged or not thetad's; use --no-resume or "
                    "another checkpoint.dir)");
}

Json Reader::parse(const std::string& text) const {
  JsonProblem problem = JsonProblem::none;
  Json root = parse_json(text.data(), text.data() + text.size(), problem);
  if (problem != JsonProblem::none) fail("manifest", json_problem_text(problem));
  if (!root.is_object()) fail("manifest", "not a JSON object");
  return root;
}

const Json& Reader::need(const Json& map, const std::string& key, const std::string& where) const {
  const auto it = map.find(key);
  if (it == map.end()) fail(where + key, "missing");
  return *it;
}

std::string Reader::text(const Json& map, const std::string& key, const std::string& where) const {
  const Json& v = need(map, key, where);
  if (!v.is_string()) fail(where + key, brief(v) + " is not a string");
  return v.get<std::string>();
}

int64_t Reader::integer(const Json& map, const std::string& key, int64_t lo, int64_t hi,
                        const std::string& where) const {
  return bounded(need(map, key, where), lo, hi, where + key);
}

int64_t Reader::bounded(const Json& v, int64_t lo, int64_t hi, const std::string& key) const {
  if (!v.is_number_integer()) fail(key, brief(v) + " is not an integer");
  // Above INT64_MAX only an unsigned number can be: outside every range read here.
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    fail(key, v.dump() + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  const int64_t n = v.get<int64_t>();
  if (n < lo || n > hi) fail(key, std::to_string(n) + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return n;
}

uint64_t Reader::unsigned_integer(const Json& map, const std::string& key, const std::string& where) const {
  const Json& v = need(map, key, where);
  if (!v.is_number_unsigned()) fail(where + key, brief(v) + " is not an unsigned 64-bit integer");
  return v.get<uint64_t>();
}

uint64_t Reader::hex(const Json& map, const std::string& key, const std::string& where) const {
  const std::string h = text(map, key, where);
  if (!is_hex16(h)) fail(where + key, brief(Json(h)) + " is not 16 hex digits");
  return std::stoull(h, nullptr, 16);
}

int64_t Reader::element(const Json& seq, size_t i, int64_t lo, int64_t hi, const std::string& where) const {
  return bounded(seq[i], lo, hi, where + "[" + std::to_string(i) + "]");
}

void Reader::only(const Json& map, const char* const* known, const std::string& where) const {
  for (auto it = map.begin(); it != map.end(); ++it) {
    bool ok = false;
    for (const char* const* p = known; *p && !ok; ++p) ok = it.key() == *p;
    if (!ok) fail(where + it.key(), "unknown key");
  }
}

void add_layout(OrderedJson& root, const ManifestLayout& l) {
  if (!l.present) return;
  OrderedJson keys = OrderedJson::object(), groups = OrderedJson::array();
  for (const auto& [k, v] : l.keys) keys[k] = v;
  for (const auto& group : l.groups) {
    OrderedJson params = OrderedJson::array();
    for (const LayoutParam& p : group) params.push_back({{"name", p.name}, {"shape", p.shape}});
    groups.push_back(std::move(params));
  }
  root["layout"] = {{"digest", hex16(l.digest)}, {"keys", std::move(keys)}, {"groups", std::move(groups)}};
}

// The manifest's "layout" object: the keys layout_keys() names, groups 0 and 1 described in full.
ManifestLayout parse_layout(const Reader& r, const Json& node) {
  ManifestLayout l;
  if (!node.is_object()) r.fail("layout", "not an object");
  l.present = true;
  l.digest = r.hex(node, "digest", "layout.");
  const auto keys = node.find("keys");
  if (keys == node.end() || !keys->is_object()) r.fail("layout.keys", "missing or not an object");
  const auto& known = layout_keys();
  // In the parsed object's order, sorted: the writer's too (layout_key_values, the fingerprint's).
  for (auto it = keys->begin(); it != keys->end(); ++it) {
    const std::string& k = it.key();
    if (std::find(known.begin(), known.end(), k) == known.end()) r.fail("layout.keys." + k, "not a layout key");
    const std::string v = r.text(*keys, k, "layout.keys.");
    if (v.size() > 4096) r.fail("layout.keys." + k, "longer than 4096 characters");
    l.keys.emplace_back(k, v);
  }
  const auto groups = node.find("groups");
  if (groups == node.end() || !groups->is_array()) r.fail("layout.groups", "missing or not a list");
  if (groups->size() > kLayoutGroupsInFull)
    r.fail("layout.groups", std::to_string(groups->size()) + " groups described, at most " + std::to_string(kLayoutGroupsInFull));
  for (size_t g = 0; g < groups->size(); ++g) {
    const Json& group = (*groups)[g];
    const std::string wg = "layout.groups[" + std::to_string(g) + "]";
    if (!group.is_array()) r.fail(wg, "not a list");
    l.groups.emplace_back();
    for (size_t i = 0; i < group.size(); ++i) {
      const Json& p = group[i];
      const std::string where = wg + "[" + std::to_string(i) + "].";
      if (!p.is_object() || p.size() != 2) r.fail(where + "name", "not an object of name and shape");
      LayoutParam lp;
      lp.name = r.text(p, "name", where);
      if (lp.name.empty() || lp.name.size() > 1024) r.fail(where + "name", "empty or longer than 1024 characters");
      const auto shape = p.find("shape");
      if (shape == p.end() || !shape->is_array() || shape->size() > 8) r.fail(where + "shape", "not a list of at most 8 sizes");
      for (size_t d = 0; d < shape->size(); ++d) lp.shape.push_back(r.element(*shape, d, 0, int64_t{1} << 40, where + "shape"));
      l.groups.back().push_back(lp);
    }
  }
  static const char* const kKeys[] = {"digest", "keys", "groups", nullptr};
  r.only(node, kKeys, "layout.");
  return l;
}

}  // namespace thetad::daemon::manifest_detail
