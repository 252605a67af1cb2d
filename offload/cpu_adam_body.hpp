// The one CPU Adam/AdamW body, generic over the vector width (the idea of DeepSpeed's simd.h,
// as a traits type instead of macros). A kernel's translation unit, compiled for one instruction
// set, defines its traits S and instantiates adam_kernel<S>:
//
//   struct S {                      // V: S::kWidth floats; Mask: which lanes of a tail block
//     using V, Mask; static constexpr size_t kWidth;
//     static V load(const float*); static V load(const float*, Mask); (store likewise)
//     static Mask tail(size_t lanes);                          // lanes 0 .. lanes-1, lanes <= kWidth
//     static V set1(float), mul(V, V), add(V, V), div(V, V), sqrt(V), fma(V a, V b, V c /* a*b+c */);
//   };
//
// Every kernel performs the same float operations in the same order (fused multiply-adds where
// written, IEEE sqrt and division), so all give bitwise the same results: the tail is one masked
// block, not a scalar loop. The order mirrors LibTorch's Adam/AdamW (decay, moments,
// denom = sqrt(v)/sqrt(bc2) + eps, p += (-lr/bc1) * m / denom). Its translation units are compiled
// with -ffp-contract=off: fusion happens only where written. Internal linkage: each unit has its
// own copy, compiled for its instruction set.
#pragma once

#include <cstddef>

#include "offload/cpu_adam_kernels.hpp"

namespace thetad::offload::detail {
namespace {

template <typename S, bool kTail>
inline void adam_block(float* p, const float* g, float* m, float* v, typename S::Mask lanes, const AdamConsts& c) {
  using V = typename S::V;
  const auto load = [lanes](const float* x) {
    if constexpr (kTail) return S::load(x, lanes);
    else return S::load(x);
  };
  const auto store = [lanes](float* x, V y) {
    if constexpr (kTail) S::store(x, y, lanes);
    else S::store(x, y);
  };
  const V p0 = load(p);
  V gv = S::mul(load(g), S::set1(c.gscale));
  if (c.use_l2) gv = S::fma(S::set1(c.l2), p0, gv);
  const V pv = S::mul(p0, S::set1(c.decay));
  const V mv = S::fma(S::set1(c.omb1), gv, S::mul(load(m), S::set1(c.b1)));
  const V vv = S::fma(S::mul(S::set1(c.omb2), gv), gv, S::mul(load(v), S::set1(c.b2)));
  const V denom = S::add(S::div(S::sqrt(vv), S::set1(c.sqrt_bc2)), S::set1(c.eps));
  const V pn = S::add(pv, S::div(S::mul(S::set1(c.neg_step), mv), denom));
  store(p, pn);
  store(m, mv);
  store(v, vv);
}

template <typename S>
inline void adam_kernel(float* p, const float* g, float* m, float* v, size_t n, const AdamConsts& c) {
  size_t i = 0;
  const typename S::Mask all = S::tail(S::kWidth);  // (unused by full blocks)
  for (; i + S::kWidth <= n; i += S::kWidth) adam_block<S, false>(p + i, g + i, m + i, v + i, all, c);
  if (i < n) adam_block<S, true>(p + i, g + i, m + i, v + i, S::tail(n - i), c);
}

}  // namespace
}  // namespace thetad::offload::detail
