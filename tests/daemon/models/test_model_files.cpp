// Untrusted model files through the model's own loading (make_model, make_data), each crafted
// here: a state dict (model.init_from, .pt) whose pickle lies about its tensors (offsets,
// strides, a storage longer than its record, nesting, a short argument tuple), non-finite values
// in a base (.pt or safetensors) or in PEFT adapters (lora.init_from), an adapter_config.json
// nested deep or not a regular file, and a token file or .npy data truncated while the job runs.
// Each is an error naming the file (and the tensor), never a crash, a hang or values read from
// elsewhere.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "config/loader.hpp"
#include "config/lora_adapter.hpp"
#include "daemon/formats/safetensors.hpp"
#include "daemon/models/model.hpp"
#include "../pt_craft.hpp"
#include "tests/daemon/test_util.hpp"

namespace thetad::daemon {
namespace {

namespace fs = std::filesystem;
using test::put;

const std::string kMlp =
    "job: files\nseed: 3\nsteps: 1\n"
    "model: {kind: multitask_mlp, input_dim: 4, hidden: 6, trunk_layers: 1, head_layers: 1, tasks: 2}\n"
    "data: {kind: synthetic, batch_per_rank: 2, schedule: round_robin}\n";
const std::string kLlama =
    "job: files\nseed: 3\nsteps: 1\n"
    "model: {kind: transformer, arch: llama, layers: 1, d_model: 8, heads: 2, kv_heads: 1, d_ff: 12, vocab: 16, "
    "seq_len: 6, tasks: 1}\n"
    "lora: {rank: 2, alpha: 4, targets: [q, v]}\n"
    "data: {kind: synthetic, batch_per_rank: 2, schedule: round_robin}\n";

class ModelFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("thetad_model_files_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  static config::Job job(const std::string& yaml, std::vector<std::string> sets) {
    config::LoadOptions lo;
    lo.overrides = std::move(sets);
    return config::load_job_from_string(yaml, "files.yaml", lo);
  }
  // The message of the ConfigError that building the model throws ("" and a failure if none).
  static std::string model_error(const config::Job& j) {
    try {
      make_model(j, torch::kCPU);
    } catch (const ConfigError& e) {
      return e.what();
    }
    ADD_FAILURE() << "the model was built";
    return "";
  }
  fs::path dir_;
};

// The MLP's shared parameters (group 0) as a state dict of float32 tensors, one storage each,
// values 0.01 * (i + 1) for element i; `change` may alter tensor k's view and record.
struct StateDict {
  std::vector<test::CraftTensor> tensors;
  std::vector<std::pair<std::string, std::string>> records;
  std::vector<std::vector<float>> values;
};

StateDict mlp_state_dict() {
  config::LoadOptions lo;
  auto model = make_model(config::load_job_from_string(kMlp, "files.yaml", lo), torch::kCPU);
  StateDict sd;
  for (const NamedParam& p : model->params()) {
    if (p.group != 0) continue;
    const std::string key = std::to_string(sd.tensors.size());
    std::vector<float> v(static_cast<size_t>(p.tensor.numel()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * static_cast<float>(i + 1);
    sd.tensors.push_back({p.name, "FloatStorage", key, p.tensor.numel(), 0, p.tensor.sizes().vec(), {}});
    sd.records.emplace_back("data/" + key, test::float_bytes(v));
    sd.values.push_back(v);
  }
  return sd;
}

std::string archive(const StateDict& sd, bool ordered = false) {
  return test::pt_archive(test::state_dict_pickle(sd.tensors, ordered), sd.records);
}

TEST_F(ModelFiles, StateDictLoadsInBothForms) {
  const StateDict sd = mlp_state_dict();
  for (const bool ordered : {false, true}) {  // torch.save of a dict; of model.state_dict()
    const std::string path = file(ordered ? "ordered.pt" : "plain.pt");
    put(path, archive(sd, ordered));
    const auto model = make_model(job(kMlp, {"model.init_from=" + path}), torch::kCPU);
    size_t k = 0;
    for (const NamedParam& p : model->params()) {
      if (p.group != 0) continue;
      const torch::Tensor want = torch::from_blob(const_cast<float*>(sd.values[k].data()), p.tensor.sizes(), torch::kFloat32);
      EXPECT_TRUE(p.tensor.detach().equal(want)) << p.name << (ordered ? " (OrderedDict)" : " (dict)");
      ++k;
    }
  }
}

// The pickle's view of a tensor must lie within its storage, whose bytes are its record's.
TEST_F(ModelFiles, StateDictViewsOutsideTheirStorageRefused) {
  struct Case {
    const char* name;
    void (*change)(StateDict&);
    const char* want;
  };
  const Case cases[] = {
      {"offset", [](StateDict& s) { s.tensors[0].offset = 24; }, "storage offset 24"},
      {"offset40", [](StateDict& s) { s.tensors[1].offset = 40; }, "storage offset 40"},
      {"storage_longer_than_record",
       [](StateDict& s) {
         s.tensors[1].numel = 16;  // 16 floats claimed, 4 bytes stored: the view reads past them
         s.records[1].second.resize(4);
       },
       "4 bytes"},
      {"huge_stride",
       [](StateDict& s) {
         s.tensors[0].strides = test::contiguous_strides(s.tensors[0].sizes);
         s.tensors[0].strides[0] = int64_t{1} << 40;
       },
       "not contiguous"},
      {"negative_stride",
       [](StateDict& s) {
         s.tensors[1].offset = s.tensors[1].numel - 1;
         s.tensors[1].strides = {-1};
       },
       "stride"},
      {"transposed",
       [](StateDict& s) {
         auto& t = s.tensors[0];
         t.strides = {1, t.sizes[0]};
       },
       "not contiguous"},
  };
  for (const Case& c : cases) {
    StateDict sd = mlp_state_dict();
    c.change(sd);
    const std::string path = file(std::string(c.name) + ".pt");
    put(path, archive(sd));
    const std::string e = model_error(job(kMlp, {"model.init_from=" + path}));
    EXPECT_NE(e.find(path), std::string::npos) << c.name << ": " << e;
    EXPECT_NE(e.find(c.want), std::string::npos) << c.name << ": " << e;
  }
}

TEST_F(ModelFiles, StateDictMalformedPickleRefused) {
  // Two million nested lists as a value (EMPTY_LIST MARK ... APPENDS); a SETITEM with a dict and
  // a key but no value on the stack (LibTorch's std::out_of_range).
  test::Pickle deep;
  deep.op('}').mark().str("x");
  const size_t n = 2000000;
  for (size_t i = 0; i < n; ++i) deep.op(']').mark();
  deep.raw(std::string(n, 'e')).op('u').stop();
  test::Pickle setitem;
  setitem.op('}').str("x").op('s').stop();
  const std::pair<const char*, std::string> cases[] = {{"deep", deep.bytes()}, {"setitem", setitem.bytes()}};
  for (const auto& [name, pickle] : cases) {
    const std::string path = file(std::string(name) + ".pt");
    put(path, test::pt_archive(pickle, {}));
    const std::string e = model_error(job(kMlp, {"model.init_from=" + path}));
    EXPECT_NE(e.find(path), std::string::npos) << name << ": " << e;
    EXPECT_NE(e.find(name[0] == 'd' ? "nested deeper than" : "SETITEM"), std::string::npos) << name << ": " << e;
  }
}

TEST_F(ModelFiles, StateDictNotARegularFileRefused) {
  const std::string fifo = file("fifo.pt");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string e = model_error(job(kMlp, {"model.init_from=" + fifo}));
  EXPECT_NE(e.find(fifo + ": model.init_from: not a regular file (a FIFO)"), std::string::npos) << e;
}

TEST_F(ModelFiles, NonFiniteStateDictRefused) {
  StateDict sd = mlp_state_dict();
  std::vector<float> v = sd.values[1];
  v[2] = std::numeric_limits<float>::quiet_NaN();
  sd.records[1].second = test::float_bytes(v);
  const std::string path = file("nan.pt");
  put(path, archive(sd));
  const std::string e = model_error(job(kMlp, {"model.init_from=" + path}));
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("'" + sd.tensors[1].key + "' value 2 is nan"), std::string::npos) << e;
}

// A Llama base as safetensors (thetad's names) with one value not finite, in each float dtype:
// early in the first 2-D tensor, and late in the largest, a tensor of more than one load piece
// (4 Mi values, read by different threads) and many check blocks: the message names the value's
// index in the whole tensor.
TEST_F(ModelFiles, NonFiniteSafetensorsBaseRefused) {
  struct Case {
    std::vector<std::string> sets;
    bool largest;
    int64_t from_end;
  };
  const std::vector<Case> cases = {{{}, false, 0}, {{"model.vocab=70000", "model.d_model=64", "model.d_ff=8"}, true, 3}};
  for (const Case& c : cases) {
    const config::Job j = job(kLlama, c.sets);
    const auto source = make_model(j, torch::kCPU);
    const NamedParam* target = nullptr;
    for (const NamedParam& p : source->params())
      if (p.group == 0 && p.tensor.dim() == 2 && (!target || (c.largest && p.tensor.numel() > target->tensor.numel())))
        target = &p;
    ASSERT_NE(target, nullptr);
    const int64_t at = c.largest ? target->tensor.numel() - c.from_end : 5;
    if (c.largest) {
      ASSERT_GT(at, int64_t{4} << 20);
    }
    for (const char* dtype : {"F32", "BF16", "F16"}) {
      std::vector<torch::Tensor> keep;
      std::vector<StWriteTensor> tensors;
      for (const NamedParam& p : source->params()) {
        if (p.group != 0) continue;
        torch::Tensor v = p.tensor.detach().clone().contiguous();
        if (&p == target) v.view({-1})[at] = std::numeric_limits<float>::infinity();
        v = v.to(std::string(dtype) == "F32" ? torch::kFloat32 : std::string(dtype) == "BF16" ? torch::kBFloat16 : torch::kFloat16);
        keep.push_back(v);
        tensors.push_back({p.name, dtype, v.sizes().vec(), v.data_ptr(), static_cast<size_t>(v.nbytes())});
      }
      const std::string path = file(std::string("base-") + dtype + ".safetensors");
      write_safetensors(path, tensors);
      std::vector<std::string> sets = c.sets;
      sets.push_back("model.init_from=" + path);
      const std::string e = model_error(job(kLlama, sets));
      EXPECT_NE(e.find(path + ": model.init_from: tensor '" + target->name + "' value " + std::to_string(at) + " is inf"),
                std::string::npos)
          << dtype << ": " << e;
    }
  }
}

// A PEFT adapter directory for kLlama's task 0: adapter_config.json (`config`) and the adapters,
// one value `poison` where that is not 0.
std::string adapter_config(const std::string& r = "2") {
  return "{\"peft_type\": \"LORA\", \"r\": " + r +
         ", \"lora_alpha\": 4, \"target_modules\": [\"q_proj\", \"v_proj\"], \"bias\": \"none\"}";
}

void write_adapters(const std::string& dir, float poison) {
  fs::create_directories(dir);
  std::vector<std::vector<float>> keep;
  std::vector<StWriteTensor> tensors;
  for (const char* word : {"q", "v"})
    for (const bool a : {true, false}) {
      const std::vector<int64_t> shape = a ? std::vector<int64_t>{2, 8} : std::vector<int64_t>{word[0] == 'q' ? 8 : 4, 2};
      keep.emplace_back(static_cast<size_t>(shape[0] * shape[1]), 0.5f);
      if (poison != 0 && word[0] == 'v' && !a) keep.back()[3] = poison;
      tensors.push_back({config::LoraAdapter::peft_name(0, *config::lora_target_of(word), a), "F32", shape, keep.back().data(), keep.back().size() * 4});
    }
  write_safetensors(dir + "/adapter_model.safetensors", tensors);
}

TEST_F(ModelFiles, AdaptersLoadAndNonFiniteRefused) {
  const std::string dir = file("adapters");
  write_adapters(dir, 0);
  put(dir + "/adapter_config.json", adapter_config());
  const auto model = make_model(job(kLlama, {"lora.init_from=" + dir}), torch::kCPU);
  write_adapters(dir, -std::numeric_limits<float>::infinity());
  const std::string e = model_error(job(kLlama, {"lora.init_from=" + dir}));
  EXPECT_NE(e.find(dir + "/adapter_model.safetensors: lora.init_from: tensor '" + config::LoraAdapter::peft_name(0, config::LoraTarget::v, false) +
                   "' value 3 is -inf"),
            std::string::npos)
      << e;
}

TEST_F(ModelFiles, AdapterConfigNestedDeepOrNotRegularRefused) {
  const std::string dir = file("adapters");
  write_adapters(dir, 0);
  const std::string cfg = dir + "/adapter_config.json";
  put(cfg, adapter_config(std::string(100000, '[') + std::string(100000, ']')));
  std::string e = model_error(job(kLlama, {"lora.init_from=" + dir}));
  EXPECT_NE(e.find(cfg + ": lora.init_from: nested deeper than 64 levels"), std::string::npos) << e;
  fs::remove(cfg);
  ASSERT_EQ(::mkfifo(cfg.c_str(), 0600), 0);
  e = model_error(job(kLlama, {"lora.init_from=" + dir}));
  EXPECT_NE(e.find(cfg + ": lora.init_from: not a regular file (a FIFO)"), std::string::npos) << e;
  fs::remove(cfg);
  fs::create_symlink("/etc/passwd", cfg);
  e = model_error(job(kLlama, {"lora.init_from=" + dir}));
  EXPECT_NE(e.find(cfg + ": lora.init_from: a symbolic link to /etc/passwd, outside"), std::string::npos) << e;
}

// A flat token file cut short while the job runs: the next batch is an error naming the file
// (the windows are read with pread: no SIGBUS from a mapping past the file's end).
TEST_F(ModelFiles, TokenFileTruncatedWhileRunning) {
  const std::string data = file("tokens");
  fs::create_directories(data);
  std::vector<uint16_t> ids(4096);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint16_t>(i % 16);
  const std::string bin = data + "/task0.bin";
  put(bin, std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * 2));
  const config::Job j = job(kLlama, {"data.kind=tokens", "data.dir=" + data, "data.token_dtype=uint16"});
  const auto model = make_model(j, torch::kCPU);
  const auto source = make_data(j, *model, torch::kCPU);
  const Batch b = source->batch(0, 0, 1, 0, 2);
  EXPECT_EQ(b.x.sizes(), (std::vector<int64_t>{2, 6}));
  EXPECT_TRUE(b.y.narrow(1, 0, 5).equal(b.x.narrow(1, 1, 5)));
  ASSERT_EQ(::truncate(bin.c_str(), 10), 0);
  try {
    for (int64_t step = 1; step < 50; ++step) source->batch(step, 0, 1, 0, 2);
    ADD_FAILURE() << "no error after the token file was cut short";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bin + ": "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("changed while the job ran"), std::string::npos) << e.what();
  }
}

// A flat token file written into in place while the job runs (the same size, ids still within the
// vocabulary: read before as the new ids, silently), or another file renamed into its place: the
// next batch is an error naming the file.
TEST_F(ModelFiles, TokenFileWrittenInPlaceOrReplacedWhileRunning) {
  const std::string data = file("tokens");
  fs::create_directories(data);
  const auto ids_bytes = [](int shift) {
    std::vector<uint16_t> ids(4096);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint16_t>((i + static_cast<size_t>(shift)) % 16);
    return std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * 2);
  };
  const std::string bin = data + "/task0.bin";
  const config::Job j = job(kLlama, {"data.kind=tokens", "data.dir=" + data, "data.token_dtype=uint16"});
  const auto model = make_model(j, torch::kCPU);
  for (const bool rename : {false, true}) {
    put(bin, ids_bytes(0));
    const auto source = make_data(j, *model, torch::kCPU);
    source->batch(0, 0, 1, 0, 2);
    if (rename) {
      put(data + "/new.bin", ids_bytes(1));
      ASSERT_EQ(::rename((data + "/new.bin").c_str(), bin.c_str()), 0);
    } else {
      test::write_in_place(bin, ids_bytes(1));
    }
    try {
      source->batch(1, 0, 1, 0, 2);
      ADD_FAILURE() << "no error after the token file changed (rename " << rename << ")";
    } catch (const Error& e) {
      const std::string why = rename ? "another file was put in its place" : "written into since the start (now 8192 bytes";
      EXPECT_NE(std::string(e.what()).find(bin + ": changed while the job ran: " + why), std::string::npos) << e.what();
    }
  }
}

// Features and targets (.npy, mapped) cut short while the job runs: the next batch is an error
// naming the file, not SIGBUS.
TEST_F(ModelFiles, NpyDataTruncatedWhileRunning) {
  const std::string data = file("npy");
  fs::create_directories(data);
  const int64_t rows = 16384;  // 256 KiB of features a task: pages past the header's
  for (int t = 0; t < 2; ++t) {
    const std::string n = std::to_string(rows);
    put(data + "/task" + std::to_string(t) + "_x.npy",
        test::npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (" + n + ", 4), }",
                        test::raw_bytes(std::vector<float>(static_cast<size_t>(rows) * 4, 0.5f))));
    put(data + "/task" + std::to_string(t) + "_y.npy",
        test::npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (" + n + ",), }",
                        test::raw_bytes(std::vector<float>(static_cast<size_t>(rows), 1.5f))));
  }
  const config::Job j = job(kMlp, {"data.kind=npy", "data.dir=" + data});
  const auto model = make_model(j, torch::kCPU);
  const auto source = make_data(j, *model, torch::kCPU);
  const Batch b = source->batch(0, 0, 1, 0, 64);
  EXPECT_TRUE(b.x.eq(0.5f).all().item<bool>());
  EXPECT_TRUE(b.y.eq(1.5f).all().item<bool>());
  const std::string x = data + "/task0_x.npy";
  ASSERT_EQ(::truncate(x.c_str(), 128), 0);
  try {
    for (int64_t step = 1; step < 50; ++step) source->batch(step, 0, 1, 0, 64);
    ADD_FAILURE() << "no error after the features were cut short";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(x + ": rows of a batch: cannot be read: the file is now 128 bytes"),
              std::string::npos) << e.what();
  }
}

// A job may have a token file per task, thousands of them: no descriptor is held per file (the
// soft limit on open files is set just above what the process holds, below the task count).
TEST_F(ModelFiles, TokenFilesHoldNoDescriptors) {
  const std::string data = file("tokens");
  fs::create_directories(data);
  const int tasks = 24;
  std::vector<uint16_t> ids(64);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint16_t>(i % 16);
  for (int t = 0; t < tasks; ++t)
    put(data + "/task" + std::to_string(t) + ".bin", std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * 2));
  const config::Job j = job(kLlama, {"data.kind=tokens", "data.dir=" + data, "data.token_dtype=uint16",
                                     "model.tasks=" + std::to_string(tasks)});
  const auto model = make_model(j, torch::kCPU);
  size_t open_fds = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/fd")) ++open_fds;
  rlimit was {};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &was), 0);
  rlimit low = was;
  low.rlim_cur = open_fds + 8;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  try {
    const auto source = make_data(j, *model, torch::kCPU);
    for (int t = 0; t < tasks; ++t) EXPECT_EQ(source->batch(0, 0, 1, t, 2).x.size(0), 2);
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
  }
  ::setrlimit(RLIMIT_NOFILE, &was);
}

}  // namespace
}  // namespace thetad::daemon
