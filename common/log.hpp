// Logging facade: per-subsystem, rank-tagged loggers over spdlog, with no spdlog/fmt in this
// header so that LibTorch translation units (whose fmt clashes with spdlog's) can use it.
//
//   thetad::log::init({rank, "info", "runs/x/rank{rank}.log"});
//   THETAD_LOG(info, "comm") << "bucket " << b << " launched";
#pragma once

#include <sstream>
#include <string>

namespace thetad::log {

enum class Level { trace = 0, debug, info, warn, error, critical, off };

struct Options {
  int rank = 0;
  std::string level = "info";  // trace|debug|info|warn|error|critical|off
  std::string file;            // optional per-rank log file ("" = none)
};

// Parses a level name; throws ConfigError on an unknown one.
Level parse_level(const std::string& name);
bool valid_level(const std::string& name);

// (Re)configures all loggers: rank tag, level, sinks. Safe to call more than once.
void init(const Options& opts);
void set_level(Level level);
bool enabled(Level level);
void write(Level level, const char* subsystem, const std::string& message);
void flush();
// Flushes log.file and throws Error (exit 1) naming it if a line could not be written to it (a
// full disk): the metrics file's rule (daemon/observe/metrics.hpp), so that no run ends 0 with its
// log lost. The trainer calls it at every step's record; thetad run at start-up and at the end.
void check_file();

// One log line; writes on destruction.
class Line {
 public:
  Line(Level level, const char* subsystem) : level_(level), subsystem_(subsystem) {}
  Line(const Line&) = delete;
  Line& operator=(const Line&) = delete;
  ~Line() { write(level_, subsystem_, os_.str()); }
  template <typename T>
  Line& operator<<(const T& v) {
    os_ << v;
    return *this;
  }

 private:
  Level level_;
  const char* subsystem_;
  std::ostringstream os_;
};

}  // namespace thetad::log

#define THETAD_LOG(level, subsystem)                                      \
  if (!::thetad::log::enabled(::thetad::log::Level::level)) {             \
  } else                                                                  \
    ::thetad::log::Line(::thetad::log::Level::level, subsystem)
