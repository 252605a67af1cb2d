// Chrome-trace timeline of one rank (Horovod-style): compute, communication, copies and CPU
// optimizer steps as complete ('X') events on named lanes, viewable in Perfetto or
// chrome://tracing. Disabled, it costs one branch per call.
//
//   Timeline tl(path, rank);                       // "" = disabled
//   { Timeline::Scope s(&tl, Lane::compute, "forward"); ... }
//   tl.record(Lane::comm, "allreduce b3", t0, Timeline::now_us() - t0, {{"bytes", int64_t{n}}});
#pragma once

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace thetad::daemon {

// Lanes become trace threads (tid) of the rank's process (pid = rank).
enum class Lane : int { compute = 0, comm = 1, h2d = 2, d2h = 3, cpu_adam = 4 };
constexpr int kNumLanes = 5;
const char* lane_name(Lane lane);

struct TimelineArg {
  std::string key;
  std::variant<int64_t, double, std::string> value;
};
using TimelineArgs = std::vector<TimelineArg>;

class Timeline {
 public:
  // Opens `path` (parent directories created) and writes the trace preamble; "" disables the
  // timeline. Throws ConfigError naming the path if it cannot be opened.
  Timeline(const std::string& path, int rank);
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;
  ~Timeline();  // close(), errors logged, never thrown

  bool enabled() const { return enabled_; }
  const std::string& path() const { return path_; }

  // Microseconds on a monotonic clock (CLOCK_MONOTONIC: comparable across the ranks of a host).
  static int64_t now_us();

  // One complete event. Thread-safe (the CPU optimizer threads and copy callbacks record too).
  void record(Lane lane, const std::string& name, int64_t start_us, int64_t dur_us,
              const TimelineArgs& args = {});

  // Finishes the JSON and closes the file; later records are dropped. Idempotent.
  // Throws Error if the file could not be written completely.
  void close();

  // Records [construction, destruction) of a scope; a null or disabled timeline does nothing.
  class Scope {
   public:
    Scope(Timeline* tl, Lane lane, std::string name, TimelineArgs args = {});
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    ~Scope();

   private:
    Timeline* tl_;
    Lane lane_;
    std::string name_;
    TimelineArgs args_;
    int64_t start_us_ = 0;
  };

 private:
  void append_locked(const std::string& event);
  void flush_locked();

  bool enabled_ = false;
  std::string path_;
  int rank_ = 0;
  std::mutex mu_;
  std::FILE* file_ = nullptr;
  std::string buffer_;  // serialized events not yet written
  bool first_event_ = true;
  bool write_failed_ = false;
};

}  // namespace thetad::daemon
