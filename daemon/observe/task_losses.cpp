// Per-task losses packed for the control plane and merged on rank 0 (see task_losses.hpp).
#include "daemon/observe/task_losses.hpp"

#include <algorithm>
#include <cstring>
#include <map>

#include "common/errors.hpp"

namespace thetad::daemon {
namespace {

constexpr int64_t kLow32 = 0xffffffffLL;

int64_t bits_of(double v) {
  int64_t w;
  std::memcpy(&w, &v, sizeof w);
  return w;
}

double double_of(int64_t w) {
  double v;
  std::memcpy(&v, &w, sizeof v);
  return v;
}

}  // namespace

std::vector<int64_t> pack_task_losses(const std::vector<TaskRowsLoss>& entries, size_t capacity) {
  THETAD_CHECK(entries.size() <= capacity, InternalError, "a step's task losses: ", entries.size(),
               " entries, room for ", capacity);
  std::vector<int64_t> words(task_loss_words(capacity), 0);
  words[0] = static_cast<int64_t>(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const TaskRowsLoss& e = entries[i];
    THETAD_CHECK(e.task >= 0 && e.rows > 0 && e.rows <= kLow32 >> 1, InternalError, "a step's task losses: task ",
                 e.task, " with ", e.rows, " rows");
    words[1 + 3 * i] = static_cast<int64_t>(e.task) | (e.rows << 32);
    words[2 + 3 * i] = bits_of(e.loss);
    words[3 + 3 * i] = bits_of(e.kept_grad_sq);
  }
  return words;
}

std::vector<TaskRowsLoss> unpack_task_losses(const std::vector<int64_t>& words, int ranks, size_t capacity) {
  const size_t per_rank = task_loss_words(capacity);
  THETAD_CHECK_EQ(words.size(), per_rank * static_cast<size_t>(std::max(ranks, 0)), "gathered task losses");
  std::vector<TaskRowsLoss> out;
  for (int r = 0; r < ranks; ++r) {
    const int64_t* w = words.data() + per_rank * static_cast<size_t>(r);
    THETAD_CHECK(w[0] >= 0 && static_cast<size_t>(w[0]) <= capacity, InternalError, "task losses of rank ", r,
                 ": ", w[0], " entries, room for ", capacity);
    for (int64_t i = 0; i < w[0]; ++i) {
      const int64_t head = w[1 + 3 * i];
      out.push_back({static_cast<int>(head & kLow32), head >> 32, double_of(w[2 + 3 * i]), double_of(w[3 + 3 * i])});
    }
  }
  return out;
}

std::vector<TaskLoss> merge_task_losses(const std::vector<TaskRowsLoss>& entries) {
  struct Sum {
    double weighted = 0.0;
    int64_t rows = 0, count = 0;
    double only = 0.0;
  };
  std::map<int, Sum> by_task;
  for (const TaskRowsLoss& e : entries) {
    Sum& s = by_task[e.task];
    s.weighted += e.loss * static_cast<double>(e.rows);
    s.rows += e.rows;
    s.only = e.loss;
    ++s.count;
  }
  std::vector<TaskLoss> out;
  out.reserve(by_task.size());
  for (const auto& [task, s] : by_task)
    out.push_back({task, s.count == 1 ? s.only : s.weighted / static_cast<double>(s.rows)});
  return out;
}

}  // namespace thetad::daemon
