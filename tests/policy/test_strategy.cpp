// Strategy<...> picks one policy per family in any order with defaults, with_t rebinds one family,
// presets and StrategyConfig carry the reference documents' defaults, accounting is ZeRO's.
#include <catch2/catch.hpp>

#include <functional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include "polyshard/nn/block.hpp"
#include "polyshard/nn/mlp.hpp"
#include "polyshard/policy/policy.hpp"

using namespace polyshard;
using std::is_same_v;

// The families of S, as one comparable type.
template <class S>
using families_t =
    std::tuple<typename S::sharding, typename S::offload, typename S::precision, typename S::wrap, typename S::checkpointing>;

// One composition, spelled in several orders.
using Permutations = std::tuple<
    Strategy<ShardParameters<false>, OffloadParameters<Cpu>, Bf16Mixed, WrapByType<Block>, ActivationCheckpointing<Block>>,
    Strategy<ActivationCheckpointing<Block>, WrapByType<Block>, Bf16Mixed, OffloadParameters<Cpu>, ShardParameters<false>>,
    Strategy<Bf16Mixed, ShardParameters<false>, ActivationCheckpointing<Block>, OffloadParameters<Cpu>, WrapByType<Block>>,
    Strategy<WrapByType<Block>, ActivationCheckpointing<Block>, ShardParameters<false>, Bf16Mixed, OffloadParameters<Cpu>>>;

TEMPLATE_LIST_TEST_CASE("Strategy picks each family whatever the order", "[policy]", Permutations) {
  STATIC_REQUIRE(StrategyType<TestType>);
  STATIC_REQUIRE(is_same_v<typename TestType::sharding, ShardParameters<false>>);
  STATIC_REQUIRE(is_same_v<typename TestType::offload, OffloadParameters<Cpu>>);
  STATIC_REQUIRE(is_same_v<typename TestType::precision, Bf16Mixed>);
  STATIC_REQUIRE(is_same_v<typename TestType::wrap, WrapByType<Block>>);
  STATIC_REQUIRE(is_same_v<typename TestType::checkpointing, ActivationCheckpointing<Block>>);
  STATIC_REQUIRE(is_same_v<typename TestType::compute_type, bfloat16>);
  STATIC_REQUIRE(is_same_v<typename TestType::reduce_type, bfloat16>);
  STATIC_REQUIRE(is_same_v<typename TestType::master_type, float>);
}

TEST_CASE("families left out take their defaults", "[policy]") {
  using Empty = Strategy<>;
  STATIC_REQUIRE(is_same_v<families_t<Empty>, std::tuple<NoShard, NoOffload, Fp32, WrapWhole, NoActivationCheckpointing>>);
  STATIC_REQUIRE(is_same_v<Empty::compute_type, float>);
  STATIC_REQUIRE(is_same_v<Empty::master_type, float>);
  STATIC_REQUIRE(is_same_v<Empty::defaults, TorchDefaults>);
  STATIC_REQUIRE(is_same_v<Strategy<DeepSpeedDefaults, ShardGradients>::defaults, DeepSpeedDefaults>);

  // One family given: that family set, every other one at its default.
  STATIC_REQUIRE(is_same_v<families_t<Strategy<ShardGradients>>,
                           std::tuple<ShardGradients, NoOffload, Fp32, WrapWhole, NoActivationCheckpointing>>);
  STATIC_REQUIRE(is_same_v<families_t<Strategy<Fp16Mixed>>,
                           std::tuple<NoShard, NoOffload, Fp16Mixed, WrapWhole, NoActivationCheckpointing>>);
  STATIC_REQUIRE(is_same_v<families_t<Strategy<WrapBySize<1000>>>,
                           std::tuple<NoShard, NoOffload, Fp32, WrapBySize<1000>, NoActivationCheckpointing>>);
  STATIC_REQUIRE(is_same_v<families_t<Strategy<ActivationCheckpointing<Block>>>,
                           std::tuple<NoShard, NoOffload, Fp32, WrapWhole, ActivationCheckpointing<Block>>>);
  STATIC_REQUIRE(is_same_v<families_t<Strategy<OffloadOptimizer<Cpu>, ShardOptimizerState>>,
                           std::tuple<ShardOptimizerState, OffloadOptimizer<Cpu>, Fp32, WrapWhole, NoActivationCheckpointing>>);
}

TEST_CASE("with_t rebinds one family and keeps the others", "[policy]") {
  using S = Strategy<ShardParameters<true>, OffloadParameters<Cpu>, Fp16Mixed, WrapByType<Block>>;

  using Bf16 = with_t<S, Bf16Mixed>;
  STATIC_REQUIRE(is_same_v<families_t<Bf16>, std::tuple<ShardParameters<true>, OffloadParameters<Cpu>, Bf16Mixed,
                                                        WrapByType<Block>, NoActivationCheckpointing>>);
  using GradOp = with_t<S, ShardParameters<false>>;
  STATIC_REQUIRE(is_same_v<families_t<GradOp>, std::tuple<ShardParameters<false>, OffloadParameters<Cpu>, Fp16Mixed,
                                                          WrapByType<Block>, NoActivationCheckpointing>>);
  using BySize = with_t<S, WrapBySize<>>;
  STATIC_REQUIRE(is_same_v<families_t<BySize>, std::tuple<ShardParameters<true>, OffloadParameters<Cpu>, Fp16Mixed,
                                                          WrapBySize<>, NoActivationCheckpointing>>);
  using Checkpointed = with_t<S, ActivationCheckpointing<Block>>;
  STATIC_REQUIRE(is_same_v<families_t<Checkpointed>, std::tuple<ShardParameters<true>, OffloadParameters<Cpu>, Fp16Mixed,
                                                                WrapByType<Block>, ActivationCheckpointing<Block>>>);
  using OnDevice = with_t<S, NoOffload>;
  STATIC_REQUIRE(is_same_v<families_t<OnDevice>,
                           std::tuple<ShardParameters<true>, NoOffload, Fp16Mixed, WrapByType<Block>, NoActivationCheckpointing>>);

  // Rebinding twice: the last one wins; rebinding to the same member changes nothing.
  STATIC_REQUIRE(is_same_v<families_t<with_t<with_t<S, Bf16Mixed>, PureBf16>>,
                           families_t<with_t<S, PureBf16>>>);
  STATIC_REQUIRE(is_same_v<families_t<with_t<S, Fp16Mixed>>, families_t<S>>);
  // Rebinding keeps the defaults policy, and rebinds it like any other.
  STATIC_REQUIRE(is_same_v<with_t<ZeRO<2>, OffloadOptimizer<Cpu>>::defaults, DeepSpeedDefaults>);
  STATIC_REQUIRE(is_same_v<with_t<ZeRO<2>, TorchDefaults>::defaults, TorchDefaults>);
  STATIC_REQUIRE(is_same_v<families_t<with_t<ZeRO<2>, TorchDefaults>>, families_t<ZeRO<2>>>);
  // A preset rebinds like any strategy: ZeRO-Offload at stage 3.
  STATIC_REQUIRE(is_same_v<families_t<with_t<ZeROOffload, ShardParameters<>>>,
                           std::tuple<ShardParameters<true>, OffloadOptimizer<Cpu>, Fp32, WrapWhole, NoActivationCheckpointing>>);
}

TEMPLATE_LIST_TEST_CASE("canonical_t spells a composition one way whatever the order and the defaults left out",
                        "[policy]", Permutations) {
  using Canonical = Strategy<ShardParameters<false>, OffloadParameters<Cpu>, Bf16Mixed, WrapByType<Block>,
                             ActivationCheckpointing<Block>>;
  STATIC_REQUIRE(is_same_v<canonical_t<TestType>, Canonical>);
  STATIC_REQUIRE(is_same_v<canonical_t<Canonical>, Canonical>);
  STATIC_REQUIRE(is_same_v<families_t<canonical_t<TestType>>, families_t<TestType>>);
}

TEST_CASE("canonical_t writes the defaults out and keeps different compositions apart", "[policy]") {
  STATIC_REQUIRE(
      is_same_v<canonical_t<Strategy<>>, Strategy<NoShard, NoOffload, Fp32, WrapWhole, NoActivationCheckpointing>>);
  STATIC_REQUIRE(is_same_v<canonical_t<Strategy<WrapByType<Block>, ShardParameters<true>>>,
                           canonical_t<Strategy<ShardParameters<true>, NoOffload, WrapByType<Block>, Fp32>>>);
  STATIC_REQUIRE(is_same_v<canonical_t<ZeRO<3>>, canonical_t<with_t<ZeRO<3>, Fp32>>>);
  STATIC_REQUIRE_FALSE(
      is_same_v<canonical_t<Strategy<ShardParameters<true>>>, canonical_t<Strategy<ShardParameters<false>>>>);
  STATIC_REQUIRE_FALSE(
      is_same_v<canonical_t<Strategy<ShardGradients>>, canonical_t<Strategy<ShardGradients, Bf16Mixed>>>);
}

TEST_CASE("each family's concept admits its members and no others", "[policy]") {
  STATIC_REQUIRE(ShardingPolicy<NoShard>);
  STATIC_REQUIRE(ShardingPolicy<ShardParameters<false>>);
  STATIC_REQUIRE(ShardingPolicy<HybridShard<ShardGradients>>);
  STATIC_REQUIRE_FALSE(ShardingPolicy<Fp32>);
  STATIC_REQUIRE(OffloadPolicy<OffloadParameters<Nvme>>);
  STATIC_REQUIRE_FALSE(OffloadPolicy<NoShard>);
  STATIC_REQUIRE(PrecisionPolicy<Fp16Mixed>);
  STATIC_REQUIRE(PrecisionPolicy<MixedPrecision<bfloat16, float, float>>);
  STATIC_REQUIRE_FALSE(PrecisionPolicy<WrapWhole>);
  STATIC_REQUIRE(WrapPolicy<WrapByType<Block>>);
  STATIC_REQUIRE(WrapPolicy<ManualWrap>);
  STATIC_REQUIRE_FALSE(WrapPolicy<NoOffload>);
  STATIC_REQUIRE(CheckpointingPolicy<ActivationCheckpointing<Block>>);
  STATIC_REQUIRE_FALSE(Policy<int>);
  STATIC_REQUIRE_FALSE(Policy<Block<float>>);
  STATIC_REQUIRE_FALSE(StrategyType<NoShard>);
  STATIC_REQUIRE(StrategyType<ZeRO<3>>);
}

TEST_CASE("sharding policies refine one another", "[policy]") {
  STATIC_REQUIRE(!NoShard::shards_optimizer_state && !NoShard::shards_gradients && !NoShard::shards_parameters);
  STATIC_REQUIRE(ShardOptimizerState::shards_optimizer_state && !ShardOptimizerState::shards_gradients);
  STATIC_REQUIRE(ShardGradients::shards_optimizer_state && ShardGradients::shards_gradients &&
                 !ShardGradients::shards_parameters);
  STATIC_REQUIRE(ShardParameters<>::shards_gradients && ShardParameters<>::shards_parameters);
  STATIC_REQUIRE(ShardParameters<>::reshard_after_forward);
  STATIC_REQUIRE_FALSE(ShardParameters<false>::reshard_after_forward);
  using Hybrid = HybridShard<ShardParameters<false>>;
  STATIC_REQUIRE(Hybrid::hybrid && !ShardParameters<false>::hybrid);
  STATIC_REQUIRE(is_same_v<Hybrid::inner, ShardParameters<false>>);
  STATIC_REQUIRE(Hybrid::shards_parameters && !Hybrid::reshard_after_forward);
  CHECK(std::string_view(ShardParameters<false>::name) == "ShardParameters<false>");
  CHECK(std::string_view(ShardParameters<true>::name) == "ShardParameters");
}

TEST_CASE("offload policies say what moves where", "[policy]") {
  STATIC_REQUIRE(!NoOffload::offloads_optimizer && !NoOffload::offloads_parameters && !NoOffload::to_nvme);
  STATIC_REQUIRE(OffloadOptimizer<>::offloads_optimizer && !OffloadOptimizer<>::offloads_parameters);
  STATIC_REQUIRE(is_same_v<OffloadOptimizer<>::target, Cpu>);  // Lightning: offload_optimizer_device='cpu'
  STATIC_REQUIRE(!OffloadOptimizer<Cpu>::to_nvme && OffloadOptimizer<Nvme>::to_nvme);
  // Parameters offload with the optimizer.
  STATIC_REQUIRE(OffloadParameters<>::offloads_parameters && OffloadParameters<>::offloads_optimizer);
  STATIC_REQUIRE(is_same_v<OffloadParameters<>::target, Cpu>);  // Lightning: offload_params_device='cpu'
  STATIC_REQUIRE(OffloadParameters<Nvme>::to_nvme);
  CHECK(std::string_view(OffloadParameters<Nvme>::name) == "OffloadParameters<Nvme>");
  CHECK(std::string_view(OffloadOptimizer<Cpu>::name) == "OffloadOptimizer<Cpu>");
  // DeepSpeed's offload_param alone: the parameter shards on the host, the optimizer where it computes.
  STATIC_REQUIRE(OffloadParametersOnly<>::offloads_parameters && !OffloadParametersOnly<>::offloads_optimizer);
  STATIC_REQUIRE(is_same_v<OffloadParametersOnly<>::target, Cpu> && !OffloadParametersOnly<>::to_nvme);
  CHECK(std::string_view(OffloadParametersOnly<>::name) == "OffloadParametersOnly<Cpu>");
}

TEST_CASE("precision policies and loss scaling carry DeepSpeed's defaults", "[policy]") {
  // initial_scale_power=16, loss_scale_window=1000, hysteresis=2, min_loss_scale=1.
  using D = DynamicLossScale<>;
  STATIC_REQUIRE(D::scaled && D::dynamic);
  STATIC_REQUIRE(D::initial_scale == 65536.0);
  STATIC_REQUIRE(D::window == 1000);
  STATIC_REQUIRE(D::hysteresis == 2);
  STATIC_REQUIRE(D::min_scale == 1.0);
  STATIC_REQUIRE(!D::consecutive_hysteresis);  // DeepSpeed's consecutive_hysteresis=false
  STATIC_REQUIRE(DynamicLossScale<8, 50, 1, 4>::initial_scale == 256.0);
  STATIC_REQUIRE(DynamicLossScale<8, 50, 1, 4>::min_scale == 4.0);
  STATIC_REQUIRE(StaticLossScale<10>::scaled && !StaticLossScale<10>::dynamic);
  STATIC_REQUIRE(StaticLossScale<10>::initial_scale == 1024.0);
  STATIC_REQUIRE(!NoLossScale::scaled && NoLossScale::initial_scale == 1.0);

  STATIC_REQUIRE(is_same_v<Fp32::compute_type, float> && is_same_v<Fp32::master_type, float> && !Fp32::mixed);
  STATIC_REQUIRE(is_same_v<Fp32::loss_scale, NoLossScale>);
  STATIC_REQUIRE(is_same_v<Fp16Mixed::compute_type, half> && is_same_v<Fp16Mixed::reduce_type, half>);
  STATIC_REQUIRE(is_same_v<Fp16Mixed::master_type, float> && Fp16Mixed::mixed);
  STATIC_REQUIRE(is_same_v<Fp16Mixed::loss_scale, DynamicLossScale<16, 1000, 2, 1, false>>);
  // PyTorch's GradScaler (FSDP and FairScale's ShardedGradScaler): init_scale 65536,
  // growth_interval 2000, growth_factor 2, backoff_factor 0.5, no hysteresis and no minimum.
  using G = GradScalerLossScale<>;
  STATIC_REQUIRE(G::scaled && G::dynamic && G::initial_scale == 65536.0 && G::window == 2000);
  STATIC_REQUIRE(G::hysteresis == 1 && G::min_scale == 0.0 && G::backoff == 0.5);
  STATIC_REQUIRE(is_same_v<Fp16Amp::loss_scale, G> && is_same_v<Fp16Amp::compute_type, half>);
  STATIC_REQUIRE(is_same_v<Fp16Amp::reduce_type, half> && is_same_v<Fp16Amp::master_type, float>);
  STATIC_REQUIRE(is_same_v<Bf16Mixed::compute_type, bfloat16> && is_same_v<Bf16Mixed::master_type, float>);
  STATIC_REQUIRE(is_same_v<Bf16Mixed::loss_scale, NoLossScale> && Bf16Mixed::mixed);
  STATIC_REQUIRE(is_same_v<PureBf16::master_type, bfloat16> && !PureBf16::mixed);
  // FSDP's fp32_reduce_scatter: low-precision compute, gradients reduced in fp32.
  using Fp32Reduce = MixedPrecision<half, float, float, DynamicLossScale<>>;
  STATIC_REQUIRE(is_same_v<Fp32Reduce::reduce_type, float> && is_same_v<Fp32Reduce::compute_type, half>);
  // ShardedDataParallel's reduce_fp16: fp32 compute, gradients reduced in fp16.
  using Fp16Reduce = MixedPrecision<float, half>;
  STATIC_REQUIRE(is_same_v<Fp16Reduce::reduce_type, half> && is_same_v<Fp16Reduce::master_type, float>);
  STATIC_REQUIRE(!Fp16Reduce::mixed);
  // Reduce defaults to compute, master to float.
  STATIC_REQUIRE(is_same_v<MixedPrecision<bfloat16>::reduce_type, bfloat16>);
  STATIC_REQUIRE(is_same_v<MixedPrecision<bfloat16>::master_type, float>);
}

TEST_CASE("wrap and checkpointing policies select module types", "[policy]") {
  STATIC_REQUIRE(WrapByType<Block>::wraps_type<Block<float>>);
  STATIC_REQUIRE(WrapByType<Block>::wraps_type<Block<double>>);
  STATIC_REQUIRE(WrapByType<Block>::wraps_type<Block<bfloat16, Cuda>>);  // the same template on a device
  STATIC_REQUIRE_FALSE(WrapByType<Block>::wraps_type<Mlp<float, Cuda>>);
  STATIC_REQUIRE_FALSE(WrapByType<Block>::wraps_type<Mlp<float>>);
  STATIC_REQUIRE_FALSE(WrapByType<Block>::wraps_type<int>);
  STATIC_REQUIRE(WrapByType<Block, Mlp>::wraps_type<Mlp<float>>);
  STATIC_REQUIRE(WrapByType<Block>::min_num_params == 0 && !WrapByType<Block>::manual);
  STATIC_REQUIRE_FALSE(WrapWhole::wraps_type<Block<float>>);
  STATIC_REQUIRE(WrapWhole::min_num_params == 0);
  STATIC_REQUIRE(WrapBySize<>::min_num_params == 100'000'000);  // FairScale strategy: min_num_params=1e8
  STATIC_REQUIRE(WrapBySize<4096>::min_num_params == 4096);
  STATIC_REQUIRE(ManualWrap::manual);
  STATIC_REQUIRE(ActivationCheckpointing<Block>::checkpoints_type<Block<float>>);
  STATIC_REQUIRE_FALSE(ActivationCheckpointing<Block>::checkpoints_type<Mlp<float>>);
  STATIC_REQUIRE_FALSE(NoActivationCheckpointing::checkpoints_type<Block<float>>);
}

TEST_CASE("presets are the strategies their documents describe", "[policy]") {
  // DDP: replicas.
  STATIC_REQUIRE(is_same_v<families_t<DDP>, std::tuple<NoShard, NoOffload, Fp32, WrapWhole, NoActivationCheckpointing>>);
  STATIC_REQUIRE(is_same_v<DDP::defaults, TorchDefaults>);
  // FairScale OSS + ShardedDataParallel: gradients and optimizer state sharded, parameters whole;
  // FairScale's defaults, on ZeRO-2's engine.
  STATIC_REQUIRE(is_same_v<ShardedDDP::sharding, ShardGradients>);
  STATIC_REQUIRE(is_same_v<ShardedDDP::offload, NoOffload>);
  STATIC_REQUIRE(is_same_v<ShardedDDP::defaults, FairScaleShardedDefaults>);
  STATIC_REQUIRE(is_same_v<canonical_t<ShardedDDP>, canonical_t<ZeRO<2>>>);
  // Lightning's DDPFullyShardedStrategy: reshard_after_forward=True, min_num_params=1e8,
  // cpu_offload=False, compute_dtype float32 unless mixed precision.
  STATIC_REQUIRE(FSDP::sharding::shards_parameters);
  STATIC_REQUIRE(FSDP::sharding::reshard_after_forward);
  STATIC_REQUIRE(!FSDP::sharding::hybrid);
  STATIC_REQUIRE(FSDP::wrap::min_num_params == 100'000'000);
  STATIC_REQUIRE(is_same_v<FSDP::offload, NoOffload>);
  STATIC_REQUIRE(is_same_v<FSDP::precision, Fp32>);
  STATIC_REQUIRE(is_same_v<FSDP::defaults, TorchDefaults>);
  // DeepSpeed stages: 0 disabled, 1 optimizer state, 2 and gradients, 3 and parameters.
  STATIC_REQUIRE(is_same_v<ZeRO<0>::sharding, NoShard>);
  STATIC_REQUIRE(is_same_v<ZeRO<1>::sharding, ShardOptimizerState>);
  STATIC_REQUIRE(is_same_v<ZeRO<2>::sharding, ShardGradients>);
  STATIC_REQUIRE(is_same_v<ZeRO<3>::sharding, ShardParameters<true>>);
  // DeepSpeedStrategy() with no arguments: zero_optimization=True, stage=2.
  STATIC_REQUIRE(is_same_v<ZeRO<>, ZeRO<2>>);
  STATIC_REQUIRE(is_same_v<families_t<ZeRO<>>,
                           std::tuple<ShardGradients, NoOffload, Fp32, WrapWhole, NoActivationCheckpointing>>);
  // Stage 3 gathers layer by layer: every repeated module of at least 1e5 parameters is a unit
  // (DeepSpeed's stage3_param_persistence_threshold), ZeRO-Infinity as well.
  STATIC_REQUIRE(is_same_v<ZeRO<3>::wrap, WrapRepeated<100'000>>);
  STATIC_REQUIRE(is_same_v<ZeROInfinity::wrap, WrapRepeated<100'000>>);
  STATIC_REQUIRE(is_same_v<families_t<ZeRO<1>>,
                           std::tuple<ShardOptimizerState, NoOffload, Fp32, WrapWhole, NoActivationCheckpointing>>);
  // Lightning's DeepSpeedStrategy defaults to stage=2, with offload_optimizer_device='cpu' when
  // offloading: ZeROOffload is its deepspeed_stage_2_offload.
  STATIC_REQUIRE(is_same_v<families_t<ZeROOffload>, families_t<with_t<ZeRO<2>, OffloadOptimizer<Cpu>>>>);
  STATIC_REQUIRE(!ZeROOffload::offload::offloads_parameters && !ZeROOffload::offload::to_nvme);
  // ZeRO-Infinity: stage 3, optimizer state on NVMe.
  STATIC_REQUIRE(is_same_v<ZeROInfinity::sharding, ShardParameters<true>>);
  STATIC_REQUIRE(is_same_v<ZeROInfinity::offload, OffloadOptimizer<Nvme>>);
  // Every DeepSpeed preset with DeepSpeed's defaults.
  STATIC_REQUIRE(is_same_v<ZeRO<0>::defaults, DeepSpeedDefaults>);
  STATIC_REQUIRE(is_same_v<ZeRO<1>::defaults, DeepSpeedDefaults>);
  STATIC_REQUIRE(is_same_v<ZeRO<2>::defaults, DeepSpeedDefaults>);
  STATIC_REQUIRE(is_same_v<ZeRO<3>::defaults, DeepSpeedDefaults>);
  STATIC_REQUIRE(is_same_v<ZeROOffload::defaults, DeepSpeedDefaults>);
  STATIC_REQUIRE(is_same_v<ZeROInfinity::defaults, DeepSpeedDefaults>);
  STATIC_REQUIRE(is_same_v<ZeROInfinityParameters::defaults, DeepSpeedDefaults>);
}

TEST_CASE("StrategyConfig carries the reference documents' defaults", "[policy]") {
  const StrategyConfig c;
  // The gradient-bucket caps: unset, each strategy's reference's (the preset's DefaultsPolicy).
  CHECK_FALSE((c.bucket_cap_mb || c.reduce_bucket_size || c.reduce_buffer_size));
  CHECK(with_reference_defaults<DDP>(c).bucket_cap_mb == 25);     // DDP's and FSDP's bucket_cap_mb
  CHECK(with_reference_defaults<FSDP>(c).bucket_cap_mb == 25);
  CHECK(with_reference_defaults<ZeRO<>>(c).reduce_bucket_size == 200'000'000);  // Lightning's reduce_bucket_size
  CHECK(with_reference_defaults<ShardedDDP>(c).reduce_buffer_size == 1 << 23);  // ShardedDataParallel's
  CHECK(c.allgather_bucket_size == 200'000'000);    // DeepSpeed allgather_bucket_size
  CHECK_FALSE(c.stage3_prefetch_bucket_size);       // unset: the next unit only
  CHECK(c.overlap_comm);                            // DeepSpeed overlap_comm
  CHECK(c.min_num_params == 0);                    // 0: WrapBySize's own threshold applies
  CHECK(c.gradient_accumulation_steps == 1);        // DeepSpeed gradient_accumulation_steps
  CHECK(c.broadcast_buffers);                       // ShardedDataParallel
  CHECK(c.sync_models_at_startup);                  // ShardedDataParallel
  CHECK(c.auto_refresh_trainable);                  // ShardedDataParallel
  CHECK(c.warn_on_trainable_params_changed);        // ShardedDataParallel
  CHECK(c.loss_scale == 0);                         // DeepSpeed: 0 is dynamic
  // Unset: the precision policy's own numbers, DeepSpeed's 16, 1000, 2 and 1 for Fp16Mixed
  // (checked with the scaler in tests/engine/test_loss_scaling.cpp).
  CHECK_FALSE(c.initial_scale_power.has_value());
  CHECK_FALSE(c.loss_scale_window.has_value());
  CHECK_FALSE(c.hysteresis.has_value());
  CHECK_FALSE(c.min_loss_scale.has_value());
  CHECK(c.nvme_path == "/local_nvme");
  CHECK(c.block_size == 1'048'576);
  CHECK(c.queue_depth == 8);
  CHECK_FALSE(c.pin_memory);
  CHECK(c.optimizer_buffer_count == 4);
  CHECK(c.params_buffer_count == 5);
  CHECK(c.params_buffer_size == 100'000'000);
  CHECK(c.max_in_cpu == 1'000'000'000);
  CHECK(c.sub_group_size == 1'000'000'000'000);
  CHECK(c.state_dict_to_cpu);                       // FSDP state_dict_to_cpu
  CHECK_FALSE(c.cpu_checkpointing);                 // DeepSpeed activation_checkpointing.cpu_checkpointing
  CHECK_FALSE(c.contiguous_memory_optimization);    // contiguous_memory_optimization
  CHECK(c.number_checkpoints == 0);                 // DeepSpeed's number_checkpoints: null
  CHECK_FALSE(c.synchronize_checkpoint_boundary);   // and synchronize_checkpoint_boundary
  CHECK_FALSE(c.move_grads_to_cpu.has_value());     // FSDP: None, cpu_offload's value
}

TEST_CASE("sub_group_sizes cuts an optimizer span into sub_group_size pieces, the rest last", "[policy]") {
  using V = std::vector<std::int64_t>;
  CHECK(sub_group_sizes(10, 4) == V{4, 4, 2});
  CHECK(sub_group_sizes(12, 4) == V{4, 4, 4});
  CHECK(sub_group_sizes(3, 4) == V{3});
  CHECK(sub_group_sizes(5, 1) == V{1, 1, 1, 1, 1});
  CHECK(sub_group_sizes(0, 4) == V{0});  // an empty span is one empty group
  CHECK(sub_group_sizes(2'197, StrategyConfig{}.sub_group_size) == V{2'197});
  CHECK_THROWS_WITH(sub_group_sizes(10, 0), Catch::Contains("sub_group_size") && Catch::Contains("got 0"));
  CHECK_THROWS_WITH(sub_group_sizes(10, -3), Catch::Contains("sub_group_size") && Catch::Contains("got -3"));
}

TEST_CASE("StrategyConfig fields a composition does not read are refused for it, and free for one that does",
          "[policy]") {
  // For a model on device D (the host unless named).
  const auto refused_on = []<class S, class D>(S, D, auto set) {
    StrategyConfig c;
    set(c);
    try {
      refuse_fields_not_read_by<S, D>(c);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  const auto refused = [&](auto strategy, auto set) { return refused_on(strategy, Cpu{}, set); };
  const auto nvme_path = [](StrategyConfig& c) { c.nvme_path = "/scratch"; };
  const auto queue_depth = [](StrategyConfig& c) { c.queue_depth = 2; };
  const auto block_size = [](StrategyConfig& c) { c.block_size = 8192; };
  const auto buffers = [](StrategyConfig& c) { c.optimizer_buffer_count = 8; };
  const auto group = [](StrategyConfig& c) { c.hybrid_group_size = 2; };
  const std::vector<std::function<void(StrategyConfig&)>> nvme_settings{nvme_path, queue_depth, block_size, buffers};
  for (const auto& nvme_setting : nvme_settings) {
    CHECK_THAT(refused(ZeRO<3>{}, nvme_setting), Catch::Contains("NVMe settings") && Catch::Contains("NoOffload"));
    CHECK_THAT(refused(ZeROOffload{}, nvme_setting), Catch::Contains("OffloadOptimizer<Cpu>"));
    CHECK(refused(ZeROInfinity{}, nvme_setting) == "(accepted)");
  }
  CHECK_THAT(refused(ZeRO<3>{}, nvme_path), Catch::Contains("nvme_path '/scratch'"));
  // The parameter-offload settings: read by OffloadParameters<Nvme> alone.
  const std::vector<std::function<void(StrategyConfig&)>> parameter_settings{
      [](StrategyConfig& c) { c.params_buffer_count = 2; }, [](StrategyConfig& c) { c.params_buffer_size = 7; },
      [](StrategyConfig& c) { c.max_in_cpu = 0; }};
  for (const auto& setting : parameter_settings) {
    CHECK_THAT(refused(ZeRO<3>{}, setting), Catch::Contains("read only under OffloadParameters<Nvme>"));
    CHECK_THAT(refused(ZeROInfinity{}, setting), Catch::Contains("OffloadOptimizer<Nvme>"));
    CHECK(refused(ZeROInfinityParameters{}, setting) == "(accepted)");
  }
  CHECK_THAT(refused(ZeRO<3>{}, parameter_settings[0]), Catch::Contains("params_buffer_count (2)"));
  CHECK_THAT(refused(ZeRO<3>{}, parameter_settings[1]), Catch::Contains("params_buffer_size (7)"));
  CHECK_THAT(refused(ZeRO<3>{}, parameter_settings[2]), Catch::Contains("max_in_cpu (0)"));
  CHECK_THAT(refused(DDP{}, group), Catch::Contains("hybrid_group_size = 2") && Catch::Contains("NoShard"));
  CHECK(refused(Strategy<HybridShard<ShardParameters<true>>>{}, group) == "(accepted)");
  CHECK(refused(DDP{}, [](StrategyConfig&) {}) == "(accepted)");
  const auto bucket = [](StrategyConfig& c) { c.bucket_cap_mb = 1; };
  for (const std::string& verdict : {refused(DDP{}, bucket), refused(ZeRO<1>{}, bucket), refused(ZeRO<2>{}, bucket),
                                     refused(ZeRO<3>{}, bucket), refused(FSDP{}, bucket)})
    CHECK(verdict == "(accepted)");  // every sharding reduces in buckets
  const auto no_prefetch = [](StrategyConfig& c) { c.prefetch = false; };
  CHECK_THAT(refused(ZeRO<1>{}, no_prefetch), Catch::Contains("prefetch = false"));
  CHECK(refused(ZeRO<3>{}, no_prefetch) == "(accepted)");
  // allgather_bucket_size cuts the all-gather of the updated shards where the optimizer state
  // alone is sharded (stages 1 and 2); stage3_prefetch_bucket_size is the prefetch budget where
  // units are gathered ahead. Each is refused where the other applies, as under DeepSpeed.
  const auto pieces = [](StrategyConfig& c) { c.allgather_bucket_size = 10; };
  const auto budget = [](StrategyConfig& c) { c.stage3_prefetch_bucket_size = 10; };
  CHECK_THAT(refused(DDP{}, pieces), Catch::Contains("allgather_bucket_size = 10") && Catch::Contains("NoShard"));
  CHECK(refused(ZeRO<1>{}, pieces) == "(accepted)");
  CHECK(refused(ZeRO<2>{}, pieces) == "(accepted)");
  CHECK_THAT(refused(ZeRO<3>{}, pieces), Catch::Contains("allgather_bucket_size = 10") &&
                                             Catch::Contains("DeepSpeed's stage 3 does not read it") &&
                                             Catch::Contains("stage3_prefetch_bucket_size"));
  CHECK_THAT(refused(FSDP{}, pieces), Catch::Contains("ShardParameters"));
  CHECK(refused(ZeRO<3>{}, budget) == "(accepted)");
  CHECK(refused(FSDP{}, budget) == "(accepted)");
  for (const std::string& verdict : {refused(DDP{}, budget), refused(ZeRO<1>{}, budget), refused(ZeRO<2>{}, budget)})
    CHECK_THAT(verdict, Catch::Contains("stage3_prefetch_bucket_size = 10") &&
                            Catch::Contains("gathers no parameters"));
  CHECK_THAT(refused(ZeRO<2>{}, [](StrategyConfig& c) { c.allgather_bucket_size = 0; }),
             Catch::Contains("allgather_bucket_size = 0") && Catch::Contains("must be positive"));
  CHECK_THAT(refused(ZeRO<3>{}, [](StrategyConfig& c) { c.stage3_prefetch_bucket_size = 0; }),
             Catch::Contains("stage3_prefetch_bucket_size = 0") && Catch::Contains("must be positive"));
  CHECK_THAT(refused(ZeRO<3>{},
                     [](StrategyConfig& c) {
                       c.stage3_prefetch_bucket_size = 10;
                       c.prefetch = false;
                     }),
             Catch::Contains("stage3_prefetch_bucket_size = 10 is a prefetch budget") &&
                 Catch::Contains("prefetch = false"));
  // remote_device: accepted where the engine builds the shards, refused elsewhere.
  const auto on_cpu = [](StrategyConfig& c) { c.remote_device = "cpu"; };
  const auto on_nvme = [](StrategyConfig& c) { c.remote_device = "nvme"; };
  using ParametersOnHost = Strategy<ShardParameters<true>, OffloadParameters<Cpu>>;
  CHECK(refused(ZeRO<3>{}, on_cpu) == "(accepted)");  // a host model's shards are built in host memory
  CHECK(refused_on(ParametersOnHost{}, Cuda{}, on_cpu) == "(accepted)");
  CHECK_THAT(refused_on(ZeRO<3>{}, Cuda{}, on_cpu),
             Catch::Contains("remote_device = 'cpu'") && Catch::Contains("in the device") &&
                 Catch::Contains("OffloadParameters<Cpu>"));
  CHECK(refused(ZeROInfinityParameters{}, on_nvme) == "(accepted)");
  CHECK(refused_on(ZeROInfinityParameters{}, Cuda{}, on_nvme) == "(accepted)");
  CHECK_THAT(refused(ZeROInfinity{}, on_nvme), Catch::Contains("remote_device = 'nvme'") &&
                                                   Catch::Contains("host memory (a host model)") &&
                                                   Catch::Contains("OffloadParameters<Nvme>"));
  CHECK_THAT(refused(ZeROInfinityParameters{}, on_cpu), Catch::Contains("NVMe file"));
  CHECK_THAT(refused(ZeRO<3>{}, [](StrategyConfig& c) { c.remote_device = "gpu"; }),
             Catch::Contains("remote_device = 'gpu': must be cpu, nvme, or empty"));
  // The delayed parameter update is read only where the optimizer steps on the host.
  const auto delayed = [](StrategyConfig& c) { c.delayed_parameter_update = true; };
  CHECK_THAT(refused(ZeRO<2>{}, delayed),
             Catch::Contains("delayed_parameter_update is read only under OffloadOptimizer<Cpu>") &&
                 Catch::Contains("NoOffload"));
  CHECK_THAT(refused(ZeROInfinity{}, delayed), Catch::Contains("OffloadOptimizer<Nvme>"));
  CHECK(refused(ZeROOffload{}, delayed) == "(accepted)");
  // pin_memory is read where host buffers move: to NVMe, or between a device model and the host.
  const auto pin = [](StrategyConfig& c) { c.pin_memory = true; };
  CHECK_THAT(refused(ZeROOffload{}, pin), Catch::Contains("pin_memory = true") &&
                                              Catch::Contains("OffloadOptimizer<Cpu> on a host model"));
  CHECK(refused(ZeROInfinity{}, pin) == "(accepted)");
  CHECK(refused_on(ZeROOffload{}, Cuda{}, pin) == "(accepted)");
  CHECK(refused_on(Strategy<ShardParameters<true>, OffloadParameters<Cpu>>{}, Cuda{}, pin) == "(accepted)");
  CHECK(refused_on(Strategy<ShardParameters<true>, OffloadParametersOnly<Cpu>>{}, Cuda{}, pin) == "(accepted)");
  CHECK_THAT(refused_on(ZeRO<2>{}, Cuda{}, pin), Catch::Contains("NoOffload on a device model"));
  // The activation-checkpointing settings act on a device model's checkpoints, whatever the strategy.
  const auto offload_inputs = [](StrategyConfig& c) { c.cpu_checkpointing = true; };
  const auto synchronize = [](StrategyConfig& c) { c.synchronize_checkpoint_boundary = true; };
  CHECK_THAT(refused(ZeRO<3>{}, offload_inputs), Catch::Contains("cpu_checkpointing = true") &&
                                                     Catch::Contains("a host model's are there already"));
  CHECK_THAT(refused(DDP{}, synchronize), Catch::Contains("synchronize_checkpoint_boundary = true"));
  CHECK(refused_on(ZeRO<3>{}, Cuda{}, offload_inputs) == "(accepted)");
  CHECK(refused_on(DDP{}, Cuda{}, synchronize) == "(accepted)");
  const auto contiguous = [](StrategyConfig& c) { c.contiguous_memory_optimization = true; };
  CHECK_THAT(refused_on(ZeRO<3>{}, Cuda{}, contiguous),
             Catch::Contains("contiguous_memory_optimization = true") && Catch::Contains("cpu_checkpointing is false"));
  CHECK(refused_on(ZeRO<3>{}, Cuda{}, [](StrategyConfig& c) {
          c.cpu_checkpointing = true;
          c.contiguous_memory_optimization = true;
          c.number_checkpoints = 12;
        }) == "(accepted)");
  CHECK_THAT(refused_on(ZeRO<3>{}, Cuda{}, [](StrategyConfig& c) {
               c.cpu_checkpointing = true;
               c.number_checkpoints = 12;
             }),
             Catch::Contains("number_checkpoints (12)") && Catch::Contains("contiguous_memory_optimization"));
  // move_grads_to_cpu says where the reduced gradients go: host memory exactly where the optimizer
  // steps there, so each value is accepted where the composition does it and refused elsewhere.
  const auto to_cpu = [](StrategyConfig& c) { c.move_grads_to_cpu = true; };
  const auto kept = [](StrategyConfig& c) { c.move_grads_to_cpu = false; };
  using FsdpOffload = Strategy<ShardParameters<true>, OffloadParameters<Cpu>>;
  using FsdpOptimizerOffload = Strategy<ShardParameters<true>, OffloadOptimizer<Cpu>>;
  CHECK(refused_on(FsdpOffload{}, Cuda{}, to_cpu) == "(accepted)");
  CHECK(refused_on(FsdpOptimizerOffload{}, Cuda{}, to_cpu) == "(accepted)");
  CHECK(refused_on(ZeROInfinity{}, Cuda{}, to_cpu) == "(accepted)");
  CHECK(refused_on(FSDP{}, Cuda{}, kept) == "(accepted)");
  CHECK(refused(FSDP{}, to_cpu) == "(accepted)");
  CHECK_THAT(refused_on(FSDP{}, Cuda{}, to_cpu), Catch::Contains("move_grads_to_cpu = true") &&
                                                     Catch::Contains("NoOffload") &&
                                                     Catch::Contains("OffloadOptimizer<Cpu>"));
  CHECK_THAT(refused_on(FsdpOffload{}, Cuda{}, kept), Catch::Contains("move_grads_to_cpu = false") &&
                                                          Catch::Contains("OffloadParameters<Cpu>"));
  // Parameters alone offloaded: the optimizer steps on the device, and the gradients stay there.
  using ParametersAlone = Strategy<ShardParameters<true>, OffloadParametersOnly<Cpu>>;
  CHECK(refused_on(ParametersAlone{}, Cuda{}, kept) == "(accepted)");
  CHECK_THAT(refused_on(ParametersAlone{}, Cuda{}, to_cpu), Catch::Contains("move_grads_to_cpu = true") &&
                                                                Catch::Contains("OffloadParametersOnly<Cpu>"));
  CHECK_THAT(refused(FSDP{}, kept),
             Catch::Contains("move_grads_to_cpu = false") && Catch::Contains("host model"));
  const auto threshold = [](StrategyConfig& c) { c.min_num_params = 500; };
  CHECK_THAT(refused(Strategy<ShardParameters<true>, WrapByType<Block>>{}, threshold),
             Catch::Contains("min_num_params = 500") && Catch::Contains("WrapByType"));
  CHECK(refused(FSDP{}, threshold) == "(accepted)");
}

TEST_CASE("model_state_bytes gives ZeRO's bytes per rank", "[policy][accounting]") {
  // fp32 Adam, replicas: 4 (parameters) + 4 (gradients) + 8 (two states; no separate master) per parameter.
  STATIC_REQUIRE(model_state_bytes<DDP>(1000, 4) == 16'000.0);
  // Mixed-precision Adam (bf16 compute, fp32 master), 1200 parameters on 4 ranks:
  //   stage 1: 2*1200 + 2*1200 + 12*1200/4 = 8400  (ZeRO: 4 + 12/N bytes per parameter)
  //   stage 2: 2*1200 + 2*1200/4 + 12*1200/4 = 6600 (2 + 14/N)
  //   stage 3: 16*1200/4 = 4800                     (16/N)
  //   replicas: 16*1200 = 19200
  STATIC_REQUIRE(model_state_bytes<Strategy<NoShard, Bf16Mixed>>(1200, 4) == 19'200.0);
  STATIC_REQUIRE(model_state_bytes<with_t<ZeRO<1>, Bf16Mixed>>(1200, 4) == 8'400.0);
  STATIC_REQUIRE(model_state_bytes<with_t<ZeRO<2>, Bf16Mixed>>(1200, 4) == 6'600.0);
  STATIC_REQUIRE(model_state_bytes<with_t<ZeRO<3>, Bf16Mixed>>(1200, 4) == 4'800.0);
  // fp16 compute reduced in fp32 at stage 2: 2*1200 + 4*1200/4 + 12*1200/4 = 7200.
  STATIC_REQUIRE(model_state_bytes<Strategy<ShardGradients, MixedPrecision<half, float, float, DynamicLossScale<>>>>(
                     1200, 4) == 7'200.0);
  // Pure bf16 Adam: no separate master copy, 2 + 2 + 2*2 = 8 bytes per parameter.
  STATIC_REQUIRE(model_state_bytes<Strategy<PureBf16>>(1000, 2) == 8'000.0);
  // Plain SGD (no state) at stage 3 in fp32 on 3 ranks: (4 + 4) * 1200 / 3 = 3200.
  STATIC_REQUIRE(model_state_bytes<ZeRO<3>>(1200, 3, 0) == 3'200.0);
  // SGD with momentum on one rank: sharding changes nothing. 4 + 4 + 4 = 12 per parameter.
  STATIC_REQUIRE(model_state_bytes<ZeRO<3>>(1000, 1, 1) == 12'000.0);
  STATIC_REQUIRE(model_state_bytes<DDP>(1000, 1, 1) == 12'000.0);
  // Offloading moves state, it does not shrink it: the accounting of ZeRO-Offload is stage 2's.
  STATIC_REQUIRE(model_state_bytes<ZeROOffload>(1200, 4) == model_state_bytes<ZeRO<2>>(1200, 4));
  // ZeRO-Infinity: the state values are on NVMe between steps. fp32 Adam: (4 + 4) * 1200 / 4.
  STATIC_REQUIRE(model_state_bytes<ZeROInfinity>(1200, 4) == 2'400.0);
  // Mixed precision: the fp32 master copy goes to the file with the moments (DeepSpeed's fp32
  // partitions), (2 + 2) * 1200 / 4, a quarter of stage 3's 4800.
  STATIC_REQUIRE(model_state_bytes<with_t<ZeROInfinity, Bf16Mixed>>(1200, 4) == 1'200.0);
  STATIC_REQUIRE(model_state_bytes<ZeROInfinity>(1200, 3, 0) == model_state_bytes<ZeRO<3>>(1200, 3, 0));
  // The parameter shards and masters on NVMe too: the gradients stay, 4 * 1200 / 4 in fp32 and
  // 2 * 1200 / 4 in bf16.
  STATIC_REQUIRE(model_state_bytes<ZeROInfinityParameters>(1200, 4) == 1'200.0);
  STATIC_REQUIRE(model_state_bytes<with_t<ZeROInfinityParameters, Bf16Mixed>>(1200, 4) == 600.0);
}

TEST_CASE("optimizer_buffer_count holds a sub-group in as many buffers as DeepSpeed counts it states per parameter",
          "[policy][accounting]") {
  // Adam's 4 (exp_avg, exp_avg_sq, the fp32 parameter, its gradient), as the reference says.
  STATIC_REQUIRE(nvme_buffers_per_sub_group(2) == 4);
  STATIC_REQUIRE(nvme_sub_groups_in_memory(4, 2) == 1);  // the default: one Adam sub-group at a time
  STATIC_REQUIRE(nvme_sub_groups_in_memory(7, 2) == 1);
  STATIC_REQUIRE(nvme_sub_groups_in_memory(8, 2) == 2);
  STATIC_REQUIRE(nvme_sub_groups_in_memory(3, 1) == 1);  // SGD with momentum
  STATIC_REQUIRE(nvme_sub_groups_in_memory(4, 0) == 2);  // SGD without: the parameter and gradient
  CHECK_THROWS_WITH(nvme_sub_groups_in_memory(3, 2),
                    Catch::Contains("optimizer_buffer_count is 3, fewer than the 4 buffers one sub-group") &&
                        Catch::Contains("Adam's are 4"));
  CHECK_THROWS_WITH(nvme_sub_groups_in_memory(0, 0), Catch::Contains("optimizer_buffer_count is 0"));
}

TEST_CASE("offloaded_state_bytes_in_step bounds the state NVMe offload brings back during a step",
          "[policy][accounting]") {
  // 16 buffers, 4 sub-groups of a 400-parameter unit's Adam moments, sharded over 4 ranks:
  // 4 * 2 * 4 * 400 / 4; the default 4 buffers, one sub-group.
  STATIC_REQUIRE(offloaded_state_bytes_in_step<ZeROInfinity>(400, 4, 16) == 3'200.0);
  STATIC_REQUIRE(offloaded_state_bytes_in_step<ZeROInfinity>(400, 4, 4) == 800.0);
  // SGD with momentum, its 3 buffers, one rank: 1 * 1 * 4 * 400.
  STATIC_REQUIRE(offloaded_state_bytes_in_step<ZeROInfinity>(400, 1, 3, 1) == 1'600.0);
  // Mixed precision brings each sub-group's fp32 masters back with its moments: 2 * (2 + 1) * 4 * 400 / 4.
  STATIC_REQUIRE(offloaded_state_bytes_in_step<with_t<ZeROInfinity, Bf16Mixed>>(400, 4, 8) == 2'400.0);
  // sub_group_size 30 brings the moments back 30 elements at a time: 4 * 2 * 4 * 30, and under
  // mixed precision the masters with them: 2 * (2 + 1) * 4 * 30.
  STATIC_REQUIRE(offloaded_state_bytes_in_step<ZeROInfinity>(400, 4, 16, 2, 30) == 960.0);
  STATIC_REQUIRE(offloaded_state_bytes_in_step<with_t<ZeROInfinity, Bf16Mixed>>(400, 4, 8, 2, 30) == 720.0);
  // A sub-group larger than the shard is the shard.
  STATIC_REQUIRE(offloaded_state_bytes_in_step<ZeROInfinity>(400, 4, 16, 2, 1'000) == 3'200.0);
  // Strategies whose state never leaves memory bring nothing back: it is in model_state_bytes.
  STATIC_REQUIRE(offloaded_state_bytes_in_step<ZeRO<3>>(400, 4, 4) == 0.0);
  STATIC_REQUIRE(offloaded_state_bytes_in_step<ZeROOffload>(400, 4, 4) == 0.0);
}

TEST_CASE("bytes_sent_per_step gives the ring collectives' bytes per rank", "[policy][accounting]") {
  // DDP, fp32, 4 ranks: all-reduce 2 * 3/4 * 1000 * 4 bytes.
  STATIC_REQUIRE(bytes_sent_per_step<DDP>(1000, 0, 4) == 6'000.0);
  // Clipping a replicated gradient needs no extra collective.
  STATIC_REQUIRE(bytes_sent_per_step<DDP>(1000, 0, 4, true) == 6'000.0);
  // Stage 1 and 2: reduce-scatter of gradients plus all-gather of parameters, 3/4 * 1000 * (4 + 4).
  STATIC_REQUIRE(bytes_sent_per_step<ZeRO<1>>(1000, 0, 4) == 6'000.0);
  STATIC_REQUIRE(bytes_sent_per_step<ZeRO<2>>(1000, 0, 4) == 6'000.0);
  // In bf16 both halve: 3/4 * 1000 * (2 + 2).
  STATIC_REQUIRE(bytes_sent_per_step<with_t<ZeRO<2>, Bf16Mixed>>(1000, 0, 4) == 3'000.0);
  // Stage 3, fp32, root unit of 100 parameters gathered once, the other 900 twice:
  // 3/4 * (1000 * 4 + (100 + 2 * 900) * 4) = 8700.
  STATIC_REQUIRE(bytes_sent_per_step<ZeRO<3>>(1000, 100, 4) == 8'700.0);
  // SHARD_GRAD_OP gathers every unit once: 3/4 * (4000 + 4000) = 6000.
  STATIC_REQUIRE(bytes_sent_per_step<with_t<ZeRO<3>, ShardParameters<false>>>(1000, 100, 4) == 6'000.0);
  // ZeRO's 1.5x: with no root parameters, stage 3 sends 3(N-1)/N of the parameter bytes.
  STATIC_REQUIRE(bytes_sent_per_step<ZeRO<3>>(1000, 0, 4) == 1.5 * bytes_sent_per_step<DDP>(1000, 0, 4));
  // fp16 stage 1 on 2 ranks: 1/2 * 1000 * (2 + 2) = 2000, plus the all-reduced overflow flag
  // (2 * 1/2 * 4 bytes), plus the squared norm when clipping (2 * 1/2 * 8 bytes).
  STATIC_REQUIRE(bytes_sent_per_step<with_t<ZeRO<1>, Fp16Mixed>>(1000, 0, 2) == 2'004.0);
  STATIC_REQUIRE(bytes_sent_per_step<with_t<ZeRO<1>, Fp16Mixed>>(1000, 0, 2, true) == 2'012.0);
  // One rank sends nothing.
  STATIC_REQUIRE(bytes_sent_per_step<with_t<ZeRO<3>, Fp16Mixed>>(1000, 100, 1, true) == 0.0);
}
