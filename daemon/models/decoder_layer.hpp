// The transformer's decoder layer as the model holds it (daemon/models/transformer.cpp): its
// matrices by LoRA target, the projections (GEMMs) that join the targets reading one input, and
// one layer's tensors.
#pragma once

#include <torch/torch.h>

#include <array>
#include <vector>

#include "config/lora_adapter.hpp"
#include "daemon/ops/frozen_weight.hpp"

namespace thetad::daemon::decoder {

// A layer's matrices by target (config/lora_adapter.hpp: the order of lora.targets' words), as
// indices of per-target arrays; the base's parameter name of each.
constexpr int kQ = int(config::LoraTarget::q), kK = int(config::LoraTarget::k), kV = int(config::LoraTarget::v),
              kO = int(config::LoraTarget::o), kGate = int(config::LoraTarget::gate), kUp = int(config::LoraTarget::up),
              kDown = int(config::LoraTarget::down), kTargets = config::kLoraTargets;
constexpr std::array<const char*, kTargets> kParamNames = {"attn.q", "attn.k", "attn.v", "attn.o",
                                                           "mlp.gate", "mlp.up", "mlp.down"};

// The targets that read one input: a layer's GEMMs (and its adapters) in four groups, joined into
// one GEMM each where the base is frozen (daemon/ops/joined_linear.hpp).
enum Projection { kQkv, kAttnOut, kGateUp, kFfnOut, kProjections };
inline const std::array<std::vector<int>, kProjections> kMembers = {{{kQ, kK, kV}, {kO}, {kGate, kUp}, {kDown}}};

struct Lora {
  torch::Tensor a, b;  // a: [rank x in], b: [out x rank]; undefined: not adapted
};

struct Block {
  torch::Tensor ln1_w, ln1_b, ln2_w, ln2_b;  // the biases: gpt2 only
  std::array<torch::Tensor, kTargets> w;     // [out x in]; gate undefined for gpt2
  std::array<torch::Tensor, kTargets> bias;  // qwen2's q, k and v; undefined elsewhere
  torch::Tensor q_norm, k_norm;              // qwen3: RMSNorm weights [head size] of each query and key head
  // A frozen base's projections of several targets as one matrix (and bias) whose rows the
  // targets' parameters view; undefined where not joined.
  std::array<torch::Tensor, kProjections> joined_w, joined_b;
};

// A frozen base's GEMMs numbered layer by layer, projection by projection (the output layer is -1).
inline int gemm_id(size_t layer, int p) { return static_cast<int>(layer) * kProjections + p; }

// Every layer's projections as GEMMs of the base: their matrices (rows joined) and biases.
inline std::vector<BaseGemm> layer_gemms(const std::vector<Block>& blocks) {
  std::vector<BaseGemm> gemms;
  for (size_t i = 0; i < blocks.size(); ++i) {
    for (int p = 0; p < kProjections; ++p) {
      BaseGemm g{gemm_id(i, p), static_cast<int>(i), {}, {}};
      for (int k : kMembers[static_cast<size_t>(p)]) {
        if (!blocks[i].w[static_cast<size_t>(k)].defined()) continue;
        g.weights.push_back(blocks[i].w[static_cast<size_t>(k)]);
        if (blocks[i].bias[static_cast<size_t>(k)].defined()) g.biases.push_back(blocks[i].bias[static_cast<size_t>(k)].detach());
      }
      gemms.push_back(std::move(g));
    }
  }
  return gemms;
}

}  // namespace thetad::daemon::decoder
