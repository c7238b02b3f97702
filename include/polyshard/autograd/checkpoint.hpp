// Activation checkpointing: run a block without keeping its activations, and recompute them in
// backward. Costs one more forward of the block; saves everything it would have kept. On a
// device, DeepSpeed's two single-rank settings apply (CheckpointSettings): the one input a
// checkpoint keeps can wait in host memory, and each boundary can wait for the device.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <typeinfo>
#include <utility>

#include "polyshard/autograd/backward.hpp"
#include "polyshard/autograd/ops/accumulate.hpp"

namespace polyshard {

/// What checkpoint() does beyond recomputing: DeepSpeed's activation_checkpointing settings that
/// act within one rank (deepspeed.checkpointing.configure's checkpoint_in_cpu and synchronize).
/// In force on a thread while a CheckpointSettingsScope lives; an engine's forward installs its
/// StrategyConfig's. Each checkpoint reads them when its forward runs, and its recomputation in
/// backward follows what its forward read.
struct CheckpointSettings {
  /// DeepSpeed's cpu_checkpointing. On a device, the input a checkpoint keeps for recomputing is
  /// copied to page-locked host memory once the block's forward is done, and its device memory
  /// is released; backward copies it back on a copy stream while the block after it recomputes,
  /// so that it is there when its own recomputation begins. With polyshard's
  /// single model-parallel rank, the partition DeepSpeed moves is the whole input. The input must
  /// then be read by nothing else in forward after the block, as with DeepSpeed (a stack of
  /// blocks, each reading the previous one's output, keeps to this); a later read is an error
  /// that names this setting. Nothing moves on the host, where activations already are.
  bool cpu_checkpointing = false;
  /// DeepSpeed's contiguous_memory_optimization, with cpu_checkpointing: the inputs a forward
  /// moves to host memory are slices of one page-locked buffer instead of an allocation each.
  /// The buffer is sized by the forward before (the first forward allocates each input on its
  /// own and measures), kept per thread, element type and device, and reused by every forward
  /// after it while no graph still holds a slice; a forward that finds it held, or too small,
  /// places what does not fit on its own and sizes a new one for the next.
  bool contiguous_memory_optimization = false;
  /// DeepSpeed's number_checkpoints, with contiguous_memory_optimization: a forward that finds no
  /// buffer it can use (none yet, one held, or one too small) allocates it at its first moved
  /// input, for this many inputs of that one's size, as DeepSpeed allocates its contiguous
  /// buffers; so the first forward's inputs go in one buffer too. Inputs past that many are placed
  /// on their own. 0: the buffer is sized by the forward before, as described above.
  std::int64_t number_checkpoints = 0;
  /// DeepSpeed's synchronize_checkpoint_boundary: the device is synchronized (all its streams)
  /// as each checkpoint's forward and recomputation begin and end, so that a profile shows each
  /// block's device time between its boundaries.
  bool synchronize_boundary = false;
};

/// What the checkpoints run while a CheckpointSettingsScope lived did.
struct CheckpointCounts {
  std::int64_t checkpoints = 0;         // checkpoint() calls outside any recomputation
  std::int64_t inputs_offloaded = 0;    // inputs moved to host memory (cpu_checkpointing)
  std::int64_t bytes_offloaded = 0;     // their bytes
  std::int64_t inputs_in_one_buffer = 0;  // of those, placed in the one buffer (contiguous_memory_optimization)
};

/// Puts `settings` in force on this thread until the scope ends, and counts what the
/// checkpoints run meanwhile do.
class CheckpointSettingsScope {
 public:
  explicit CheckpointSettingsScope(CheckpointSettings settings)
      : settings_(settings), serial_(++scopes_begun()), saved_(current()) {
    POLYSHARD_CHECK(settings.cpu_checkpointing || !settings.contiguous_memory_optimization,
                    "CheckpointSettings: contiguous_memory_optimization places the inputs cpu_checkpointing moves to "
                    "host memory, and cpu_checkpointing is false: set it too, or leave contiguous_memory_optimization "
                    "false");
    POLYSHARD_CHECK(settings.number_checkpoints >= 0 &&
                        (settings.number_checkpoints == 0 || settings.contiguous_memory_optimization),
                    "CheckpointSettings: number_checkpoints (", settings.number_checkpoints, ") sizes the one buffer ",
                    "of contiguous_memory_optimization, in inputs: a count of at least 1 with it, or 0");
    current() = this;
  }
  ~CheckpointSettingsScope() { current() = saved_; }
  CheckpointSettingsScope(const CheckpointSettingsScope&) = delete;
  CheckpointSettingsScope& operator=(const CheckpointSettingsScope&) = delete;

  const CheckpointSettings& settings() const { return settings_; }
  const CheckpointCounts& counts() const { return counts_; }
  CheckpointCounts& counts() { return counts_; }

  /// The innermost scope of this thread, or null.
  static CheckpointSettingsScope*& current() {
    thread_local CheckpointSettingsScope* scope = nullptr;
    return scope;
  }

  /// The input the last checkpoint in this scope moved to host memory (of whichever element
  /// type and device), which the next one links to: backward brings each back ahead of its use.
  struct Offloaded {
    std::weak_ptr<void> input;
    const std::type_info* type = nullptr;
  };
  Offloaded& last_offloaded() { return last_offloaded_; }
  /// Tells this scope from every other this thread opened (a forward from the one before it).
  std::uint64_t serial() const { return serial_; }

 private:
  static std::uint64_t& scopes_begun() {
    thread_local std::uint64_t count = 0;
    return count;
  }

  CheckpointSettings settings_;
  CheckpointCounts counts_;
  Offloaded last_offloaded_;
  std::uint64_t serial_;
  CheckpointSettingsScope* saved_;
};

/// Device synchronisations this thread made at checkpoint boundaries (synchronize_boundary), ever.
inline std::int64_t& checkpoint_boundary_synchronizations() {
  thread_local std::int64_t count = 0;
  return count;
}

namespace detail {
/// Whether this thread is inside a checkpoint's recomputation, whose graph backward consumes
/// at once: a checkpoint nested there keeps its input where it is.
inline bool& recomputing() {
  thread_local bool inside = false;
  return inside;
}

/// Waits for the device at a checkpoint boundary when the settings say so, and counts it.
template <FloatElement T, Device D>
void checkpoint_boundary(const CheckpointSettings& settings) {
  if (!settings.synchronize_boundary) return;
  Storage<T, D>::synchronize_device();
  ++checkpoint_boundary_synchronizations();
}

/// Where contiguous_memory_optimization puts a forward's moved inputs: slices of one page-locked
/// buffer per thread, element type and device (CheckpointSettings says how it is sized and reused).
template <FloatElement T, Device D>
class ContiguousHostCopies {
 public:
  static ContiguousHostCopies& of_this_thread() {
    thread_local ContiguousHostCopies copies;
    return copies;
  }

  /// Host memory for `n` elements moved by the forward of `scope`: a slice of the buffer where
  /// it fits (`in_buffer` true), else an allocation of its own.
  Tensor<T, Cpu> place(std::int64_t n, const CheckpointSettingsScope& scope, bool& in_buffer) {
    if (scope.serial() != serial_) begin_forward(scope.serial(), scope.settings().number_checkpoints * round_up(n));
    const std::int64_t slot = round_up(n);
    demand_ += slot;
    in_buffer = buffer_.defined() && used_ + n <= buffer_.numel();
    if (!in_buffer) return host_staging_tensor<T, D>(Shape{n}, MemoryCategory::Activations);
    Tensor<T, Cpu> slice = buffer_.flat_view(used_, n);
    used_ = std::min(used_ + slot, buffer_.numel());
    return slice;
  }

 private:
  /// Slices start on 512-byte boundaries, where copies to and from the device run fastest.
  static std::int64_t round_up(std::int64_t n) {
    constexpr std::int64_t per = std::max<std::int64_t>(1, 512 / static_cast<std::int64_t>(sizeof(T)));
    return (n + per - 1) / per * per;
  }
  /// A new forward: the buffer is reused when no slice of it is held and it holds `wanted`
  /// elements (number_checkpoints' slots, else what the forward before asked for), and replaced
  /// by one of that size otherwise.
  void begin_forward(std::uint64_t serial, std::int64_t slots) {
    serial_ = serial;
    const std::int64_t wanted = slots > 0 ? slots : demand_;
    const bool held = buffer_.defined() && buffer_.storage().use_count() > 1;
    if (wanted > 0 && (held || !buffer_.defined() || buffer_.numel() < wanted)) {
      buffer_ = Tensor<T, Cpu>();  // the old one stays only as long as its slices
      buffer_ = host_staging_tensor<T, D>(Shape{wanted}, MemoryCategory::Activations);
    }
    used_ = 0;
    demand_ = 0;
  }

  Tensor<T, Cpu> buffer_;
  std::uint64_t serial_ = 0;
  std::int64_t used_ = 0;    // elements of the buffer this forward placed
  std::int64_t demand_ = 0;  // elements this forward asked for, slices rounded up
};

/// A checkpoint's input moved to host memory (cpu_checkpointing): the host copy of its whole
/// storage, whose device memory is released until backward brings it back. Every view of the
/// storage comes back with it. The copies leave the host free: down on the current stream after
/// the block's forward, up on a copy stream, started while the block after this one recomputes
/// (prefetch_previous), and waited for by the device only where the recomputation reads it.
template <FloatElement T, Device D>
class OffloadedInput {
  using Transfers = PinnedTransfers<D>;

 public:
  /// Moves x's storage to host memory, or returns null where it must stay: memory an activation
  /// does not own (a parameter, a gradient, a buffer the caller wrapped). Records it in `scope`
  /// as the last one moved, after the one moved before it.
  static std::shared_ptr<OffloadedInput> take(const Tensor<T, D>& x, CheckpointSettingsScope* scope) {
    const auto& storage = x.storage();
    if (!storage || !storage->materialized() || storage->numel() == 0 ||
        storage->category() != MemoryCategory::Activations)
      return nullptr;
    auto taken = std::make_shared<OffloadedInput>();
    taken->storage_ = storage;
    const auto n = static_cast<std::int64_t>(storage->numel());
    if (scope && scope->settings().contiguous_memory_optimization) {
      bool in_buffer = false;
      taken->host_ = ContiguousHostCopies<T, D>::of_this_thread().place(n, *scope, in_buffer);
      if (in_buffer) ++scope->counts().inputs_in_one_buffer;
    } else {
      taken->host_ = host_staging_tensor<T, D>(Shape{n}, MemoryCategory::Activations);
    }
    taken->down_ = Transfers::to_host(taken->host_.data(), storage->data(), storage->bytes());
    storage->set_release_reason(
        "it is the input of a checkpointed block, which cpu_checkpointing moved to host memory after the block's "
        "forward until its recomputation in backward; read it inside that block only, or leave cpu_checkpointing "
        "false");
    storage->release_after_current_work();
    if (scope) {
      CheckpointSettingsScope::Offloaded& last = scope->last_offloaded();
      if (last.type == &typeid(OffloadedInput))
        taken->previous_ = std::static_pointer_cast<OffloadedInput>(last.input.lock());
      last = {taken, &typeid(OffloadedInput)};
    }
    return taken;
  }

  ~OffloadedInput() {
    // The host copy goes back to the allocator with this object: no copy may still use it.
    if (down_) Transfers::finish(down_);
    if (up_) Transfers::finish(up_);
  }

  /// Gives the storage device memory again and starts the copy up, unless it has started.
  void prefetch() {
    if (up_) return;
    storage_->materialize();
    up_ = Transfers::to_device_ahead(storage_->data(), host_.data(), storage_->bytes());
  }
  /// The elements on the device for the current stream's later work (prefetching them first if
  /// nothing did).
  void restore() {
    prefetch();
    Transfers::order_after(up_);
    storage_->set_release_reason("");
  }
  /// Starts bringing back the input moved before this one, whose block backward recomputes next
  /// in a stack of blocks, so that its copy runs beside this block's recomputation.
  void prefetch_previous() {
    if (const auto previous = previous_.lock()) previous->prefetch();
  }
  std::int64_t bytes() const { return static_cast<std::int64_t>(storage_->bytes()); }

 private:
  std::shared_ptr<Storage<T, D>> storage_;
  Tensor<T, Cpu> host_;
  typename Transfers::Pending down_, up_;
  std::weak_ptr<OffloadedInput> previous_;
};
}  // namespace detail

/// Computes fn(x) under NoGradGuard and records one node whose backward re-runs fn with
/// recording on, then sweeps back through the recomputed graph. The gradients reaching x and
/// the parameters fn uses are the same as without checkpointing, provided fn is deterministic.
/// `fn` is copied into the graph: capture the module by reference, and keep it alive. The
/// CheckpointSettings in force (none: keep the input where it is, no synchronisation) apply.
template <FloatElement T, Device D, class F>
Var<T, D> checkpoint(F fn, const Var<T, D>& x) {
  CheckpointSettingsScope* scope = detail::recomputing() ? nullptr : CheckpointSettingsScope::current();
  const CheckpointSettings settings = scope ? scope->settings() : CheckpointSettings{};
  if (scope) ++scope->counts().checkpoints;
  Tensor<T, D> y;
  {
    detail::checkpoint_boundary<T, D>(settings);
    NoGradGuard no_grad;
    y = fn(Var<T, D>(x.value(), false)).value();
    detail::checkpoint_boundary<T, D>(settings);
  }
  auto node = std::make_shared<Node<T, D>>();
  node->value = std::move(y);
  node->op = "checkpoint";
  if (!grad_enabled()) return Var<T, D>(std::move(node));
  // fn's parameters need gradients even when x does not, so the node always records.
  node->requires_grad = true;
  node->sweeps_again = true;
  node->inputs.push_back(x.node());
  // On the host the input is in host memory already; on a device, it may go there.
  std::shared_ptr<detail::OffloadedInput<T, D>> offloaded;
  if constexpr (!std::same_as<D, Cpu>) {
    if (settings.cpu_checkpointing) offloaded = detail::OffloadedInput<T, D>::take(x.value(), scope);
    if (offloaded && scope) {
      ++scope->counts().inputs_offloaded;
      scope->counts().bytes_offloaded += offloaded->bytes();
    }
  }
  node->backward = [fn = std::move(fn), offloaded = std::move(offloaded), settings](Node<T, D>& self) {
    Node<T, D>& input = *self.inputs[0];
    if constexpr (!std::same_as<D, Cpu>) {
      if (offloaded) {
        offloaded->restore();
        offloaded->prefetch_previous();
      }
    }
    detail::checkpoint_boundary<T, D>(settings);
    struct Recomputing {
      bool saved = std::exchange(detail::recomputing(), true);
      ~Recomputing() { detail::recomputing() = saved; }
    } recomputing;
    GradModeGuard recording(true);
    Var<T, D> x_again(input.value, input.requires_grad);
    Var<T, D> y_again = fn(x_again);
    if (y_again.requires_grad()) {
      backward(y_again, self.grad);
      if (input.requires_grad && x_again.grad().defined()) accumulate_into(input.sink(), x_again.grad());
    }
    detail::checkpoint_boundary<T, D>(settings);
  };
  return Var<T, D>(std::move(node));
}

}  // namespace polyshard
