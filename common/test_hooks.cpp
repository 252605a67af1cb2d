// The test aids' registry (see test_hooks.hpp): the one place THETAD_TEST_* variables are read.
#include "common/test_hooks.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

namespace thetad::test_hooks {
namespace {

int64_t env_int(const char* name, int64_t otherwise) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoll(v) : otherwise;
}

const char* point_name(StallPoint p) {
  switch (p) {
    case StallPoint::nccl_id_exchange: return "nccl_id_exchange";
    case StallPoint::cache_agreement: return "cache_agreement";
  }
  return "";
}

}  // namespace

int64_t checkpoint_write_delay_ms() { return env_int("THETAD_TEST_CHECKPOINT_WRITE_DELAY_MS", 0); }

int checkpoint_enospc_rank() { return static_cast<int>(env_int("THETAD_TEST_CHECKPOINT_ENOSPC_RANK", -1)); }

bool checkpoint_stage_host() { return env_int("THETAD_TEST_CHECKPOINT_STAGE_HOST", 0) != 0; }

bool slot_pass_without_graph() { return env_int("THETAD_TEST_SLOT_PASS", 0) != 0; }

int checkpoint_background_threads() {
  return static_cast<int>(std::max<int64_t>(0, env_int("THETAD_TEST_CHECKPOINT_BACKGROUND_THREADS", 0)));
}

bool device_memory(int64_t* free_bytes, int64_t* total_bytes) {
  const char* v = std::getenv("THETAD_TEST_DEVICE_MEMORY");
  if (!v || !*v) return false;
  char* end = nullptr;
  const double free_mib = std::strtod(v, &end);
  if (end == v || *end != '/') return false;
  const char* rest = end + 1;
  const double total_mib = std::strtod(rest, &end);
  if (end == rest || *end != '\0' || !(free_mib >= 0) || !(total_mib >= free_mib) || total_mib > 1e12) return false;
  *free_bytes = static_cast<int64_t>(free_mib * 1048576.0);
  *total_bytes = static_cast<int64_t>(total_mib * 1048576.0);
  return true;
}

bool truncate_mapped(const std::string& path) {
  const char* v = std::getenv("THETAD_TEST_TRUNCATE_MAPPED");
  if (!v || !*v) return false;
  const size_t slash = path.find_last_of('/');
  return path.compare(slash == std::string::npos ? 0 : slash + 1, std::string::npos, v) == 0;
}

void stall_at(StallPoint point, int rank) {
  const char* v = std::getenv("THETAD_TEST_STALL");
  if (!v || !*v) return;
  const std::string s(v);
  const size_t at = s.find('@'), colon = s.find(':', at == std::string::npos ? 0 : at);
  if (at == std::string::npos || colon == std::string::npos) return;
  if (s.compare(0, at, point_name(point)) != 0) return;
  if (std::atoi(s.substr(at + 1, colon - at - 1).c_str()) != rank) return;
  const double seconds = std::atof(s.substr(colon + 1).c_str());
  if (seconds > 0) std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

}  // namespace thetad::test_hooks
