// Full state dicts of an Engine's model, whatever its sharding: gathered in memory (host or
// device, as state_dict_to_cpu says), or into one safetensors file written by rank 0, and loaded
// from either by every rank reading only the slices its shards need.
#pragma once

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "polyshard/comm/host_values.hpp"
#include "polyshard/io/sharded_checkpoint.hpp"

namespace polyshard {

/// How a full-weights file names and lays out the model's parameters. The default is
/// polyshard's own: PyTorch's names and nn.Linear's (out, in). Another library's layout (Hugging
/// Face's GPT-2: hf_gpt2_layout()) renames, stores some matrices transposed, and may hold
/// tensors that are not parameters.
struct WeightLayout {
  /// The file's name of a parameter.
  std::function<std::string(const std::string&)> file_name = [](const std::string& name) { return name; };
  /// True for a matrix the file stores as its transpose (Conv1D's (in, out)).
  std::function<bool(const std::string&)> transposed = [](const std::string&) { return false; };
  /// True for a tensor of the file that is not a parameter and is not read (a buffer).
  std::function<bool(const std::string&)> ignored = [](const std::string&) { return false; };
};

namespace detail {
/// Writes units laid out as `units`, whole (`whole[u]` the padded flat masters of unit u), as one
/// safetensors file with PyTorch names and shapes and the `tied` aliases, beside the persistent
/// buffers of `model` under their own names and dtypes, as a PyTorch state dict holds them.
template <class Model, class Plan, class MT>
void write_full_weights(const std::filesystem::path& path, const Model& model, const Plan& units,
                        const std::vector<Tensor<MT>>& whole, const std::vector<TiedParameter>& tied,
                        const std::optional<DType>& dtype, const WeightLayout& layout) {
  SafetensorsWriter writer;
  add_persistent_buffers(writer, model);
  writer.add_metadata("format", "pt");
  for (std::size_t u = 0; u < units.units.size(); ++u)
    for (const auto& e : units.units[u].entries) {
      const Tensor<MT> value = whole[u].flat_view(e.offset, e.numel()).reshape(e.shape);
      const std::string name = layout.file_name(e.name);
      add_stored(writer, name, layout.transposed(e.name) ? value.transpose().contiguous() : value, dtype);
      for (const TiedParameter& tie : tied)
        if (tie.source == e.name) add_stored(writer, tie.alias, value, dtype);
    }
  writer.write(path);
}

/// Walks the parameters of units laid out as `units` against a source of named tensors:
/// `expected(e)` gives the name and shape entry `e` must have there, `found(name)` the shape the
/// source holds under that name, or null. Adds each name to `names`, those the source lacks to
/// `missing`, and those of another shape to `misshaped` ("name (<source> [a, b], model [c, d])").
template <class Plan, class Expected, class Found>
void compare_parameter_shapes(const Plan& units, const char* source, Expected&& expected, Found&& found,
                              std::set<std::string>& names, std::vector<std::string>& missing,
                              std::vector<std::string>& misshaped) {
  for (const auto& unit : units.units)
    for (const auto& e : unit.entries) {
      const auto [name, shape] = expected(e);
      names.insert(name);
      const std::optional<std::vector<std::int64_t>> have = found(name);
      if (!have) missing.push_back(name);
      else if (*have != shape)
        misshaped.push_back(name + " (" + source + " " + shape_string(*have) + ", model " + shape_string(shape) + ")");
    }
}

/// Checks that `file` holds exactly the parameters of units laid out as `units`, with their
/// shapes (and perhaps `tied` aliases), and the persistent buffers of `model` with their shapes
/// and dtypes; throws naming every difference.
template <class Model, class Plan>
void check_full_weights(const SafetensorsFile& file, const Model& model, const Plan& units,
                        const std::vector<TiedParameter>& tied, const std::filesystem::path& path,
                        const WeightLayout& layout) {
  std::vector<std::string> missing, unexpected, misshaped, wrong_buffers;
  std::set<std::string> names = compare_persistent_buffers(model, &file, missing, wrong_buffers);
  const auto expected = [&](const auto& e) {
    std::vector<std::int64_t> shape(e.shape.begin(), e.shape.end());
    if (layout.transposed(e.name) && shape.size() == 2) std::swap(shape[0], shape[1]);
    return std::pair(layout.file_name(e.name), shape);
  };
  const auto found = [&](const std::string& name) -> std::optional<std::vector<std::int64_t>> {
    if (const SafetensorsTensorInfo* t = file.find(name)) return t->shape;
    return std::nullopt;
  };
  compare_parameter_shapes(units, "file", expected, found, names, missing, misshaped);
  for (const SafetensorsTensorInfo& t : file.tensors()) {
    const bool alias = std::any_of(tied.begin(), tied.end(), [&](const TiedParameter& tie) { return tie.alias == t.name; });
    if (!names.count(t.name) && !alias && !layout.ignored(t.name)) unexpected.push_back(t.name);
  }
  const std::string prefix = "load_full_weights: '" + path.string() + "' does not match the model:";
  std::string msg = mismatch_message(prefix, "tensors", missing, unexpected, misshaped);
  if (!wrong_buffers.empty())
    msg += (msg.empty() ? prefix : "") + " different shapes or dtypes for buffers " + join_names(wrong_buffers) + ";";
  if (!msg.empty()) throw Error(msg);
}

/// Reads the master weights `params` of `unit` (the rank's span from element `offset`) from
/// `file`; padding is zeroed.
template <class Layout, class MT>
void read_full_unit(const SafetensorsFile& file, const Layout& unit, std::int64_t offset, std::span<MT> params,
                    const WeightLayout& layout) {
  std::fill(params.begin(), params.end(), MT(0));
  for (const SpanSlice& s : span_slices(unit, offset, std::int64_t(params.size()))) {
    const std::string& name = unit.entries[s.entry].name;
    const auto out = params.subspan(static_cast<std::size_t>(s.span_offset), static_cast<std::size_t>(s.end - s.begin));
    if (layout.transposed(name)) {
      // Stored (in, out): this rank's slice of the (out, in) matrix is strided in the file, so
      // the matrix is read whole and transposed.
      const Tensor<MT> matrix = file.read<MT>(layout.file_name(name), DTypeConversion::convert).transpose().contiguous();
      std::copy_n(matrix.data() + s.begin, out.size(), out.begin());
    } else {
      file.read_elements(layout.file_name(name), static_cast<std::uint64_t>(s.begin), out, DTypeConversion::convert);
    }
  }
}
}  // namespace detail

/// One parameter of `engine`'s model, whole, from the master weights (the most precise copy
/// under every precision): what a full state dict (FSDP's state_dict()) returns for it.
/// StrategyConfig::state_dict_to_cpu chose its memory: host memory (true, the default), or the
/// memory of the model's device (false; on a host model, host memory too). A view of its unit's
/// gathered buffer, which training does not change.
template <FloatElement T, Device D>
struct FullParameter {
  std::string name;
  bool in_host_memory = true;
  Tensor<T, Cpu> host;  ///< the values, where in_host_memory; empty otherwise
  Tensor<T, D> device;  ///< the values, where not in_host_memory; empty otherwise

  const Shape& shape() const { return in_host_memory ? host.shape() : device.shape(); }

  /// The values in host memory, copied down where they are on the device.
  Tensor<T, Cpu> to_host() const {
    if (in_host_memory) return host;
    Tensor<T, Cpu> out = Tensor<T, Cpu>::empty(device.shape(), MemoryCategory::Other);
    copy_across(device, out);
    return out;
  }
};

namespace detail {
/// Whether `engine`'s full state dicts go to host memory: state_dict_to_cpu, or a host model.
template <class E>
bool state_dict_in_host_memory(const E& engine) {
  return std::same_as<typename E::device, Cpu> || engine.config().state_dict_to_cpu;
}

/// Unit `unit`'s master weights, whole (padded), gathered from every rank's part: into `host`
/// (`to_host`), or else into `device`, in the memory of the engine's device, without passing
/// through the host when the masters are there. `may_alias`: where the masters are whole in host
/// memory and stay there (not swapped out to NVMe after the access), `host` may be a view of the
/// engine's own (for a save, which ends before the next step). A collective.
template <class E>
void gather_masters(E& engine, std::size_t unit, bool to_host, bool may_alias, Tensor<typename E::MT>& host,
                    Tensor<typename E::MT, typename E::device>& device) {
  using MT = typename E::MT;
  using D = typename E::device;
  const auto& layout = engine.units().units[unit];
  const std::int64_t padded = layout.padded;
  auto& comm = engine.shard_comm();
  const int ranks = comm.size();
  // Shards of their own sizes (ShardPartition::whole_parameters) come each from its rank, into
  // `whole`, which holds this rank's already.
  const auto broadcast_shards = [&](const auto& whole, auto&& broadcast) {
    for (int r = 0; r < ranks; ++r)
      if (layout.shard_size(r, ranks) > 0)
        broadcast(whole.flat_view(layout.shard_begin(r, ranks), layout.shard_size(r, ranks)).span(), r);
  };
  engine.access_optimizer(unit, [&](auto&, auto params) {
    const std::int64_t mine = layout.shard_begin(comm.rank(), ranks), count = static_cast<std::int64_t>(params.size());
    // (With uneven shards, one rank may hold a unit whole while the others hold none of it.)
    const bool whole = layout.bounds.empty() && count == padded;
    if constexpr (E::masters_on_host) {
      if (whole && may_alias && to_host && E::masters_resident) {
        host = Tensor<MT>::wrap(params.data(), Shape{padded});
      } else if (whole) {
        host = Tensor<MT>::from({padded}, std::span<const MT>(params), MemoryCategory::Other);
      } else if (!layout.bounds.empty()) {
        host = Tensor<MT>::empty({padded}, MemoryCategory::Other);
        host.flat_view(mine, count).copy_from(Tensor<MT>::wrap(params.data(), Shape{count}));
        broadcast_shards(host, [&](std::span<MT> part, int root) { broadcast_host<D>(comm, part, root); });
      } else {
        host = Tensor<MT>::empty({padded}, MemoryCategory::Other);
        all_gather_host<D>(comm, std::span<const MT>(params), host.span());
      }
      if (!to_host) device = on_device<D>(std::exchange(host, Tensor<MT>()), MemoryCategory::Other);
    } else {
      // The masters are in the device's memory: gathered there, and copied down if asked.
      device = Tensor<MT, D>::empty({padded}, MemoryCategory::Other);
      if (whole) {
        device.copy_from(Tensor<MT, D>::wrap(params.data(), Shape{padded}));
      } else if (!layout.bounds.empty()) {
        device.flat_view(mine, count).copy_from(Tensor<MT, D>::wrap(params.data(), Shape{count}));
        broadcast_shards(device, [&](std::span<MT> part, int root) { comm.broadcast(part, root); });
      } else {
        comm.all_gather(std::span<const MT>(params), device.span());
      }
      if (to_host) {
        host = Tensor<MT>::empty({padded}, MemoryCategory::Other);
        copy_across(std::exchange(device, Tensor<MT, D>()), host);
      }
    }
  });
}
}  // namespace detail

/// FSDP's full state dict of `engine`'s parameters: every parameter by name, whole, from the
/// master weights, sorted by name, on every rank (a collective: every rank calls it). In host
/// memory under StrategyConfig::state_dict_to_cpu (the default), one unit at a time passing
/// through the device; without it, in the memory of the model's device. The persistent buffers
/// are whole on every rank already (engine.model()); tied aliases are the caller's to add
/// (tied_parameters), as save_full_weights writes them.
template <class E>
std::vector<FullParameter<typename E::MT, typename E::device>> full_state_dict(E& engine) {
  using MT = typename E::MT;
  using D = typename E::device;
  const bool to_host = detail::state_dict_in_host_memory(engine);
  std::vector<FullParameter<MT, D>> out;
  for (std::size_t u = 0; u < engine.units().units.size(); ++u) {
    Tensor<MT> host;
    Tensor<MT, D> device;
    detail::gather_masters(engine, u, to_host, false, host, device);
    for (const auto& e : engine.units().units[u].entries) {
      FullParameter<MT, D>& p = out.emplace_back();
      p.name = e.name;
      p.in_host_memory = to_host;
      if (to_host) p.host = host.flat_view(e.offset, e.numel()).reshape(e.shape);
      else p.device = device.flat_view(e.offset, e.numel()).reshape(e.shape);
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return out;
}

/// Loads a full state dict held in memory (full_state_dict's, from an engine of any strategy and
/// world size over the same model, its tensors in host or device memory) into `engine`, as FSDP's
/// load_state_dict takes a full one: every rank copies from `dict` only the slices of its own
/// shards into its master weights, then rebuilds its parameters; optimizer state and buffers are
/// untouched. Names and shapes must match the model's parameters exactly; a dict that does not
/// fit changes nothing, on any rank, and the error names every difference. A collective.
template <class E, FloatElement T, Device D>
void load_full_state_dict(E& engine, const std::vector<FullParameter<T, D>>& dict) {
  using MT = typename E::MT;
  std::map<std::string, const FullParameter<T, D>*> by_name;
  std::string error = detail::attempt([&] {
    for (const FullParameter<T, D>& p : dict) by_name.emplace(p.name, &p);
    std::vector<std::string> missing, unexpected, misshaped;
    std::set<std::string> names;
    const auto dims = [](const Shape& s) { return std::vector<std::int64_t>(s.begin(), s.end()); };
    const auto expected = [&](const auto& e) { return std::pair(e.name, dims(e.shape)); };
    const auto found = [&](const std::string& name) -> std::optional<std::vector<std::int64_t>> {
      const auto it = by_name.find(name);
      if (it == by_name.end()) return std::nullopt;
      return dims(it->second->shape());
    };
    detail::compare_parameter_shapes(engine.units(), "state dict", expected, found, names, missing, misshaped);
    for (const FullParameter<T, D>& p : dict)
      if (!names.count(p.name)) unexpected.push_back(p.name);
    const std::string msg = detail::mismatch_message(
        "load_full_state_dict: the state dict does not match the model:", "parameters", missing, unexpected, misshaped);
    if (!msg.empty()) throw Error(msg);
  });
  detail::agree_or_throw<typename E::device>(engine.communicator(), error, "load_full_state_dict", "its state dict");
  for (std::size_t u = 0; u < engine.units().units.size(); ++u) {
    const auto& unit = engine.units().units[u];
    engine.access_optimizer_on_host(u, true, [&](auto&, auto params) {
      std::fill(params.begin(), params.end(), MT(0));  // the padding
      const std::int64_t offset = engine.optimizer_offset(u);
      for (const detail::SpanSlice& s : detail::span_slices(unit, offset, std::int64_t(params.size()))) {
        const FullParameter<T, D>& p = *by_name.at(unit.entries[s.entry].name);
        const std::int64_t n = s.end - s.begin;
        Tensor<T> values;
        if (p.in_host_memory) {
          values = p.host.contiguous().reshape(Shape{-1}).flat_view(s.begin, n);
        } else {
          values = Tensor<T>::empty({n}, MemoryCategory::Other);
          copy_across(p.device.contiguous().reshape(Shape{-1}).flat_view(s.begin, n), values);
        }
        const std::span<const T> from = values.span();
        std::transform(from.begin(), from.end(), params.begin() + s.span_offset,
                       [](T x) { return static_cast<MT>(x); });
      }
    });
  }
  engine.refresh_parameters_from_master();
}

/// Gathers the master weights of `engine`'s model (a collective: every rank calls it) and writes
/// them from rank 0 as one safetensors file with PyTorch names and shapes, atomically, with rank
/// 0's persistent buffers: a PyTorch state_dict (FSDP's full state dict with rank0_only). Under
/// state_dict_to_cpu (the default) each unit is gathered into host memory; without it, as FSDP's
/// state_dict() on the compute device, the whole model is gathered into device memory first
/// and rank 0 copies it down to write it. `tied` aliases (tied_parameters<Gpt<float>>::of(model))
/// are written too; stored as `dtype` if given. `layout`: another library's names and matrix
/// layout (hf_gpt2_layout()); polyshard's by default.
template <class E>
void save_full_weights(E& engine, const std::filesystem::path& path, const std::vector<TiedParameter>& tied = {},
                       std::optional<DType> dtype = std::nullopt, const WeightLayout& layout = {}) {
  using MT = typename E::MT;
  using D = typename E::device;
  auto& comm = engine.communicator();
  const bool to_host = detail::state_dict_in_host_memory(engine);
  std::vector<Tensor<MT>> whole(engine.units().units.size());
  std::vector<Tensor<MT, D>> on_device(whole.size());
  for (std::size_t u = 0; u < whole.size(); ++u)
    detail::gather_masters(engine, u, to_host, true, whole[u], on_device[u]);
  std::string error = detail::attempt([&] {
    if (comm.rank() != 0) return;
    if (!to_host)
      for (std::size_t u = 0; u < whole.size(); ++u) {
        whole[u] = Tensor<MT>::empty(on_device[u].shape(), MemoryCategory::Other);
        copy_across(on_device[u], whole[u]);
      }
    detail::write_full_weights(path, engine.model(), engine.units(), whole, tied, dtype, layout);
  });
  detail::agree_or_throw<D>(comm, error, "save_full_weights", path);
}

/// Loads a full state dict (save_full_weights', save_state_dict's, or PyTorch's in nn.Linear
/// layout) into `engine`: every rank reads from the file only the slices of its own shards into
/// its master weights, then rebuilds its parameters, and reads the persistent buffers whole;
/// optimizer state is untouched. Names and shapes (and the buffers' dtypes) must match the model
/// exactly; `tied` aliases may be present and are not read (FSDP's load_full_weights). A
/// collective; an error on one rank is an error on all. `layout`: another library's names and
/// matrix layout (hf_gpt2_layout()); polyshard's by default.
template <class E>
void load_full_weights(E& engine, const std::filesystem::path& path, const std::vector<TiedParameter>& tied = {},
                       const WeightLayout& layout = {}) {
  auto& comm = engine.communicator();
  std::optional<SafetensorsFile> file;
  std::string error = detail::attempt([&] {
    file.emplace(SafetensorsFile::open(path));
    detail::check_full_weights(*file, engine.model(), engine.units(), tied, path, layout);
  });
  detail::agree_or_throw<typename E::device>(comm, error, "load_full_weights", path);

  error = detail::attempt([&] {
    for (std::size_t u = 0; u < engine.units().units.size(); ++u) {
      const auto& unit = engine.units().units[u];
      engine.access_optimizer_on_host(
          u, true,
          [&](auto&, auto params) { detail::read_full_unit(*file, unit, engine.optimizer_offset(u), params, layout); });
    }
    detail::read_persistent_buffers(engine.model(), *file);
  });
  detail::agree_or_throw<typename E::device>(comm, error, "load_full_weights", path);
  engine.refresh_parameters_from_master();
}

}  // namespace polyshard
