// CPU Adam kernels agree bitwise with each other (scalar, AVX2, AVX-512, threaded chunks) and
// with a double-precision evaluation of the documented algorithm to float accuracy.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include <xmmintrin.h>

#include "comm/bf16.hpp"
#include "offload/cpu_adam.hpp"

using thetad::offload::AdamHyper;
using thetad::offload::adam_step;

namespace {

struct State {
  std::vector<float> p, g, m, v;
};

State random_state(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  State s{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
  for (size_t i = 0; i < n; ++i) {
    s.p[i] = d(rng);
    s.g[i] = d(rng);
    s.m[i] = 0.1f * d(rng);
    s.v[i] = std::abs(0.01f * d(rng));
  }
  return s;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

AdamHyper hyper(bool decoupled, double wd, int64_t step) {
  AdamHyper h;
  h.lr = 1e-3;
  h.weight_decay = wd;
  h.decoupled = decoupled;
  h.step = step;
  h.grad_scale = 0.75;
  return h;
}

}  // namespace

TEST(CpuAdamKernels, AllKernelsBitwiseEqual) {
  for (size_t n : {1ul, 7ul, 15ul, 16ul, 17ul, 33ul, 1000ul, 300001ul}) {
    for (bool decoupled : {true, false}) {
      std::vector<State> out;
      for (int k : {1, 2, 3}) {
        thetad::offload::detail::force_adam_kernel(k);
        State s = random_state(n, 7);
        for (int64_t t = 1; t <= 3; ++t)
          adam_step(s.p.data(), s.g.data(), s.m.data(), s.v.data(), n, hyper(decoupled, 0.01, t));
        out.push_back(std::move(s));
      }
      thetad::offload::detail::force_adam_kernel(0);
      for (size_t k = 1; k < out.size(); ++k) {
        EXPECT_TRUE(same_bits(out[0].p, out[k].p)) << "n=" << n << " kernel " << k;
        EXPECT_TRUE(same_bits(out[0].m, out[k].m)) << "n=" << n << " kernel " << k;
        EXPECT_TRUE(same_bits(out[0].v, out[k].v)) << "n=" << n << " kernel " << k;
      }
    }
  }
  std::printf("adam kernel on this CPU: %s\n", thetad::offload::adam_kernel_name().c_str());
}

// offload.h2d_dtype bf16: the step also writes p rounded to bf16, exactly as the reference
// conversion rounds it, and p, m, v keep the bits of a step without the copy, on every kernel.
TEST(CpuAdamKernels, Bf16CopyIsTheRoundedParameters) {
  for (size_t n : {1ul, 17ul, 2048ul, 2049ul, 300001ul}) {
    for (int k : {1, 2, 3}) {
      thetad::offload::detail::force_adam_kernel(k);
      State a = random_state(n, 11), b = a;
      std::vector<uint16_t> copy(n, 0xdead);
      adam_step(a.p.data(), a.g.data(), a.m.data(), a.v.data(), n, hyper(true, 0.01, 2));
      adam_step(b.p.data(), b.g.data(), b.m.data(), b.v.data(), n, hyper(true, 0.01, 2), copy.data());
      EXPECT_TRUE(same_bits(a.p, b.p) && same_bits(a.m, b.m) && same_bits(a.v, b.v)) << "n=" << n << " kernel " << k;
      size_t wrong = 0;
      for (size_t i = 0; i < n; ++i) wrong += copy[i] != thetad::comm::float_to_bf16(b.p[i]);
      EXPECT_EQ(wrong, 0u) << "n=" << n << " kernel " << k;
    }
  }
  thetad::offload::detail::force_adam_kernel(0);
}

TEST(CpuAdamKernels, RoundToBf16TiesNaNsAndSubnormals) {
  // Ties to even (both ways), just above a tie, NaNs (quiet and signalling), infinities, zeros,
  // subnormals, the largest float (rounds to infinity), and random values; 40 of them so that
  // the vector kernel sees full vectors and a tail.
  std::vector<uint32_t> bits = {0x3f808000u, 0x3f818000u, 0x3f808001u, 0x7fc00000u, 0x7f800001u, 0xffa00000u,
                                0x7f800000u, 0xff800000u, 0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu,
                                0x7f7fffffu, 0x3f7fffffu};
  std::mt19937 rng(5);
  while (bits.size() < 40) bits.push_back(static_cast<uint32_t>(rng()));
  std::vector<float> x(bits.size());
  std::memcpy(x.data(), bits.data(), bits.size() * 4);
  for (int k : {1, 3}) {
    thetad::offload::detail::force_adam_kernel(k);
    std::vector<uint16_t> out(x.size());
    thetad::offload::round_to_bf16(x.data(), out.data(), x.size());
    for (size_t i = 0; i < x.size(); ++i)
      EXPECT_EQ(out[i], thetad::comm::float_to_bf16(x[i])) << std::hex << "bits 0x" << bits[i] << " kernel " << k;
  }
  thetad::offload::detail::force_adam_kernel(0);
  EXPECT_EQ(thetad::comm::float_to_bf16(x[0]), 0x3f80u);  // 1 + 2^-8: a tie, to the even 1.0
  EXPECT_EQ(thetad::comm::float_to_bf16(x[1]), 0x3f82u);  // a tie, to the even upper neighbour
}

TEST(CpuAdamKernels, ThreadedEqualsPiecewise) {
  // One call over n (threaded chunks) equals calls over pieces with odd boundaries.
  const size_t n = 1000003;
  State a = random_state(n, 3), b = a;
  const AdamHyper h = hyper(true, 0.01, 4);
  adam_step(a.p.data(), a.g.data(), a.m.data(), a.v.data(), n, h);
  for (size_t off = 0; off < n;) {
    const size_t len = std::min<size_t>(n - off, 12345);
    adam_step(b.p.data() + off, b.g.data() + off, b.m.data() + off, b.v.data() + off, len, h);
    off += len;
  }
  EXPECT_TRUE(same_bits(a.p, b.p));
  EXPECT_TRUE(same_bits(a.m, b.m));
  EXPECT_TRUE(same_bits(a.v, b.v));
}

TEST(CpuAdamKernels, MatchesDoubleReference) {
  const size_t n = 4099;
  for (bool decoupled : {true, false}) {
    State s = random_state(n, 11);
    std::vector<double> p(s.p.begin(), s.p.end()), m(s.m.begin(), s.m.end()),
        v(s.v.begin(), s.v.end());
    for (int64_t t = 1; t <= 5; ++t) {
      const AdamHyper h = hyper(decoupled, 0.05, t);
      adam_step(s.p.data(), s.g.data(), s.m.data(), s.v.data(), n, h);
      const double bc1 = 1 - std::pow(h.beta1, double(t));
      const double bc2 = 1 - std::pow(h.beta2, double(t));
      for (size_t i = 0; i < n; ++i) {
        double g = double(s.g[i]) * h.grad_scale;
        if (decoupled) p[i] *= 1 - h.lr * h.weight_decay;
        else g += h.weight_decay * p[i];
        m[i] = h.beta1 * m[i] + (1 - h.beta1) * g;
        v[i] = h.beta2 * v[i] + (1 - h.beta2) * g * g;
        p[i] -= h.lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + h.eps);
      }
    }
    for (size_t i = 0; i < n; ++i) {
      ASSERT_NEAR(s.p[i], p[i], 1e-6 * std::abs(p[i]) + 1e-8) << i;
      // m sums terms of both signs: its error is relative to the gradient terms (~0.1), not to m.
      ASSERT_NEAR(s.m[i], m[i], 1e-5 * std::abs(m[i]) + 1e-7) << i;
    }
  }
}

// Vanishing gradients (subnormal squares): every kernel, inline and threaded, flushes a subnormal
// second moment to zero by default and keeps them with set_flush_subnormals(false); the normal
// parameters' bits are the same either way, and the caller's MXCSR is untouched.
TEST(CpuAdamKernels, SubnormalMomentsAreFlushedAndParametersKeepTheirBits) {
  for (size_t n : {size_t{1000}, size_t{300001}}) {  // inline, and split over the pool
    for (int k : {1, 2, 3}) {
      thetad::offload::detail::force_adam_kernel(k);
      State flushed = random_state(n, 5);
      for (float& g : flushed.g) g *= 1e-20f;  // (1 - beta2) g^2 ~ 1e-43: subnormal
      std::fill(flushed.m.begin(), flushed.m.end(), 0.0f);
      std::fill(flushed.v.begin(), flushed.v.end(), 0.0f);
      State kept = flushed;
      const unsigned csr = _mm_getcsr();
      adam_step(flushed.p.data(), flushed.g.data(), flushed.m.data(), flushed.v.data(), n, hyper(true, 0.01, 1));
      EXPECT_EQ(_mm_getcsr(), csr);
      thetad::offload::set_flush_subnormals(false);
      adam_step(kept.p.data(), kept.g.data(), kept.m.data(), kept.v.data(), n, hyper(true, 0.01, 1));
      thetad::offload::set_flush_subnormals(true);
      size_t subnormal_v = 0;
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(flushed.v[i], 0.0f) << i;
        ASSERT_EQ(flushed.m[i], kept.m[i]) << i;  // (1 - beta1) g ~ 1e-21 is a normal float
        subnormal_v += std::fpclassify(kept.v[i]) == FP_SUBNORMAL;
      }
      EXPECT_GT(subnormal_v, n / 2) << "kernel " << k;  // IEEE mode kept them
      EXPECT_TRUE(same_bits(flushed.p, kept.p)) << "kernel " << k;
    }
  }
  thetad::offload::detail::force_adam_kernel(0);
}

// The clip norm of offloaded groups: the sum of squares in double, over sizes that split into
// several threaded chunks and ones that do not; deterministic (same bits on every call).
TEST(CpuAdamKernels, SumSquaresIsTheDoubleSum) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{37}, size_t{1} << 16, (size_t{1} << 18) + 13}) {
    std::vector<float> g(n);
    std::mt19937 rng(static_cast<uint32_t>(n));
    std::normal_distribution<float> d(0.0f, 3.0f);
    for (float& x : g) x = d(rng);
    long double want = 0;
    for (float x : g) want += static_cast<long double>(x) * x;
    const double got = thetad::offload::sum_squares(g.data(), n);
    EXPECT_NEAR(got, static_cast<double>(want), 1e-12 * static_cast<double>(want) + 1e-300) << "n " << n;
    EXPECT_EQ(got, thetad::offload::sum_squares(g.data(), n)) << "n " << n;
  }
}
