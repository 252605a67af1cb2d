// Placeholders of path keys (see placeholders.hpp).
#include "config/placeholders.hpp"

#include <cstring>

namespace thetad::config {

std::string expand_placeholders(const std::string& path, const PathValues& values) {
  std::string out;
  out.reserve(path.size());
  for (size_t i = 0; i < path.size();) {
    const auto at = [&](const char* name) { return path.compare(i, std::strlen(name), name) == 0; };
    const char* name = nullptr;
    std::string value;
    if (path[i] == '{') {
      if (values.job && at("{job}")) name = "{job}", value = *values.job;
      else if (values.rank && at("{rank}")) name = "{rank}", value = std::to_string(*values.rank);
      else if (values.task && at("{task}")) name = "{task}", value = std::to_string(*values.task);
    }
    if (name) {
      out += value;
      i += std::strlen(name);
    } else {
      out += path[i++];
    }
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
