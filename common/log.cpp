// spdlog behind the facade of log.hpp: one logger per subsystem, all sharing the same sinks,
// the rank in every line: "[2026-11-21 10:00:00.123] [rank 1] [comm] info: ...".
#include "common/log.hpp"

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>

#include "common/errors.hpp"

namespace thetad::log {
namespace {

// The log file: like spdlog's basic_file_sink, but a failed write or flush (a full disk,
// /dev/full) is kept, not thrown into spdlog's error handler (which prints to stderr and goes
// on): the file stops being written and check_file() reports it, so that a run never ends 0
// with its log lost.
class CheckedFileSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit CheckedFileSink(const std::string& path) : path_(path) {
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    std::error_code ec;
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    file_ = std::fopen(path.c_str(), "ae");  // appended, close-on-exec
    if (!file_) throw ConfigError("log.file: cannot open '" + path + "': " + std::strerror(errno));
  }
  ~CheckedFileSink() override {
    if (file_) std::fclose(file_);
  }
  const std::string& path() const { return path_; }
  // The first failure, "" while none.
  std::string error() {
    std::lock_guard<std::mutex> lock(mutex_);
    return error_;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (!error_.empty()) return;
    spdlog::memory_buf_t buf;
    formatter_->format(msg, buf);
    if (std::fwrite(buf.data(), 1, buf.size(), file_) != buf.size()) fail();
  }
  void flush_() override {
    if (error_.empty() && std::fflush(file_) != 0) fail();
  }

 private:
  void fail() { error_ = std::strerror(errno); }
  std::string path_;
  std::FILE* file_ = nullptr;
  std::string error_;
};

struct State {
  std::mutex mu;
  std::vector<spdlog::sink_ptr> sinks;
  std::shared_ptr<CheckedFileSink> file;  // log.file, if any
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
  s.file.reset();
  auto err = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  err->set_pattern(pattern(opts.rank));
  s.sinks.push_back(err);
  if (!opts.file.empty()) {
    s.file = std::make_shared<CheckedFileSink>(opts.file);
    s.file->set_pattern(pattern(opts.rank));
    s.sinks.push_back(s.file);
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

void check_file() {
  std::shared_ptr<CheckedFileSink> file;
  {
    std::lock_guard<std::mutex> lock(state().mu);
    file = state().file;
  }
  if (!file) return;
  file->flush();
  const std::string error = file->error();
  if (!error.empty())
    throw Error(file->path() + ": writing the log failed (log.file): " + error + "; the lines since are lost");
}

}  // namespace thetad::log
