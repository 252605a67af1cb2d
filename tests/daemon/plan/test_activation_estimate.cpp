// The transformer pass's activations per token (daemon/plan/activation_estimate.hpp), counted
// here again tensor by tensor for the 1.1 B Llama of bench/jobs/llama-1b-lora.yaml, and what moves
// them: the compute dtype, offload.activations, the architecture; the rule auto applies.
#include <gtest/gtest.h>

#include <string>

#include "config/loader.hpp"
#include "daemon/plan/activation_estimate.hpp"

namespace thetad::daemon {
namespace {

config::Job llama_1b(const std::string& more = "", const std::string& precision = "bf16",
                     const std::string& arch = "llama") {
  return config::load_job_from_string(
      "job: l\nsteps: 1\nprecision: " + precision + "\ndata: {kind: synthetic}\n"
      "model: {kind: transformer, arch: " + arch + ", kv_heads: 4, layers: 22, d_model: 2048, heads: 32, "
      "d_ff: 5632, vocab: 32000, seq_len: 2048, tasks: 8, train_shared: false}\n"
      "lora: {rank: 16, alpha: 32, targets: [q, k, v, o, gate, up, down]}\n" + more,
      "job.yaml");
}

TEST(ActivationEstimate, TheLlamaLayersSavedTensorsAndTheLogitsGradient) {
  // Per layer: residual sums and normed inputs of 2 norms (4 x 2048), q and the attention output
  // (2 x 2048), k and v (2 x 4 heads x 64), gate|up (2 x 5632), down's input (5632), x A^T of 7
  // targets (7 x 16); 32 heads' log-sum-exp in float32. Then the logits' gradient and the norm's input.
  const int64_t layer = (4 * 2048 + 2 * 2048 + 2 * 256 + 3 * 5632 + 7 * 16) * 2 + 32 * 4;
  const ActivationEstimate e = transformer_activations(llama_1b());
  EXPECT_EQ(e.bytes_per_token, 22 * layer + (32000 + 2048) * 2) << e.parts;
  EXPECT_NE(e.parts.find("22 layers"), std::string::npos) << e.parts;
}

TEST(ActivationEstimate, Fp32DoublesTheValuesAndOffloadLeavesOutTheActivationsInput) {
  const int64_t bf16 = transformer_activations(llama_1b()).bytes_per_token;
  const int64_t fp32 = transformer_activations(llama_1b("", "fp32")).bytes_per_token;
  EXPECT_EQ(fp32, 2 * bf16 - 22 * 32 * 4);  // the log-sum-exp is float32 in both
  const int64_t offloaded = transformer_activations(llama_1b("offload: {activations: true}\n")).bytes_per_token;
  EXPECT_EQ(bf16 - offloaded, 22 * 2 * 5632 * 2);  // gate|up waits in host memory
}

TEST(ActivationEstimate, Qwen3AddsItsHeadNormsAndOtherModelsAreNotCounted) {
  EXPECT_EQ(transformer_activations(llama_1b("", "bf16", "qwen3")).bytes_per_token -
                transformer_activations(llama_1b()).bytes_per_token,
            22 * (2048 + 256) * 2);
  const config::Job mlp = config::load_job_from_string(
      "job: m\nsteps: 1\ndata: {}\nmodel: {kind: multitask_mlp, input_dim: 8, hidden: 8, output_dim: 1, tasks: 2}\n", "job.yaml");
  EXPECT_EQ(transformer_activations(mlp).bytes_per_token, 0);
}

TEST(ActivationEstimate, TheJointPassFitsWithATenthOfTheDeviceLeft) {
  const int64_t gib = int64_t{1} << 30;
  EXPECT_TRUE(joint_pass_fits(18 * gib, 40 * gib, 80 * gib));
  EXPECT_TRUE(joint_pass_fits(32 * gib, 40 * gib, 80 * gib));   // 32 + 8 = 40
  EXPECT_FALSE(joint_pass_fits(33 * gib, 40 * gib, 80 * gib));
}

}  // namespace
}  // namespace thetad::daemon
