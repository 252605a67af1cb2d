// Checkpoint files: LibTorch pickles (torch.load-able dicts) plus a JSON manifest; atomic by
// directory rename. See checkpoint.hpp for the layout and protocol.
#include "daemon/checkpoint.hpp"

#include <torch/serialize.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <regex>
#include <sstream>

#include "common/errors.hpp"
#include "common/log.hpp"

namespace fs = std::filesystem;

namespace thetad::daemon {
namespace {

std::string step_name(int64_t step) {
  std::ostringstream os;
  os << "step-" << std::setw(8) << std::setfill('0') << step;
  return os.str();
}

std::string group_file(int group) {
  std::ostringstream os;
  os << "group-" << std::setw(4) << std::setfill('0') << group << ".pt";
  return os.str();
}

void write_file_atomic(const fs::path& path, const std::vector<char>& bytes) {
  fs::path part = path;
  part += ".part";
  {
    std::ofstream out(part, std::ios::binary | std::ios::trunc);
    if (!out) throw Error("checkpoint: cannot write " + part.string());
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) throw Error("checkpoint: short write to " + part.string());
  }
  fs::rename(part, path);
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::optional<CheckpointInfo> find_latest_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return std::nullopt;
  static const std::regex re("step-([0-9]{8})");
  std::optional<CheckpointInfo> best;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (!std::regex_match(name, m, re)) continue;
    if (!fs::exists(entry.path() / "manifest.json")) continue;  // incomplete
    int64_t step = std::stoll(m[1].str());
    if (!best || step > best->step) best = CheckpointInfo{entry.path().string(), step};
  }
  return best;
}

std::string write_checkpoint(const CheckpointWriter& w, int num_groups,
                             const std::function<GroupState(int)>& group_state) {
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
  if (ok) {
    try {
      for (int g = w.rank; g < num_groups; g += w.world) {
        GroupState st = group_state(g);
        c10::Dict<std::string, at::Tensor> dict;
        for (size_t i = 0; i < st.names.size(); ++i) {
          dict.insert("param/" + st.names[i], st.params[i].detach().cpu().contiguous());
          dict.insert("exp_avg/" + st.names[i], st.exp_avg[i].detach().cpu().contiguous());
          dict.insert("exp_avg_sq/" + st.names[i], st.exp_avg_sq[i].detach().cpu().contiguous());
        }
        dict.insert("steps", torch::tensor(st.steps, torch::kInt64));
        write_file_atomic(tmp / group_file(g), torch::pickle_save(c10::IValue(dict)));
      }
    } catch (const std::exception& e) {
      ok = false;
      error = e.what();
    }
  }
  if (!w.all_ok(ok)) {
    throw Error("checkpoint at step " + std::to_string(w.step) + " failed" +
                (error.empty() ? " on another rank" : ": " + error));
  }
  if (w.rank == 0) {
    std::ostringstream m;
    m << "{\n  \"format\": \"thetad-checkpoint-1\",\n  \"job\": \"" << w.job_name
      << "\",\n  \"job_hash\": \"" << w.job_hash << "\",\n  \"step\": " << w.step
      << ",\n  \"world_size\": " << w.world << ",\n  \"groups\": [";
    for (int g = 0; g < num_groups; ++g)
      m << (g ? ", " : "") << "{\"group\": " << g << ", \"file\": \"" << group_file(g) << "\"}";
    m << "]\n}\n";
    std::string s = m.str();
    write_file_atomic(tmp / "manifest.json", std::vector<char>(s.begin(), s.end()));
    fs::remove_all(final_dir);
    fs::rename(tmp, final_dir);
    // Keep the newest `keep` checkpoints.
    std::vector<fs::path> all;
    static const std::regex re("step-[0-9]{8}");
    for (const auto& e : fs::directory_iterator(root))
      if (std::regex_match(e.path().filename().string(), re)) all.push_back(e.path());
    std::sort(all.begin(), all.end());
    for (size_t i = 0; i + static_cast<size_t>(w.keep) < all.size(); ++i) fs::remove_all(all[i]);
    THETAD_LOG(info, "ckpt") << "checkpoint written: " << final_dir.string();
  }
  w.barrier();
  return final_dir.string();
}

GroupState load_group(const CheckpointInfo& ckpt, int group, const std::string& expected_job_hash) {
  const fs::path dir(ckpt.path);
  const std::string manifest = read_text(dir / "manifest.json");
  static const std::regex hash_re("\"job_hash\": \"([0-9a-f]+)\"");
  std::smatch m;
  if (!std::regex_search(manifest, m, hash_re))
    throw ConfigError(ckpt.path + "/manifest.json: no job_hash");
  if (!expected_job_hash.empty() && m[1].str() != expected_job_hash)
    throw ConfigError(ckpt.path + "/manifest.json: checkpoint is of another model (job_hash " +
                      m[1].str() + ", this job " + expected_job_hash +
                      "); use --no-resume or another checkpoint.dir");
  const fs::path file = dir / group_file(group);
  std::ifstream in(file, std::ios::binary);
  if (!in) throw ConfigError(file.string() + ": missing from checkpoint");
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto dict = torch::pickle_load(bytes).toGenericDict();
  GroupState st;
  st.group = group;
  for (const auto& item : dict) {
    const std::string key = item.key().toStringRef();
    if (key.rfind("param/", 0) == 0) st.names.push_back(key.substr(6));
  }
  for (const auto& name : st.names) {
    st.params.push_back(dict.at("param/" + name).toTensor());
    st.exp_avg.push_back(dict.at("exp_avg/" + name).toTensor());
    st.exp_avg_sq.push_back(dict.at("exp_avg_sq/" + name).toTensor());
  }
  st.steps = dict.at("steps").toTensor().item<int64_t>();
  return st;
}

}  // namespace thetad::daemon
