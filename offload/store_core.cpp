// The parameter store's shared core (see store_core.hpp): the plan, the arena and its update
// queue, and the waits and copies both device paths use.
#include "offload/store_core.hpp"

#include <algorithm>
#include <chrono>

#include "comm/backends.hpp"
#include "comm/node_memory.hpp"
#include "common/errors.hpp"
#include "offload/bandwidth_probe.hpp"
#include "offload/util.hpp"

namespace thetad::offload {
namespace {

// The settings the plan does not check, checked before it.
const StoreOptions& checked(const StoreOptions& o) {
  THETAD_CHECK(o.prefetch >= 0, ConfigError, "offload.prefetch must be >= 0 (got ", o.prefetch, ")");
  return o;
}

}  // namespace

StoreCore::StoreCore(const StoreOptions& options, const std::vector<GroupShape>& groups, Device& dev)
    : opts(checked(options)),
      device(dev),
      plan(plan_store(groups, {options.shard_bytes, options.device_slots, options.device_budget_bytes})),
      plane(comm::make_mpi_communicator(), timeout_of(options.timeout_s)) {
  // Collective from here on; every rank reached it with the same decisions.
  held.assign(plan.index.size(), 0);
  for (const GroupShape& g : groups) held[index_of(g.group)] = g.held ? 1 : 0;
  std::vector<ArenaEntry> entries;  // a group the job never uses takes no arena memory
  for (size_t gi = 0; gi < plan.index.size(); ++gi)
    entries.push_back({plan.index.group_of(gi), held[gi] ? plan.group_numel[gi] : 0});
  arena = std::make_unique<HostArena>(comm::make_node_memory(timeout_of(opts.timeout_s)), entries,
                                      opts.host_limit_bytes, &device, opts.bf16_copies);
  expected.assign(plan.index.size(), 0);
  stats.host_pinned_bytes = arena->bytes();
  updates = std::make_unique<UpdateQueue>(*arena, device, opts.async_step, opts.timeout_s, opts.lowest_group_first);
}

size_t StoreCore::held_index(int group) const {
  const size_t gi = index_of(group);
  THETAD_CHECK(held[gi], InternalError, "offload: group ", group,
               " has no memory in the host arena (offload.host_groups: scheduled, and the schedule never uses it); "
               "its values are the initial ones, drawn by the caller");
  return gi;
}

void StoreCore::wait_final(size_t gi) {
  if (arena->seq_reached(gi, expected[gi])) return;
  const auto t0 = std::chrono::steady_clock::now();
  updates->wait_update(gi, expected[gi]);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  count([&](StoreStats& s) { s.acquire_wait_ms += ms; });
}

Fence StoreCore::copy_split(bool to_device, char* dst, const char* src, size_t bytes, const Fence& after) {
  const char* host = to_device ? src : dst;
  const char* base = arena->base();
  Fence last;
  for (size_t done = 0; done < bytes;) {
    const size_t pos = static_cast<size_t>(host + done - base);
    const size_t room = HostArena::kPinChunkBytes - pos % HostArena::kPinChunkBytes;
    const size_t len = std::min(bytes - done, room);
    last = to_device ? device.h2d(dst + done, src + done, len, after) : device.d2h(dst + done, src + done, len, after);
    done += len;
  }
  return last;
}

Fence StoreCore::load_part(size_t gi, char* line, size_t line_numel, int part, const Fence& after) {
  const size_t bytes = arena->entry(gi).numel * sizeof(float);
  const float* parts[3] = {arena->params(gi), arena->exp_avg(gi), arena->exp_avg_sq(gi)};
  const Fence done = copy_split(true, line + static_cast<size_t>(part) * line_numel * sizeof(float),
                                reinterpret_cast<const char*>(parts[part]), bytes, after);
  count([&](StoreStats& s) { s.h2d_bytes += bytes; });
  return done;
}

Fence StoreCore::flush_line(size_t gi, const char* line, size_t line_numel, const Fence& after) {
  if (!arena->is_owner(gi)) return after;
  const size_t bytes = arena->entry(gi).numel * sizeof(float);
  float* parts[3] = {arena->params(gi), arena->exp_avg(gi), arena->exp_avg_sq(gi)};
  std::vector<Fence> copies;
  for (size_t k = 0; k < 3; ++k)
    copies.push_back(copy_split(false, reinterpret_cast<char*>(parts[k]), line + k * line_numel * sizeof(float), bytes, after));
  const Fence last = copies.back();
  last_d2h = last;
  updates->submit_publish(gi, std::move(copies), expected[gi]);
  count([&](StoreStats& s) { s.d2h_bytes += 3 * bytes; });
  return last;
}

UpdateBandwidths StoreCore::agreed_bandwidths(void* device_buf, size_t numel, const char* what) {
  updates->wait_idle();        // the CPU AdamW of the step before is not measured against
  device.host_wait(last_d2h);  // nor are its copies
  UpdateBandwidths bw = probe_bandwidths(device, device_buf, numel);
  const std::vector<double> v = plane.min(std::vector<double>{bw.h2d, bw.d2h, bw.cpu_adam}, {what, now});
  return {v[0], v[1], v[2]};
}

}  // namespace thetad::offload
