// parse_json and json_brief (see json_read.hpp).
#include "common/json_read.hpp"

#include "common/text.hpp"

namespace thetad {

using nlohmann::json;

json parse_json(const char* begin, const char* end, JsonProblem& problem, size_t max_depth) {
  problem = JsonProblem::none;
  bool too_deep = false;
  // The parser is iterative; the callback sees each container as it opens, at its depth (the
  // outermost at 0), and drops one too deep (nothing below it is kept), so the document held is
  // never deeper than the bound.
  const json::parser_callback_t bound = [&](int depth, json::parse_event_t event, json&) {
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
        static_cast<size_t>(depth) >= max_depth) {
      too_deep = true;
      return false;
    }
    return true;
  };
  json j = json::parse(begin, end, bound, /*allow_exceptions=*/false);
  if (j.is_discarded()) problem = too_deep ? JsonProblem::too_deep : JsonProblem::invalid;
  else if (too_deep) problem = JsonProblem::too_deep;
  if (problem != JsonProblem::none) j = json(json::value_t::discarded);
  return j;
}

std::string json_problem_text(JsonProblem problem, size_t max_depth) {
  if (problem == JsonProblem::too_deep) return "nested deeper than " + std::to_string(max_depth) + " levels";
  return problem == JsonProblem::invalid ? "not valid JSON" : "";
}

std::string json_brief(const json& v) {
  switch (v.type()) {
    case json::value_t::object: return "an object of " + std::to_string(v.size()) + (v.size() == 1 ? " key" : " keys");
    case json::value_t::array: return "an array of " + std::to_string(v.size()) + (v.size() == 1 ? " item" : " items");
    case json::value_t::string: {
      const std::string& s = v.get_ref<const std::string&>();
      return "\"" + printable(s.substr(0, 40)) + (s.size() > 40 ? "...\"" : "\"");
    }
    case json::value_t::discarded: return "nothing";
    default: return v.dump();  // a number, true, false or null: no recursion
  }
}

}  // namespace thetad
