// config::LoraAdapter: the one place an adapter's matrices are named, parsed, shaped and counted.
// Its names must round-trip (the checkpoints and the PEFT files are read back through them),
// anything else must not parse as an adapter matrix, and its counts must be the shapes the
// transformer builds (counted here by hand for the 1.1 B Llama of bench/jobs/llama-1b-lora.yaml).
#include <gtest/gtest.h>

#include "config/lora_adapter.hpp"

namespace thetad::config {
namespace {

Job llama_1b(std::vector<std::string> targets) {
  Job job;
  job.model.kind = ModelKind::Transformer;
  job.model.arch = ModelArch::Llama;
  job.model.d_model = 2048;
  job.model.layers = 22;
  job.model.heads = 32;
  job.model.kv_heads = 4;
  job.model.d_ff = 5632;
  job.lora.rank = 16;
  job.lora.alpha = 32;
  job.lora.targets = std::move(targets);
  return job;
}

TEST(LoraAdapter, NamesRoundTrip) {
  const LoraAdapter adapter(llama_1b({"q", "k", "v", "o", "gate", "up", "down"}));
  const std::vector<LoraMatrix> ms = adapter.matrices(7);
  ASSERT_EQ(ms.size(), 22u * 7u * 2u);
  // The model's registration order: layer, then target in lora.targets' order, A before B.
  EXPECT_EQ(LoraAdapter::name(ms[0]), "lora.7.0.q.a");
  EXPECT_EQ(LoraAdapter::name(ms[1]), "lora.7.0.q.b");
  EXPECT_EQ(LoraAdapter::name(ms[2]), "lora.7.0.k.a");
  EXPECT_EQ(LoraAdapter::name(ms.back()), "lora.7.21.down.b");
  for (const LoraMatrix& m : ms) {
    const auto back = LoraAdapter::parse(LoraAdapter::name(m));
    ASSERT_TRUE(back.has_value()) << LoraAdapter::name(m);
    EXPECT_TRUE(*back == m) << LoraAdapter::name(m);
  }
  const auto big = LoraAdapter::parse("lora.123456789012.40.gate.b");
  ASSERT_TRUE(big.has_value());
  EXPECT_EQ(big->task, 123456789012);
  EXPECT_EQ(big->layer, 40);
  EXPECT_EQ(big->target, LoraTarget::gate);
  EXPECT_FALSE(big->a);
}

TEST(LoraAdapter, OtherNamesDoNotParse) {
  for (const char* name : {"", "lora", "lora.0.0.q", "lora.0.0.q.c", "lora.0.0.ffn.a", "lora.x.0.q.a", "lora.0..q.a",
                           "lora.-1.0.q.a", "lora.+1.0.q.a", "lora.0.0.q.a.b", "blocks.0.attn.q.weight",
                           "LORA.0.0.q.a", "lora.0.0.q.a ", "lora. 0.0.q.a", "lora.99999999999999999999.0.q.a"})
    EXPECT_FALSE(LoraAdapter::parse(name).has_value()) << "'" << name << "'";
}

TEST(LoraAdapter, PeftNames) {
  EXPECT_EQ(LoraAdapter::peft_name(0, LoraTarget::q, true), "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(LoraAdapter::peft_name(5, LoraTarget::gate, false), "base_model.model.model.layers.5.mlp.gate_proj.lora_B.weight");
  EXPECT_EQ(peft_module_of(LoraTarget::down), "mlp.down_proj");
  EXPECT_EQ(peft_module_of(LoraTarget::o), "self_attn.o_proj");
  for (int i = 0; i < kLoraTargets; ++i) {
    const auto t = static_cast<LoraTarget>(i);
    EXPECT_EQ(lora_target_of(lora_target_word(t)), t);
  }
  EXPECT_FALSE(lora_target_of("ffn").has_value());
}

TEST(LoraAdapter, ShapesAndSizeAreTheModelsMatrices) {
  const LoraAdapter adapter(llama_1b({"q", "k", "v", "o", "gate", "up", "down"}));
  // Heads of 64: q 2048 wide, k and v 4 x 64 = 256.
  EXPECT_EQ(adapter.base_shape(LoraTarget::q), (std::pair<int64_t, int64_t>{2048, 2048}));
  EXPECT_EQ(adapter.base_shape(LoraTarget::k), (std::pair<int64_t, int64_t>{256, 2048}));
  EXPECT_EQ(adapter.base_shape(LoraTarget::down), (std::pair<int64_t, int64_t>{2048, 5632}));
  EXPECT_EQ(adapter.shape(LoraTarget::v, true), (std::vector<int64_t>{16, 2048}));
  EXPECT_EQ(adapter.shape(LoraTarget::v, false), (std::vector<int64_t>{256, 16}));
  // By hand: 16 x ((2048+2048) + 2 (2048+256) + (2048+2048) + 3 (2048+5632)) per layer.
  const double per_layer = 16.0 * (4096 + 2 * 2304 + 4096 + 3 * 7680);
  EXPECT_EQ(adapter.elements_per_layer(), per_layer);
  EXPECT_EQ(adapter.elements(), 22 * per_layer);
  EXPECT_DOUBLE_EQ(adapter.scale(), 2.0);
  double from_shapes = 0;
  for (const LoraMatrix& m : adapter.matrices(0)) {
    const std::vector<int64_t> s = adapter.shape(m.target, m.a);
    from_shapes += double(s[0] * s[1]);
  }
  EXPECT_EQ(from_shapes, adapter.elements());

  // gpt2: heads of d_model / heads, no key/value heads of their own.
  Job gpt2 = llama_1b({"q", "v"});
  gpt2.model.arch = ModelArch::Gpt2;
  const LoraAdapter small(gpt2);
  EXPECT_EQ(small.base_shape(LoraTarget::v), (std::pair<int64_t, int64_t>{2048, 2048}));
  EXPECT_TRUE(small.adapts(LoraTarget::q));
  EXPECT_FALSE(small.adapts(LoraTarget::k));
  EXPECT_EQ(small.elements_per_layer(), 16.0 * 2 * 4096);
}

}  // namespace
}  // namespace thetad::config
