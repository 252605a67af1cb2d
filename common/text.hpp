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

// The length of the valid UTF-8 sequence that starts at s[i] (1 for ASCII), 0 when the bytes
// there are not one (a stray continuation byte, an overlong lead, a cut sequence).
inline size_t utf8_length_at(const std::string& s, size_t i) {
  const auto u = static_cast<unsigned char>(s[i]);
  const size_t len = u < 0x80 ? 1 : (u >> 5) == 0x6 && u >= 0xc2 ? 2 : (u >> 4) == 0xe ? 3 : (u >> 3) == 0x1e && u <= 0xf4 ? 4 : 0;
  if (len == 0 || i + len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k)
    if ((static_cast<unsigned char>(s[i + k]) & 0xc0) != 0x80) return 0;
  return len;
}

// What `printable` does with a newline and a tab: escapes them (a one-line message) or keeps
// them (a block of log lines).
enum class LineBreaks { kEscape, kKeep };

// `s` safe to print: control characters (C0, DEL and the C1 range U+0080..U+009F, which hold
// the terminal's escape sequences) as \xNN (a newline as \n unless kept), and bytes that are
// not part of valid UTF-8 as \xNN, so that a binary file named in an error or a rank's output
// cannot garble or drive the terminal. Valid UTF-8 passes through.
inline std::string printable(const std::string& s, LineBreaks breaks = LineBreaks::kEscape) {
  static const char* hex = "0123456789abcdef";
  const bool keep = breaks == LineBreaks::kKeep;
  const auto plain = [keep](unsigned char u) {
    return (u >= 0x20 && u < 0x7f) || (keep && (u == '\n' || u == '\t'));
  };
  std::string out;
  out.reserve(s.size());
  const auto escape = [&](unsigned char u) {
    out += "\\x";
    out += hex[u >> 4];
    out += hex[u & 15];
  };
  for (size_t i = 0; i < s.size();) {
    size_t run = i;
    while (run < s.size() && plain(static_cast<unsigned char>(s[run]))) ++run;
    out.append(s, i, run - i);  // most text is plain ASCII: copied as one run
    if ((i = run) == s.size()) break;
    const auto u = static_cast<unsigned char>(s[i]);
    const size_t len = u < 0x80 ? 0 : utf8_length_at(s, i);
    const bool c1 = len == 2 && u == 0xc2 && static_cast<unsigned char>(s[i + 1]) < 0xa0;
    if (len == 0 || c1) {
      if (u == '\n') out += "\\n";
      else escape(u);
      ++i;
      continue;
    }
    out.append(s, i, len);
    i += len;
  }
  return out;
}

}  // namespace thetad
