// spdlog behind the facade of log.hpp: one logger per subsystem, all sharing the same sinks,
// the rank in every line: "[2026-11-21 10:00:00.123] [rank 1] [comm] info: ...".
#include "common/log.hpp"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <map>
#include <mutex>

#include "common/errors.hpp"

namespace thetad::log {
namespace {

struct State {
  std::mutex mu;
  std::vector<spdlog::sink_ptr> sinks;
  std::map<std::string, std::shared_ptr<spdlog::logger>> loggers;
  std::atomic<int> level{static_cast<int>(Level::info)};
  int rank = 0;
};

State& state() {
  static State* s = new State();  // never destroyed: loggers may be used during exit
  return *s;
}

spdlog::level::level_enum to_spd(Level l) { return static_cast<spdlog::level::level_enum>(l); }

std::string pattern(int rank) {
  return "[%Y-%m-%d %H:%M:%S.%e] [rank " + std::to_string(rank) + "] [%n] %l: %v";
}

void ensure_sinks_locked(State& s) {
  if (s.sinks.empty()) {
    auto err = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    err->set_pattern(pattern(s.rank));
    s.sinks.push_back(err);
  }
}

std::shared_ptr<spdlog::logger> logger_for(const char* subsystem) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.loggers.find(subsystem);
  if (it != s.loggers.end()) return it->second;
  ensure_sinks_locked(s);
  auto lg = std::make_shared<spdlog::logger>(subsystem, s.sinks.begin(), s.sinks.end());
  lg->set_level(spdlog::level::trace);  // filtering happens in enabled()
  lg->flush_on(spdlog::level::warn);
  s.loggers.emplace(subsystem, lg);
  return lg;
}

}  // namespace

bool valid_level(const std::string& name) {
  static const char* names[] = {"trace", "debug", "info", "warn", "error", "critical", "off"};
  for (const char* n : names)
    if (name == n) return true;
  return false;
}

Level parse_level(const std::string& name) {
  static const char* names[] = {"trace", "debug", "info", "warn", "error", "critical", "off"};
  for (int i = 0; i < 7; ++i)
    if (name == names[i]) return static_cast<Level>(i);
  throw ConfigError("unknown log level '" + name +
                    "' (expected trace, debug, info, warn, error, critical or off)");
}

void init(const Options& opts) {
  Level level = parse_level(opts.level);
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.rank = opts.rank;
  s.sinks.clear();
  auto err = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  err->set_pattern(pattern(opts.rank));
  s.sinks.push_back(err);
  if (!opts.file.empty()) {
    try {
      auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(opts.file, false);
      file->set_pattern(pattern(opts.rank));
      s.sinks.push_back(file);
    } catch (const spdlog::spdlog_ex& e) {
      throw ConfigError("log.file: cannot open '" + opts.file + "': " + e.what());
    }
  }
  for (auto& [name, lg] : s.loggers) lg->sinks() = s.sinks;
  s.level.store(static_cast<int>(level));
}

void set_level(Level level) { state().level.store(static_cast<int>(level)); }

bool enabled(Level level) {
  return level != Level::off && static_cast<int>(level) >= state().level.load();
}

void write(Level level, const char* subsystem, const std::string& message) {
  if (!enabled(level)) return;
  logger_for(subsystem)->log(to_spd(level), message);
}

void flush() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  for (auto& [name, lg] : s.loggers) lg->flush();
}

}  // namespace thetad::log
