// polyshard-train's --deepspeed-config FILE: a DeepSpeed JSON config (the file Lightning's
// DeepSpeedStrategy(config=...) and the deepspeed launcher take) read into Options, each key with
// the meaning and default DeepSpeed documents for it. A key with no counterpart here, a value
// polyshard cannot honour, an unknown key or a wrong type stops the run with a message naming the
// key and the file, never a silently different run. Only main.cpp includes it (through
// command_line.hpp).
#pragma once

#include <nlohmann/json.hpp>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>

#include "options.hpp"
#include "polyshard/core/error.hpp"

namespace train {

/// Whether a flag ("--precision") was set on the command line or in --config: those win over the
/// DeepSpeed file, as the command line wins over --config.
using FlagGiven = std::function<bool(const std::string& flag)>;

namespace detail {

/// Reads one DeepSpeed config into Options. Values of "auto" (Hugging Face's convention, which
/// DeepSpeed's own integrations fill in from the trainer) leave polyshard-train's own value.
class DeepSpeedConfigReader {
 public:
  using json = nlohmann::json;

  DeepSpeedConfigReader(std::string file, Options& o, FlagGiven given)
      : file_(std::move(file)), o_(o), given_(std::move(given)) {}

  void read(const json& root) {
    object(root, "", {
        {"train_batch_size", [&](const json& v, const std::string& k) {
           const auto n = integer(v, k, 1);
           set("--batch", o_.batch, n);
           if (n) o_.batch_given = true;
         }},
        {"train_micro_batch_size_per_gpu",
         [&](const json& v, const std::string& k) {
           if (auto n = integer(v, k, 1)) o_.micro_batch = *n;
         }},
        {"gradient_accumulation_steps",
         [&](const json& v, const std::string& k) { set("--accum", o_.accum, integer(v, k, 1)); }},
        {"gradient_clipping", [&](const json& v, const std::string& k) { set("--clip", o_.clip, number(v, k, 0)); }},
        {"steps_per_print",
         [&](const json& v, const std::string& k) { set("--log-every", o_.log_every, integer(v, k, 1)); }},
        // Timing is always printed; any optimizer runs.
        {"wall_clock_breakdown", [&](const json& v, const std::string& k) { boolean(v, k); }},
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
                                         "have no exact counterpart; set --warmup and --schedule instead");
         }},
        {"fp16", [&](const json& v, const std::string& k) { fp16(v, k); }},
        {"bf16", [&](const json& v, const std::string& k) {
           object(v, k, {{"enabled", [&](const json& e, const std::string& ek) { bf16_ = boolean(e, ek); }}});
         }},
        {"zero_optimization", [&](const json& v, const std::string& k) { zero(v, k); }},
        {"aio", [&](const json& v, const std::string& k) { aio(v, k); }},
        {"activation_checkpointing", [&](const json& v, const std::string& k) { activation_checkpointing(v, k); }},
    });
    finish();
  }

 private:
  using Handler = std::function<void(const json&, const std::string& key)>;

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    polyshard::detail::throw_error("polyshard-train: --deepspeed-config ", file_, ": ", key, ": ", what);
  }
  void refuse_unless(bool ok, const std::string& key, const std::string& why) const {
    if (!ok) fail(key, "polyshard-train cannot honour this value: " + why);
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

  /// The value, unless the flag was given (which wins) or the key said "auto".
  template <class T, class U>
  void set(const std::string& flag, T& field, const std::optional<U>& value) const {
    if (value && !given_(flag)) field = static_cast<T>(*value);
  }

  // optimizer: {"type": ..., "params": {...}}. DeepSpeed's Adam is AdamW unless adam_w_mode is
  // false, and its Adam and AdamW take weight_decay 0 unless given (torch.optim.AdamW's is 1e-2).
  void optimizer(const json& v, const std::string& key) {
    std::optional<std::string> type;
    json params = json::object();
    std::string params_key = path(key, "params");
    object(v, key, {{"type", [&](const json& t, const std::string& k) { type = text(t, k); }},
                    {"params", [&](const json& p, const std::string&) { params = p; }}});
    if (!type) fail(path(key, "type"), "is required (Adam, AdamW or SGD)");
    std::string name = *type;
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    std::optional<double> lr, eps, weight_decay, momentum;
    bool weight_decay_key = false;
    std::optional<bool> nesterov, adam_w_mode, torch_adam;
    std::optional<std::pair<double, double>> betas;
    std::map<std::string, Handler> known{
        {"lr", [&](const json& x, const std::string& k) { lr = number(x, k, 0); }},
        {"weight_decay", [&](const json& x, const std::string& k) {
           weight_decay = number(x, k, 0);
           weight_decay_key = true;
         }}};
    if (name == "adam" || name == "adamw") {
      known["eps"] = [&](const json& x, const std::string& k) { eps = number(x, k, 0); };
      known["betas"] = [&](const json& x, const std::string& k) {
        if (is_auto(x)) return;
        if (!x.is_array() || x.size() != 2) fail(k, "expects [B1, B2], got " + x.dump());
        betas = {*number(x[0], k + "[0]", 0), *number(x[1], k + "[1]", 0)};
      };
      known["adam_w_mode"] = [&](const json& x, const std::string& k) { adam_w_mode = boolean(x, k); };
      known["torch_adam"] = [&](const json& x, const std::string& k) { torch_adam = boolean(x, k); };
    } else if (name == "sgd") {
      known["momentum"] = [&](const json& x, const std::string& k) { momentum = number(x, k, 0); };
      known["nesterov"] = [&](const json& x, const std::string& k) { nesterov = boolean(x, k); };
    } else {
      fail(path(key, "type"), "'" + *type + "' is not one of polyshard's optimizers (Adam, AdamW, SGD)");
    }
    object(params, params_key, known);
    // DeepSpeed: "Adam" with adam_w_mode true (its default) decouples the weight decay.
    std::string chosen = name == "sgd" ? "sgd" : (name == "adamw" || adam_w_mode.value_or(true) ? "adamw" : "adam");
    if (name == "adamw" && adam_w_mode == false) fail(path(params_key, "adam_w_mode"), "false contradicts type AdamW");
    (void)torch_adam;  // the same update either way: torch's Adam or DeepSpeed's fused one
    set("--optimizer", o_.optimizer, std::optional<std::string>(chosen));
    set("--lr", o_.lr, lr);
    set("--eps", o_.eps, eps);
    set("--momentum", o_.momentum, momentum);
    set("--nesterov", o_.nesterov, nesterov);
    set("--weight-decay", o_.weight_decay, weight_decay_key ? weight_decay : std::optional<double>(0.0));
    if (betas && !given_("--betas")) std::tie(o_.beta1, o_.beta2) = *betas;
  }

  // fp16: its loss-scale keys apply when it is enabled; DeepSpeed reads none of them otherwise.
  void fp16(const json& v, const std::string& key) {
    std::optional<double> loss_scale, min_loss_scale;
    std::optional<std::int64_t> initial_scale_power, loss_scale_window, hysteresis;
    object(v, key, {
        {"enabled", [&](const json& x, const std::string& k) { fp16_ = boolean(x, k); }},
        {"loss_scale", [&](const json& x, const std::string& k) { loss_scale = number(x, k, 0); }},
        {"initial_scale_power", [&](const json& x, const std::string& k) { initial_scale_power = integer(x, k, 0); }},
        {"loss_scale_window", [&](const json& x, const std::string& k) { loss_scale_window = integer(x, k, 1); }},
        {"hysteresis", [&](const json& x, const std::string& k) { hysteresis = integer(x, k, 1); }},
        {"min_loss_scale", [&](const json& x, const std::string& k) { min_loss_scale = number(x, k, 0); }},
        {"consecutive_hysteresis", [&](const json& x, const std::string& k) {
           refuse_unless(boolean(x, k).value_or(false) == false, k,
                         "polyshard-train's fp16 scaler is DynamicLossScale<> with DeepSpeed's default false "
                         "(true is DynamicLossScale's ConsecutiveHysteresis argument, chosen at compile time)");
         }},
        {"auto_cast", [&](const json& x, const std::string& k) {
           refuse_unless(boolean(x, k).value_or(false) == false, k,
                         "the model's inputs are token ids; there is nothing to cast");
         }},
        {"fp16_master_weights_and_grads", [&](const json& x, const std::string& k) {
           refuse_unless(boolean(x, k).value_or(false) == false, k, "Fp16Mixed keeps fp32 master weights");
         }},
    });
    if (fp16_.value_or(false)) {
      set("--loss-scale", o_.loss_scale, loss_scale);
      set("--initial-scale-power", o_.initial_scale_power, initial_scale_power);
      set("--loss-scale-window", o_.loss_scale_window, loss_scale_window);
      set("--hysteresis", o_.hysteresis, hysteresis);
      set("--min-loss-scale", o_.min_loss_scale, min_loss_scale);
    }
  }

  void offload(const json& v, const std::string& key, std::optional<std::string>& device, bool parameters) {
    object(v, key, {
        {"device", [&](const json& x, const std::string& k) {
           device = text(x, k);
           if (device && *device != "none" && *device != "cpu" && *device != "nvme")
             fail(k, "expects none, cpu or nvme, got " + x.dump());
         }},
        {"nvme_path", [&](const json& x, const std::string& k) { set("--nvme-path", o_.settings.nvme_path, text(x, k)); }},
        {"pin_memory", [&](const json& x, const std::string& k) {
           set("--pin-memory", o_.settings.pin_memory, boolean(x, k));
         }},
        {"buffer_count", [&](const json& x, const std::string& k) {
           const auto count = integer(x, k, 1, std::numeric_limits<int>::max());
           if (parameters) set("--params-buffer-count", o_.settings.params_buffer_count, count);
           else set("--optimizer-buffer-count", o_.settings.optimizer_buffer_count, count);
         }},
        {"buffer_size", [&](const json& x, const std::string& k) {
           if (!parameters) fail(k, "belongs to offload_param, not offload_optimizer");
           set("--params-buffer-size", o_.settings.params_buffer_size, integer(x, k, 1));
         }},
        {"max_in_cpu", [&](const json& x, const std::string& k) {
           if (!parameters) fail(k, "belongs to offload_param, not offload_optimizer");
           set("--max-in-cpu", o_.settings.max_in_cpu, integer(x, k, 0));
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
           stage_ = integer(x, k, 0);
           if (stage_ && *stage_ > 3) fail(k, "expects 0, 1, 2 or 3, got " + x.dump());
         }},
        {"offload_optimizer", [&](const json& x, const std::string& k) { offload(x, k, offload_optimizer_, false); }},
        {"offload_param", [&](const json& x, const std::string& k) { offload(x, k, offload_param_, true); }},
        {"overlap_comm", [&](const json& x, const std::string& k) {
           set("--overlap-comm", o_.settings.overlap_comm, boolean(x, k));
         }},
        {"reduce_bucket_size", [&](const json& x, const std::string& k) {
           set("--reduce-bucket-size", o_.settings.reduce_bucket_size, integer(x, k, 1));
         }},
        {"allgather_bucket_size", [&](const json& x, const std::string& k) {
           set("--allgather-bucket-size", o_.settings.allgather_bucket_size, integer(x, k, 1));
         }},
        {"sub_group_size", [&](const json& x, const std::string& k) {
           set("--sub-group-size", o_.settings.sub_group_size, integer(x, k, 1));
         }},
        {"contiguous_gradients", always_true("copies each unit's gradients into one flat buffer")},
        {"reduce_scatter", always_true("reduces sharded gradients with reduce-scatter")},
        {"allgather_partitions", always_true("gathers a unit's shards with one all-gather")},
        {"round_robin_gradients", [&](const json& x, const std::string& k) {
           refuse_unless(!boolean(x, k).value_or(false), k, "gradients are partitioned as flat even slices");
         }},
        {"elastic_checkpoint", [&](const json& x, const std::string& k) {
           boolean(x, k);  // a checkpoint resumes on any world size (--resume) either way
         }},
    });
  }

  // aio: the asynchronous I/O of an offload to NVMe (Lightning's block_size, queue_depth,
  // single_submit, overlap_events and thread_count). The sizes are settings; the other three
  // describe how polyshard's file always works, so only DeepSpeed's defaults are accepted.
  void aio(const json& v, const std::string& key) {
    object(v, key, {
        {"block_size", [&](const json& x, const std::string& k) {
           set("--block-size", o_.settings.block_size, integer(x, k, 1));
         }},
        {"queue_depth", [&](const json& x, const std::string& k) {
           set("--queue-depth", o_.settings.queue_depth, integer(x, k, 1, std::numeric_limits<int>::max()));
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

  // activation_checkpointing: DeepSpeed's settings for the checkpointing a model asks for; here
  // the section turns on --checkpoint-activations (each block recomputed in backward), and its
  // single-rank settings set StrategyConfig's fields; partitioning across model-parallel ranks,
  // which polyshard does not have, is refused.
  void activation_checkpointing(const json& v, const std::string& key) {
    const auto unsupported = [&](const char* why) {
      return [this, why](const json& x, const std::string& k) {
        refuse_unless(!boolean(x, k).value_or(false), k, why);
      };
    };
    object(v, key, {
        {"partition_activations", unsupported("checkpointed activations are kept whole on each rank")},
        {"cpu_checkpointing", [&](const json& x, const std::string& k) {
           set("--cpu-checkpointing", o_.settings.cpu_checkpointing, boolean(x, k));
         }},
        {"contiguous_memory_optimization", [&](const json& x, const std::string& k) {
           set("--contiguous-memory-optimization", o_.settings.contiguous_memory_optimization, boolean(x, k));
         }},
        {"synchronize_checkpoint_boundary", [&](const json& x, const std::string& k) {
           set("--synchronize-checkpoint-boundary", o_.settings.synchronize_checkpoint_boundary, boolean(x, k));
         }},
        {"profile", unsupported("no per-checkpoint profile; --trace records each unit's forward and backward")},
        {"number_checkpoints", [&](const json& x, const std::string& k) {
           refuse_unless(x.is_null(), k, "every block is a checkpoint; leave it null");
         }},
    });
    set("--checkpoint-activations", o_.checkpoint_activations, std::optional<bool>(true));
  }

  /// The strategy and the precision, which several keys decide together.
  void finish() {
    if (fp16_.value_or(false) && bf16_.value_or(false)) fail("fp16.enabled, bf16.enabled", "both are true");
    if (fp16_.value_or(false)) set("--precision", o_.precision, std::optional<std::string>("fp16-mixed"));
    if (bf16_.value_or(false)) set("--precision", o_.precision, std::optional<std::string>("bf16-mixed"));
    if (!(stage_ || offload_optimizer_ || offload_param_)) return;  // no zero_optimization: --strategy stands
    const std::string opt = offload_optimizer_.value_or("none"), param = offload_param_.value_or("none");
    const std::int64_t stage = stage_.value_or(0);
    const std::string where = "zero_optimization.stage " + std::to_string(stage) + " with offload_optimizer " + opt +
                              " and offload_param " + param;
    std::string family;
    if (param != "none" && stage != 3) fail("zero_optimization.offload_param", "needs stage 3, as in DeepSpeed");
    if (param == "nvme" && opt != "nvme")
      fail("zero_optimization.offload_param.device", "nvme without offload_optimizer nvme: polyshard's parameter "
                                                     "offload to NVMe puts the masters and optimizer state there "
                                                     "too; set offload_optimizer.device to nvme");
    if (opt == "nvme" && stage != 3) fail("zero_optimization.offload_optimizer.device", "nvme needs stage 3");
    if (stage == 0 && opt == "none") family = "ddp";
    else if (stage == 1 && opt == "none") family = "zero1";
    else if (stage == 1 && opt == "cpu") family = "zero1_offload";
    else if (stage == 2 && opt == "none") family = "zero2";
    else if (stage == 2 && opt == "cpu") family = "zero_offload";
    else if (stage == 3 && opt == "none" && param == "none") family = "zero3";
    else if (stage == 3 && opt == "cpu" && param == "none") family = "zero3_offload_optimizer";
    else if (stage == 3 && opt == "cpu" && param == "cpu") family = "zero3_offload";
    else if (stage == 3 && opt == "nvme" && param == "none") family = "zero_infinity";
    else if (stage == 3 && opt == "nvme" && param == "nvme") family = "zero_infinity_parameters";
    else if (stage == 3 && opt == "none" && param == "cpu") family = "zero3_offload_parameters";
    else fail(where, "polyshard-train has no strategy of this composition");
    set("--strategy", o_.strategy, std::optional<std::string>(family));
  }

  std::string file_;
  Options& o_;
  FlagGiven given_;
  std::optional<bool> fp16_, bf16_;
  std::optional<std::int64_t> stage_;
  std::optional<std::string> offload_optimizer_, offload_param_;
};

}  // namespace detail

/// Reads the DeepSpeed JSON config `file` into `o`, leaving the flags for which `given` is true.
/// Throws polyshard::Error naming the file and the key on anything it cannot honour.
inline void apply_deepspeed_config(const std::string& file, Options& o, const FlagGiven& given) {
  std::ifstream in(file);
  POLYSHARD_CHECK(in.good(), "polyshard-train: --deepspeed-config ", file, ": cannot be read");
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const nlohmann::json::parse_error& e) {
    polyshard::detail::throw_error("polyshard-train: --deepspeed-config ", file, ": not JSON: ", e.what());
  }
  detail::DeepSpeedConfigReader(file, o, given).read(root);
}

}  // namespace train
