// Small text helpers shared by config/ and daemon/: placeholder substitution and JSON string
// escaping (metrics, timeline, checkpoint manifests). Header-only, no dependencies.
#pragma once

#include <string>

namespace thetad {

// `s` with every occurrence of `from` replaced by `to`, scanning left to right (replacements
// are not rescanned).
inline std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

// Appends `s` as a JSON string literal, quotes included: ", \ and control characters (and DEL)
// escaped; other bytes (UTF-8) pass through.
inline void append_json_string(std::string& out, const std::string& s) {
  static const char* hex = "0123456789abcdef";
  out += '"';
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (u < 0x20 || u == 0x7f) {
          out += "\\u00";
          out += hex[u >> 4];
          out += hex[u & 15];
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

inline std::string json_string(const std::string& s) {
  std::string out;
  append_json_string(out, s);
  return out;
}

}  // namespace thetad
