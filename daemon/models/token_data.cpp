// The transformer's token data (see transformer.hpp): synthetic walks, .npy token files, and flat
// binary token files of uint16 or uint32 ids (data.token_dtype), memory-mapped and read window
// by window, so a file of billions of tokens costs no copy.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "daemon/formats/mapped_file.hpp"
#include "daemon/formats/npy.hpp"
#include "daemon/models/param_builder.hpp"
#include "daemon/models/transformer.hpp"

namespace thetad::daemon {
namespace {

using namespace detail;

// Rows of seq_len + 1 tokens: inputs are the first seq_len, targets the last seq_len.
Batch split_windows(const torch::Tensor& windows) {
  const int64_t s = windows.size(1) - 1;
  return {windows.narrow(1, 0, s).contiguous(), windows.narrow(1, 1, s).contiguous()};
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

// Token files, one per task: data.dir/task{t}.npy (copied out as int64), or flat little-endian
// ids data.dir/task{t}.bin (data.token_dtype uint16/uint32: the files stay mapped and each batch
// gathers its windows from the map, widening them to int64). Windows start at random offsets,
// seeded like the synthetic data. Every id is checked against model.vocab before any step.
class TokenFiles : public DataSource {
 public:
  TokenFiles(const config::Job& job, torch::Device device)
      : seed_(job.seed), seq_(job.model.seq_len), vocab_(job.model.vocab), device_(device) {
    for (int64_t t = 0; t < job.model.tasks; ++t) {
      const std::string path = job.data.dir + "/task" + std::to_string(t);
      if (job.data.token_dtype == config::TokenDtype::Npy) add_npy(path + ".npy");
      else add_bin(path + ".bin", job.data.token_dtype == config::TokenDtype::Uint32);
    }
  }
  Batch batch(int64_t step, int rank, int world, int task, int64_t rows) override {
    (void)world;
    const torch::Tensor& ids = tokens_.at(static_cast<size_t>(task));
    auto gen = generator(mix_seed(seed_, 0x70c3, static_cast<uint64_t>(step), static_cast<uint64_t>(rank) * 1000003u + task));
    const torch::Tensor start = torch::randint(ids.size(0) - seq_, {rows, 1}, gen, torch::kInt64);
    const torch::Tensor index = start + torch::arange(seq_ + 1, torch::kInt64).unsqueeze(0);
    torch::Tensor w = ids.index_select(0, index.reshape({-1})).to(torch::kInt64);
    if (ids.scalar_type() == torch::kInt16) w = w.bitwise_and(0xffff);  // uint16 ids read as int16 bits
    return split_windows(w.view({rows, seq_ + 1}).to(device_));
  }

 private:
  void check(const std::string& path, int64_t n, int64_t lo, int64_t hi) const {
    if (n < seq_ + 1)
      throw ConfigError(path + ": " + std::to_string(n) + " tokens, fewer than one window of model.seq_len + 1 = " +
                        std::to_string(seq_ + 1));
    if (lo < 0 || hi >= vocab_)
      throw ConfigError(path + ": token id " + std::to_string(lo < 0 ? lo : hi) + " is outside [0, model.vocab = " +
                        std::to_string(vocab_) + ")");
  }
  void add_npy(const std::string& path) {
    NpyArray a = NpyArray::open(path);
    a.require_ndim(1);
    torch::ScalarType type;
    if (a.dtype() == "<i8") type = torch::kInt64;
    else if (a.dtype() == "<i4") type = torch::kInt32;
    else if (a.dtype() == "<u2") type = torch::kInt16;  // read as bits, widened below
    else
      throw ConfigError(path + ": token ids must be int64, int32 or uint16, found " + npy_dtype_name(a.dtype()));
    if (a.numel() < seq_ + 1) check(path, a.numel(), 0, 0);
    torch::Tensor ids = torch::from_blob(const_cast<void*>(a.data()), {a.numel()}, type);
    // Copied out of the map (which goes with `a`): widened, or cloned when already int64.
    ids = type == torch::kInt16 ? ids.to(torch::kInt32).bitwise_and(0xffff).to(torch::kInt64)
          : type == torch::kInt32 ? ids.to(torch::kInt64)
                                  : ids.clone();
    check(path, ids.numel(), ids.min().item<int64_t>(), ids.max().item<int64_t>());
    tokens_.push_back(ids);
  }
  void add_bin(const std::string& path, bool wide) {
    const size_t item = wide ? 4 : 2;
    MappedFile f = MappedFile::open(path);
    if (f.size() % item != 0)
      throw ConfigError(path + ": " + std::to_string(f.size()) + " bytes, not a whole number of " +
                        (wide ? "uint32" : "uint16") + " token ids (data.token_dtype)");
    const auto n = static_cast<int64_t>(f.size() / item);
    check(path, n, 0, static_cast<int64_t>(wide ? max_id<uint32_t>(f) : max_id<uint16_t>(f)));
    // Read as the signed type of the same width (ids < vocab <= 2^31 are the same bits).
    tokens_.push_back(torch::from_blob(const_cast<char*>(f.data()), {n}, wide ? torch::kInt32 : torch::kInt16));
    maps_.push_back(std::move(f));
  }
  template <typename T>
  static uint64_t max_id(const MappedFile& f) {
    T hi = 0;
    for (size_t i = 0; i < f.size() / sizeof(T); ++i) {
      T v;
      std::memcpy(&v, f.data() + i * sizeof(T), sizeof(T));
      hi = std::max(hi, v);
    }
    return hi;
  }

  uint64_t seed_;
  int64_t seq_, vocab_;
  torch::Device device_;
  std::vector<MappedFile> maps_;       // what the .bin files' tensors point into
  std::vector<torch::Tensor> tokens_;  // per task: int64 ids (.npy) or the mapped ids (.bin)
};

}  // namespace

std::unique_ptr<DataSource> make_token_data(const config::Job& job, torch::Device device) {
  if (job.data.kind == config::DataKind::Tokens) return std::make_unique<TokenFiles>(job, device);
  return std::make_unique<SyntheticTokens>(job, device);
}

}  // namespace thetad::daemon
