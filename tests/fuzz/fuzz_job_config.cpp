// libFuzzer target: load_job_from_string on arbitrary bytes. It may only return a Job or throw
// ConfigError (JobError is one); any other exception escapes and libFuzzer reports it as a
// crash, as it does sanitizer reports, hangs (-timeout) and stack overflows.
// An accepted job is pushed further: the schedule is built for a few world sizes, and its
// effective YAML (to_yaml) must load again.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/errors.hpp"
#include "config/loader.hpp"
#include "daemon/plan/schedule.hpp"

namespace {

void exercise_schedule(const thetad::config::Job& job) {
  for (int world = 1; world <= 3; ++world) {
    try {
      auto s = thetad::daemon::Schedule::create(job, world);
      for (int64_t step = 0; step < 3; ++step)
        for (int r = 0; r < world; ++r) (void)s->plan(step, r);
      (void)s->next_use(0, 0, 0, 16);
    } catch (const thetad::ConfigError&) {
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string yaml(reinterpret_cast<const char*>(data), size);
  thetad::config::Job job;
  try {
    job = thetad::config::load_job_from_string(yaml, "fuzz.yaml");
  } catch (const thetad::ConfigError&) {
    return 0;
  }
  exercise_schedule(job);
  (void)thetad::config::fingerprint(job);
  const std::string effective = thetad::config::to_yaml(job);
  try {
    (void)thetad::config::load_job_from_string(effective, "effective.yaml");
  } catch (const thetad::ConfigError& e) {
    // The effective configuration of a valid job must itself be a valid job.
    std::fprintf(stderr, "to_yaml output does not reload:\n%s\n--- error:\n%s\n", effective.c_str(), e.what());
    std::abort();
  }
  return 0;
}
