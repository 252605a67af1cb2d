// Placeholders of path keys (see placeholders.hpp).
#include "config/placeholders.hpp"

#include <cstring>
#include <utility>

namespace thetad::config {

std::string expand_placeholders(const std::string& path, const PathValues& values) {
  const auto text = [](const std::optional<int64_t>& v) {
    return v ? std::optional<std::string>(std::to_string(*v)) : std::nullopt;
  };
  const std::optional<std::string> rank = text(values.rank), task = text(values.task);
  const std::pair<const char*, const std::optional<std::string>*> subs[] = {
      {"{job}", &values.job}, {"{rank}", &rank}, {"{task}", &task}};
  std::string out;
  out.reserve(path.size());
  for (size_t i = 0; i < path.size();) {
    bool replaced = false;
    for (const auto& [name, value] : subs) {
      const size_t n = std::strlen(name);
      if (path[i] != '{' || !*value || path.compare(i, n, name) != 0) continue;
      out += **value;  // appended, never scanned again
      i += n;
      replaced = true;
      break;
    }
    if (!replaced) out += path[i++];
  }
  return out;
}

std::string unknown_placeholder(const std::string& path, std::initializer_list<const char*> allowed) {
  for (size_t open = path.find('{'); open != std::string::npos; open = path.find('{', open + 1)) {
    const size_t close = path.find('}', open);
    const std::string ph = path.substr(open, close == std::string::npos ? std::string::npos : close - open + 1);
    bool known = false;
    for (const char* a : allowed) known = known || ph == a;
    if (!known) return ph;
  }
  return "";
}

size_t first_control_byte(const std::string& path) {
  for (size_t i = 0; i < path.size(); ++i) {
    const auto u = static_cast<unsigned char>(path[i]);
    if (u < 0x20 || u == 0x7f) return i;
  }
  return std::string::npos;
}

}  // namespace thetad::config
