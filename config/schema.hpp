// Internal to config/: the table of every job key (section, name, type, where it lives in Job)
// that drives parsing, `--set`, to_yaml and the fingerprint, plus the allowed enum values.
#pragma once

#include <string>
#include <vector>

#include "config/job.hpp"

namespace thetad::config::detail {

enum class ValueType {
  Int,          // int64_t
  UInt,         // uint64_t
  Double,       // double
  Bool,         // bool, YAML true/false
  String,       // std::string
  Enum,         // one of job.hpp's enums, written as its YAML word (Field::parse_word, word)
  StringList,   // std::vector<std::string>
  Patterns,     // std::vector<std::string> written as one string or a list of them
  DoubleList,   // std::vector<double>
  IntList,      // std::vector<int64_t>
  IntListList,  // std::vector<std::vector<int64_t>>
  Betas,        // optimizer.betas: [beta1, beta2] stored in OptimizerConfig
};

struct Field {
  const char* section;  // "" = top level
  const char* key;      // the YAML key
  ValueType type;
  void* (*member)(Job&);  // address of the member (OptimizerConfig* for Betas)
  bool fingerprinted;     // must agree across ranks
  // Enum only: sets the member from its YAML word (false: not one of them), and the word back.
  bool (*parse_word)(void* member, const std::string& word) = nullptr;
  const std::string& (*word)(const void* member) = nullptr;

  std::string path() const;
};

// Every key, in the order to_yaml writes them.
const std::vector<Field>& fields();
// "model", "data", ... in document order.
const std::vector<std::string>& section_names();
bool is_section(const std::string& name);
// Keys of a section; for "" the top-level scalar keys followed by the section names.
std::vector<std::string> keys_of(const std::string& section);
// Every "section.key" and top-level key.
std::vector<std::string> all_paths();
const Field* find_field(const std::string& section, const std::string& key);

// Allowed values of an enum key ("model.kind"), or nullptr when the key is not an enum.
const std::vector<std::string>* allowed_values(const std::string& path);

// The value of `f` in `job` as YAML flow text ("0.001", "[0.9, 0.999]", "\"runs/{job}\"").
std::string format_value(const Field& f, const Job& job);
// Shortest text that reads back as exactly `v`.
std::string format_double(double v);
// `s` as a YAML scalar: plain when unambiguous, double-quoted otherwise.
std::string format_string(const std::string& s);
// "a, b, c"
std::string join(const std::vector<std::string>& items, const char* sep = ", ");

}  // namespace thetad::config::detail
