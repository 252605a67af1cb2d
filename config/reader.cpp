// Reads YAML nodes into a Job: strict types (a quoted "5" is a string, not a number; booleans
// are true/false only), unknown keys with a suggestion, duplicate keys, and `--set` overrides.
#include "config/reader.hpp"

#include <yaml-cpp/yaml.h>
#include <yaml-cpp/eventhandler.h>

#include <sstream>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <optional>
#include <utility>

#include "config/limits.hpp"
#include "config/schema.hpp"

namespace thetad::config::detail {

namespace {

// A string by its quotes ("!" is yaml-cpp's tag for a quoted scalar) or by an explicit tag.
bool is_quoted(const YAML::Node& n) {
  const std::string& t = n.Tag();
  return t == "!" || t == "!!str" || t == "tag:yaml.org,2002:str";
}

std::string describe(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null: return "nothing";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a map";
    case YAML::NodeType::Scalar:
      return is_quoted(n) ? "the string \"" + n.Scalar() + "\"" : "'" + n.Scalar() + "'";
    default: return "an undefined value";
  }
}

template <typename T>
std::optional<T> parse_number(std::string s, bool& out_of_range) {
  out_of_range = false;
  if (!s.empty() && s[0] == '+') s.erase(0, 1);
  if (s.empty() || s[0] == '+') return std::nullopt;
  T value{};
  const auto res = std::from_chars(s.data(), s.data() + s.size(), value);
  if (res.ec == std::errc::result_out_of_range) out_of_range = true;
  if (res.ec != std::errc() || res.ptr != s.data() + s.size()) return std::nullopt;
  return value;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

std::string unknown_key_message(const std::string& section, const std::string& key) {
  const auto keys = keys_of(section);
  const std::string near = nearest(key, keys);
  if (!near.empty()) return "unknown key; did you mean '" + near + "'?";
  for (const auto& f : fields()) {
    if (key == f.key && section != f.section)
      return "unknown key; did you mean '" + f.path() + "'? (it belongs " +
             (f.section[0] ? "in the '" + std::string(f.section) + "' section)" : "at the top level)");
  }
  if (!section.empty() && is_section(key))
    return "unknown key; '" + key + "' is a section of its own, at the top level";
  return "unknown key; known keys " + (section.empty() ? std::string("at the top level") : "in '" + section + "'") +
         ": " + join(keys);
}

class Reader {
 public:
  // `cli_arg`: the --set argument being read (cli), named in its messages.
  // `text_bytes`: the size of the text read (job_value_bound, limits.hpp).
  Reader(Job& job, Diagnostics& diag, bool cli, size_t text_bytes, std::string cli_arg = "")
      : job_(job), d_(diag), cli_(cli), cli_arg_(std::move(cli_arg)), bound_(job_value_bound(text_bytes)) {}

  // The entries of a map: the top level ("") or a section.
  void read_entries(const std::string& section, const YAML::Node& map) {
    std::map<std::string, int> seen;  // key -> line of its first appearance
    for (const auto& entry : map) {  // by value: yaml-cpp's it->first is a dangling proxy
      const YAML::Node& k = entry.first;
      const Origin ko = origin(k, d_.where(section));
      if (!spend(1, section, ko)) return;
      if (!k.IsScalar()) {
        d_.error_at(ko, section, "keys must be plain names, got " + describe(k));
        continue;
      }
      const std::string key = k.Scalar();
      const std::string path = section.empty() ? key : section + "." + key;
      const auto [first, inserted] = seen.emplace(key, ko.line);
      if (!inserted) {
        d_.error_at(ko, path, cli_ ? "duplicate key (given twice in --set '" + cli_arg_ + "')"
                                   : "duplicate key (first given on line " + std::to_string(first->second) + ")");
        d_.mark_bad(path);
        continue;
      }
      if (section.empty() && is_section(key)) {
        read_section(key, entry.second, ko);
      } else if (const Field* f = find_field(section, key)) {
        read_field(*f, entry.second, ko);
      } else {
        d_.error_at(ko, path, unknown_key_message(section, key));
      }
    }
  }

  void read_section(const std::string& name, const YAML::Node& v, Origin ko) {
    if (!cli_ || !d_.given(name)) d_.note(name, ko);
    if (v.IsNull()) return;  // "offload:" with nothing under it: all defaults
    if (!v.IsMap()) {
      fail(name, ko, "expected a map of '" + name + "' keys, got " + describe(v));
      return;
    }
    read_entries(name, v);
  }

  void read_field(const Field& f, const YAML::Node& v, Origin ko) {
    const std::string path = f.path();
    if (!spend(v.IsSequence() ? v.size() : 1, path, ko)) return;
    if (cli_) d_.forget_under(path);
    d_.note(path, ko);
    void* member = f.member(job_);
    switch (f.type) {
      case ValueType::Int: {
        int64_t x;
        if (read_int(v, path, ko, x)) *static_cast<int64_t*>(member) = x;
        break;
      }
      case ValueType::UInt: {
        bool range = false;
        const auto x = scalar_ok(v) ? parse_number<uint64_t>(v.Scalar(), range) : std::nullopt;
        if (x) {
          *static_cast<uint64_t*>(member) = *x;
        } else if (scalar_ok(v) && !v.Scalar().empty() && v.Scalar()[0] == '-' &&
                   parse_number<int64_t>(v.Scalar(), range)) {
          fail(path, ko, "must be >= 0, got " + v.Scalar());
        } else {
          fail(path, ko, std::string(range ? "integer out of range" : "expected a non-negative integer") +
                             ", got " + describe(v));
        }
        break;
      }
      case ValueType::Double: {
        double x;
        if (read_double(v, path, ko, x)) *static_cast<double*>(member) = x;
        break;
      }
      case ValueType::Bool: {
        if (scalar_ok(v) && (v.Scalar() == "true" || v.Scalar() == "false"))
          *static_cast<bool*>(member) = v.Scalar() == "true";
        else
          fail(path, ko, "expected true or false, got " + describe(v));
        break;
      }
      case ValueType::String: {
        if (v.IsNull())
          *static_cast<std::string*>(member) = "";
        else if (v.IsScalar())
          *static_cast<std::string*>(member) = v.Scalar();
        else
          fail(path, ko, "expected a string, got " + describe(v));
        break;
      }
      case ValueType::Enum: {
        // Not one of the words: validate reports it (with the other range checks), so the
        // word is kept for its message and the member left as it was.
        if (!v.IsNull() && !v.IsScalar()) {
          fail(path, ko, "expected a string, got " + describe(v));
          break;
        }
        const std::string word = v.IsNull() ? "" : v.Scalar();
        if (f.parse_word(member, word))
          d_.forget_unknown_word(path);
        else
          d_.note_unknown_word(path, word);
        break;
      }
      case ValueType::StringList: read_string_list(v, path, ko, member); break;
      case ValueType::Patterns:
        if (v.IsScalar())
          *static_cast<std::vector<std::string>*>(member) = {v.Scalar()};
        else
          read_string_list(v, path, ko, member);
        break;
      case ValueType::DoubleList: read_number_list<double>(v, path, ko, member, "numbers", &Reader::read_double); break;
      case ValueType::IntList: read_number_list<int64_t>(v, path, ko, member, "integers", &Reader::read_int); break;
      case ValueType::IntListList: read_int_lists(v, path, ko, member); break;
      case ValueType::Betas: read_betas(v, path, ko, member); break;
    }
  }

 private:
  // Counts `n` more values converted. YAML aliases repeat what they name, so a short document can
  // stand for billions of values: past the bound (job_value_bound, limits.hpp) nothing more is
  // converted, and one error names the place the bound was crossed.
  bool spend(size_t n, const std::string& path, Origin o) {
    if (exhausted_) return false;
    if (n <= bound_ - spent_) {
      spent_ += n;
      return true;
    }
    exhausted_ = true;
    fail(path, o,
         "the job expands to more than " + std::to_string(bound_) +
             " values: YAML aliases (*name) repeat the node they name, and this document's stand for more values "
             "than its text could write out; write the values out");
    return false;
  }

  Origin origin(const YAML::Node& n, Origin fallback) const {
    if (cli_) return Origin::cli();
    const YAML::Mark m = n.Mark();
    return m.line >= 0 ? Origin::file(m.line, m.column) : fallback;
  }

  bool fail(const std::string& path, Origin o, const std::string& what) {
    d_.error_at(o, path, what);
    d_.mark_bad(path);
    return false;
  }

  static bool scalar_ok(const YAML::Node& v) { return v.IsScalar() && !is_quoted(v); }

  bool read_int(const YAML::Node& v, const std::string& path, Origin o, int64_t& out) {
    bool range = false;
    const auto x = scalar_ok(v) ? parse_number<int64_t>(v.Scalar(), range) : std::nullopt;
    if (x) {
      out = *x;
      return true;
    }
    if (range) return fail(path, o, "integer out of range, got " + describe(v));
    return fail(path, o, "expected an integer, got " + describe(v));
  }

  bool read_double(const YAML::Node& v, const std::string& path, Origin o, double& out) {
    bool range = false;
    const auto x = scalar_ok(v) ? parse_number<double>(v.Scalar(), range) : std::nullopt;
    if (!x) return fail(path, o, "expected a number, got " + describe(v));
    if (!std::isfinite(*x)) return fail(path, o, "expected a finite number, got " + describe(v));
    out = *x;
    return true;
  }

  // Null reads as an empty list; anything else but a list is a type error.
  bool list_ok(const YAML::Node& v, const std::string& path, Origin o, const char* what) {
    if (v.IsNull() || v.IsSequence()) return true;
    return fail(path, o, std::string("expected a list of ") + what + ", got " + describe(v));
  }

  void read_string_list(const YAML::Node& v, const std::string& path, Origin o, void* member) {
    if (!list_ok(v, path, o, "strings")) return;
    std::vector<std::string> out;
    for (size_t i = 0; i < v.size(); ++i) {
      const std::string ip = path + "[" + std::to_string(i) + "]";
      const Origin io = origin(v[i], o);
      d_.note(ip, io);
      if (!v[i].IsScalar()) {
        fail(ip, io, "expected a string, got " + describe(v[i]));
        d_.mark_bad(path);
        return;
      }
      out.push_back(v[i].Scalar());
    }
    *static_cast<std::vector<std::string>*>(member) = std::move(out);
  }

  // A list of numbers, each read by `one` (read_double, read_int): all or nothing.
  template <typename T>
  void read_number_list(const YAML::Node& v, const std::string& path, Origin o, void* member, const char* what,
                        bool (Reader::*one)(const YAML::Node&, const std::string&, Origin, T&)) {
    if (!list_ok(v, path, o, what)) return;
    std::vector<T> out(v.size());
    bool ok = true;
    for (size_t i = 0; i < v.size(); ++i) {
      const std::string ip = path + "[" + std::to_string(i) + "]";
      const Origin io = origin(v[i], o);
      d_.note(ip, io);
      ok = (this->*one)(v[i], ip, io, out[i]) && ok;
    }
    if (ok)
      *static_cast<std::vector<T>*>(member) = std::move(out);
    else
      d_.mark_bad(path);
  }

  void read_int_lists(const YAML::Node& v, const std::string& path, Origin o, void* member) {
    if (!list_ok(v, path, o, "lists of task ids")) return;
    std::vector<std::vector<int64_t>> out(v.size());
    bool ok = true;
    for (size_t r = 0; r < v.size(); ++r) {
      const std::string rp = path + "[" + std::to_string(r) + "]";
      const Origin ro = origin(v[r], o);
      d_.note(rp, ro);
      if (!v[r].IsSequence()) {
        ok = fail(rp, ro, "expected a list of task ids, got " + describe(v[r]));
        continue;
      }
      if (!spend(v[r].size(), rp, ro)) {
        d_.mark_bad(path);
        return;
      }
      out[r].resize(v[r].size());
      for (size_t i = 0; i < v[r].size(); ++i) {
        const std::string ip = rp + "[" + std::to_string(i) + "]";
        const Origin io = origin(v[r][i], ro);
        d_.note(ip, io);
        ok = read_int(v[r][i], ip, io, out[r][i]) && ok;
      }
    }
    if (ok)
      *static_cast<std::vector<std::vector<int64_t>>*>(member) = std::move(out);
    else
      d_.mark_bad(path);
  }

  void read_betas(const YAML::Node& v, const std::string& path, Origin o, void* member) {
    if (!v.IsSequence() || v.size() != 2) {
      const std::string got = v.IsSequence() ? std::to_string(v.size()) + " elements" : describe(v);
      fail(path, o, "expected a list of 2 numbers [beta1, beta2], got " + got);
      return;
    }
    double b[2];
    bool ok = true;
    for (size_t i = 0; i < 2; ++i) {
      const std::string ip = path + "[" + std::to_string(i) + "]";
      const Origin io = origin(v[i], o);
      d_.note(ip, io);
      ok = read_double(v[i], ip, io, b[i]) && ok;
    }
    if (!ok) {
      d_.mark_bad(path);
      return;
    }
    auto* opt = static_cast<OptimizerConfig*>(member);
    opt->beta1 = b[0];
    opt->beta2 = b[1];
  }

  Job& job_;
  Diagnostics& d_;
  bool cli_;
  std::string cli_arg_;
  size_t bound_;      // values it may convert
  size_t spent_ = 0;  // values converted (spend)
  bool exhausted_ = false;
};

}  // namespace

namespace {
// Counts documents without building them. yaml-cpp 0.7's LoadAll can loop forever on some
// malformed inputs (found by fuzzing; upstream jbeder/yaml-cpp#1040); the event parser stops.
class NullHandler : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

int count_documents(const std::string& text) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  NullHandler h;
  int n = 0;
  while (n < 2 && parser.HandleNextDocument(h)) ++n;
  return n;
}
}  // namespace

bool read_document(const std::string& text, Job& job, Diagnostics& diag) {
  std::vector<YAML::Node> docs;
  try {
    if (count_documents(text) > 1) {
      // Point at the separator of the second document.
      int line = 0;
      size_t pos = text.rfind("---", 0) == 0 ? text.find("\n---", 3) : text.find("\n---");
      if (pos != std::string::npos) line = static_cast<int>(std::count(text.begin(), text.begin() + pos + 1, '\n'));
      diag.error_at(Origin::file(line, 0), "",  // line: 0-based, of the separator
                    "a job file holds one YAML document; this is a second one (after '---')");
      return false;
    }
    docs.push_back(YAML::Load(text));
  } catch (const YAML::Exception& e) {
    // yaml-cpp's exceptions carry the position (0-based) and the bare message.
    const Origin at = e.mark.line >= 0 ? Origin::file(e.mark.line, e.mark.column) : Origin{1, 1, false};
    // YAML forbids tabs in indentation; yaml-cpp's message does not say so.
    const bool tab_indent = text.find("\n\t") != std::string::npos || text.rfind('\t', 0) == 0 ||
                            text.find(" \t") != std::string::npos;
    diag.error_at(at, "", "malformed YAML: " + e.msg +
                              (tab_indent ? " (YAML does not allow tabs for indentation)" : ""));
    return false;
  }
  if (docs.empty() || docs[0].IsNull()) return true;  // empty: the missing keys are reported
  const YAML::Node& root = docs[0];
  if (!root.IsMap()) {
    const YAML::Mark m = root.Mark();
    diag.error_at(m.line >= 0 ? Origin::file(m.line, m.column) : Origin{1, 1, false}, "",
                  "the job file must be a map of keys (job, steps, model, data, ...), got " +
                      describe(root));
    return false;
  }
  Reader(job, diag, false, text.size()).read_entries("", root);
  return true;
}

void apply_override(const std::string& assignment, Job& job, Diagnostics& diag) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos) {
    diag.error_at(Origin::cli(), trim(assignment), "expected key.path=value");
    return;
  }
  const std::string key = trim(assignment.substr(0, eq));
  const std::string value = assignment.substr(eq + 1);
  if (key.empty()) {
    diag.error_at(Origin::cli(), "'" + assignment + "'", "missing key path before '='");
    return;
  }
  const auto dot = key.find('.');
  const std::string section = dot == std::string::npos ? "" : key.substr(0, dot);
  const std::string name = dot == std::string::npos ? key : key.substr(dot + 1);
  const bool whole_section = section.empty() && is_section(name);
  const Field* field = whole_section ? nullptr : find_field(section, name);
  if (!whole_section && !field) {
    auto candidates = all_paths();
    candidates.insert(candidates.end(), section_names().begin(), section_names().end());
    const std::string near = nearest(key, candidates);
    diag.error_at(Origin::cli(), key,
                  near.empty() ? "unknown key path (docs/configuration.md lists them all)"
                               : "unknown key path; did you mean '" + near + "'?");
    return;
  }

  YAML::Node node;
  const std::string v = trim(value);
  const bool raw_string = field && (field->type == ValueType::String || field->type == ValueType::Enum) && !v.empty() &&
                          v[0] != '"' && v[0] != '\'';
  if (raw_string) {
    // Paths such as {job}.log would read as YAML flow maps; a string key takes the text as is.
    node = YAML::Node(v);
  } else {
    try {
      node = YAML::Load(value);
    } catch (const YAML::Exception& e) {
      diag.error_at(Origin::cli(), key, "cannot parse value '" + value + "': " + e.msg);
      diag.mark_bad(key);
      return;
    }
  }
  Reader reader(job, diag, true, assignment.size(), assignment);
  if (whole_section) {
    reader.read_section(name, node, Origin::cli());
  } else {
    if (!section.empty() && !diag.given(section)) diag.note(section, Origin::cli());
    reader.read_field(*field, node, Origin::cli());
  }
}

}  // namespace thetad::config::detail
