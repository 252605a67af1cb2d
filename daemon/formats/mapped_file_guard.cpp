// MappedFile::read_guarded: reads out of a map that survive the file being shortened under them.
// A page of a file mapping past the file's end raises SIGBUS on the thread that touches it, and its
// default action kills the process with no word of the file. One process-wide handler, installed
// once, jumps back to the guarded read of the faulting thread when the address lies in the mapping
// that thread is reading; any other SIGBUS (another mapping, another thread, kill -BUS) gets the
// action there was before, as if this handler had never been installed.
//
// The handler is async-signal-safe: it reads one thread-local pointer and either calls
// siglongjmp or sigaction and raise.
#include "daemon/formats/mapped_file.hpp"

#include <csetjmp>
#include <atomic>
#include <csignal>
#include <mutex>

#include "common/errors.hpp"

namespace thetad::daemon {
namespace {

struct Guard {
  const char* begin;
  const char* end;
  sigjmp_buf* jump;
};

// The read this thread guards now; initial-exec: a plain load in the handler, nothing allocated.
__attribute__((tls_model("initial-exec"))) thread_local const Guard* t_guard = nullptr;

struct sigaction g_before {};  // SIGBUS's action before ours: where unrelated faults go
std::once_flag g_installed;

void on_sigbus(int sig, siginfo_t* info, void* /*context*/) {
  const Guard* g = t_guard;
  const char* at = static_cast<const char*>(info->si_addr);
  // si_code > 0: raised by the kernel for a fault at si_addr (not sent by kill or sigqueue).
  if (g != nullptr && info->si_code > 0 && at >= g->begin && at < g->end) siglongjmp(*g->jump, 1);
  // Not ours: the action before, for this fault and every later one. A fault is raised again as
  // the instruction is retried on return; a sent signal is raised here, delivered on return.
  ::sigaction(SIGBUS, &g_before, nullptr);
  if (info->si_code <= 0) ::raise(sig);
}

void install() {
  struct sigaction sa {};
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  THETAD_CHECK(::sigaction(SIGBUS, &sa, &g_before) == 0, InternalError, "cannot install the SIGBUS handler");
}

}  // namespace

bool MappedFile::read_guarded(void (*fn)(void*), void* arg) const {
  std::call_once(g_installed, install);
  const Guard* const outer = t_guard;  // a read within a read (none today) keeps the outer one
  sigjmp_buf jump;
  const Guard guard{data(), data() + size_, &jump};
  // savemask 1: the jump restores this signal mask, in which SIGBUS is not blocked (the handler
  // runs with it blocked).
  if (sigsetjmp(jump, 1) != 0) {
    t_guard = outer;
    return false;
  }
  t_guard = &guard;
  std::atomic_signal_fence(std::memory_order_seq_cst);  // the handler sees the guard set
  try {
    fn(arg);
  } catch (...) {
    t_guard = outer;
    throw;
  }
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_guard = outer;
  return true;
}

}  // namespace thetad::daemon
