// One rank's training loop under a strategy type, and the map from a family and a precision to
// strategy types (strategies.cpp instantiates it). Every --wrap runs on the same strategy type.
#pragma once

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <optional>
#include <thread>

#include "families.hpp"
#include "options.hpp"
#include "polyshard/data/data.hpp"
#include "polyshard/engine/engine.hpp"
#include "polyshard/engine/generate.hpp"
#include "polyshard/io/full_weights.hpp"
#include "polyshard/io/hf_gpt2.hpp"
#include "polyshard/io/sharded_checkpoint.hpp"
#include "polyshard/nn/nn.hpp"
#include "polyshard/optim/optim.hpp"
#include "polyshard/policy/policy.hpp"
#include "polyshard/policy/step_memory.hpp"
#include "polyshard/profile/trace.hpp"
#include "polyshard/tensor/cpu/blas.hpp"

namespace train {

using namespace polyshard;

/// --wrap block's threshold for the size-based wrap: one block's parameters. Auto-wrap then makes
/// each block a unit and nothing else: a block's sub-modules hold fewer parameters than it, and
/// what lies outside the blocks is smaller (the final LayerNorm) or cannot be a unit (the
/// embeddings, one of which the head shares). train_rank checks the units it got.
template <class Model>
std::int64_t block_wrap_threshold(Model& model) {
  if (model.transformer.h.empty()) return std::numeric_limits<std::int64_t>::max();
  return count_parameters(model.transformer.h[0]);
}

inline AnyOptimizerConfig optimizer_config(const Options& o) {
  if (o.optimizer == "sgd") {
    SgdConfig c{.lr = o.lr, .momentum = o.momentum, .nesterov = o.nesterov};
    if (o.weight_decay >= 0) c.weight_decay = o.weight_decay;
    return c;
  }
  auto configure = [&](auto c) {
    c.lr = o.lr;
    c.beta1 = o.beta1;
    c.beta2 = o.beta2;
    c.eps = o.eps;
    if (o.weight_decay >= 0) c.weight_decay = o.weight_decay;  // else the optimizer's default
    return c;
  };
  if (o.optimizer == "adam") return configure(AdamConfig{});
  return configure(AdamWConfig{});
}

/// A number in a metrics line: JSON has no NaN or infinity (a step skipped for overflow has no
/// gradient norm, a diverged run no loss), so those are written as null.
struct JsonNumber {
  double value;
  friend std::ostream& operator<<(std::ostream& out, JsonNumber n) {
    if (std::isfinite(n.value)) return out << n.value;
    return out << "null";
  }
};

/// Generated tokens on one line: bytes as text, with C escapes for control characters, quotes
/// and bytes outside ASCII, when the tokens are bytes; ids separated by spaces otherwise.
inline std::string printable_tokens(const std::vector<std::int32_t>& tokens, bool bytes) {
  std::string out;
  if (!bytes) {
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      if (i) out += ' ';  // appended, not an operator+ chain: GCC 12 warns falsely on that at -O3
      out += std::to_string(tokens[i]);
    }
    return out;
  }
  out += '"';
  for (const std::int32_t t : tokens) {
    const auto c = static_cast<unsigned char>(t);
    if (c == '\n') out += "\\n";
    else if (c == '"' || c == '\\') (out += '\\') += static_cast<char>(c);
    else if (c >= 0x20 && c < 0x7f) out += static_cast<char>(c);
    else {
      static constexpr char hex[] = "0123456789abcdef";
      ((out += "\\x") += hex[c >> 4]) += hex[c & 15];
    }
  }
  return out + '"';
}

/// Per-rank figures of one step, gathered to rank 0 for the metrics file.
struct RankFigures {
  static constexpr std::size_t kinds = 5;  // all-reduce, reduce-scatter, all-gather, broadcast, reduce
  static constexpr std::size_t size = kinds + 1 + memory_category_count + 1;  // ..., bytes moved (measured)
  static constexpr std::size_t moved = kinds + 1 + memory_category_count;
  static constexpr CollectiveKind kind_of[kinds] = {CollectiveKind::AllReduce, CollectiveKind::ReduceScatter,
                                                    CollectiveKind::AllGather, CollectiveKind::Broadcast,
                                                    CollectiveKind::Reduce};
  static constexpr const char* kind_name[kinds] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                                   "reduce"};
};

/// Trains on one rank of `comm` under strategy S, computing on device D (a device needs
/// polyshard/engine/cuda/engine.hpp included first). Rank 0 prints progress and writes metrics.
template <class S, class D = Cpu, class Comm>
void train_rank(const Options& o, Comm& comm, const Datasets& data, Trace* trace = nullptr) {
  constexpr bool on_host = std::same_as<D, Cpu>;
  // A host model computes in float; a device model in the precision policy's compute type.
  using Model = Gpt<std::conditional_t<on_host, float, typename S::compute_type>, D>;
  MemoryTracker memory;
  TrackerScope scope(memory);
  const int world = comm.size(), rank = comm.rank();
  GptConfig cfg{.vocab_size = o.vocab, .block_size = model_positions(o), .n_layer = o.layers,
                .n_head = o.heads, .n_embd = o.embd};
  Model model(cfg);
  model.checkpoint_blocks = o.checkpoint_activations;
  if (o.decay_matrices_only) decay_matrices_only(model);  // read by the engine as it builds its optimizers
  StrategyConfig config = o.settings;
  config.gradient_accumulation_steps = static_cast<int>(o.accum);  // the engine counts the micro-batches
  fill_named_defaults<S>(config, o.strategy, ranks_span_machines(world));
  config.min_num_params = o.wrap == "block" ? block_wrap_threshold(model) : wrap_threshold(o);
  // --strategy hybrid without --hybrid-group: two groups when the world splits evenly.
  if constexpr (S::sharding::hybrid)
    config.hybrid_group_size =
        o.hybrid_group > 0 ? static_cast<int>(o.hybrid_group) : (world % 2 == 0 ? world / 2 : world);
  else
    config.hybrid_group_size = static_cast<int>(o.hybrid_group);  // the engine refuses it where set
  Engine<S, Model, Comm, AnyOptimizer<float>> engine(model, comm, optimizer_config(o), config, o.seed);
  // The most this rank held while the engine was built (under NVMe offload: one unit's state more).
  std::array<double, memory_category_count> built_peak{};
  for (std::size_t c = 0; c < memory_category_count; ++c)
    built_peak[c] = static_cast<double>(memory.peak(static_cast<MemoryCategory>(c)));
  engine.track_grad_norm(true);
  engine.set_trace(trace);
  POLYSHARD_CHECK(o.wrap != "block" || engine.units().units.size() == model.transformer.h.size() + 1,
                  "polyshard-train: --wrap block cut ", engine.units().units.size(), " units, not the root and ",
                  model.transformer.h.size(), " blocks");

  // Where the data stands is the step and the seed (every draw is a pure function of both); the
  // batch shape and the data set must match for the positions to mean the same batches.
  const std::vector<std::pair<std::string, std::string>> run_values = {
      {"batch", std::to_string(o.batch)}, {"accum", std::to_string(o.accum)}, {"data", data.train.origin()}};
  std::int64_t first_step = 0;
  std::uint64_t seed = o.seed;
  const auto tied = tied_parameters<Model>::of(model);
  if (!o.init.empty()) load_full_weights(engine, o.init, tied);
  if (!o.init_hf.empty()) load_hf_gpt2_pretrained(engine, o.init_hf);
  if (!o.resume.empty()) {
    const TrainingState state = load_checkpoint(engine, o.resume);
    for (const auto& [key, value] : run_values) {
      const std::string* saved = state.find(key);
      POLYSHARD_CHECK(!saved || *saved == value, "polyshard-train: --resume ", o.resume, " was saved with ", key, " ",
                      *saved, ", this run has ", value, "; the data would not continue where it stopped");
    }
    first_step = state.step;
    seed = state.seed;
    if (rank == 0)
      std::printf("resuming from %s at step %lld (seed %llu)\n", o.resume.c_str(), static_cast<long long>(first_step),
                  static_cast<unsigned long long>(seed));
  }
  auto save = [&](std::int64_t steps_done) {
    save_checkpoint(engine, o.save, {.step = steps_done, .seed = seed, .extra = run_values});
    if (rank == 0)
      std::printf("saved checkpoint %s at step %lld\n", o.save.c_str(), static_cast<long long>(steps_done));
  };

  const std::int64_t micro_rows = o.batch / o.accum;
  const BatchSampler sampler(data.train, o.seq, micro_rows, seed);
  const int states = engine.optimizers().empty() ? 0 : engine.optimizers()[0].states_per_param();
  const std::int64_t padded = engine.units().padded_total(), root = engine.units().units[0].padded;
  const int shard_ranks = engine.shard_comm().size();
  // This rank's shards where they are uneven (--partition whole_parameters).
  const std::vector<std::int64_t> shards = engine.units().uneven_shards(engine.shard_comm().rank(), shard_ranks);
  const std::int64_t rank_shard = rank_shard_elements(shards);
  const double predicted_bytes = bytes_sent_per_step<S>(padded, root, world, /*norm=*/true, shard_ranks, rank_shard);
  const double predicted_state = model_state_bytes<S>(padded, shard_ranks, states, rank_shard);
  // A steady-state step's peak per category (policy/step_memory.hpp), predicted for host models
  // outside HybridShard at one micro-batch a step; the backend's scratch comes on top of the
  // engine's communication buffers.
  std::optional<StepPeakMemory> predicted_peak, predicted_built;
  if constexpr (on_host && !S::sharding::hybrid) {
    std::vector<std::int64_t> sizes;
    std::vector<std::size_t> buckets;
    for (std::size_t i = 0; i < engine.units().units.size(); ++i) {
      sizes.push_back(engine.units().units[i].padded);
      buckets.push_back(engine.gradient_buckets(i).size());
    }
    if (o.accum == 1)
      predicted_peak = host_step_peak_memory<S>(sizes, world, states, config, buckets,
                                                optimizer_sub_group_sizes(engine.optimizers()), shards);
    predicted_built = host_construction_peak_memory<S>(sizes, world, states, config, shards);
  }

  std::ofstream metrics;
  if (rank == 0) {
    std::printf("polyshard-train: GPT %lld layers, %lld heads, width %lld, sequence %lld: %lld parameters\n",
                static_cast<long long>(o.layers), static_cast<long long>(o.heads), static_cast<long long>(o.embd),
                static_cast<long long>(o.seq), static_cast<long long>(engine.units().numel_total()));
    std::printf("strategy %s (%s, %s, %s), %d rank(s) on %s, %zu unit(s); data: %s (%lld tokens); batch %lld in %lld "
                "micro-batch(es); optimizer %s, lr %g\n",
                o.strategy.c_str(), S::sharding::name, S::offload::name, S::precision::name, world,
                on_host ? "the host" : "GPUs",
                engine.units().units.size(),
                data.train.origin().c_str(), static_cast<long long>(data.train.size()), static_cast<long long>(o.batch),
                static_cast<long long>(o.accum), o.optimizer.c_str(), o.lr);
    for (const std::string& note : o.notes) std::printf("note: %s\n", note.c_str());
    if (!o.metrics.empty()) {
      metrics.open(o.metrics);
      metrics.precision(17);  // losses that read back exactly: a resumed run can be compared digit for digit
      POLYSHARD_CHECK(metrics.good(), "polyshard-train: cannot write metrics to '", o.metrics, "'");
    }
  }

  // --val-data: the mean loss over the same eval_batches batches every time (a fixed seed), each
  // rank its rows of each, summed over ranks; a forward without gradients, under every strategy.
  std::optional<BatchSampler> val_sampler;
  if (data.validation) val_sampler.emplace(*data.validation, o.seq, micro_rows, /*seed=*/0);
  auto validation_loss = [&] {
    NoGradGuard no_grad;
    double sum = 0;
    for (std::int64_t m = 0; m < o.eval_batches; ++m) {
      const Batch batch = val_sampler->batch(m, rank, world);
      const double weight = static_cast<double>(batch.inputs.size(0)) / static_cast<double>(micro_rows);
      auto loss = engine.forward(
          [&] { return model.loss(on_device<D>(batch.inputs), on_device<D>(batch.targets)); });
      sum += weight * static_cast<double>(static_cast<float>(loss.value().to_vector()[0]));
    }
    all_reduce_host<D>(comm, std::span<double>(&sum, 1), ReduceOp::Sum);
    return sum / static_cast<double>(o.eval_batches);
  };

  // --sample-every: a continuation of the prompt drawn from the current weights. Every rank runs
  // the forwards (a sharded model is gathered unit by unit for each token); rank 0 prints it.
  auto sample = [&](std::int64_t step) {
    std::vector<std::int32_t> drawn;
    if constexpr (on_host) {
      const SamplingConfig c{.new_tokens = o.sample_tokens, .temperature = o.temperature, .top_k = o.top_k,
                             .seed = counter_bits(o.seed, static_cast<std::uint64_t>(step))};
      drawn = generate(engine, model, data.prompt, c);
      drawn.erase(drawn.begin(), drawn.begin() + static_cast<std::ptrdiff_t>(data.prompt.size()));
    }
    return drawn;
  };

  // --wall-clock-breakdown (DeepSpeed's wall_clock_breakdown): forward, backward and the
  // optimizer step each timed to the end of its work on the device, summed over a step's
  // micro-batches, and their means over the steps since the last print. Backward and step are
  // then called apart, which gives the same bits as backward_and_step but no host step beside
  // backward (an offloaded optimizer's overlap), so that each can be timed.
  struct Breakdown {
    double forward = 0, backward = 0, step = 0;  // seconds
    std::int64_t steps = 0;
  } breakdown;
  const auto timed = [&](double& total, auto&& work) {
    const auto t = std::chrono::steady_clock::now();
    auto result = work();
    polyshard::Storage<float, D>::synchronize_device();
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
    return result;
  };

  const auto start = std::chrono::steady_clock::now();
  double first_loss = NAN, last_loss = NAN;
  for (std::int64_t step = first_step; step < o.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    memory.reset_peaks();
    engine.reset_stats();
    double local_loss = 0;
    const double lr = learning_rate(o, step);
    const double clip = o.clip > 0 ? o.clip : std::numeric_limits<double>::infinity();
    bool applied = false;
    const Breakdown before = breakdown;
    for (std::int64_t micro = 0; micro < o.accum; ++micro) {
      const Batch batch = sampler.batch(step * o.accum + micro, rank, world);
      // This rank's share of the micro-batch; the engine divides by the accumulation steps.
      const double weight = static_cast<double>(batch.inputs.size(0)) / static_cast<double>(micro_rows);
      const auto forward = [&] {
        return engine.forward([&] { return model.loss(on_device<D>(batch.inputs), on_device<D>(batch.targets)); });
      };
      auto loss = o.wall_clock_breakdown ? timed(breakdown.forward, forward) : forward();
      local_loss += weight / static_cast<double>(o.accum) * static_cast<double>(static_cast<float>(
                                                                 loss.value().to_vector()[0]));
      // Only the last micro-batch reduces and steps, as its units' gradients land (an offloaded
      // optimizer); the others accumulate (StrategyConfig::gradient_accumulation_steps).
      if (o.wall_clock_breakdown) {
        timed(breakdown.backward, [&] {
          engine.backward(loss, weight);
          return 0;
        });
        loss = {};
        applied = timed(breakdown.step, [&] { return engine.step(lr, clip); });
      } else {
        applied = engine.backward_and_step(loss, weight, lr, clip);
      }
    }
    ++breakdown.steps;
    const Breakdown this_step{breakdown.forward - before.forward, breakdown.backward - before.backward,
                              breakdown.step - before.step, 1};
    const double step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    // Figures of this step, before the reporting collectives below add to the counters.
    std::vector<double> mine(RankFigures::size);
    for (std::size_t k = 0; k < RankFigures::kinds; ++k) mine[k] = engine.bytes_sent(RankFigures::kind_of[k]);
    mine[RankFigures::kinds] = static_cast<double>(memory.current(MemoryCategory::Parameters) +
                                                   memory.current(MemoryCategory::Gradients) +
                                                   memory.current(MemoryCategory::OptimizerState));
    for (std::size_t c = 0; c < memory_category_count; ++c)
      mine[RankFigures::kinds + 1 + c] = static_cast<double>(memory.peak(static_cast<MemoryCategory>(c)));
    mine[RankFigures::moved] = engine.bytes_moved();
    std::vector<double> all(mine.size() * static_cast<std::size_t>(world));
    all_gather_host<D>(comm, std::span<const double>(mine), std::span<double>(all));
    double loss_sum = local_loss;
    all_reduce_host<D>(comm, std::span<double>(&loss_sum, 1), ReduceOp::Sum);
    const bool evaluate = val_sampler && ((o.eval_every > 0 && (step + 1) % o.eval_every == 0) || step + 1 == o.steps);
    const double val_loss = evaluate ? validation_loss() : NAN;
    const bool sampling = o.sample_every > 0 && ((step + 1) % o.sample_every == 0 || step + 1 == o.steps);
    const std::vector<std::int32_t> drawn = sampling ? sample(step) : std::vector<std::int32_t>{};
    if (o.save_every > 0 && (step + 1) % o.save_every == 0 && step + 1 < o.steps) save(step + 1);
    if (rank != 0) continue;

    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double tokens_per_s = static_cast<double>(o.batch * o.seq) / step_s;
    if (step == first_step) first_loss = loss_sum;
    last_loss = loss_sum;
    POLYSHARD_CHECK(std::isfinite(loss_sum), "polyshard-train: the loss became ", loss_sum, " at step ", step,
                    " (try a lower --lr)");
    if (step % o.log_every == 0 || step + 1 == o.steps) {
      std::printf("step %5lld | loss %.4f | lr %.2e | grad norm %.3f | %8.0f tok/s | %.1f ms | elapsed %.1f s%s\n",
                  static_cast<long long>(step), loss_sum, lr, engine.last_grad_norm(), tokens_per_s, step_s * 1e3,
                  elapsed, applied ? "" : " | skipped (overflow)");
      if (o.wall_clock_breakdown) {
        const double per_step = 1e3 / static_cast<double>(breakdown.steps);
        std::printf("step %5lld | time (ms) per step, mean of %lld | forward %.2f | backward %.2f | step %.2f\n",
                    static_cast<long long>(step), static_cast<long long>(breakdown.steps),
                    breakdown.forward * per_step, breakdown.backward * per_step, breakdown.step * per_step);
        breakdown = {};
      }
    }
    if (evaluate) std::printf("step %5lld | validation loss %.4f\n", static_cast<long long>(step), val_loss);
    if (sampling)
      std::printf("step %5lld | sample: %s\n", static_cast<long long>(step),
                  printable_tokens(drawn, data.bytes).c_str());
    if (metrics.is_open()) {
      metrics << "{\"step\":" << step << ",\"loss\":" << JsonNumber{loss_sum};
      if (evaluate) metrics << ",\"val_loss\":" << JsonNumber{val_loss};
      if (sampling) {
        metrics << ",\"sample\":[";
        for (std::size_t i = 0; i < drawn.size(); ++i) metrics << (i ? "," : "") << drawn[i];
        metrics << "]";
      }
      metrics << ",\"lr\":" << lr << ",\"grad_norm\":"
              << JsonNumber{engine.last_grad_norm()} << ",\"skipped\":" << (applied ? "false" : "true")
              << ",\"loss_scale\":" << engine.loss_scaler().scale() << ",\"tokens_per_s\":" << tokens_per_s
              << ",\"step_s\":" << step_s << ",\"elapsed_s\":" << elapsed;
      if (o.wall_clock_breakdown)
        metrics << ",\"wall_clock\":{\"forward_s\":" << this_step.forward << ",\"backward_s\":" << this_step.backward
                << ",\"optimizer_step_s\":" << this_step.step << "}";
      metrics << ",\"parameters\":" << engine.units().numel_total() << ",\"world_size\":" << world
              << ",\"device\":\"" << (on_host ? "cpu" : "cuda") << "\",\"strategy\":\"" << o.strategy
              << "\",\"precision\":\"" << o.precision << "\",\"partition\":\""
              << (engine.config().partition ? partition_name(*engine.config().partition) : "none")
              << "\",\"predicted\":{\"bytes_sent\":" << predicted_bytes << ",\"model_state_bytes\":" << predicted_state;
      // A predicted peak per category, as ,"name":{...}.
      const auto predicted_peaks = [&](const char* name, const StepPeakMemory& p) {
        metrics << ",\"" << name << "\":{\"parameters\":" << p.parameters << ",\"gradients\":" << p.gradients
                << ",\"optimizer_state\":" << p.optimizer_state << ",\"working_copies\":" << p.working_copies
                << ",\"communication\":" << p.communication << ",\"other\":" << p.other << "}";
      };
      if (predicted_peak) predicted_peaks("peak_bytes", *predicted_peak);
      if (predicted_built) predicted_peaks("built_peak_bytes", *predicted_built);
      metrics << "},\"built_peak_bytes\":{";  // rank 0's, while the engine was built
      for (std::size_t c = 0; c < memory_category_count; ++c)
        metrics << (c ? "," : "") << '"' << memory_category_name(static_cast<MemoryCategory>(c))
                << "\":" << built_peak[c];
      metrics << "},\"activation_bytes\":[";  // rank 0's, per unit
      for (std::size_t u = 0; u < engine.activation_bytes().size(); ++u)
        metrics << (u ? "," : "") << engine.activation_bytes()[u];
      metrics << "],\"ranks\":[";
      for (int r = 0; r < world; ++r) {
        const double* f = all.data() + static_cast<std::size_t>(r) * RankFigures::size;
        metrics << (r ? "," : "") << "{\"rank\":" << r << ",\"bytes_sent\":{";
        double total = 0;
        for (std::size_t k = 0; k < RankFigures::kinds; ++k) {
          metrics << (k ? "," : "") << '"' << RankFigures::kind_name[k] << "\":" << f[k];
          total += f[k];
        }
        metrics << ",\"total\":" << total << "},\"bytes_moved\":" << f[RankFigures::moved] << ",\"model_state_bytes\":" << f[RankFigures::kinds] << ",\"peak_bytes\":{";
        for (std::size_t c = 0; c < memory_category_count; ++c)
          metrics << (c ? "," : "") << '"' << memory_category_name(static_cast<MemoryCategory>(c))
                  << "\":" << f[RankFigures::kinds + 1 + c];
        metrics << "}}";
      }
      metrics << "]}\n";
      metrics.flush();
    }
  }
  if (!o.save.empty()) save(std::max(first_step, o.steps));
  if (!o.export_weights.empty()) {
    save_full_weights(engine, o.export_weights, tied);
    if (rank == 0) std::printf("exported full weights to %s\n", o.export_weights.c_str());
  }
  if (!o.export_hf.empty()) {
    save_hf_gpt2_pretrained(engine, cfg, o.export_hf);
    if (rank == 0) std::printf("exported a Hugging Face GPT-2 directory to %s\n", o.export_hf.c_str());
  }
  if (rank == 0 && o.settings.cpu_checkpointing) {
    const CheckpointCounts& c = engine.last_checkpoint_counts();
    std::printf("cpu_checkpointing: %lld of %lld checkpointed blocks' inputs (%lld bytes) waited in host memory, "
                "%lld of them in one buffer\n",
                static_cast<long long>(c.inputs_offloaded), static_cast<long long>(c.checkpoints),
                static_cast<long long>(c.bytes_offloaded), static_cast<long long>(c.inputs_in_one_buffer));
  }
  if (rank == 0)
    std::printf("done: loss %.4f -> %.4f in %lld steps\n", first_loss, last_loss,
                static_cast<long long>(std::max<std::int64_t>(o.steps - first_step, 0)));
}

/// The sharding and offload policies of each family.
template <Family F>
struct FamilyPolicies;
template <> struct FamilyPolicies<Family::ddp> { using sharding = NoShard; using offload = NoOffload; };
template <> struct FamilyPolicies<Family::zero1> { using sharding = ShardOptimizerState; using offload = NoOffload; };
template <> struct FamilyPolicies<Family::zero2> { using sharding = ShardGradients; using offload = NoOffload; };
template <> struct FamilyPolicies<Family::zero3> { using sharding = ShardParameters<true>; using offload = NoOffload; };
template <> struct FamilyPolicies<Family::fsdp_grad_op> { using sharding = ShardParameters<false>; using offload = NoOffload; };
template <> struct FamilyPolicies<Family::zero1_offload> {
  using sharding = ShardOptimizerState;
  using offload = OffloadOptimizer<Cpu>;
};
template <> struct FamilyPolicies<Family::zero_offload> { using sharding = ShardGradients; using offload = OffloadOptimizer<Cpu>; };
template <> struct FamilyPolicies<Family::zero3_offload_optimizer> {
  using sharding = ShardParameters<true>;
  using offload = OffloadOptimizer<Cpu>;
};
template <> struct FamilyPolicies<Family::zero3_offload> {
  using sharding = ShardParameters<true>;
  using offload = OffloadParameters<Cpu>;
};
template <> struct FamilyPolicies<Family::zero3_offload_parameters> {
  using sharding = ShardParameters<true>;
  using offload = OffloadParametersOnly<Cpu>;
};
template <> struct FamilyPolicies<Family::hybrid> { using sharding = HybridShard<ShardParameters<true>>; using offload = NoOffload; };
template <> struct FamilyPolicies<Family::zero_infinity> {
  using sharding = ShardParameters<true>;
  using offload = OffloadOptimizer<Nvme>;
};
template <> struct FamilyPolicies<Family::zero_infinity_parameters> {
  using sharding = ShardParameters<true>;
  using offload = OffloadParameters<Nvme>;
};

/// The precision policy of each --precision (fp16-mixed: by the strategy's scaler, families.hpp).
template <Precision P>
using PrecisionOf =
    std::conditional_t<P == Precision::fp32, Fp32,
                       std::conditional_t<P == Precision::bf16_mixed, Bf16Mixed,
                                          std::conditional_t<P == Precision::fp16_amp, Fp16Amp, Fp16Mixed>>>;

/// One strategy type per family and precision, whatever the --wrap: FairScale's size-based wrap
/// with its threshold set at run time (train_rank: whole, size:N, or one block's parameters).
/// Compiling one engine instead of one per wrap takes a third off the program's build.
template <Family F, Precision P, class D, class Comm>
void train_strategy(const Options& o, Comm& comm, const Datasets& data, Trace* trace) {
  using Sharding = typename FamilyPolicies<F>::sharding;
  using Offload = typename FamilyPolicies<F>::offload;
  train_rank<Strategy<Sharding, Offload, PrecisionOf<P>, WrapBySize<1>>, D>(o, comm, data, trace);
}

}  // namespace train
