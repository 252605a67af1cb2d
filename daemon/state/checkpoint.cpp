// Checkpoint files: LibTorch pickles (torch.load-able dicts) plus a JSON manifest; atomic by
// directory rename. See checkpoint.hpp for the layout and protocol.
#include "daemon/state/checkpoint.hpp"

#include <torch/serialize.h>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <regex>
#include <sstream>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "comm/bucket_plan.hpp"
#include "common/text.hpp"
#include "daemon/core/manifest.hpp"

namespace fs = std::filesystem;

namespace thetad::daemon {
namespace {

std::string step_name(int64_t step) {
  std::ostringstream os;
  os << "step-" << std::setw(8) << std::setfill('0') << step;
  return os.str();
}

[[noreturn]] void io_error(const std::string& what, const fs::path& p) {
  throw Error("checkpoint: " + what + " " + p.string() + ": " + std::strerror(errno));
}

// Writes the file under path.part, on disk (fsync) before it takes its name: a crash leaves the
// old contents or the new ones, never a torn file.
void write_file_durable(const fs::path& path, const std::vector<char>& bytes) {
  fs::path part = path;
  part += ".part";
  const int fd = ::open(part.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) io_error("cannot write", part);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      io_error("short write to", part);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    io_error("cannot sync", part);
  }
  if (::close(fd) != 0) io_error("cannot close", part);
  fs::rename(part, path);
}

// A directory's entries (creations, renames) on disk.
void sync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) io_error("cannot open directory", dir);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0 && errno != EINVAL) io_error("cannot sync directory", dir);  // EINVAL: fs without it
}

// Completed steps of a checkpoint directory's name, or -1.
int64_t step_of(const fs::path& p) {
  static const std::regex re("step-([0-9]{8})");
  std::smatch m;
  const std::string name = p.filename().string();
  return std::regex_match(name, m, re) ? std::stoll(m[1].str()) : -1;
}

// After publishing `step`: keeps the newest `keep` checkpoints up to it (it included) and drops
// the temporary directories of interrupted writes. Newer checkpoints, if any, are left alone.
void prune(const fs::path& root, int64_t step, int64_t keep) {
  std::vector<std::pair<int64_t, fs::path>> older;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".tmp-step-", 0) == 0) {
      fs::remove_all(e.path());
      continue;
    }
    const int64_t s = step_of(e.path());
    if (s >= 0 && s < step) older.emplace_back(s, e.path());
  }
  std::sort(older.begin(), older.end());
  const size_t keep_older = keep > 1 ? static_cast<size_t>(keep - 1) : 0;
  for (size_t i = 0; i + keep_older < older.size(); ++i) fs::remove_all(older[i].second);
}

// A checkpoint file's bytes; ConfigError naming it where it cannot be read whole.
std::vector<char> read_bytes(const fs::path& p) {
  std::error_code ec;
  if (!fs::is_regular_file(p, ec))
    throw ConfigError(p.string() + ": " + (fs::exists(p, ec) ? "not a regular file" : "missing") +
                      " (the checkpoint is damaged; use --no-resume or another checkpoint.dir)");
  std::ifstream in(p, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw ConfigError(p.string() + ": cannot be read: " + std::strerror(errno));
  return bytes;
}

std::string checksum_part(int rank) { return "checksums-rank-" + std::to_string(rank) + ".txt"; }

// Whether a host tensor holds only finite values (a plain loop: checkpoints of a million tiny
// tensors cannot afford a LibTorch reduction per tensor).
bool all_finite(const at::Tensor& t) {
  if (t.scalar_type() != at::kFloat) return torch::isfinite(t).all().item<bool>();
  const at::Tensor c = t.contiguous();
  const float* v = c.data_ptr<float>();
  bool finite = true;
  for (int64_t i = 0, n = c.numel(); i < n; ++i) finite &= std::isfinite(v[i]);
  return finite;
}

// A shard's groups as one torch.load-able dict of five tensors (a tensor per parameter would
// make a million tiny tasks millions of records, minutes to write): "param", "exp_avg" and
// "exp_avg_sq" (float32, the groups' values one after the other, each group in its flat layout:
// parameters in registration order), "offsets" (int64 [count + 1], where each group starts) and
// "steps" (int64 [count]). Never a checkpoint of non-finite parameters: it would become the
// newest and, with keep, replace the last good one (the write fails on every rank, exit 1, and
// its temporary directory goes).
std::vector<char> pickle_shard(const CheckpointWriter& w, const ManifestShard& shard,
                               const std::function<GroupState(int)>& group_state) {
  std::vector<float> param, exp_avg, exp_avg_sq;
  std::vector<int64_t> offsets{0}, steps;
  // Appends a tensor's values: host fp32 tensors (the common case, millions of tiny ones) by
  // memcpy, without a LibTorch operation each; anything else through a host copy.
  const auto append = [](std::vector<float>& out, const at::Tensor& t) {
    const at::Tensor c = t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous()
                             ? t : t.detach().to(torch::kCPU, torch::kFloat32).contiguous();
    const float* v = c.data_ptr<float>();
    out.insert(out.end(), v, v + c.numel());
  };
  for (int64_t g = shard.first; g < shard.first + shard.count; ++g) {
    const GroupState st = group_state(static_cast<int>(g));
    for (size_t i = 0; i < st.names.size(); ++i) {
      const size_t at = param.size();
      append(param, st.params[i]);
      bool finite = true;
      for (size_t k = at; k < param.size(); ++k) finite &= std::isfinite(param[k]);
      if (!finite)
        throw Error("non-finite parameters after step " + std::to_string(w.step) + ": parameter '" + st.names[i] +
                    "' of group " + std::to_string(g) + " holds NaN or Inf; the checkpoint of step " +
                    std::to_string(w.step) + " is not written");
      append(exp_avg, st.exp_avg[i]);
      append(exp_avg_sq, st.exp_avg_sq[i]);
    }
    offsets.push_back(static_cast<int64_t>(param.size()));
    steps.push_back(st.steps);
  }
  // from_blob: the dict's tensors view the vectors, which outlive the pickling below.
  const auto view = [](auto& v, at::ScalarType type) {
    return torch::from_blob(v.data(), {static_cast<int64_t>(v.size())}, type);
  };
  c10::Dict<std::string, at::Tensor> dict;
  dict.insert("param", view(param, at::kFloat));
  dict.insert("exp_avg", view(exp_avg, at::kFloat));
  dict.insert("exp_avg_sq", view(exp_avg_sq, at::kFloat));
  dict.insert("offsets", view(offsets, at::kLong));
  dict.insert("steps", view(steps, at::kLong));
  return torch::pickle_save(c10::IValue(dict));
}

}  // namespace

std::optional<CheckpointInfo> find_latest_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return std::nullopt;
  std::optional<CheckpointInfo> best;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const int64_t step = step_of(entry.path());
    if (step < 0) continue;
    if (!fs::exists(entry.path() / "manifest.json")) continue;  // incomplete
    if (!best || step > best->step) best = CheckpointInfo{entry.path().string(), step};
  }
  return best;
}

std::string checkpoint_path(const std::string& dir, int64_t step) { return (fs::path(dir) / step_name(step)).string(); }

std::string write_checkpoint(const CheckpointWriter& w, const std::function<GroupState(int)>& group_state) {
  const int num_groups = static_cast<int>(w.group_bytes.size());
  const fs::path root(w.dir);
  const fs::path tmp = root / (".tmp-" + step_name(w.step));
  const fs::path final_dir = root / step_name(w.step);
  bool ok = true;
  std::string error;
  if (w.rank == 0) {
    try {
      fs::create_directories(root);
      fs::remove_all(tmp);  // left over from a run killed mid-write
      fs::create_directories(tmp);
    } catch (const std::exception& e) {
      ok = false;
      error = e.what();
    }
  }
  w.barrier();
  const std::vector<ManifestShard> shards = plan_shards(w.group_bytes);
  if (ok) {
    try {
      std::ostringstream sums;  // "shard fnv1a64" per line: rank 0 puts them in the manifest
      for (size_t s = static_cast<size_t>(w.rank); s < shards.size(); s += static_cast<size_t>(w.world)) {
        const std::vector<char> bytes = pickle_shard(w, shards[s], group_state);
        write_file_durable(tmp / shards[s].file, bytes);
        sums << s << " " << comm::fnv1a64(bytes.data(), bytes.size()) << "\n";
      }
      const std::string text = sums.str();
      write_file_durable(tmp / checksum_part(w.rank), std::vector<char>(text.begin(), text.end()));
    } catch (const std::exception& e) {
      ok = false;
      error = e.what();
    }
  }
  // Every rank learns whether all succeeded; each throws the same way if not. A failed write
  // (a full disk) leaves no temporary directory behind to fill the disk further: rank 0 removes
  // it once every rank has stopped writing (the agreement), and the newest complete checkpoint
  // stays what it was.
  const auto agree = [&](const char* elsewhere) {
    if (w.all_ok(ok)) return;
    std::string removed;
    if (w.rank == 0) {
      std::error_code ec;
      fs::remove_all(tmp, ec);
      removed = ec ? "; could not remove " + tmp.string() + ": " + ec.message() : "; " + tmp.string() + " removed";
    }
    throw Error("checkpoint at step " + std::to_string(w.step) + " failed" +
                (error.empty() ? std::string(elsewhere) : ": " + error) + removed +
                " (the newest complete checkpoint in " + w.dir + " is unchanged)");
  };
  agree(" on another rank");
  // Rank 0 publishes: the manifest last, the directory renamed into place once everything in it
  // is on disk, then the rename itself synced.
  if (w.rank == 0) try {
    Manifest m;
    m.job = w.job_name;
    m.job_hash = w.job_hash;
    m.step = w.step;
    m.world_size = w.world;
    m.num_groups = num_groups;
    m.shards = shards;
    std::vector<uint8_t> summed(shards.size(), 0);
    for (int r = 0; r < w.world; ++r) {  // every rank's checksums, then its part file goes
      const fs::path part = tmp / checksum_part(r);
      std::ifstream in(part);
      size_t sh = 0;
      uint64_t sum = 0;
      while (in >> sh >> sum) {
        THETAD_CHECK(sh < shards.size(), InternalError, part.string(), ": shard ", sh);
        m.shards[sh].fnv1a64 = sum;
        summed[sh] = 1;
      }
      fs::remove(part);
    }
    for (size_t sh = 0; sh < shards.size(); ++sh)
      THETAD_CHECK(summed[sh], InternalError, "checkpoint: no checksum for ", shards[sh].file);
    const std::string s = manifest_json(m);
    write_file_durable(tmp / "manifest.json", std::vector<char>(s.begin(), s.end()));
    sync_dir(tmp);
    fs::remove_all(final_dir);  // the same step written before (a rerun): replaced whole
    fs::rename(tmp, final_dir);
    sync_dir(root);
    prune(root, w.step, w.keep);
    THETAD_LOG(info, "ckpt") << "checkpoint written: " << final_dir.string();
  } catch (const std::exception& e) {
    ok = false;
    error = e.what();
  }
  agree(" on rank 0");
  return final_dir.string();
}

CheckpointDirLock::CheckpointDirLock(const std::string& dir, const std::string& job_name) {
  const auto refuse = [&](const std::string& why) {
    throw ConfigError("checkpoint.dir " + dir + ": " + why + " (found before any step)");
  };
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir, ec)) refuse(fs::exists(dir) ? "exists and is not a directory" : "cannot be created: " + ec.message());
  const fs::path lock = fs::path(dir) / ".lock";
  fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) refuse(std::string("not writable: ") + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string holder(256, '\0');
    const ssize_t n = ::pread(fd_, holder.data(), holder.size(), 0);
    holder.resize(n > 0 ? static_cast<size_t>(n) : 0);
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\0')) holder.pop_back();
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK)
      refuse("in use by another job (" + (holder.empty() ? std::string("holder unknown") : holder) +
             "); two jobs on one checkpoint directory would publish over each other's steps");
    refuse(std::string("cannot be locked: ") + std::strerror(err));
  }
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  const std::time_t now = std::time(nullptr);
  char stamp[32];
  std::tm utc{};
  gmtime_r(&now, &utc);
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &utc);
  const std::string who = "job " + job_name + ", pid " + std::to_string(::getpid()) + " on " + host + " since " + stamp;
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, who.data(), who.size(), 0) != static_cast<ssize_t>(who.size()))
    refuse(std::string("not writable: ") + std::strerror(errno));
  // The checkpoints themselves need files written and synced in it: prove it now, not after training.
  const fs::path probe = fs::path(dir) / ".write-probe";
  try {
    write_file_durable(probe, std::vector<char>(who.begin(), who.end()));
    fs::remove(probe);
  } catch (const std::exception& e) {
    refuse(std::string("not writable: ") + e.what());
  }
}

CheckpointDirLock::~CheckpointDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

std::string set_aside_checkpoints(const std::string& dir) {
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return "";
  std::vector<fs::path> found;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (step_of(e.path()) >= 0) found.push_back(e.path());
  if (found.empty()) return "";
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &utc);
  fs::path aside = fs::path(dir) / (std::string("previous-") + stamp);
  for (int i = 1; fs::exists(aside); ++i) aside = fs::path(dir) / (std::string("previous-") + stamp + "-" + std::to_string(i));
  fs::create_directories(aside);
  for (const auto& p : found) fs::rename(p, aside / p.filename());
  sync_dir(aside);
  sync_dir(dir);
  return aside.string();
}

CheckpointReader::CheckpointReader(const CheckpointInfo& ckpt, int num_groups, const std::string& expected_job_hash)
    : ckpt_(ckpt) {
  const fs::path path = fs::path(ckpt.path) / "manifest.json";
  const std::vector<char> text = read_bytes(path);
  manifest_ = parse_manifest(std::string(text.begin(), text.end()), path.string());
  if (manifest_.step != ckpt.step)
    throw ConfigError(path.string() + ": step: " + std::to_string(manifest_.step) + " but the directory is of step " +
                      std::to_string(ckpt.step) + " (the checkpoint is damaged; use --no-resume or another "
                      "checkpoint.dir)");
  if (!expected_job_hash.empty() && manifest_.job_hash != expected_job_hash)
    throw ConfigError(path.string() + ": checkpoint is of another model (job_hash " + manifest_.job_hash +
                      ", this job " + expected_job_hash + "); use --no-resume or another checkpoint.dir");
  if (num_groups >= 0 && manifest_.num_groups != num_groups)
    throw ConfigError(path.string() + ": groups: " + std::to_string(manifest_.num_groups) + " groups, this job has " +
                      std::to_string(num_groups) + " (use --no-resume or another checkpoint.dir)");
}

// A checkpoint file's bytes checked against the manifest's checksum, then unpickled as a dict
// (ConfigError naming the file otherwise).
c10::impl::GenericDict CheckpointReader::load_file(const std::string& name, bool has_checksum, uint64_t checksum) const {
  const fs::path file = fs::path(ckpt_.path) / name;  // a fixed name: parse_manifest allows no path
  const std::vector<char> bytes = read_bytes(file);
  if (has_checksum) {
    const uint64_t sum = comm::fnv1a64(bytes.data(), bytes.size());
    if (sum != checksum) {
      std::ostringstream os;
      os << "checksum " << std::hex << std::setw(16) << std::setfill('0') << sum << " where manifest.json says "
         << std::setw(16) << checksum << " (" << std::dec << bytes.size() << " bytes)";
      throw damaged(name, os.str());
    }
  }
  try {
    c10::IValue v = torch::pickle_load(bytes);
    if (!v.isGenericDict()) throw damaged(name, "not a dict of tensors");
    return v.toGenericDict();
  } catch (const c10::Error& e) {
    throw damaged(name, std::string("not a dict of tensors: ") + e.what_without_backtrace());
  }
}

ConfigError CheckpointReader::damaged(const std::string& name, const std::string& what) const {
  return ConfigError((fs::path(ckpt_.path) / name).string() + ": " + what +
                     " (the checkpoint is damaged; use --no-resume or another checkpoint.dir)");
}

// A tensor of the dict by key (ConfigError naming the file and key where missing or another type).
at::Tensor CheckpointReader::tensor(const c10::impl::GenericDict& dict, const std::string& key,
                                    const std::string& file) const {
  auto it = dict.find(key);
  if (it == dict.end()) throw damaged(file, "key '" + key + "' missing");
  if (!it->value().isTensor()) throw damaged(file, "key '" + key + "' is not a tensor");
  return it->value().toTensor();
}

GroupState CheckpointReader::load_group(int group) const {
  THETAD_CHECK(group >= 0 && group < manifest_.num_groups, InternalError, "no group ", group, " in ", ckpt_.path);
  return manifest_.shards.empty() ? load_group_file(group) : load_shard_group(group);
}

// Format 3: the group's slice of its shard, the shard read and checked once for all its groups
// (resume goes in group order). Names are not stored: the flat layout is the model's, which the
// manifest's job_hash vouches for; RunState splits it.
GroupState CheckpointReader::load_shard_group(int group) const {
  const size_t s = shard_of(manifest_, group);
  const ManifestShard& sh = manifest_.shards[s];
  if (shard_.index != static_cast<int64_t>(s)) {
    shard_ = {};
    const c10::impl::GenericDict dict = load_file(sh.file, true, sh.fnv1a64);
    const auto values = [&](const char* key) {
      at::Tensor t = tensor(dict, key, sh.file);
      if (t.dim() != 1 || t.scalar_type() != at::kFloat) throw damaged(sh.file, std::string("key '") + key + "' is not float32 [n]");
      return t;
    };
    shard_.param = values("param");
    shard_.exp_avg = values("exp_avg");
    shard_.exp_avg_sq = values("exp_avg_sq");
    const at::Tensor offsets = tensor(dict, "offsets", sh.file), steps = tensor(dict, "steps", sh.file);
    if (offsets.dim() != 1 || offsets.scalar_type() != at::kLong || offsets.numel() != sh.count + 1)
      throw damaged(sh.file, "key 'offsets' is not int64 [" + std::to_string(sh.count + 1) + "]");
    if (steps.dim() != 1 || steps.scalar_type() != at::kLong || steps.numel() != sh.count)
      throw damaged(sh.file, "key 'steps' is not int64 [" + std::to_string(sh.count) + "]");
    const int64_t n = shard_.param.numel();
    if (shard_.exp_avg.numel() != n || shard_.exp_avg_sq.numel() != n)
      throw damaged(sh.file, "keys 'param', 'exp_avg' and 'exp_avg_sq' differ in length");
    shard_.offsets.assign(offsets.data_ptr<int64_t>(), offsets.data_ptr<int64_t>() + offsets.numel());
    shard_.steps.assign(steps.data_ptr<int64_t>(), steps.data_ptr<int64_t>() + steps.numel());
    for (size_t i = 0; i + 1 < shard_.offsets.size(); ++i)
      if (shard_.offsets[i] > shard_.offsets[i + 1]) throw damaged(sh.file, "key 'offsets' decreases");
    if (shard_.offsets.front() != 0 || shard_.offsets.back() != n)
      throw damaged(sh.file, "key 'offsets' does not span 'param' (" + std::to_string(n) + " values)");
    shard_.index = static_cast<int64_t>(s);
  }
  const size_t i = static_cast<size_t>(group - sh.first);
  const int64_t a = shard_.offsets[i], len = shard_.offsets[i + 1] - a;
  GroupState st;
  st.group = group;
  st.params = {shard_.param.narrow(0, a, len)};
  // Training on from NaN or Inf would only spread it: refused before any step.
  if (!all_finite(st.params[0]))
    throw ConfigError((fs::path(ckpt_.path) / sh.file).string() + ": group " + std::to_string(group) +
                      ": parameters hold NaN or Inf (resume from an earlier checkpoint, or start anew with --no-resume)");
  st.exp_avg = {shard_.exp_avg.narrow(0, a, len)};
  st.exp_avg_sq = {shard_.exp_avg_sq.narrow(0, a, len)};
  st.steps = shard_.steps[i];
  return st;
}

// Formats 1 and 2: a file per group, tensors by name.
GroupState CheckpointReader::load_group_file(int group) const {
  const ManifestGroup& mg = manifest_.groups[static_cast<size_t>(group)];
  const c10::impl::GenericDict dict = load_file(mg.file, mg.has_checksum, mg.fnv1a64);
  GroupState st;
  st.group = group;
  for (const auto& item : dict) {
    if (!item.key().isString()) throw damaged(mg.file, "a key that is not a string");
    const std::string key = item.key().toStringRef();
    if (key.rfind("param/", 0) == 0) st.names.push_back(key.substr(6));
  }
  for (const auto& name : st.names) {
    st.params.push_back(tensor(dict, "param/" + name, mg.file));
    if (!all_finite(st.params.back()))
      throw ConfigError((fs::path(ckpt_.path) / mg.file).string() + ": parameter '" + name +
                        "' holds NaN or Inf (resume from an earlier checkpoint, or start anew with --no-resume)");
    st.exp_avg.push_back(tensor(dict, "exp_avg/" + name, mg.file));
    st.exp_avg_sq.push_back(tensor(dict, "exp_avg_sq/" + name, mg.file));
  }
  const at::Tensor steps = tensor(dict, "steps", mg.file);
  if (steps.numel() != 1 || steps.scalar_type() != at::kLong) throw damaged(mg.file, "key 'steps' is not one int64");
  st.steps = steps.item<int64_t>();
  return st;
}

GroupState in_model_layout(const GroupState& loaded, const ParamGroups& groups, int g, const std::string& where) {
  if (loaded.names.empty()) {
    const int64_t n = groups.numel(g);
    if (loaded.params.size() != 1 || loaded.params[0].numel() != n)
      throw ConfigError(where + ": group " + std::to_string(g) + " holds " +
                        std::to_string(loaded.params.empty() ? 0 : loaded.params[0].numel()) +
                        " values where this model's group has " + std::to_string(n));
    GroupState st;
    st.group = g;
    st.steps = loaded.steps;
    for (int p : groups.members[static_cast<size_t>(g)]) {
      const NamedParam& np = groups[p];
      const auto off = static_cast<int64_t>(groups.offset[static_cast<size_t>(p)]);
      st.names.push_back(np.name);
      st.params.push_back(loaded.params[0].narrow(0, off, np.tensor.numel()).view(np.tensor.sizes()));
      st.exp_avg.push_back(loaded.exp_avg[0].narrow(0, off, np.tensor.numel()).view(np.tensor.sizes()));
      st.exp_avg_sq.push_back(loaded.exp_avg_sq[0].narrow(0, off, np.tensor.numel()).view(np.tensor.sizes()));
    }
    return st;
  }
  std::map<std::string, size_t> by_name;
  for (size_t i = 0; i < loaded.names.size(); ++i) by_name[loaded.names[i]] = i;
  GroupState st;
  st.group = g;
  st.steps = loaded.steps;
  for (int p : groups.members[static_cast<size_t>(g)]) {
    const NamedParam& np = groups[p];
    auto it = by_name.find(np.name);
    if (it == by_name.end()) throw ConfigError(where + ": parameter '" + np.name + "' missing");
    if (!loaded.params[it->second].sizes().equals(np.tensor.sizes()))
      throw ConfigError(where + ": parameter '" + np.name + "' has another shape");
    st.names.push_back(np.name);
    st.params.push_back(loaded.params[it->second]);
    st.exp_avg.push_back(loaded.exp_avg[it->second]);
    st.exp_avg_sq.push_back(loaded.exp_avg_sq[it->second]);
  }
  return st;
}

}  // namespace thetad::daemon
