// The bucket plan: a pure function of (parameters with sizes and groups, settings). Identical
// on every rank, so it is hashed and compared at startup. See docs/architecture.md "Bucket plan".
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace thetad::comm {

struct ParamInfo {
  std::string name;
  size_t numel = 0;
  int group = 0;  // 0 = Θ, t = θ[t]
  bool alone = false;  // in a bucket of its own (the engine's streamed groups need that)
};

struct BucketPlanOptions {
  size_t bucket_cap_bytes = 25u << 20;
  size_t first_bucket_bytes = 1u << 20;
  size_t elem_size = 4;
};

struct Bucket {
  int index = 0;
  int group = 0;
  std::vector<int> params;      // parameter indices, in backward (reverse registration) order
  std::vector<size_t> offsets;  // element offset of each param inside the bucket
  size_t numel = 0;
};

struct BucketPlan {
  std::vector<Bucket> buckets;
  std::vector<int> param_bucket;     // param index -> bucket index
  std::vector<size_t> param_offset;  // param index -> element offset inside its bucket
  std::vector<std::vector<int>> group_buckets;  // group -> its bucket indices, ascending
  int num_groups = 0;
  BucketPlanOptions options;         // the settings the plan was made with
  std::vector<ParamInfo> params;     // the parameters the plan was made from (names for errors)
  uint64_t hash = 0;                 // over names, sizes, groups, options and the layout
  std::string describe() const;      // one line per bucket, for logs and check_consistent
};

// Groups must lie in [0, num_groups). Params of each group are walked in reverse registration
// order and cut at the cap; the first bucket of the whole plan (the first to be ready in
// backward) is capped at first_bucket_bytes. Buckets never mix groups. A single parameter larger
// than the cap, or marked `alone`, gets a bucket of its own; a parameter without elements gets
// none (param_bucket -1: a placeholder, e.g. a matrix whose row shards are planned instead).
// Throws ConfigError on a bad group index.
BucketPlan make_bucket_plan(const std::vector<ParamInfo>& params, int num_groups,
                            const BucketPlanOptions& opts);

// FNV-1a 64 over bytes; used for plan and job hashes.
uint64_t fnv1a64(const void* data, size_t len, uint64_t seed = 14695981039346656037ull);
uint64_t fnv1a64(const std::string& s, uint64_t seed = 14695981039346656037ull);
// FNV-1a with 64-bit words as its symbols (little-endian loads; the last len % 8 bytes one by
// one): eight times fewer multiplications than fnv1a64, for hashing gigabytes of parameters.
uint64_t fnv1a64_words(const void* data, size_t len, uint64_t seed = 14695981039346656037ull);

}  // namespace thetad::comm
