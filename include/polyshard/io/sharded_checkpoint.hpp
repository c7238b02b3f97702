// Sharded checkpoints of an Engine: every rank that holds distinct state writes one safetensors
// file of its master weights and optimizer state, rank 0 writes metadata.json, and the directory
// appears atomically. Loading accepts any world size, sharding and wrap policy: each rank reads
// exactly the slices of the files its own shards need (plan_checkpoint_reads). The model's
// persistent buffers, whole on every rank, are rank 0's, in buffers.safetensors.
#pragma once

#include <algorithm>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "polyshard/comm/communicator.hpp"
#include "polyshard/comm/host_values.hpp"
#include "polyshard/io/atomic_directory.hpp"
#include "polyshard/io/checkpoint_io.hpp"
#include "polyshard/io/checkpoint_metadata.hpp"
#include "polyshard/io/safetensors_reader.hpp"
#include "polyshard/io/safetensors_writer.hpp"
#include "polyshard/io/state_dict.hpp"

namespace polyshard {

namespace detail {

/// Adds `t` under `name` and under every tied alias of `name`, stored as `dtype` when given.
template <Element T>
void add_with_aliases(SafetensorsWriter& writer, const std::string& name, const Tensor<T>& t,
                      const std::vector<TiedParameter>& tied, const std::optional<DType>& dtype) {
  add_stored(writer, name, t, dtype);
  for (const TiedParameter& tie : tied)
    if (tie.source == name) add_stored(writer, tie.alias, t, dtype);
}

/// The part of one parameter inside a rank's optimizer span of a unit.
struct SpanSlice {
  std::size_t entry;            ///< index in the unit's entries
  std::int64_t begin, end;      ///< element range within the parameter
  std::int64_t span_offset;     ///< where element `begin` sits in the optimizer span
};

/// The parameters' pieces inside elements [span_begin, span_begin + span_size) of `unit`'s flat
/// buffer (padding holds no parameter and is left out).
template <class Layout>
std::vector<SpanSlice> span_slices(const Layout& unit, std::int64_t span_begin, std::int64_t span_size) {
  std::vector<SpanSlice> out;
  const std::int64_t span_end = span_begin + span_size;
  for (std::size_t i = 0; i < unit.entries.size(); ++i) {
    const auto& e = unit.entries[i];
    const std::int64_t lo = std::max(span_begin, e.offset), hi = std::min(span_end, e.offset + e.numel());
    if (lo < hi) out.push_back({i, lo - e.offset, hi - e.offset, lo - span_begin});
  }
  return out;
}

/// Whether every rank agrees that its part succeeded: each reports `ok`, all learn whether all
/// did. A rank whose part failed must still call this, so that no rank waits in a later
/// collective for one that gave up. D: the device the communicator's buffers live on (the
/// engine's; see all_reduce_host).
template <Device D, Communicator Comm>
bool all_ranks_succeeded(Comm& comm, bool ok) {
  double failures = ok ? 0 : 1;
  all_reduce_host<D>(comm, std::span<double>(&failures, 1), ReduceOp::Sum);
  return failures == 0;
}

/// Runs `part`; returns its error message ("" when it succeeded).
template <class F>
std::string attempt(F&& part) {
  try {
    part();
    return {};
  } catch (const std::exception& e) {
    return e.what();
  }
}

/// Runs `call` of a CheckpointIO, its error prefixed with what it was for (`what`) and the
/// checkpoint: a store of one's own says only what failed in it.
template <class F>
auto through_io(const char* what, const std::filesystem::path& dir, F&& call) {
  try {
    return call();
  } catch (const std::exception& e) {
    throw_error(what, " '", dir.string(), "': ", e.what());
  }
}

/// Throws on every rank when any rank's part failed: the failing ranks with their own message,
/// the others saying that another rank failed.
template <Device D, Communicator Comm>
void agree_or_throw(Comm& comm, const std::string& error, const char* what, const std::filesystem::path& dir) {
  if (all_ranks_succeeded<D>(comm, error.empty())) return;
  if (!error.empty()) throw Error(error);
  throw_error(what, ": another rank failed on '", dir.string(), "' (its error says why); nothing was changed here");
}

/// `s` as rank `root` holds it, on every rank (a checkpoint's temporary directory name).
template <Device D, Communicator Comm>
std::string broadcast_string(Comm& comm, const std::string& s, int root) {
  double n = static_cast<double>(s.size());
  broadcast_host<D>(comm, std::span<double>(&n, 1), root);
  std::vector<double> chars(static_cast<std::size_t>(n));
  if (comm.rank() == root)
    for (std::size_t i = 0; i < chars.size(); ++i) chars[i] = static_cast<unsigned char>(s[i]);
  broadcast_host<D>(comm, std::span<double>(chars), root);
  std::string out(chars.size(), '\0');
  for (std::size_t i = 0; i < chars.size(); ++i) out[i] = static_cast<char>(static_cast<unsigned char>(chars[i]));
  return out;
}

/// How an engine's state splits into files: one file per rank of the sharding group when the
/// strategy shards optimizer state, else one file; ranks of other replica groups write nothing.
template <class E>
struct CheckpointFiles {
  std::size_t count = 1;
  bool writes = false;
  std::size_t mine = 0;

  explicit CheckpointFiles(E& engine) {
    const int shard_world = engine.shard_comm().size(), shard_rank = engine.shard_comm().rank();
    const bool first_replica = engine.communicator().rank() < shard_world;
    if constexpr (E::within_group::shards_optimizer_state) {
      count = static_cast<std::size_t>(shard_world);
      writes = first_replica;
      mine = static_cast<std::size_t>(shard_rank);
    } else {
      writes = first_replica && shard_rank == 0;
    }
  }
};

/// The parameters of checkpoint `m` and where their pieces go, for units laid out as `units`
/// (an engine's UnitPlan) saved into `files` files. A function of the layout alone, so that
/// every strategy over the same model shares its one instance.
template <class Plan>
void describe_layout(CheckpointMetadata& m, const Plan& units, std::size_t files) {
  for (const auto& unit : units.units) {
    std::vector<std::size_t> index;
    for (const auto& e : unit.entries) {
      index.push_back(m.parameters.size());
      m.parameters.push_back({e.name, std::vector<std::int64_t>(e.shape.begin(), e.shape.end()), {}});
    }
    // File f holds rank f's shard (one file: the one rank's, the whole unit).
    const int ranks = static_cast<int>(files);
    for (std::size_t f = 0; f < files; ++f) {
      const int rank = static_cast<int>(f);
      for (const SpanSlice& s : span_slices(unit, unit.shard_begin(rank, ranks), unit.shard_size(rank, ranks)))
        m.parameters[index[s.entry]].pieces.push_back({f, s.begin, s.end});
    }
  }
}

/// Records in `m` the state kinds of each parameter whose optimizer keeps fewer than the
/// checkpoint's (an OptimizerList's SGD beside Adam), so that a load can tell a list that steps
/// it otherwise. `groups`: any unit's optimizer groups (each knows every optimizer's kinds).
template <class Plan, class Groups>
void describe_parameter_state(CheckpointMetadata& m, const Plan& units, const Groups& groups) {
  std::map<std::string_view, const std::vector<std::string>*> kinds;
  for (const auto& unit : units.units)
    for (const auto& e : unit.entries) kinds[e.name] = &groups.kinds_of(e.optimizer);
  for (CheckpointParameter& p : m.parameters)
    if (const auto* k = kinds.at(p.name); k->size() != m.optimizer_state.size()) p.state = *k;
}

/// The metadata of `engine`'s checkpoint: a pure function of its unit layout and strategy.
template <class E>
CheckpointMetadata describe_checkpoint(E& engine, const TrainingState& training) {
  using S = typename E::strategy;
  using MT = typename E::MT;
  const CheckpointFiles<E> files(engine);
  CheckpointMetadata m;
  m.sharding = S::sharding::name;
  m.offload = S::offload::name;
  m.precision = S::precision::name;
  m.wrap = S::wrap::name;
  m.world_size = engine.communicator().size();
  for (std::size_t f = 0; f < files.count; ++f) m.files.push_back(checkpoint_file_name(f, files.count));
  m.master_dtype = std::string(safetensors_dtype_name(to_safetensors_dtype(dtype_v<MT>)));
  m.optimizer_step = engine.optimizers().empty() ? 0 : engine.optimizers()[0].step_count();
  // Every unit's groups know every kind of the list; the names need no state in memory (nothing
  // is read back from NVMe for them).
  m.optimizer_state = engine.optimizers().at(0).state_names();
  const auto& scaler = engine.loss_scaler();
  m.loss_scaled = scaler.scaled();
  m.loss_scale = scaler.scale();
  m.good_steps = scaler.good_steps();
  m.hysteresis_left = scaler.hysteresis_left();
  m.skipped_steps = scaler.skipped_steps();
  m.training = training;
  describe_layout(m, engine.units(), files.count);
  describe_parameter_state(m, engine.units(), engine.optimizers().at(0));
  return m;
}

/// Adds one unit's master weights `params` and the state of `opt` (the rank's span of the unit,
/// starting at element `offset` of its flat buffer) to `writer`, one tensor per parameter piece
/// and kind its optimizer keeps (`groups`: any unit's optimizer groups; under an OptimizerList
/// an SGD's parameters have no Adam moments, which would be zeros).
/// The writer reads them only when it writes, later: `masters_stay` says whether `params` is
/// still valid then (an engine's own host masters), `state_stays` whether opt's state tensors
/// still hold this unit's state then (false: NVMe, paged out again); what does not stay is
/// copied now. A device engine's masters do not stay: access_optimizer_on_host hands out a
/// staging copy that it frees (and the next unit's copy may reuse) when it returns.
template <class Layout, class Groups, class Opt, class MT>
void add_unit_state(SafetensorsWriter& writer, const Layout& unit, const Groups& groups, std::int64_t offset, Opt& opt,
                    std::span<MT> params, bool masters_stay, bool state_stays) {
  const Tensor<MT> master = Tensor<MT>::wrap(params.data(), Shape{static_cast<std::int64_t>(params.size())});
  const auto state = opt.state();
  auto keep = [&](const auto& t, bool stays) { return stays ? t : t.clone(MemoryCategory::Other); };
  for (const SpanSlice& s : span_slices(unit, offset, static_cast<std::int64_t>(params.size()))) {
    const std::string& name = unit.entries[s.entry].name;
    const std::int64_t n = s.end - s.begin;
    writer.add(checkpoint_tensor_name("master", name, s.begin),
               keep(master.flat_view(s.span_offset, n), masters_stay && state_stays));
    const std::vector<std::string>& kinds = groups.kinds_of(unit.entries[s.entry].optimizer);
    for (const auto& [kind, tensor] : state)
      if (std::find(kinds.begin(), kinds.end(), kind) != kinds.end())
        writer.add(checkpoint_tensor_name(kind, name, s.begin), keep(tensor.flat_view(s.span_offset, n), state_stays));
  }
}

/// The file of a checkpoint directory that holds the model's persistent buffers (rank 0's), when
/// it has any.
inline constexpr const char* checkpoint_buffers_file = "buffers.safetensors";

/// Writes the persistent buffers of `model` to `path`, each in its own dtype; no file when it
/// has none.
template <class Model>
void write_checkpoint_buffers(const Model& model, const std::filesystem::path& path) {
  SafetensorsWriter writer;
  writer.add_metadata("format", "polyshard-buffers");
  if (add_persistent_buffers(writer, model) > 0) writer.write(path);
}

/// Compares the persistent buffers of `model` with the tensors of the same names in `file` (none:
/// as if empty): a buffer the file lacks goes to `missing`, one of another shape or dtype to
/// `wrong`, described. Returns the buffers' names.
template <class Model>
std::set<std::string> compare_persistent_buffers(const Model& model, const SafetensorsFile* file,
                                                 std::vector<std::string>& missing, std::vector<std::string>& wrong) {
  std::set<std::string> names;
  visit_buffers(model, [&](const std::string& name, const auto& b) {
    if (!b.persistent()) return;
    names.insert(name);
    using T = parameter_element_t<std::remove_cvref_t<decltype(b)>>;
    const SafetensorsTensorInfo* t = file ? file->find(name) : nullptr;
    if (!t) return missing.push_back(name);
    const Shape& s = b.shape();
    if (!std::equal(t->shape.begin(), t->shape.end(), s.begin(), s.end()) || to_core_dtype(t->dtype) != dtype_v<T>)
      wrong.push_back(name + " (" + std::string(safetensors_dtype_name(t->dtype)) + " " + shape_string(t->shape) +
                      " in the file, " + std::string(dtype_name(dtype_v<T>)) + " " +
                      shape_string(std::vector<std::int64_t>(s.begin(), s.end())) + " in the model)");
  });
  return names;
}

/// Checks that the buffers file of checkpoint `dir` (if any) holds exactly the persistent
/// buffers of `model`, with their shapes and dtypes; returns it open, or nothing when neither
/// has buffers. Throws naming every difference.
template <class Model>
std::optional<SafetensorsFile> check_checkpoint_buffers(const Model& model, const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / checkpoint_buffers_file;
  std::optional<SafetensorsFile> file;
  if (std::filesystem::exists(path)) file = SafetensorsFile::open(path);
  std::vector<std::string> missing, unexpected, wrong;
  const std::set<std::string> mine = compare_persistent_buffers(model, file ? &*file : nullptr, missing, wrong);
  if (file)
    for (const SafetensorsTensorInfo& t : file->tensors())
      if (!mine.count(t.name)) unexpected.push_back(t.name);
  const std::string prefix = "load_checkpoint: the buffers of '" + dir.string() + "' do not match the model's:";
  std::string msg = mismatch_message(prefix, "buffers", missing, unexpected);
  if (!wrong.empty()) msg += (msg.empty() ? prefix : "") + " different shapes or dtypes for " + join_names(wrong) + ";";
  if (!msg.empty()) throw Error(msg);
  return file;
}

/// Reads every persistent buffer of `model` from `file` (a checkpoint's buffers file or a full
/// state dict, checked first).
template <class Model>
void read_persistent_buffers(const Model& model, const SafetensorsFile& file) {
  visit_buffers(model, [&](const std::string& name, const auto& b) {
    if (!b.persistent()) return;
    using T = parameter_element_t<std::remove_cvref_t<decltype(b)>>;
    copy_across(file.read<T>(name), b.value());
  });
}

/// Writes this rank's file: its master weights and optimizer state, one tensor per parameter
/// piece. State kept off memory between steps (NVMe) is copied out while it is resident.
template <class E>
void write_checkpoint_file(E& engine, const std::filesystem::path& path) {
  SafetensorsWriter writer;
  writer.add_metadata("format", "polyshard-shard");
  for (std::size_t u = 0; u < engine.units().units.size(); ++u)
    engine.access_optimizer_on_host(u, false, [&](auto& opt, auto params) {
      add_unit_state(writer, engine.units().units[u], engine.optimizers().at(0), engine.optimizer_offset(u), opt,
                     params, E::masters_on_host, E::optimizer_state_resident);
    });
  writer.write(path);
}

/// Checks that checkpoint `m` fits an engine whose units are laid out as `units` and whose
/// optimizers are `groups` (any unit's): the same parameters with the same shapes, optimizer
/// state of the same names, and each parameter's of the kinds its optimizer keeps. Throws naming
/// every difference.
template <class Plan, class Groups>
void check_checkpoint_fits(const Plan& units, const Groups& groups, const CheckpointMetadata& m,
                           const std::filesystem::path& dir) {
  std::vector<std::string> mine = groups.state_names();
  std::vector<std::string> missing, unexpected, misshaped;
  std::set<std::string> engine_names;
  for (const auto& unit : units.units)
    for (const auto& e : unit.entries) {
      engine_names.insert(e.name);
      const CheckpointParameter* p = m.find(e.name);
      if (!p) missing.push_back(e.name);
      else if (!std::equal(p->shape.begin(), p->shape.end(), e.shape.begin(), e.shape.end()))
        misshaped.push_back(e.name + " (checkpoint " + shape_string(p->shape) + ", model " +
                            shape_string(std::vector<std::int64_t>(e.shape.begin(), e.shape.end())) + ")");
    }
  for (const auto& p : m.parameters)
    if (!engine_names.count(p.name)) unexpected.push_back(p.name);
  if (std::string msg = mismatch_message("load_checkpoint: '" + dir.string() + "' does not match the model:",
                                         "parameters", missing, unexpected, misshaped);
      !msg.empty())
    throw Error(msg);
  std::vector<std::string> theirs = m.optimizer_state;
  std::sort(mine.begin(), mine.end());
  std::sort(theirs.begin(), theirs.end());
  auto list = [](const std::vector<std::string>& v) { return v.empty() ? std::string("none") : join_names(v); };
  if (mine != theirs)
    throw_error("load_checkpoint: '", dir.string(), "' holds optimizer state ", list(theirs),
                " but the engine's optimizer keeps ", list(mine), "; load it with the optimizer it was saved with");
  // Each parameter's own kinds: an OptimizerList that steps a parameter with another optimizer
  // would resume it from state its saved optimizer never kept (zeros).
  const auto kinds = [](std::vector<std::string> v) {
    std::sort(v.begin(), v.end());
    std::string out = v.empty() ? "none" : "";
    for (std::size_t i = 0; i < v.size(); ++i) out += (i ? " " : "") + v[i];
    return out;
  };
  std::vector<std::string> stepped_otherwise;
  for (const auto& unit : units.units)
    for (const auto& e : unit.entries) {
      const std::string want = kinds(groups.kinds_of(e.optimizer)), had = kinds(m.find(e.name)->state.value_or(theirs));
      if (want != had) stepped_otherwise.push_back(e.name + " (saved with " + had + ", now " + want + ")");
    }
  if (!stepped_otherwise.empty())
    throw_error("load_checkpoint: '", dir.string(), "': the engine's optimizers keep other state than the ",
                "checkpoint's for ", join_names(stepped_otherwise),
                "; load it with the OptimizerList it was saved with");
  POLYSHARD_CHECK(parse_safetensors_dtype(m.master_dtype).has_value() &&
                      to_core_dtype(*parse_safetensors_dtype(m.master_dtype)).has_value(),
                  "load_checkpoint: '", dir.string(), "': master dtype '", m.master_dtype, "' is not one polyshard reads");
}

/// Opens the files of checkpoint `m` that this rank's reads touch, once each.
class CheckpointFileSet {
 public:
  CheckpointFileSet(const std::filesystem::path& dir, const CheckpointMetadata& m) : dir_(dir), m_(m) {}

  const SafetensorsFile& file(std::size_t index) {
    auto it = open_.find(index);
    if (it == open_.end()) {
      const std::filesystem::path path = dir_ / m_.files[index];
      POLYSHARD_CHECK(std::filesystem::is_regular_file(path), "load_checkpoint: '", dir_.string(), "' lacks file '",
                      m_.files[index], "' that its metadata lists");
      it = open_.emplace(index, std::make_unique<SafetensorsFile>(SafetensorsFile::open(path))).first;
    }
    return *it->second;
  }

  /// Checks that tensor `name` of file `index` holds `count` elements (one dimension), so that
  /// a file that disagrees with the metadata fails before anything is written.
  void check(std::size_t index, const std::string& name, std::int64_t count) {
    const SafetensorsFile& f = file(index);
    const SafetensorsTensorInfo* t = f.find(name);
    POLYSHARD_CHECK(t, "load_checkpoint: '", f.name(), "' lacks tensor '", name, "' that the metadata places there");
    POLYSHARD_CHECK(t->shape.size() == 1 && t->shape[0] == count, "load_checkpoint: '", f.name(), "': tensor '", name,
                    "' has shape ", detail::shape_string(t->shape), " but the metadata says (", count, ",)");
    const auto dtype = to_core_dtype(t->dtype);
    POLYSHARD_CHECK(dtype && is_float_dtype(*dtype), "load_checkpoint: '", f.name(), "': tensor '", name, "' has dtype ",
                    safetensors_dtype_name(t->dtype), ", not a floating-point type");
  }

 private:
  std::filesystem::path dir_;
  const CheckpointMetadata& m_;
  std::map<std::size_t, std::unique_ptr<SafetensorsFile>> open_;
};

/// Each kind ("master", then the optimizer state names) of every parameter slice this rank's
/// optimizer spans hold, with the reads that fill it.
struct PlannedSlice {
  std::size_t unit;
  SpanSlice slice;
  const CheckpointParameter* parameter;
  std::vector<CheckpointRead> reads;
};

/// What a rank reads of checkpoint `m`: the slices of its optimizer spans (unit u's span starts
/// at element offsets[u] and holds sizes[u] elements), every read checked against the files'
/// headers before anything is written.
struct CheckpointLoadPlan {
  std::unique_ptr<CheckpointFileSet> files;
  std::vector<PlannedSlice> slices;
};

template <class Plan>
CheckpointLoadPlan plan_checkpoint_load(const Plan& units, const std::vector<std::int64_t>& offsets,
                                        const std::vector<std::int64_t>& sizes, const CheckpointMetadata& m,
                                        const std::filesystem::path& dir) {
  CheckpointLoadPlan plan{std::make_unique<CheckpointFileSet>(dir, m), {}};
  std::vector<std::string> kinds{"master"};
  for (const std::string& s : m.optimizer_state) kinds.push_back(s);
  for (std::size_t u = 0; u < units.units.size(); ++u) {
    const auto& unit = units.units[u];
    for (const SpanSlice& s : span_slices(unit, offsets[u], sizes[u])) {
      const CheckpointParameter* p = m.find(unit.entries[s.entry].name);
      PlannedSlice planned{u, s, p, plan_checkpoint_reads(*p, s.begin, s.end)};
      for (const CheckpointRead& r : planned.reads)
        for (const std::string& kind : kinds)
          if (kind == "master" || p->keeps(kind))
            plan.files->check(r.file, checkpoint_tensor_name(kind, p->name, r.piece_begin), r.piece_size);
      plan.slices.push_back(std::move(planned));
    }
  }
  return plan;
}

/// Fills unit `u`'s master weights `params` and the state of `opt` from the planned reads, and
/// sets the optimizer's step count; padding is zeroed, as a fresh engine has it.
template <class Opt, class MT>
void read_unit_state(CheckpointLoadPlan& plan, std::size_t u, Opt& opt, std::span<MT> params, std::int64_t step) {
  using P = typename Opt::param_type;
  auto state = opt.state();
  std::fill(params.begin(), params.end(), MT(0));
  for (auto& [name, tensor] : state) tensor.fill(P(0));
  for (const PlannedSlice& ps : plan.slices) {
    if (ps.unit != u) continue;
    for (const CheckpointRead& r : ps.reads) {
      const std::int64_t at = ps.slice.span_offset + r.into;
      const SafetensorsFile& f = plan.files->file(r.file);
      f.read_elements(checkpoint_tensor_name("master", ps.parameter->name, r.piece_begin),
                      static_cast<std::uint64_t>(r.offset),
                      params.subspan(static_cast<std::size_t>(at), static_cast<std::size_t>(r.count)),
                      DTypeConversion::convert);
      for (auto& [name, tensor] : state)
        if (ps.parameter->keeps(name))  // the others stay zero: its optimizer keeps no such state
          f.read_elements(checkpoint_tensor_name(name, ps.parameter->name, r.piece_begin),
                          static_cast<std::uint64_t>(r.offset), tensor.flat_view(at, r.count).span(),
                          DTypeConversion::convert);
    }
  }
  opt.set_step_count(step);
}

}  // namespace detail

/// Saves `engine`'s training state into checkpoint directory `dir`: master weights and optimizer
/// state as one safetensors file per rank that holds distinct shards, and metadata.json
/// (strategy, world size, parameter layout, optimizer step, loss-scaler state, `training`: the
/// data position and random seed). The directory appears only when complete (temporary
/// directory, fsync, rename): a process killed mid-save leaves the previous checkpoint whole. A
/// collective: every rank of the engine's communicator calls it. Files must be visible to all
/// ranks at `dir` (one machine, or a shared file system). Refused between the micro-batches of
/// one step (StrategyConfig::gradient_accumulation_steps): a checkpoint holds no gradients.
/// `io` stores the files (Lightning's checkpoint_io): rank 0's begins, commits or aborts the save.
template <class E>
void save_checkpoint(E& engine, const std::filesystem::path& dir, const TrainingState& training = {},
                     CheckpointIO& io = default_checkpoint_io()) {
  // Every rank counts the same micro-batches, so every rank refuses alike, before any collective.
  POLYSHARD_CHECK(engine.accumulated_micro_batches() == 0, "save_checkpoint: '", dir.string(), "' would lose the ",
                  "gradients of the ", engine.accumulated_micro_batches(), " micro-batch(es) this step has ",
                  "accumulated (gradient_accumulation_steps ", engine.config().gradient_accumulation_steps,
                  "), since a checkpoint holds no gradients; save after the step() that applies them");
  auto& comm = engine.communicator();
  std::filesystem::path tmp;
  std::string error = detail::attempt([&] {
    if (comm.rank() == 0)
      tmp = detail::through_io("save_checkpoint: CheckpointIO::begin_save of", dir, [&] { return io.begin_save(dir); });
  });
  detail::agree_or_throw<typename E::device>(comm, error, "save_checkpoint", dir);
  tmp = detail::broadcast_string<typename E::device>(comm, tmp.string(), 0);

  const detail::CheckpointFiles<E> files(engine);
  error = detail::attempt([&] {
    if (files.writes) detail::write_checkpoint_file(engine, tmp / checkpoint_file_name(files.mine, files.count));
    detail::probe_save("rank file written");
  });
  if (!detail::all_ranks_succeeded<typename E::device>(comm, error.empty())) {
    if (comm.rank() == 0) {
      const std::string aborted = detail::attempt([&] {
        detail::through_io("save_checkpoint: CheckpointIO::abort_save of", dir, [&] { io.abort_save(tmp); });
      });
      if (error.empty() && !aborted.empty()) error = aborted;
    }
    if (!error.empty()) throw Error(error);
    detail::throw_error("save_checkpoint: another rank failed to write its file of '", dir.string(),
                        "' (its error says why); the previous checkpoint is intact");
  }
  if (comm.rank() == 0)
    error = detail::attempt([&] {
      detail::probe_save("rank files written");
      detail::write_checkpoint_buffers(engine.model(), tmp / detail::checkpoint_buffers_file);
      const std::string json = checkpoint_metadata_json(detail::describe_checkpoint(engine, training));
      write_file_atomically(tmp / checkpoint_metadata_file, [&](FileSink& sink) { sink.write(std::as_bytes(std::span(json))); });
      detail::probe_save("metadata written");
      detail::through_io("save_checkpoint: CheckpointIO::commit_save of", dir, [&] { io.commit_save(tmp, dir); });
    });
  detail::agree_or_throw<typename E::device>(comm, error, "save_checkpoint", dir);
}

/// Loads checkpoint directory `dir` into `engine`, whatever world size, sharding or wrap policy
/// saved it: each rank reads from the files exactly the slices of master weights and optimizer
/// state its shards need, then rebuilds its parameters from the masters; the optimizer step and
/// the loss-scaler state are restored and gradients cleared. Returns the saved TrainingState.
/// The model must have the same parameters and shapes, and the optimizer the same state names.
/// Everything is checked (metadata, every file header, every tensor's shape) before any state
/// is written; an error on one rank is an error on all. A collective. Each rank's `io` says where
/// the files of `dir` are (Lightning's checkpoint_io).
template <class E>
TrainingState load_checkpoint(E& engine, const std::filesystem::path& checkpoint,
                              CheckpointIO& io = default_checkpoint_io()) {
  auto& comm = engine.communicator();
  CheckpointMetadata m;
  detail::CheckpointLoadPlan plan;
  std::optional<SafetensorsFile> buffers;
  std::filesystem::path dir = checkpoint;
  std::string error = detail::attempt([&] {
    dir = detail::through_io("load_checkpoint: CheckpointIO::open_for_load of", checkpoint,
                             [&] { return io.open_for_load(checkpoint); });
    m = read_checkpoint_metadata(dir);
    buffers = detail::check_checkpoint_buffers(engine.model(), dir);
    detail::check_checkpoint_fits(engine.units(), engine.optimizers().at(0), m, dir);
    std::vector<std::int64_t> offsets, sizes;
    for (std::size_t u = 0; u < engine.units().units.size(); ++u) {
      offsets.push_back(engine.optimizer_offset(u));
      sizes.push_back(static_cast<std::int64_t>(engine.optimizers()[u].numel()));
    }
    plan = detail::plan_checkpoint_load(engine.units(), offsets, sizes, m, dir);
  });
  detail::agree_or_throw<typename E::device>(comm, error, "load_checkpoint", checkpoint);

  error = detail::attempt([&] {
    for (std::size_t u = 0; u < engine.units().units.size(); ++u)
      engine.access_optimizer_on_host(
          u, true, [&](auto& opt, auto params) { detail::read_unit_state(plan, u, opt, params, m.optimizer_step); });
    if (buffers) detail::read_persistent_buffers(engine.model(), *buffers);
  });
  detail::agree_or_throw<typename E::device>(comm, error, "load_checkpoint", checkpoint);

  auto& scaler = engine.loss_scaler();
  if (scaler.scaled() && m.loss_scaled)
    scaler.restore(m.loss_scale, static_cast<int>(m.good_steps), static_cast<int>(m.hysteresis_left), m.skipped_steps);
  engine.refresh_parameters_from_master();
  engine.zero_grad();
  return m.training;
}

/// The whole `kind` ("master", or an optimizer state name such as "exp_avg") of parameter `p`
/// of the checkpoint in `dir` described by `m`, assembled from its pieces as float, in the
/// parameter's shape. Needs no engine and no communicator: tools read checkpoints this way.
inline Tensor<float> read_checkpoint_tensor(const std::filesystem::path& dir, const CheckpointMetadata& m,
                                            std::string_view kind, const CheckpointParameter& p) {
  Tensor<float> out = Tensor<float>::empty(Shape(std::span<const std::int64_t>(p.shape)));
  detail::CheckpointFileSet files(dir, m);
  for (const CheckpointPiece& c : p.pieces) {
    const std::string name = checkpoint_tensor_name(kind, p.name, c.begin);
    files.check(c.file, name, c.end - c.begin);
    files.file(c.file).read_elements(name, 0, out.flat_view(c.begin, c.end - c.begin).span(), DTypeConversion::convert);
  }
  return out;
}

/// Writes the master weights of checkpoint `dir` as one full state dict with PyTorch names
/// (as DeepSpeed's zero_to_fp32 does), for PyTorch or load_state_dict: no engine, no ranks.
/// `tied` aliases (GPT's lm_head.weight; tied_parameters<Gpt<float>>::of(model) lists them) are
/// written too, so that a strict PyTorch load finds every key. Stored as `dtype` when given.
inline void consolidate_checkpoint(const std::filesystem::path& dir, const std::filesystem::path& out,
                                   const std::vector<TiedParameter>& tied = {},
                                   std::optional<DType> dtype = std::nullopt) {
  const CheckpointMetadata m = read_checkpoint_metadata(dir);
  SafetensorsWriter writer;
  writer.add_metadata("format", "pt");
  writer.add_metadata("step", std::to_string(m.training.step));
  for (const CheckpointParameter& p : m.parameters)
    detail::add_with_aliases(writer, p.name, read_checkpoint_tensor(dir, m, "master", p), tied, dtype);
  writer.write(out);
}

}  // namespace polyshard
