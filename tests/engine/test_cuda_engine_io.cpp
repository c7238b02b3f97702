// The engine on one GPU: offloaded state in pinned host memory, and checkpoints and full weights
// that move between a device engine and a host engine bit for bit, and checkpointed activations
// kept in host memory (cpu_checkpointing).
#include "cuda_engine_fixture.hpp"
#include "io/temp_dir.hpp"
#include "polyshard/io/io.hpp"

using namespace polyshard;
using namespace polyshard::test;

TEMPLATE_TEST_CASE("offloaded state of a device engine lives in pinned host memory under pin_memory, given back "
                   "with the engine; in pageable memory without it, staged, to the same bits",
                   "[cuda][engine]", FsdpCpuOffload, ZeRO3ParamOffload, ZeRO3ParamOnlyOffload) {
  // Where the optimizer steps on the host, its masters, state and gradient copies are offloaded;
  // under OffloadParametersOnly only the parameter shards are.
  constexpr bool steps_on_host = TestType::offload::offloads_optimizer;
  auto& pinned = cuda::pinned_host_allocator();
  const std::size_t before = pinned.in_use_bytes();
  const auto is_pageable = [](const auto& t) { return cuda::is_pageable(t.data()); };
  std::int64_t parameters = 0;
  test::RunResult runs[2];
  for (const bool pin : {true, false}) {
    CAPTURE(pin);
    StrategyConfig config;
    config.pin_memory = pin;
    NcclCommunicator comm = one_gpu();
    Gpt<float, Cuda> model(test::tiny_gpt());
    Engine<TestType, Gpt<float, Cuda>, NcclCommunicator, Sgd<float>> engine(model, comm, test::momentum_sgd(), config,
                                                                            42);
    parameters = 0;
    for (const auto& [name, values] : engine.full_parameters()) parameters += std::int64_t(values.size());
    for (const auto& u : engine.unit_states()) {
      if constexpr (steps_on_host) CHECK(is_pageable(u.master) == !pin);
      else CHECK_FALSE(is_pageable(u.master));  // on the device
      if constexpr (std::same_as<typename std::decay_t<decltype(u)>::shard_device, Cpu>)
        CHECK(is_pageable(u.param_shard) == !pin);
      else CHECK_FALSE(is_pageable(u.param_shard));  // on the device
    }
    // The host optimizer's state (SGD's momentum) is pinned with the masters, as DeepSpeed pins it.
    for (const auto& groups : engine.optimizers())
      for (const auto& optimizer : groups)
        for (const auto& [name, state] : optimizer.state()) {
          INFO(name);
          if constexpr (steps_on_host) CHECK(is_pageable(state) == !pin);
          else CHECK_FALSE(is_pageable(state));  // on the device
        }
    // The master weights, or the parameter shards, and the momentum at least (world size 1: every
    // shard is the whole unit), fp32.
    const std::size_t offloaded = std::size_t(parameters) * sizeof(float) * (steps_on_host ? 2 : 1);
    if (pin) CHECK(pinned.in_use_bytes() - before >= offloaded);
    else CHECK(pinned.in_use_bytes() == before);
    for (int step = 0; step < 2; ++step) runs[pin ? 0 : 1].losses.push_back(train_one_step(engine, model, step));
    // Gradients come down into pinned buffers too; without pin_memory nothing of the engine's
    // stays page-locked between steps (the staging chunks go back after each copy).
    if constexpr (steps_on_host) {
      for (const auto& u : engine.unit_states()) CHECK(is_pageable(u.step_grads) == !pin);
    }
    const std::size_t with_gradients = offloaded + (steps_on_host ? std::size_t(parameters) * sizeof(float) : 0);
    if (pin) CHECK(pinned.in_use_bytes() - before >= with_gradients);
    else CHECK(pinned.in_use_bytes() == before);
    runs[pin ? 0 : 1].parameters = engine.full_parameters();
  }
  CHECK(pinned.in_use_bytes() == before);
  CHECK(runs[0].losses == runs[1].losses);
  CHECK(runs[0].parameters == runs[1].parameters);
}

TEMPLATE_TEST_CASE("pin_memory is refused where no host buffer moves to or from a device", "[cuda][engine]", DDP,
                   FsdpPerBlock) {
  StrategyConfig config;
  config.pin_memory = true;
  NcclCommunicator comm = one_gpu();
  Gpt<float, Cuda> model(test::tiny_gpt());
  using E = Engine<TestType, Gpt<float, Cuda>, NcclCommunicator, Sgd<float>>;
  CHECK_THROWS_WITH(E(model, comm, test::momentum_sgd(), config, 42),
                    Catch::Contains("pin_memory") && Catch::Contains("NoOffload"));
}

TEMPLATE_TEST_CASE("a device engine's checkpoint resumes on the host, and the host's on the device, bit for bit",
                   "[cuda][engine][io]", ZeRO2PerBlock, FsdpPerBlock, FsdpCpuOffload) {
  using S = TestType;
  using Opt = AdamW<float>;
  const AdamWConfig adamw{.lr = 1e-2};
  TempDir dir;
  NcclCommunicator comm = one_gpu();
  Gpt<float, Cuda> gpu_model(test::tiny_gpt());
  Engine<S, Gpt<float, Cuda>, NcclCommunicator, Opt> gpu(gpu_model, comm, adamw, {}, 42);
  for (int step = 0; step < 2; ++step) train_one_step(gpu, gpu_model, step);
  save_checkpoint(gpu, dir / "from-gpu", {.step = 2});
  save_full_weights(gpu, dir / "gpu-weights.safetensors");
  const auto gpu_parameters = gpu.full_parameters();
  {
    // The checkpoint holds the device's masters themselves, each unit's own (not the bytes of a
    // staging copy freed before the file was written, which another unit's copy may reuse).
    const CheckpointMetadata m = read_checkpoint_metadata(dir / "from-gpu");
    test::Parameters saved;
    for (const CheckpointParameter& p : m.parameters)
      saved.emplace_back(p.name, read_checkpoint_tensor(dir / "from-gpu", m, "master", p).to_vector());
    std::sort(saved.begin(), saved.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    CHECK(test::max_difference(saved, gpu_parameters) == 0.0);
  }

  // The host resumes where the device stopped: the same masters, state and step count, so the
  // same next steps (within the products' rounding).
  test::Parameters host_parameters, host_from_weights;
  std::vector<double> host_losses;
  run_ranks(1, [&](ThreadCommunicator& host_comm) {
    Gpt<float> model(test::tiny_gpt());
    Engine<S, Gpt<float>, ThreadCommunicator, Opt> host(model, host_comm, adamw, {}, 7);  // another seed
    const TrainingState state = load_checkpoint(host, dir / "from-gpu");
    POLYSHARD_CHECK(state.step == 2, "step ", state.step);
    host_parameters = host.full_parameters();
    for (int step = 2; step < 4; ++step) host_losses.push_back(train_one_step(host, model, step));
    save_checkpoint(host, dir / "from-host", {.step = 4});
    Engine<S, Gpt<float>, ThreadCommunicator, Opt> fresh(model, host_comm, adamw, {}, 9);
    load_full_weights(fresh, dir / "gpu-weights.safetensors");
    host_from_weights = fresh.full_parameters();
  });
  CHECK(test::max_difference(host_parameters, gpu_parameters) == 0.0);
  CHECK(test::max_difference(host_from_weights, gpu_parameters) == 0.0);

  std::vector<double> gpu_losses;
  for (int step = 2; step < 4; ++step) gpu_losses.push_back(train_one_step(gpu, gpu_model, step));
  check_losses(gpu_losses, host_losses, 1e-5);

  // And back: a fresh device engine loads the host's checkpoint and holds the host's parameters.
  Gpt<float, Cuda> resumed_model(test::tiny_gpt());
  Engine<S, Gpt<float, Cuda>, NcclCommunicator, Opt> resumed(resumed_model, comm, adamw, {}, 11);
  CHECK(load_checkpoint(resumed, dir / "from-host").step == 4);
  CHECK(test::max_difference(resumed.full_parameters(), gpu.full_parameters()) <= 2e-5);
}

TEMPLATE_TEST_CASE("state_dict_to_cpu: a full state dict in host memory, or else in each rank's device memory, "
                   "every parameter whole from the masters, to the same bits, and back into a fresh engine",
                   "[cuda][engine][io]", DDP, FsdpPerBlock, FsdpCpuOffload) {
  const int world = GENERATE(1, 2);
  CAPTURE(world);
  if (!test::have_devices(world)) return;
  struct Seen {
    test::Parameters dict, parameters;  // full_state_dict's, and full_parameters()'s (the oracle)
    test::Parameters loaded;            // a fresh engine's after load_full_state_dict(dict)
    std::vector<bool> in_host_memory, memory_matches;
    std::int64_t tracked = 0, whole = 0;  // bytes the dict holds, and the padded units'
  };
  std::vector<Seen> seen(2 * static_cast<std::size_t>(world));  // [to_cpu][rank]
  TempDir dir;
  run_on_gpus(world, [&](int r, NcclCommunicator& comm) {
    for (const bool to_cpu : {true, false}) {
      Seen& out = seen[static_cast<std::size_t>((to_cpu ? 0 : world) + r)];
      StrategyConfig config;
      config.state_dict_to_cpu = to_cpu;
      Gpt<float, Cuda> model(test::tiny_gpt());
      Engine<TestType, Gpt<float, Cuda>, NcclCommunicator, Sgd<float>> engine(model, comm, test::momentum_sgd(),
                                                                              config, 42);
      train_one_step(engine, model, 0);  // every rank the same batch: the masters move
      {
        MemoryTracker tracker;
        TrackerScope scope(tracker);
        const auto dict = full_state_dict(engine);
        out.tracked = tracker.current(MemoryCategory::Other);
        for (const auto& p : dict) {
          out.in_host_memory.push_back(p.in_host_memory);
          cudaPointerAttributes a{};
          POLYSHARD_CUDA_CHECK(cudaPointerGetAttributes(&a, to_cpu ? p.host.data() : p.device.data()));
          out.memory_matches.push_back(to_cpu ? a.type != cudaMemoryTypeDevice
                                              : a.type == cudaMemoryTypeDevice && a.device == r);
          out.dict.emplace_back(p.name, p.to_host().to_vector());
        }
        // Back into a fresh engine from another seed, from either memory.
        Gpt<float, Cuda> fresh_model(test::tiny_gpt());
        Engine<TestType, Gpt<float, Cuda>, NcclCommunicator, Sgd<float>> fresh(fresh_model, comm,
                                                                               test::momentum_sgd(), config, 7);
        load_full_state_dict(fresh, dict);
        out.loaded = fresh.full_parameters();
      }
      for (const auto& u : engine.units().units) out.whole += u.padded * std::int64_t(sizeof(float));
      out.parameters = engine.full_parameters();
      // Rank 0 writes the same file either way (from the device, without state_dict_to_cpu).
      save_full_weights(engine, dir / (to_cpu ? "host.safetensors" : "device.safetensors"));
    }
  });
  for (std::size_t i = 0; i < seen.size(); ++i) {
    const Seen& s = seen[i];
    CHECK(s.dict == s.parameters);  // fp32: the masters are the parameters, bit for bit
    CHECK(s.dict == seen[i % std::size_t(world)].dict);
    CHECK(s.loaded == s.parameters);
    const bool to_cpu = i < std::size_t(world);
    INFO((to_cpu ? "state_dict_to_cpu, rank " : "on the device, rank ") << i % std::size_t(world));
    CHECK(std::all_of(s.in_host_memory.begin(), s.in_host_memory.end(), [&](bool h) { return h == to_cpu; }));
    CHECK(std::all_of(s.memory_matches.begin(), s.memory_matches.end(), [](bool m) { return m; }));
    CHECK(s.tracked == s.whole);  // every unit, whole, and nothing else left behind
  }
  CHECK(read_file(dir / "host.safetensors", "weights") == read_file(dir / "device.safetensors", "weights"));
}

TEST_CASE("cpu_checkpointing under ActivationCheckpointing<Block>: every block's input waits in host memory, in one "
          "buffer after the first step, and the run is the same bit for bit",
          "[cuda][engine]") {
  const GptConfig cfg = test::tiny_gpt();
  const std::int64_t input_bytes = 6 * cfg.block_size * cfg.n_embd * std::int64_t(sizeof(float));  // rows x T x C
  StrategyConfig moved;
  moved.cpu_checkpointing = true;
  moved.contiguous_memory_optimization = true;
  moved.synchronize_checkpoint_boundary = true;
  test::RunResult runs[2];
  for (const bool offload : {false, true}) {
    CAPTURE(offload);
    NcclCommunicator comm = one_gpu();
    Gpt<float, Cuda> model(cfg);
    Engine<ZeRO3Checkpointed, Gpt<float, Cuda>, NcclCommunicator, Sgd<float>> engine(
        model, comm, test::momentum_sgd(), offload ? moved : StrategyConfig{}, 42);
    for (int step = 0; step < 3; ++step) {
      const std::int64_t synchronized = checkpoint_boundary_synchronizations();
      runs[offload ? 1 : 0].losses.push_back(train_one_step(engine, model, step));
      const CheckpointCounts& c = engine.last_checkpoint_counts();
      CHECK(c.checkpoints == cfg.n_layer);
      CHECK(c.inputs_offloaded == (offload ? cfg.n_layer : 0));
      CHECK(c.bytes_offloaded == (offload ? cfg.n_layer * input_bytes : 0));
      CHECK(c.inputs_in_one_buffer == (offload && step > 0 ? cfg.n_layer : 0));  // the first step measures
      // Each block's forward and recomputation, begun and ended.
      CHECK(checkpoint_boundary_synchronizations() - synchronized == (offload ? 4 * cfg.n_layer : 0));
    }
    runs[offload ? 1 : 0].parameters = engine.full_parameters();
  }
  CHECK(runs[1].losses == runs[0].losses);
  CHECK(runs[1].parameters == runs[0].parameters);
}

#ifdef POLYSHARD_HAVE_LIBURING
TEST_CASE("ZeRO-Infinity on a GPU model, in one group a unit and in sub-groups, trains as the CPU offload does",
          "[cuda][engine][nvme]") {
  // The same host step as OffloadOptimizer<Cpu>, its masters and state in a file; in sub-groups
  // each group casts its own fp32 masters into its slice of the device's bf16 copy before they
  // go back to the file. The CPU offload in sub-groups too.
  using InMemory = Strategy<ShardParameters<true>, OffloadOptimizer<Cpu>, WrapByType<Block>, Bf16Mixed>;
  using OnNvme = Strategy<ShardParameters<true>, OffloadOptimizer<Nvme>, WrapByType<Block>, Bf16Mixed>;
  const AdamWConfig adamw{.lr = 1e-2};
  constexpr double no_clip = std::numeric_limits<double>::infinity();
  const auto memory = train_on_gpu<InMemory, AdamW<float>>(3, adamw);
  CHECK(test::max_difference(memory.parameters, train_on_gpu<InMemory, AdamW<float>>(0, adamw).parameters) > 1e-3);
  StrategyConfig pieces;
  pieces.sub_group_size = 37;
  const auto memory_pieces = train_on_gpu<InMemory, AdamW<float>>(3, adamw, no_clip, pieces);
  CHECK(test::max_difference(memory_pieces.parameters, memory.parameters) == 0.0);
  for (const std::int64_t group : {StrategyConfig{}.sub_group_size, std::int64_t{37}}) {
    CAPTURE(group);
    TempDir dir;
    StrategyConfig nvme;
    nvme.nvme_path = dir.path().string();
    nvme.sub_group_size = group;
    const auto offloaded = train_on_gpu<OnNvme, AdamW<float>>(3, adamw, no_clip, nvme);
    CHECK(test::max_difference(offloaded.parameters, memory.parameters) == 0.0);
    CHECK(offloaded.losses == memory.losses);
  }
}
#endif
