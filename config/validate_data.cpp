// The data section of a job: the data kind, batch sizes, token files and their loss masks, the
// task schedules (weighted, per rank, alternate) against the model's tasks, and the held-out
// evaluation (eval) that reads token files as data does (Checker, checker.hpp).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <unordered_set>

#include "config/checker.hpp"

namespace thetad::config::detail {

void Checker::data() {
  const DataConfig& dc = j_.data;
  const int64_t T = j_.model.tasks;
  const bool tasks_ok = ok("model.tasks") && T > 0;
  one_of("data.kind");
  one_of("data.schedule");
  above<int64_t>("data.batch_per_rank", dc.batch_per_rank, 0);
  at_most<int64_t>("data.batch_per_rank", dc.batch_per_rank, kMaxDim, "rows of one rank's batch");
  at_least("data.noise", dc.noise, 0.0);
  if (is("data.kind", dc.kind, DataKind::Npy) && dc.dir.empty())
    fail("data.dir", "required when data.kind is 'npy' (directory of task{t}_x.npy, "
                     "task{t}_y.npy)", "data.kind");
  if (is("data.kind", dc.kind, DataKind::Tokens) && dc.dir.empty())
    fail("data.dir", "required when data.kind is 'tokens' (directory of task{t}.npy token files)", "data.kind");
  const bool transformer = is("model.kind", j_.model.kind, ModelKind::Transformer);
  if (is("data.kind", dc.kind, DataKind::Tokens) && ok("model.kind") && !transformer &&
      !is("model.kind", j_.model.kind, ModelKind::Torchscript))
    fail("data.kind", "'tokens' is for the transformer and TorchScript language models; model.kind is '" +
                          to_string(j_.model.kind) + "'");
  if (transformer && is("data.kind", dc.kind, DataKind::Npy))
    fail("data.kind", "the transformer reads tokens: 'synthetic' or 'tokens', not 'npy'");
  placeholders("data.dir", dc.dir);
  if ((is("data.kind", dc.kind, DataKind::Npy) || is("data.kind", dc.kind, DataKind::Tokens)) && tasks_ok)
    data_files(T);
  token_ids();
  eval();
  at_least<int64_t>("data.tasks_per_rank", dc.tasks_per_rank, 1);
  if (tasks_ok && dc.tasks_per_rank > T)
    fail("data.tasks_per_rank", "must be <= model.tasks (" + num(T) + "), got " +
                                    num(dc.tasks_per_rank));
  // With an unknown schedule nothing below could fail (a batch is split into one slice).
  if (!ok("data.schedule") || unknown("data.schedule")) return;
  if (dc.schedule == ScheduleKind::RoundRobin || dc.schedule == ScheduleKind::Weighted)
    at_most<int64_t>("data.tasks_per_rank", dc.tasks_per_rank, kMaxTasksPerRank,
                     "tasks one rank draws in a step");
  if (dc.schedule == ScheduleKind::Weighted) weighted(T, tasks_ok);
  if (dc.schedule == ScheduleKind::PerRank) per_rank(T, tasks_ok);
  if (dc.schedule == ScheduleKind::Alternate) alternate(T, tasks_ok);
  if (tasks_ok) batch_covers_tasks(T);
}

// The input files are where the run will look for them (exit 2 from `validate`, not from every
// rank after start): data.dir a directory, each task's npy files regular files. Token files are
// needed only for the tasks the schedule trains, which depends on the ranks: they are checked,
// ids and masks included, by daemon/plan/token_files (`thetad validate`, and every rank before
// the run starts). Skipped with {rank}: each rank has its own.
void Checker::data_files(int64_t T) {
  const DataConfig& dc = j_.data;
  if (dc.dir.empty() || !ok("data.dir") || dc.dir.find("{rank}") != std::string::npos) return;
  const std::string dir = with_job(dc.dir);
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    fail("data.dir", "'" + dir + "' is not a directory" + (fs::exists(dir, ec) ? "" : " (no such directory)"));
    return;
  }
  if (dc.kind != DataKind::Npy) return;
  for (int64_t t = 0; t < T; ++t)
    for (const char* suffix : {"_x.npy", "_y.npy"}) {
      const fs::path f = fs::path(dir) / ("task" + std::to_string(t) + suffix);
      if (fs::is_regular_file(f, ec)) continue;
      fail("data.dir", f.string() + ": " + (fs::exists(f, ec) ? "not a regular file" : "missing") + " (task " +
                           std::to_string(t) + "'s features and targets)");
      return;
    }
}

// What the token files' ids can hold: uint16 wraps ids of a larger vocabulary silently (Llama
// 3's 128,256 ids), so it is refused where model.vocab (or config.json's vocab_size) needs more.
// data.loss_mask: masks beside the transformer's token files.
void Checker::token_ids() {
  const DataConfig& dc = j_.data;
  const bool reads_tokens = is("data.kind", dc.kind, DataKind::Tokens) || !j_.eval.dir.empty();
  constexpr int64_t kUint16Ids = int64_t{1} << 16;
  if (reads_tokens && is("data.token_dtype", dc.token_dtype, TokenDtype::Uint16) && ok("model.vocab") &&
      j_.model.vocab > kUint16Ids)
    fail("data.token_dtype", "uint16 holds ids up to 65535, but model.vocab is " + num(j_.model.vocab) +
                                 ": larger ids would have wrapped when the file was written; write the ids as "
                                 "uint32 (tools/tokenize_tasks.py picks it for such a vocabulary) and set "
                                 "data.token_dtype: uint32", "model.vocab");
  if (!dc.loss_mask) return;
  if (ok("model.kind") && !is("model.kind", j_.model.kind, ModelKind::Transformer))
    fail("data.loss_mask", "is for the transformer's token files; model.kind is '" + to_string(j_.model.kind) + "'");
  else if (!reads_tokens && ok("data.kind"))
    fail("data.loss_mask", "is true but no token files are read (data.kind is '" + to_string(dc.kind) +
                               "' and there is no eval.dir): the masks lie beside token files", "data.kind");
}

// eval: held-out token files per task, read forward only. Not with the host store or a streamed
// trunk: the adapters (or the base) are then on the device only within a step's window.
void Checker::eval() {
  const EvalConfig& e = j_.eval;
  const int64_t T = j_.model.tasks;
  const bool tasks_ok = ok("model.tasks") && T > 0;
  at_least<int64_t>("eval.every_steps", e.every_steps, 0);
  above<int64_t>("eval.rows", e.rows, 0);
  at_most<int64_t>("eval.rows", e.rows, kMaxDim, "windows of one task's evaluation");
  placeholders("eval.dir", e.dir);
  eval_tasks_given(T, tasks_ok);
  one_of("export.best");
  if (j_.export_.best == ExportPick::EvalLoss && !unknown("export.best")) {
    if (e.dir.empty())
      fail("export.best", "eval_loss needs an evaluation: set eval.dir (held-out task{t} token files)", "eval.dir");
    if (j_.export_.adapters_dir.empty())
      fail("export.best", "is eval_loss but there is no export.adapters_dir to write the adapters to",
           "export.adapters_dir");
  }
  if (e.dir.empty()) return;
  if (ok("model.kind") && !is("model.kind", j_.model.kind, ModelKind::Transformer)) {
    fail("eval.dir", "evaluation is for the transformer (token files); model.kind is '" + to_string(j_.model.kind) + "'",
         "model.kind");
    return;
  }
  if (!ok("eval.dir") || e.dir.find("{rank}") != std::string::npos) return;
  const std::string dir = with_job(e.dir);
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    fail("eval.dir", "'" + dir + "' is not a directory" +
                         (std::filesystem::exists(dir, ec) ? "" : " (no such directory)"));
}

// eval.tasks: `all`, `scheduled`, or task ids.
void Checker::eval_tasks_given(int64_t T, bool tasks_ok) {
  const std::vector<std::string>& words = j_.eval.tasks;
  if (words.empty()) {
    fail("eval.tasks", "must be 'all', 'scheduled' or a list of task ids");
    return;
  }
  if (words.size() == 1 && (words[0] == "all" || words[0] == "scheduled")) return;
  std::unordered_set<std::string> seen;
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string& w = words[i];
    const std::string ip = words.size() == 1 ? std::string("eval.tasks") : "eval.tasks[" + std::to_string(i) + "]";
    bool digits = !w.empty() && w.size() <= 9;
    for (char c : w) digits = digits && c >= '0' && c <= '9';
    if (!digits) {
      fail(ip, "must be a task id, or eval.tasks one of 'all' and 'scheduled' alone; got '" + w + "'");
      continue;
    }
    if (tasks_ok && std::stoll(w) >= T)
      fail(ip, "task id must be in [0, " + num(T) + ") (tasks are numbered from 0), got " + w);
    if (!seen.insert(std::to_string(std::stoll(w))).second) fail(ip, "task " + w + " is listed twice");
  }
}

// A rank's batch is cut into one slice per task of its step; each slice needs a row.
void Checker::batch_covers_tasks(int64_t T) {
  const DataConfig& dc = j_.data;
  int64_t slices = 1;
  if (dc.schedule == ScheduleKind::RoundRobin) slices = std::min(dc.tasks_per_rank, T);
  if (dc.schedule == ScheduleKind::Weighted) slices = dc.tasks_per_rank;
  if (dc.schedule == ScheduleKind::All || dc.schedule == ScheduleKind::Alternate) slices = T;
  for (const auto& tasks : dc.per_rank)
    if (dc.schedule == ScheduleKind::PerRank) slices = std::max<int64_t>(slices, tasks.size());
  if (dc.batch_per_rank > 0 && dc.batch_per_rank < slices && ok("data.tasks_per_rank") &&
      ok("data.per_rank"))
    fail("data.batch_per_rank", "is smaller than the " + num(slices) + " tasks a rank's batch "
                                "is split into with schedule '" + to_string(dc.schedule) + "'; got " +
                                num(dc.batch_per_rank), "data.schedule");
}

void Checker::weighted(int64_t T, bool tasks_ok) {
  const auto& w = j_.data.weights;
  if (w.empty()) {
    fail("data.weights", "schedule 'weighted' needs one weight per task", "data.schedule");
    return;
  }
  if (tasks_ok && static_cast<int64_t>(w.size()) != T)
    fail("data.weights", "needs one weight per task: " + num(T) + " (model.tasks), got " +
                             std::to_string(w.size()));
  double sum = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i] < 0) fail("data.weights[" + std::to_string(i) + "]", "must be >= 0, got " + num(w[i]));
    sum += w[i] > 0 ? w[i] : 0;
  }
  if (sum <= 0) fail("data.weights", "at least one weight must be > 0");
  else if (!std::isfinite(sum))
    fail("data.weights", "the weights must have a finite sum (they are relative frequencies: scale "
                         "them down), got " + num(sum));
}

void Checker::per_rank(int64_t T, bool tasks_ok) {
  const auto& pr = j_.data.per_rank;
  if (pr.empty()) {
    fail("data.per_rank", "schedule 'per_rank' needs a list of task ids for each rank, e.g. "
                          "[[0, 1], [2, 3]]", "data.schedule");
    return;
  }
  for (size_t r = 0; r < pr.size(); ++r) {
    const std::string rp = "data.per_rank[" + std::to_string(r) + "]";
    if (pr[r].empty()) fail(rp, "rank " + std::to_string(r) + " has no tasks");
    std::unordered_set<int64_t> seen;  // a list may be as long as the job file allows
    for (size_t i = 0; i < pr[r].size(); ++i) {
      const std::string ip = rp + "[" + std::to_string(i) + "]";
      if (tasks_ok && (pr[r][i] < 0 || pr[r][i] >= T))
        fail(ip, "task id must be in [0, " + num(T) + ") (tasks are numbered from 0), got " +
                     num(pr[r][i]));
      if (!seen.insert(pr[r][i]).second)
        fail(ip, "task " + num(pr[r][i]) + " is listed twice for rank " + std::to_string(r));
    }
  }
}

void Checker::alternate(int64_t T, bool tasks_ok) {
  const auto& alt = j_.data.alternate;
  if (alt.empty()) {
    fail("data.alternate", "schedule 'alternate' needs the groups to train in turn, e.g. "
                           "[shared, tasks] or [shared, \"task:0\"]", "data.schedule");
    return;
  }
  for (size_t i = 0; i < alt.size(); ++i) {
    const std::string& e = alt[i];
    const std::string ip = "data.alternate[" + std::to_string(i) + "]";
    AlternateEntry entry;
    if (!AlternateEntry::parse(e, entry))
      fail(ip, "must be 'shared', 'tasks' or 'task:N' (N a task id); got '" + e + "'");
    else if (entry.kind == AlternateEntry::Kind::Task && tasks_ok && entry.task >= T)
      fail(ip, "task id must be in [0, " + num(T) + ") (tasks are numbered from 0), got '" + e + "'");
  }
}

}  // namespace thetad::config::detail

namespace thetad::config {

EvalTasks eval_tasks(const std::vector<std::string>& words) {
  EvalTasks out;
  if (words.size() == 1 && words[0] == "all") return out;
  if (words.size() == 1 && words[0] == "scheduled") {
    out.kind = EvalTasks::Kind::Scheduled;
    return out;
  }
  out.kind = EvalTasks::Kind::List;
  for (const std::string& w : words) out.ids.push_back(std::stoll(w));
  std::sort(out.ids.begin(), out.ids.end());
  return out;
}

}  // namespace thetad::config
