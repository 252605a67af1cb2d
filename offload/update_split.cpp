// The split of a streamed trunk's optimizer work (see update_split.hpp): the resources' totals and
// the step model, a replay of daemon/homes/streamed_trunk.cpp's order of copies, kernels, host
// waits and CPU updates with each operation's start the latest of what it waits for.
#include "offload/update_split.hpp"

#include <algorithm>
#include <limits>

namespace thetad::offload {

namespace {

constexpr double kNever = 1e30;
constexpr double kAdamBytes = 28;  // p, g, m, v read; p, m, v written
constexpr double kLineBytes = 12;  // values, m, v through an update line, each way
constexpr int kSteps = 10;         // from idle resources; the last 4 are steady within 0.5%
// What the probe, each resource alone, does not see (fitted to the H100 steps of
// tests/offload/test_update_split.cpp): PCIe moving both ways at once gives each direction this
// much of its rate alone, and the CPU AdamW shares host memory with the copies (below), keeping
// at least kCpuFloor of its own rate.
constexpr double kDuplex = 0.8;
constexpr double kCpuFloor = 0.25;

double seconds(double bytes, double rate) {
  if (bytes <= 0) return 0;
  return rate > 0 ? bytes / rate : kNever;
}

struct Dma {  // a copy's time on the link, reading or writing host memory at `rate` bytes/s
  double start, end, rate;
  bool forward, in;
};

// When `work` (seconds at full speed) begun at t ends, at speed(t) of full speed, which changes
// only where one of `spans` starts or ends.
template <typename Speed>
double finish(double t, double work, const std::vector<Dma>& spans, const Speed& speed) {
  if (work >= kNever) return t + work;
  while (work > 0) {
    double next = std::numeric_limits<double>::infinity();
    for (const Dma& d : spans) next = std::min(next, d.start > t ? d.start : d.end > t ? d.end : next);
    const double v = speed(t);
    if (t + work / v <= next) return t + work / v;
    work -= (next - t) * v;
    t = next;
  }
  return t;
}

class StepReplay {
 public:
  StepReplay(const StepInput& in, size_t split)
      : in_(in), split_(split), L_(static_cast<int>(in.layers.size())), p_(std::max<int64_t>(in.prefetch, 1)),
        value_bytes_(in.bf16_copies ? 2 : 4), slots_(static_cast<size_t>(p_ + 2)), lines_(static_cast<size_t>(p_ + 2)),
        updated_(in.layers.size(), 0.0), held_(in.layers.size(), 0), values_(in.layers.size(), 0.0),
        act_out_(in.layers.size(), 0.0), act_in_(in.layers.size(), -1.0) {}

  StepModel run() {
    std::vector<double> begin;
    for (int s = 0; s < kSteps; ++s) {
      busy_ = StepModel{};
      // The step before's length stands for this one's where its updates overlap the next forward.
      const size_t n = begin.size();
      const double period = n >= 2 ? begin[n - 1] - begin[n - 2] : n == 1 ? compute_ - begin[0] : 0.0;
      begin.push_back(step(period));
    }
    StepModel m = busy_;  // the last step's busy times
    m.step_s = (begin.back() - begin[kSteps - 5]) / 4;
    return m;
  }

 private:
  struct Slot {
    int layer = -1;
    bool fresh = false, pinned = false;
    double free_at = 0, landed = 0;  // the last compute reading it; its copy's end
    uint64_t used = 0;
  };
  struct Line {
    int layer = -1;
    double free_at = 0, loaded = 0;  // its last copy out; its copy in
  };
  struct CpuJob {
    int layer;
    double submitted, ready, cost;
  };

  bool split_now(int l) const { return l >= 0 && static_cast<size_t>(l) < split_; }
  double numel(int l) const { return static_cast<double>(in_.layers[static_cast<size_t>(l)].numel); }

  double h2d(double ready, double bytes) { return copy(true, h2d_, ready, bytes, in_.bw.h2d, busy_.h2d_s); }
  double d2h(double ready, double bytes) { return copy(false, d2h_, ready, bytes, in_.bw.d2h, busy_.d2h_s); }
  // One stream per direction, in issue order; while the other direction's copies run, each moves
  // kDuplex of its rate alone (the probe's). The other direction's are the step before's, a step
  // later: in issue order a copy is modelled before the other direction's that overlap it.
  double copy(bool in, double& stream, double ready, double bytes, double rate, double& busy) {
    const double start = std::max(stream, ready);
    const double t = finish(start, seconds(bytes, rate), before_, [&](double at) {
      for (const Dma& d : before_)
        if (d.in != in && d.start <= at && at < d.end) return kDuplex;
      return 1.0;
    });
    stream = t;
    busy += t - start;
    if (t > start) dma_.push_back({start, t, bytes / (t - start), forward_, in});
    return t;
  }
  void compute(double ready, double t) {
    compute_ = std::max(compute_, ready) + t;
    busy_.compute_s += t;
  }

  // StreamedTrunk::hold -> ParamStore::acquire: the host waits for the layer's last update, a slot
  // of the least recently used unpinned ones takes the copy once the compute reading it is done.
  void hold(int l) {
    if (l < 0 || l >= L_ || held_[static_cast<size_t>(l)]) return;
    host_ = std::max(host_, updated_[static_cast<size_t>(l)]);
    held_[static_cast<size_t>(l)] = 1;
    Slot* slot = nullptr;
    for (Slot& s : slots_)
      if (s.layer == l) slot = &s;  // resident, if stale copied again into its own slot
    if (!slot)
      for (Slot& s : slots_)
        if (!s.pinned && (!slot || (slot->layer >= 0 && (s.layer < 0 || s.used < slot->used)))) slot = &s;
    if (!slot) slot = &slots_.front();  // every slot pinned: the store throws; not reached
    if (slot->layer != l || !slot->fresh) {
      slot->layer = l;
      slot->fresh = true;
      slot->landed = h2d(std::max(host_, slot->free_at), value_bytes_ * numel(l));
    }
    slot->pinned = true;
    slot->used = ++tick_;
    values_[static_cast<size_t>(l)] = slot->landed;
  }
  void release(int l) {
    held_[static_cast<size_t>(l)] = 0;
    for (Slot& s : slots_)
      if (s.layer == l) s.pinned = false, s.free_at = compute_;
  }

  // PooledActivationStash::fetch: after the compute queued so far, once its copy out landed. The
  // top layer's are still on the device (forward's last, never reaped).
  void fetch(int l) {
    if (l < 0 || act_in_[static_cast<size_t>(l)] >= 0) return;
    const double bytes = in_.layers[static_cast<size_t>(l)].act_bytes;
    if (bytes <= 0 || l == L_ - 1) return void(act_in_[static_cast<size_t>(l)] = 0);
    host_ = std::max(host_, act_out_[static_cast<size_t>(l)]);
    act_in_[static_cast<size_t>(l)] = h2d(compute_, bytes);
  }

  Line* line_of(int l) {
    for (Line& x : lines_)
      if (x.layer == l) return &x;
    return nullptr;
  }
  // UpdateLines::load: the ring's next line no layer holds, once its last copy out landed and the
  // layer's last update is published.
  Line& load_line(int l) {
    size_t i = next_line_;
    while (lines_[i].layer >= 0) i = (i + 1) % lines_.size();
    next_line_ = (i + 1) % lines_.size();
    Line& x = lines_[i];
    x.layer = l;
    host_ = std::max(host_, updated_[static_cast<size_t>(l)]);  // wait_final, as acquire
    x.loaded = h2d(std::max(host_, x.free_at), kLineBytes * numel(l));
    return x;
  }
  // StreamedTrunk::prefetch_update_line: only while a line stays free for the layer being updated.
  void prefetch_line(int l) {
    if (!split_now(l) || line_of(l)) return;
    size_t free = 0;
    for (const Line& x : lines_) free += x.layer < 0 ? 1 : 0;
    if (free > 1) load_line(l);
  }

  // StreamedTrunk::update_split_layer: the device AdamW on the line after the layer's backward,
  // the line back to the arena, the owner's worker publishing it once landed.
  void update_on_device(int l) {
    Line* x = line_of(l);
    if (!x) x = &load_line(l);
    compute(x->loaded, seconds(kAdamBytes * numel(l), in_.device_adam_bps));
    x->free_at = d2h(compute_, kLineBytes * numel(l));
    x->layer = -1;
    jobs_.push_back({l, host_, x->free_at, 0.0});
  }
  // StreamedTrunk::push_bucket: the gradient to the owner's landing area, its CPU AdamW queued.
  void push(int l) {
    last_push_ = d2h(compute_, 4 * numel(l));
    const double adam_bytes = in_.bf16_copies ? kAdamBytes + 2 : kAdamBytes;
    jobs_.push_back({l, host_, last_push_, seconds(adam_bytes * numel(l), in_.bw.cpu_adam)});
  }

  // Host memory is one: the copies read and write it at their PCIe rates while the CPU AdamW runs,
  // which gets what they leave of the rate it reaches alone (its probe), at least kCpuFloor of it.
  // The next forward's copies, which overlap the last updates, are this step's shifted by a step.
  double cpu_end(double t, double cost, double period) {
    if (cost <= 0) return t;
    std::vector<Dma> dma;
    for (const Dma& d : dma_)
      if (d.end > t) dma.push_back(d);
    for (const Dma& d : dma_)
      if (d.forward && d.end + period > t) dma.push_back({d.start + period, d.end + period, d.rate, true, d.in});
    return finish(t, cost, dma, [&](double at) {
      double load = 0;
      for (const Dma& d : dma)
        if (d.start <= at && at < d.end) load += d.rate;
      return std::max(kCpuFloor, 1.0 - load / in_.bw.cpu_adam);
    });
  }
  // UpdateQueue's worker (lowest_entry_first): of the submitted jobs whose copies landed, the
  // lowest layer; if none has, the oldest, waited for. One at a time, on all the CPU's threads.
  void run_cpu(double period) {
    double t = cpu_;
    while (!jobs_.empty()) {
      auto pick = jobs_.end();
      for (auto it = jobs_.begin(); it != jobs_.end(); ++it)
        if (it->submitted <= t && it->ready <= t && (pick == jobs_.end() || it->layer < pick->layer)) pick = it;
      if (pick == jobs_.end()) {
        pick = jobs_.begin();
        t = std::max(t, pick->submitted);
      }
      const double start = std::max(t, pick->ready);
      t = cpu_end(start, pick->cost, period);
      busy_.cpu_s += t - start;
      updated_[static_cast<size_t>(pick->layer)] = t;
      jobs_.erase(pick);
    }
    cpu_ = t;
  }

  // One step; returns when its compute began.
  double step(double period) {
    for (Slot& s : slots_) s.fresh = false;  // every layer was updated: every copy is stale
    std::fill(act_in_.begin(), act_in_.end(), -1.0);
    compute(last_push_, 0);  // start_window: compute_after_pushes
    const double begin = compute_;
    compute(0, in_.before_s);
    before_.clear();
    for (Dma d : dma_) before_.push_back({d.start + period, d.end + period, d.rate, d.forward, d.in});
    dma_.clear();
    forward_ = true;
    for (int l = 0; l < L_; ++l) {  // forward: acquire, the next layers prefetched, compute, release
      hold(l);
      for (int64_t k = 1; k <= p_; ++k) hold(l + static_cast<int>(k));
      // The stash's memory of two layers back is reused once its copy out landed.
      const double reuse = l >= 2 ? act_out_[static_cast<size_t>(l - 2)] : 0.0;
      compute(std::max({values_[static_cast<size_t>(l)], host_, reuse}), in_.layers[static_cast<size_t>(l)].fwd_s);
      release(l);
      const double act = in_.layers[static_cast<size_t>(l)].act_bytes;
      act_out_[static_cast<size_t>(l)] = act > 0 ? d2h(compute_, act) : compute_;
    }
    forward_ = false;
    for (int l = L_ - 1; l >= 0; --l) {  // backward, top layer first
      fetch(l);
      fetch(l - 1);  // one layer ahead
      const bool reads_values = l > 0 || !in_.lowest_is_first;
      if (reads_values) {
        hold(l);
        for (int64_t k = 1; k <= p_; ++k) hold(l - static_cast<int>(k));
        for (int64_t k = 0; k <= p_; ++k) prefetch_line(l - static_cast<int>(k));
      }
      const double values = reads_values ? values_[static_cast<size_t>(l)] : 0.0;
      compute(std::max(act_in_[static_cast<size_t>(l)], values), in_.layers[static_cast<size_t>(l)].bwd_s);
      if (reads_values) release(l);
      if (split_now(l)) update_on_device(l);
      else push(l);
    }
    compute(0, in_.after_s);
    for (Slot& s : slots_)  // release_step: every slot after the step's compute
      if (s.pinned) s.pinned = false, s.free_at = compute_;
    std::fill(held_.begin(), held_.end(), 0);
    run_cpu(period);
    return begin;
  }

  const StepInput& in_;
  const size_t split_;
  const int L_;
  const int64_t p_;
  const double value_bytes_;
  double compute_ = 0, h2d_ = 0, d2h_ = 0, cpu_ = 0, host_ = 0, last_push_ = 0;
  std::vector<Slot> slots_;
  std::vector<Line> lines_;
  size_t next_line_ = 0;
  uint64_t tick_ = 0;
  std::vector<double> updated_;  // per layer: its last update published (what acquire waits for)
  std::vector<uint8_t> held_;
  std::vector<double> values_, act_out_, act_in_;  // per layer: values on the device; activations out, in
  std::vector<CpuJob> jobs_;    // this step's, in submission order
  std::vector<Dma> dma_;        // the copies of this step
  std::vector<Dma> before_;     // the step before's, a step later
  bool forward_ = false;
  StepModel busy_;
};

}  // namespace

double SplitTimes::longest_s() const { return std::max({h2d_s, d2h_s, cpu_s}); }

SplitTimes split_times(const std::vector<size_t>& layers, size_t device, const UpdateBandwidths& bw, bool bf16_copies) {
  const double value_bytes = bf16_copies ? 2 : 4, adam_bytes = bf16_copies ? kAdamBytes + 2 : kAdamBytes;
  double h2d = 0, d2h = 0, cpu = 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    const double n = static_cast<double>(layers[l]);
    h2d += 2 * value_bytes * n;
    if (l < device) {
      h2d += kLineBytes * n;
      d2h += kLineBytes * n;
    } else {
      d2h += 4 * n;
      cpu += adam_bytes * n;
    }
  }
  return {seconds(h2d, bw.h2d), seconds(d2h, bw.d2h), seconds(cpu, bw.cpu_adam)};
}

StepModel model_step(const StepInput& in, size_t split) {
  return StepReplay(in, std::min(split, in.layers.size())).run();
}

size_t fastest_split(const StepInput& in, std::vector<StepModel>* models) {
  std::vector<StepModel> all;
  double least = std::numeric_limits<double>::infinity();
  for (size_t k = 0; k <= in.layers.size(); ++k) {
    all.push_back(model_step(in, k));
    least = std::min(least, all.back().step_s);
  }
  size_t best = 0;
  while (all[best].step_s > least * 1.01) ++best;
  // A split only where the model promises more than its error: on one H100 the counts between
  // none and all measured up to 23% slower than modelled (4 of 12 layers of 6144: 169.0 against
  // 137.1 ms; none 143.2 against 146.8), so a smaller promised gain may well be a loss.
  if (all[best].step_s > (1.0 - kSplitMargin) * all.front().step_s) best = 0;
  if (models) *models = std::move(all);
  return best;
}

}  // namespace thetad::offload
