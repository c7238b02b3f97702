// Reference optimizers for the tests: the update formulas as written in the papers and in
// PyTorch's documentation, one scalar loop in double precision, independent of the kernels.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "polyshard/optim/config.hpp"

namespace polyshard::test {

/// Deterministic values in [-scale, scale), different for each (seed, index).
inline std::vector<double> values(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  std::vector<double> v(n);
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (double& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = scale * (static_cast<double>(s >> 11) / static_cast<double>(1ull << 53) * 2 - 1);
  }
  return v;
}

template <class T>
std::vector<T> cast(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

/// values(n, seed, scale) as a gradient of type G: each value rounded to float, then to G (the
/// way a 16-bit gradient is computed from a float one).
template <class G>
std::vector<G> values_as(std::size_t n, std::uint64_t seed, double scale) {
  const auto v = values(n, seed, scale);
  std::vector<G> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = static_cast<G>(static_cast<float>(v[i]));
  return g;
}

/// torch.optim.SGD as documented: g += wd p; b = g (first step) or mu b + (1 - tau) g;
/// g = nesterov ? g + mu b : b; p -= lr g.
struct ReferenceSgd {
  SgdConfig c;
  std::vector<double> p, b;
  std::int64_t t = 0;

  void step(const std::vector<double>& grad) {
    ++t;
    b.resize(p.size());
    for (std::size_t i = 0; i < p.size(); ++i) {
      double g = grad[i] + c.weight_decay * p[i];
      if (c.momentum != 0) {
        b[i] = t == 1 ? g : c.momentum * b[i] + (1 - c.dampening) * g;
        g = c.nesterov ? g + c.momentum * b[i] : b[i];
      }
      p[i] -= c.lr * g;
    }
  }
};

/// Adam (Kingma and Ba, with eps outside the square root) and AdamW (Loshchilov and Hutter,
/// decay decoupled and scaled by lr as in PyTorch): m_hat = m / (1 - b1^t), v_hat = v / (1 - b2^t),
/// p -= lr m_hat / (sqrt(v_hat) + eps).
struct ReferenceAdam {
  AdamConfig c;
  bool decoupled = false;
  std::vector<double> p, m, v;
  std::int64_t t = 0;

  void step(const std::vector<double>& grad) {
    ++t;
    m.resize(p.size());
    v.resize(p.size());
    for (std::size_t i = 0; i < p.size(); ++i) {
      double g = grad[i];
      if (decoupled) {
        p[i] -= c.lr * c.weight_decay * p[i];
      } else {
        g += c.weight_decay * p[i];
      }
      m[i] = c.beta1 * m[i] + (1 - c.beta1) * g;
      v[i] = c.beta2 * v[i] + (1 - c.beta2) * g * g;
      const double m_hat = m[i] / (1 - std::pow(c.beta1, static_cast<double>(t)));
      const double v_hat = v[i] / (1 - std::pow(c.beta2, static_cast<double>(t)));
      p[i] -= c.lr * m_hat / (std::sqrt(v_hat) + c.eps);
    }
  }
};

/// Largest |a[i] - b[i]|.
template <class T>
double max_abs_diff(std::span<const T> a, const std::vector<double>& b) {
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(static_cast<double>(a[i]) - b[i]));
  return d;
}

/// Bitwise equality, so -0 against +0 or two NaNs with different payloads count as different.
template <class T>
bool same_bits(std::span<const T> a, std::span<const T> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

/// How far a P-precision result may stray from the double reference over a few steps.
template <class P>
inline constexpr double tolerance = sizeof(P) == 4 ? 2e-5 : 1e-12;

}  // namespace polyshard::test
