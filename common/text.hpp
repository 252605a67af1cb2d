// Small text helpers shared by config/ and daemon/: placeholder substitution, JSON string
// escaping (metrics, timeline, checkpoint manifests) and printable messages. Header-only, no
// dependencies.
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

// `s` safe to print in a one-line message: control characters (C0, DEL and C1) as \xNN (a
// newline as \n), and bytes that are not part of valid UTF-8 as \xNN, so that a binary file
// named in an error, or a name in a file's content, cannot garble or drive the terminal. Other
// valid UTF-8 passes through.
inline std::string printable(const std::string& s) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(s.size());
  const auto escape = [&](unsigned char u) {
    out += "\\x";
    out += hex[u >> 4];
    out += hex[u & 15];
  };
  for (size_t i = 0; i < s.size();) {
    const auto u = static_cast<unsigned char>(s[i]);
    if (u == '\n') {
      out += "\\n";
      ++i;
      continue;
    }
    if (u < 0x20 || u == 0x7f) {
      escape(u);
      ++i;
      continue;
    }
    // A UTF-8 sequence: its length from the lead byte, then continuation bytes 10xxxxxx.
    const size_t len = u < 0x80 ? 1 : (u >> 5) == 0x6 && u >= 0xc2 ? 2 : (u >> 4) == 0xe ? 3 : (u >> 3) == 0x1e && u <= 0xf4 ? 4 : 0;
    bool valid = len > 0 && i + len <= s.size();
    for (size_t k = 1; valid && k < len; ++k) valid = (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
    // The C1 controls U+0080..U+009F (CSI among them) drive terminals as ESC sequences do.
    const bool c1 = valid && len == 2 && u == 0xc2 && static_cast<unsigned char>(s[i + 1]) < 0xa0;
    if (c1) {
      escape(u);
      escape(static_cast<unsigned char>(s[i + 1]));
      i += 2;
      continue;
    }
    if (!valid) {
      escape(u);
      ++i;
      continue;
    }
    out.append(s, i, len);
    i += len;
  }
  return out;
}

}  // namespace thetad
