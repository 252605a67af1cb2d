// The Llama layer's memory-bound steps as kernels of their own, for bf16 on GPUs: each reads its
// inputs once and writes its outputs once, where LibTorch's operators pass over the activations
// once per operation (and, on the strided halves of a joined GEMM's output, without vectorized
// loads). Torch-free (raw bf16 bits as uint16_t, a cudaStream_t as void*); compiled with the
// CUDA toolkit only (THETAD_MODEL_KERNELS); daemon/models/transformer.cpp falls back to the
// operators elsewhere. Every function queues its work on `stream` and returns.
#pragma once

#include <cstdint>

namespace thetad::daemon::kernels {

// SwiGLU over the joined gate/up GEMM's output gu [rows, 2 ff] (contiguous): out [rows, ff] =
// silu(gate) * up, gate = gu[:, :ff], up = gu[:, ff:], in float32, rounded once.
void swiglu_forward(const uint16_t* gu, uint16_t* out, int64_t rows, int64_t ff, void* stream);
// Its gradient d_gu [rows, 2 ff] from g [rows, ff]: d_gate = g up silu'(gate), d_up = g silu(gate).
void swiglu_backward(const uint16_t* gu, const uint16_t* g, uint16_t* d_gu, int64_t rows, int64_t ff, void* stream);

// The joined q/k/v GEMM's output qkv [tokens, (heads + 2 kv_heads) head] (contiguous; token t at
// position t % seq of its row) split into contiguous q [tokens, heads head], k and v [tokens,
// kv_heads head], q and k rotated by the tables cos, sin [seq, head] (float32; Hugging Face's
// half-split rotation: out1 = x1 c - x2 s, out2 = x2 c + x1 s), in float32, rounded once.
struct RotaryShape {
  int64_t tokens, seq, heads, kv_heads, head;
};
void rotary_split_forward(const uint16_t* qkv, const float* cos, const float* sin, uint16_t* q, uint16_t* k,
                          uint16_t* v, const RotaryShape& s, void* stream);
// Its gradient: d_qkv from dq, dk (rotated back) and dv.
void rotary_split_backward(const uint16_t* dq, const uint16_t* dk, const uint16_t* dv, const float* cos,
                           const float* sin, uint16_t* d_qkv, const RotaryShape& s, void* stream);

// The residual stream's step before a GEMM (residual_norm_kernels.cu), a row of d float32 values
// at a time: sum = h + o (o, the sublayer's bf16 output; null: sum is h and is not written), n =
// bf16(w * (sum * rstd)) with rstd = 1 / sqrt(mean(sum^2) + eps) per row, kept for backward.
void residual_rms_norm_forward(const float* h, const uint16_t* o, const float* w, float* sum, uint16_t* n, float* rstd,
                               int64_t rows, int64_t d, float eps, void* stream);
// Its gradient from g_n (n's, bf16) and g_sum (the sum's from later layers, float32; null:
// none), x being the normed sum: the sum's whole gradient written to g_h in float32 and to g_o
// rounded to bf16 (either null: not wanted).
void residual_rms_norm_backward(const uint16_t* g_n, const float* x, const float* w, const float* rstd,
                                const float* g_sum, float* g_h, uint16_t* g_o, int64_t rows, int64_t d, void* stream);

}  // namespace thetad::daemon::kernels
