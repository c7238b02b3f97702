// A DeepSpeed JSON config read into polyshard's settings: every key DeepSpeed documents lands in
// its field with DeepSpeed's meaning, absent keys keep DeepSpeed's defaults, "auto" and the keys
// a caller keeps leave the caller's values, and anything polyshard cannot honour is an error
// naming the file and the key. check_deepspeed_config compares the file's composition with a
// strategy type.
#include <catch2/catch.hpp>

#include <fstream>
#include <string>
#include <string_view>

#include "io/temp_dir.hpp"
#include "polyshard/io/deepspeed_config.hpp"
#include "polyshard/policy/presets.hpp"

using namespace polyshard;

namespace {

DeepSpeedConfig read(std::string_view text, DeepSpeedReadOptions options = {}) {
  options.source = "ds.json";
  return deepspeed_config_from_json(nlohmann::json::parse(text), std::move(options));
}

/// The message read() throws for `text`.
std::string refusal(std::string_view text) {
  try {
    read(text);
  } catch (const Error& e) {
    return e.what();
  }
  return "(read without an error)";
}

template <class S>
std::string mismatch(std::string_view text) {
  const auto c = read(text);
  try {
    check_deepspeed_config<S>(c);
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

// Every key the reader applies, none at DeepSpeed's or StrategyConfig's default.
constexpr std::string_view every_key = R"({
  "train_batch_size": 24, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3,
  "gradient_clipping": 0.5, "steps_per_print": 7, "wall_clock_breakdown": true,
  "zero_allow_untested_optimizer": true, "prescale_gradients": false, "gradient_predivide_factor": 1.0,
  "communication_data_type": null, "scheduler": null,
  "optimizer": {"type": "Adam", "params": {"lr": 0.002, "betas": [0.8, 0.95], "eps": 1e-6,
                                           "weight_decay": 0.1, "adam_w_mode": false, "torch_adam": true}},
  "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 500,
           "hysteresis": 3, "min_loss_scale": 4, "consecutive_hysteresis": false, "auto_cast": false,
           "fp16_master_weights_and_grads": false},
  "bf16": {"enabled": false},
  "zero_optimization": {
    "stage": 3, "overlap_comm": false, "reduce_bucket_size": 5e7, "stage3_prefetch_bucket_size": 3e7,
    "sub_group_size": 1000000, "contiguous_gradients": true, "reduce_scatter": true, "allgather_partitions": true,
    "round_robin_gradients": false, "elastic_checkpoint": true,
    "offload_optimizer": {"device": "nvme", "nvme_path": "/scratch", "pin_memory": true, "buffer_count": 8,
                          "fast_init": false, "ratio": 1.0},
    "offload_param": {"device": "nvme", "nvme_path": "/scratch", "pin_memory": true, "buffer_count": 6,
                      "buffer_size": 2e7, "max_in_cpu": 5e8}},
  "aio": {"block_size": 262144, "queue_depth": 16, "single_submit": false, "overlap_events": true,
          "thread_count": 1},
  "activation_checkpointing": {"partition_activations": false, "cpu_checkpointing": true,
                               "contiguous_memory_optimization": true, "synchronize_checkpoint_boundary": true,
                               "profile": false, "number_checkpoints": 24}
})";

}  // namespace

TEST_CASE("a DeepSpeed config sets every field its keys name, with DeepSpeed's meaning", "[io][deepspeed]") {
  const auto c = read(every_key);
  CHECK(c.stage == 3);
  CHECK(c.offload_optimizer == OffloadDevice::nvme);
  CHECK(c.offload_param == OffloadDevice::nvme);
  CHECK(c.fp16 == true);
  CHECK(c.bf16 == false);
  CHECK(c.consecutive_hysteresis == false);
  CHECK(c.activation_checkpointing);
  CHECK(c.train_batch_size == 24);
  CHECK(c.train_micro_batch_size_per_gpu == 2);
  CHECK(c.gradient_clipping == 0.5);
  CHECK(c.steps_per_print == 7);
  REQUIRE(c.optimizer);
  CHECK(c.optimizer->type == "adam");  // adam_w_mode false: DeepSpeed's Adam with L2 decay
  CHECK(c.optimizer->lr == 0.002);
  CHECK(c.optimizer->betas == std::pair{0.8, 0.95});
  CHECK(c.optimizer->eps == 1e-6);
  CHECK(c.optimizer->weight_decay == 0.1);

  const StrategyConfig& s = c.strategy;
  CHECK(s.gradient_accumulation_steps == 3);
  CHECK(s.overlap_comm == false);
  CHECK(s.reduce_bucket_size == 50'000'000);  // 5e7: a float with no fraction is an integer
  CHECK(s.stage3_prefetch_bucket_size == 30'000'000);  // stage 3's prefetch budget
  CHECK(s.allgather_bucket_size == StrategyConfig{}.allgather_bucket_size);  // not read at stage 3
  CHECK(s.prefetch);
  CHECK(c.wall_clock_breakdown == true);
  CHECK(c.notes.empty());
  CHECK(s.sub_group_size == 1'000'000);
  CHECK(s.nvme_path == "/scratch");
  CHECK(s.pin_memory);
  CHECK(s.optimizer_buffer_count == 8);
  CHECK(s.params_buffer_count == 6);
  CHECK(s.params_buffer_size == 20'000'000);
  CHECK(s.max_in_cpu == 500'000'000);
  CHECK(s.block_size == 262'144);
  CHECK(s.queue_depth == 16);
  CHECK(s.loss_scale == 0);
  CHECK(s.initial_scale_power == 12);
  CHECK(s.loss_scale_window == 500);
  CHECK(s.hysteresis == 3);
  CHECK(s.min_loss_scale == 4);
  CHECK(s.cpu_checkpointing);
  CHECK(s.contiguous_memory_optimization);
  CHECK(s.number_checkpoints == 24);
  CHECK(s.synchronize_checkpoint_boundary);
}

TEST_CASE("absent DeepSpeed keys keep DeepSpeed's defaults", "[io][deepspeed]") {
  const auto c = read("{}");
  const StrategyConfig d;
  CHECK_FALSE(c.stage);  // DeepSpeed's stage 0, which check_deepspeed_config compares
  CHECK(c.offload_optimizer == OffloadDevice::none);
  CHECK(c.offload_param == OffloadDevice::none);
  CHECK(c.fp16 == false);
  CHECK(c.bf16 == false);
  CHECK_FALSE(c.activation_checkpointing);
  CHECK_FALSE(c.optimizer);
  CHECK_FALSE(c.train_batch_size);
  CHECK_FALSE(c.wall_clock_breakdown);
  CHECK(c.strategy.number_checkpoints == 0);  // DeepSpeed's null
  CHECK(read(R"({"activation_checkpointing": {"number_checkpoints": null}})").strategy.number_checkpoints == 0);
  // DeepSpeed's bucket defaults, not Lightning's 2e8: reduce_bucket_size 5e8 at every stage, and
  // overlap_comm only where DeepSpeed turns it on by itself, at stage 3.
  CHECK(c.strategy.reduce_bucket_size == 500'000'000);
  CHECK(c.strategy.overlap_comm == false);
  CHECK(c.strategy.allgather_bucket_size == d.allgather_bucket_size);  // stage 0 gathers nothing
  const auto stage2 = read(R"({"zero_optimization": {"stage": 2}})");
  CHECK(stage2.strategy.allgather_bucket_size == 500'000'000);  // stages 1 and 2: the all-gather's pieces
  CHECK(stage2.strategy.overlap_comm == false);
  const auto stage3 = read(R"({"zero_optimization": {"stage": 3}})");
  CHECK(stage3.strategy.stage3_prefetch_bucket_size == 50'000'000);  // DeepSpeed's 5e7
  CHECK(stage3.strategy.allgather_bucket_size == d.allgather_bucket_size);
  CHECK_FALSE(stage2.strategy.stage3_prefetch_bucket_size);
  CHECK(stage3.strategy.prefetch);
  CHECK(stage3.strategy.overlap_comm == true);
  CHECK(stage3.strategy.reduce_bucket_size == 500'000'000);
  CHECK(c.strategy.gradient_accumulation_steps == 1);
  CHECK(c.strategy.optimizer_buffer_count == 4);
  CHECK(c.strategy.params_buffer_count == 5);
  CHECK_FALSE(c.strategy.hysteresis);

  // An optimizer section without weight_decay: DeepSpeed's 0, not torch.optim.AdamW's 1e-2; its
  // Adam decouples the decay (adam_w_mode true).
  const auto adam = read(R"({"optimizer": {"type": "Adam", "params": {"lr": 0.1}}})");
  CHECK(adam.optimizer->type == "adamw");
  CHECK(adam.optimizer->weight_decay == 0.0);
  // The loss-scale keys are read only with fp16 enabled, as DeepSpeed reads them.
  const auto off = read(R"({"fp16": {"enabled": false, "hysteresis": 5, "loss_scale_window": 9}})");
  CHECK_FALSE(off.strategy.hysteresis);
  CHECK_FALSE(off.strategy.loss_scale_window);
}

TEST_CASE("stage 3's keys: stage3_prefetch_bucket_size is the prefetch budget, allgather_bucket_size belongs to "
          "stages 1 and 2, the scheduling keys are read with a note",
          "[io][deepspeed]") {
  using Catch::Contains;
  const auto budget = read(R"({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 1234}})");
  CHECK(budget.strategy.stage3_prefetch_bucket_size == 1234);
  CHECK(budget.strategy.prefetch);
  CHECK(budget.notes.empty());
  // 0: DeepSpeed fetches nothing ahead.
  const auto none = read(R"({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 0}})");
  CHECK_FALSE(none.strategy.prefetch);
  CHECK_FALSE(none.strategy.stage3_prefetch_bucket_size);
  // Each key read only by the stages DeepSpeed reads it at; elsewhere a note says so.
  const auto gather3 = read(R"({"zero_optimization": {"allgather_bucket_size": 777, "stage": 3}})");
  CHECK(gather3.strategy.allgather_bucket_size == StrategyConfig{}.allgather_bucket_size);
  CHECK(gather3.strategy.stage3_prefetch_bucket_size == 50'000'000);
  REQUIRE(gather3.notes.size() == 1);
  CHECK_THAT(gather3.notes[0], Contains("zero_optimization.allgather_bucket_size: read by DeepSpeed's stages 1 and 2"));
  const auto gather2 = read(R"({"zero_optimization": {"stage": 2, "allgather_bucket_size": 777,
                                                      "stage3_prefetch_bucket_size": 99}})");
  CHECK(gather2.strategy.allgather_bucket_size == 777);
  CHECK_FALSE(gather2.strategy.stage3_prefetch_bucket_size);
  CHECK(gather2.strategy.prefetch);
  REQUIRE(gather2.notes.size() == 1);
  CHECK_THAT(gather2.notes[0], Contains("stage3_prefetch_bucket_size: read by DeepSpeed's stage 3 only"));
  // Hugging Face's ZeRO-3 template: its scheduling keys in one note, the numbers unchanged.
  const auto hf = read(R"({"zero_optimization": {"stage": 3, "overlap_comm": true, "contiguous_gradients": true,
      "sub_group_size": 1e9, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
      "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": 1e9,
      "stage3_max_reuse_distance": 1e9, "stage3_gather_16bit_weights_on_model_save": true}})");
  REQUIRE(hf.notes.size() == 1);
  CHECK_THAT(hf.notes[0], Contains("zero_optimization.stage3_max_live_parameters = 1000000000, "
                                   "zero_optimization.stage3_max_reuse_distance = 1000000000, "
                                   "zero_optimization.stage3_param_persistence_threshold = auto: no counterpart") &&
                              Contains("the results do not"));
  CHECK(hf.strategy.reduce_bucket_size == StrategyConfig{}.reduce_bucket_size);    // "auto": the caller's
  CHECK(hf.strategy.allgather_bucket_size == StrategyConfig{}.allgather_bucket_size);
  CHECK_FALSE(hf.strategy.stage3_prefetch_bucket_size);  // "auto": the caller's
  const auto unsaved =
      read(R"({"zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": false}})");
  REQUIRE(unsaved.notes.size() == 1);
  CHECK_THAT(unsaved.notes[0], Contains("always gather the whole model"));
  // The values are still checked.
  CHECK_THAT(refusal(R"({"zero_optimization": {"stage": 3, "stage3_max_live_parameters": "lots"}})"),
             Contains("ds.json: zero_optimization.stage3_max_live_parameters: expects an integer"));
  CHECK_THAT(refusal(R"({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": -1}})"),
             Contains("stage3_prefetch_bucket_size: must be at least 0"));
}

TEST_CASE("auto and the keys a caller keeps leave the caller's settings", "[io][deepspeed]") {
  StrategyConfig base;
  base.reduce_bucket_size = 7;
  base.queue_depth = 3;
  base.hysteresis = 4;
  const auto automatic = read(R"({"zero_optimization": {"stage": "auto", "reduce_bucket_size": "auto"},
                                 "fp16": {"enabled": "auto"}, "aio": {"queue_depth": 16}})",
                              {.base = base});
  CHECK(automatic.strategy.reduce_bucket_size == 7);
  CHECK(automatic.strategy.queue_depth == 16);
  CHECK(automatic.strategy.hysteresis == 4);
  CHECK_FALSE(automatic.stage);
  CHECK_FALSE(automatic.fp16);  // not compared by check_deepspeed_config

  const auto kept = read(R"({"zero_optimization": {"stage": 2, "reduce_bucket_size": 100},
                            "fp16": {"enabled": true, "hysteresis": 9}, "aio": {"queue_depth": 16}})",
                         {.base = base, .keep = [](std::string_view key) {
                            return key == "zero_optimization.reduce_bucket_size" || key == "fp16.hysteresis";
                          }});
  CHECK(kept.strategy.reduce_bucket_size == 7);
  CHECK(kept.strategy.hysteresis == 4);
  CHECK(kept.strategy.queue_depth == 16);
  CHECK(kept.stage == 2);

  // A caller that picks the composition itself keeps its values for the keys the file leaves
  // out, whose DeepSpeed defaults depend on the file's stage; the keys the file has still apply.
  const auto own = read(R"({"zero_optimization": {"stage": 3, "reduce_bucket_size": 100}})",
                        {.base = base, .deepspeed_defaults = false});
  CHECK(own.strategy.reduce_bucket_size == 100);
  CHECK(own.strategy.allgather_bucket_size == base.allgather_bucket_size);
  CHECK(own.strategy.stage3_prefetch_bucket_size == base.stage3_prefetch_bucket_size);
  CHECK(own.strategy.overlap_comm == base.overlap_comm);
}

TEST_CASE("a DeepSpeed key polyshard cannot honour is an error naming the file and the key", "[io][deepspeed]") {
  using Catch::Contains;
  CHECK_THAT(refusal(R"({"zero_optimization": {"stage": 3, "stage_three": 1}})"),
             Contains("ds.json: zero_optimization.stage_three: no such key here") && Contains("reduce_bucket_size"));
  CHECK_THAT(refusal(R"({"fp16": {"enabled": "yes"}})"), Contains("fp16.enabled: expects true or false"));
  CHECK_THAT(refusal(R"({"zero_optimization": {"stage": 2.5}})"), Contains("zero_optimization.stage: expects an "
                                                                            "integer"));
  CHECK_THAT(refusal(R"({"zero_optimization": {"stage": 4}})"), Contains("zero_optimization.stage: must be at most 3"));
  CHECK_THAT(refusal(R"({"fp16": {"initial_scale_power": 63}})"), Contains("fp16.initial_scale_power: must be at "
                                                                           "most 62"));
  CHECK_THAT(refusal(R"({"activation_checkpointing": {"partition_activations": true}})"),
             Contains("activation_checkpointing.partition_activations: polyshard cannot honour") &&
                 Contains("model parallelism, which polyshard does not have"));
  CHECK_THAT(refusal(R"({"activation_checkpointing": {"number_checkpoints": 0}})"),
             Contains("activation_checkpointing.number_checkpoints: must be at least 1"));
  CHECK_THAT(refusal(R"({"scheduler": {"type": "WarmupLR"}})"), Contains("scheduler: polyshard cannot honour"));
  CHECK_THAT(refusal(R"({"optimizer": {"type": "Lamb"}})"), Contains("optimizer.type: 'Lamb' is not one of"));
  CHECK_THAT(refusal(R"({"optimizer": {"type": "AdamW", "params": {"momentum": 0.9}}})"),
             Contains("optimizer.params.momentum: no such key here"));
  CHECK_THAT(refusal(R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})"),
             Contains("zero_optimization.offload_param: needs stage 3"));
  CHECK_THAT(refusal(R"({"zero_optimization": {"offload_optimizer": {"device": "cpu"}}})"),
             Contains("zero_optimization.offload_optimizer: needs stage 1, 2 or 3"));
  CHECK_THAT(refusal(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}})"),
             Contains("without offload_optimizer nvme"));
  CHECK_THAT(refusal(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}})"),
             Contains("nvme needs stage 3"));
  CHECK_THAT(refusal(R"({"zero_optimization": {"offload_optimizer": {"device": "disk"}}})"),
             Contains("offload_optimizer.device: expects none, cpu or nvme"));
  CHECK_THAT(refusal(R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})"), Contains("both are true"));
  CHECK_THAT(refusal(R"({"zero_optimization": {"contiguous_gradients": false}})"),
             Contains("zero_optimization.contiguous_gradients: polyshard cannot honour"));
  CHECK_THAT(refusal(R"({"aio": {"thread_count": 2}})"), Contains("aio.thread_count: polyshard cannot honour"));
  CHECK_THAT(refusal("[1, 2]"), Contains("ds.json: the file: expects an object"));

  const test::TempDir dir;
  const auto file = dir / "broken.json";
  std::ofstream(file) << R"({"fp16": )";
  CHECK_THROWS_WITH(read_deepspeed_config(file), Contains("DeepSpeed config " + file.string() + ": not JSON"));
  CHECK_THROWS_WITH(read_deepspeed_config(dir / "absent.json"), Contains("absent.json: cannot be read"));
}

TEST_CASE("check_deepspeed_config accepts the strategy a config describes and names what differs", "[io][deepspeed]") {
  using Catch::Contains;
  // Each preset with the file that describes it.
  CHECK(mismatch<DDP>("{}") == "(accepted)");
  CHECK(mismatch<ZeRO<1>>(R"({"zero_optimization": {"stage": 1}})") == "(accepted)");
  CHECK(mismatch<ZeRO<2>>(R"({"zero_optimization": {"stage": 2}})") == "(accepted)");
  CHECK(mismatch<ZeRO<3>>(R"({"zero_optimization": {"stage": 3}})") == "(accepted)");
  CHECK(mismatch<ZeROOffload>(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})") ==
        "(accepted)");
  CHECK(mismatch<ZeROInfinity>(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}})") ==
        "(accepted)");
  CHECK(mismatch<ZeROInfinityParameters>(R"({"zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "nvme"}, "offload_param": {"device": "nvme"}}})") == "(accepted)");
  CHECK(mismatch<Strategy<ShardParameters<true>, OffloadParameters<Cpu>>>(R"({"zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}})") == "(accepted)");
  CHECK(mismatch<Strategy<ShardParameters<true>, OffloadParametersOnly<Cpu>>>(
            R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}})") == "(accepted)");
  CHECK(mismatch<ZeRO<2>::with<Fp16Mixed>>(R"({"zero_optimization": {"stage": 2}, "fp16": {"enabled": true}})") ==
        "(accepted)");
  CHECK(mismatch<ZeRO<2>::with<Bf16Mixed>>(R"({"zero_optimization": {"stage": 2}, "bf16": {"enabled": true}})") ==
        "(accepted)");
  CHECK(mismatch<ZeRO<2>::with<Bf16Mixed>>(R"({"zero_optimization": {"stage": 2}, "bf16": {"enabled": "auto"}})") ==
        "(accepted)");

  // What differs, named with the key and the strategy's policy.
  CHECK_THAT(mismatch<ZeRO<3>>(R"({"zero_optimization": {"stage": 2}})"),
             Contains("ds.json: zero_optimization.stage: stage 2, but the strategy Strategy<ShardParameters") &&
                 Contains("is stage 3"));
  CHECK_THAT(mismatch<ZeRO<1>>("{}"), Contains("stage 0 (DeepSpeed's, without the key)"));
  CHECK_THAT(mismatch<ZeRO<2>>(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})"),
             Contains("offload_optimizer.device: cpu") && Contains("puts the optimizer none (NoOffload)"));
  CHECK_THAT(mismatch<ZeROInfinity>(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"},
      "offload_param": {"device": "nvme"}}})"),
             Contains("offload_param.device: nvme") && Contains("puts the parameters none"));
  // fp16 is DeepSpeed's scaler: PyTorch's GradScaler (Fp16Amp) is a different run.
  CHECK_THAT(mismatch<ZeRO<2>::with<Fp16Amp>>(R"({"zero_optimization": {"stage": 2}, "fp16": {"enabled": true}})"),
             Contains("fp16.enabled: true") && Contains("DeepSpeed's loss scaler (Fp16Amp)"));
  // fp16 off with bf16 left to the caller: whatever the scaler, a strategy computing in fp16 differs.
  CHECK_THAT(mismatch<ZeRO<2>::with<Fp16Amp>>(R"({"zero_optimization": {"stage": 2}, "fp16": {"enabled": false},
      "bf16": {"enabled": "auto"}})"),
             Contains("fp16.enabled: false") && Contains("computes in fp16 (Fp16Amp)"));
  CHECK_THAT(mismatch<ZeRO<2>::with<Bf16Mixed>>(R"({"zero_optimization": {"stage": 2}})"),
             Contains("both false (DeepSpeed's fp32)") && Contains("Bf16Mixed"));
  CHECK_THAT(mismatch<ZeRO<2>>(R"({"zero_optimization": {"stage": 2}, "bf16": {"enabled": true}})"),
             Contains("bf16.enabled: true") && Contains("does not compute in bf16"));
  CHECK_THAT(mismatch<ZeRO<2>::with<Fp16Mixed>>(R"({"zero_optimization": {"stage": 2},
      "fp16": {"enabled": true, "consecutive_hysteresis": true}})"),
             Contains("fp16.consecutive_hysteresis: true") && Contains("consecutive_hysteresis false"));
  using Consecutive = MixedPrecision<half, half, float, DynamicLossScale<16, 1000, 2, 1, true>>;
  CHECK(mismatch<ZeRO<2>::with<Consecutive>>(R"({"zero_optimization": {"stage": 2},
      "fp16": {"enabled": true, "consecutive_hysteresis": true}})") == "(accepted)");
  CHECK_THAT(mismatch<Strategy<HybridShard<ShardParameters<true>>>>(R"({"zero_optimization": {"stage": 3}})"),
             Contains("HybridShard"));
}
