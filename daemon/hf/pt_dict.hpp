// A dict of tensors from a PyTorch archive (model.init_from's state dicts, checkpoint files), read
// by thetad's own strict reader (daemon/formats/pt_file.hpp) instead of LibTorch's unpickler, which
// trusts the pickle's offsets, strides and storage sizes (and whose behaviour differs between
// LibTorch 1.13 and 2.x). The tensors are host tensors over the file's bytes (no copy where
// aligned), kept alive by them.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>

namespace thetad::daemon {

// The dict of the archive in [data, data + size), which `owner` keeps alive: string or integer
// keys; tensor values, or None for a value that is not a tensor (the reader's callers refuse
// those by key). ConfigError "FILE: ..." as read_pt_file throws.
c10::impl::GenericDict pt_dict(std::shared_ptr<const void> owner, const char* data, size_t size,
                               const std::string& file, bool check_crc);

// The file `path` read whole and pt_dict of it, CRCs checked. A path that is not a regular file
// (refused before it is opened) or cannot be read is a ConfigError "PATH: WHAT: ...".
c10::impl::GenericDict load_pt_dict(const std::string& path, const std::string& what);

}  // namespace thetad::daemon
