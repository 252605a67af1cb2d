// config::Job -> options of the engine, the bucket plan and the store (see job_options.hpp).
#include "daemon/plan/job_options.hpp"

#include <cmath>
#include <iomanip>
#include <sstream>

#include "config/loader.hpp"

namespace thetad::daemon {

std::chrono::milliseconds comm_timeout(const config::Job& job) {
  return std::chrono::milliseconds(static_cast<int64_t>(job.comm.timeout_s * 1000));
}

comm::BucketPlanOptions bucket_plan_options(const config::Job& job) {
  comm::BucketPlanOptions o;
  o.bucket_cap_bytes = job.comm.bucket_cap_bytes();
  o.first_bucket_bytes = job.comm.first_bucket_bytes();
  return o;
}

comm::EngineOptions engine_options(const config::Job& job) {
  comm::EngineOptions o;
  o.prune = job.comm.prune;
  o.average = job.comm.average == config::Average::World ? comm::Average::world : comm::Average::contributors;
  o.declared = job.comm.active == config::Active::Declared;
  o.timeout = comm_timeout(job);
  o.wire = job.comm.grad_dtype == config::GradDtype::Bf16 ? comm::DType::bf16 : comm::DType::f32;
  return o;
}

offload::StoreOptions store_options(const config::Job& job) {
  offload::StoreOptions o;
  o.device_slots = job.offload.device_slots;
  o.device_budget_bytes = job.offload.device_budget_bytes();
  o.prefetch = job.offload.prefetch;
  o.host_limit_bytes = job.offload.host_limit_bytes();
  o.cpu_threads = job.offload.cpu_threads;
  o.shard_bytes = job.offload.shard_bytes();
  o.timeout_s = job.comm.timeout_s;
  o.bf16_copies = job.offload.h2d_dtype == config::H2dDtype::Bf16;
  switch (job.offload.uncached_update) {
    case config::UncachedUpdate::Auto: o.uncached_update = offload::UncachedUpdate::Auto; break;
    case config::UncachedUpdate::Host: o.uncached_update = offload::UncachedUpdate::Host; break;
    case config::UncachedUpdate::Device: o.uncached_update = offload::UncachedUpdate::Device; break;
  }
  return o;
}

double lr_at(const config::OptimizerConfig& opt, int64_t step, int64_t total_steps) {
  if (opt.warmup_steps > 0 && step < opt.warmup_steps)
    return opt.lr * double(step + 1) / double(opt.warmup_steps);
  if (opt.lr_schedule == config::LrSchedule::Cosine) {
    const double span = std::max<int64_t>(1, total_steps - opt.warmup_steps);
    const double progress = std::min(1.0, double(step - opt.warmup_steps) / span);
    return opt.min_lr + 0.5 * (opt.lr - opt.min_lr) * (1.0 + std::cos(M_PI * progress));
  }
  return opt.lr;
}

std::string hex64(uint64_t h) {
  std::ostringstream os;
  os << std::hex << std::setw(16) << std::setfill('0') << h;
  return os.str();
}

std::string model_hash(const config::Job& job) {
  std::string lines;
  std::istringstream in(config::fingerprint(job));
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model.", 0) == 0) lines += line + "\n";
  return hex64(comm::fnv1a64(lines));
}

}  // namespace thetad::daemon
