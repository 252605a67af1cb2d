// JSON from others' files (config.json, adapter_config.json, a safetensors header, a model's
// index): parsed with its nesting bounded, and quoted in messages by a short form that never walks
// the document (nlohmann's dump() recurses once per level: a 200 KB file of nested arrays
// overflowed the stack).
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>

namespace thetad {

// Far above what a model's files nest (config.json: 4 levels) and far below what the recursion
// of dump() or of a comparison can take.
constexpr size_t kMaxJsonDepth = 64;
// The largest JSON file read whole (config.json, adapter_config.json, model.safetensors.index.json:
// kilobytes, an index of a large model a few megabytes).
constexpr size_t kMaxJsonFileBytes = size_t{16} << 20;

enum class JsonProblem { none, invalid, too_deep };

// Parses [begin, end) as one JSON value nested at most `max_depth` levels (a scalar is 0, [1] is
// 1). Never throws: on a problem returns a discarded value and sets `problem`.
nlohmann::json parse_json(const char* begin, const char* end, JsonProblem& problem, size_t max_depth = kMaxJsonDepth);

// "not valid JSON" / "nested deeper than 64 levels" for messages.
std::string json_problem_text(JsonProblem problem, size_t max_depth = kMaxJsonDepth);

// A value as a message may quote it: a number, true, false, null, or a string (escaped as
// printable() does, cut at 40 bytes, in quotes); an array or object by its kind and size
// ("an array of 3 items").
std::string json_brief(const nlohmann::json& v);

}  // namespace thetad
