// CountExchange (see count_exchange.hpp).
#include "comm/engine/count_exchange.hpp"

#include <algorithm>

namespace thetad::comm::engine_detail {

CountExchange::CountExchange(Communicator& comm, int num_groups, std::chrono::milliseconds timeout)
    : comm_(comm), timeout_(timeout), counts_(num_groups, 0), only_root_(num_groups, -1) {
  buf_ = comm_.allocate(2 * num_groups * sizeof(int32_t));
}

void CountExchange::begin(const std::vector<uint8_t>& local_active, int rank, int64_t step) {
  start_ = Clock::now();
  // Per group: 1 if active here, then rank+1 if active here. Summed: the contributors, and
  // for a group with one contributor, that rank + 1.
  const size_t G = counts_.size();
  std::vector<int32_t> flags(2 * G);
  for (size_t g = 0; g < G; ++g) {
    flags[g] = local_active[g] ? 1 : 0;
    flags[G + g] = local_active[g] ? rank + 1 : 0;
  }
  comm_.copy_from_host(buf_.get(), flags.data(), flags.size() * sizeof(int32_t));
  AllreduceOptions o;
  o.tag = CollectiveTag{"count exchange", step, -1};
  o.after_compute = false;  // flags only: do not wait for forward's kernels
  work_ = comm_.allreduce(buf_.get(), flags.size(), DType::i32, o);
}

bool CountExchange::fetch(bool block) {
  if (ready_) return true;
  if (!work_) return false;
  if (!block && !work_->is_completed()) return false;
  work_->wait(timeout_);
  std::vector<int32_t> sums(2 * counts_.size());
  comm_.copy_to_host(sums.data(), buf_.get(), sums.size() * sizeof(int32_t));
  std::copy(sums.begin(), sums.begin() + static_cast<std::ptrdiff_t>(counts_.size()), counts_.begin());
  for (size_t g = 0; g < counts_.size(); ++g) only_root_[g] = counts_[g] == 1 ? sums[counts_.size() + g] - 1 : -1;
  observed_ms_ = std::chrono::duration<double, std::milli>(Clock::now() - start_).count();
  ready_ = true;
  return true;
}

void CountExchange::reset() {
  ready_ = false;
  work_.reset();
  observed_ms_ = -1;
}

double CountExchange::latency_ms() const {
  const double exchange = work_ ? work_->elapsed_ms() : -1.0;
  return exchange >= 0 ? exchange : observed_ms_;
}

}  // namespace thetad::comm::engine_detail
