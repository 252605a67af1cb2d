// Memory that is deliberately never freed — buffers a collective still in flight may write into
// when its owner is destroyed after an error — told to LeakSanitizer, so that a sanitizer run
// reports only real leaks. A no-op in builds without it.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define THETAD_LEAK_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(leak_sanitizer)
#define THETAD_LEAK_SANITIZER 1
#endif
#endif
#ifdef THETAD_LEAK_SANITIZER
#include <sanitizer/lsan_interface.h>
#endif

namespace thetad {

// `p`, kept alive to the process's end; what it points to counts as reachable.
template <typename T>
T* leak_on_purpose(T* p) noexcept {
#ifdef THETAD_LEAK_SANITIZER
  if (p != nullptr) __lsan_ignore_object(p);
#endif
  return p;
}

}  // namespace thetad
