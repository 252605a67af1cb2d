// The 4-bit NormalFloat base's dequantization as a kernel of its own, for GPUs
// (daemon/ops/nf4.cpp): each byte of codes read once, each value written once, where LibTorch's
// operators would make index tensors eight times the codes' size. Torch-free, compiled with the
// CUDA toolkit only (THETAD_MODEL_KERNELS).
#pragma once

#include <cstdint>

namespace thetad::daemon::kernels {

// out[e] = round(code_book[code(e)] * absmax[e / 64]) for e < numel, the product in float32
// rounded once to bf16 (and widened again where out_f32 is the output): code(e) is the high half
// of codes[e / 2] for even e, the low half for odd e; absmax in bf16 (its bits). Exactly one of
// out_bf16 (bf16 bits) and out_f32 is given. Queued on `stream` (a cudaStream_t).
void nf4_dequantize(const uint8_t* codes, const uint16_t* absmax, const float* code_book, int64_t numel,
                    uint16_t* out_bf16, float* out_f32, void* stream);

}  // namespace thetad::daemon::kernels
