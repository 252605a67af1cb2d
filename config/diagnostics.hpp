// Internal to config/: where each key of a job came from (file line/column or a `--set`), and
// the collected error messages in the one format `WHERE: KEY.PATH: what is wrong`.
#pragma once

#include <cstddef>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace thetad::config::detail {

// A position in the job file (1-based) or "set on the command line".
struct Origin {
  int line = 0;  // 0 = unknown
  int col = 0;
  bool from_override = false;

  static Origin file(int line0, int col0) { return {line0 + 1, col0 + 1, false}; }
  static Origin cli() { return {0, 0, true}; }
  bool known() const { return from_override || line > 0; }
};

class Diagnostics {
 public:
  explicit Diagnostics(std::string source) : source_(std::move(source)) {}

  const std::string& source() const { return source_; }

  // Records that `path` ("model.tasks", "data.weights[2]") was given at `where`.
  void note(const std::string& path, Origin where) { origins_[path] = where; }
  // A `--set` replaced `path`: forget what the file said about it and its children.
  void forget_under(const std::string& path);
  bool given(const std::string& path) const { return origins_.count(path) != 0; }
  // Where `path` was given; else where its nearest given parent was; else the document start.
  Origin where(const std::string& path) const;

  // A key that failed to parse: later checks on it (and its children) stay quiet.
  void mark_bad(const std::string& path) { bad_.insert(path); }
  bool bad(const std::string& path) const;

  // An enum key given a word that is not one of its values: kept for validate's message.
  void note_unknown_word(const std::string& path, std::string word) { unknown_words_[path] = std::move(word); }
  void forget_unknown_word(const std::string& path) { unknown_words_.erase(path); }
  // The unknown word given for `path`, or nullptr when its value is one of the enum's.
  const std::string* unknown_word(const std::string& path) const {
    const auto it = unknown_words_.find(path);
    return it == unknown_words_.end() ? nullptr : &it->second;
  }

  void error_at(Origin where, const std::string& path, const std::string& what);
  // `WHERE: KEY.PATH: what` (or `--set KEY.PATH: what`), control characters escaped.
  std::string format(Origin where, const std::string& path, const std::string& what) const;
  // At `path`'s own origin, or `anchor`'s when `path` was not given (a missing key).
  void error(const std::string& path, const std::string& what, const std::string& anchor = "");

  // A key that is valid but likely a mistake: `WHERE: KEY.PATH: what`, reported without failing.
  void warning(const std::string& path, const std::string& what);
  const std::vector<std::string>& warnings() const { return warnings_; }

  bool empty() const { return entries_.empty(); }
  // File errors in file order, then command-line ones: the first kMaxJobErrors (limits.hpp)
  // found, and a line counting the others.
  std::vector<std::string> messages() const;

 private:
  struct Entry {
    Origin where;
    std::string text;
  };
  std::string source_;
  std::map<std::string, Origin> origins_;
  std::set<std::string> bad_;
  std::map<std::string, std::string> unknown_words_;
  std::vector<Entry> entries_;
  size_t unshown_ = 0;  // errors past kMaxJobErrors
  std::vector<std::string> warnings_;
};

// Parent of a key path: "a.b[2]" -> "a.b", "a.b" -> "a", "a" -> "".
std::string parent_path(const std::string& path);

// Levenshtein edit distance.
size_t edit_distance(const std::string& a, const std::string& b);

// The candidate nearest to `word`, or "" when none is close enough to be a plausible typo.
std::string nearest(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace thetad::config::detail
