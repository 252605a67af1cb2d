// `data.kind: npy`: per task, features `task{t}_x.npy` (float32 [N, input_dim]) and targets
// `task{t}_y.npy`: float32 [N, output_dim] (or [N] when output_dim is 1) for regression models,
// int64 class labels [N] in [0, classes of slice t) for the extreme classifier. Memory-mapped,
// read in a per-epoch shuffled order derived from the seed; every file is checked (labels
// included) before training.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "common/errors.hpp"
#include "daemon/formats/npy.hpp"
#include "daemon/models/kinds.hpp"
#include "daemon/models/model.hpp"

namespace thetad::daemon {
namespace {

class NpyData : public DataSource {
 public:
  NpyData(const config::Job& job, bool labels, torch::Device device)
      : seed_(job.seed), in_(job.model.input_dim), out_(job.model.output_dim), labels_(labels),
        device_(device) {
    namespace fs = std::filesystem;
    const std::string dir_text = job.data.dir;
    const fs::path dir(dir_text);
    if (!fs::is_directory(dir))
      throw ConfigError(job.source + ": data.dir: '" + dir_text + "' is not a directory");
    for (int64_t t = 0; t < job.model.tasks; ++t) {
      const std::string xp = (dir / ("task" + std::to_string(t) + "_x.npy")).string();
      const std::string yp = (dir / ("task" + std::to_string(t) + "_y.npy")).string();
      if (!fs::exists(xp)) throw ConfigError(xp + ": missing (task " + std::to_string(t) + " features)");
      if (!fs::exists(yp)) throw ConfigError(yp + ": missing (task " + std::to_string(t) + " targets)");
      Task task{NpyArray::open(xp), NpyArray::open(yp), {}};
      task.x.require_dtype("<f4");
      task.x.require_ndim(2);
      task.y.require_dtype(labels_ ? "<i8" : "<f4");
      const auto& xs = task.x.header().shape;
      const auto& ys = task.y.header().shape;
      if (labels_) {
        check_labels(job, t, task, xp, yp);
        tasks_.push_back(std::move(task));
        continue;
      }
      if (xs[1] != in_)
        throw ConfigError(xp + ": has " + std::to_string(xs[1]) + " features per row, model.input_dim is " +
                          std::to_string(in_));
      if (xs[0] == 0) throw ConfigError(xp + ": has no rows");
      const bool y_ok = (ys.size() == 2 && ys[0] == xs[0] && ys[1] == out_) ||
                        (ys.size() == 1 && ys[0] == xs[0] && out_ == 1);
      if (!y_ok)
        throw ConfigError(yp + ": shape " + npy_shape_string(ys) + " does not match " +
                          std::to_string(xs[0]) + " rows of " + std::to_string(out_) +
                          " targets (model.output_dim)");
      tasks_.push_back(std::move(task));
    }
  }

  Batch batch(int64_t step, int rank, int world, int task, int64_t rows) override {
    Task& t = tasks_.at(task);
    const int64_t n = t.x.header().shape[0];
    // The rows' indices first (the permutations allocate), then the copies out of the maps.
    std::vector<int64_t> index(static_cast<size_t>(rows));
    const int64_t base = (step * world + rank) * rows;  // this batch's first row in the task's stream
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t pos = base + r;
      index[static_cast<size_t>(r)] = permutation(t, task, pos / n)[pos % n];
    }
    auto x = torch::empty({rows, in_}, torch::kFloat32);
    auto y = labels_ ? torch::empty({rows}, torch::kInt64) : torch::empty({rows, out_}, torch::kFloat32);
    copy_rows(t.x, index, in_, x.data_ptr());
    copy_rows(t.y, index, labels_ ? 1 : out_, y.data_ptr());
    return {x.to(device_), y.to(device_)};
  }

 private:
  struct Task {
    NpyArray x, y;
    std::map<int64_t, std::vector<int64_t>> perms;  // epoch -> order (few epochs live at once)
  };

  // Rows `index` of a 2-D array (or elements of a 1-D one, width 1) into `to`.
  static void copy_rows(const NpyArray& a, const std::vector<int64_t>& index, int64_t width, void* to) {
    const auto bytes = static_cast<size_t>(width) * a.itemsize();
    const char* from = static_cast<const char*>(a.data());
    char* out = static_cast<char*>(to);
    a.read("rows of a batch", [&] {
      for (size_t r = 0; r < index.size(); ++r)
        std::memcpy(out + r * bytes, from + static_cast<size_t>(index[r]) * bytes, bytes);
    });
  }

  const std::vector<int64_t>& permutation(Task& t, int task, int64_t epoch) {
    auto it = t.perms.find(epoch);
    if (it != t.perms.end()) return it->second;
    if (t.perms.size() > 4) t.perms.erase(t.perms.begin());
    std::vector<int64_t> order(static_cast<size_t>(t.x.header().shape[0]));
    std::iota(order.begin(), order.end(), 0);
    std::mt19937_64 rng(mix_seed(seed_, 0x5aff1e, static_cast<uint64_t>(task), static_cast<uint64_t>(epoch)));
    std::shuffle(order.begin(), order.end(), rng);
    return t.perms.emplace(epoch, std::move(order)).first->second;
  }

  // Class labels of slice t must lie in [0, classes of the slice).
  void check_labels(const config::Job& job, int64_t t, const Task& task, const std::string& xp,
                    const std::string& yp) {
    const auto& xs = task.x.header().shape;
    const auto& ys = task.y.header().shape;
    if (xs[0] == 0) throw ConfigError(xp + ": has no rows");
    if (xs[1] != in_)
      throw ConfigError(xp + ": has " + std::to_string(xs[1]) + " features per row, model.input_dim is " +
                        std::to_string(in_));
    if (ys.size() != 1 || ys[0] != xs[0])
      throw ConfigError(yp + ": expected " + std::to_string(xs[0]) + " int64 class labels (shape (" +
                        std::to_string(xs[0]) + ",)), found shape " + npy_shape_string(ys));
    const int64_t classes = job.model.classes / job.model.tasks + (t < job.model.classes % job.model.tasks ? 1 : 0);
    const int64_t* y = task.y.data_as<int64_t>();
    const int64_t count = ys[0];
    int64_t bad = -1, label = 0;  // the first label out of range
    task.y.read("class labels", [&] {
      for (int64_t i = 0; i < count && bad < 0; ++i)
        if (y[i] < 0 || y[i] >= classes) bad = i, label = y[i];
    });
    if (bad >= 0)
      throw ConfigError(yp + ": label " + std::to_string(label) + " at row " + std::to_string(bad) +
                        " is out of range: slice " + std::to_string(t) + " has classes 0.." +
                        std::to_string(classes - 1));
  }

  uint64_t seed_;
  int64_t in_, out_;
  bool labels_;
  torch::Device device_;
  std::vector<Task> tasks_;
};

}  // namespace

std::unique_ptr<DataSource> make_npy_data(const config::Job& job, const TaskModel& model,
                                          torch::Device device) {
  return std::make_unique<NpyData>(job, model.loss_kind() == LossKind::cross_entropy, device);
}

}  // namespace thetad::daemon
