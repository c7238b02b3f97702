// Gradient oracle for tests: central finite differences in double precision.
#pragma once

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "polyshard/autograd/backward.hpp"

namespace polyshard::test {

/// A tensor of normal(0, scale) values from a seeded generator.
inline Tensor<double> random_tensor(const Shape& shape, std::uint64_t seed, double scale = 1.0) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> dist(0.0, scale);
  Tensor<double> t = Tensor<double>::empty(shape);
  for (double& x : t.span()) x = dist(gen);
  return t;
}

/// random_tensor() rounded to float: the inputs of GPU tests and their CPU twins.
inline Tensor<float> random_floats(const Shape& shape, std::uint64_t seed, double scale = 1.0) {
  const Tensor<double> d = random_tensor(shape, seed, scale);
  Tensor<float> f = Tensor<float>::empty(shape);
  for (std::int64_t i = 0; i < d.numel(); ++i) f.data()[i] = static_cast<float>(d.data()[i]);
  return f;
}

/// Token ids uniform in [0, v) from a seeded generator.
inline Tensor<std::int32_t> random_ids(const Shape& shape, std::int32_t v, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<std::int32_t> dist(0, v - 1);
  Tensor<std::int32_t> t = Tensor<std::int32_t>::empty(shape);
  for (auto& x : t.span()) x = dist(gen);
  return t;
}

/// Worst relative error, over every input, between the gradient backward() gives for
/// dot(seed, f(inputs)) and the central difference (f(x + h) - f(x - h)) / 2h.
/// The error of one input is ||analytic - numeric|| / max(||analytic||, ||numeric||, 1e-12).
inline double gradient_error(const std::function<Var<double>(const std::vector<Var<double>>&)>& f,
                             std::vector<Tensor<double>> inputs, std::uint64_t seed = 7, double h = 1e-5) {
  std::vector<Var<double>> vars;
  for (auto& t : inputs) vars.emplace_back(t, true);
  Var<double> out = f(vars);
  const Tensor<double> weights = random_tensor(out.shape(), seed);
  backward(out, weights);

  auto objective = [&]() {
    NoGradGuard no_grad;
    std::vector<Var<double>> plain;
    for (auto& t : inputs) plain.emplace_back(t, false);
    const Tensor<double> y = f(plain).value().contiguous();
    double s = 0;
    for (std::int64_t i = 0; i < y.numel(); ++i) s += y.data()[i] * weights.data()[i];
    return s;
  };

  double worst = 0;
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    const Tensor<double> analytic = vars[k].grad().defined() ? vars[k].grad() : Tensor<double>::zeros(inputs[k].shape());
    double diff2 = 0, a2 = 0, n2 = 0;
    double* x = inputs[k].data();
    for (std::int64_t i = 0; i < inputs[k].numel(); ++i) {
      const double saved = x[i];
      x[i] = saved + h;
      const double up = objective();
      x[i] = saved - h;
      const double down = objective();
      x[i] = saved;
      const double numeric = (up - down) / (2 * h);
      const double a = analytic.data()[i];
      diff2 += (a - numeric) * (a - numeric);
      a2 += a * a;
      n2 += numeric * numeric;
    }
    worst = std::max(worst, std::sqrt(diff2) / std::max({std::sqrt(a2), std::sqrt(n2), 1e-12}));
  }
  return worst;
}

}  // namespace polyshard::test
