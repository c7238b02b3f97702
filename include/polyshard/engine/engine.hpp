// The training engine: a model, a communicator and a strategy type; forward, backward and step
// with the strategy's gathers, reductions and sharded optimizer step at unit boundaries.
#pragma once

#include <algorithm>
#include <cmath>
#include <deque>
#include <exception>
#include <future>
#include <iostream>
#include <limits>
#include <optional>
#include <unordered_map>
#include <string>
#include <vector>

#include "polyshard/autograd/checkpoint.hpp"
#include "polyshard/comm/call_site.hpp"
#include "polyshard/comm/comm_stats.hpp"
#include "polyshard/comm/host_values.hpp"
#include "polyshard/core/device_handoff.hpp"
#include "polyshard/core/host_allocator.hpp"
#include "polyshard/core/serial_worker.hpp"
#include "polyshard/engine/gradient_buckets.hpp"
#include "polyshard/engine/gradient_ops.hpp"
#include "polyshard/engine/host_optimizer_view.hpp"
#include "polyshard/engine/loss_scaler.hpp"
#include "polyshard/engine/model_contract.hpp"
#include "polyshard/engine/offload.hpp"
#include "polyshard/engine/optimizer_groups.hpp"
#include "polyshard/engine/parameter_partition.hpp"
#include "polyshard/engine/sharding/no_shard.hpp"
#include "polyshard/engine/sharding/shard_gradients.hpp"
#include "polyshard/engine/sharding/shard_optimizer_state.hpp"
#include "polyshard/engine/sharding/shard_parameters.hpp"
#include "polyshard/engine/units.hpp"
#include "polyshard/optim/clip_grad_norm.hpp"
#include "polyshard/optim/optimizer.hpp"
#include "polyshard/optim/optimizer_list.hpp"
#include "polyshard/policy/config.hpp"
#include "polyshard/policy/strategy.hpp"
#include "polyshard/profile/trace.hpp"

namespace polyshard {

namespace detail {
/// The sharding policy a rank runs within its group: the policy itself, or HybridShard's inner.
template <class Sharding>
struct hybrid_inner {
  using type = Sharding;
};
template <class Inner>
struct hybrid_inner<HybridShard<Inner>> {
  using type = Inner;
};

/// The element type and device a model computes in: Model::element_type and
/// Model::device_type where it names them (Gpt does), else float on the host.
template <class Model>
struct model_numerics {
  using element = float;
  using device = Cpu;
};
template <class Model>
  requires requires {
    typename Model::element_type;
    typename Model::device_type;
  }
struct model_numerics<Model> {
  using element = typename Model::element_type;
  using device = typename Model::device_type;
};

// The engine's own types that depend on nothing of its strategy (the step's plan, the gathers
// ahead, the module buffers): declared here, they and the containers of them are compiled once
// per program rather than once per engine type.

/// What a step does: its learning rate and clipping, whether it needs the global gradient
/// norm, whether the units were updated as their gradients landed (backward_and_step), and
/// the inverse of the loss scale this step's gradients carry.
struct StepPlan {
  double lr;
  double max_grad_norm;
  bool needs_norm;
  bool updated_early;
  double inv_loss_scale;
};

/// What a unit's gradients told the step: whether they overflowed, and their squared norm
/// (of the gradients as reduced: still scaled by the loss scale).
struct UnitGradCheck {
  bool overflow = false;
  double squares = 0;
};

/// A backward_and_step in progress: its plan, how many of each unit's backwards have finished,
/// and which units have landed (handed to the host thread).
struct Landing {
  StepPlan plan;
  std::vector<int> backwards_done;
  std::vector<char> landed;
};

/// A unit's gather issued ahead of its forward.
struct PrefetchedGather {
  std::size_t unit;
  CommHandle handle;
};

/// Starts the broadcast of rank 0's `value` to every rank, in its own memory. Collectives carry
/// floating-point elements; a broadcast only copies bytes, so an integer buffer (a step
/// counter) travels as the float type of its width, its bytes never read as floats.
template <class Comm, Element T, class D>
CommHandle broadcast_buffer(Comm& c, const Tensor<T, D>& value) {
  if constexpr (FloatElement<T>) {
    return c.broadcast_async(value.span(), 0);
  } else {
    using F = std::conditional_t<sizeof(T) == sizeof(double), double, float>;
    static_assert(sizeof(F) == sizeof(T), "a buffer's integer type has the width of a float type");
    const std::span<T> bytes = value.span();
    return c.broadcast_async(std::span<F>(reinterpret_cast<F*>(bytes.data()), bytes.size()), 0);
  }
}

/// A module buffer as an engine keeps it, whole on every rank and outside the units: its name
/// and how to broadcast it from rank 0 (its element type erased).
template <class Comm>
struct ModuleBuffer {
  std::string name;
  std::function<CommHandle(Comm&)> broadcast;
};

/// The buffers of `model`, in the order visit_buffers gives them (per model and communicator,
/// not per strategy).
template <class Comm, class Model>
std::vector<ModuleBuffer<Comm>> module_buffers(Model& model) {
  std::vector<ModuleBuffer<Comm>> buffers;
  visit_buffers(model, [&](const std::string& name, const auto& b) {
    buffers.push_back({name, [value = b.value()](Comm& c) { return broadcast_buffer(c, value); }});
  });
  return buffers;
}

/// The engine of Engine<S, ...> (below), over the canonical spelling of S: compositions that name
/// the same policies in another order, or leave defaults out, share one instantiation.
template <StrategyType S, class Model, Communicator Comm, Optimizer Opt>
class EngineOver : private ModuleHooks<typename detail::model_numerics<Model>::element,
                                       typename detail::model_numerics<Model>::device> {
 public:
  using strategy = S;
  using sharding = typename S::sharding;
  using precision = typename S::precision;
  using CT = typename S::compute_type;
  using RT = typename S::reduce_type;
  using MT = typename S::master_type;
  /// HybridShard<Inner> runs Inner inside each group of ranks and all-reduces across groups.
  using within_group = typename detail::hybrid_inner<sharding>::type;
  using Behaviour = ShardingBehaviour<within_group>;
  /// Where the model computes, and in what element type.
  using device = typename detail::model_numerics<Model>::device;
  using work_type = typename detail::model_numerics<Model>::element;
  using State = UnitState<CT, RT, MT, device, typename S::offload>;
  /// What updates a unit's master weights where they live: Opt itself on the host (a host
  /// model, or optimizer state offloaded from a device), its fused kernels on a device.
  using UnitOptimizer = optimizer_on_t<Opt, typename State::step_device>;
  /// The optimizer writes the compute-dtype copy of the weights in its own pass (the fused
  /// kernels on a device, the vector kernels on the host) where that copy is a buffer of its
  /// own, in the memory the optimizer steps in, and the sharding behaviour names it.
  static constexpr bool fuses_compute_copy =
      !std::is_same_v<CT, MT> && std::same_as<typename State::shard_device, typename State::step_device> &&
      requires(State& u) { Behaviour::compute_copy(u); } &&
      (std::same_as<typename State::step_device, Cpu>
           ? requires(UnitOptimizer& o, std::span<MT> p, std::span<const RT> g, std::span<CT> c) {
               o.step(p, g, c, 1.0);
             }
           : (std::is_same_v<RT, CT> || std::is_same_v<RT, float>));  // the device kernels' (gradient, copy) pairs

  static_assert(std::is_same_v<work_type, typename State::work_type>,
                "Engine<S, Model, ...>: the model's element type does not fit the strategy: a host model computes in "
                "float (Gpt<float>; the precision policy's 16-bit types are storage there), a device model in the "
                "precision policy's compute type (Gpt<bfloat16, Cuda> for a bf16 policy)");
  static_assert(keeps_model_contract<Model, typename S::wrap, typename S::checkpointing, work_type, device>(),
                "Engine<S, Model, ...>: the model breaks its contract (docs/models.md): see the sentence above");
  static_assert(std::same_as<device, Cpu> || moves_device_buffers<Comm>,
                "Engine<S, Model, Comm, ...>: a model on a device needs a communicator of device buffers "
                "(NcclCommunicator, one GPU per rank): ThreadCommunicator and MpiCommunicator move host memory");

  static_assert(std::is_same_v<MT, typename Opt::param_type>,
                "Engine<S, Model, Comm, Opt>: the optimizer's parameter type must be the precision policy's master "
                "type (float for every preset)");
  /// Where the offload policy keeps optimizer state between steps (see engine/offload.hpp).
  using Placement = OffloadPlacement<typename S::offload>;
  static_assert(sizeof(Placement) > 0, "instantiates the offload placement and its checks");

  /// Binds `model`'s parameters to the strategy's buffers and builds the rank's state: whole
  /// parameters or only the rank's shards, as the strategy says, initialised from `seed`.
  EngineOver(Model& model, Comm& comm, typename Opt::config_type optimizer, StrategyConfig config = {},
             std::uint64_t seed = 0)
      : EngineOver(model, comm, OptimizerList<typename Opt::config_type>{{every_parameter(), std::move(optimizer)}},
                   std::move(config), seed) {}
  /// As above with several optimizers, each over the parameters it selects (OptimizerList).
  EngineOver(Model& model, Comm& comm, const OptimizerList<typename Opt::config_type>& optimizers,
             StrategyConfig config = {}, std::uint64_t seed = 0)
      : model_(model), comm_(comm), config_(with_reference_defaults<S>(config)), scaler_(config) {
    refuse_fields_not_read_by<S, device>(config_);
    POLYSHARD_CHECK(config.gradient_accumulation_steps >= 1, "StrategyConfig::gradient_accumulation_steps (the "
                    "micro-batches of one step) must be at least 1, got ", config.gradient_accumulation_steps);
    if constexpr (State::master_is_full || State::master_is_shard)
      POLYSHARD_CHECK(!config.delayed_parameter_update, "StrategyConfig::delayed_parameter_update: under this ",
                      "strategy the master weights are the parameters forward reads, so the host cannot update ",
                      "them while forward runs; it needs master weights apart: a 16-bit precision policy, or a ",
                      "device model");
    if constexpr (sharding::hybrid) {
      const int g = config.hybrid_group_size > 0 ? config.hybrid_group_size : comm.size();
      POLYSHARD_CHECK(comm.size() % g == 0, "HybridShard: world size ", comm.size(),
                      " is not a multiple of hybrid_group_size ", g);
      group_.emplace(comm.split(comm.rank() / g, comm.rank()));     // shards: consecutive ranks
      replicas_.emplace(comm.split(comm.rank() % g, comm.rank()));  // the same shard in every group
    }
    Comm& shards = shard_comm();
    plan_ = plan_units<typename S::wrap, typename S::checkpointing, work_type, Model, device>(model, shards.size(),
                                                                                              config.min_num_params);
    assign_optimizers(plan_, optimizers);
    if (config_.partition == ShardPartition::whole_parameters) lay_out_whole_parameters(plan_, shards.size());
    const OptimizerListFacts list = list_facts(optimizers);
    units_.resize(plan_.units.size());
    for (std::size_t i = 0; i < units_.size(); ++i) {
      State& u = units_[i];
      u.layout = &plan_.units[i];
      u.rank = shards.rank();
      u.world = shards.size();
      u.shard = u.layout->shard_size(u.rank, u.world);
      u.gather_piece = allgather_piece_elements(config, u.world, u.shard);
      u.pin_host = config.pin_memory;
    }
    // Unit by unit, each placed as soon as it is built: under NVMe offload its state (and shard)
    // go to the file before the next unit is made, so that building never holds them all.
    for (std::size_t i = 0; i < units_.size(); ++i) {
      State& u = units_[i];
      Behaviour::allocate(u, seed);
      if (config.sync_models_at_startup) sync_from_rank0(u);
      u.bind();
      std::optional<HostAllocatorScope> pinned;  // the state, and the masters NVMe offload hands to the sub-groups
      pin_host_optimizer_state(pinned, config);
      optimizers_.emplace_back(optimizer_runs(u, optimizers), config.sub_group_size, list);
      placement_.place(i, units_, optimizers_, config, comm.rank());
    }
    placement_.finish_placing();
    plan_buckets();
    buffers_ = detail::module_buffers<Comm>(model);
    if (config.sync_models_at_startup)
      broadcast_buffers("the start-up sync of the module buffers from rank 0", /*blocking=*/true);
  }
  EngineOver(const EngineOver&) = delete;
  EngineOver& operator=(const EngineOver&) = delete;
  /// Waits for the collectives still in flight (after an error, they fail at once or time out):
  /// they read and write this engine's buffers.
  ~EngineOver() {
    settle_in_flight();
    if (delayed_.valid()) delayed_.wait();  // it reads and writes this engine's buffers
  }

  /// Runs `loss_fn` (the model's forward) with the strategy's hooks in place.
  template <class F>
  Var<work_type, device> forward(F&& loss_fn) {
    Trace::Span span(trace_, "forward", "compute");
    check_trainable();
    if (config_.broadcast_buffers)
      broadcast_buffers("the broadcast of the module buffers before forward", /*blocking=*/true);
    else
      wait_for_buffers();  // those sync_buffers(false) left in flight
    ModuleHooksScope<work_type, device> hooks(*this);
    in_backward_ = false;
    if (grad_enabled()) ++micro_batch_;
    drain_prefetch();
    running_order_.clear();
    gather(0);  // the root stays gathered until its backward is done
    ActivationCount count(*this, 0);
    CheckpointSettingsScope checkpointing({.cpu_checkpointing = config_.cpu_checkpointing,
                                           .contiguous_memory_optimization = config_.contiguous_memory_optimization,
                                           .number_checkpoints = config_.number_checkpoints,
                                           .synchronize_boundary = config_.synchronize_checkpoint_boundary});
    Var<work_type, device> loss = loss_fn();
    count.done();
    POLYSHARD_CHECK(checkpointing.counts().checkpoints > 0 ||
                        !(config_.cpu_checkpointing || config_.synchronize_checkpoint_boundary),
                    "Engine::forward: StrategyConfig::", config_.cpu_checkpointing ? "cpu_checkpointing" :
                    "synchronize_checkpoint_boundary", " acts on checkpointed blocks, and this forward checkpointed "
                    "none: checkpoint some (ActivationCheckpointing<Block>, or the model's own checkpoint() calls), "
                    "or leave it false");
    last_checkpoint_counts_ = checkpointing.counts();
    // Without gradients (evaluation) no backward follows to free the root: it is freed now.
    if (!grad_enabled()) {
      Behaviour::release(units_[0]);
      drain_prefetch();
    }
    return loss;
  }

  /// Backward from `loss`, seeded with `weight` times the loss scale; reduces every unit's
  /// gradients (unless inside no_sync) and waits for the reductions. Under
  /// StrategyConfig::gradient_accumulation_steps K > 1 the seed is weight / K times the loss
  /// scale (DeepSpeed divides the loss by its accumulation steps), and only the backward of a
  /// step's last micro-batch (is_gradient_accumulation_boundary()) reduces: the others
  /// accumulate local gradients, as under no_sync.
  void backward(const Var<work_type, device>& loss, double weight = 1.0) {
    Trace::Span span(trace_, "backward", "compute");
    std::optional<NoSync> accumulating;
    if (!is_gradient_accumulation_boundary()) accumulating.emplace(*this);
    ModuleHooksScope<work_type, device> hooks(*this);
    in_backward_ = true;
    if (!running_order_.empty()) forward_order_ = running_order_;
    State& root = units_[0];
    gather(0);
    Behaviour::begin_backward(root);
    leaf_entries_.clear();
    arm_buckets(0);
    // Buckets are reduced as backward finishes them (overlap_comm), else when their unit's
    // backward is done.
    std::optional<GradientReadyScope<work_type, device>> ready;
    if (sync_ && config_.overlap_comm && reduces_in_buckets)
      ready.emplace([this](Node<work_type, device>& leaf) { gradient_final(leaf); });
    const double seed = weight / config_.gradient_accumulation_steps * scaler_.scale();
    SettleOnError settle_on_error{*this};
    if (loss.value().numel() == 1) {
      // In double: a loss scale fp16 cannot hold (65536 and up) still seeds the loss's gradient
      // (its op computes in float), rather than an infinite seed skipping every step.
      polyshard::backward(loss, seed);
    } else {
      polyshard::backward(
          loss, Tensor<work_type, device>::full(loss.shape(), static_cast<work_type>(static_cast<float>(seed))));
    }
    post_backward(root);
    finish_reductions();
    land_ready_units();
    drain_prefetch();
    in_backward_ = false;
  }

  /// Inside this scope backward accumulates local gradients without communicating
  /// (FSDP/DDP no_sync); the first backward after it reduces everything accumulated.
  class NoSync {
   public:
    explicit NoSync(EngineOver& e) : engine_(e), saved_(e.sync_) { e.sync_ = false; }
    ~NoSync() { engine_.sync_ = saved_; }

   private:
    EngineOver& engine_;
    bool saved_;
  };
  NoSync no_sync() { return NoSync(*this); }

  /// Reduces now the gradients that backward passes inside no_sync accumulated, as the next
  /// backward outside no_sync would reduce them with its own (FairScale ShardedDataParallel's
  /// reduce()), so that step() may follow: the same collectives over the same sums, bit for bit.
  /// Nothing to do where no gradients are pending. A collective call: every rank calls it.
  void reduce() {
    POLYSHARD_CHECK(!in_backward_, "Engine::reduce: called during backward");
    SettleOnError settle_on_error{*this};
    for (std::size_t i = units_.size(); i-- > 0;)  // in backward's order: the last unit first
      if (units_[i].local_grads) reduce_unit(i);
    finish_reductions();
  }

  /// Applies the optimizer to every unit with learning rate `lr`. Returns false when the step
  /// was skipped because the (scaled) gradients overflowed; the parameters are then untouched.
  /// `max_grad_norm` clips the global gradient norm (infinity: no clipping). Under
  /// StrategyConfig::gradient_accumulation_steps K > 1 it is called after every micro-batch's
  /// backward, as DeepSpeed's engine.step() is, and only the K-th call of a step updates: the
  /// others count the micro-batch and return false, leaving the parameters untouched.
  bool step(double lr, double max_grad_norm = std::numeric_limits<double>::infinity()) {
    if (count_micro_batch()) return false;
    Trace::Span span(trace_, "step", "compute");
    NextStep next_step{*this};
    drain_prefetch();
    complete_delayed_update();
    POLYSHARD_CHECK(!pending_local_grads(), "Engine::step: gradients accumulated under no_sync were never reduced; "
                                            "run one backward outside no_sync before stepping");
    if constexpr (sharding::hybrid) {
      // Groups hold the same shards: sum each shard's gradient over the groups, once per step
      // (after any accumulation), so that every replica applies the same update.
      for (State& u : units_) {
        CallSite site(step_site("the sum over replicas of the gradients of " + unit_name(u)));
        replicas_->all_reduce(Behaviour::optimizer_grads(u).span(), ReduceOp::Sum);
      }
    }
    const StepPlan plan{lr, max_grad_norm, needs_grad_norm(max_grad_norm), false, 1.0 / scaler_.scale()};
    grad_checks_.assign(units_.size(), UnitGradCheck{});
    for (std::size_t i = 0; i < units_.size(); ++i) {
      stage_step_grads(units_[i]);
      check_unit_grads(i, plan);
    }
    return finish_step(plan);
  }

  /// backward(loss, weight) then step(lr, max_grad_norm), with the same results bit for bit;
  /// for the last micro-batch of a step. Where the optimizer steps on the host
  /// (OffloadOptimizer<Cpu>), each unit's reduced gradients are copied to the host and checked
  /// on a host thread as soon as they have landed, while backward goes on for the units before
  /// it; without gradient clipping and loss scaling, that thread applies the unit's optimizer
  /// update then as well, and only the write-back of the updated parameters waits for the end
  /// of backward. (With clipping or a dynamic loss scale, every update needs the global norm or
  /// overflow check, hence all units, first.) Under other strategies, and with NVMe offload,
  /// HybridShard or the delayed parameter update, the two calls in turn. If backward fails (a
  /// collective that failed: the run cannot go on), units the host thread already updated stay
  /// updated and the step number stays where it was.
  bool backward_and_step(const Var<work_type, device>& loss, double weight, double lr,
                         double max_grad_norm = std::numeric_limits<double>::infinity()) {
    handed_off_in_backward_ = 0;
    if (!steps_in_backward() || !is_gradient_accumulation_boundary()) {
      backward(loss, weight);
      return step(lr, max_grad_norm);
    }
    POLYSHARD_CHECK(sync_, "Engine::backward_and_step inside no_sync: the step needs this backward's gradients ",
                    "reduced; call backward() inside no_sync and backward_and_step() outside it");
    const StepPlan plan{lr, max_grad_norm, needs_grad_norm(max_grad_norm),
                        !precision::loss_scale::scaled && !std::isfinite(max_grad_norm), 1.0 / scaler_.scale()};
    if (!host_steps_) host_steps_.emplace();
    grad_checks_.assign(units_.size(), UnitGradCheck{});
    landing_.emplace(Landing{plan, std::vector<int>(units_.size(), 0), std::vector<char>(units_.size(), 0)});
    struct EndLanding {
      EngineOver& e;
      ~EndLanding() { e.landing_.reset(); }
    } end_landing{*this};
    backward(loss, weight);
    NextStep next_step{*this};  // after backward: a backward that throws leaves the step number as it was
    POLYSHARD_CHECK(!pending_local_grads(), "Engine::backward_and_step: gradients accumulated under no_sync were "
                                            "never reduced: a unit this backward did not reach has some");
    for (std::size_t i = 0; i < units_.size(); ++i)  // a unit whose forward did not run
      if (!landing_->landed[i]) land(i);
    {
      Trace::Span wait(trace_, "wait for the host steps", "compute");
      host_steps_->wait();
    }
    Trace::Span span(trace_, "step", "compute");
    return finish_step(plan);
  }

  /// Under StrategyConfig::delayed_parameter_update: waits for the optimizer update the last
  /// step() left running and writes its parameters back, so that the model's parameters, the
  /// master weights and the optimizer state include every step taken (rethrowing the update's
  /// failure). A collective where the policy all-gathers updated shards: every rank calls it.
  /// step() calls it first, and so do full_parameters(), access_optimizer() (checkpoints and
  /// full weights), refresh_parameters_from_master() and refresh_trainable(); the next step()
  /// then starts the delay over. Without a delayed update in flight, nothing.
  void complete_delayed_update() {
    if (!delayed_.valid()) return;
    delayed_.get();
    for (State& u : units_) write_back_unit(u, step_site("the delayed parameter update of " + unit_name(u)));
  }

  /// Forgets every gradient, writing nothing; a parameter no backward reaches steps with zeros
  /// (set_to_none=False). The micro-batches counted toward the next step under
  /// gradient_accumulation_steps go with them: the next one starts a step.
  void zero_grad() {
    accumulated_micro_batches_ = 0;
    for (State& u : units_) {
      u.local_grads = false;
      u.reduced_has_grad = false;
      u.reset_grad_flags();
    }
  }

  /// Broadcasts every module buffer (Buffer members: running statistics and the like) from rank
  /// 0, so that every rank holds rank 0's (FairScale's sync_buffers(blocking), whose default is
  /// false). A collective: every rank calls it. Blocking, it returns once this rank holds rank
  /// 0's buffers. Not blocking, it starts the broadcasts and returns: the buffers belong to them
  /// until the engine next uses them (forward, or model(), through which checkpoints and state
  /// dicts read them), which waits for them first, or until wait_for_buffers(). Read the
  /// model's buffers directly only after one of these. forward() broadcasts, blocking, under
  /// StrategyConfig::broadcast_buffers (the default), and the constructor under
  /// sync_models_at_startup.
  void sync_buffers(bool blocking = false) { broadcast_buffers("sync_buffers", blocking); }

  /// Waits for the broadcasts that sync_buffers(false) started; throws the first one's error
  /// after waiting for the others.
  void wait_for_buffers() {
    if (std::exception_ptr failed = wait_for_all(buffer_broadcasts_)) std::rethrow_exception(failed);
  }

  /// The model the engine trains (checkpoints read and write its buffers through it), once
  /// the buffer broadcasts in flight are done.
  Model& model() {
    wait_for_buffers();
    return model_;
  }

  /// Re-reads every parameter's requires_grad after the caller changed it (FairScale's
  /// refresh_trainable). A frozen parameter (set_requires_grad(false)) is neither reduced (its
  /// gradient is zero) nor updated: its values and its optimizer state stay as they are. The
  /// engine reads the flags when it is built, and forward() reads them again when they changed
  /// (StrategyConfig::auto_refresh_trainable, FairScale's default) or else throws. Local: every
  /// rank must freeze the same parameters.
  void refresh_trainable() {
    complete_delayed_update();  // the update reads which parameters are frozen
    for (State& u : units_) u.read_trainable();
  }

  /// Every parameter of the model by name, as float, gathered from wherever it lives (a
  /// collective: every rank must call it). Sorted by name.
  std::vector<std::pair<std::string, std::vector<float>>> full_parameters() {
    drain_prefetch();
    complete_delayed_update();
    std::vector<std::pair<std::string, std::vector<float>>> out;
    for (State& u : units_) {
      Tensor<CT, device> whole = u.full;
      if constexpr (sharding::shards_parameters) {
        whole = Tensor<CT, device>::empty({u.layout->padded}, MemoryCategory::Communication);
        CallSite site("full_parameters(), gathering " + unit_name(u));
        placement_.with_parameters(static_cast<std::size_t>(&u - units_.data()), [&] {
          shard_comm().all_gather(std::span<const CT>(u.param_shard_on_device().span()), whole.span());
        });
      }
      const std::vector<CT> host = whole.to_vector();
      for (const auto& e : u.layout->entries) {
        std::vector<float> values(static_cast<std::size_t>(e.numel()));
        for (std::int64_t i = 0; i < e.numel(); ++i)
          values[static_cast<std::size_t>(i)] = static_cast<float>(host[static_cast<std::size_t>(e.offset + i)]);
        out.emplace_back(e.name, std::move(values));
      }
    }
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    return out;
  }

  /// Whether the next backward() and step() are those of a step's last micro-batch, the one
  /// that reduces and updates (DeepSpeed's is_gradient_accumulation_boundary()): always, unless
  /// StrategyConfig::gradient_accumulation_steps is above 1.
  bool is_gradient_accumulation_boundary() const {
    return accumulated_micro_batches_ + 1 >= config_.gradient_accumulation_steps;
  }
  /// The micro-batches of the current step whose step() has been called, their gradients
  /// accumulated and not yet applied (0 at a step's boundary; see gradient_accumulation_steps).
  int accumulated_micro_batches() const { return accumulated_micro_batches_; }

  /// How many units the last backward_and_step handed to the host thread before backward
  /// reached the root's end: the units whose host step could overlap the rest of backward (0
  /// where backward_and_step is backward then step).
  std::size_t units_handed_off_in_backward() const { return handed_off_in_backward_; }

  /// Measures the gradient norm at every step even without clipping (for logging).
  void track_grad_norm(bool on) { track_grad_norm_ = on; }
  double last_grad_norm() const { return last_grad_norm_; }
  /// What the checkpoints of the last forward did (their count, and the inputs cpu_checkpointing
  /// moved to host memory).
  const CheckpointCounts& last_checkpoint_counts() const { return last_checkpoint_counts_; }
  const LossScaler<typename precision::loss_scale>& loss_scaler() const { return scaler_; }
  LossScaler<typename precision::loss_scale>& loss_scaler() { return scaler_; }
  const UnitPlan<work_type, device>& units() const { return plan_; }
  /// Unit `unit`'s gradient buckets, in the order they are launched (engine/gradient_buckets.hpp).
  const std::vector<GradientBucket>& gradient_buckets(std::size_t unit) const { return buckets_.at(unit); }
  const std::vector<State>& unit_states() const { return units_; }
  /// Each unit's optimizers, one per sub-group of its optimizer span (StrategyConfig::sub_group_size).
  const std::vector<OptimizerGroups<UnitOptimizer>>& optimizers() const { return optimizers_; }
  /// Calls `f(optimizer, params)` with unit `unit`'s optimizer seen as one over its span
  /// (OptimizerGroupsView: state() as long as the span), its state resident in memory, and
  /// the master weights it updates (the whole unit, or this rank's shard), then puts the state
  /// back where the offload policy keeps it, with what f wrote. Checkpoints read and restore
  /// state through this.
  template <class F>
  decltype(auto) access_optimizer(std::size_t unit, F&& f) {
    POLYSHARD_CHECK(unit < units_.size(), "Engine::access_optimizer: unit ", unit, " of ", units_.size());
    complete_delayed_update();
    return placement_.with_resident(unit, [&]() -> decltype(auto) {
      OptimizerGroupsView<UnitOptimizer> view(optimizers_[unit], Behaviour::optimizer_params(units_[unit]));
      auto call = [&]() -> decltype(auto) { return f(view, Behaviour::optimizer_params(units_[unit]).span()); };
      return detail::then_put_back(call, [&] { view.write_back(); }, [] {});
    });
  }
  /// Whether the master weights and optimizer state live in host memory (a host engine, or an
  /// offloaded device engine): access_optimizer_on_host then hands out the engine's own memory.
  static constexpr bool masters_on_host = std::same_as<typename State::step_device, Cpu>;
  /// access_optimizer with the master weights and optimizer state in host memory, where io
  /// reads and writes them: f(opt, params) with `params` a host span and opt.state() host
  /// tensors. State a device keeps is copied down first and, with `write_back`, up again after
  /// f; host state (a host engine's, or a device engine's offloaded state) is handed over as it is.
  template <class F>
  void access_optimizer_on_host(std::size_t unit, bool write_back, F&& f) {
    if constexpr (masters_on_host) {
      access_optimizer(unit, std::forward<F>(f));
    } else {
      POLYSHARD_CHECK(unit < units_.size(), "Engine::access_optimizer_on_host: unit ", unit, " of ", units_.size());
      complete_delayed_update();
      const auto params = Behaviour::optimizer_params(units_[unit]);
      const Tensor<MT> host = host_staging_tensor<MT, device>(params.shape(), MemoryCategory::Other);
      copy_across(params, host);
      OptimizerGroupsView<UnitOptimizer> groups(optimizers_[unit], params);
      HostOptimizerView<OptimizerGroupsView<UnitOptimizer>, device> view(groups);
      f(view, host.span());
      if (write_back) {
        copy_across(host, params);
        view.write_back();
        groups.write_back();
      }
    }
  }
  /// False when the offload policy keeps optimizer state outside memory between steps (NVMe):
  /// state() tensors are then valid only inside access_optimizer.
  static constexpr bool optimizer_state_resident = !S::offload::to_nvme;
  /// False when the master weights live outside memory between steps (offloaded to NVMe, where
  /// they go with the optimizer state unless they are the parameter shards, and with the shards
  /// under OffloadParameters<Nvme>): unit_states()' masters then have elements only inside
  /// access_optimizer.
  static constexpr bool masters_resident =
      !(S::offload::to_nvme && (S::offload::offloads_parameters || !State::master_is_shard));
  /// Sets each parameter's UnitEntry::optimizer: the first of `optimizers` that selects its name.
  static void assign_optimizers(UnitPlan<work_type, device>& plan,
                                const OptimizerList<typename Opt::config_type>& optimizers) {
    POLYSHARD_CHECK(!optimizers.empty(), "Engine: an OptimizerList of no optimizers");
    for (auto& unit : plan.units)
      for (auto& e : unit.entries) {
        const auto first = std::find_if(optimizers.begin(), optimizers.end(),
                                        [&](const auto& o) { return o.selects && o.selects(e.name); });
        POLYSHARD_CHECK(first != optimizers.end(), "Engine: no optimizer of the OptimizerList selects parameter '",
                        e.name, "': every parameter needs one, a frozen one too (refresh_trainable may thaw it)");
        e.optimizer = static_cast<std::size_t>(first - optimizers.begin());
      }
  }
  /// What every unit's optimizer groups share, read from the list (OptimizerListFacts).
  static OptimizerListFacts list_facts(const OptimizerList<typename Opt::config_type>& optimizers) {
    OptimizerListFacts facts;
    for (std::size_t k = 0; k < optimizers.size(); ++k) {
      const Opt empty(optimizers[k].config, 0);
      if (k == 0) facts.reference_lr = empty.lr();
      POLYSHARD_CHECK(facts.reference_lr != 0 || empty.lr() == 0, "Engine: the OptimizerList's first optimizer has ",
                      "lr 0, and optimizer ", k, "'s is not: step(lr) scales the others' learning rates as the ",
                      "first's, so the first needs a configured lr that is not 0");
      const auto state = empty.state();
      facts.most_state_kinds = std::max(facts.most_state_kinds, state.size());
      std::vector<std::string>& mine = facts.kinds.emplace_back();
      for (const auto& [name, tensor] : state) {
        mine.push_back(name);
        if (std::find(facts.state_names.begin(), facts.state_names.end(), name) == facts.state_names.end())
          facts.state_names.push_back(name);
      }
    }
    return facts;
  }
  /// Unit u's optimizer span as (elements, config) runs: each parameter's optimizer's config
  /// (UnitEntry::optimizer), without weight decay over the parameters exempt from it
  /// (Parameter::set_weight_decay(false), PyTorch's parameter group with weight_decay=0). The
  /// flags are read once, here; one run when all parameters are stepped alike.
  static std::vector<std::pair<std::int64_t, typename Opt::config_type>> optimizer_runs(
      State& u, const OptimizerList<typename Opt::config_type>& optimizers) {
    const std::int64_t numel = Behaviour::optimizer_params(u).numel();
    std::vector<std::int64_t> offsets;
    std::vector<std::pair<std::size_t, bool>> keys;  // (optimizer, decays)
    for (const auto& e : u.layout->entries) {
      offsets.push_back(e.offset);
      keys.emplace_back(e.optimizer, e.parameter == nullptr || e.parameter->has_weight_decay());
      if (keys.back().second) continue;
      POLYSHARD_CHECK(without_weight_decay(optimizers[e.optimizer].config).has_value(), "Engine: parameter '",
                      e.name, "' is exempt from weight decay (Parameter::set_weight_decay(false)), and its ",
                      "optimizer's config has no weight_decay to leave out");
    }
    std::vector<std::pair<std::int64_t, typename Opt::config_type>> runs;
    for (const auto& [elements, key] :
         parameter_runs(offsets, keys, optimizer_span_begin(u, numel), numel, std::pair<std::size_t, bool>{0, true})) {
      const auto& config = optimizers[key.first].config;
      runs.emplace_back(elements, key.second ? config : *without_weight_decay(config));
    }
    return runs;
  }
  /// Where unit `unit`'s optimizer span starts in the unit's flat buffer: 0 when the rank
  /// updates the whole unit, the start of its shard otherwise.
  std::int64_t optimizer_offset(std::size_t unit) const {
    return optimizer_span_begin(units_[unit], static_cast<std::int64_t>(optimizers_[unit].numel()));
  }
  /// Where an optimizer span of `numel` elements starts in unit u: a span of the whole unit at
  /// 0, a shard at the shard's start.
  static std::int64_t optimizer_span_begin(const State& u, std::int64_t numel) {
    return numel == u.layout->padded ? 0 : u.shard_begin();
  }
  /// Makes the compute-dtype parameters of every unit equal the master weights again, after
  /// the masters were written (a checkpoint restore), as after an optimizer step: a collective
  /// where the policy all-gathers updated shards.
  void refresh_parameters_from_master() {
    complete_delayed_update();
    for (std::size_t i = 0; i < units_.size(); ++i)  // NVMe: the shard and masters of each in turn
      placement_.with_masters(i, [&] {
        // Masters the sub-groups hold, put together for the write-back.
        const GroupMasters<UnitOptimizer> masters(optimizers_[i], Behaviour::optimizer_params(units_[i]));
        write_back_unit(units_[i], "the refresh of " + unit_name(units_[i]) + " from its master weights");
      });
  }
  Comm& communicator() { return comm_; }
  /// The run-time settings the engine was built with.
  const StrategyConfig& config() const { return config_; }
  /// Records compute and communication spans into `trace` (null: none) from now on.
  void set_trace(Trace* trace) { trace_ = trace; }
  /// The communicator shards are spread over: the whole world, or this rank's group under
  /// HybridShard.
  Comm& shard_comm() { return group_ ? *group_ : comm_; }

  /// The bytes of activations each unit's forward kept for backward, in the last forward with
  /// gradients, by unit (units().units' order): what the memory tracker counted under
  /// Activations from the unit's start to its end, less what the units inside it kept. The
  /// root's figure is the model's own activations outside every other unit (the loss among
  /// them). A checkpointed unit keeps its output only.
  const std::vector<std::int64_t>& activation_bytes() const { return activation_bytes_; }

  /// This rank's calls, bytes sent (the ring formula's prediction) and bytes moved (measured by
  /// the backend) per collective kind, summed over every communicator the engine uses: the
  /// world's, or under hybrid sharding the shard group's and the replicas'.
  CommStats traffic() const {
    CommStats total = comm_.stats();
    if (group_) {
      total += group_->stats();
      total += replicas_->stats();
    }
    return total;
  }
  /// Bytes this rank sent in collectives of `kind` over every communicator the engine uses.
  double bytes_sent(CollectiveKind kind) const { return traffic().bytes_sent(kind); }
  /// Bytes this rank sent over every communicator the engine uses.
  double bytes_sent() const { return traffic().total_bytes_sent(); }
  /// Bytes this rank's backend moved, measured (CommStats::bytes_moved), over every
  /// communicator the engine uses; bytes_sent() is the ring formula's prediction.
  double bytes_moved() const { return traffic().total_bytes_moved(); }
  /// Resets the byte counters of every communicator the engine uses.
  void reset_stats() {
    comm_.stats().reset();
    if (group_) {
      group_->stats().reset();
      replicas_->stats().reset();
    }
  }

 private:
  using Activation = Var<work_type, device>;

  /// However a step ends (applied, skipped or failed), the next forward is micro-batch 1 of the
  /// next step.
  struct NextStep {
    EngineOver& e;
    ~NextStep() {
      ++e.step_number_;
      e.micro_batch_ = 0;
      e.accumulated_micro_batches_ = 0;
    }
  };

  /// Under gradient_accumulation_steps: counts a micro-batch that is not the last of its step
  /// and says so (its step() then updates nothing).
  bool count_micro_batch() {
    if (is_gradient_accumulation_boundary()) return false;
    ++accumulated_micro_batches_;
    return true;
  }

  /// Under pin_memory, a device model's optimizer that steps in host memory keeps its state
  /// page-locked too, as DeepSpeed pins the offloaded optimizer state: `scope` then makes the
  /// host allocations made in it page-locked.
  static void pin_host_optimizer_state([[maybe_unused]] std::optional<HostAllocatorScope>& scope,
                                       [[maybe_unused]] const StrategyConfig& config) {
    if constexpr (!std::same_as<device, Cpu> && std::same_as<typename State::step_device, Cpu>)
      if (config.pin_memory) scope.emplace(Storage<MT, device>::staging_allocator());
  }

  using StepPlan = detail::StepPlan;
  bool needs_grad_norm(double max_grad_norm) const { return std::isfinite(max_grad_norm) || track_grad_norm_; }

  using UnitGradCheck = detail::UnitGradCheck;

  /// Unit i's staged gradients checked for inf and NaN (under a dynamic loss scale), and their
  /// squared norm where the plan needs it, into grad_checks_[i]. Read only: the unscaling and
  /// clipping are one multiplier the update applies to each gradient as it reads it (in fp32,
  /// where a gradient unscaled back into fp16 would underflow), as DeepSpeed's combined scale.
  void check_unit_grads(std::size_t i, const StepPlan& plan) {
    const auto grads = step_grads(units_[i]);
    using G = typename std::decay_t<decltype(grads)>::value_type;
    UnitGradCheck& c = grad_checks_[i];
    if (plan.needs_norm) c.squares = squared_norm(grads);
    if constexpr (precision::loss_scale::scaled) {
      const bool norm_tells = plan.needs_norm && norm_sees_nonfinite<G, typename State::step_device>;
      c.overflow = norm_tells ? !std::isfinite(c.squares) : has_nonfinite(grads);
    }
  }

  /// Applies the optimizer to unit i's staged, checked gradients, each times `grad_scale` as it
  /// is read (no write-back).
  void update_unit(std::size_t i, double lr, double grad_scale) {
    optimizers_[i].set_lr(lr);
    step_unit(i, step_grads(units_[i]), grad_scale, /*fuse_compute_copy=*/true);
  }

  /// Unit i's optimizer step over `grads`, sub-group by sub-group, each sub-group's state (and
  /// masters it holds) brought in before its step and sent back after it where the offload
  /// policy keeps them away (NVMe). With `fuse_compute_copy`, an optimizer that can writes the compute copy in the
  /// same pass.
  template <class Grads>
  void step_unit(std::size_t i, const Grads& grads, double grad_scale, bool fuse_compute_copy) {
    State& u = units_[i];
    OptimizerGroups<UnitOptimizer>& groups = optimizers_[i];
    const auto around = [&](std::size_t group, const auto& step) {
      placement_.fetch_group(i, group);  // NVMe: the group's state read back, the next group's on its way
      bool current = step();
      // Masters the group holds leave with it (NVMe): its slice of the compute copy is cast now.
      if constexpr (requires(State& s) { Behaviour::compute_copy(s); }) {
        if (!current && groups.hold_masters()) {
          cast_across(groups.master(group),
                      Behaviour::compute_copy(u).flat_view(groups.offset(group), groups.numel(group)));
          current = true;
        }
      }
      placement_.store_group(i, group);  // NVMe: written back behind the next group's step
      return current;
    };
    bool current = false;
    if constexpr (fuses_compute_copy) {
      if (fuse_compute_copy)
        current = u.step_groups(groups, Behaviour::optimizer_params(u), grads, grad_scale, around,
                                Behaviour::compute_copy(u));
      else current = u.step_groups(groups, Behaviour::optimizer_params(u), grads, grad_scale, around);
    } else {
      current = u.step_groups(groups, Behaviour::optimizer_params(u), grads, grad_scale, around);
    }
    if (current) u.compute_copy_current = true;
  }

  /// Makes unit u's parameters (on every rank, where the policy all-gathers them) equal its
  /// updated master weights: the behaviour's after_step, a collective named `site`.
  void write_back_unit(State& u, const std::string& site) {
    CallSite named(site);
    Behaviour::after_step(u, shard_comm());
    u.compute_copy_current = false;
  }

  /// Casts unit u's updated master weights into its compute-dtype copy (from the host to the
  /// device where the optimizer is offloaded), unless the update wrote it or the masters are
  /// that copy: the part of the write-back that is the rank's own, which the host thread does
  /// for the units it updated while backward goes on. after_step then leaves it alone.
  void write_compute_copy(State& u) {
    if constexpr (requires { Behaviour::compute_copy(u); } && !State::master_is_full && !State::master_is_shard) {
      if (u.compute_copy_current) return;
      cast_across(u.master, Behaviour::compute_copy(u));
      u.compute_copy_current = true;
    }
  }

  /// The step after every unit's gradients were staged and checked (grad_checks_): the
  /// overflow decision across ranks, the global norm and clipping, the updates not yet applied
  /// and the write-back of every unit, in unit order (the write-back may be a collective).
  bool finish_step(const StepPlan& plan) {
    if constexpr (precision::loss_scale::scaled) {
      // A step that overflowed is skipped whole.
      float overflow = 0;
      for (const UnitGradCheck& c : grad_checks_)
        if (c.overflow) overflow = 1;
      CallSite site(step_site("the overflow check"));
      all_reduce_host<device>(shard_comm(), std::span<float>(&overflow, 1));
      if (!scaler_.update(overflow > 0)) {
        last_grad_norm_ = std::numeric_limits<double>::quiet_NaN();
        zero_grad();
        return false;
      }
    }
    // What every gradient is multiplied by as the update reads it: the loss scale undone, then
    // the clipping coefficient.
    double grad_scale = plan.inv_loss_scale;
    if (plan.needs_norm) {
      double squares = 0;
      for (const UnitGradCheck& c : grad_checks_) squares += c.squares;
      if constexpr (sharding::shards_optimizer_state) {
        CallSite site(step_site("the gradient norm"));
        all_reduce_host<device>(shard_comm(), std::span<double>(&squares, 1));
      }
      last_grad_norm_ = std::sqrt(squares) * plan.inv_loss_scale;
      const double coefficient = clip_coefficient(last_grad_norm_, plan.max_grad_norm);  // applied when it shrinks
      if (std::isfinite(plan.max_grad_norm) && coefficient < 1.0) {
        POLYSHARD_CHECK(!plan.updated_early, "Engine: clipping after the units were updated");
        grad_scale *= coefficient;
      }
    }
    if (config_.delayed_parameter_update) {
      launch_delayed_update(plan.lr, grad_scale);
      zero_grad();
      return true;
    }
    for (std::size_t i = 0; i < units_.size(); ++i) {
      State& u = units_[i];
      if (!plan.updated_early) {
        placement_.fetch(i);  // NVMe parameters: unit i's shard read back, unit i+1's on its way
        update_unit(i, plan.lr, grad_scale);
      }
      {
        Trace::Span span(trace_, "write back unit " + std::to_string(i), "communication", 1);
        write_back_unit(u, step_site("the parameter update of " + unit_name(u)));
      }
      if (!plan.updated_early) placement_.store(i);  // NVMe parameters: the shard written back behind
    }
    placement_.settle();
    zero_grad();
    return true;
  }

  /// Whether backward_and_step hands each unit's step to a host thread as its gradients land:
  /// where the optimizer steps on the host from memory (not NVMe), each group steps its own
  /// shards (not HybridShard, whose replicas sum them in the step) and the step is not delayed.
  bool steps_in_backward() const {
    if constexpr (S::offload::offloads_optimizer && !S::offload::to_nvme && !sharding::hybrid)
      return !config_.delayed_parameter_update;
    return false;
  }

  using Landing = detail::Landing;

  /// How many backwards unit `index` goes through: one per forward run (the root: one).
  int backwards_expected(std::size_t index) const {
    if (index == 0) return 1;
    return static_cast<int>(std::count(forward_order_.begin(), forward_order_.end(), index));
  }

  /// Hands every unit whose backward is done and whose reductions have all completed to the
  /// host thread (inside backward_and_step).
  void land_ready_units() {
    if (!landing_) return;
    for (std::size_t i = 0; i < units_.size(); ++i)
      if (!landing_->landed[i] && landing_->backwards_done[i] == backwards_expected(i) && !unit_in_flight(i)) land(i);
  }

  /// On the host thread, behind the units landed before: unit i's reduced gradients copied to
  /// the host (after what this thread's device stream has done so far), checked, and, where
  /// the plan allows, the unit updated.
  void land(std::size_t i) {
    landing_->landed[i] = 1;
    if (landing_->backwards_done[0] == 0) ++handed_off_in_backward_;
    host_steps_->submit([this, i, plan = landing_->plan, point = DeviceHandoff<device>::mark(),
                         tracker = &current_memory_tracker()] {
      TrackerScope counted(*tracker);
      typename DeviceHandoff<device>::Enter ordered(point);
      Trace::Span span(trace_, "host step unit " + std::to_string(i), "compute", 2);
      // Each part as a span of its own inside the unit's: where an offloaded step's time goes.
      {
        Trace::Span part(trace_, "stage gradients", "compute", 2);
        stage_step_grads(units_[i]);
      }
      {
        Trace::Span part(trace_, "check gradients", "compute", 2);
        check_unit_grads(i, plan);
      }
      if (plan.updated_early) {
        {
          Trace::Span part(trace_, "update", "compute", 2);
          update_unit(i, plan.lr, plan.inv_loss_scale);  // no clipping, no dynamic scale: the plan says so
        }
        Trace::Span part(trace_, "write compute copy", "compute", 2);
        write_compute_copy(units_[i]);
      }
    });
  }

  /// Copies unit u's reduced gradients to where its optimizer steps, when that is not where
  /// they were reduced (optimizer state offloaded to the host).
  void stage_step_grads(State& u) {
    if constexpr (!std::same_as<typename State::step_device, device>) {
      const auto g = Behaviour::optimizer_grads(u);
      if (!u.step_grads.defined())
        u.step_grads = detail::buffer<RT, typename State::step_device>(u, g.numel(), MemoryCategory::Gradients);
      copy_across(g, u.step_grads);
    }
  }
  /// The gradients unit u's optimizer reads, where it steps (after stage_step_grads).
  auto step_grads(State& u) {
    if constexpr (std::same_as<typename State::step_device, device>) return Behaviour::optimizer_grads(u);
    else return u.step_grads;
  }

  Activation around(const void* module, std::type_index type, const std::function<Activation(const Activation&)>& body,
                    const Activation& x) override {
    const ModuleKey key{module, type};
    auto it = plan_.unit_of_module.find(key);
    if (it == plan_.unit_of_module.end()) {
      if (!in_backward_ && plan_.checkpointed_modules.count(key)) return checkpoint(body, x);
      return body(x);
    }
    const std::size_t index = it->second;
    State& u = units_[index];
    gather(index);
    if (!in_backward_) {
      running_order_.push_back(index);
      prefetch_after(index, +1);
    }
    // Backward reaches `out` before the unit's own nodes and `in` after all of them.
    ActivationCount count(*this, index);
    Activation in = boundary(x, "unit input", [this, index] { post_backward(units_[index]); });
    Activation y = (u.layout->checkpointed && !in_backward_) ? checkpoint(body, in) : body(in);
    Activation out = boundary(y, "unit output", [this, index] {
      gather(index);
      prefetch_after(index, -1);
      Behaviour::begin_backward(units_[index]);
      arm_buckets(index);
    });
    count.done();
    if (sharding::reshard_after_forward && !in_backward_) Behaviour::release(u);
    return out;
  }

  bool leaves_plain(const void* module, std::type_index type) const override {
    const ModuleKey key{module, type};
    return !plan_.unit_of_module.count(key) && !plan_.checkpointed_modules.count(key);
  }

  /// Counts what unit `index`'s forward keeps under Activations (activation_bytes()), from
  /// construction to done(), when it runs with gradients outside backward (a checkpointed
  /// unit's recomputation is not counted again).
  class ActivationCount {
   public:
    ActivationCount(EngineOver& e, std::size_t index)
        : engine_(e), index_(index), counting_(grad_enabled() && !e.in_backward_) {
      if (!counting_) return;
      if (index == 0) engine_.nested_activations_.clear();  // a forward that threw left some
      engine_.activation_bytes_.resize(engine_.units_.size());
      start_ = current_memory_tracker().current(MemoryCategory::Activations);
      engine_.nested_activations_.push_back(0);
    }
    void done() {
      if (!counting_) return;
      const std::int64_t kept = current_memory_tracker().current(MemoryCategory::Activations) - start_;
      engine_.activation_bytes_[index_] = kept - engine_.nested_activations_.back();
      engine_.nested_activations_.pop_back();
      if (!engine_.nested_activations_.empty()) engine_.nested_activations_.back() += kept;
    }

   private:
    EngineOver& engine_;
    std::size_t index_;
    bool counting_;
    std::int64_t start_ = 0;
  };

  /// An identity node that runs `hook` when backward passes through it.
  template <class Hook>
  static Activation boundary(const Activation& x, const char* op, Hook hook) {
    auto node = std::make_shared<Node<work_type, device>>();
    node->value = x.value();
    node->op = op;
    if (grad_enabled()) {
      node->requires_grad = true;
      node->inputs.push_back(x.node());
      node->backward = [hook](Node<work_type, device>& self) {
        hook();
        if (self.inputs[0]->requires_grad) accumulate_into(self.inputs[0]->sink(), self.grad);
      };
    }
    return Activation(std::move(node));
  }

  /// FairScale's sync_models_at_startup: rank 0's whole parameters overwrite every other
  /// rank's (and their master copies), for when ranks were not initialised alike. Sharded
  /// parameters are built as shards of one deterministic init, so there is nothing to sync.
  void sync_from_rank0(State& u) {
    if constexpr (!sharding::shards_parameters) {
      if (comm_.size() == 1) return;
      const auto before = u.full.to_vector();
      CallSite site("the start-up sync of " + unit_name(u) + " from rank 0");
      comm_.broadcast(u.full.span(), 0);
      const auto after = u.full.to_vector();
      if (std::equal(before.begin(), before.end(), after.begin(), [](CT a, CT b) { return a == b; })) return;
      // This rank was initialised differently: take rank 0's parameters, masters included
      // (a separate master copy can only be re-derived from them at compute precision).
      u.refresh_work_from_full();
      if constexpr (!State::master_is_full) {
        const std::int64_t begin = sharding::shards_optimizer_state ? u.shard_begin() : 0;
        cast_across(u.full.flat_view(begin, u.master.numel()), u.master);
      }
    }
  }

  /// Gathers unit `index` if it is not (a span in the trace when it was not), completing its
  /// prefetch if one is in flight.
  void gather(std::size_t index) {
    State& u = units_[index];
    if constexpr (sharding::shards_parameters) {
      const auto at = std::find_if(prefetched_.begin(), prefetched_.end(),
                                   [index](const Prefetched& p) { return p.unit == index; });
      if (at != prefetched_.end()) {
        Trace::Span span(trace_, "wait for prefetched unit " + std::to_string(index), "communication", 1);
        order_after(at->handle);
        prefetched_.erase(at);
        finish_gather(index);
        return;
      }
    }
    if (u.gathered) return;
    Trace::Span span(trace_, "gather unit " + std::to_string(index), "communication", 1);
    CallSite site(gather_site(u));
    if constexpr (sharding::shards_parameters) {
      CommHandle handle = start_gather(index);
      order_after(handle);
      finish_gather(index);
    } else {
      Behaviour::gather(u, shard_comm());
    }
  }

  /// Issues unit `index`'s all-gather, its parameter shard in memory until finish_gather.
  CommHandle start_gather(std::size_t index) {
    placement_.acquire_parameters(index);  // NVMe: the shard read in
    return Behaviour::start_gather(units_[index], shard_comm());
  }
  /// Once unit `index`'s all-gather completed (or the device was ordered after it): its view
  /// current, and its shard no longer needed in memory.
  void finish_gather(std::size_t index) {
    Behaviour::finish_gather(units_[index]);
    placement_.release_parameters(index);  // NVMe: dropped; the file holds the same values
  }

  /// Orders what the engine does next after the collective behind `handle`: on a device, the
  /// compute stream waits for it and the host goes on (its wait, which sees a failure or a
  /// timeout, comes at the end of the forward or backward: wait_on_host_for_ordered); on the
  /// host, here.
  void order_after(CommHandle& handle) {
    if constexpr (!std::same_as<device, Cpu>) {
      if (handle.wait_on_device()) {
        ordered_.push_back(handle);
        return;
      }
    }
    handle.wait();
  }

  /// Waits on the host for the collectives the device was ordered after, in the order issued;
  /// when one failed, waits for the others all the same, then throws the first error.
  void wait_on_host_for_ordered() {
    if (std::exception_ptr failed = wait_for_all(ordered_)) {
      settle_in_flight();
      std::rethrow_exception(failed);
    }
  }

  /// Waits for every handle in `handles`, in order, and empties it: the first failure, after
  /// waiting for the others all the same (null when none failed).
  static std::exception_ptr wait_for_all(std::vector<CommHandle>& handles) {
    std::exception_ptr failed;
    for (CommHandle& h : handles) {
      try {
        h.wait();
      } catch (...) {
        if (!failed) failed = std::current_exception();
      }
    }
    handles.clear();
    return failed;
  }

  /// Issues the gathers of the units that run after unit `index` (direction +1: in forward;
  /// -1: in backward) in the last recorded forward, skipping those already gathered, while the
  /// units gathered ahead stay within the prefetch budget (prefetch_budget_elements; the first
  /// unit ahead whatever its size). Every rank records the same order and has the same units,
  /// so every rank issues the same collectives.
  void prefetch_after(std::size_t index, int direction) {
    if constexpr (sharding::shards_parameters) {
      if (!config_.prefetch) return;
      const auto at = std::find(forward_order_.begin(), forward_order_.end(), index);
      if (at == forward_order_.end()) return;
      const std::int64_t budget = prefetch_budget_elements(config_);
      std::int64_t ahead = 0;
      for (const Prefetched& p : prefetched_) ahead += units_[p.unit].layout->padded;
      const auto end = static_cast<std::ptrdiff_t>(forward_order_.size());
      for (auto position = (at - forward_order_.begin()) + direction; position >= 0 && position < end;
           position += direction) {
        const std::size_t next = forward_order_[static_cast<std::size_t>(position)];
        const bool in_flight = std::any_of(prefetched_.begin(), prefetched_.end(),
                                           [next](const Prefetched& p) { return p.unit == next; });
        if (units_[next].gathered || in_flight) continue;
        const std::int64_t size = units_[next].layout->padded;
        if (!prefetched_.empty() && ahead + size > budget) {
          // NVMe: the next gather's shard read in while this unit computes, if a buffer is free,
          // so that its gather waits for the file only when the read is slower than a unit.
          placement_.read_parameters_ahead(next);
          return;
        }
        if (!placement_.may_read_parameters_ahead(next)) return;  // NVMe: every buffer holds a shard
        Trace::Span span(trace_, "prefetch unit " + std::to_string(next), "communication", 1);
        CallSite site(gather_site(units_[next]));  // the same collective as the gather it replaces
        prefetched_.push_back(Prefetched{next, start_gather(next)});
        ahead += size;
      }
    }
  }

  /// Completes and frees the prefetches the model did not use (its order changed), so that
  /// nothing reads the parameter shards while the optimizer writes them, and waits on the host
  /// for every collective the device was ordered after (order_after): the forward's end without
  /// gradients, the backward's end, the step's start.
  void drain_prefetch() {
    if constexpr (sharding::shards_parameters) {
      while (!prefetched_.empty()) {
        order_after(prefetched_.front().handle);
        const std::size_t index = prefetched_.front().unit;
        prefetched_.pop_front();
        finish_gather(index);
        Behaviour::release(units_[index]);
      }
    }
    wait_on_host_for_ordered();
  }

  /// The gradients a delayed update steps with, where it steps.
  using StepGrads =
      Tensor<typename std::decay_t<decltype(Behaviour::optimizer_grads(std::declval<State&>()))>::value_type,
             typename State::step_device>;

  /// Starts the optimizer update of this step's gradients, each times `grad_scale` (the loss
  /// scale undone and the clipping), on a host thread, at learning rate `lr`, and returns:
  /// forward and backward go on with the parameters as they are, and the next step() completes
  /// it (complete_delayed_update). The update reads the gradients where the optimizer steps:
  /// offloaded, the host copy the next backward does not write (stage_step_grads); else a copy
  /// of them, taken here.
  void launch_delayed_update(double lr, double grad_scale) {
    if constexpr (S::offload::offloads_optimizer && !S::offload::to_nvme) {
      std::vector<StepGrads> grads;
      delayed_grads_.resize(units_.size());
      for (std::size_t i = 0; i < units_.size(); ++i) {
        State& u = units_[i];
        if constexpr (std::same_as<typename State::step_device, device>) {
          const StepGrads live = step_grads(u);
          if (!delayed_grads_[i].defined())
            delayed_grads_[i] = StepGrads::empty(live.shape(), MemoryCategory::Gradients);
          copy_across(live, delayed_grads_[i]);
          grads.push_back(delayed_grads_[i]);
        } else {
          grads.push_back(step_grads(u));
        }
        optimizers_[i].set_lr(lr);
      }
      delayed_ = std::async(std::launch::async, [this, grads = std::move(grads), grad_scale] {
        // Forward reads the compute copy meanwhile: the write-back casts it once forward is done.
        for (std::size_t i = 0; i < units_.size(); ++i)
          step_unit(i, grads[i], grad_scale, /*fuse_compute_copy=*/false);
      });
    }
  }

  /// Whether the behaviour reduces a unit bucket by bucket (reduce_bucket and end_reduction,
  /// the library's own), or the whole unit once its backward is done (reduce: a policy's own
  /// may define it, even over a behaviour it inherits reduce_bucket from; docs/custom-policy.md).
  static constexpr bool reduces_in_buckets =
      !requires(State& u, Comm& c, std::vector<PendingReduction>& p) { Behaviour::reduce(u, c, p, 0); } &&
      requires(State& u, Comm& c, std::vector<PendingReduction>& p) { Behaviour::reduce_bucket(u, c, p, 0, 0); };

  /// Cuts every unit into gradient buckets (gradient_bucket_elements of the config).
  void plan_buckets() {
    const std::int64_t cap = gradient_bucket_elements(config_, sizeof(RT));
    buckets_.clear();
    for (const State& u : units_) {
      std::vector<std::int64_t> offsets, sizes;
      for (const auto& e : u.layout->entries) {
        POLYSHARD_CHECK(offsets.empty() || e.offset >= offsets.back() + sizes.back(),
                        "Engine: the parameters of ", unit_name(u), " are not laid out in order");
        offsets.push_back(e.offset);
        sizes.push_back(e.numel());
      }
      buckets_.push_back(plan_gradient_buckets(offsets, sizes, u.layout->padded, cap));
    }
    progress_.assign(units_.size(), BucketProgress{});
  }

  /// Unit `index`'s backward begins: which of its parameters backward will finish, and where
  /// each parameter's leaf is, so that gradient_final can find it.
  void arm_buckets(std::size_t index) {
    if (!sync_) return;
    const State& u = units_[index];
    std::vector<bool> needs;
    for (std::size_t i = 0; i < u.layout->entries.size(); ++i) {
      const auto& e = u.layout->entries[i];
      needs.push_back(e.numel() > 0 && !u.is_frozen(e) && e.parameter->requires_grad());
      leaf_entries_[e.parameter->leaf().node().get()] = {index, i};
    }
    progress_[index].arm(buckets_[index], needs);
  }

  /// Backward has finished `leaf`'s gradient: launch every bucket of its unit now complete, in
  /// order.
  void gradient_final(Node<work_type, device>& leaf) {
    const auto at = leaf_entries_.find(&leaf);
    if (at == leaf_entries_.end()) return;  // not a parameter of a unit in backward now
    const auto [index, entry] = at->second;
    BucketProgress& progress = progress_[index];
    progress.final(entry);
    for (std::size_t b = progress.launchable(); b < buckets_[index].size(); b = progress.launchable()) {
      launch_bucket(index, b);
      progress.launched();
    }
  }

  /// Issues bucket `b` of unit `index`: zeroes the gradient of every parameter in it that
  /// received none, of the frozen ones and of the padding, then starts its reduction.
  void launch_bucket(std::size_t index, std::size_t b) {
    State& u = units_[index];
    const GradientBucket& bucket = buckets_[index][b];
    u.settle_grads(bucket.begin, bucket.end);
    const std::size_t issued = pending_.size();
    {
      CallSite site(reduction_site(u, b));
      Behaviour::reduce_bucket(u, shard_comm(), pending_, bucket.begin, bucket.end);
    }
    for (std::size_t i = issued; i < pending_.size(); ++i) pending_[i].unit = index;
    if (trace_) {
      // Spans from issue to observed completion, one trace thread per unit.
      const int tid = 100 + static_cast<int>(index);
      const double start = Trace::now_us();
      for (std::size_t i = issued; i < pending_.size(); ++i)
        pending_[i].then = [then = std::move(pending_[i].then), trace = trace_, tid, start] {
          trace->complete("reduce", "communication", start, Trace::now_us(), tid);
          then();
        };
    }
  }

  /// A unit's gradients are complete: reduce what is left of them (or keep accumulating under
  /// no_sync), and free its gathered parameters.
  void post_backward(State& u) {
    const std::size_t index = static_cast<std::size_t>(&u - units_.data());
    if (sync_) reduce_unit(index);
    else u.local_grads = true;
    Behaviour::release(u);
    if (landing_ && sync_) {
      ++landing_->backwards_done[index];
      land_ready_units();
    }
  }

  /// Settles every collective in flight when the scope ends by an exception (one failed inside
  /// backward or reduce()): nothing may stay in flight over this engine's buffers.
  struct SettleOnError {
    EngineOver& e;
    int uncaught = std::uncaught_exceptions();
    ~SettleOnError() {
      if (std::uncaught_exceptions() > uncaught) e.settle_in_flight();
    }
  };

  /// Reduces what is left of unit `index`'s gradients: the buckets backward has not launched, or
  /// the whole unit.
  void reduce_unit(std::size_t index) {
    State& u = units_[index];
    if constexpr (reduces_in_buckets) {
      BucketProgress& progress = progress_[index];
      for (std::size_t b = progress.armed() ? progress.next() : 0; b < buckets_[index].size(); ++b)
        launch_bucket(index, b);
      progress.disarm();
      const std::size_t before = pending_.size();
      Behaviour::end_reduction(u, pending_, unit_in_flight(index));
      for (std::size_t i = before; i < pending_.size(); ++i) pending_[i].unit = index;
    } else {
      u.settle_grads(0, u.layout->padded);
      const std::size_t issued = pending_.size();
      CallSite site(reduction_site(u, buckets_[index].size()));
      Behaviour::reduce(u, shard_comm(), pending_, gradient_bucket_elements(config_, sizeof(RT)));
      for (std::size_t i = issued; i < pending_.size(); ++i) pending_[i].unit = index;
    }
    // The reductions issued before this unit's own complete now, so that a unit's whole
    // gradients (and the copies they are reduced from) live only while its own reductions
    // overlap the next unit's backward: at most two units' at a time, not every unit's until
    // backward ends. Without overlap_comm, this unit's complete too.
    complete_reductions(config_.overlap_comm ? leading_not_of(index) : pending_.size());
  }

  /// Whether a reduction of unit `index` is still in flight.
  bool unit_in_flight(std::size_t index) const {
    return std::any_of(pending_.begin(), pending_.end(), [&](const PendingReduction& p) { return p.unit == index; });
  }
  /// How many reductions in flight, from the first, belong to units other than `index`.
  std::size_t leading_not_of(std::size_t index) const {
    std::size_t n = 0;
    while (n < pending_.size() && pending_[n].unit != index) ++n;
    return n;
  }

  /// Waits for every reduction in flight and completes it; when one failed, waits for the others
  /// all the same (they use this engine's buffers), then throws the first error.
  void finish_reductions() {
    Trace::Span span(trace_, "wait for reductions", "communication", 1);
    complete_reductions(pending_.size());
  }

  /// Waits for the first `count` reductions in flight, in the order they were issued, completes
  /// them and forgets them (freeing what they hold); when one failed, waits for every other one
  /// all the same (they use this engine's buffers), then throws the first error.
  void complete_reductions(std::size_t count) {
    std::exception_ptr failed;
    for (std::size_t i = 0; i < count; ++i) {
      try {
        if (failed) pending_[i].handle.wait();
        else {
          order_after(pending_[i].handle);
          pending_[i].then();
        }
      } catch (...) {
        if (!failed) failed = std::current_exception();
      }
    }
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(count));
    if (failed) {
      settle_in_flight();
      std::rethrow_exception(failed);
    }
  }

  /// Waits for the broadcasts in flight (each buffer's broadcasts stay in the order they were
  /// issued), starts every buffer's broadcast from rank 0 (none at world size 1) and, blocking,
  /// waits for them as well; not blocking, wait_for_buffers() ends them.
  void broadcast_buffers(const std::string& site, bool blocking) {
    wait_for_buffers();
    if (comm_.size() > 1) {
      for (detail::ModuleBuffer<Comm>& b : buffers_) {
        CallSite named(site + " ('" + b.name + "')");
        buffer_broadcasts_.push_back(b.broadcast(comm_));
      }
    }
    if (blocking) wait_for_buffers();
  }

  /// Waits for every collective in flight, keeping none of their errors: after an error has
  /// already left the engine, or when it is destroyed.
  void settle_in_flight() noexcept {
    const auto wait_quietly = [](CommHandle& h) {
      try {
        h.wait();
      } catch (...) {  // already reported, or reported by the error in flight
      }
    };
    for (PendingReduction& p : pending_) wait_quietly(p.handle);
    pending_.clear();
    for (Prefetched& p : prefetched_) wait_quietly(p.handle);
    prefetched_.clear();
    for (CommHandle& h : ordered_) wait_quietly(h);
    ordered_.clear();
    for (CommHandle& h : buffer_broadcasts_) wait_quietly(h);
    buffer_broadcasts_.clear();
    if (host_steps_) host_steps_->settle();
  }

  // Call sites: every collective the engine issues names what it is for, which step and which
  // micro-batch, and (for a reduction) which parameters are frozen, so that ranks that diverge
  // (one skips a unit, freezes a parameter the others train, runs an extra micro-batch) stop at
  // the first collective that differs, with an error naming it on every rank.

  static std::string unit_name(const State& u) { return u.layout->display_name(); }
  /// "WHAT (step S)", for the step's own collectives.
  std::string step_site(const std::string& what) const { return what + " (step " + std::to_string(step_number_) + ")"; }
  /// "WHAT (step S, micro-batch M)", or "(step S, evaluation)" for a forward without gradients.
  std::string micro_batch_site(const std::string& what) const {
    std::string when = " (step " + std::to_string(step_number_);
    if (in_backward_ || grad_enabled()) when += ", micro-batch " + std::to_string(micro_batch_);
    else when += ", evaluation";
    if (!sync_) when += ", under no_sync";
    return what + when + ")";
  }
  std::string gather_site(const State& u) const {
    return micro_batch_site(std::string(in_backward_ ? "the backward" : "the forward") + " gather of " + unit_name(u));
  }
  /// The site of bucket `b` of unit u's gradient reduction (b == the unit's bucket count: the
  /// whole unit), naming the parameters in it that are frozen or have no gradient.
  std::string reduction_site(const State& u, std::size_t b) const {
    // A parameter frozen on one rank only, or without a gradient on one rank only (its forward
    // skipped a module), makes the reductions' sites differ even where their sizes are the same.
    const auto& buckets = buckets_[static_cast<std::size_t>(&u - units_.data())];
    const std::size_t first = b < buckets.size() ? buckets[b].first : 0;
    const std::size_t last = b < buckets.size() ? buckets[b].last : u.layout->entries.size();
    std::string frozen, without_gradient;
    for (std::size_t i = first; i < last; ++i) {
      const auto& e = u.layout->entries[i];
      if (e.numel() == 0) continue;
      const bool is_frozen = u.is_frozen(e);
      std::string& list = is_frozen ? frozen : without_gradient;
      if (is_frozen || !e.parameter->leaf().node()->has_grad) list += (list.empty() ? "" : ", ") + e.name;
    }
    std::string what = "the gradient reduction of " + unit_name(u);
    if (b < buckets.size() && buckets.size() > 1)
      what += ", bucket " + std::to_string(b + 1) + " of " + std::to_string(buckets.size());
    if (!frozen.empty()) what += " with frozen parameters " + frozen;
    if (!without_gradient.empty()) what += " with no gradient for " + without_gradient;
    return micro_batch_site(what);
  }

  /// Never computes with requires_grad flags the engine has not read (a parameter frozen behind
  /// its back would still be decayed and moved by its optimizer state): with
  /// auto_refresh_trainable it reads them again, warning where asked, else it refuses.
  void check_trainable() {
    std::string changed;
    for (State& u : units_) {
      const auto* e = u.trainable_changed();
      if (!e) continue;
      const std::string what = std::string("parameter '") + e->name + "' was " +
                               (e->parameter->requires_grad() ? "unfrozen" : "frozen") +
                               " (set_requires_grad) since the engine last read the flags";
      if (!config_.auto_refresh_trainable)
        detail::throw_error("Engine::forward: ", what, ": call refresh_trainable() after changing them, or set "
                            "StrategyConfig::auto_refresh_trainable");
      changed += (changed.empty() ? "" : "; ") + what;
      u.read_trainable();
    }
    if (!changed.empty() && config_.warn_on_trainable_params_changed)
      std::clog << "polyshard: warning: " << changed << ": the engine read the flags again (auto_refresh_trainable)"
                << std::endl;
  }

  bool pending_local_grads() const {
    for (const State& u : units_)
      if (u.local_grads) return true;
    return false;
  }

  Model& model_;
  Comm& comm_;
  std::optional<Comm> group_, replicas_;  // HybridShard only
  StrategyConfig config_;
  UnitPlan<work_type, device> plan_;
  std::vector<State> units_;
  /// The model's buffers, whole on every rank and outside the units.
  std::vector<detail::ModuleBuffer<Comm>> buffers_;
  std::vector<CommHandle> buffer_broadcasts_;  // started by sync_buffers(false), in order
  std::vector<OptimizerGroups<UnitOptimizer>> optimizers_;
  Placement placement_;  // where optimizer state lives between steps
  LossScaler<typename precision::loss_scale> scaler_;
  std::vector<PendingReduction> pending_;
  // Per unit: its gradient buckets, and which of them this backward has finished and launched;
  // where each parameter's leaf is (for the units whose backward began).
  std::vector<std::vector<GradientBucket>> buckets_;
  std::vector<BucketProgress> progress_;
  std::unordered_map<const Node<work_type, device>*, std::pair<std::size_t, std::size_t>> leaf_entries_;
  Trace* trace_ = nullptr;
  // Units in the order the last forward ran them (a model may run them in another order than
  // it declares them), and the gathers issued ahead of their units, in the order issued.
  std::vector<std::size_t> forward_order_, running_order_;
  using Prefetched = detail::PrefetchedGather;
  std::deque<Prefetched> prefetched_;
  // The optimizer update a delayed step left running, and the copies of the gradients it reads
  // (StrategyConfig::delayed_parameter_update).
  std::future<void> delayed_;
  std::vector<StepGrads> delayed_grads_;
  // The host thread backward_and_step hands the units' steps to, what the step learnt of each
  // unit's gradients, and the backward_and_step in progress.
  std::optional<detail::SerialWorker> host_steps_;
  std::vector<UnitGradCheck> grad_checks_;
  std::optional<Landing> landing_;
  std::size_t handed_off_in_backward_ = 0;
  // Collectives the device stream waits for and the host has not yet (order_after).
  std::vector<CommHandle> ordered_;
  bool in_backward_ = false;
  bool sync_ = true;
  std::uint64_t step_number_ = 1;  // the step being accumulated, from 1
  int micro_batch_ = 0;            // forwards with gradients since the last step
  int accumulated_micro_batches_ = 0;  // step() calls since the last update (gradient_accumulation_steps)
  bool track_grad_norm_ = false;
  double last_grad_norm_ = std::numeric_limits<double>::quiet_NaN();
  CheckpointCounts last_checkpoint_counts_{};
  std::vector<std::int64_t> activation_bytes_;     // per unit, the last forward with gradients
  std::vector<std::int64_t> nested_activations_;  // what the units inside each running one kept
};
}  // namespace detail

/// Data-parallel training of `model` on the ranks of `comm` under strategy `S`, with optimizer
/// `Opt` (Sgd<float>, Adam<float>, AdamW<float>, AnyOptimizer<float>) over each unit's master
/// weights.
///
/// The model's device decides where every buffer lives: a host model (Gpt<float>) computes in
/// float with the strategy's 16-bit types as storage; a device model (Gpt<CT, Cuda>, with
/// polyshard/engine/cuda/engine.hpp included) computes in the compute type CT, its units'
/// buffers in device memory, its collectives on a communicator of device buffers (NCCL) and its
/// updates through the fused kernels.
///
/// Per step: zero_grad(); loss = forward([&] { return model.loss(x, y); });
/// backward(loss, weight); step(lr). `weight` is this rank's share of the global batch (its rows
/// over all rows), so that the summed gradients equal the gradient of the global mean loss.
///
/// The model must call the modules that may be units through call() (the nn modules do), and
/// must not move while the engine lives: parameters are bound to the engine's buffers.
///
/// Settings `config` leaves unset take the defaults of S's reference (S::defaults: the gradient
/// buckets of DDP and FSDP are bucket_cap_mb's 25 MiB, ShardedDDP's reduce_buffer_size's 2^23
/// elements, the ZeRO presets' reduce_bucket_size's 2e8); config() shows them filled in.
template <StrategyType S, class Model, Communicator Comm, Optimizer Opt>
class Engine : public detail::EngineOver<canonical_t<S>, Model, Comm, Opt> {
  using Base = detail::EngineOver<canonical_t<S>, Model, Comm, Opt>;

 public:
  Engine(Model& model, Comm& comm, typename Opt::config_type optimizer, StrategyConfig config = {},
         std::uint64_t seed = 0)
      : Base(model, comm, std::move(optimizer), with_reference_defaults<S>(std::move(config)), seed) {}
  /// Several optimizers, each over the parameters it selects (FairScale's list of OSS):
  /// step(lr)'s lr is the first's, the others' scaled alike (OptimizerList). A template, so that
  /// `{}` still means the one optimizer's default config.
  template <std::same_as<OptimizerList<typename Opt::config_type>> List>
  Engine(Model& model, Comm& comm, const List& optimizers, StrategyConfig config = {}, std::uint64_t seed = 0)
      : Base(model, comm, optimizers, with_reference_defaults<S>(std::move(config)), seed) {}
  using strategy = S;
};

}  // namespace polyshard
