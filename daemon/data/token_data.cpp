// The transformer's token data (see transformer.hpp, token_data.hpp): synthetic walks, .npy token
// files, and flat binary token files of uint16 or uint32 ids (data.token_dtype), read window by
// window with pread, so a file of billions of tokens costs no copy, and one cut short while the
// job runs is an error naming it (a memory map of it killed the rank with SIGBUS at the next
// window past the new end: no check of the size before a read closes the race with a truncation,
// a SIGBUS handler would be process-wide; a short read is an ordinary error). With
// data.loss_mask, each file's mask (a byte per token) is read beside it and the targets it leaves
// out are -1 in the batch, which the loss skips. The files' ids and masks were checked before the
// run started (daemon/plan/token_files.hpp); a task the run never trains needs no file.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/errors.hpp"
#include "common/file_read.hpp"
#include "daemon/formats/npy.hpp"
#include "daemon/plan/token_files.hpp"
#include "daemon/models/param_builder.hpp"
#include "daemon/data/token_data.hpp"
#include "daemon/models/transformer.hpp"

namespace thetad::daemon {
namespace {

using namespace detail;

// Rows of seq_len + 1 tokens: inputs are the first seq_len, targets the last seq_len; a target
// whose mask byte is 0 (`mask` [rows, seq_len], where given) becomes -1.
Batch split_windows(const torch::Tensor& windows, const torch::Tensor& mask = {}) {
  const int64_t s = windows.size(1) - 1;
  // A copy always: for one row the narrowed view already counts as contiguous, and masking it
  // would write -1 into the windows, the inputs' tokens among them.
  torch::Tensor y = windows.narrow(1, 1, s).clone(torch::MemoryFormat::Contiguous);
  if (mask.defined()) y.masked_fill_(mask.eq(0), -1);
  return {windows.narrow(1, 0, s).contiguous(), y};
}

// Task t walks the vocabulary with stride 1 + (t x 7919 mod (vocab - 1)) from a random start;
// data.noise of the tokens are replaced by random ones (the walk goes on underneath). The next
// token follows from the current one and the task: the base can learn the walk, the adapters the
// task's stride.
class SyntheticTokens : public DataSource {
 public:
  SyntheticTokens(const config::Job& job, torch::Device device)
      : seed_(job.seed), vocab_(job.model.vocab), seq_(job.model.seq_len), noise_(job.data.noise), device_(device) {}
  Batch batch(int64_t step, int rank, int world, int task, int64_t rows) override {
    (void)world;
    auto gen = generator(mix_seed(seed_, 0x70c3, static_cast<uint64_t>(step), static_cast<uint64_t>(rank) * 1000003u + task));
    const int64_t stride = 1 + (int64_t{task} * 7919) % (vocab_ - 1);
    const torch::Tensor start = torch::randint(vocab_, {rows, 1}, gen, torch::kInt64);
    torch::Tensor w = (start + torch::arange(seq_ + 1, torch::kInt64).unsqueeze(0) * stride).remainder(vocab_);
    if (noise_ > 0) {
      const torch::Tensor flip = torch::rand({rows, seq_ + 1}, gen).lt(std::min(noise_, 1.0));
      w = torch::where(flip, torch::randint(vocab_, {rows, seq_ + 1}, gen, torch::kInt64), w);
    }
    return split_windows(w.to(device_));
  }

 private:
  uint64_t seed_;
  int64_t vocab_, seq_;
  double noise_;
  torch::Device device_;
};

// A flat token file: its path, size and version (FileVersion) when the job started. Each batch
// opens it anew and reads its windows with pread (a job may have a file per task, thousands of
// them: no descriptor is held between batches); a file another put in its place since, written
// into since, cut short, or no longer a regular file, is an Error naming it: its new bytes would
// otherwise be trained on, silently, from that batch on.
class TokenFile {
 public:
  TokenFile(const std::string& path, size_t item) : path_(path), item_(item) {
    struct stat st {};
    const Fd fd{open_checked(&st, /*started=*/false)};
    size_ = static_cast<uint64_t>(st.st_size);
    version_ = file_version(st);
  }
  uint64_t size() const { return size_; }
  int64_t tokens() const { return static_cast<int64_t>(size_ / item_); }
  // For each of `rows` starts, the n ids from there widened into dst (rows x n); an id at or above
  // `vocab` (the file rewritten since its ids were checked) is an Error naming the file.
  void windows(const int64_t* starts, int64_t rows, int64_t n, int64_t vocab, int64_t* dst) const {
    struct stat st {};
    const Fd fd{open_checked(&st, /*started=*/true)};
    const FileVersion now = file_version(st);
    if (!now.same_version(version_))
      throw Error(path_ + ": changed while the job ran: " +
                  (now.same_file(version_) ? "written into since the start (now " + std::to_string(st.st_size) +
                                                 " bytes, " + std::to_string(size_) + " at the start)"
                                           : std::string("another file was put in its place")) +
                  " (token files must not change during a run)");
    std::vector<char> buf(static_cast<size_t>(n) * item_);
    for (int64_t r = 0; r < rows; ++r) {
      read(fd.fd, static_cast<uint64_t>(starts[r]) * item_, buf);
      int64_t* out = dst + r * n;
      int64_t hi = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (item_ == 1) {
          out[i] = static_cast<unsigned char>(buf[static_cast<size_t>(i)]);
        } else if (item_ == 2) {
          uint16_t v;
          std::memcpy(&v, buf.data() + 2 * i, 2);
          out[i] = v;
        } else {
          uint32_t v;
          std::memcpy(&v, buf.data() + 4 * i, 4);
          out[i] = v;
        }
        hi = std::max(hi, out[i]);
      }
      if (hi >= vocab)
        throw Error(path_ + ": changed while the job ran: token id " + std::to_string(hi) + " near token " +
                    std::to_string(starts[r]) + " is outside [0, model.vocab = " + std::to_string(vocab) +
                    ") (token files must not change during a run)");
    }
  }

 private:
  struct Fd {
    int fd;
    ~Fd() { ::close(fd); }
  };
  // The file opened (non-blocking: a FIFO is refused, not waited on) and checked regular; a
  // ConfigError before the job starts, an Error once it runs.
  int open_checked(struct stat* st, bool started) const {
    const auto fail = [&](const std::string& why) {
      if (started) throw Error(path_ + ": changed while the job ran: " + why + " (token files must not change during a run)");
      throw ConfigError(path_ + ": " + why);
    };
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) fail(std::string("cannot open: ") + std::strerror(errno));
    const bool stat_ok = ::fstat(fd, st) == 0;
    if (!stat_ok || !S_ISREG(st->st_mode)) {
      const std::string why = !stat_ok ? std::string("cannot stat: ") + std::strerror(errno)
                                       : "not a regular file (" + file_kind_name(st->st_mode) + ")";
      ::close(fd);
      fail(why);
    }
    return fd;
  }
  // buf.size() bytes at `offset`: a short read is the file cut short since the start.
  void read(int fd, uint64_t offset, std::vector<char>& buf) const {
    size_t done = 0;
    while (done < buf.size()) {
      const ssize_t r = ::pread(fd, buf.data() + done, buf.size() - done, static_cast<off_t>(offset + done));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0)
        throw Error(path_ + ": changed while the job ran: " + (r < 0 ? std::string(std::strerror(errno)) : "it ends") +
                    " at byte " + std::to_string(offset + done) + ", where it had " + std::to_string(size_) +
                    " bytes at the start (token files must not change during a run)");
      done += static_cast<size_t>(r);
    }
  }

  std::string path_;
  size_t item_;
  uint64_t size_ = 0;
  FileVersion version_;
};

// One task's token file (.npy copied out as int64, or a flat .bin read window by window) and,
// with data.loss_mask, its mask (a byte per token, read window by window).
class TaskTokens {
 public:
  TaskTokens(const std::string& dir, const config::Job& job, int task) : vocab_(job.model.vocab) {
    const std::string path = token_file(dir, job, task);
    if (job.data.token_dtype == config::TokenDtype::Npy) {
      ids_ = read_npy(path);
    } else {
      const size_t item = job.data.token_dtype == config::TokenDtype::Uint32 ? 4 : 2;
      file_.emplace_back(path, item);
      if (file_[0].size() % item != 0) throw ConfigError(path + ": not a whole number of token ids (data.token_dtype)");
    }
    if (tokens() < job.model.seq_len + 1)
      throw ConfigError(path + ": " + std::to_string(tokens()) + " tokens, fewer than one window of model.seq_len + 1 = " +
                        std::to_string(job.model.seq_len + 1));
    if (job.data.loss_mask) {
      mask_.emplace_back(mask_file(dir, task), 1);
      if (static_cast<int64_t>(mask_[0].size()) != tokens())
        throw ConfigError(mask_file(dir, task) + ": not one byte per token of " + path + " (data.loss_mask)");
    }
  }
  int64_t tokens() const { return file_.empty() ? ids_.size(0) : file_[0].tokens(); }
  // The windows of n tokens from each of `rows` starts (int64 [rows, 1]) as a Batch of n - 1
  // positions, masked targets -1.
  Batch batch(const torch::Tensor& start, int64_t rows, int64_t n) const {
    torch::Tensor w;
    if (!file_.empty()) {
      w = torch::empty({rows, n}, torch::kInt64);
      file_[0].windows(start.data_ptr<int64_t>(), rows, n, vocab_, w.data_ptr<int64_t>());
    } else {
      const torch::Tensor index = start + torch::arange(n, torch::kInt64).unsqueeze(0);
      w = ids_.index_select(0, index.reshape({-1})).view({rows, n});
    }
    torch::Tensor mask;
    if (!mask_.empty()) {  // the targets' bytes: positions 1 .. n-1 of each window
      mask = torch::empty({rows, n - 1}, torch::kInt64);
      const torch::Tensor from = (start + 1).contiguous();
      mask_[0].windows(from.data_ptr<int64_t>(), rows, n - 1, 2, mask.data_ptr<int64_t>());
    }
    return split_windows(w, mask);
  }

 private:
  static torch::Tensor read_npy(const std::string& path) {
    NpyArray a = NpyArray::open(path);
    a.require_ndim(1);
    torch::ScalarType type;
    if (a.dtype() == "<i8") type = torch::kInt64;
    else if (a.dtype() == "<i4") type = torch::kInt32;
    else if (a.dtype() == "<u2") type = torch::kInt16;  // read as bits, widened below
    else
      throw ConfigError(path + ": token ids must be int64, int32 or uint16, found " + npy_dtype_name(a.dtype()));
    // Copied out of the map (which goes with `a`), then widened where they are not int64.
    torch::Tensor ids = torch::empty({a.numel()}, type);
    void* to = ids.data_ptr();
    const void* from = a.data();
    const size_t bytes = a.nbytes();
    if (bytes > 0) a.read("token ids", [&] { std::memcpy(to, from, bytes); });
    return type == torch::kInt16 ? ids.to(torch::kInt32).bitwise_and(0xffff).to(torch::kInt64)
           : type == torch::kInt32 ? ids.to(torch::kInt64)
                                   : ids;
  }
  int64_t vocab_;
  std::vector<TokenFile> file_;  // .bin: the file (none for .npy)
  std::vector<TokenFile> mask_;  // data.loss_mask: the mask
  torch::Tensor ids_;            // .npy: int64 ids
};

// Token files, one per task: data.dir/task{t}.npy (copied out as int64), or flat little-endian
// ids data.dir/task{t}.bin (data.token_dtype uint16/uint32: each batch reads its windows from the
// file, widened to int64). Windows start at random offsets, seeded like the synthetic data. A
// task without a file (one the run never trains: the run checked that the others have theirs)
// is an error only if a batch asks for it.
class TokenFiles : public DataSource {
 public:
  TokenFiles(const config::Job& job, torch::Device device)
      : seed_(job.seed), seq_(job.model.seq_len), device_(device), dir_(job.data.dir), job_(job) {
    for (int64_t t = 0; t < job.model.tasks; ++t) {
      std::error_code ec;
      if (std::filesystem::exists(token_file(dir_, job, t), ec)) tasks_.emplace_back(TaskTokens(dir_, job, static_cast<int>(t)));
      else tasks_.emplace_back();
    }
  }
  Batch batch(int64_t step, int rank, int world, int task, int64_t rows) override {
    (void)world;
    const auto t = static_cast<size_t>(task);
    if (!tasks_.at(t)) throw ConfigError(token_file(dir_, job_, task) + ": missing (task " + std::to_string(task) + "'s token ids)");
    auto gen = generator(mix_seed(seed_, 0x70c3, static_cast<uint64_t>(step), static_cast<uint64_t>(rank) * 1000003u + task));
    const torch::Tensor start = torch::randint(tasks_[t]->tokens() - seq_, {rows, 1}, gen, torch::kInt64);
    const Batch b = tasks_[t]->batch(start, rows, seq_ + 1);
    return {b.x.to(device_), b.y.to(device_)};
  }

 private:
  uint64_t seed_;
  int64_t seq_;
  torch::Device device_;
  std::string dir_;
  const config::Job& job_;
  std::vector<std::optional<TaskTokens>> tasks_;  // per task; none without a file
};

class EvalFiles : public EvalTokens {
 public:
  EvalFiles(const config::Job& job, const std::vector<int>& tasks) : seq_(job.model.seq_len) {
    const std::string dir = job.eval.dir;
    for (int t : tasks) tasks_.emplace(t, TaskTokens(dir, job, t));
  }
  int64_t windows(int task) const override { return (tasks_.at(task).tokens() - 1) / seq_; }
  Batch rows(int task, int64_t first, int64_t count) const override {
    const torch::Tensor start = (torch::arange(first, first + count, torch::kInt64) * seq_).unsqueeze(1).contiguous();
    return tasks_.at(task).batch(start, count, seq_ + 1);
  }

 private:
  int64_t seq_;
  std::map<int, TaskTokens> tasks_;
};

}  // namespace

std::unique_ptr<DataSource> make_token_data(const config::Job& job, torch::Device device) {
  if (job.data.kind == config::DataKind::Tokens) return std::make_unique<TokenFiles>(job, device);
  return std::make_unique<SyntheticTokens>(job, device);
}

std::unique_ptr<EvalTokens> make_eval_tokens(const config::Job& job, const std::vector<int>& tasks) {
  return std::make_unique<EvalFiles>(job, tasks);
}

}  // namespace thetad::daemon
