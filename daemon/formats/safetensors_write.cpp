// write_safetensors (see safetensors.hpp): the header as the reference writer lays it out, the
// data after it, written under a temporary name, fsynced and renamed into place.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/errors.hpp"
#include "common/safe_file.hpp"
#include "daemon/formats/safetensors.hpp"

namespace thetad::daemon {
namespace {

void write_all(int fd, const char* p, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw Error(path + ": cannot write: " + std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

void write_safetensors_file(const std::string& path, const std::vector<StWriteTensor>& tensors,
                            const std::map<std::string, std::string>& metadata, bool sync) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const StWriteTensor& t : tensors) {
    const size_t item = st_itemsize(t.dtype);
    const auto numel = static_cast<size_t>(st_numel(t.shape, path, t.name));
    THETAD_CHECK(item != 0 && numel * item == t.nbytes && !header.contains(t.name), InternalError, path,
                 ": write_safetensors: tensor '", t.name, "' (", t.dtype, ", ", t.nbytes, " bytes) is inconsistent or repeated");
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.nbytes}}};
    offset += t.nbytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((uint64_t(text.size()) >> (8 * i)) & 0xff);

  const int fd = safe_file::create_fresh(path);  // a leftover or planted name replaced, never followed
  if (fd < 0) throw Error(path + ": cannot create: " + std::strerror(errno));
  try {
    write_all(fd, len, 8, path);
    write_all(fd, text.data(), text.size(), path);
    for (const StWriteTensor& t : tensors) write_all(fd, static_cast<const char*>(t.data), t.nbytes, path);
    if (sync && ::fsync(fd) != 0) throw Error(path + ": fsync: " + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(path.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    const int e = errno;
    ::unlink(path.c_str());
    throw Error(path + ": close: " + std::strerror(e));
  }
}

void write_safetensors(const std::string& path, const std::vector<StWriteTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::string tmp = path + ".tmp";
  write_safetensors_file(tmp, tensors, metadata, /*sync=*/true);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw Error(path + ": cannot rename " + tmp + " into place: " + std::strerror(e));
  }
}

}  // namespace thetad::daemon
