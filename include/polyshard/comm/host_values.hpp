// Collectives over a few host values (a step's overflow flag, a sum of squares, a step's
// figures) on any communicator: in place where the communicator moves host memory, staged
// through a device tensor where it moves device buffers (NCCL).
#pragma once

#include <algorithm>
#include <span>
#include <vector>

#include "polyshard/comm/reduce_op.hpp"
#include "polyshard/tensor/tensor.hpp"

namespace polyshard {

/// Whether communicator Comm reads and writes device memory only (NCCL), not host memory.
template <class Comm>
inline constexpr bool moves_device_buffers = requires { requires Comm::device_buffers; };

namespace detail {
template <class Comm, class D>
constexpr void check_host_staging() {
  static_assert(!moves_device_buffers<Comm> || !std::same_as<D, Cpu>,
                "this communicator moves device buffers: name the device to stage host values through "
                "(all_reduce_host<Cuda>(...)), and include its storage header (polyshard/tensor/cuda/storage.hpp)");
}

/// Runs collective(span) over host `values` in place: on them, or on a copy in D's memory,
/// copied back after, where Comm moves device buffers.
template <class D, class Comm, class X, class Collective>
void host_values_in_place(std::span<X> values, Collective collective) {
  check_host_staging<Comm, D>();
  if constexpr (moves_device_buffers<Comm>) {
    auto staged = on_device<D>(Tensor<X>::from({static_cast<std::int64_t>(values.size())}, values),
                               MemoryCategory::Communication);
    collective(staged.span());
    const std::vector<X> host = staged.to_vector();
    std::copy(host.begin(), host.end(), values.begin());
  } else {
    collective(values);
  }
}
}  // namespace detail

/// comm.all_reduce of host `values`, in place. D: the device the communicator's buffers live on
/// (values go there and back when it moves device buffers; ignored otherwise).
template <Device D, class Comm, Element X>
void all_reduce_host(Comm& comm, std::span<X> values, ReduceOp op = ReduceOp::Sum) {
  detail::host_values_in_place<D, Comm>(values, [&](std::span<X> v) { comm.all_reduce(v, op); });
}

/// comm.all_gather of host values: rank r's `mine` lands at all[r * mine.size(), ...). D as for
/// all_reduce_host.
template <Device D, class Comm, Element X>
void all_gather_host(Comm& comm, std::span<const X> mine, std::span<X> all) {
  detail::check_host_staging<Comm, D>();
  if constexpr (moves_device_buffers<Comm>) {
    auto in = on_device<D>(Tensor<X>::from({static_cast<std::int64_t>(mine.size())}, mine),
                           MemoryCategory::Communication);
    auto out = Tensor<X, D>::empty({static_cast<std::int64_t>(all.size())}, MemoryCategory::Communication);
    comm.all_gather(std::span<const X>(in.span()), out.span());
    const std::vector<X> host = out.to_vector();
    std::copy(host.begin(), host.end(), all.begin());
  } else {
    comm.all_gather(mine, all);
  }
}

/// comm.broadcast of host `values` from rank `root`, in place. D as for all_reduce_host.
template <Device D, class Comm, Element X>
void broadcast_host(Comm& comm, std::span<X> values, int root) {
  detail::host_values_in_place<D, Comm>(values, [&](std::span<X> v) { comm.broadcast(v, root); });
}

}  // namespace polyshard
