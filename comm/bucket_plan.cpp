// make_bucket_plan: group-homogeneous buckets in backward order (docs/architecture.md "Bucket plan"), its
// human-readable description and the hash that ranks compare at startup.
#include "comm/bucket_plan.hpp"

#include <cstring>
#include <algorithm>
#include <sstream>

#include "common/errors.hpp"

namespace thetad::comm {

uint64_t fnv1a64(const void* data, size_t len, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = seed;
  for (size_t i = 0; i < len; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

uint64_t fnv1a64(const std::string& s, uint64_t seed) { return fnv1a64(s.data(), s.size(), seed); }

uint64_t fnv1a64_words(const void* data, size_t len, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = seed;
  size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h ^= w;
    h *= 1099511628211ull;
  }
  return fnv1a64(p + i, len - i, h);
}

namespace {

// A bucket while the plan is being built; `closed_at` orders buckets by when they fill in backward.
struct Draft {
  int group = 0;
  std::vector<int> params;
  size_t bytes = 0;
  size_t cap = 0;
  size_t closed_at = 0;
};

// Every field that decides the layout, in a fixed text form, so the hash is platform-independent.
std::string canonical(const BucketPlan& plan) {
  std::ostringstream os;
  os << "cap=" << plan.options.bucket_cap_bytes << " first=" << plan.options.first_bucket_bytes
     << " elem=" << plan.options.elem_size << " groups=" << plan.num_groups << "\n";
  for (size_t i = 0; i < plan.params.size(); ++i)
    os << "p " << i << " " << plan.params[i].name << " " << plan.params[i].numel << " "
       << plan.params[i].group << (plan.params[i].alone ? " alone" : "") << "\n";
  for (const Bucket& b : plan.buckets) {
    os << "b " << b.index << " " << b.group << " " << b.numel;
    for (size_t k = 0; k < b.params.size(); ++k) os << " " << b.params[k] << "@" << b.offsets[k];
    os << "\n";
  }
  return os.str();
}

}  // namespace

BucketPlan make_bucket_plan(const std::vector<ParamInfo>& params, int num_groups,
                            const BucketPlanOptions& opts) {
  if (num_groups < 1) throw ConfigError("bucket plan: num_groups must be at least 1");
  if (opts.elem_size == 0) throw ConfigError("bucket plan: elem_size must be positive");
  if (opts.bucket_cap_bytes == 0 || opts.first_bucket_bytes == 0)
    throw ConfigError("bucket plan: bucket_cap_mb and first_bucket_mb must be positive");
  for (const ParamInfo& p : params)
    if (p.group < 0 || p.group >= num_groups)
      throw ConfigError(detail::concat("parameter '", p.name, "' has group ", p.group,
                                       ", outside [0, ", num_groups, ")"));

  // Walk in backward order; each group has one open bucket. A bucket closes when it reaches
  // its cap, or before a parameter that would overflow it (so a huge parameter sits alone).
  std::vector<Draft> closed;
  std::vector<Draft> open(num_groups);
  std::vector<bool> is_open(num_groups, false);
  bool first_opened = false;
  size_t tick = 0;
  auto close = [&](int g) {
    open[g].closed_at = tick++;
    closed.push_back(std::move(open[g]));
    open[g] = Draft{};
    is_open[g] = false;
  };
  for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i) {
    const int g = params[i].group;
    const size_t bytes = params[i].numel * opts.elem_size;
    if (bytes == 0) continue;  // a placeholder: no bucket
    if (params[i].alone) {
      if (is_open[g]) close(g);
      open[g].group = g;
      open[g].params.push_back(i);
      open[g].bytes = bytes;
      first_opened = true;
      close(g);
      continue;
    }
    if (is_open[g] && !open[g].params.empty() && open[g].bytes + bytes > open[g].cap) close(g);
    if (!is_open[g]) {
      open[g].group = g;
      // The first bucket opened holds the last registered parameter, the first one backward
      // produces: keeping it small starts communication early.
      open[g].cap = first_opened ? opts.bucket_cap_bytes : opts.first_bucket_bytes;
      first_opened = true;
      is_open[g] = true;
    }
    open[g].params.push_back(i);
    open[g].bytes += bytes;
    if (open[g].bytes >= open[g].cap) close(g);
  }
  // Buckets still open fill when their last parameter arrives; order them by that moment.
  std::vector<std::pair<int, int>> rest;  // (position of last parameter in walk, group)
  for (int g = 0; g < num_groups; ++g)
    if (is_open[g]) rest.emplace_back(-open[g].params.back(), g);
  std::sort(rest.begin(), rest.end());
  for (auto& [pos, g] : rest) {
    (void)pos;
    close(g);
  }

  BucketPlan plan;
  plan.num_groups = num_groups;
  plan.options = opts;
  plan.params = params;
  plan.param_bucket.assign(params.size(), -1);
  plan.param_offset.assign(params.size(), 0);
  plan.group_buckets.assign(num_groups, {});
  for (size_t bi = 0; bi < closed.size(); ++bi) {
    Bucket b;
    b.index = static_cast<int>(bi);
    b.group = closed[bi].group;
    for (int p : closed[bi].params) {
      b.params.push_back(p);
      b.offsets.push_back(b.numel);
      plan.param_bucket[p] = b.index;
      plan.param_offset[p] = b.numel;
      b.numel += params[p].numel;
    }
    plan.group_buckets[b.group].push_back(b.index);
    plan.buckets.push_back(std::move(b));
  }
  plan.hash = fnv1a64(canonical(plan));
  return plan;
}

std::string BucketPlan::describe() const {
  std::ostringstream os;
  os << "plan: " << buckets.size() << " buckets, " << params.size() << " params, " << num_groups
     << " groups, cap " << options.bucket_cap_bytes << " B, first " << options.first_bucket_bytes
     << " B, elem " << options.elem_size << " B, hash " << std::hex << hash << std::dec << "\n";
  for (const Bucket& b : buckets) {
    os << "bucket " << b.index << ": group " << b.group << ", " << b.numel << " elements:";
    for (int p : b.params) {
      const ParamInfo& info = p < static_cast<int>(params.size()) ? params[p] : ParamInfo{};
      os << " " << info.name << "[" << info.numel << "]";
    }
    os << "\n";
  }
  return os.str();
}

}  // namespace thetad::comm
