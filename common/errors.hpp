// The one exception family of thetad and the one place that maps it to exit codes.
// Every layer throws these; `exit_code_for` (errors.cpp) is the only code->exit mapping.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace thetad {

// Process exit codes (docs/architecture.md "Interfaces users see").
enum ExitCode : int {
  kExitOk = 0,
  kExitOther = 1,
  kExitBadInput = 2,
  kExitComm = 3,
  kExitInterrupted = 4,
};

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  virtual int exit_code() const { return kExitOther; }
};

// A bad job file, bad data or bad command line: nothing was started, nothing written.
class ConfigError : public Error {
 public:
  using Error::Error;
  int exit_code() const override { return kExitBadInput; }
};

// A collective failed or a peer is gone.
class CommError : public Error {
 public:
  using Error::Error;
  int exit_code() const override { return kExitComm; }
};

// A collective (or any blocking call) did not finish within its timeout.
class TimeoutError : public CommError {
 public:
  using CommError::CommError;
};

// SIGTERM/SIGINT was honoured: the step finished and a checkpoint was written.
class InterruptedError : public Error {
 public:
  using Error::Error;
  int exit_code() const override { return kExitInterrupted; }
};

// A bug or an unexpected state of a foreign library.
class InternalError : public Error {
 public:
  using Error::Error;
  int exit_code() const override { return kExitOther; }
};

// Maps any exception to the process exit code. The only such mapping in thetad.
int exit_code_for(const std::exception& e) noexcept;

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace thetad

// THETAD_CHECK(cond, ErrorType, msg...) throws ErrorType("file:line: msg") when cond is false.
#define THETAD_CHECK(cond, ErrorType, ...)                                                     \
  do {                                                                                         \
    if (!(cond))                                                                               \
      throw ErrorType(::thetad::detail::concat(__FILE__, ":", __LINE__, ": ", __VA_ARGS__)); \
  } while (0)

// THETAD_CHECK_EQ(a, b, msg...) prints both values on failure (gloo's ENFORCE_EQ).
#define THETAD_CHECK_EQ(a, b, ...)                                                           \
  do {                                                                                       \
    const auto& thetad_a_ = (a);                                                             \
    const auto& thetad_b_ = (b);                                                             \
    if (!(thetad_a_ == thetad_b_))                                                           \
      throw ::thetad::InternalError(::thetad::detail::concat(                                \
          __FILE__, ":", __LINE__, ": expected " #a " == " #b " (", thetad_a_, " vs ",      \
          thetad_b_, "): ", __VA_ARGS__));                                                   \
  } while (0)
