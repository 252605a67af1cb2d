// CPU Adam/AdamW for offloaded parameter groups: one fused, vectorized, multi-threaded pass
// over (param, grad, m, v) whose numerics follow LibTorch's torch::optim::Adam / AdamW.
//
//   thetad::offload::AdamHyper h{1e-3, 0.9, 0.999, 1e-8, 0.01, /*decoupled=*/true, step};
//   thetad::offload::adam_step(param, grad, exp_avg, exp_avg_sq, n, h);   // step is 1-based
//
// AdamW (decoupled):  p *= 1 - lr*wd;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g;
//                     p -= (lr/bc1) * m / (sqrt(v)/sqrt(bc2) + eps),  bc_i = 1 - b_i^step
// Adam:               g += wd*p first, no decoupled decay, otherwise the same.
// Bias corrections are computed in double, as LibTorch does. The AVX-512 or AVX2+FMA kernel is
// chosen once at run time from the CPU's features; the scalar kernel serves every other CPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace thetad::offload {

// Hyper-parameters are doubles, as in LibTorch's options: 1 - beta2 taken from a float 0.999
// would be off by 1.3e-5 relative. The kernels round each derived constant to float once.
struct AdamHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled = true;     // true: AdamW, false: Adam (L2 penalty added to the gradient)
  int64_t step = 1;          // 1-based count of steps taken by this group, this one included
  double grad_scale = 1.0;   // multiplies the gradient on the fly (gradient clipping factor)
  // > 0: the parameter store clips by the gradient's norm before the step: grad_scale becomes
  // clip_norm / (norm + 1e-6) where the norm (sum of squares in double) exceeds clip_norm.
  double clip_norm = 0.0;
};

// One optimizer step over n elements, in place on p, m, v. g is read only. Large n is split
// over a persistent pool of worker threads (one per hardware thread). Thread-safe: concurrent
// callers share the pool one at a time. p_bf16 (optional): also writes the updated parameters
// rounded to bfloat16 (nearest even, as comm::float_to_bf16), block by block while they are
// still in cache: the copy a bf16 job sends to the device (offload.h2d_dtype), for 2 more bytes
// written per parameter instead of a second pass over p.
void adam_step(float* p, const float* g, float* m, float* v, size_t n, const AdamHyper& h,
               uint16_t* p_bf16 = nullptr);

// dst[i] = bf16(src[i]) (round to nearest even, NaN stays NaN) on the thread pool: the bf16
// copy of parameters written other than by adam_step (initial values, resume, a device flush).
void round_to_bf16(const float* src, uint16_t* dst, size_t n);

// Sum of g[i]^2 over n elements, in double, on the thread pool (deterministic: fixed chunks,
// added in order).
double sum_squares(const float* g, size_t n);

// adam_step treats subnormal floats as zero (inputs) and flushes subnormal results to zero, as
// torch.set_flush_denormal(True) does: on by default (see cpu_adam.cpp for why: it changes no
// parameter's bits and keeps Intel cores off their slow path). false gives IEEE behaviour; the
// benchmark compares the two. Process-wide.
void set_flush_subnormals(bool on);

// Which kernel adam_step uses on this CPU: "avx512", "avx2" or "scalar".
std::string adam_kernel_name();

namespace detail {
// Kernel selection for tests: 0 = automatic, 1 = scalar, 2 = avx2, 3 = avx512 (ignored when the
// CPU lacks the feature).
void force_adam_kernel(int which);
}  // namespace detail

}  // namespace thetad::offload
