// The placeholders of path keys ({job}, {rank}, {task}): the one expansion that every path of a
// job goes through (validation, the run's outputs and inputs, adapter directories), and the
// reading of a template that validation checks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

namespace thetad::config {

// The values of a path's placeholders; a placeholder without a value stays as written.
struct PathValues {
  std::optional<std::string> job;
  std::optional<int64_t> rank;
  std::optional<int64_t> task;
};

// `path` with each placeholder that has a value replaced, in one pass from left to right: a value
// is never scanned again, so one holding "{job}" cannot expand without end.
std::string expand_placeholders(const std::string& path, const PathValues& values);

// The first "{...}" of `path` that is not one of `allowed` ("{job}", ...), an unclosed one read to
// the end; "" when there is none.
std::string unknown_placeholder(const std::string& path, std::initializer_list<const char*> allowed);

// The offset of the first control byte of `path` (below 0x20, or DEL), or npos.
size_t first_control_byte(const std::string& path);

}  // namespace thetad::config
