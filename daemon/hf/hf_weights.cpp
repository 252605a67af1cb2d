// load_safetensors_weights (see hf_weights.hpp).
#include "daemon/hf/hf_weights.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <iomanip>

#include <filesystem>
#include <map>
#include <memory>
#include <vector>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/thread_pool.hpp"
#include "common/text.hpp"
#include "daemon/formats/hf_names.hpp"
#include "daemon/formats/safetensors.hpp"

namespace thetad::daemon {

bool is_safetensors_source(const std::string& path) {
  const std::string ext = ".safetensors";
  std::error_code ec;
  return std::filesystem::is_directory(path, ec) ||
         (path.size() >= ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0);
}

namespace {

void check(const SafetensorsCheckpoint& ck, const std::string& name, const NamedParam& p, const std::string& what) {
  const StTensor& t = ck.tensor(name);
  if (t.shape != p.tensor.sizes().vec())
    throw ConfigError(ck.file_of(name) + ": " + what + ": tensor '" + printable(name) + "' has shape " + st_shape_string(t.shape) +
                      ", the model's " + p.name + " has " + st_shape_string(p.tensor.sizes().vec()));
  if (t.dtype != "F32" && t.dtype != "BF16" && t.dtype != "F16")
    throw ConfigError(ck.file_of(name) + ": " + what + ": tensor '" + printable(name) + "' is " + t.dtype +
                      ", not F32, BF16 or F16");
}

// Elements [first, first + count) of the file's tensor `name`: none may be NaN or infinite
// (training from them fails at the first step, blaming the learning rate), checked on the bits
// before they are converted or copied.
void check_finite(const SafetensorsCheckpoint& ck, const std::string& name, int64_t first, int64_t count,
                  const std::string& what) {
  const StTensor& t = ck.tensor(name);
  const size_t item = st_itemsize(t.dtype);
  int64_t bad = -1;
  unsigned char value[8] = {};  // the first bad one, for the message
  ck.read(name, [&](const char* bytes) {
    const char* src = bytes + static_cast<size_t>(first) * item;
    bad = st_first_nonfinite(t.dtype, src, static_cast<size_t>(count));
    if (bad >= 0) std::memcpy(value, src + static_cast<size_t>(bad) * item, item);
  });
  if (bad >= 0)
    throw ConfigError(ck.file_of(name) + ": " + what + ": tensor '" + printable(name) + "' value " +
                      std::to_string(first + bad) + " is " + st_nonfinite_word(t.dtype, value) +
                      " (thetad trains only from finite values)");
}

// Thread-seconds a load spent in each stage of read_range, for its log line: where a slow load's
// time goes (the finiteness pass, the conversion out of the map, the copy onto a device).
struct LoadStages {
  std::atomic<int64_t> check_ns{0}, convert_ns{0}, copy_ns{0};
};

// Adds the nanoseconds since `since` to `to` (none where there is no `to`), and restarts `since`.
void lap(std::atomic<int64_t>* to, std::chrono::steady_clock::time_point& since) {
  const auto now = std::chrono::steady_clock::now();
  if (to) *to += std::chrono::duration_cast<std::chrono::nanoseconds>(now - since).count();
  since = now;
}

// Elements [first, first + count) of the file's tensor `name` into parameter p (float32, or bf16:
// a frozen base held so), checked finite: converted straight into a host parameter, else into a
// host buffer (pinned for a GPU) and copied from there. Every read of the map is guarded
// (SafetensorsCheckpoint::read): a file shortened under the job is exit 2 naming it and the
// tensor; the GPU's copy reads only the buffer, since a fault inside the CUDA runtime could not be
// left safely.
void read_range(const SafetensorsCheckpoint& ck, const std::string& name, NamedParam& p, int64_t first, int64_t count,
                const std::string& what, LoadStages* stages = nullptr) {
  auto since = std::chrono::steady_clock::now();
  check_finite(ck, name, first, count, what);
  lap(stages ? &stages->check_ns : nullptr, since);
  const StTensor& t = ck.tensor(name);
  const size_t offset = static_cast<size_t>(first) * st_itemsize(t.dtype);
  const std::string where = ck.file_of(name) + ": tensor '" + printable(name) + "'";
  const bool bf16 = p.tensor.scalar_type() == torch::kBFloat16;
  THETAD_CHECK(bf16 || p.tensor.scalar_type() == torch::kFloat32, InternalError, "parameter ", p.name, " is ",
               p.tensor.scalar_type(), ", neither float32 nor bf16");
  const auto convert = [&](void* dst) {
    ck.read(name, [&](const char* bytes) {
      if (bf16) st_to_bf16(t.dtype, bytes + offset, static_cast<size_t>(count), static_cast<uint16_t*>(dst), where);
      else st_to_fp32(t.dtype, bytes + offset, static_cast<size_t>(count), static_cast<float*>(dst), where);
    });
  };
  torch::NoGradGuard no_grad;
  torch::Tensor flat = p.tensor.detach().view({-1}).narrow(0, first, count);
  if (p.tensor.is_cpu() && p.tensor.is_contiguous()) {
    convert(flat.data_ptr());
    lap(stages ? &stages->convert_ns : nullptr, since);
    return;
  }
  torch::Tensor host = torch::empty({count}, torch::TensorOptions(p.tensor.scalar_type()).pinned_memory(p.tensor.is_cuda()));
  convert(host.data_ptr());
  lap(stages ? &stages->convert_ns : nullptr, since);
  flat.copy_(host);
  lap(stages ? &stages->copy_ns : nullptr, since);  // the pinned buffer's allocation is in convert's
}

// Pieces of at most this many elements: the threads share the large tensors too.
constexpr int64_t kPieceElems = int64_t{4} << 20;

}  // namespace

void assign_from(const std::shared_ptr<const SafetensorsCheckpoint>& ck, const std::string& name, NamedParam& p,
                 const std::string& what) {
  check(*ck, name, p, what);
  if (p.init) {  // a placeholder the host store fills later, from the map: checked now, every rank alike
    check_finite(*ck, name, 0, p.tensor.numel(), what);
    p.init = [ck, name](torch::Tensor& dst) { ck->read_fp32(name, dst.sizes().vec(), dst.data_ptr<float>()); };
    return;
  }
  read_range(*ck, name, p, 0, p.tensor.numel(), what);
}

void load_safetensors_weights(const config::Job& job, TaskModel& model) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string& path = job.model.init_from;
  auto ck = std::make_shared<const SafetensorsCheckpoint>(SafetensorsCheckpoint::open(path));
  std::map<std::string, NamedParam*> by_name;
  for (NamedParam& p : model.params()) by_name[p.name] = &p;
  // Parameter -> the file's tensor that holds it.
  std::map<NamedParam*, std::string> source;
  std::vector<std::string> extra;
  for (const std::string& name : ck->names()) {
    auto it = by_name.find(name);
    if (it == by_name.end()) it = by_name.find(thetad_name_of_hf(name));
    if (it == by_name.end()) {
      extra.push_back(name);
      continue;
    }
    const auto [prev, fresh] = source.emplace(it->second, name);
    if (!fresh)
      throw ConfigError(ck->file_of(name) + ": model.init_from: tensors '" + printable(prev->second) + "' and '" +
                        printable(name) + "' both hold parameter '" + it->first + "'");
  }
  std::vector<std::pair<NamedParam*, std::string>> now;
  for (NamedParam& p : model.params()) {
    const auto it = source.find(&p);
    if (it != source.end()) {
      now.emplace_back(&p, it->second);
    } else if (p.group == 0) {
      const std::string hf = hf_name_of_thetad(p.name);
      throw ConfigError(path + ": model.init_from: tensor '" + (hf.empty() ? p.name : hf) + "' is missing (thetad's " +
                        p.name + ", shape " + st_shape_string(p.tensor.sizes().vec()) + ")");
    }
  }
  // Shapes and dtypes first (one pass, nothing written), then read in parallel over pieces of
  // the parameters (each a pass over its mapped bytes); lazily built ones read when they are filled.
  struct Piece {
    NamedParam* p;
    const std::string* name;
    int64_t first, count;
  };
  std::vector<Piece> pieces;
  double bytes = 0;
  for (auto& [p, name] : now) {
    check(*ck, name, *p, "model.init_from");
    if (p->init) {
      assign_from(ck, name, *p, "model.init_from");
      continue;
    }
    const int64_t n = p->tensor.numel();
    for (int64_t first = 0; first < n; first += kPieceElems) pieces.push_back({p, &name, first, std::min(kPieceElems, n - first)});
    bytes += double(n) * double(st_itemsize(ck->tensor(name).dtype));
  }
  // On the training pool (the rank's share of the CPUs), not on LibTorch's intra-op threads: they
  // are as many as OMP_NUM_THREADS says, and where that is 1 (Debian's LibTorch runs on 1 anyway)
  // the whole base would be read on one thread.
  LoadStages stages;
  ThreadPool& pool = ThreadPool::instance();
  pool.parallel_for(pieces.size(), [&](size_t i) {
    read_range(*ck, *pieces[i].name, *pieces[i].p, pieces[i].first, pieces[i].count, "model.init_from", &stages);
  });
  if (!extra.empty()) {
    std::string list;
    for (size_t i = 0; i < extra.size() && i < 8; ++i) list += (i ? ", " : "") + printable(extra[i]);
    THETAD_LOG(warn, "train") << path << ": model.init_from: " << extra.size()
                              << " tensors name no parameter of the model and are ignored: " << list
                              << (extra.size() > 8 ? ", ..." : "");
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  THETAD_LOG(info, "train") << "model.init_from: " << source.size() << " parameters from " << path << " ("
                            << std::fixed << std::setprecision(3) << bytes / 1e9 << " GB read in " << s << " s: "
                            << std::setprecision(2) << bytes / 1e9 / std::max(s, 1e-9) << " GB/s, "
                            << pool.threads() << " threads; thread-seconds: finiteness " << std::setprecision(3)
                            << double(stages.check_ns) / 1e9 << ", conversion " << double(stages.convert_ns) / 1e9
                            << ", copy to the device " << double(stages.copy_ns) / 1e9 << ")";
}

}  // namespace thetad::daemon
