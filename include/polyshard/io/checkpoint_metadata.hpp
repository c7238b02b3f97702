// The metadata file of a sharded checkpoint, and resharding as a pure function of it: which
// slices of which files hold a given range of a parameter.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "polyshard/core/error.hpp"
#include "polyshard/io/json.hpp"

namespace polyshard {

/// Elements [begin, end) of a parameter (in its row-major order), stored in file `file` of the
/// checkpoint under the tensor names checkpoint_tensor_name(kind, parameter, begin).
struct CheckpointPiece {
  std::size_t file = 0;
  std::int64_t begin = 0, end = 0;
};

/// One parameter of a checkpoint: its PyTorch name, shape, and the pieces that tile it.
struct CheckpointParameter {
  std::string name;
  std::vector<std::int64_t> shape;
  std::vector<CheckpointPiece> pieces;  ///< sorted by begin, tiling [0, numel)
  /// The state kinds its optimizer keeps, where fewer than the checkpoint's (an OptimizerList's
  /// SGD beside Adam); unset: every one of CheckpointMetadata::optimizer_state.
  std::optional<std::vector<std::string>> state = {};
  /// Whether the checkpoint holds state of `kind` for this parameter: tensors
  /// "<kind>/<name>@<begin>" exist for the kinds its optimizer keeps only.
  bool keeps(std::string_view kind) const {
    return !state || std::find(state->begin(), state->end(), kind) != state->end();
  }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (const std::int64_t e : shape) n *= e;
    return n;
  }
};

/// Where training stood when a checkpoint was saved, beyond what the engine holds: the data
/// position and the random state (every random draw of polyshard is a pure function of the seed
/// and a position, so the seed is the whole random state), plus any values of the caller's.
struct TrainingState {
  std::int64_t step = 0;       ///< optimizer steps taken: where the data sampler resumes
  std::uint64_t seed = 0;      ///< the key of the counter-based random streams
  std::vector<std::pair<std::string, std::string>> extra = {};  ///< caller's values, by name

  /// The value of extra entry `key`, or nullptr.
  const std::string* find(std::string_view key) const {
    for (const auto& [k, v] : extra)
      if (k == key) return &v;
    return nullptr;
  }
};

/// The contents of a sharded checkpoint's metadata.json.
struct CheckpointMetadata {
  static constexpr const char* format_name = "polyshard-sharded-checkpoint";
  static constexpr std::int64_t format_version = 1;

  // What saved it (informative: a load accepts any strategy and world size).
  std::string sharding, offload, precision, wrap;
  std::int64_t world_size = 1;
  std::vector<std::string> files;     ///< one per rank that held distinct state
  std::string master_dtype = "F32";   ///< safetensors dtype of the master weights
  std::int64_t optimizer_step = 0;
  std::vector<std::string> optimizer_state;  ///< state tensor names per parameter ("exp_avg", ...)
  bool loss_scaled = false;
  double loss_scale = 1;
  std::int64_t good_steps = 0, hysteresis_left = 0, skipped_steps = 0;
  TrainingState training;
  std::vector<CheckpointParameter> parameters;

  /// The parameter named `name`, or nullptr.
  const CheckpointParameter* find(std::string_view name) const {
    for (const auto& p : parameters)
      if (p.name == name) return &p;
    return nullptr;
  }
};

/// Name of the tensor holding elements [begin, ...) of `parameter`'s `kind` ("master" for the
/// master weights, or an optimizer state name) in a checkpoint file.
inline std::string checkpoint_tensor_name(std::string_view kind, std::string_view parameter, std::int64_t begin) {
  std::string out(kind);
  out += '/';
  out += parameter;
  out += '@';
  out += std::to_string(begin);
  return out;
}

/// Name of file `index` of `count` in a checkpoint directory.
inline std::string checkpoint_file_name(std::size_t index, std::size_t count) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "rank-%05zu-of-%05zu.safetensors", index, count);
  return buf;
}

namespace detail {

inline std::string json_double(double x) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);  // shortest form that reads back exactly
  return std::string(buf, r.ptr);
}

inline void append_json_strings(std::string& out, const std::vector<std::string>& values) {
  out += '[';
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i) out += ", ";
    append_json_string(out, values[i]);
  }
  out += ']';
}

/// Reads one metadata document, naming `where` and the member in every error.
class MetadataReader {
 public:
  explicit MetadataReader(std::string where) : where_(std::move(where)) {}

  template <class... Args>
  [[noreturn]] void fail(const Args&... args) const {
    throw_error("checkpoint metadata '", where_, "': ", args...);
  }

  const JsonValue& member(const JsonValue& object, std::string_view key, JsonValue::Kind kind) const {
    if (object.kind != JsonValue::Kind::Object) fail("expected an object holding '", key, "'");
    const JsonValue* v = object.find(key);
    if (!v) fail("'", key, "' is missing");
    if (v->kind != kind) fail("'", key, "' is ", json_kind_name(v->kind), ", not ", json_kind_name(kind));
    return *v;
  }
  std::int64_t integer(const JsonValue& object, std::string_view key, std::int64_t min = 0) const {
    const std::int64_t v = member(object, key, JsonValue::Kind::Integer).integer;
    if (v < min) fail("'", key, "' is ", v, ", less than ", min);
    return v;
  }
  const std::string& string(const JsonValue& object, std::string_view key) const {
    return member(object, key, JsonValue::Kind::String).string;
  }
  double real(const JsonValue& object, std::string_view key) const {
    const std::string& s = string(object, key);
    double x = 0;
    const auto r = std::from_chars(s.data(), s.data() + s.size(), x);
    if (r.ec != std::errc() || r.ptr != s.data() + s.size()) fail("'", key, "' is not a number: '", s, "'");
    return x;
  }
  std::vector<std::string> strings(const JsonValue& object, std::string_view key) const {
    std::vector<std::string> out;
    for (const JsonValue& e : member(object, key, JsonValue::Kind::Array).elements) {
      if (e.kind != JsonValue::Kind::String) fail("'", key, "' holds ", json_kind_name(e.kind), ", not strings");
      out.push_back(e.string);
    }
    return out;
  }

 private:
  std::string where_;
};

}  // namespace detail

/// metadata.json of a checkpoint: one parameter per line, so that a person can read it.
inline std::string checkpoint_metadata_json(const CheckpointMetadata& m) {
  using detail::append_json_strings;
  std::string j = "{\n  \"format\": ";
  append_json_string(j, CheckpointMetadata::format_name);
  j += ",\n  \"version\": " + std::to_string(CheckpointMetadata::format_version);
  j += ",\n  \"strategy\": {\"sharding\": ";
  append_json_string(j, m.sharding);
  j += ", \"offload\": ";
  append_json_string(j, m.offload);
  j += ", \"precision\": ";
  append_json_string(j, m.precision);
  j += ", \"wrap\": ";
  append_json_string(j, m.wrap);
  j += "},\n  \"world_size\": " + std::to_string(m.world_size);
  j += ",\n  \"files\": ";
  append_json_strings(j, m.files);
  j += ",\n  \"master_dtype\": ";
  append_json_string(j, m.master_dtype);
  j += ",\n  \"optimizer\": {\"step\": " + std::to_string(m.optimizer_step) + ", \"state\": ";
  append_json_strings(j, m.optimizer_state);
  j += "},\n  \"loss_scaler\": {\"scaled\": " + std::to_string(m.loss_scaled ? 1 : 0) + ", \"scale\": \"" +
       detail::json_double(m.loss_scale) + "\", \"good_steps\": " + std::to_string(m.good_steps) +
       ", \"hysteresis_left\": " + std::to_string(m.hysteresis_left) +
       ", \"skipped_steps\": " + std::to_string(m.skipped_steps) + "}";
  j += ",\n  \"training\": {\"step\": " + std::to_string(m.training.step) + ", \"seed\": \"" +
       std::to_string(m.training.seed) + "\", \"extra\": {";
  for (std::size_t i = 0; i < m.training.extra.size(); ++i) {
    if (i) j += ", ";
    append_json_string(j, m.training.extra[i].first);
    j += ": ";
    append_json_string(j, m.training.extra[i].second);
  }
  j += "}},\n  \"parameters\": [";
  for (std::size_t i = 0; i < m.parameters.size(); ++i) {
    const CheckpointParameter& p = m.parameters[i];
    j += i ? ",\n    " : "\n    ";
    j += "{\"name\": ";
    append_json_string(j, p.name);
    j += ", \"shape\": [";
    for (std::size_t d = 0; d < p.shape.size(); ++d) j += (d ? ", " : "") + std::to_string(p.shape[d]);
    j += "]";
    if (p.state) {
      j += ", \"state\": ";
      append_json_strings(j, *p.state);
    }
    j += ", \"pieces\": [";
    for (std::size_t k = 0; k < p.pieces.size(); ++k)
      j += (k ? ", [" : "[") + std::to_string(p.pieces[k].file) + ", " + std::to_string(p.pieces[k].begin) + ", " +
           std::to_string(p.pieces[k].end) + "]";
    j += "]}";
  }
  j += "\n  ]\n}\n";
  return j;
}

/// Parses and validates metadata.json (`where` names it in errors): the format and version, every
/// member's kind, file indices in range, and pieces that tile each parameter exactly, in order,
/// without gap or overlap. A metadata file that passes describes a loadable checkpoint as far as
/// the metadata alone can tell.
inline CheckpointMetadata parse_checkpoint_metadata(std::string_view text, const std::string& where) {
  const detail::MetadataReader r(where);
  JsonValue doc;
  try {
    doc = parse_json(text, 8, std::size_t{1} << 24, std::size_t{1} << 24);
  } catch (const Error& e) {
    r.fail("not valid JSON: ", e.what());
  }
  if (doc.kind != JsonValue::Kind::Object) r.fail("the document is not a JSON object");
  if (r.string(doc, "format") != CheckpointMetadata::format_name)
    r.fail("'format' is '", r.string(doc, "format"), "', not '", CheckpointMetadata::format_name, "'");
  if (const std::int64_t v = r.integer(doc, "version"); v != CheckpointMetadata::format_version)
    r.fail("format version ", v, " is not ", CheckpointMetadata::format_version, ", the one this polyshard reads");

  CheckpointMetadata m;
  const JsonValue& strategy = r.member(doc, "strategy", JsonValue::Kind::Object);
  m.sharding = r.string(strategy, "sharding");
  m.offload = r.string(strategy, "offload");
  m.precision = r.string(strategy, "precision");
  m.wrap = r.string(strategy, "wrap");
  m.world_size = r.integer(doc, "world_size", 1);
  m.files = r.strings(doc, "files");
  if (m.files.empty()) r.fail("'files' is empty");
  std::set<std::string> file_names;
  for (const std::string& f : m.files) {
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
      r.fail("file name '", f, "' is not a plain file name in the checkpoint directory");
    if (!file_names.insert(f).second) r.fail("file '", f, "' is listed twice");
  }
  m.master_dtype = r.string(doc, "master_dtype");
  const JsonValue& optimizer = r.member(doc, "optimizer", JsonValue::Kind::Object);
  m.optimizer_step = r.integer(optimizer, "step");
  m.optimizer_state = r.strings(optimizer, "state");
  for (const std::string& s : m.optimizer_state)
    if (s.empty() || s == "master" || s.find('/') != std::string::npos) r.fail("optimizer state name '", s, "' is invalid");
  const JsonValue& scaler = r.member(doc, "loss_scaler", JsonValue::Kind::Object);
  m.loss_scaled = r.integer(scaler, "scaled") != 0;
  m.loss_scale = r.real(scaler, "scale");
  if (!(m.loss_scale > 0)) r.fail("loss scale ", m.loss_scale, " is not positive");
  m.good_steps = r.integer(scaler, "good_steps");
  m.hysteresis_left = r.integer(scaler, "hysteresis_left");
  m.skipped_steps = r.integer(scaler, "skipped_steps");
  const JsonValue& training = r.member(doc, "training", JsonValue::Kind::Object);
  m.training.step = r.integer(training, "step");
  {
    const std::string& seed = r.string(training, "seed");
    const auto res = std::from_chars(seed.data(), seed.data() + seed.size(), m.training.seed);
    if (res.ec != std::errc() || res.ptr != seed.data() + seed.size()) r.fail("training seed '", seed, "' is not an integer");
  }
  for (const JsonMember& e : r.member(training, "extra", JsonValue::Kind::Object).members) {
    if (e.value.kind != JsonValue::Kind::String) r.fail("training value '", e.name, "' is not a string");
    m.training.extra.emplace_back(e.name, e.value.string);
  }

  std::set<std::string> names;
  for (const JsonValue& pv : r.member(doc, "parameters", JsonValue::Kind::Array).elements) {
    CheckpointParameter p;
    p.name = r.string(pv, "name");
    if (p.name.empty() || !names.insert(p.name).second) r.fail("parameter name '", p.name, "' is empty or repeated");
    std::int64_t numel = 1;
    for (const JsonValue& e : r.member(pv, "shape", JsonValue::Kind::Array).elements) {
      if (e.kind != JsonValue::Kind::Integer || e.integer < 0)
        r.fail("parameter '", p.name, "': shape holds something other than non-negative integers");
      if (__builtin_mul_overflow(numel, e.integer, &numel)) r.fail("parameter '", p.name, "': shape overflows");
      p.shape.push_back(e.integer);
    }
    if (pv.find("state")) {
      p.state = r.strings(pv, "state");
      for (const std::string& kind : *p.state)
        if (std::find(m.optimizer_state.begin(), m.optimizer_state.end(), kind) == m.optimizer_state.end())
          r.fail("parameter '", p.name, "': state '", kind, "' is not one of the optimizer's");
    }
    std::int64_t next = 0;
    for (const JsonValue& piece : r.member(pv, "pieces", JsonValue::Kind::Array).elements) {
      const auto& f = piece.elements;
      if (piece.kind != JsonValue::Kind::Array || f.size() != 3 ||
          std::any_of(f.begin(), f.end(), [](const JsonValue& x) { return x.kind != JsonValue::Kind::Integer || x.integer < 0; }))
        r.fail("parameter '", p.name, "': a piece is not [file, begin, end] of non-negative integers");
      const CheckpointPiece c{static_cast<std::size_t>(f[0].integer), f[1].integer, f[2].integer};
      if (c.file >= m.files.size()) r.fail("parameter '", p.name, "': piece names file ", c.file, " of ", m.files.size());
      if (c.begin != next || c.end <= c.begin)
        r.fail("parameter '", p.name, "': piece [", c.begin, ", ", c.end, ") does not follow the previous one at ", next,
               " (pieces must tile the parameter in order)");
      next = c.end;
      p.pieces.push_back(c);
    }
    if (next != numel)
      r.fail("parameter '", p.name, "': pieces cover [0, ", next, ") of its ", numel, " elements");
    m.parameters.push_back(std::move(p));
  }
  return m;
}

/// The file of a sharded checkpoint directory that describes it: every checkpoint has one.
inline constexpr const char* checkpoint_metadata_file = "metadata.json";

/// Reads and parses `dir`/metadata.json (at most 64 MiB).
inline CheckpointMetadata read_checkpoint_metadata(const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / checkpoint_metadata_file;
  std::ifstream in(path, std::ios::binary);
  POLYSHARD_CHECK(in.good(), "load_checkpoint: '", dir.string(), "' is not a sharded checkpoint: cannot open ",
                  path.string());
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  POLYSHARD_CHECK(size >= 0 && size <= (std::streamoff{64} << 20), "checkpoint metadata '", path.string(), "' is ",
                  size, " bytes, more than the 64 MiB a metadata file may hold");
  in.seekg(0);
  std::string text(static_cast<std::size_t>(size), '\0');
  in.read(text.data(), size);
  POLYSHARD_CHECK(in.good() || in.eof(), "checkpoint metadata '", path.string(), "': read failed");
  return parse_checkpoint_metadata(text, path.string());
}

/// One read that resharding needs: `count` elements starting at element `offset` of the piece of
/// the parameter that begins at `piece_begin` (and holds `piece_size` elements) in file `file`,
/// landing `into` elements after the start of the requested range.
struct CheckpointRead {
  std::size_t file;
  std::int64_t piece_begin, piece_size;
  std::int64_t offset, count, into;
};

/// The reads that fetch elements [begin, end) of parameter `p`: resharding as a pure function of
/// the metadata. The pieces tile the parameter (parse_checkpoint_metadata checked), so the reads
/// cover the range exactly once.
inline std::vector<CheckpointRead> plan_checkpoint_reads(const CheckpointParameter& p, std::int64_t begin, std::int64_t end) {
  POLYSHARD_CHECK(0 <= begin && begin <= end && end <= p.numel(), "plan_checkpoint_reads: range [", begin, ", ", end,
                  ") of parameter '", p.name, "' with ", p.numel(), " elements");
  std::vector<CheckpointRead> reads;
  // The first piece ending after `begin`; pieces are sorted and contiguous.
  auto it = std::upper_bound(p.pieces.begin(), p.pieces.end(), begin,
                             [](std::int64_t x, const CheckpointPiece& c) { return x < c.end; });
  for (; it != p.pieces.end() && it->begin < end; ++it) {
    const std::int64_t lo = std::max(begin, it->begin), hi = std::min(end, it->end);
    reads.push_back({it->file, it->begin, it->end - it->begin, lo - it->begin, hi - lo, lo - begin});
  }
  return reads;
}

}  // namespace polyshard
