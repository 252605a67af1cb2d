// The manifest's pieces shared by its files (manifest.cpp: formats 4 to 6; manifest_legacy.cpp:
// formats 1 to 3; manifest_parse.cpp: reading keys, the text's layout, the layout's object): every
// failure names the file and the key. Internal to daemon/checkpoint_format (manifest.hpp is the
// interface).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <ostream>
#include <string>

namespace thetad::daemon {
struct Manifest;
struct ManifestLayout;
}  // namespace thetad::daemon

namespace thetad::daemon::manifest_detail {

using Json = nlohmann::json;                // what is read
using OrderedJson = nlohmann::ordered_json;  // what is written: keys in the order given

// The checkpoint's largest group count: model.tasks <= 2^20, plus Θ.
constexpr int64_t kMaxGroups = int64_t{1} << 21;

std::string hex16(uint64_t v);
bool is_hex16(const std::string& s);

struct Reader {
  const std::string& path;
  // ConfigError "<path>: <key>: <what> (the checkpoint is damaged or not thetad's; ...)".
  [[noreturn]] void fail(const std::string& key, const std::string& what) const;
  // The document (an object), its nesting bounded; fails naming "manifest" otherwise.
  Json parse(const std::string& text) const;
  // map[key], present (fail otherwise).
  const Json& need(const Json& map, const std::string& key, const std::string& where) const;
  // A string.
  std::string text(const Json& map, const std::string& key, const std::string& where = "") const;
  // An integer in lo..hi.
  int64_t integer(const Json& map, const std::string& key, int64_t lo, int64_t hi,
                  const std::string& where = "") const;
  // `v` as an integer in lo..hi, named `key` where it is not.
  int64_t bounded(const Json& v, int64_t lo, int64_t hi, const std::string& key) const;
  uint64_t unsigned_integer(const Json& map, const std::string& key, const std::string& where = "") const;
  // A string of 16 lowercase hex digits.
  uint64_t hex(const Json& map, const std::string& key, const std::string& where = "") const;
  // Element i of a list as an integer in lo..hi (named "<where>[i]").
  int64_t element(const Json& seq, size_t i, int64_t lo, int64_t hi, const std::string& where) const;
  // Fails on a key of `map` other than `known` (a null-terminated list).
  void only(const Json& map, const char* const* known, const std::string& where) const;
};

// The manifest's text without its closing brace: "{", then one top-level key a line, each value
// as Python's json.dumps writes one (", " and ": " between items) and its strings and numbers as
// nlohmann writes them (bytes that are not UTF-8 replaced, so that the text stays JSON). The
// caller closes it ("\n}\n"), after format 6's checksum of this much (manifest.cpp).
std::string open_text(const OrderedJson& root);

// The layout's object (nothing for a manifest without one), and that object parsed.
void add_layout(OrderedJson& root, const ManifestLayout& l);
ManifestLayout parse_layout(const Reader& r, const Json& node);

// Formats 1 to 3 (manifest_legacy.cpp): their "groups" list or "shards", and their JSON.
void parse_legacy(const Reader& r, const Json& root, Manifest& m);
void add_legacy(OrderedJson& root, const Manifest& m);

}  // namespace thetad::daemon::manifest_detail
