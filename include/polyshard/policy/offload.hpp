// OffloadPolicy: where master weights, gradients and optimizer state live between steps.
#pragma once

#include "polyshard/core/device.hpp"
#include "polyshard/policy/family.hpp"

namespace polyshard {

/// NVMe storage as an offload target: files under a directory, read and written with io_uring.
struct Nvme {
  static constexpr const char* name = "nvme";
};

/// Required members of an OffloadPolicy:
///   using family = offload_family;
///   static constexpr bool offloads_optimizer, offloads_parameters, to_nvme;
template <class P>
concept OffloadPolicy = PolicyOf<P, offload_family> && requires {
  { P::offloads_optimizer } -> std::convertible_to<bool>;
  { P::offloads_parameters } -> std::convertible_to<bool>;
  { P::to_nvme } -> std::convertible_to<bool>;
};

template <class Where>
concept OffloadTarget = std::same_as<Where, Cpu> || std::same_as<Where, Nvme>;

/// Everything stays on the compute device.
struct NoOffload {
  using family = offload_family;
  static constexpr bool offloads_optimizer = false;
  static constexpr bool offloads_parameters = false;
  static constexpr bool to_nvme = false;
  static constexpr const char* name = "NoOffload";
};

/// ZeRO-Offload / ZeRO-Infinity for the optimizer: fp32 master weights and optimizer state live
/// on `Where` (host memory, or NVMe files staged through host buffers), and the optimizer step
/// runs on the CPU; FSDP's move_grads_to_cpu.
template <class Where = Cpu>
struct OffloadOptimizer : NoOffload {
  static_assert(OffloadTarget<Where>, "OffloadOptimizer<Where>: 'Where' must be Cpu or Nvme");
  using target = Where;
  static constexpr bool offloads_optimizer = true;
  static constexpr bool to_nvme = std::same_as<Where, Nvme>;
  static constexpr const char* name = to_nvme ? "OffloadOptimizer<Nvme>" : "OffloadOptimizer<Cpu>";
};

/// FSDP's cpu_offload and ZeRO-3's offload_parameters: parameter shards too live on `Where`
/// between uses (the optimizer is offloaded with them).
template <class Where = Cpu>
struct OffloadParameters : OffloadOptimizer<Where> {
  static constexpr bool offloads_parameters = true;
  static constexpr const char* name =
      std::same_as<Where, Nvme> ? "OffloadParameters<Nvme>" : "OffloadParameters<Cpu>";
};

/// ZeRO-3's offload_param alone (DeepSpeed's offload_param without offload_optimizer; Lightning's
/// offload_parameters=True with offload_optimizer=False): parameter shards live in host memory
/// between gathers, while the master weights and optimizer state stay on the compute device, which
/// steps them and writes each updated shard back to the host. Host memory only: parameters on NVMe
/// bring the optimizer with them (OffloadParameters<Nvme>).
template <class Where = Cpu>
struct OffloadParametersOnly : NoOffload {
  static_assert(std::same_as<Where, Cpu>,
                "OffloadParametersOnly<Where>: parameter shards alone go to host memory (Cpu); on NVMe the masters "
                "and optimizer state go with them: use OffloadParameters<Nvme> (ZeRO-Infinity)");
  using target = Where;
  static constexpr bool offloads_parameters = true;
  static constexpr const char* name = "OffloadParametersOnly<Cpu>";
};

}  // namespace polyshard
