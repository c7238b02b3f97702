// Writing safetensors files: tensors in a stable order, a space-padded header, metadata, and
// an atomic replacement of the target file.
#pragma once

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "polyshard/io/atomic_file.hpp"
#include "polyshard/io/safetensors_header.hpp"
#include "polyshard/tensor/tensor.hpp"

namespace polyshard {

/// Collects named tensors and metadata, then writes them as one safetensors file. Tensors are
/// held by reference (a Tensor shares storage), so their elements are read at write time.
/// Tensors are laid out by descending element size, then by name, as the reference Python
/// writer does: the file's bytes do not depend on the order of add() calls, and every tensor
/// starts at a multiple of its element size (the header is padded to a multiple of 8).
class SafetensorsWriter {
 public:
  /// Adds `t` under `name`, stored in its own dtype. Names must be unique, non-empty, and not
  /// "__metadata__".
  template <Element T>
  SafetensorsWriter& add(std::string name, const Tensor<T>& t) {
    return add_as<T>(std::move(name), t);
  }

  /// Adds `t` under `name`, stored as `To` (converted with element_cast at write time).
  template <Element To, Element From>
  SafetensorsWriter& add_as(std::string name, const Tensor<From>& t) {
    static_assert(FloatElement<To> == FloatElement<From>,
                  "add_as<To>(name, t): integers and floating point do not convert into each other");
    POLYSHARD_CHECK(t.defined(), "SafetensorsWriter: tensor '", name, "' has no storage");
    POLYSHARD_CHECK(!name.empty() && name != "__metadata__", "SafetensorsWriter: '", name,
                    "' cannot name a tensor");
    POLYSHARD_CHECK(names_.insert(name).second, "SafetensorsWriter: tensor '", name, "' added twice");
    Entry e;
    e.name = std::move(name);
    e.dtype = to_safetensors_dtype(dtype_v<To>);
    e.shape.assign(t.shape().begin(), t.shape().end());
    e.nbytes = static_cast<std::uint64_t>(t.numel()) * sizeof(To);
    e.emit = [t](const std::function<void(std::span<const std::byte>)>& out) {
      const Tensor<From> c = t.contiguous();  // (a copy only for a transposed view)
      if constexpr (std::same_as<To, From>) {
        out(std::as_bytes(c.span()));
      } else {
        constexpr std::int64_t chunk = 1 << 16;
        std::vector<To> buffer(static_cast<std::size_t>(std::min(chunk, c.numel())));
        for (std::int64_t done = 0; done < c.numel();) {
          const std::int64_t n = std::min(chunk, c.numel() - done);
          for (std::int64_t i = 0; i < n; ++i) buffer[static_cast<std::size_t>(i)] = element_cast<To>(c.data()[done + i]);
          out(std::as_bytes(std::span<const To>(buffer.data(), static_cast<std::size_t>(n))));
          done += n;
        }
      }
    };
    entries_.push_back(std::move(e));
    return *this;
  }

  /// Sets a "__metadata__" entry (string to string); a later call with the same key replaces it.
  SafetensorsWriter& add_metadata(std::string key, std::string value) {
    for (auto& [k, v] : metadata_)
      if (k == key) {
        v = std::move(value);
        return *this;
      }
    metadata_.emplace_back(std::move(key), std::move(value));
    return *this;
  }

  /// Number of tensors added.
  std::size_t size() const { return entries_.size(); }

  /// Writes the file atomically (temporary beside it, fsync, rename, fsync of the directory).
  void write(const std::filesystem::path& path) const {
    const std::vector<const Entry*> order = ordered();
    const std::string header = header_json(order, path.string());
    write_file_atomically(path, [&](FileSink& sink) { emit_all(order, header, [&](auto b) { sink.write(b); }); });
  }

  /// The file's bytes in memory (for tests and in-memory transfer).
  std::vector<std::byte> to_bytes() const {
    const std::vector<const Entry*> order = ordered();
    const std::string header = header_json(order, "<memory>");
    std::vector<std::byte> out;
    emit_all(order, header, [&](std::span<const std::byte> b) {
      const std::size_t at = out.size();
      out.resize(at + b.size());
      if (!b.empty()) std::memcpy(out.data() + at, b.data(), b.size());
    });
    return out;
  }

 private:
  struct Entry {
    std::string name;
    SafetensorsDType dtype;
    std::vector<std::int64_t> shape;
    std::uint64_t nbytes;
    std::function<void(const std::function<void(std::span<const std::byte>)>&)> emit;
  };

  std::vector<const Entry*> ordered() const {
    std::vector<const Entry*> order;
    for (const Entry& e : entries_) order.push_back(&e);
    std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
      const auto sa = safetensors_dtype_size(a->dtype), sb = safetensors_dtype_size(b->dtype);
      return sa != sb ? sa > sb : a->name < b->name;
    });
    return order;
  }

  std::string header_json(const std::vector<const Entry*>& order, const std::string& file) const {
    std::string json = "{";
    bool first = true;
    if (!metadata_.empty()) {
      json += "\"__metadata__\":{";
      for (std::size_t i = 0; i < metadata_.size(); ++i) {
        if (i) json += ',';
        append_json_string(json, metadata_[i].first);
        json += ':';
        append_json_string(json, metadata_[i].second);
      }
      json += '}';
      first = false;
    }
    std::uint64_t offset = 0, data_bytes = 0;
    for (const Entry* e : order) {
      if (!first) json += ',';
      first = false;
      append_json_string(json, e->name);
      json += ":{\"dtype\":\"";
      json += safetensors_dtype_name(e->dtype);
      json += "\",\"shape\":[";
      for (std::size_t i = 0; i < e->shape.size(); ++i) {
        if (i) json += ',';
        json += std::to_string(e->shape[i]);
      }
      json += "],\"data_offsets\":[";
      json += std::to_string(offset);
      json += ',';
      json += std::to_string(offset + e->nbytes);
      json += "]}";
      offset += e->nbytes;
    }
    data_bytes = offset;
    json += '}';
    json.append((8 - json.size() % 8) % 8, ' ');
    // Hold the writer to the reader's rules (UTF-8 names, limits): never write a file we refuse.
    parse_safetensors_header(file, json, 8 + json.size() + data_bytes);
    return json;
  }

  template <class Out>
  void emit_all(const std::vector<const Entry*>& order, const std::string& header, Out&& out) const {
    unsigned char prefix[8];
    std::uint64_t n = header.size();
    for (int i = 0; i < 8; ++i, n >>= 8) prefix[i] = static_cast<unsigned char>(n & 0xff);
    out(std::as_bytes(std::span<const unsigned char>(prefix, 8)));
    out(std::as_bytes(std::span<const char>(header.data(), header.size())));
    const std::function<void(std::span<const std::byte>)> sink = [&](std::span<const std::byte> b) { out(b); };
    for (const Entry* e : order) e->emit(sink);
  }

  std::vector<Entry> entries_;
  std::unordered_set<std::string> names_;
  std::vector<std::pair<std::string, std::string>> metadata_;
};

}  // namespace polyshard
