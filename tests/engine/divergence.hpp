// Ranks that diverge inside the engine, for the tests under the in-process and MPI backends: one
// rank skips a unit, freezes a parameter the others train, or runs an extra micro-batch; and a
// loss whose backward runs a hook with collectives in flight (where a test makes a rank die).
#pragma once

#include <functional>
#include <string>

#include "engine_fixture.hpp"

namespace polyshard::test {

enum class Divergence { None, SkipUnit, FreezeParameter, ExtraMicroBatch };

/// Gpt::logits's first step: token plus position embeddings of the batch's inputs.
inline Var<float> embed(const Gpt<float>& m, const Batch& b) {
  const std::int64_t rows = b.inputs.size(0), steps = b.inputs.size(1);
  auto positions = Tensor<std::int32_t>::empty({rows, steps});  // (B, T)
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t t = 0; t < steps; ++t) positions.data()[r * steps + t] = static_cast<std::int32_t>(t);
  return add(m.transformer.wte(b.inputs), m.transformer.wpe(positions));  // (B, T, C)
}

/// Gpt::loss, leaving block 0 out when `skip_block0`.
inline Var<float> loss_skipping_block0(const Gpt<float>& m, const Batch& b, bool skip_block0) {
  Var<float> x = embed(m, b);  // (B, T, C)
  for (std::size_t i = 0; i < m.transformer.h.size(); ++i)
    if (!(skip_block0 && i == 0)) x = call(m.transformer.h[i], x);
  x = call(m.transformer.ln_f, x);
  return cross_entropy(linear(x, m.transformer.wte.weight.var()), b.targets);  // (B, T, V) logits
}

/// Gpt::loss with an identity node between block 0 and block 1 whose backward runs `on_backward`:
/// by then backward has issued block 1's gradient reduction and prefetched block 0's gather.
inline Var<float> loss_with_backward_hook(const Gpt<float>& m, const Batch& b, std::function<void()> on_backward) {
  Var<float> x = embed(m, b);  // (B, T, C)
  x = call(m.transformer.h[0], x);
  auto node = std::make_shared<Node<float, Cpu>>();
  node->value = x.value();
  node->op = "test hook";
  node->requires_grad = true;
  node->inputs.push_back(x.node());
  node->backward = [on_backward](Node<float, Cpu>& self) {
    on_backward();
    accumulate_into(self.inputs[0]->sink(), self.grad);
  };
  x = call(m.transformer.h[1], Var<float>(std::move(node)));
  x = call(m.transformer.ln_f, x);
  return cross_entropy(linear(x, m.transformer.wte.weight.var()), b.targets);  // (B, T, V) logits
}

/// Trains tiny_gpt() under S for three steps of two micro-batches (the first under no_sync) on
/// this rank of `comm`; when `odd` this rank diverges as `d` says from step 2 on (its forward
/// skips block 0; it freezes transformer.h.1.mlp.c_fc.weight; it runs a third micro-batch).
/// Returns the error this rank stopped with, "" when it finished.
template <class S, class Comm>
std::string diverge(Comm& comm, Divergence d, bool odd) {
  Gpt<float> model(tiny_gpt());
  Engine<S, Gpt<float>, Comm, Sgd<float>> engine(model, comm, momentum_sgd(), {}, 42);
  BatchSampler sampler(tiny_data(), 8, 2 * comm.size(), 7);
  try {
    for (int step = 1; step <= 3; ++step) {
      const bool now = odd && step >= 2;
      if (now && d == Divergence::FreezeParameter && step == 2) {
        visit_parameters(model, [](const std::string& name, Parameter<float>& p) {
          if (name == "transformer.h.1.mlp.c_fc.weight") p.set_requires_grad(false);
        });
        engine.refresh_trainable();
      }
      const int micro_batches = now && d == Divergence::ExtraMicroBatch ? 3 : 2;
      for (int m = 0; m < micro_batches; ++m) {
        const Batch b = sampler.batch(step * 3 + m, comm.rank(), comm.size());
        const bool skip = now && d == Divergence::SkipUnit;
        const auto run = [&] {
          Var<float> loss = engine.forward([&] { return loss_skipping_block0(model, b, skip); });
          engine.backward(loss, 0.5 / comm.size());
        };
        if (m + 1 < micro_batches) {
          auto no_sync = engine.no_sync();
          run();
        } else {
          run();
        }
      }
      engine.step(0.1);
    }
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace polyshard::test
