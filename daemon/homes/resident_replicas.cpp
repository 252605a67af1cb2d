// ResidentReplicas (see resident_replicas.hpp).
#include "daemon/homes/resident_replicas.hpp"

#include <string>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "daemon/plan/job_options.hpp"

namespace thetad::daemon {

ResidentReplicas::ResidentReplicas(const config::Job& job, const DataPlane& plane, comm::Engine& engine,
                                   WindowPlans& plans, std::vector<uint8_t> keepable,
                                   std::vector<int64_t> state_numel, StateOf state_of, Timeline* timeline)
    : job_(job),
      plane_(plane),
      engine_(engine),
      keepable_(std::move(keepable)),
      state_numel_(std::move(state_numel)),
      state_of_(std::move(state_of)),
      timeline_(timeline),
      plan_(plans, keepable_, replica_costs(job)),
      holders_(static_cast<int>(keepable_.size())) {
  int n = 0;
  for (uint8_t k : keepable_) n += k;
  THETAD_LOG(info, "replicas") << n << " resident groups follow the replica rule: one trained by one rank in "
                               << min_kept_run(replica_costs(job)) << " or more windows in a row keeps its gradient "
                               << "there; the others' replicas catch up when the schedule needs them";
}

void ResidentReplicas::start_window(int64_t step) {
  step_ = step;
  for (int g = 0; g < plan_.num_groups(); ++g) {
    if (!applies(g)) continue;
    const ReplicaDecision d = plan_.decision(step, g);
    if (auto m = holders_.before(g, d, plan_.readers(step, g))) move(*m);
    if (d.mode == ReplicaMode::keep) engine_.keep(g, d.keeper);
  }
}

bool ResidentReplicas::before_update(int g) {
  const int kept_by = engine_.kept_by(g);
  if (auto m = holders_.before_update(g, kept_by)) move(*m);
  return kept_by < 0 || kept_by == plane_.comm->rank();
}

bool ResidentReplicas::stale_here(int g) const {
  const int h = holders_.holder(g);
  return applies(g) && h >= 0 && h != plane_.comm->rank();
}

void ResidentReplicas::make_current() {
  for (const StateMove& m : holders_.make_all_current()) move(m);
}

void ResidentReplicas::add_stats(StepRecord& rec) {
  rec.bytes_state_moved = moved_bytes_;
  rec.state_moves = moves_;
  moved_bytes_ = moves_ = 0;
}

// One flat float32 buffer of the group's state: packed by the holder, sent (or broadcast), copied
// into the tensors where it arrives. On GPUs the compute stream waits for the transfer (the
// holder's buffer is not reused, nor the receiver's state read, before it lands); on the CPU the
// host does. Counted on every rank (the payload, as bytes_allreduced is).
void ResidentReplicas::move(const StateMove& m) {
  torch::NoGradGuard no_grad;
  comm::Communicator& comm = *plane_.comm;
  const int me = comm.rank();
  const bool sends = me == m.from, receives = m.to < 0 ? !sends : me == m.to;
  const int64_t numel = state_numel_[static_cast<size_t>(m.group)];
  moved_bytes_ += numel * static_cast<int64_t>(sizeof(float));
  moves_ += 1;
  if ((!sends && !receives) || numel == 0) return;
  const std::vector<torch::Tensor> parts = state_of_(m.group);  // a bystander creates no moments
  const comm::CollectiveTag tag{"state of group " + std::to_string(m.group) + " from rank " + std::to_string(m.from) +
                                    (m.to < 0 ? " to every rank" : " to rank " + std::to_string(m.to)),
                                step_, -1};
  const Timeline::Scope span(timeline_, Lane::comm, tag.what, {{"bytes", numel * int64_t{4}}});
  torch::Tensor flat;
  int64_t have = 0;
  for (const torch::Tensor& t : parts) have += t.numel();
  THETAD_CHECK(have == numel, InternalError, "group ", m.group, "'s state holds ", have, " elements, not ", numel);
  plane_.on_compute_stream([&] {
    if (!sends) {
      flat = torch::empty({numel}, torch::TensorOptions().dtype(torch::kFloat32).device(plane_.device));
      return;
    }
    std::vector<torch::Tensor> flats;
    for (const torch::Tensor& t : parts) flats.push_back(t.reshape({-1}));
    flat = torch::cat(flats);
  });
  const auto n = static_cast<size_t>(numel);
  comm::WorkPtr work = m.to < 0 ? comm.broadcast(flat.data_ptr(), n, comm::DType::f32, m.from, tag)
                       : sends  ? comm.send(flat.data_ptr(), n, comm::DType::f32, m.to, tag)
                                : comm.recv(flat.data_ptr(), n, comm::DType::f32, m.from, tag);
  if (plane_.gpu()) work->block_stream(plane_.compute_stream, comm_timeout(job_));
  else work->wait(comm_timeout(job_));
  if (!receives) return;
  plane_.on_compute_stream([&] {
    int64_t at = 0;
    for (const torch::Tensor& t : parts) {
      t.copy_(flat.narrow(0, at, t.numel()).view(t.sizes()));
      at += t.numel();
    }
  });
}

}  // namespace thetad::daemon
