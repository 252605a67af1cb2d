// exit_code_for: the single mapping from exceptions to process exit codes.
#include "common/errors.hpp"

namespace thetad {

int exit_code_for(const std::exception& e) noexcept {
  if (const auto* te = dynamic_cast<const Error*>(&e)) return te->exit_code();
  return kExitOther;
}

}  // namespace thetad
