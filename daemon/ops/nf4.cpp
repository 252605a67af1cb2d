// 4-bit NormalFloat quantization (see nf4.hpp): the quantizer in LibTorch's operators wherever
// the weights are (it runs once, at load), the dequantization in a kernel of its own on GPUs
// (it runs before every GEMM of the base) and in the operators on the CPU.
#include "daemon/ops/nf4.hpp"

#include <algorithm>

#include "common/errors.hpp"

#if THETAD_TORCH_CUDA && THETAD_MODEL_KERNELS
#include <c10/cuda/CUDAStream.h>

#include "daemon/ops/nf4_kernels.hpp"
#endif

namespace thetad::daemon {
namespace {

// Quantized a slice at a time: the operators' temporaries (float32 and int64 copies of the
// values) stay within ~16 M values whatever the matrix's size.
constexpr int64_t kSliceBlocks = int64_t{1} << 18;

torch::Tensor book_on(torch::Device device) {
  const auto& b = nf4_code_book();
  return torch::tensor(std::vector<float>(b.begin(), b.end()), torch::kFloat32).to(device);
}

// The values of every byte's two codes, [256, 2] float32: the CPU's dequantization looks a byte
// up once, not each half of it.
torch::Tensor pair_table() {
  static const torch::Tensor table = [] {
    const auto& b = nf4_code_book();
    std::vector<float> v;
    for (int byte = 0; byte < 256; ++byte) {
      v.push_back(b[static_cast<size_t>(byte >> 4)]);
      v.push_back(b[static_cast<size_t>(byte & 15)]);
    }
    return torch::tensor(v, torch::kFloat32).view({256, 2});
  }();
  return table;
}

}  // namespace

const std::array<float, 16>& nf4_code_book() {
  static const std::array<float, 16> book = {-1.0f,
                                             -0.6961928009986877f,
                                             -0.5250730514526367f,
                                             -0.39491748809814453f,
                                             -0.28444138169288635f,
                                             -0.18477343022823334f,
                                             -0.09105003625154495f,
                                             0.0f,
                                             0.07958029955625534f,
                                             0.16093020141124725f,
                                             0.24611230194568634f,
                                             0.33791524171829224f,
                                             0.44070982933044434f,
                                             0.5626170039176941f,
                                             0.7229568362236023f,
                                             1.0f};
  return book;
}

int64_t Nf4Matrix::bytes() const {
  return defined() ? codes.numel() + absmax.numel() * kNf4AbsmaxBytes : 0;
}

Nf4Matrix Nf4Matrix::to(torch::Device device) const {
  return {codes.to(device), absmax.to(device), rows, cols};
}

Nf4Matrix nf4_quantize(const torch::Tensor& w) {
  THETAD_CHECK(w.dim() == 2 && w.is_floating_point(), InternalError, "nf4_quantize: a float matrix, got ", w.sizes());
  torch::NoGradGuard no_grad;
  const int64_t numel = w.numel(), blocks = (numel + kNf4Block - 1) / kNf4Block;
  const torch::Device device = w.device();
  const torch::Tensor book = book_on(device);
  // The midpoints between neighbouring levels: bucketize gives each value the index of the first
  // midpoint at or above it, the nearest level's (the lower one on a midpoint).
  const torch::Tensor mids = (book.narrow(0, 0, 15) + book.narrow(0, 1, 15)) / 2;
  const torch::Tensor flat = w.detach().reshape({-1});
  Nf4Matrix q;
  q.rows = w.size(0);
  q.cols = w.size(1);
  q.codes = torch::empty({blocks * kNf4Block / 2}, torch::TensorOptions().dtype(torch::kUInt8).device(device));
  q.absmax = torch::empty({blocks}, torch::TensorOptions().dtype(torch::kBFloat16).device(device));
  for (int64_t first = 0; first < blocks; first += kSliceBlocks) {
    const int64_t n = std::min(kSliceBlocks, blocks - first), begin = first * kNf4Block;
    const int64_t real = std::min(n * kNf4Block, numel - begin);
    torch::Tensor v = flat.narrow(0, begin, real).to(torch::kFloat32);
    if (real < n * kNf4Block) v = torch::cat({v, torch::zeros({n * kNf4Block - real}, v.options())});
    v = v.view({n, kNf4Block});
    // The scale as held: rounded to bf16 first, so dequantization multiplies by what scaled.
    const torch::Tensor m = v.abs().amax(1).to(torch::kBFloat16).to(torch::kFloat32);
    const torch::Tensor scaled = v / torch::where(m > 0, m, torch::ones_like(m)).unsqueeze(1);
    const torch::Tensor idx = torch::bucketize(scaled, mids).view({-1, 2});
    q.codes.narrow(0, begin / 2, n * kNf4Block / 2).copy_(idx.select(1, 0) * 16 + idx.select(1, 1));
    q.absmax.narrow(0, first, n).copy_(m);  // exact: m is a bf16 value
  }
  return q;
}

torch::Tensor nf4_dequantize(const Nf4Matrix& m, torch::ScalarType dtype, const torch::Tensor& scratch) {
  THETAD_CHECK(m.defined() && (dtype == torch::kBFloat16 || dtype == torch::kFloat32), InternalError,
               "nf4_dequantize: a quantized matrix into bf16 or float32");
  const int64_t numel = m.numel();
  const torch::Device device = m.codes.device();
  const bool into_scratch = scratch.defined() && scratch.scalar_type() == dtype && scratch.device() == device &&
                            scratch.is_contiguous() && scratch.numel() >= numel;
  torch::Tensor out = into_scratch ? scratch.view({-1}).narrow(0, 0, numel)
                                   : torch::empty({numel}, torch::TensorOptions().dtype(dtype).device(device));
#if THETAD_TORCH_CUDA && THETAD_MODEL_KERNELS
  if (device.is_cuda()) {
    const bool bf16 = dtype == torch::kBFloat16;
    kernels::nf4_dequantize(m.codes.data_ptr<uint8_t>(), reinterpret_cast<const uint16_t*>(m.absmax.data_ptr()),
                            nf4_code_book().data(), numel,
                            bf16 ? reinterpret_cast<uint16_t*>(out.data_ptr()) : nullptr,
                            bf16 ? nullptr : out.data_ptr<float>(),
                            c10::cuda::getCurrentCUDAStream(device.index()).stream());
    return out.view({m.rows, m.cols});
  }
#endif
  THETAD_CHECK(device.is_cpu(), InternalError, "nf4_dequantize: a ", device, " matrix in a build without its kernel");
  torch::NoGradGuard no_grad;
  const int64_t blocks = m.absmax.numel();
  const torch::Tensor values = pair_table().index_select(0, m.codes.to(torch::kLong)).view({blocks, kNf4Block});
  const torch::Tensor scale = m.absmax.to(torch::kFloat32).unsqueeze(1);
  const torch::Tensor scaled = (values * scale).view({-1}).narrow(0, 0, numel).to(torch::kBFloat16);
  out.copy_(scaled);
  return out.view({m.rows, m.cols});
}

torch::Tensor Nf4Scratch::get(int64_t numel, torch::ScalarType dtype, torch::Device device) {
  if (!buffer_.defined() || buffer_.scalar_type() != dtype || buffer_.device() != device || buffer_.numel() < numel)
    buffer_ = torch::empty({std::max(numel, reserved_)}, torch::TensorOptions().dtype(dtype).device(device));
  return buffer_;
}

void Nf4Weights::add(int id, Nf4Matrix m) {
  scratch_.reserve(m.numel());
  matrices_[id] = std::move(m);
}

void Nf4Weights::follow(torch::Device device) {
  for (auto& [id, m] : matrices_)
    if (m.codes.device() != device) m = m.to(device);
}

torch::Tensor Nf4Weights::acquire(int id, torch::ScalarType dtype, bool backward) {
  (void)backward;
  const Nf4Matrix& m = matrices_.at(id);
  return nf4_dequantize(m, dtype, scratch_.get(m.numel(), dtype, m.codes.device()));
}

}  // namespace thetad::daemon
