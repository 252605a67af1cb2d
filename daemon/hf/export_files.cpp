// Export directories, staged files and dtypes (see export_files.hpp).
#include "daemon/hf/export_files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "common/errors.hpp"
#include "common/safe_file.hpp"
#include "config/placeholders.hpp"

namespace thetad::daemon {
namespace {

namespace fs = std::filesystem;

// syncfs on the filesystem of each file's directory (one call per filesystem).
template <typename File>
void sync_filesystems(const std::vector<File>& files) {
  std::set<dev_t> done;
  for (const File& f : files) {
    const std::string dir = fs::path(f.path).parent_path().string(), &key = f.key;
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0 || !done.insert(st.st_dev).second) continue;
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    const bool ok = fd >= 0 && ::syncfs(fd) == 0;
    const int e = errno;
    if (fd >= 0) ::close(fd);
    if (!ok) throw Error(dir + ": " + key + ": syncfs: " + std::strerror(e));
  }
}

}  // namespace

std::string adapter_dir(const std::string& pattern, const config::Job& job, int64_t task) {
  config::PathValues values;
  values.job = job.name;
  values.rank = 0;  // every rank reads and writes the same directories
  values.task = task;
  return config::expand_placeholders(pattern, values);
}

void check_export_dir(const std::string& key, const std::string& dir, int64_t task, const std::string& what,
                      const std::function<bool(const std::string&)>& own, std::set<std::string>& probed) {
  const std::string refusing = "refusing to write task " + std::to_string(task) + "'s " + what + " there";
  const std::string before = " (found before any step; " + refusing + ")";
  std::error_code ec;
  std::string at = dir;  // where its files (or its directory) would be created
  while (!fs::exists(fs::symlink_status(at, ec)) && fs::path(at).has_parent_path() && fs::path(at).parent_path() != at)
    at = fs::path(at).parent_path().string();
  if (at == dir && fs::exists(fs::symlink_status(dir, ec))) {
    if (!fs::is_directory(dir, ec)) throw ConfigError(dir + ": " + key + ": exists and is not a directory; " + refusing);
    if (const std::string why = safe_file::make_dirs(dir, true); !why.empty())
      throw ConfigError(dir + ": " + key + ": " + why + before);
    for (const auto& entry : fs::directory_iterator(dir, ec))
      if (!own(entry.path().filename().string()))
        throw ConfigError(dir + ": " + key + ": holds '" + entry.path().filename().string() + "', which is not a " + what +
                          "'s file; " + refusing + " (choose an empty or new directory)");
  }
  if (!probed.insert(at).second) return;
  if (const std::string why = safe_file::probe_writable(at); !why.empty())
    throw ConfigError(dir + ": " + key + ": not writable: " + why + before);
}

void write_text(const std::string& path, const std::string& text) {
  const int fd = safe_file::create_fresh(path);
  if (fd < 0) throw Error(path + ": cannot create: " + std::strerror(errno));
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const int e = errno;
  if (::close(fd) != 0 || !ok) {
    ::unlink(path.c_str());
    throw Error(path + ": cannot write: " + std::strerror(ok ? errno : e));
  }
}

void StagedFiles::publish() {
  sync_filesystems(files_);
  for (const File& f : files_)
    if (std::rename((f.path + ".tmp").c_str(), f.path.c_str()) != 0)
      throw Error(f.path + ": " + f.key + ": cannot rename " + f.path + ".tmp into place: " + std::strerror(errno));
  sync_filesystems(files_);
  files_.clear();
}

void StagedFiles::discard() noexcept {
  for (const File& f : files_) (void)::unlink((f.path + ".tmp").c_str());
  files_.clear();
}

ExportTensor export_tensor(const torch::Tensor& fp32, config::ExportDtype dtype, const std::string& what) {
  static const char* const kWords[] = {"F32", "BF16", "F16"};
  static const torch::ScalarType kTypes[] = {torch::kFloat32, torch::kBFloat16, torch::kFloat16};
  const auto i = static_cast<size_t>(dtype);
  ExportTensor out{fp32.to(torch::kCPU).to(kTypes[i]).contiguous(), kWords[i]};
  // Checked as written: fp16 turns values beyond 65504 into Inf.
  if (!torch::isfinite(out.data).all().item<bool>())
    throw Error(what + " holds NaN or Inf" +
                (dtype == config::ExportDtype::Fp16 && torch::isfinite(fp32).all().item<bool>()
                     ? std::string(" in fp16 (values beyond its range of 65504); export.dtype bf16 or fp32 holds them")
                     : std::string(" (the training diverged: see train.on_nonfinite)")));
  return out;
}

}  // namespace thetad::daemon
