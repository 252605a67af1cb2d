// The launcher's connections from its host's wrappers (see wrapper_links.hpp).
#include "launch/wrapper_links.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>

namespace thetad::launch {

namespace {
constexpr int kReportedRefusals = 10;  // then one line says the rest are not reported
}  // namespace

WrapperLinks::WrapperLinks(int ranks, Sink lines, Sink log)
    : ranks_(ranks), lines_(std::move(lines)), log_(std::move(log)) {}

void WrapperLinks::open() {
  listener_ = std::make_unique<LogListener>();
  if (!listener_->valid()) {  // the wrappers write to their stderr, which mpirun carries
    log_("no log socket (" + listener_->why() + "): the ranks' lines come through mpirun");
    listener_.reset();
    return;
  }
  ::setenv(kLogSocketVar, listener_->path().c_str(), 1);
  ::setenv(kLogTokenVar, listener_->token().c_str(), 1);
}

void WrapperLinks::hide() {
  ::unsetenv(kLogSocketVar);
  ::unsetenv(kLogTokenVar);
}

void WrapperLinks::add_poll_fds(std::vector<pollfd>& fds) const {
  fds.push_back({listener_ ? listener_->fd() : -1, POLLIN, 0});
  for (const auto& l : links_) fds.push_back({l->fd.get(), POLLIN, 0});
}

void WrapperLinks::handle(const std::vector<pollfd>& fds, size_t first, double now) {
  for (size_t i = links_.size(); i-- > 0;)
    if (fds[first + 1 + i].revents && !read(*links_[i])) links_.erase(links_.begin() + long(i));
  if (fds[first].revents) accept_all(now);
}

void WrapperLinks::refuse(const std::string& why) {
  if (++refusals_ <= kReportedRefusals) log_(why);
  if (refusals_ == kReportedRefusals) log_("further refused log connections are not reported");
}

void WrapperLinks::accept_all(double now) {
  for (;;) {
    std::string refused;
    LogListener::Peer p = listener_->accept(refused);
    if (!p.fd) {
      if (refused.empty()) return;
      refuse(refused);
      continue;
    }
    const size_t pending = size_t(std::count_if(links_.begin(), links_.end(), [](const auto& l) { return l->rank < 0; }));
    if (pending >= kMaxPending) {
      refuse("refused a log connection from pid " + std::to_string(p.pid) + ": " + std::to_string(kMaxPending) +
             " connections wait for their first line already");
      continue;
    }
    auto l = std::make_unique<Link>();
    l->fd = std::move(p.fd);
    l->pid = p.pid;
    l->deadline = now + kHelloWaitS;
    links_.push_back(std::move(l));
  }
}

bool WrapperLinks::read(Link& l) {
  char buf[65536];
  // Until it is proven, no more than a hello may come in.
  const size_t want = l.rank >= 0 ? sizeof buf : kMaxHelloBytes - l.hello.size();
  const ssize_t n = ::read(l.fd.get(), buf, want);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (n <= 0) {
    if (l.rank >= 0) {
      lines_(l.buf.finish());
      closed_order_.push_back(l.rank);
    }
    return false;
  }
  if (l.rank >= 0) {
    lines_(l.buf.feed(buf, size_t(n)));
    return true;
  }
  l.hello.append(buf, size_t(n));
  const size_t nl = l.hello.find('\n');
  if (nl != std::string::npos) return prove(l, l.hello.substr(nl + 1));
  if (l.hello.size() < kMaxHelloBytes) return true;
  refuse("refused a log connection from pid " + std::to_string(l.pid) + ": no first line within " +
         std::to_string(kMaxHelloBytes) + " bytes");
  return false;
}

bool WrapperLinks::prove(Link& l, std::string rest) {
  l.hello.resize(l.hello.find('\n'));
  std::string why;
  const int rank = check_hello(l.hello, listener_->token(), ranks_, why);
  if (rank >= 0 && ranks().count(rank)) why = "for rank " + std::to_string(rank) + ", connected already";
  if (rank < 0 || !why.empty()) {
    refuse("refused a log connection from pid " + std::to_string(l.pid) + ": " + why);
    return false;
  }
  l.rank = rank;
  l.hello.clear();
  l.pidfd = pidfd_open(l.pid);
  if (stop_sent_) pidfd_signal(l.pidfd.get(), l.pid, SIGTERM);  // came up after the stop
  if (!rest.empty()) lines_(l.buf.feed(rest.data(), rest.size()));
  return true;
}

int WrapperLinks::next_deadline_ms(double now) const {
  double first = -1;
  for (const auto& l : links_)
    if (l->rank < 0 && (first < 0 || l->deadline < first)) first = l->deadline;
  return first < 0 ? -1 : std::max(0, int((first - now) * 1000) + 1);
}

void WrapperLinks::expire(double now) {
  for (size_t i = links_.size(); i-- > 0;) {
    const Link& l = *links_[i];
    if (l.rank >= 0 || l.deadline > now) continue;
    refuse("refused a log connection from pid " + std::to_string(l.pid) + ": no first line within " +
           std::to_string(int(kHelloWaitS)) + " s");
    links_.erase(links_.begin() + long(i));
  }
}

void WrapperLinks::stop_all() {
  stop_sent_ = true;
  for (const auto& l : links_)
    if (l->rank >= 0) pidfd_signal(l->pidfd.get(), l->pid, SIGTERM);
}

std::set<int> WrapperLinks::ranks() const {
  std::set<int> out;
  for (const auto& l : links_)
    if (l->rank >= 0) out.insert(l->rank);
  return out;
}

std::set<pid_t> WrapperLinks::pids() const {
  std::set<pid_t> out;
  for (const auto& l : links_)
    if (l->rank >= 0 && l->pid > 0) out.insert(l->pid);
  return out;
}

size_t WrapperLinks::proven() const { return ranks().size(); }

}  // namespace thetad::launch
