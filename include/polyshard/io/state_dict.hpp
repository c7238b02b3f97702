// Full state dicts: every parameter of a module saved under its PyTorch name in one safetensors
// file, and loaded back by name into a bound module with errors that name what does not fit.
#pragma once

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "polyshard/io/safetensors_reader.hpp"
#include "polyshard/io/safetensors_writer.hpp"
#include "polyshard/io/tied_parameters.hpp"
#include "polyshard/nn/reflect.hpp"

namespace polyshard {

/// How save_state_dict writes a module.
struct SaveStateDictOptions {
  /// Store every parameter as this floating-point dtype (e.g. DType::BF16); by default each in
  /// its own element type.
  std::optional<DType> dtype = std::nullopt;
  /// Also write tied weights under their alias (GPT's "lm_head.weight"), as PyTorch's
  /// state_dict() lists them, so that a strict load_state_dict in PyTorch finds every key.
  bool write_tied = true;
  /// Extra "__metadata__" entries; {"format": "pt"} is always written (Hugging Face checks it).
  std::vector<std::pair<std::string, std::string>> metadata = {};
};

/// How load_state_dict matches a file to a module.
struct LoadStateDictOptions {
  /// Missing or unexpected tensors are an error (as torch's strict=True); otherwise they are
  /// reported in the result and the matching tensors are loaded.
  bool strict = true;
  /// Convert tensors stored in another floating-point dtype (a BF16 file into an F32 model).
  bool convert_dtype = true;
};

/// What a load matched, as torch's load_state_dict reports it (empty after a strict load).
struct LoadStateDictResult {
  std::vector<std::string> missing_keys;     ///< parameters of the module the file lacks
  std::vector<std::string> unexpected_keys;  ///< tensors of the file the module lacks
};

namespace detail {

/// What a tensor of a file is to a module being loaded.
struct FileKey {
  enum class Kind { parameter, alias, ignored, unexpected } kind = Kind::unexpected;
  std::string target;        ///< parameter name (parameter, alias)
  bool transposed = false;   ///< stored as the transpose of the parameter (Conv1D layout)
};

inline std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  const std::size_t shown = std::min<std::size_t>(names.size(), 8);
  for (std::size_t i = 0; i < shown; ++i) out += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > shown) out += " and " + std::to_string(names.size() - shown) + " more";
  return out;
}

/// What a file and a module disagree on, as one message: "<prefix> missing <noun> 'a';
/// unexpected <noun> 'b'; different shapes for 'c (...)';" ("" when they agree).
inline std::string mismatch_message(const std::string& prefix, const char* noun, const std::vector<std::string>& missing,
                                    const std::vector<std::string>& unexpected,
                                    const std::vector<std::string>& misshaped = {}) {
  if (missing.empty() && unexpected.empty() && misshaped.empty()) return {};
  std::string msg = prefix;
  if (!missing.empty()) msg += std::string(" missing ") + noun + " " + join_names(missing) + ";";
  if (!unexpected.empty()) msg += std::string(" unexpected ") + noun + " " + join_names(unexpected) + ";";
  if (!misshaped.empty()) msg += " different shapes for " + join_names(misshaped) + ";";
  return msg;
}

template <class P>
using parameter_element_t = typename decltype(std::declval<const P&>().value())::value_type;

/// Loads the tensors of `file` into the parameters of `module` as `classify` maps them. Every
/// name, shape and dtype is checked before any parameter is written, so a load that fails on
/// them leaves the module as it was.
template <Module M, class Classify>
LoadStateDictResult load_mapped(M& module, const SafetensorsFile& file, Classify&& classify,
                                const LoadStateDictOptions& options, const char* what) {
  struct Param {
    Shape shape;
    DType dtype;
    const SafetensorsTensorInfo* source = nullptr;
    bool transposed = false;
  };
  std::unordered_map<std::string, Param> params;
  std::vector<std::string> order;
  visit_parameters(module, [&](const std::string& name, auto& p) {
    params.emplace(name, Param{p.shape(), dtype_v<parameter_element_t<std::remove_cvref_t<decltype(p)>>>});
    order.push_back(name);
  });
  // Persistent buffers, under their own names (never renamed, aliased or transposed).
  std::unordered_map<std::string, Param> buffers;
  std::vector<std::string> buffer_order;
  visit_buffers(module, [&](const std::string& name, const auto& b) {
    if (!b.persistent()) return;
    buffers.emplace(name, Param{b.shape(), dtype_v<parameter_element_t<std::remove_cvref_t<decltype(b)>>>});
    buffer_order.push_back(name);
  });

  LoadStateDictResult result;
  std::vector<std::pair<const SafetensorsTensorInfo*, std::string>> aliases;
  for (const SafetensorsTensorInfo& t : file.tensors()) {
    const FileKey key = classify(t.name);
    const auto it = key.kind == FileKey::Kind::unexpected || key.kind == FileKey::Kind::ignored
                        ? params.end()
                        : params.find(key.target);
    if (key.kind == FileKey::Kind::ignored) continue;
    if (const auto b = buffers.find(t.name); it == params.end() && b != buffers.end()) {
      if (b->second.source) throw_error(what, ": '", file.name(), "' holds buffer '", t.name, "' twice");
      b->second.source = &t;
      continue;
    }
    if (it == params.end()) {
      result.unexpected_keys.push_back(t.name);
      continue;
    }
    if (key.kind == FileKey::Kind::alias) {
      aliases.emplace_back(&t, key.target);
      continue;
    }
    if (it->second.source)
      throw_error(what, ": '", file.name(), "' holds parameter '", key.target, "' twice, as '", it->second.source->name,
                  "' and as '", t.name, "'");
    it->second.source = &t;
    it->second.transposed = key.transposed;
  }
  for (const std::string& name : order)
    if (!params[name].source) result.missing_keys.push_back(name);
  for (const std::string& name : buffer_order)
    if (!buffers[name].source) result.missing_keys.push_back(name);
  if (options.strict)
    if (std::string msg = mismatch_message(std::string(what) + ": '" + file.name() + "' does not match the module:",
                                           "tensors", result.missing_keys, result.unexpected_keys);
        !msg.empty())
      throw Error(msg);

  auto check = [&](const SafetensorsTensorInfo& t, const std::string& param, Shape expected, bool transposed) {
    if (transposed) std::swap(expected[0], expected[1]);
    if (!std::equal(t.shape.begin(), t.shape.end(), expected.begin(), expected.end()))
      throw_error(what, ": '", file.name(), "': tensor '", t.name, "' has shape ", shape_string(t.shape),
                  " but parameter '", param, "' needs ", expected, transposed ? " (its transpose, Conv1D layout)" : "");
    const auto core = to_core_dtype(t.dtype);
    const DType want = params[param].dtype;
    if (!core || !is_float_dtype(*core))
      throw_error(what, ": '", file.name(), "': tensor '", t.name, "' has dtype ", safetensors_dtype_name(t.dtype),
                  ", not a floating-point type a parameter can hold");
    if (*core != want && !options.convert_dtype)
      throw_error(what, ": '", file.name(), "': tensor '", t.name, "' is ", dtype_name(*core), " but parameter '", param,
                  "' is ", dtype_name(want), " and dtype conversion is off");
  };
  for (const std::string& name : order)
    if (const Param& p = params[name]; p.source) check(*p.source, name, p.shape, p.transposed);
  for (const auto& [t, source] : aliases) check(*t, source, params[source].shape, false);
  for (const std::string& name : buffer_order) {
    const Param& b = buffers[name];
    if (!b.source) continue;
    const SafetensorsTensorInfo& t = *b.source;
    if (!std::equal(t.shape.begin(), t.shape.end(), b.shape.begin(), b.shape.end()))
      throw_error(what, ": '", file.name(), "': tensor '", t.name, "' has shape ", shape_string(t.shape),
                  " but buffer '", name, "' needs ", b.shape);
    const auto core = to_core_dtype(t.dtype);
    const bool both_float = core && is_float_dtype(*core) && is_float_dtype(b.dtype);
    if (core != b.dtype && !(both_float && options.convert_dtype))
      throw_error(what, ": '", file.name(), "': tensor '", t.name, "' is ", safetensors_dtype_name(t.dtype),
                  " but buffer '", name, "' is ", dtype_name(b.dtype));
  }

  const DTypeConversion conversion = options.convert_dtype ? DTypeConversion::convert : DTypeConversion::exact;
  visit_parameters(module, [&](const std::string& name, auto& p) {
    using T = parameter_element_t<std::remove_cvref_t<decltype(p)>>;
    const Param& info = params[name];
    if (!info.source) return;
    if (info.transposed) {
      const Tensor<T> stored = file.read<T>(info.source->name, conversion);  // (in, out)
      p.value().copy_from(stored.transpose());                                // (out, in)
    } else {
      file.read_into(info.source->name, p.value(), conversion);
    }
  });
  visit_buffers(module, [&](const std::string& name, const auto& b) {
    if (const auto it = buffers.find(name); it != buffers.end() && it->second.source)
      file.read_into(it->second.source->name, b.value(), conversion);
  });
  // A tied alias carries no values of its own: it must equal its source as loaded.
  visit_parameters(module, [&](const std::string& name, auto& p) {
    using T = parameter_element_t<std::remove_cvref_t<decltype(p)>>;
    for (const auto& [t, source] : aliases) {
      if (source != name) continue;
      const Tensor<T> stored = file.read<T>(t->name, conversion);
      const Tensor<T> value = p.value().contiguous();
      if (std::memcmp(stored.data(), value.data(), value.bytes()) != 0)
        throw_error(what, ": '", file.name(), "': tensor '", t->name, "' differs from '", name,
                    "'; this module ties them (one parameter), so they must be equal");
    }
  });
  return result;
}

template <class Add>
void add_with_dtype(const std::optional<DType>& dtype, Add&& add) {
  if (!dtype) return add(std::type_identity<void>{});
  POLYSHARD_CHECK(is_float_dtype(*dtype), "save_state_dict: parameters cannot be stored as ", dtype_name(*dtype));
  visit_dtype(*dtype, [&](auto tag) {
    if constexpr (FloatElement<decltype(tag)>) add(std::type_identity<decltype(tag)>{});
  });
}

/// Adds `t` to `writer` under `name`, stored as `dtype` when given, else in its own dtype.
template <Element T>
void add_stored(SafetensorsWriter& writer, const std::string& name, const Tensor<T>& t, const std::optional<DType>& dtype) {
  add_with_dtype(dtype, [&](auto as) {
    using To = typename decltype(as)::type;
    if constexpr (std::is_void_v<To>) writer.add(name, t);
    else writer.add_as<To>(name, t);
  });
}

/// Adds every parameter of `module` to `writer` under `rename(name)`, transposed where
/// `transpose(name)` says, stored as `dtype` when given.
template <Module M, class Rename, class Transpose>
void add_parameters(SafetensorsWriter& writer, const M& module, const std::optional<DType>& dtype, Rename&& rename,
                    Transpose&& transpose) {
  visit_parameters(module, [&](const std::string& name, const auto& p) {
    using T = parameter_element_t<std::remove_cvref_t<decltype(p)>>;
    const Tensor<T> value = transpose(name) ? p.value().transpose() : p.value();
    add_stored(writer, rename(name), value, dtype);
  });
}

/// Adds every persistent buffer of `module` to `writer` under its name, in its own dtype (a
/// device buffer through a host copy); returns how many.
template <Module M>
int add_persistent_buffers(SafetensorsWriter& writer, const M& module) {
  int added = 0;
  visit_buffers(module, [&](const std::string& name, const auto& b) {
    if (!b.persistent()) return;
    using X = std::remove_cvref_t<decltype(b)>;
    using T = parameter_element_t<X>;
    if constexpr (std::same_as<typename is_buffer<X>::device, Cpu>) {
      writer.add(name, b.value());
    } else {
      const std::vector<T> values = b.value().to_vector();
      writer.add(name, Tensor<T>::from(b.shape(), std::span<const T>(values)));
    }
    ++added;
  });
  return added;
}

}  // namespace detail

/// Saves every parameter and persistent buffer of `module` under its PyTorch name
/// ("transformer.h.0.attn.c_attn.weight", nn.Linear's (out, in) layout) into one safetensors file, written atomically. The parameters
/// must be bound (a module built with FlatParameters, or gathered whole). Tied weights are
/// written under their alias as well unless options.write_tied is false.
/// @param module   the module to save
/// @param path     the file to create or replace
/// @param options  stored dtype, tied aliases, extra metadata
template <Module M>
void save_state_dict(const M& module, const std::filesystem::path& path, const SaveStateDictOptions& options = {}) {
  SafetensorsWriter writer;
  writer.add_metadata("format", "pt");
  for (const auto& [k, v] : options.metadata) writer.add_metadata(k, v);
  detail::add_parameters(writer, module, options.dtype, [](const std::string& n) { return n; },
                         [](const std::string&) { return false; });
  detail::add_persistent_buffers(writer, module);  // in their own dtypes: options.dtype is the parameters'
  if (options.write_tied) {
    for (const TiedParameter& tie : tied_parameters<M>::of(module)) {
      bool found = false;
      visit_parameters(module, [&](const std::string& name, const auto& p) {
        if (name != tie.source) return;
        found = true;
        detail::add_stored(writer, tie.alias, p.value(), options.dtype);
      });
      POLYSHARD_CHECK(found, "save_state_dict: tied weight '", tie.alias, "' names no parameter '", tie.source, "'");
    }
  }
  writer.write(path);
}

/// Loads a state dict saved by save_state_dict (or by PyTorch with safetensors, in nn.Linear
/// layout) into the bound parameters of `module`, by name. Shapes must match exactly; tied
/// aliases (GPT's "lm_head.weight") may be present and must equal their source. Errors name the
/// file and every missing, unexpected or mis-shaped tensor; names, shapes and dtypes are all
/// checked before any parameter is written.
/// @param module   a module whose parameters are bound (FlatParameters, or gathered whole)
/// @param path     the safetensors file
/// @param options  strictness and dtype conversion
template <Module M>
LoadStateDictResult load_state_dict(M& module, const std::filesystem::path& path,
                                    const LoadStateDictOptions& options = {}) {
  const SafetensorsFile file = SafetensorsFile::open(path);
  const std::vector<TiedParameter> tied = tied_parameters<M>::of(module);
  return detail::load_mapped(
      module, file,
      [&](const std::string& name) {
        for (const TiedParameter& t : tied)
          if (t.alias == name) return detail::FileKey{detail::FileKey::Kind::alias, t.source};
        return detail::FileKey{detail::FileKey::Kind::parameter, name};
      },
      options, "load_state_dict");
}

}  // namespace polyshard
