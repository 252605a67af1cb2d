// The token files a job reads, checked before anything starts (see token_files.hpp).
#include "daemon/plan/token_files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "common/errors.hpp"
#include "common/file_read.hpp"
#include "daemon/formats/npy.hpp"
#include "daemon/plan/schedule.hpp"

namespace thetad::daemon {
namespace {

constexpr size_t kBlock = size_t{1} << 20;

// The file opened for reading (non-blocking: a FIFO is refused, not waited on) and checked a
// regular file; its size in *size.
int open_regular(const std::string& path, const std::string& what, uint64_t* size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    throw ConfigError(path + ": " + (errno == ENOENT ? std::string("missing") : "cannot open: " + std::string(std::strerror(errno))) +
                      " (" + what + ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const std::string why = S_ISREG(st.st_mode) ? std::string(std::strerror(errno)) : "not a regular file (" + file_kind_name(st.st_mode) + ")";
    ::close(fd);
    throw ConfigError(path + ": " + why + " (" + what + ")");
  }
  *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

struct Fd {
  int fd;
  ~Fd() { ::close(fd); }
};

// Calls `block(bytes, n, first_byte)` for each block of the file read from the start.
template <typename F>
void read_blocks(int fd, uint64_t size, const std::string& path, F&& block) {
  std::vector<char> buf(kBlock);
  for (uint64_t at = 0; at < size;) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(kBlock, size - at));
    const ssize_t r = ::pread(fd, buf.data(), want, static_cast<off_t>(at));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) throw ConfigError(path + ": read failed at byte " + std::to_string(at) + ": " +
                                  (r < 0 ? std::strerror(errno) : "the file ends early"));
    block(buf.data(), static_cast<size_t>(r), at);
    at += static_cast<uint64_t>(r);
  }
}

std::string out_of_range(const std::string& path, int64_t id, int64_t at, int64_t vocab, const std::string& what) {
  return path + ": token id " + std::to_string(id) + " is outside [0, model.vocab = " + std::to_string(vocab) +
         ") at token " + std::to_string(at) + " (" + what + ")";
}

// The ids of a flat little-endian file of `item`-byte ids.
template <typename T>
TokenFileFacts scan_flat(const std::string& path, int64_t vocab, const std::string& what) {
  uint64_t size = 0;
  const Fd f{open_regular(path, what, &size)};
  if (size % sizeof(T) != 0)
    throw ConfigError(path + ": " + std::to_string(size) + " bytes, not a whole number of " +
                      (sizeof(T) == 2 ? "uint16" : "uint32") + " token ids (data.token_dtype; " + what + ")");
  TokenFileFacts facts;
  facts.tokens = static_cast<int64_t>(size / sizeof(T));
  read_blocks(f.fd, size, path, [&](const char* bytes, size_t n, uint64_t first) {
    for (size_t i = 0; i < n / sizeof(T); ++i) {
      T v;
      std::memcpy(&v, bytes + i * sizeof(T), sizeof(T));
      const int64_t id = static_cast<int64_t>(v);
      if (id >= vocab) throw ConfigError(out_of_range(path, id, static_cast<int64_t>(first / sizeof(T) + i), vocab, what));
      facts.max_id = std::max(facts.max_id, id);
    }
  });
  return facts;
}

template <typename T>
TokenFileFacts scan_npy_ids(const NpyArray& a, const std::string& path, int64_t vocab, const std::string& what) {
  TokenFileFacts facts;
  facts.tokens = a.numel();
  const T* v = a.data_as<T>();
  const int64_t n = a.numel();
  int64_t bad = -1, bad_id = 0;  // the first id out of range
  a.read("token ids", [&] {
    for (int64_t i = 0; i < n; ++i) {
      const auto id = static_cast<int64_t>(v[i]);
      if (id < 0 || id >= vocab) {
        bad = i, bad_id = id;
        return;
      }
      facts.max_id = std::max(facts.max_id, id);
    }
  });
  if (bad >= 0) throw ConfigError(out_of_range(path, bad_id, bad, vocab, what));
  return facts;
}

TokenFileFacts scan_npy(const std::string& path, const config::Job& job, const std::string& what) {
  uint64_t size = 0;
  { const Fd f{open_regular(path, what, &size)}; }  // missing, or not a regular file: said as for .bin
  const NpyArray a = NpyArray::open(path);
  a.require_ndim(1);
  const int64_t vocab = job.model.vocab;
  if (a.dtype() == "<i8") return scan_npy_ids<int64_t>(a, path, vocab, what);
  if (a.dtype() == "<i4") return scan_npy_ids<int32_t>(a, path, vocab, what);
  if (a.dtype() == "<u2") {
    if (vocab > (int64_t{1} << 16))
      throw ConfigError(path + ": uint16 token ids hold at most 65535, but model.vocab is " + std::to_string(vocab) +
                        ": larger ids would have wrapped when the file was written (write int32 or int64; " + what + ")");
    return scan_npy_ids<uint16_t>(a, path, vocab, what);
  }
  throw ConfigError(path + ": token ids must be int64, int32 or uint16, found " + npy_dtype_name(a.dtype()) + " (" + what + ")");
}

void check_window(const std::string& path, const TokenFileFacts& facts, int64_t min_tokens, const std::string& what) {
  if (facts.tokens < min_tokens)
    throw ConfigError(path + ": " + std::to_string(facts.tokens) + " tokens, fewer than one window of model.seq_len + 1 = " +
                      std::to_string(min_tokens) + " (" + what + ")");
}

}  // namespace

std::string token_file(const std::string& dir, const config::Job& job, int64_t task) {
  return dir + "/task" + std::to_string(task) + (job.data.token_dtype == config::TokenDtype::Npy ? ".npy" : ".bin");
}

std::string mask_file(const std::string& dir, int64_t task) { return dir + "/task" + std::to_string(task) + ".mask.bin"; }

TokenFileFacts scan_token_file(const std::string& path, const config::Job& job, int64_t min_tokens, const std::string& what) {
  TokenFileFacts facts;
  switch (job.data.token_dtype) {
    case config::TokenDtype::Npy: facts = scan_npy(path, job, what); break;
    case config::TokenDtype::Uint16: facts = scan_flat<uint16_t>(path, job.model.vocab, what); break;
    case config::TokenDtype::Uint32: facts = scan_flat<uint32_t>(path, job.model.vocab, what); break;
  }
  check_window(path, facts, min_tokens, what);
  return facts;
}

void scan_mask_file(const std::string& path, int64_t tokens, const std::string& what) {
  uint64_t size = 0;
  const Fd f{open_regular(path, what, &size)};
  if (size != static_cast<uint64_t>(tokens))
    throw ConfigError(path + ": " + std::to_string(size) + " bytes where its token file has " + std::to_string(tokens) +
                      " tokens: a loss mask holds one byte per token (data.loss_mask; " + what + ")");
  read_blocks(f.fd, size, path, [&](const char* bytes, size_t n, uint64_t first) {
    for (size_t i = 0; i < n; ++i)
      if (bytes[i] != 0 && bytes[i] != 1)
        throw ConfigError(path + ": byte " + std::to_string(first + i) + " is " +
                          std::to_string(static_cast<unsigned char>(bytes[i])) +
                          ": a loss mask holds 1 (the token counts in the loss) or 0 (it does not) (" + what + ")");
  });
}

std::vector<uint8_t> tasks_trained(const config::Job& job, int world) {
  const std::vector<uint8_t> groups =
      Schedule::create(job, world)->task_groups_used_before(job.steps * job.accumulate_steps);
  return std::vector<uint8_t>(groups.begin() + 1, groups.end());
}

std::vector<int> eval_tasks_at(const config::Job& job, int world, int64_t completed) {
  const config::EvalTasks which = config::eval_tasks(job.eval.tasks);
  std::vector<int> tasks;
  if (which.kind == config::EvalTasks::Kind::List) {
    for (int64_t t : which.ids) tasks.push_back(static_cast<int>(t));
    return tasks;
  }
  if (which.kind == config::EvalTasks::Kind::All) {
    for (int t = 0; t < job.model.tasks; ++t) tasks.push_back(t);
    return tasks;
  }
  // scheduled: trained (not only used: data.schedule alternate freezes some) in the steps since
  // the previous evaluation point, by any rank.
  const int64_t every = job.eval.every_steps;
  const int64_t since = every > 0 ? (completed - 1) / every * every : 0;
  const auto schedule = Schedule::create(job, world);
  std::vector<uint8_t> trained(static_cast<size_t>(job.model.tasks), 0);
  const int64_t k = job.accumulate_steps;
  const bool alternate = job.data.schedule == config::ScheduleKind::Alternate;
  for (int64_t micro = since * k; micro < completed * k; ++micro)
    for (int r = 0; r < world; ++r) {
      if (!alternate) {  // every task a plan uses it trains: the plan's task list is enough
        for (int t : schedule->tasks_at(micro, r)) trained[static_cast<size_t>(t)] = 1;
        continue;
      }
      const StepPlan plan = schedule->plan(micro, r);
      for (int t : plan.tasks) trained[static_cast<size_t>(t)] |= plan.trained[static_cast<size_t>(t) + 1];
    }
  for (int t = 0; t < job.model.tasks; ++t)
    if (trained[static_cast<size_t>(t)]) tasks.push_back(t);
  return tasks;
}

std::vector<int> eval_tasks_of_run(const config::Job& job, int world) {
  if (config::eval_tasks(job.eval.tasks).kind != config::EvalTasks::Kind::Scheduled) return eval_tasks_at(job, world, 0);
  std::vector<int> tasks;
  const std::vector<uint8_t> trained = tasks_trained(job, world);
  for (int t = 0; t < job.model.tasks; ++t)
    if (trained[static_cast<size_t>(t)]) tasks.push_back(t);
  return tasks;
}

int64_t check_token_inputs(const config::Job& job, int world) {
  int64_t files = 0;
  const bool masks = job.data.loss_mask;
  const auto check = [&](const std::string& dir, int t, const char* kind) {
    const std::string what = "task " + std::to_string(t) + "'s " + kind;
    const std::string path = token_file(dir, job, t);
    const TokenFileFacts facts = scan_token_file(path, job, job.model.seq_len + 1, what);
    ++files;
    if (masks) {
      scan_mask_file(mask_file(dir, t), facts.tokens, what + " loss mask");
      ++files;
    }
  };
  if (job.data.kind == config::DataKind::Tokens) {
    const std::string& dir = job.data.dir;
    const std::vector<uint8_t> trained = tasks_trained(job, world);
    for (int t = 0; t < job.model.tasks; ++t)
      if (trained[static_cast<size_t>(t)]) check(dir, t, "token ids (data.dir)");
  }
  if (!job.eval.dir.empty()) {
    const std::string& dir = job.eval.dir;
    for (int t : eval_tasks_of_run(job, world)) check(dir, t, "held-out token ids (eval.dir)");
  }
  return files;
}

}  // namespace thetad::daemon
