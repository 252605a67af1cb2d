// The control plane (see control_plane.hpp): agreements built from the host communicator's
// collectives, each waited for with the plane's timeout.
#include "comm/control_plane.hpp"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <vector>

#include "comm/bucket_plan.hpp"
#include "common/errors.hpp"
#include "common/leak_on_purpose.hpp"
#include "common/log.hpp"

namespace thetad::comm {
namespace {

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream is(s);
  std::string line;
  while (std::getline(is, line)) out.push_back(line);
  return out;
}

// The first difference between this rank's lines and rank 0's, in words.
std::string first_difference(int rank, const std::string& mine, const std::string& ref) {
  std::vector<std::string> a = split_lines(mine), b = split_lines(ref);
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    if (i < a.size() && i < b.size()) {
      if (a[i] != b[i])
        return detail::concat("rank ", rank, " has '", a[i], "' where rank 0 has '", b[i], "'");
    } else if (i < a.size()) {
      return detail::concat("rank ", rank, " has '", a[i], "' (line ", i + 1, ") that rank 0 lacks");
    } else {
      return detail::concat("rank ", rank, " lacks '", b[i], "' (line ", i + 1, ") that rank 0 has");
    }
  }
  return detail::concat("rank ", rank, " differs from rank 0 in line endings or spacing");
}

// What kind of failure an exception is, as one byte that travels with its message.
char kind_of(std::exception_ptr e, std::string& message) {
  try {
    std::rethrow_exception(e);
  } catch (const ConfigError& x) {
    message = x.what();
    return 'c';
  } catch (const CommError& x) {
    message = x.what();
    return 'm';
  } catch (const std::exception& x) {
    message = x.what();
    return 'e';
  } catch (...) {
    message = "unknown exception";
    return 'e';
  }
}

[[noreturn]] void throw_kind(char kind, const std::string& message) {
  if (kind == 'c') throw ConfigError(message);
  if (kind == 'm') throw CommError(message);
  throw Error(message);
}

}  // namespace

ControlPlane::ControlPlane(std::shared_ptr<Communicator> comm, std::chrono::milliseconds timeout)
    : comm_(std::move(comm)), timeout_(timeout) {
  THETAD_CHECK(comm_ && comm_->memory_kind() == MemoryKind::host, InternalError,
               "the control plane needs a host-memory communicator");
}

bool ControlPlane::all_ok(bool ok, const CollectiveTag& what) {
  int32_t bad = ok ? 0 : 1;
  AllreduceOptions o;
  o.op = ReduceOp::max;
  o.tag = what;
  comm_->allreduce(&bad, 1, DType::i32, o)->wait(timeout_);
  return bad == 0;
}

void ControlPlane::agree(std::exception_ptr error, const CollectiveTag& what) {
  // The lowest failing rank, or size() where every rank succeeded.
  int32_t first = error ? rank() : size();
  AllreduceOptions o;
  o.op = ReduceOp::max;
  o.tag = what;
  int32_t negated = -first;  // max of -rank = -(min rank)
  comm_->allreduce(&negated, 1, DType::i32, o)->wait(timeout_);
  first = -negated;
  if (first >= size()) return;
  std::string message;
  const char kind = error ? kind_of(error, message) : 'e';
  std::string packed = broadcast(std::string(1, kind) + message, first, what);
  if (rank() == first) std::rethrow_exception(error);
  throw_kind(packed.empty() ? 'e' : packed[0],
             detail::concat(what.describe(), " failed on rank ", first, ": ", packed.substr(1)));
}

int64_t ControlPlane::broadcast(int64_t value, int root, const CollectiveTag& what) {
  comm_->broadcast(&value, 1, DType::i64, root, what)->wait(timeout_);
  return value;
}

std::string ControlPlane::broadcast(std::string text, int root, const CollectiveTag& what) {
  const auto len = broadcast(static_cast<int64_t>(text.size()), root, what);
  text.resize(static_cast<size_t>(len));
  if (len > 0) comm_->broadcast(text.data(), text.size(), DType::u8, root, what)->wait(timeout_);
  return text;
}

int64_t ControlPlane::run_on_root(int root, const CollectiveTag& what, const std::function<int64_t()>& work) {
  int64_t value = 0;
  std::exception_ptr error;
  if (rank() == root) {
    try {
      value = work();
    } catch (...) {
      error = std::current_exception();
    }
  }
  agree(error, what);
  return broadcast(value, root, what);
}

void ControlPlane::check_consistent(const std::string& what, const std::string& canonical_lines) {
  const CollectiveTag tag{"consistency check of the " + what};
  uint64_t mine = fnv1a64(canonical_lines);
  std::vector<uint64_t> all(static_cast<size_t>(size()));
  comm_->allgather(&mine, all.data(), 1, DType::i64, tag)->wait(timeout_);
  std::vector<int> differing;
  for (int r = 1; r < size(); ++r)
    if (all[static_cast<size_t>(r)] != all[0]) differing.push_back(r);
  if (differing.empty()) return;

  // Rank 0's text goes to everyone; the first differing rank words the difference and sends
  // it back so that every rank throws (and logs) the same message.
  const std::string ref = broadcast(canonical_lines, 0, tag);
  const int culprit = differing.front();
  const std::string msg =
      broadcast(rank() == culprit ? first_difference(rank(), canonical_lines, ref) : std::string(), culprit, tag);
  std::ostringstream os;
  os << what << " differs across ranks: " << msg;
  if (differing.size() > 1) {
    os << " (ranks differing from rank 0:";
    for (int r : differing) os << " " << r;
    os << ")";
  }
  THETAD_LOG(error, "comm") << os.str();
  throw ConfigError(os.str());
}

void ControlPlane::barrier(const CollectiveTag& what) { comm_->barrier(what)->wait(timeout_); }

std::vector<int64_t> ControlPlane::gather(const std::vector<int64_t>& values, const CollectiveTag& what) {
  std::vector<int64_t> all(values.size() * static_cast<size_t>(size()));
  if (!values.empty()) comm_->allgather(values.data(), all.data(), values.size(), DType::i64, what)->wait(timeout_);
  return all;
}

// The values travel as 64-bit words (a double's bits), so one allgather serves both types.
template <typename T, typename Pick>
std::vector<T> ControlPlane::reduce(std::vector<T> values, const CollectiveTag& what, Pick pick) {
  static_assert(sizeof(T) == sizeof(int64_t), "64-bit values only");
  std::vector<int64_t> words(values.size());
  if (!values.empty()) std::memcpy(words.data(), values.data(), values.size() * sizeof(T));
  const std::vector<int64_t> all = gather(words, what);
  for (size_t r = 0; r < static_cast<size_t>(size()); ++r) {
    for (size_t i = 0; i < values.size(); ++i) {
      T v;
      std::memcpy(&v, &all[r * values.size() + i], sizeof v);
      values[i] = r == 0 ? v : pick(values[i], v);
    }
  }
  return values;
}

std::vector<int64_t> ControlPlane::min(std::vector<int64_t> values, const CollectiveTag& what) {
  return reduce(std::move(values), what, [](int64_t a, int64_t b) { return std::min(a, b); });
}

std::vector<int64_t> ControlPlane::max(std::vector<int64_t> values, const CollectiveTag& what) {
  return reduce(std::move(values), what, [](int64_t a, int64_t b) { return std::max(a, b); });
}

std::vector<double> ControlPlane::min(std::vector<double> values, const CollectiveTag& what) {
  return reduce(std::move(values), what, [](double a, double b) { return std::min(a, b); });
}

std::vector<double> ControlPlane::max(std::vector<double> values, const CollectiveTag& what) {
  return reduce(std::move(values), what, [](double a, double b) { return std::max(a, b); });
}

ControlPlane::AnyFlag ControlPlane::post_any(bool flag, const CollectiveTag& what) {
  AnyFlag f;
  f.flag_ = std::make_shared<int32_t>(flag ? 1 : 0);
  f.timeout_ = timeout_;
  AllreduceOptions o;
  o.op = ReduceOp::max;
  o.tag = what;
  f.work_ = comm_->allreduce(f.flag_.get(), 1, DType::i32, o);
  return f;
}

void ControlPlane::AnyFlag::keep_if_in_flight() noexcept {
  if (work_ && !work_->is_completed()) leak_on_purpose(new std::shared_ptr<int32_t>(std::move(flag_)));
}

ControlPlane::AnyFlag::~AnyFlag() { keep_if_in_flight(); }

ControlPlane::AnyFlag& ControlPlane::AnyFlag::operator=(AnyFlag&& o) noexcept {
  if (this != &o) {
    keep_if_in_flight();
    work_ = std::move(o.work_);
    timeout_ = o.timeout_;
    flag_ = std::move(o.flag_);
  }
  return *this;
}

bool ControlPlane::AnyFlag::get() {
  if (!work_) return false;
  work_->wait(timeout_);
  work_.reset();
  return *flag_ > 0;
}

ControlPlane::Gathered ControlPlane::post_gather(std::vector<int64_t> words, const CollectiveTag& what) {
  Gathered g;
  g.timeout_ = timeout_;
  g.buffers_ = std::make_shared<Gathered::Buffers>();
  g.buffers_->recv.resize(words.size() * static_cast<size_t>(size()));
  g.buffers_->send = std::move(words);
  if (!g.buffers_->send.empty())
    g.work_ = comm_->allgather(g.buffers_->send.data(), g.buffers_->recv.data(), g.buffers_->send.size(),
                               DType::i64, what);
  return g;
}

ControlPlane::Gathered::~Gathered() {
  if (work_ && !work_->is_completed()) leak_on_purpose(new std::shared_ptr<Buffers>(std::move(buffers_)));
}

bool ControlPlane::Gathered::ready() const { return !work_ || work_->is_completed(); }

const std::vector<int64_t>& ControlPlane::Gathered::get() {
  THETAD_CHECK(buffers_, InternalError, "ControlPlane::Gathered::get: nothing was posted");
  if (work_) {
    work_->wait(timeout_);
    work_.reset();
  }
  return buffers_->recv;
}

}  // namespace thetad::comm
