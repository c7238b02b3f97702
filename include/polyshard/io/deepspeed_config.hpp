// A DeepSpeed JSON config (the `config` of Lightning's DeepSpeedStrategy, the file the deepspeed
// launcher takes) read into what polyshard's types and settings take from it: the composition
// the file asks for (ZeRO stage, offload devices, precision), which a strategy type must match
// (check_deepspeed_config<S>), the StrategyConfig its keys set, each with the meaning and default
// DeepSpeed documents, and the values of the training loop the caller runs (batch sizes,
// clipping, optimizer). A key with no counterpart, a value polyshard cannot honour, an unknown
// key or a wrong type is an error naming the file and the key, never a silently different run.
#pragma once

#include <nlohmann/json.hpp>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "polyshard/core/dtype.hpp"
#include "polyshard/core/error.hpp"
#include "polyshard/policy/config.hpp"
#include "polyshard/policy/strategy.hpp"

namespace polyshard {

/// Where a ZeRO offload section puts its tensors (its "device"; DeepSpeed's default "none").
enum class OffloadDevice { none, cpu, nvme };

inline const char* offload_device_name(OffloadDevice d) {
  return d == OffloadDevice::cpu ? "cpu" : d == OffloadDevice::nvme ? "nvme" : "none";
}

/// The "optimizer" section: the caller builds the optimizer (polyshard's optimizers are types).
struct DeepSpeedOptimizer {
  /// "adamw", "adam" or "sgd". DeepSpeed's Adam decouples the weight decay unless adam_w_mode is
  /// false, so {"type": "Adam"} reads as "adamw".
  std::string type;
  std::optional<double> lr, eps, momentum;
  /// DeepSpeed's Adam, AdamW and SGD take 0 unless the key is given (torch.optim.AdamW's is 1e-2);
  /// unset only for "auto".
  std::optional<double> weight_decay;
  std::optional<std::pair<double, double>> betas;
  std::optional<bool> nesterov;
};

/// What a DeepSpeed config asks for. Values of "auto" (Hugging Face's convention, which
/// DeepSpeed's integrations fill in from the trainer) are left unset, or, in `strategy`, at the
/// value the reader started from.
struct DeepSpeedConfig {
  std::string source;  ///< the file, for messages

  // The composition, which check_deepspeed_config<S> compares with a strategy type.
  /// zero_optimization.stage; unset without one, where DeepSpeed runs stage 0.
  std::optional<int> stage;
  OffloadDevice offload_optimizer = OffloadDevice::none;  ///< zero_optimization.offload_optimizer.device
  OffloadDevice offload_param = OffloadDevice::none;      ///< zero_optimization.offload_param.device
  /// fp16.enabled, bf16.enabled: DeepSpeed's false where the file has none; unset for "auto".
  std::optional<bool> fp16 = false, bf16 = false;
  /// fp16.consecutive_hysteresis (DeepSpeed's default false): the DynamicLossScale argument.
  std::optional<bool> consecutive_hysteresis;
  /// The file has an activation_checkpointing section: DeepSpeed applies it to the blocks the
  /// model checkpoints (the strategy's checkpointing policy here); its settings are in `strategy`.
  bool activation_checkpointing = false;

  /// The settings: every zero_optimization, aio, fp16 loss-scale and activation_checkpointing key,
  /// and gradient_accumulation_steps, applied over the reader's starting value.
  StrategyConfig strategy;

  // The training loop's, which the caller runs.
  std::optional<std::int64_t> train_batch_size, train_micro_batch_size_per_gpu, steps_per_print;
  /// wall_clock_breakdown (DeepSpeed's default false): print how long forward, backward and the
  /// optimizer step took, every steps_per_print steps.
  std::optional<bool> wall_clock_breakdown;
  std::optional<double> gradient_clipping;  ///< the norm gradients are clipped to; 0: none
  std::optional<DeepSpeedOptimizer> optimizer;

  /// Keys read that set nothing here, each with why, for the caller to show: stage 3's keys for
  /// how DeepSpeed schedules its gathers (which parameters stay whole, when gathered ones are
  /// released) or what it saves, where polyshard's schedule is fixed, and a bucket key of a
  /// stage other than the file's, which DeepSpeed does not read either. None changes the numbers
  /// a run computes.
  std::vector<std::string> notes;
};

/// How read_deepspeed_config reads: the settings to start from, and the keys to check but leave
/// at that start (a command line that wins over the file names its own).
struct DeepSpeedReadOptions {
  StrategyConfig base{};
  /// True for a dotted key ("zero_optimization.reduce_bucket_size") whose StrategyConfig field
  /// keeps base's value; empty: every key applies.
  std::function<bool(std::string_view key)> keep{};
  /// The messages' prefix; empty: "DeepSpeed config <file>".
  std::string source{};
  /// Absent bucket and overlap keys take DeepSpeed's defaults, which depend on the stage (see
  /// zero_optimization's keys); false: base's values stand, for a caller that chooses the
  /// composition itself rather than the file's stage.
  bool deepspeed_defaults = true;
};

namespace detail {

/// Reads one parsed config into a DeepSpeedConfig, key by key, each with a handler.
class DeepSpeedConfigReader {
 public:
  using json = nlohmann::json;

  DeepSpeedConfigReader(DeepSpeedConfig& out, const DeepSpeedReadOptions& options) : c_(out), options_(options) {
    c_.strategy = options.base;
  }

  void read(const json& root) {
    object(root, "", {
        {"train_batch_size",
         [&](const json& v, const std::string& k) { c_.train_batch_size = integer(v, k, 1); }},
        {"train_micro_batch_size_per_gpu",
         [&](const json& v, const std::string& k) { c_.train_micro_batch_size_per_gpu = integer(v, k, 1); }},
        {"gradient_accumulation_steps", [&](const json& v, const std::string& k) {
           set(k, c_.strategy.gradient_accumulation_steps, integer(v, k, 1, std::numeric_limits<int>::max()));
         }},
        {"gradient_clipping", [&](const json& v, const std::string& k) { c_.gradient_clipping = number(v, k, 0); }},
        {"steps_per_print", [&](const json& v, const std::string& k) { c_.steps_per_print = integer(v, k, 1); }},
        {"wall_clock_breakdown",
         [&](const json& v, const std::string& k) { c_.wall_clock_breakdown = boolean(v, k); }},
        // Any optimizer may be sharded.
        {"zero_allow_untested_optimizer", [&](const json& v, const std::string& k) { boolean(v, k); }},
        {"prescale_gradients", [&](const json& v, const std::string& k) {
           refuse_unless(boolean(v, k).value_or(false) == false, k,
                         "gradients are averaged after the reduction, as DeepSpeed's default false does");
         }},
        {"gradient_predivide_factor", [&](const json& v, const std::string& k) {
           refuse_unless(number(v, k, 0).value_or(1.0) == 1.0, k, "gradients are divided by the world size once; "
                                                                  "only DeepSpeed's default 1.0 means that");
         }},
        {"communication_data_type", [&](const json& v, const std::string& k) {
           refuse_unless(v.is_null(), k, "collectives run in the precision policy's reduce type; leave it null");
         }},
        {"optimizer", [&](const json& v, const std::string& k) { optimizer(v, k); }},
        {"scheduler", [&](const json& v, const std::string& k) {
           refuse_unless(v.is_null(), k, "DeepSpeed's schedulers (WarmupLR's log warm-up from warmup_min_lr, ...) "
                                         "have no exact counterpart; schedule the learning rate in the loop");
         }},
        {"fp16", [&](const json& v, const std::string& k) { fp16(v, k); }},
        {"bf16", [&](const json& v, const std::string& k) {
           object(v, k, {{"enabled", [&](const json& e, const std::string& ek) { c_.bf16 = boolean(e, ek); }}});
         }},
        {"zero_optimization", [&](const json& v, const std::string& k) { zero(v, k); }},
        {"aio", [&](const json& v, const std::string& k) { aio(v, k); }},
        {"activation_checkpointing", [&](const json& v, const std::string& k) { activation_checkpointing(v, k); }},
    });
    zero_buckets();
    finish();
  }

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw_error(options_.source, ": ", key, ": ", what);
  }

 private:
  using Handler = std::function<void(const json&, const std::string& key)>;

  void refuse_unless(bool ok, const std::string& key, const std::string& why) const {
    if (!ok) fail(key, "polyshard cannot honour this value: " + why);
  }
  static std::string path(const std::string& parent, const std::string& key) {
    return parent.empty() ? key : parent + "." + key;
  }
  static bool is_auto(const json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

  /// Calls each key's handler; a key without one is an error that lists the keys known there.
  void object(const json& v, const std::string& key, const std::map<std::string, Handler>& handlers) const {
    if (!v.is_object()) fail(key.empty() ? "the file" : key, "expects an object, got " + std::string(v.type_name()));
    for (const auto& [name, value] : v.items()) {
      const auto handler = handlers.find(name);
      if (handler == handlers.end()) {
        std::string known;
        for (const auto& [k, h] : handlers) known += (known.empty() ? "" : ", ") + k;
        fail(path(key, name), "no such key here (known: " + known + ")");
      }
      handler->second(value, path(key, name));
    }
  }

  std::optional<bool> boolean(const json& v, const std::string& key) const {
    if (is_auto(v)) return std::nullopt;
    if (!v.is_boolean()) fail(key, "expects true or false, got " + v.dump());
    return v.get<bool>();
  }
  std::optional<double> number(const json& v, const std::string& key, double min) const {
    if (is_auto(v)) return std::nullopt;
    if (!v.is_number()) fail(key, "expects a number, got " + v.dump());
    const double x = v.get<double>();
    if (!(x >= min)) fail(key, "must be at least " + format(min) + ", got " + v.dump());
    return x;
  }
  /// An integer from min to max; 2e8 (a JSON float with no fraction, as DeepSpeed's docs write
  /// bucket sizes) counts. An int field passes int's largest value as max.
  std::optional<std::int64_t> integer(const json& v, const std::string& key, std::int64_t min,
                                      std::int64_t max = std::numeric_limits<std::int64_t>::max()) const {
    if (is_auto(v)) return std::nullopt;
    if (!v.is_number() || (v.is_number_float() && (std::trunc(v.get<double>()) != v.get<double>() ||
                                                   std::abs(v.get<double>()) > 9.0e15)))
      fail(key, "expects an integer, got " + v.dump());
    const std::int64_t n = v.is_number_float() ? static_cast<std::int64_t>(v.get<double>()) : v.get<std::int64_t>();
    if (n < min) fail(key, "must be at least " + std::to_string(min) + ", got " + v.dump());
    if (n > max) fail(key, "must be at most " + std::to_string(max) + ", got " + v.dump());
    return n;
  }
  std::optional<std::string> text(const json& v, const std::string& key) const {
    if (is_auto(v)) return std::nullopt;
    if (!v.is_string()) fail(key, "expects a string, got " + v.dump());
    return v.get<std::string>();
  }
  static std::string format(double x) {
    std::ostringstream s;
    s << x;
    return s.str();
  }

  /// A StrategyConfig field takes the key's value, unless the key said "auto" or the caller keeps it.
  template <class T, class U>
  void set(const std::string& key, T& field, const std::optional<U>& value) const {
    if (!value || (options_.keep && options_.keep(key))) return;
    field = static_cast<typename FieldValue<T>::type>(*value);
  }
  /// The type a StrategyConfig field holds: an optional field's value type, else the field's.
  template <class T>
  struct FieldValue {
    using type = T;
  };
  template <class T>
  struct FieldValue<std::optional<T>> {
    using type = T;
  };

  // optimizer: {"type": ..., "params": {...}}.
  void optimizer(const json& v, const std::string& key) {
    std::optional<std::string> type;
    json params = json::object();
    const std::string params_key = path(key, "params");
    object(v, key, {{"type", [&](const json& t, const std::string& k) { type = text(t, k); }},
                    {"params", [&](const json& p, const std::string&) { params = p; }}});
    if (!type) fail(path(key, "type"), "is required (Adam, AdamW or SGD)");
    std::string name = *type;
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    DeepSpeedOptimizer o;
    bool weight_decay_key = false;
    std::optional<bool> adam_w_mode;
    std::map<std::string, Handler> known{
        {"lr", [&](const json& x, const std::string& k) { o.lr = number(x, k, 0); }},
        {"weight_decay", [&](const json& x, const std::string& k) {
           o.weight_decay = number(x, k, 0);
           weight_decay_key = true;
         }}};
    if (name == "adam" || name == "adamw") {
      known["eps"] = [&](const json& x, const std::string& k) { o.eps = number(x, k, 0); };
      known["betas"] = [&](const json& x, const std::string& k) {
        if (is_auto(x)) return;
        if (!x.is_array() || x.size() != 2) fail(k, "expects [B1, B2], got " + x.dump());
        const auto b1 = number(x[0], k + "[0]", 0), b2 = number(x[1], k + "[1]", 0);
        if (!b1 || !b2) fail(k, "expects two numbers, got " + x.dump());
        o.betas = std::pair{*b1, *b2};
      };
      known["adam_w_mode"] = [&](const json& x, const std::string& k) { adam_w_mode = boolean(x, k); };
      // The same update either way: torch's Adam or DeepSpeed's fused one.
      known["torch_adam"] = [&](const json& x, const std::string& k) { boolean(x, k); };
    } else if (name == "sgd") {
      known["momentum"] = [&](const json& x, const std::string& k) { o.momentum = number(x, k, 0); };
      known["nesterov"] = [&](const json& x, const std::string& k) { o.nesterov = boolean(x, k); };
    } else {
      fail(path(key, "type"), "'" + *type + "' is not one of polyshard's optimizers (Adam, AdamW, SGD)");
    }
    object(params, params_key, known);
    if (name == "adamw" && adam_w_mode == false) fail(path(params_key, "adam_w_mode"), "false contradicts type AdamW");
    o.type = name == "sgd" ? "sgd" : (name == "adamw" || adam_w_mode.value_or(true) ? "adamw" : "adam");
    if (!weight_decay_key) o.weight_decay = 0.0;
    c_.optimizer = std::move(o);
  }

  // fp16: its loss-scale keys apply when it is enabled; DeepSpeed reads none of them otherwise.
  void fp16(const json& v, const std::string& key) {
    std::optional<double> loss_scale, min_loss_scale;
    std::optional<std::int64_t> initial_scale_power, loss_scale_window, hysteresis;
    constexpr std::int64_t int_max = std::numeric_limits<int>::max();
    object(v, key, {
        {"enabled", [&](const json& x, const std::string& k) { c_.fp16 = boolean(x, k); }},
        {"loss_scale", [&](const json& x, const std::string& k) { loss_scale = number(x, k, 0); }},
        {"initial_scale_power", [&](const json& x, const std::string& k) {
           initial_scale_power = integer(x, k, 0, 62);
         }},
        {"loss_scale_window", [&](const json& x, const std::string& k) {
           loss_scale_window = integer(x, k, 1, int_max);
         }},
        {"hysteresis", [&](const json& x, const std::string& k) { hysteresis = integer(x, k, 1, int_max); }},
        {"min_loss_scale", [&](const json& x, const std::string& k) { min_loss_scale = number(x, k, 0); }},
        {"consecutive_hysteresis",
         [&](const json& x, const std::string& k) { c_.consecutive_hysteresis = boolean(x, k); }},
        {"auto_cast", [&](const json& x, const std::string& k) {
           refuse_unless(boolean(x, k).value_or(false) == false, k, "the engine casts no inputs; leave it false");
         }},
        {"fp16_master_weights_and_grads", [&](const json& x, const std::string& k) {
           refuse_unless(boolean(x, k).value_or(false) == false, k, "Fp16Mixed keeps fp32 master weights");
         }},
    });
    if (!c_.fp16.value_or(false)) return;
    set(path(key, "loss_scale"), c_.strategy.loss_scale, loss_scale);
    set(path(key, "initial_scale_power"), c_.strategy.initial_scale_power, initial_scale_power);
    set(path(key, "loss_scale_window"), c_.strategy.loss_scale_window, loss_scale_window);
    set(path(key, "hysteresis"), c_.strategy.hysteresis, hysteresis);
    set(path(key, "min_loss_scale"), c_.strategy.min_loss_scale, min_loss_scale);
  }

  void offload(const json& v, const std::string& key, OffloadDevice& device, bool parameters) {
    object(v, key, {
        {"device", [&](const json& x, const std::string& k) {
           const auto d = text(x, k);
           if (!d) return;
           if (*d == "none") device = OffloadDevice::none;
           else if (*d == "cpu") device = OffloadDevice::cpu;
           else if (*d == "nvme") device = OffloadDevice::nvme;
           else fail(k, "expects none, cpu or nvme, got " + x.dump());
         }},
        {"nvme_path", [&](const json& x, const std::string& k) { set(k, c_.strategy.nvme_path, text(x, k)); }},
        {"pin_memory", [&](const json& x, const std::string& k) { set(k, c_.strategy.pin_memory, boolean(x, k)); }},
        {"buffer_count", [&](const json& x, const std::string& k) {
           const auto count = integer(x, k, 1, std::numeric_limits<int>::max());
           if (parameters) set(k, c_.strategy.params_buffer_count, count);
           else set(k, c_.strategy.optimizer_buffer_count, count);
         }},
        {"buffer_size", [&](const json& x, const std::string& k) {
           if (!parameters) fail(k, "belongs to offload_param, not offload_optimizer");
           set(k, c_.strategy.params_buffer_size, integer(x, k, 1));
         }},
        {"max_in_cpu", [&](const json& x, const std::string& k) {
           if (!parameters) fail(k, "belongs to offload_param, not offload_optimizer");
           set(k, c_.strategy.max_in_cpu, integer(x, k, 0));
         }},
        {"fast_init", [&](const json& x, const std::string& k) {
           refuse_unless(boolean(x, k).value_or(false) == false, k, "no fast initialisation path; leave it false");
         }},
        {"ratio", [&](const json& x, const std::string& k) {
           refuse_unless(number(x, k, 0).value_or(1.0) == 1.0, k, "the whole optimizer step is offloaded or none");
         }},
    });
  }

  void zero(const json& v, const std::string& key) {
    const auto always_true = [&](const char* what) {
      return [this, what](const json& x, const std::string& k) {
        refuse_unless(boolean(x, k).value_or(true), k, std::string("polyshard always ") + what);
      };
    };
    object(v, key, {
        {"stage", [&](const json& x, const std::string& k) {
           if (const auto s = integer(x, k, 0, 3)) c_.stage = static_cast<int>(*s);
         }},
        {"offload_optimizer",
         [&](const json& x, const std::string& k) { offload(x, k, c_.offload_optimizer, false); }},
        {"offload_param", [&](const json& x, const std::string& k) { offload(x, k, c_.offload_param, true); }},
        // Read here, applied by zero_buckets() once the stage is known.
        {"overlap_comm", [&](const json& x, const std::string& k) { overlap_comm_ = {boolean(x, k)}; }},
        {"reduce_bucket_size", [&](const json& x, const std::string& k) { reduce_bucket_ = {integer(x, k, 1)}; }},
        {"allgather_bucket_size",
         [&](const json& x, const std::string& k) { allgather_bucket_ = {integer(x, k, 1)}; }},
        {"stage3_prefetch_bucket_size",
         [&](const json& x, const std::string& k) { prefetch_bucket_ = {integer(x, k, 0)}; }},
        {"stage3_param_persistence_threshold", no_setting()},
        {"stage3_model_persistence_threshold", no_setting()},
        {"stage3_max_live_parameters", no_setting()},
        {"stage3_max_reuse_distance", no_setting()},
        {"stage3_gather_16bit_weights_on_model_save", [&](const json& x, const std::string& k) {
           if (boolean(x, k).value_or(true) == false)
             c_.notes.push_back(k + " = false: polyshard's exports (save_full_state_dict, polyshard-train --export) "
                                    "always gather the whole model");
         }},
        {"sub_group_size", [&](const json& x, const std::string& k) {
           set(k, c_.strategy.sub_group_size, integer(x, k, 1));
         }},
        {"contiguous_gradients", always_true("copies each unit's gradients into one flat buffer")},
        {"reduce_scatter", always_true("reduces sharded gradients with reduce-scatter")},
        {"allgather_partitions", always_true("gathers a unit's shards with one all-gather")},
        {"round_robin_gradients", [&](const json& x, const std::string& k) {
           refuse_unless(!boolean(x, k).value_or(false), k, "gradients are partitioned as flat even slices");
         }},
        // A checkpoint resumes on any world size either way (load_checkpoint re-slices it).
        {"elastic_checkpoint", [&](const json& x, const std::string& k) { boolean(x, k); }},
    });
  }

  /// A stage 3 scheduling key with no setting here: its value checked (a count of elements) and
  /// kept for the one note zero_buckets() writes about them all.
  Handler no_setting() {
    return [this](const json& x, const std::string& k) {
      const auto n = integer(x, k, 0);
      schedule_keys_.push_back(k + " = " + (n ? std::to_string(*n) : std::string("auto")));
    };
  }

  /// The bucket and overlap keys, with DeepSpeed's defaults where the file has none (unless the
  /// caller keeps the field): reduce_bucket_size 5e8; allgather_bucket_size 5e8, read by stages 1
  /// and 2 only (the all-gather of the updated shards); stage3_prefetch_bucket_size 5e7, read by
  /// stage 3 only, where it is polyshard's prefetch budget (0: no prefetch); overlap_comm true at
  /// stage 3, false below, as DeepSpeed decides it when the file leaves it out.
  void zero_buckets() {
    const int stage = c_.stage.value_or(0);
    if (!schedule_keys_.empty()) {
      std::string keys;
      for (const std::string& k : schedule_keys_) keys += (keys.empty() ? "" : ", ") + k;
      c_.notes.push_back(keys + ": no counterpart; polyshard shards every parameter and releases each unit once it "
                                "has run, holding whole only the root, the unit computing and the units prefetched "
                                "(stage3_prefetch_bucket_size): memory and communication differ from DeepSpeed's, "
                                "the results do not");
    }
    const std::string zero = "zero_optimization";
    const auto apply = [&](const std::string& key, auto& field, const auto& read, auto deepspeed_default) {
      if (read) set(path(zero, key), field, *read);
      else if (options_.deepspeed_defaults) set(path(zero, key), field, std::optional(deepspeed_default));
    };
    apply("reduce_bucket_size", c_.strategy.reduce_bucket_size, reduce_bucket_, std::int64_t{500'000'000});
    apply("overlap_comm", c_.strategy.overlap_comm, overlap_comm_, stage == 3);
    if (stage == 1 || stage == 2) {
      apply("allgather_bucket_size", c_.strategy.allgather_bucket_size, allgather_bucket_,
            std::int64_t{500'000'000});
    } else if (allgather_bucket_) {
      c_.notes.push_back(path(zero, "allgather_bucket_size") + ": read by DeepSpeed's stages 1 and 2 only, and " +
                         "this is stage " + std::to_string(stage) +
                         (stage == 3 ? " (whose prefetch is stage3_prefetch_bucket_size)" : ""));
    }
    // A caller's prefetch = false stands.
    if (stage == 3 && (prefetch_bucket_ || (options_.deepspeed_defaults && c_.strategy.prefetch))) {
      const std::string key = path(zero, "stage3_prefetch_bucket_size");
      const std::optional<std::int64_t> budget =
          prefetch_bucket_ ? *prefetch_bucket_ : std::optional<std::int64_t>(50'000'000);
      if (budget && *budget == 0) set(key, c_.strategy.prefetch, std::optional(false));
      else set(key, c_.strategy.stage3_prefetch_bucket_size, budget);
    } else if (stage != 3 && prefetch_bucket_) {
      c_.notes.push_back(path(zero, "stage3_prefetch_bucket_size") + ": read by DeepSpeed's stage 3 only, and " +
                         "this is stage " + std::to_string(stage));
    }
  }

  // aio: the asynchronous I/O of an offload to NVMe. The sizes are settings; single_submit,
  // overlap_events and thread_count describe how polyshard's file always works, so only
  // DeepSpeed's defaults are accepted.
  void aio(const json& v, const std::string& key) {
    object(v, key, {
        {"block_size", [&](const json& x, const std::string& k) { set(k, c_.strategy.block_size, integer(x, k, 1)); }},
        {"queue_depth", [&](const json& x, const std::string& k) {
           set(k, c_.strategy.queue_depth, integer(x, k, 1, std::numeric_limits<int>::max()));
         }},
        {"single_submit", [&](const json& x, const std::string& k) {
           refuse_unless(!boolean(x, k).value_or(false), k,
                         "the file's I/O thread submits the requests it can start as one batch, as DeepSpeed's "
                         "default false does");
         }},
        {"overlap_events", [&](const json& x, const std::string& k) {
           refuse_unless(boolean(x, k).value_or(true), k, "requests are submitted without waiting for earlier ones "
                                                          "to complete, as DeepSpeed's default true does");
         }},
        {"thread_count", [&](const json& x, const std::string& k) {
           refuse_unless(integer(x, k, 1).value_or(1) == 1, k, "one I/O thread serves each rank's file, as "
                                                               "DeepSpeed's default 1 does");
         }},
    });
  }

  // activation_checkpointing: what the checkpoints the model asks for do; partitioning across
  // model-parallel ranks, which polyshard does not have, is refused.
  void activation_checkpointing(const json& v, const std::string& key) {
    const auto unsupported = [&](const char* why) {
      return [this, why](const json& x, const std::string& k) {
        refuse_unless(!boolean(x, k).value_or(false), k, why);
      };
    };
    object(v, key, {
        {"partition_activations", unsupported("checkpointed activations are kept whole on each rank: "
                                              "partitioning them applies to model parallelism, which polyshard "
                                              "does not have")},
        {"cpu_checkpointing", [&](const json& x, const std::string& k) {
           set(k, c_.strategy.cpu_checkpointing, boolean(x, k));
         }},
        {"contiguous_memory_optimization", [&](const json& x, const std::string& k) {
           set(k, c_.strategy.contiguous_memory_optimization, boolean(x, k));
         }},
        {"synchronize_checkpoint_boundary", [&](const json& x, const std::string& k) {
           set(k, c_.strategy.synchronize_checkpoint_boundary, boolean(x, k));
         }},
        {"profile", unsupported("no per-checkpoint profile; the engine's trace records each unit's forward and "
                                "backward")},
        {"number_checkpoints", [&](const json& x, const std::string& k) {
           if (!x.is_null()) set(k, c_.strategy.number_checkpoints, integer(x, k, 1));
         }},
    });
    c_.activation_checkpointing = true;
  }

  /// The rules several keys decide together (DeepSpeed's, and polyshard's compositions).
  void finish() const {
    if (c_.fp16.value_or(false) && c_.bf16.value_or(false)) fail("fp16.enabled, bf16.enabled", "both are true");
    const int stage = c_.stage.value_or(0);
    if (c_.offload_param != OffloadDevice::none && stage != 3)
      fail("zero_optimization.offload_param", "needs stage 3, as in DeepSpeed");
    if (c_.offload_optimizer != OffloadDevice::none && stage == 0)
      fail("zero_optimization.offload_optimizer", "needs stage 1, 2 or 3, as in DeepSpeed");
    if (c_.offload_param == OffloadDevice::nvme && c_.offload_optimizer != OffloadDevice::nvme)
      fail("zero_optimization.offload_param.device", "nvme without offload_optimizer nvme: polyshard's parameter "
                                                     "offload to NVMe puts the masters and optimizer state there "
                                                     "too; set offload_optimizer.device to nvme");
    if (c_.offload_param == OffloadDevice::cpu && c_.offload_optimizer == OffloadDevice::nvme)
      fail("zero_optimization.offload_optimizer.device", "nvme with offload_param cpu: polyshard offloads the "
                                                         "optimizer to NVMe with the parameters on NVMe or on "
                                                         "the compute device");
    if (c_.offload_optimizer == OffloadDevice::nvme && stage != 3)
      fail("zero_optimization.offload_optimizer.device", "nvme needs stage 3");
  }

  DeepSpeedConfig& c_;
  const DeepSpeedReadOptions& options_;
  // zero_optimization's keys that zero_buckets() applies: unset where the file has none, an
  // unset value inside where it says "auto".
  std::optional<std::optional<bool>> overlap_comm_;
  std::optional<std::optional<std::int64_t>> reduce_bucket_, allgather_bucket_, prefetch_bucket_;
  std::vector<std::string> schedule_keys_;  // "key = value" of the stage 3 keys without a setting here
};

}  // namespace detail

/// Reads a DeepSpeed config already parsed (Lightning's config dict); `options.source` names it in
/// messages.
inline DeepSpeedConfig deepspeed_config_from_json(const nlohmann::json& root, DeepSpeedReadOptions options = {}) {
  if (options.source.empty()) options.source = "DeepSpeed config";
  DeepSpeedConfig c;
  c.source = options.source;
  detail::DeepSpeedConfigReader(c, options).read(root);
  return c;
}

/// Reads the DeepSpeed JSON config `file`. Throws polyshard::Error naming the file and the key on
/// anything polyshard cannot honour.
inline DeepSpeedConfig read_deepspeed_config(const std::filesystem::path& file, DeepSpeedReadOptions options = {}) {
  if (options.source.empty()) options.source = "DeepSpeed config " + file.string();
  std::ifstream in(file);
  POLYSHARD_CHECK(in.good(), options.source, ": cannot be read");
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const nlohmann::json::parse_error& e) {
    detail::throw_error(options.source, ": not JSON: ", e.what());
  }
  return deepspeed_config_from_json(root, std::move(options));
}

/// The ZeRO stage of sharding policy P: what each rank holds 1/N of.
template <class P>
constexpr int zero_stage_of() {
  return P::shards_parameters ? 3 : P::shards_gradients ? 2 : P::shards_optimizer_state ? 1 : 0;
}

/// Refuses, naming the key and the strategy, a config whose composition strategy S is not: its
/// ZeRO stage (DeepSpeed's 0 where the file has none), its offload devices, its precision (fp16
/// is DeepSpeed's dynamic scaler, with the file's consecutive_hysteresis; bf16; neither, fp32).
/// Keys set to "auto" are the caller's, and not compared.
template <StrategyType S>
void check_deepspeed_config(const DeepSpeedConfig& c) {
  using Sharding = typename S::sharding;
  using Offload = typename S::offload;
  using Precision = typename S::precision;
  using Compute = typename Precision::compute_type;
  using Scale = typename Precision::loss_scale;
  const std::string offload = detail::policy_name<Offload>(), precision = detail::policy_name<Precision>();
  const std::string strategy =
      std::string("Strategy<") + detail::policy_name<Sharding>() + ", " + offload + ", " + precision + ">";
  const auto refuse = [&](const char* key, const std::string& file_says, const std::string& type_says) {
    detail::throw_error(c.source, ": ", key, ": ", file_says, ", but the strategy ", strategy, " ", type_says);
  };
  if constexpr (Sharding::hybrid) {
    refuse("zero_optimization.stage", "a DeepSpeed stage", "shards within groups of ranks (HybridShard), which "
                                                          "no DeepSpeed stage does");
  } else {
    constexpr int stage = zero_stage_of<Sharding>();
    if (c.stage.value_or(0) != stage)
      refuse("zero_optimization.stage", "stage " + std::to_string(c.stage.value_or(0)) +
                                            (c.stage ? "" : " (DeepSpeed's, without the key)"),
             "is stage " + std::to_string(stage) + " (" + detail::policy_name<Sharding>() + ")");
  }
  const auto device = [](bool offloaded) {
    return !offloaded ? OffloadDevice::none : Offload::to_nvme ? OffloadDevice::nvme : OffloadDevice::cpu;
  };
  if (c.offload_optimizer != device(Offload::offloads_optimizer))
    refuse("zero_optimization.offload_optimizer.device", offload_device_name(c.offload_optimizer),
           std::string("puts the optimizer ") + offload_device_name(device(Offload::offloads_optimizer)) + " (" +
               offload + ")");
  if (c.offload_param != device(Offload::offloads_parameters))
    refuse("zero_optimization.offload_param.device", offload_device_name(c.offload_param),
           std::string("puts the parameters ") + offload_device_name(device(Offload::offloads_parameters)) + " (" +
               offload + ")");
  if (c.fp16 == false && c.bf16 == false && !std::is_same_v<Compute, float>)
    refuse("fp16.enabled, bf16.enabled", "both false (DeepSpeed's fp32)",
           "does not compute in fp32 (" + precision + ")");
  if (c.fp16) {
    // DeepSpeed's scaler, or a static scale (its loss_scale > 0).
    constexpr bool deepspeed_scale = []() {
      if constexpr (requires { Scale::hysteresis_and_floor; }) return Scale::hysteresis_and_floor;
      else return Scale::scaled && !Scale::dynamic;
    }();
    constexpr bool in_fp16 = std::is_same_v<Compute, half>;
    if (*c.fp16 && !(in_fp16 && deepspeed_scale))
      refuse("fp16.enabled", "true", "does not compute in fp16 with DeepSpeed's loss scaler (" + precision + ")");
    if (!*c.fp16 && in_fp16) refuse("fp16.enabled", "false", "computes in fp16 (" + precision + ")");
  }
  if (c.bf16 && *c.bf16 != std::is_same_v<Compute, bfloat16>)
    refuse("bf16.enabled", *c.bf16 ? "true" : "false",
           std::string(*c.bf16 ? "does not compute" : "computes") + " in bf16 (" + precision + ")");
  if constexpr (requires { Scale::consecutive_hysteresis; }) {
    if (c.fp16.value_or(false) && c.consecutive_hysteresis &&
        *c.consecutive_hysteresis != Scale::consecutive_hysteresis)
      refuse("fp16.consecutive_hysteresis", *c.consecutive_hysteresis ? "true" : "false",
             std::string("scales the loss with consecutive_hysteresis ") +
                 (Scale::consecutive_hysteresis ? "true" : "false") + " (" + precision + ")");
  }
}

}  // namespace polyshard
