// Chrome-trace writer. Events are serialized as they are recorded and written in chunks, so a
// long run does not hold its whole trace in memory; close() terminates the JSON.
#include "daemon/observe/timeline.hpp"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "daemon/observe/metrics.hpp"

namespace thetad::daemon {
namespace {

constexpr size_t kFlushBytes = 1 << 20;

void append_args(std::string& out, const TimelineArgs& args) {
  out += ",\"args\":{";
  for (size_t i = 0; i < args.size(); ++i) {
    if (i) out += ',';
    append_json_string(out, args[i].key);
    out += ':';
    if (const auto* iv = std::get_if<int64_t>(&args[i].value)) append_json_number(out, *iv);
    else if (const auto* dv = std::get_if<double>(&args[i].value)) append_json_number(out, *dv);
    else append_json_string(out, std::get<std::string>(args[i].value));
  }
  out += '}';
}

std::string metadata(const char* what, int pid, int tid, const std::string& key, const std::string& value) {
  std::string e = "{\"ph\":\"M\",\"name\":";
  append_json_string(e, what);
  e += ",\"pid\":" + std::to_string(pid) + ",\"tid\":" + std::to_string(tid) + ",\"args\":{";
  append_json_string(e, key);
  e += ':' + value + "}}";
  return e;
}

}  // namespace

const char* lane_name(Lane lane) {
  switch (lane) {
    case Lane::compute: return "compute";
    case Lane::comm: return "comm";
    case Lane::h2d: return "h2d";
    case Lane::d2h: return "d2h";
    case Lane::cpu_adam: return "cpu_adam";
  }
  return "?";
}

int64_t Timeline::now_us() {
  using namespace std::chrono;
  return duration_cast<microseconds>(steady_clock::now().time_since_epoch()).count();
}

Timeline::Timeline(const std::string& path, int rank) : enabled_(!path.empty()), path_(path), rank_(rank) {
  if (!enabled_) return;
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) {
    fs::create_directories(parent, ec);
    if (ec) throw ConfigError(path + ": cannot create the timeline directory: " + ec.message());
  }
  file_ = std::fopen(path.c_str(), "w");
  if (file_ == nullptr)
    throw ConfigError(path + ": cannot open the timeline file for writing: " + std::strerror(errno));

  std::lock_guard<std::mutex> lock(mu_);
  buffer_ = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  append_locked(metadata("process_name", rank_, 0, "name", json_string("rank " + std::to_string(rank_))));
  append_locked(metadata("process_sort_index", rank_, 0, "sort_index", std::to_string(rank_)));
  for (int l = 0; l < kNumLanes; ++l) {
    append_locked(metadata("thread_name", rank_, l, "name", json_string(lane_name(static_cast<Lane>(l)))));
    append_locked(metadata("thread_sort_index", rank_, l, "sort_index", std::to_string(l)));
  }
}

Timeline::~Timeline() {
  try {
    close();
  } catch (const std::exception& e) {
    THETAD_LOG(warn, "timeline") << e.what();
  }
}

void Timeline::append_locked(const std::string& event) {
  if (!first_event_) buffer_ += ",\n";
  first_event_ = false;
  buffer_ += event;
  if (buffer_.size() >= kFlushBytes) flush_locked();
}

void Timeline::flush_locked() {
  if (file_ == nullptr || buffer_.empty()) return;
  if (std::fwrite(buffer_.data(), 1, buffer_.size(), file_) != buffer_.size()) write_failed_ = true;
  buffer_.clear();
}

void Timeline::record(Lane lane, const std::string& name, int64_t start_us, int64_t dur_us,
                      const TimelineArgs& args) {
  if (!enabled_) return;
  // Serialize outside the lock: recording threads only contend for the append.
  std::string e = "{\"ph\":\"X\",\"name\":";
  append_json_string(e, name);
  e += ",\"cat\":";
  append_json_string(e, lane_name(lane));
  e += ",\"pid\":" + std::to_string(rank_) + ",\"tid\":" + std::to_string(static_cast<int>(lane)) +
       ",\"ts\":" + std::to_string(start_us) + ",\"dur\":" + std::to_string(dur_us < 0 ? 0 : dur_us);
  if (!args.empty()) append_args(e, args);
  e += '}';
  std::lock_guard<std::mutex> lock(mu_);
  if (file_ == nullptr) return;  // closed
  append_locked(e);
}

void Timeline::close() {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (file_ == nullptr) return;
  buffer_ += "\n]}\n";
  flush_locked();
  const bool close_failed = std::fclose(file_) != 0;
  file_ = nullptr;
  if (write_failed_ || close_failed) throw Error(path_ + ": writing the timeline failed (disk full?)");
}

Timeline::Scope::Scope(Timeline* tl, Lane lane, std::string name, TimelineArgs args)
    : tl_(tl != nullptr && tl->enabled() ? tl : nullptr), lane_(lane) {
  if (tl_ == nullptr) return;
  name_ = std::move(name);
  args_ = std::move(args);
  start_us_ = now_us();
}

Timeline::Scope::~Scope() {
  if (tl_ != nullptr) tl_->record(lane_, name_, start_us_, now_us() - start_us_, args_);
}

}  // namespace thetad::daemon
