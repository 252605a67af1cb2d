// Test-only: the logits thetad's model computes at its initial weights (model.init_from,
// lora.init_from) for given token ids, as a float32 .npy, so that tests can compare them with
// another implementation (tests/integration/llama_peft.sh against its own torch Llama,
// gpu_llama_peft.sh against Hugging Face transformers and peft). Not part of `thetad`.
//
//   thetad_logits JOB.yaml [--set k=v ...] --tokens IDS.npy (int64 [rows, seq]) --task T --out OUT.npy
//                 [--task T2 --out OUT2.npy ...] [--device cuda]
// Each --out takes the task of the --task before it: one start gives several tasks' logits.
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "common/errors.hpp"
#include "config/loader.hpp"
#include "daemon/formats/npy.hpp"
#include "daemon/models/model.hpp"
#include "daemon/ops/precision.hpp"
#include "daemon/plan/input_path.hpp"

using namespace thetad;
using namespace thetad::daemon;

// A float32 C-order .npy of `t` (numpy's format 1.0: header padded to 64 bytes).
void save_npy(const std::string& path, const torch::Tensor& t) {
  std::string shape;
  for (int64_t d : t.sizes()) shape += std::to_string(d) + ", ";
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + shape + "), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  const char len[2] = {static_cast<char>(header.size() & 0xff), static_cast<char>(header.size() >> 8)};
  out.write(len, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.numel() * 4));
  if (!out) throw Error(path + ": cannot write");
}

int main(int argc, char** argv) {
  std::string job_path, tokens, device = "cpu";
  int task = 0;
  std::vector<std::pair<int, std::string>> outs;  // (task, file)
  config::LoadOptions lo;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--", 0) == 0 && i + 1 >= argc) {
      std::cerr << "thetad_logits: " << a << " needs a value\n";
      return 2;
    }
    if (a == "--set") lo.overrides.push_back(argv[++i]);
    else if (a == "--tokens") tokens = argv[++i];
    else if (a == "--task") task = std::stoi(argv[++i]);
    else if (a == "--out") outs.emplace_back(task, argv[++i]);
    else if (a == "--device") device = argv[++i];
    else job_path = a;
  }
  try {
    const config::Job job = config::load_job(job_path, lo);
    const torch::Device dev(device);
    auto model = make_model(with_input_paths(job, 0), dev);  // its paths as rank 0 reads them
    NpyArray ids = NpyArray::open(tokens);
    ids.require_dtype("<i8");
    ids.require_ndim(2);
    const torch::Tensor x = torch::from_blob(const_cast<void*>(ids.data()), {ids.shape()[0], ids.shape()[1]}, torch::kInt64).to(dev);
    torch::NoGradGuard no_grad;
    for (const auto& [t, out] : outs) {
      torch::Tensor logits;
      {
        AutocastScope autocast(job.precision, dev);
        logits = model->forward(x, t);
      }
      save_npy(out, logits.to(torch::kCPU, torch::kFloat32).contiguous());
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "thetad_logits: " << e.what() << "\n";
    return exit_code_for(e);
  }
}
