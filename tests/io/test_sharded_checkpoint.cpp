// Sharded checkpoints: the metadata format and its validation, resharding as a pure function
// of it, exact resume, loading onto other world sizes, strategies and wrap policies, and the
// errors a corrupt or mismatched checkpoint gives.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <mutex>
#include <optional>

#include "../engine/engine_fixture.hpp"
#include "polyshard/io/full_weights.hpp"
#include "polyshard/io/hf_gpt2.hpp"
#include "polyshard/io/sharded_checkpoint.hpp"
#include "polyshard/io/state_dict.hpp"
#include "crash_replay.hpp"
#include "temp_dir.hpp"

using namespace polyshard;
using namespace polyshard::test;
namespace fs = std::filesystem;

namespace {

/// What rank 0 saw of a run that may start from a checkpoint and may end by saving one.
struct CheckpointRun {
  Parameters parameters;
  std::vector<double> losses;  // global mean loss per step
  double loss_scale = 0;
  int good_steps = 0;
  std::int64_t resumed_step = -1;  // TrainingState::step read from the loaded checkpoint
  std::vector<std::string> errors;  // per rank, "" when it succeeded
  Parameters state_dict;                   // full_state_dict's, as float, when asked for
  bool state_dict_in_host_memory = true;   // every parameter of it, on every rank
  bool state_dicts_agree = true;           // every rank's the same as rank 0's
  std::vector<FullParameter<float, Cpu>> dict;  // rank 0's full_state_dict, itself
};

struct RunSpec {
  int world = 1;
  int first_step = 0, steps = 0;
  std::optional<fs::path> load = {}, save = {};
  std::optional<fs::path> init = {}, export_to = {};  // full weights in, full weights out
  std::optional<fs::path> init_hf = {}, export_hf = {};  // Hugging Face save_pretrained directories
  bool state_dict = false;  // take full_state_dict at the end
  const std::vector<FullParameter<float, Cpu>>* init_dict = nullptr;  // loaded at the start, in memory
  GptConfig model = tiny_gpt();
  CheckpointIO* io = nullptr;  // the store that loads and saves go through; null: the default
};

template <class Opt>
typename Opt::config_type optimizer_config() {
  if constexpr (std::is_same_v<Opt, Sgd<float>>) return momentum_sgd();
  else return {.lr = 0.01, .weight_decay = 0.1};
}

/// Trains tiny_gpt() under S with optimizer Opt from spec.first_step for spec.steps steps on
/// spec.world thread ranks, loading and saving as spec says. Errors are caught per rank.
template <class S, class Opt = AdamW<float>>
CheckpointRun run(const RunSpec& spec, StrategyConfig config = {}) {
  const int world = spec.world;
  std::vector<CheckpointRun> results(static_cast<std::size_t>(world));
  run_ranks(world, [&](ThreadCommunicator& comm) {
    CheckpointRun& out = results[static_cast<std::size_t>(comm.rank())];
    out.errors.assign(1, "");
    try {
      Gpt<float> model(spec.model);
      const auto opt = optimizer_config<Opt>();
      Engine<S, Gpt<float>, ThreadCommunicator, Opt> engine(model, comm, opt, config, 42);
      CheckpointIO& io = spec.io ? *spec.io : default_checkpoint_io();
      if (spec.load) out.resumed_step = load_checkpoint(engine, *spec.load, io).step;
      if (spec.init) load_full_weights(engine, *spec.init, tied_parameters<Gpt<float>>::of(model));
      if (spec.init_hf) load_hf_gpt2_pretrained(engine, *spec.init_hf);
      if (spec.init_dict) load_full_state_dict(engine, *spec.init_dict);
      const std::int64_t batch = 6;
      BatchSampler sampler(tiny_data(), 8, batch, 7);
      const RowRange rows = rank_rows(batch, comm.rank(), world);
      const double weight = double(rows.end - rows.begin) / double(batch);
      for (int step = spec.first_step; step < spec.first_step + spec.steps; ++step) {
        const Batch b = sampler.batch(step, comm.rank(), world);
        Var<float> loss = engine.forward([&] { return model.loss(b.inputs, b.targets); });
        out.losses.push_back(loss.value().data()[0] * weight);
        engine.backward(loss, weight);
        loss = Var<float>();
        engine.step(opt.lr);
      }
      if (spec.save)
        save_checkpoint(engine, *spec.save,
                        {.step = spec.first_step + spec.steps, .seed = 7, .extra = {{"run", "test"}}}, io);
      if (spec.export_to) save_full_weights(engine, *spec.export_to, tied_parameters<Gpt<float>>::of(model));
      if (spec.export_hf) save_hf_gpt2_pretrained(engine, spec.model, *spec.export_hf);
      if (spec.state_dict) {
        out.dict = full_state_dict(engine);
        for (const auto& p : out.dict) {
          out.state_dict_in_host_memory = out.state_dict_in_host_memory && p.in_host_memory;
          out.state_dict.emplace_back(p.name, p.to_host().to_vector());
        }
      }
      out.parameters = engine.full_parameters();
      out.loss_scale = engine.loss_scaler().scale();
      out.good_steps = engine.loss_scaler().good_steps();
    } catch (const std::exception& e) {
      out.errors[0] = e.what();
    }
  });
  CheckpointRun result = std::move(results[0]);
  for (std::size_t r = 1; r < results.size(); ++r) {
    result.errors.push_back(results[r].errors[0]);
    result.state_dict_in_host_memory = result.state_dict_in_host_memory && results[r].state_dict_in_host_memory;
    result.state_dicts_agree = result.state_dicts_agree && results[r].state_dict == result.state_dict;
    for (std::size_t i = 0; i < result.losses.size() && i < results[r].losses.size(); ++i)
      result.losses[i] += results[r].losses[i];
  }
  return result;
}

bool succeeded(const CheckpointRun& r) {
  for (const std::string& e : r.errors)
    if (!e.empty()) {
      UNSCOPED_INFO("rank error: " << e);
      return false;
    }
  return true;
}

/// A plain model's parameters by name, as engine.full_parameters() lists them.
Parameters sorted_parameters(const Gpt<float>& model) {
  Parameters out;
  visit_parameters(model, [&](const std::string& name, const auto& p) { out.emplace_back(name, p.value().to_vector()); });
  std::sort(out.begin(), out.end());
  return out;
}

bool bit_identical(const Parameters& a, const Parameters& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].first != b[i].first ||
        std::memcmp(a[i].second.data(), b[i].second.data(), a[i].second.size() * sizeof(float)) != 0 ||
        a[i].second.size() != b[i].second.size())
      return false;
  return true;
}

/// Every kind of every parameter of a checkpoint, assembled whole: what it holds independent
/// of how it was sharded.
std::map<std::string, std::vector<float>> contents(const fs::path& dir) {
  const CheckpointMetadata m = read_checkpoint_metadata(dir);
  std::map<std::string, std::vector<float>> out;
  std::vector<std::string> kinds{"master"};
  kinds.insert(kinds.end(), m.optimizer_state.begin(), m.optimizer_state.end());
  for (const auto& p : m.parameters)
    for (const auto& kind : kinds) out[kind + "/" + p.name] = read_checkpoint_tensor(dir, m, kind, p).to_vector();
  return out;
}

using Zero3Blocks = Strategy<ShardParameters<true>, WrapByType<Block>>;

/// A store of the test's own, as a user's would be (a remote one, say): a save is staged in a
/// scratch directory away from the checkpoint and copied into place on commit, a load copies the
/// stored checkpoint into a cache first. Every call is recorded; the ranks' loads call it at once.
class StagingIO final : public CheckpointIO {
 public:
  explicit StagingIO(fs::path scratch) : scratch_(std::move(scratch)) { fs::create_directories(scratch_); }

  fs::path begin_save(const fs::path& dir) override {
    const fs::path staging = scratch_ / ("staging-" + std::to_string(record("begin " + dir.filename().string())));
    fs::create_directory(staging);
    return staging;
  }
  void commit_save(const fs::path& staging, const fs::path& dir) override {
    record("commit");
    if (fail_commit) throw Error("the store refused the checkpoint");
    write_directory_atomically(dir, [&](const fs::path& tmp) {
      for (const auto& file : fs::directory_iterator(staging)) fs::copy_file(file.path(), tmp / file.path().filename());
    });
    fs::remove_all(staging);
  }
  void abort_save(const fs::path& staging) override {
    record("abort");
    fs::remove_all(staging);
  }
  fs::path open_for_load(const fs::path& dir) override {
    // Ranks open at once: each takes a cache of its own, numbered by its call.
    const fs::path cache = scratch_ / ("cache-" + std::to_string(record("open")));
    fs::copy(dir, cache, fs::copy_options::recursive);
    return cache;
  }
  void remove_checkpoint(const fs::path& dir) override {
    record("remove");
    fs::remove_all(dir);
  }

  std::vector<std::string> calls() const {
    std::lock_guard lock(mutex_);
    return calls_;
  }
  std::size_t count(const std::string& prefix) const {
    std::lock_guard lock(mutex_);
    return static_cast<std::size_t>(std::count_if(calls_.begin(), calls_.end(), [&](const std::string& c) {
      return c.rfind(prefix, 0) == 0;
    }));
  }
  bool fail_commit = false;

 private:
  /// Records `call`; returns its index among every call, unique to it even when ranks call at once.
  std::size_t record(std::string call) {
    std::lock_guard lock(mutex_);
    calls_.push_back(std::move(call));
    return calls_.size() - 1;
  }
  fs::path scratch_;
  mutable std::mutex mutex_;
  std::vector<std::string> calls_;
};

}  // namespace

TEST_CASE("checkpoint metadata round-trips through its JSON", "[io][checkpoint]") {
  CheckpointMetadata m;
  m.sharding = "ShardParameters<true>";
  m.offload = "NoOffload";
  m.precision = "Fp16Mixed";
  m.wrap = "WrapByType";
  m.world_size = 4;
  m.files = {checkpoint_file_name(0, 2), checkpoint_file_name(1, 2)};
  m.optimizer_step = 17;
  m.optimizer_state = {"exp_avg", "exp_avg_sq"};
  m.loss_scaled = true;
  m.loss_scale = 0.1;  // not a power of two: must read back exactly
  m.good_steps = 3;
  m.hysteresis_left = 1;
  m.skipped_steps = 2;
  m.training = {.step = 17, .seed = 18446744073709551615ull, .extra = {{"a \"quoted\" key", "v\n"}}};
  m.parameters = {{"w", {2, 3}, {{0, 0, 4}, {1, 4, 6}}}, {"b", {3}, {{1, 0, 3}}, std::vector<std::string>{"exp_avg"}}};
  const CheckpointMetadata r = parse_checkpoint_metadata(checkpoint_metadata_json(m), "test");
  CHECK(m.files == r.files);
  CHECK(r.world_size == 4);
  CHECK(r.sharding == m.sharding);
  CHECK(r.optimizer_step == 17);
  CHECK(r.optimizer_state == m.optimizer_state);
  CHECK(r.loss_scaled);
  CHECK(r.loss_scale == 0.1);
  CHECK(r.good_steps == 3);
  CHECK(r.hysteresis_left == 1);
  CHECK(r.skipped_steps == 2);
  CHECK(r.training.seed == m.training.seed);
  REQUIRE(r.training.find("a \"quoted\" key"));
  CHECK(*r.training.find("a \"quoted\" key") == "v\n");
  REQUIRE(r.parameters.size() == 2);
  CHECK(r.parameters[0].pieces.size() == 2);
  CHECK(r.parameters[0].pieces[1].file == 1);
  CHECK(r.parameters[0].pieces[1].begin == 4);
  CHECK(r.parameters[1].numel() == 3);
  // A parameter's own state kinds, written only where its optimizer keeps fewer (an OptimizerList).
  CHECK_FALSE(r.parameters[0].state.has_value());
  CHECK(r.parameters[1].state == std::vector<std::string>{"exp_avg"});
}

TEST_CASE("corrupt checkpoint metadata is refused with what is wrong", "[io][checkpoint]") {
  CheckpointMetadata m;
  m.files = {"rank-00000-of-00001.safetensors"};
  m.optimizer_state = {"exp_avg", "exp_avg_sq"};
  m.parameters = {{"w", {2, 3}, {{0, 0, 4}, {0, 4, 6}}, std::vector<std::string>{"exp_avg"}}};
  const std::string good = checkpoint_metadata_json(m);
  CHECK_NOTHROW(parse_checkpoint_metadata(good, "m.json"));
  auto refused = [&](std::string from, const std::string& to, const std::string& message) {
    const auto at = good.find(from);
    REQUIRE(at != std::string::npos);
    std::string bad = good;
    bad.replace(at, from.size(), to);
    CHECK_THROWS_WITH(parse_checkpoint_metadata(bad, "m.json"), Catch::Contains(message) && Catch::Contains("m.json"));
  };
  refused("[0, 4, 6]", "[0, 5, 6]", "does not follow the previous one at 4");      // gap
  refused("[0, 4, 6]", "[0, 3, 6]", "does not follow the previous one at 4");      // overlap
  refused("[0, 4, 6]", "[0, 4, 5]", "pieces cover [0, 5) of its 6 elements");      // short
  refused("[0, 4, 6]", "[3, 4, 6]", "piece names file 3 of 1");
  refused("[0, 4, 6]", "[0, 4]", "is not [file, begin, end]");
  refused("polyshard-sharded-checkpoint", "something-else", "'format' is 'something-else'");
  refused("\"version\": 1", "\"version\": 9", "format version 9");
  refused("\"world_size\": 1", "\"world_size\": 0", "'world_size' is 0, less than 1");
  refused("\"scale\": \"1\"", "\"scale\": \"x\"", "'scale' is not a number");
  refused("rank-00000-of-00001.safetensors", "../escape", "is not a plain file name");
  refused("\"name\": \"w\"", "\"name\": 5", "'name' is an integer, not a string");
  refused("{\n", "[\n", "not valid JSON");
  refused("\"state\": [\"exp_avg\"]", "\"state\": [\"momentum_buffer\"]",
          "parameter 'w': state 'momentum_buffer' is not one of the optimizer's");
  CHECK_THROWS_WITH(parse_checkpoint_metadata(good.substr(0, good.size() / 2), "m.json"), Catch::Contains("not valid JSON"));
}

TEST_CASE("resharding plans cover a range exactly once, from the metadata alone", "[io][checkpoint]") {
  const CheckpointParameter p{"w", {12}, {{0, 0, 4}, {1, 4, 10}, {2, 10, 12}}};
  const auto reads = plan_checkpoint_reads(p, 3, 11);
  REQUIRE(reads.size() == 3);
  CHECK((reads[0].file == 0 && reads[0].piece_begin == 0 && reads[0].offset == 3 && reads[0].count == 1 && reads[0].into == 0));
  CHECK((reads[1].file == 1 && reads[1].piece_begin == 4 && reads[1].offset == 0 && reads[1].count == 6 && reads[1].into == 1));
  CHECK((reads[2].file == 2 && reads[2].piece_begin == 10 && reads[2].offset == 0 && reads[2].count == 1 && reads[2].into == 7));
  CHECK((reads[0].piece_size == 4 && reads[1].piece_size == 6 && reads[2].piece_size == 2));
  // Every sub-range of every length is covered once, in order.
  for (std::int64_t b = 0; b <= 12; ++b)
    for (std::int64_t e = b; e <= 12; ++e) {
      std::int64_t next = 0;
      for (const auto& r : plan_checkpoint_reads(p, b, e)) {
        CHECK(r.into == next);
        CHECK(r.piece_begin + r.offset == b + r.into);
        next += r.count;
      }
      CHECK(next == e - b);
    }
  CHECK_THROWS_WITH(plan_checkpoint_reads(p, 5, 13), Catch::Contains("range [5, 13)"));
}

TEMPLATE_TEST_CASE("resuming from a checkpoint equals training without a break, bit for bit", "[io][checkpoint]",
                   (Strategy<NoShard>), ZeRO<1>, Zero3Blocks, (Strategy<ShardGradients, Fp16Mixed, WrapByType<Block>>)) {
  using S = TestType;
  for (const int world : {1, 2, 4}) {
    INFO("world size " << world);
    TempDir dir;
    const CheckpointRun whole = run<S>({.world = world, .steps = 5});
    REQUIRE(succeeded(whole));
    const CheckpointRun first = run<S>({.world = world, .steps = 3, .save = dir / "ckpt"});
    REQUIRE(succeeded(first));
    const CheckpointRun second = run<S>({.world = world, .first_step = 3, .steps = 2, .load = dir / "ckpt"});
    REQUIRE(succeeded(second));
    CHECK(second.resumed_step == 3);
    CHECK(bit_identical(second.parameters, whole.parameters));
    REQUIRE(second.losses.size() == 2);
    CHECK(second.losses[0] == whole.losses[3]);
    CHECK(second.losses[1] == whole.losses[4]);
    CHECK(second.loss_scale == whole.loss_scale);
    CHECK(second.good_steps == whole.good_steps);
  }
}

TEST_CASE("a checkpoint loads onto any world size, sharding and wrap policy unchanged", "[io][checkpoint]") {
  TempDir dir;
  const fs::path saved = dir / "zero3x4";
  const CheckpointRun a = run<Zero3Blocks>({.world = 4, .steps = 3, .save = saved});
  REQUIRE(succeeded(a));
  const auto original = contents(saved);
  CHECK(read_checkpoint_metadata(saved).files.size() == 4);

  // Load, then save again without a step: the parameters gathered after loading, and every
  // master weight and optimizer state element of the new checkpoint, equal the original's.
  auto reload = [&]<class S>(int world, const std::string& name, StrategyConfig config = {}) {
    INFO(name << " on " << world << " rank(s)");
    if constexpr (S::sharding::hybrid) config.hybrid_group_size = 2;
    const CheckpointRun b = run<S>({.world = world, .first_step = 3, .load = saved, .save = dir / name}, config);
    REQUIRE(succeeded(b));
    CHECK(b.resumed_step == 3);
    // Parameters are the masters in the compute dtype: equal where that is float.
    if constexpr (std::is_same_v<typename S::compute_type, float>) CHECK(bit_identical(b.parameters, a.parameters));
    CHECK(contents(dir / name) == original);
    const CheckpointMetadata m = read_checkpoint_metadata(dir / name);
    CHECK(m.optimizer_step == 3);
    CHECK(m.world_size == world);
    REQUIRE(m.training.find("run"));
  };
  reload.operator()<DDP>(1, "ddp1");
  reload.operator()<Strategy<NoShard>>(3, "ddp3");
  reload.operator()<ZeRO<1>>(3, "zero1x3");
  reload.operator()<ZeRO<2>>(2, "zero2x2");
  reload.operator()<ShardedDDP>(3, "sharded_ddp_x3");  // each parameter whole on one rank
  reload.operator()<Strategy<ShardParameters<false>, WrapBySize<40>>>(3, "fsdp_grad_op_x3");
  reload.operator()<Strategy<ShardParameters<true>, Bf16Mixed>>(4, "zero3_bf16_whole");
  reload.operator()<Strategy<HybridShard<ShardParameters<true>>>>(4, "hybrid");
  // An engine that steps its units in sub-groups reads and writes the same tensors.
  StrategyConfig pieces;
  pieces.sub_group_size = 37;
  reload.operator()<Zero3Blocks>(3, "zero3_sub_groups", pieces);
  CHECK(read_checkpoint_metadata(dir / "ddp3").files.size() == 1);
  CHECK(read_checkpoint_metadata(dir / "zero1x3").files.size() == 3);
}

TEST_CASE("training resumed on another world size follows the original run", "[io][checkpoint]") {
  // Momentum SGD: linear in the gradients, so a different reduction order only moves the
  // parameters by rounding (see engine_fixture.hpp).
  TempDir dir;
  const CheckpointRun whole = run<Zero3Blocks, Sgd<float>>({.world = 4, .steps = 5});
  REQUIRE(succeeded(whole));
  REQUIRE(succeeded(run<Zero3Blocks, Sgd<float>>({.world = 4, .steps = 3, .save = dir / "ckpt"})));
  const CheckpointRun ddp = run<DDP, Sgd<float>>({.world = 1, .first_step = 3, .steps = 2, .load = dir / "ckpt"});
  REQUIRE(succeeded(ddp));
  CHECK(max_difference(ddp.parameters, whole.parameters) < 1e-6);
  CHECK(std::abs(ddp.losses[1] - whole.losses[4]) < 1e-6);
  const CheckpointRun zero2 = run<ZeRO<2>, Sgd<float>>({.world = 3, .first_step = 3, .steps = 2, .load = dir / "ckpt"});
  REQUIRE(succeeded(zero2));
  CHECK(max_difference(zero2.parameters, whole.parameters) < 1e-6);
}

TEST_CASE("a corrupt or mismatched checkpoint fails on every rank with what is wrong", "[io][checkpoint]") {
  TempDir dir;
  const fs::path saved = dir / "ckpt";
  REQUIRE(succeeded(run<Zero3Blocks>({.world = 2, .steps = 1, .save = saved})));
  const Parameters fresh = run<Zero3Blocks>({.world = 2}).parameters;

  // Every rank must fail (none may wait for another), each naming the problem or the other rank.
  auto fails_everywhere = [&](const CheckpointRun& r, const std::string& message) {
    REQUIRE(r.errors.size() == 2);
    bool named = false;
    for (const std::string& e : r.errors) {
      CHECK(!e.empty());
      named = named || e.find(message) != std::string::npos;
    }
    CHECK(named);
    INFO(r.errors[0] << " | " << r.errors[1]);
  };
  auto load_into_zero3 = [&](const fs::path& from) {
    return run<Zero3Blocks>({.world = 2, .first_step = 1, .load = from});
  };

  SECTION("not a checkpoint") { fails_everywhere(load_into_zero3(dir / "missing"), "is not a sharded checkpoint"); }
  SECTION("a missing rank file") {
    fs::copy(saved, dir / "copy", fs::copy_options::recursive);
    fs::remove(dir / "copy" / checkpoint_file_name(1, 2));
    fails_everywhere(load_into_zero3(dir / "copy"), "lacks file 'rank-00001-of-00002.safetensors'");
  }
  SECTION("a truncated rank file") {
    fs::copy(saved, dir / "copy", fs::copy_options::recursive);
    fs::resize_file(dir / "copy" / checkpoint_file_name(0, 2), fs::file_size(dir / "copy" / checkpoint_file_name(0, 2)) - 4);
    fails_everywhere(load_into_zero3(dir / "copy"), "rank-00000-of-00002.safetensors");
  }
  SECTION("metadata that disagrees with a file") {
    fs::copy(saved, dir / "copy", fs::copy_options::recursive);
    // Swap the files: each now lacks the tensors the metadata places there.
    fs::rename(dir / "copy" / checkpoint_file_name(0, 2), dir / "copy" / "tmp");
    fs::rename(dir / "copy" / checkpoint_file_name(1, 2), dir / "copy" / checkpoint_file_name(0, 2));
    fs::rename(dir / "copy" / "tmp", dir / "copy" / checkpoint_file_name(1, 2));
    fails_everywhere(load_into_zero3(dir / "copy"), "that the metadata places there");
  }
  SECTION("another model") {
    GptConfig wider = tiny_gpt();
    wider.n_embd = 8;
    fails_everywhere(run<Zero3Blocks>({.world = 2, .load = saved, .model = wider}), "different shapes for");
    GptConfig deeper = tiny_gpt();
    deeper.n_layer = 3;
    fails_everywhere(run<Zero3Blocks>({.world = 2, .load = saved, .model = deeper}), "missing parameters 'transformer.h.2");
  }
  SECTION("another optimizer") {
    fails_everywhere(run<Zero3Blocks, Sgd<float>>({.world = 2, .load = saved}),
                     "holds optimizer state 'exp_avg', 'exp_avg_sq' but the engine's optimizer keeps 'momentum_buffer'");
  }
  // A failed load changes nothing a later successful one would not overwrite; the model a
  // mismatch was refused for still trains from its own initialisation.
  CHECK(bit_identical(run<Zero3Blocks>({.world = 2}).parameters, fresh));
}

TEST_CASE("a checkpoint is refused between the micro-batches of one step and saved at its end", "[io][checkpoint]") {
  // A checkpoint holds no gradients: one saved after 1 of 2 micro-batches would lose its.
  TempDir dir;
  StrategyConfig accumulating;
  accumulating.gradient_accumulation_steps = 2;
  const CheckpointRun midway = run<ZeRO<2>>({.world = 2, .steps = 1, .save = dir / "midway"}, accumulating);
  for (const std::string& e : midway.errors)
    CHECK_THAT(e, Catch::Contains("would lose the gradients of the 1 micro-batch(es)") &&
                      Catch::Contains("gradient_accumulation_steps 2"));
  CHECK_FALSE(fs::exists(dir / "midway"));
  REQUIRE(succeeded(run<ZeRO<2>>({.world = 2, .steps = 4, .save = dir / "at_end"}, accumulating)));
  CHECK(read_checkpoint_metadata(dir / "at_end").optimizer_step == 2);  // four micro-batches, two steps
}

TEST_CASE("saving over a checkpoint replaces it whole, a consolidated file holds every weight", "[io][checkpoint]") {
  TempDir dir;
  const fs::path saved = dir / "ckpt";
  REQUIRE(succeeded(run<ZeRO<2>>({.world = 2, .steps = 1, .save = saved})));
  const CheckpointRun later = run<ZeRO<2>>({.world = 2, .steps = 2, .save = saved});
  REQUIRE(succeeded(later));
  CHECK(read_checkpoint_metadata(saved).optimizer_step == 2);
  std::size_t entries = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    (void)e;
    ++entries;
  }
  CHECK(entries == 1);  // no temporary or previous checkpoint left beside it

  Gpt<float> model(tiny_gpt());
  consolidate_checkpoint(saved, dir / "full.safetensors", tied_parameters<Gpt<float>>::of(model));
  const SafetensorsFile full = SafetensorsFile::open(dir / "full.safetensors");
  CHECK(full.find("lm_head.weight"));
  for (const auto& [name, values] : later.parameters) {
    INFO(name);
    const Tensor<float> t = full.read<float>(name);
    CHECK(t.to_vector() == values);
  }
}

TEST_CASE("a CheckpointIO of one's own stores the checkpoint that saves write and loads read", "[io][checkpoint]") {
  TempDir dir;
  StagingIO io(dir / "scratch");
  const fs::path plain = dir / "plain", stored = dir / "stored";
  REQUIRE(succeeded(run<ZeRO<2>>({.world = 2, .steps = 2, .save = plain})));
  REQUIRE(succeeded(run<ZeRO<2>>({.world = 2, .steps = 2, .save = stored, .io = &io})));
  // Rank 0 began and committed the one save; every rank wrote into the store's staging directory,
  // whose files the commit moved into place: the checkpoint the default writes, element for element.
  CHECK(io.calls() == std::vector<std::string>{"begin stored", "commit"});
  CHECK(contents(stored) == contents(plain));
  for (const auto& entry : fs::directory_iterator(dir / "scratch"))  // the commit took the staging away
    CHECK_FALSE(entry.path().filename().string().starts_with("staging-"));

  // Each rank loads through its store's cache, and training resumes exactly as from the default's.
  const CheckpointRun from_store = run<ZeRO<2>>({.world = 2, .first_step = 2, .steps = 1, .load = stored, .io = &io});
  const CheckpointRun from_plain = run<ZeRO<2>>({.world = 2, .first_step = 2, .steps = 1, .load = plain});
  REQUIRE(succeeded(from_store));
  REQUIRE(succeeded(from_plain));
  CHECK(io.count("open") == 2);
  CHECK(bit_identical(from_store.parameters, from_plain.parameters));

  // A store that refuses the commit fails the save on every rank; the stored checkpoint stays.
  io.fail_commit = true;
  const CheckpointRun refused = run<ZeRO<2>>({.world = 2, .steps = 3, .save = stored, .io = &io});
  for (const std::string& e : refused.errors) CHECK_THAT(e, Catch::Contains("save_checkpoint"));
  CHECK_THAT(refused.errors[0], Catch::Contains("CheckpointIO::commit_save of") &&
                                    Catch::Contains("the store refused the checkpoint"));
  CHECK(read_checkpoint_metadata(stored).optimizer_step == 2);
  CHECK(contents(stored) == contents(plain));

  // remove_checkpoint goes through the store too; the default refuses what is not a checkpoint.
  remove_checkpoint(stored, io);
  CHECK(io.count("remove") == 1);
  CHECK_FALSE(fs::exists(stored));
  CHECK_THROWS_WITH(remove_checkpoint(dir / "scratch"), Catch::Contains("is not a checkpoint (no metadata.json)"));
  CHECK(fs::exists(dir / "scratch"));
  remove_checkpoint(plain);
  CHECK_FALSE(fs::exists(plain));
}

TEST_CASE("full weights leave a sharded engine as one PyTorch state dict and load into any other", "[io][checkpoint]") {
  TempDir dir;
  const fs::path file = dir / "model.safetensors";
  const CheckpointRun a = run<Zero3Blocks>({.world = 4, .steps = 2, .export_to = file});
  REQUIRE(succeeded(a));
  {
    // The file is a plain state dict: it loads into a model without any engine.
    Gpt<float> model(tiny_gpt());
    FlatParameters<float> flat(model);
    load_state_dict(model, file);  // strict: every name, the tied lm_head.weight included
    CHECK(bit_identical(sorted_parameters(model), a.parameters));
  }
  // Each rank of another strategy reads its own slices: the same parameters, bit for bit.
  const CheckpointRun ddp = run<DDP>({.world = 1, .init = file});
  REQUIRE(succeeded(ddp));
  CHECK(bit_identical(ddp.parameters, a.parameters));
  const CheckpointRun zero1 = run<ZeRO<1>>({.world = 3, .init = file});
  REQUIRE(succeeded(zero1));
  CHECK(bit_identical(zero1.parameters, a.parameters));
  // Each parameter whole on one rank, shards of their own sizes: read in, and exported again
  // from every owner's masters.
  const CheckpointRun oss = run<ShardedDDP>({.world = 3, .init = file, .export_to = dir / "oss.safetensors"});
  REQUIRE(succeeded(oss));
  CHECK(bit_identical(oss.parameters, a.parameters));
  {
    Gpt<float> model(tiny_gpt());
    FlatParameters<float> flat(model);
    load_state_dict(model, dir / "oss.safetensors");
    CHECK(bit_identical(sorted_parameters(model), a.parameters));
  }
  // bf16 compute keeps fp32 masters: the masters come back exactly through another export.
  const CheckpointRun bf16 = run<Strategy<ShardParameters<true>, Bf16Mixed>>({.world = 2, .init = file, .export_to = dir / "again.safetensors"});
  REQUIRE(succeeded(bf16));
  Gpt<float> model(tiny_gpt());
  FlatParameters<float> flat(model);
  load_state_dict(model, dir / "again.safetensors");
  CHECK(bit_identical(sorted_parameters(model), a.parameters));

  GptConfig wider = tiny_gpt();
  wider.n_embd = 8;
  const CheckpointRun wrong = run<Zero3Blocks>({.world = 2, .init = file, .model = wider});
  for (const std::string& e : wrong.errors) CHECK(!e.empty());
  CHECK_THAT(wrong.errors[0], Catch::Contains("does not match the model") && Catch::Contains("different shapes for"));
}

TEST_CASE("a full state dict gives every rank every parameter whole, from the master weights, in host memory on a "
          "host model",
          "[io][checkpoint]") {
  // The oracle: ZeRO-1 keeps every parameter whole on every rank and trains bit for bit like ZeRO-3
  // at the same world size (fp32), so its full_parameters() reads them without a gather.
  const CheckpointRun zero1 = run<ZeRO<1>>({.world = 3, .steps = 2});
  REQUIRE(succeeded(zero1));
  for (const bool to_cpu : {true, false}) {
    CAPTURE(to_cpu);
    StrategyConfig config;
    config.state_dict_to_cpu = to_cpu;  // a host model computes on the host: host memory either way
    const CheckpointRun zero3 = run<ZeRO<3>>({.world = 3, .steps = 2, .state_dict = true}, config);
    REQUIRE(succeeded(zero3));
    CHECK(zero3.state_dict_in_host_memory);
    CHECK(zero3.state_dicts_agree);
    CHECK(bit_identical(zero3.state_dict, zero1.parameters));
  }
  // Under bf16 compute it holds the fp32 masters, of which the parameters are the rounding.
  using Zero3Bf16 = Strategy<ShardParameters<true>, Bf16Mixed>;
  const CheckpointRun bf16 = run<Zero3Bf16>({.world = 2, .steps = 2, .state_dict = true});
  REQUIRE(succeeded(bf16));
  CHECK(bf16.state_dicts_agree);
  REQUIRE(bf16.state_dict.size() == bf16.parameters.size());
  CHECK_FALSE(bit_identical(bf16.state_dict, bf16.parameters));
  for (std::size_t i = 0; i < bf16.state_dict.size(); ++i) {
    const auto& [name, masters] = bf16.state_dict[i];
    INFO(name);
    REQUIRE(name == bf16.parameters[i].first);
    std::vector<float> rounded;
    for (const float m : masters) rounded.push_back(static_cast<float>(bfloat16(m)));
    CHECK(rounded == bf16.parameters[i].second);
  }
}

TEST_CASE("a full state dict in memory loads into another strategy on another world size, and one that does not "
          "fit is refused on every rank, naming each difference",
          "[io][checkpoint]") {
  const CheckpointRun zero3 = run<ZeRO<3>>({.world = 3, .steps = 2, .state_dict = true});
  REQUIRE(succeeded(zero3));
  const CheckpointRun fresh = run<ZeRO<1>>({.world = 2});
  REQUIRE(succeeded(fresh));
  CHECK_FALSE(bit_identical(fresh.parameters, zero3.parameters));  // training moved them
  // Each rank of ZeRO-1 on 2 ranks, and DDP on 1, copies its slices: the same parameters, bit for bit.
  const CheckpointRun zero1 = run<ZeRO<1>>({.world = 2, .init_dict = &zero3.dict});
  REQUIRE(succeeded(zero1));
  CHECK(bit_identical(zero1.parameters, zero3.parameters));
  const CheckpointRun ddp = run<DDP>({.world = 1, .init_dict = &zero3.dict});
  REQUIRE(succeeded(ddp));
  CHECK(bit_identical(ddp.parameters, zero3.parameters));

  std::vector<FullParameter<float, Cpu>> wrong = zero3.dict;
  wrong.pop_back();                             // missing
  wrong[0].name = "transformer.h.9.attn.bias";  // unexpected (and its own name missing)
  const auto matrix = std::find_if(wrong.begin(), wrong.end(), [](const auto& p) { return p.host.rank() == 2; });
  REQUIRE(matrix != wrong.end());
  const std::string reshaped = matrix->name;
  matrix->host = matrix->host.reshape(Shape{-1});
  const CheckpointRun refused = run<ZeRO<1>>({.world = 2, .init_dict = &wrong});
  for (const std::string& e : refused.errors) CHECK_THAT(e, Catch::Contains("does not match the model"));
  CHECK_THAT(refused.errors[0],
             Catch::Contains("missing parameters") && Catch::Contains("'" + zero3.dict[0].name + "'") &&
                 Catch::Contains("'" + zero3.dict.back().name + "'") &&
                 Catch::Contains("unexpected parameters 'transformer.h.9.attn.bias'") &&
                 Catch::Contains("different shapes for '" + reshaped + " (state dict (") &&
                 Catch::Contains("), model ("));
}

#if defined(POLYSHARD_HAVE_LIBURING)
TEST_CASE("full weights and a full state dict leave ZeRO-Infinity's file whole, each unit its own masters",
          "[io][checkpoint][nvme]") {
  // At world size 1 each unit's masters are whole, and they live in the file between uses: each
  // must be copied out before the next unit's are read into memory the first ones gave back.
  TempDir dir;
  StrategyConfig config;
  config.nvme_path = dir.path().string();
  config.max_in_cpu = 0;  // every shard and master in the file
  using InfinityBlocks = with_t<ZeROInfinityParameters, WrapByType<Block>>;
  const fs::path file = dir / "model.safetensors";
  const CheckpointRun nvme =
      run<InfinityBlocks>({.world = 1, .steps = 2, .export_to = file, .state_dict = true}, config);
  REQUIRE(succeeded(nvme));
  Gpt<float> model(tiny_gpt());
  FlatParameters<float> flat(model);
  load_state_dict(model, file);
  CHECK(bit_identical(sorted_parameters(model), nvme.parameters));
  CHECK(bit_identical(nvme.state_dict, nvme.parameters));
}

TEST_CASE("ZeRO-Infinity in bf16 stepping in sub-groups saves and resumes bit for bit, its masters in the sub-groups",
          "[io][checkpoint][nvme]") {
  // The fp32 masters live in the file with each sub-group's moments; a checkpoint puts each
  // unit's together and a load splits them again, here into the file and into memory.
  TempDir dir;
  StrategyConfig config;
  config.nvme_path = dir.path().string();
  config.optimizer_buffer_count = nvme_buffers_per_sub_group(2);  // one AdamW sub-group at a time
  config.sub_group_size = 37;
  using InfinityBf16 = with_t<with_t<ZeROInfinity, WrapByType<Block>>, Bf16Mixed>;
  using MemoryBf16 = Strategy<ShardParameters<true>, Bf16Mixed>;  // one unit: any layout loads
  const CheckpointRun whole = run<InfinityBf16>({.world = 2, .steps = 4}, config);
  REQUIRE(succeeded(whole));
  REQUIRE(succeeded(run<InfinityBf16>({.world = 2, .steps = 2, .save = dir / "ckpt"}, config)));
  const CheckpointRun resumed =
      run<InfinityBf16>({.world = 2, .first_step = 2, .steps = 2, .load = dir / "ckpt"}, config);
  REQUIRE(succeeded(resumed));
  CHECK(bit_identical(resumed.parameters, whole.parameters));
  const CheckpointRun in_memory = run<MemoryBf16>({.world = 2, .first_step = 2, .steps = 2, .load = dir / "ckpt"});
  REQUIRE(succeeded(in_memory));
  CHECK(bit_identical(in_memory.parameters, whole.parameters));
  CHECK(bit_identical(run<MemoryBf16>({.world = 2, .steps = 4}).parameters, whole.parameters));
}
#endif

TEST_CASE("Hugging Face GPT-2 directories leave a sharded engine and load into any other", "[io][checkpoint]") {
  TempDir dir;
  const fs::path hf = dir / "hf";
  const CheckpointRun a = run<Zero3Blocks>({.world = 4, .steps = 2, .export_hf = hf});
  REQUIRE(succeeded(a));
  // GPT2LMHeadModel's layout, read by load_hf_gpt2 (the mapping of a model without an engine).
  const SafetensorsFile file = SafetensorsFile::open(hf / "model.safetensors");
  REQUIRE(file.find("h.0.attn.c_attn.weight"));
  CHECK(file.find("h.0.attn.c_attn.weight")->shape == std::vector<std::int64_t>{6, 18});  // Conv1D: (in, out)
  CHECK_FALSE(file.find("transformer.wte.weight"));
  CHECK_FALSE(file.find("lm_head.weight"));
  {
    const GptConfig c = read_hf_gpt2_config(hf / "config.json");
    CHECK((c.vocab_size == 13 && c.block_size == 8 && c.n_layer == 2 && c.n_head == 2 && c.n_embd == 6));
    Gpt<float> model(c);
    FlatParameters<float> flat(model);
    load_hf_gpt2(model, hf / "model.safetensors");
    CHECK(bit_identical(sorted_parameters(model), a.parameters));
  }
  // Every rank of another strategy and world size reads its slices, transposing Conv1D's.
  const CheckpointRun zero1 = run<ZeRO<1>>({.world = 3, .init_hf = hf});
  REQUIRE(succeeded(zero1));
  CHECK(bit_identical(zero1.parameters, a.parameters));
  const CheckpointRun zero3 = run<Zero3Blocks>({.world = 3, .init_hf = hf});
  REQUIRE(succeeded(zero3));
  CHECK(bit_identical(zero3.parameters, a.parameters));
  // A published file also holds the attention-mask buffers and perhaps lm_head.weight: ignored.
  {
    Gpt<float> model(tiny_gpt());
    FlatParameters<float> flat(model);
    load_hf_gpt2(model, hf / "model.safetensors");
    SafetensorsWriter writer;
    writer.add_metadata("format", "pt");
    visit_parameters(model, [&](const std::string& name, auto& p) {
      const std::string bare = name.substr(12);  // no "transformer."
      bool conv1d = false;  // GPT-2's Conv1D matrices, stored (in, out)
      for (const char* s : {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"})
        conv1d = conv1d || bare.ends_with(s);
      writer.add(bare, conv1d ? p.value().transpose().contiguous() : p.value());
    });
    writer.add("h.0.attn.bias", Tensor<float>::zeros({1, 1, 8, 8})).add("lm_head.weight", model.transformer.wte.weight.value());
    fs::create_directories(dir / "published");
    writer.write(dir / "published" / "model.safetensors");
    const CheckpointRun published = run<Zero3Blocks>({.world = 2, .init_hf = dir / "published"});
    REQUIRE(succeeded(published));
    CHECK(bit_identical(published.parameters, a.parameters));
  }
  GptConfig wider = tiny_gpt();
  wider.n_embd = 8;
  const CheckpointRun wrong = run<Zero3Blocks>({.world = 2, .init_hf = hf, .model = wider});
  for (const std::string& e : wrong.errors) CHECK_THAT(e, Catch::Contains("does not match the model"));
}

TEST_CASE("resuming on another strategy with the same reduction order is bit-identical", "[io][checkpoint]") {
  // ZeRO-1, ZeRO-2 and ZeRO-3 reduce-scatter the same buffers in the same ring order at one world
  // size, and every strategy on one rank sums nothing: a hand-over between them changes no bit.
  TempDir dir;
  const CheckpointRun whole = run<ZeRO<1>>({.world = 2, .steps = 4});
  REQUIRE(succeeded(whole));
  REQUIRE(succeeded(run<ZeRO<1>>({.world = 2, .steps = 2, .save = dir / "zero1"})));
  const CheckpointRun zero3 = run<ZeRO<3>>({.world = 2, .first_step = 2, .steps = 2, .load = dir / "zero1"});
  REQUIRE(succeeded(zero3));
  CHECK(bit_identical(zero3.parameters, whole.parameters));
  // Saved by an engine stepping in sub-groups of 37 elements, resumed by one stepping whole units.
  StrategyConfig pieces;
  pieces.sub_group_size = 37;
  REQUIRE(succeeded(run<ZeRO<1>>({.world = 2, .steps = 2, .save = dir / "zero1_sub_groups"}, pieces)));
  const CheckpointRun from_pieces =
      run<ZeRO<3>>({.world = 2, .first_step = 2, .steps = 2, .load = dir / "zero1_sub_groups"});
  REQUIRE(succeeded(from_pieces));
  CHECK(bit_identical(from_pieces.parameters, whole.parameters));

  const CheckpointRun ddp = run<DDP>({.world = 1, .steps = 4});
  REQUIRE(succeeded(ddp));
  REQUIRE(succeeded(run<Zero3Blocks>({.world = 1, .steps = 2, .save = dir / "zero3x1"})));
  const CheckpointRun resumed = run<DDP>({.world = 1, .first_step = 2, .steps = 2, .load = dir / "zero3x1"});
  REQUIRE(succeeded(resumed));
  CHECK(bit_identical(resumed.parameters, ddp.parameters));
}

TEST_CASE("a save killed with SIGKILL at any point leaves the previous checkpoint, which resumes exactly",
          "[io][checkpoint]") {
  TempDir dir;
  const fs::path saved = dir / "ckpt";
  REQUIRE(succeeded(run<ZeRO<3>>({.world = 2, .steps = 2, .save = saved})));
  const CheckpointRun uninterrupted = run<ZeRO<3>>({.world = 2, .first_step = 2, .steps = 2, .load = saved});
  REQUIRE(succeeded(uninterrupted));
  const auto entries = [&] {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir.path())) names.push_back(e.path().filename().string());
    return names;
  };

  for (const char* point : {"rank file written", "rank files written", "metadata written", "before rename"}) {
    INFO("killed at: " << point);
    // A child process trains one more step and saves over the checkpoint; the probe kills it at
    // `point`, without unwinding or flushing, as kill -9 would.
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      detail::checkpoint_save_probe() = [point](std::string_view at) {
        if (at == point) ::raise(SIGKILL);
      };
      run<ZeRO<3>>({.world = 2, .first_step = 2, .steps = 1, .load = saved, .save = saved});
      ::_exit(0);  // the save finished: the probe never fired
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    REQUIRE(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGKILL);

    // The name `ckpt` is the previous checkpoint, whole: it loads and resumes bit for bit.
    const CheckpointRun resumed = run<ZeRO<3>>({.world = 2, .first_step = 2, .steps = 2, .load = saved});
    REQUIRE(succeeded(resumed));
    CHECK(resumed.resumed_step == 2);
    CHECK(resumed.losses == uninterrupted.losses);
    CHECK(max_difference(resumed.parameters, uninterrupted.parameters) == 0.0);
    // What the killed save wrote is a hidden temporary beside it, never taken for the checkpoint.
    const auto names = entries();
    CHECK(std::count(names.begin(), names.end(), "ckpt") == 1);
    CHECK(std::all_of(names.begin(), names.end(), [](const std::string& n) { return n == "ckpt" || n.starts_with(".ckpt.tmp-"); }));
  }
  // The next save removes the temporaries of the killed ones.
  REQUIRE(succeeded(run<ZeRO<3>>({.world = 2, .first_step = 2, .steps = 1, .load = saved, .save = saved})));
  CHECK(entries() == std::vector<std::string>{"ckpt"});
  CHECK(read_checkpoint_metadata(saved).training.step == 3);
}

namespace {

/// What the replay of a save found: how many distinct states a power loss could leave, how many
/// of them held the previous checkpoint and how many the new one, and what each of the others held.
struct ReplayOutcome {
  int states = 0, previous = 0, next = 0;
  bool finished_save_durable = false;  // once the save returned, every power loss leaves the new one
  std::vector<std::string> neither;
};

/// A checkpoint a replayed state may hold: its parameters and the step it was saved at.
struct Saved {
  Parameters parameters;
  std::int64_t step = 0;
};

/// Replays the recorded save `ops` (those `keep` accepts; the others as if the code left them
/// out) over directory `root` as `before` holds it, and loads "ckpt" from every distinct state a
/// power loss could leave (crash_replay.hpp), written out under `scratch`: it must be the previous
/// checkpoint (none: no "ckpt" at all) or the new one, whole.
template <class Keep>
ReplayOutcome replay_save(const std::vector<RecordedOperation>& ops, Keep keep, const fs::path& root,
                          const fs::path& before, const std::optional<Saved>& previous, const Saved& next,
                          const fs::path& scratch) {
  enum class Holds { previous, next, neither };
  ReplayOutcome out;
  std::map<DurableTree, Holds> seen;
  const auto holds = [&](const DurableTree& state, std::size_t prefix) {
    if (const auto it = seen.find(state); it != seen.end()) return it->second;
    ++out.states;
    fs::remove_all(scratch);
    write_tree(state, scratch);
    const fs::path ckpt = scratch / "ckpt";
    Holds verdict = Holds::neither;
    std::string what = "another checkpoint";
    if (!previous && !fs::exists(ckpt)) {
      verdict = Holds::previous;
    } else {
      const CheckpointRun loaded = run<ZeRO<3>>({.world = 2, .load = ckpt});
      const bool ok = loaded.errors[0].empty() && loaded.errors[1].empty();
      if (!ok) what = loaded.errors[0] + loaded.errors[1];
      const auto holds_saved = [&](const Saved& saved) {
        return ok && loaded.resumed_step == saved.step && bit_identical(loaded.parameters, saved.parameters);
      };
      if (previous && holds_saved(*previous)) verdict = Holds::previous;
      else if (holds_saved(next)) verdict = Holds::next;
    }
    switch (verdict) {
      case Holds::previous: ++out.previous; break;
      case Holds::next: ++out.next; break;
      case Holds::neither:
        out.neither.push_back("after " + std::to_string(prefix) + " of " + std::to_string(ops.size()) +
                              " operations: " + what);
        break;
    }
    seen.emplace(state, verdict);
    return verdict;
  };
  PowerLossModel model(root, before);
  for (std::size_t prefix = 0;; ++prefix) {
    const std::vector<DurableTree> states = model.power_loss_states();
    for (const DurableTree& state : states) holds(state, prefix);
    if (prefix == ops.size()) {
      out.finished_save_durable = holds(states[0], prefix) == Holds::next &&
                                  (states.size() == 1 || holds(states[1], prefix) == Holds::next);
      break;
    }
    if (keep(ops[prefix])) model.apply(ops[prefix]);
  }
  return out;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& line : lines) out += line + "\n";
  return out;
}

}  // namespace

TEST_CASE("a save cut by a power loss after any operation leaves the previous checkpoint or the new one",
          "[io][checkpoint]") {
  // Every prefix of a recorded save, with all it had not fsynced dropped (crash_replay.hpp): "ckpt"
  // must then load as the previous checkpoint or the new one, and a finished save must be durable.
  // The same replay without one kind of fsync must break this, or the check would prove nothing.
  using Kind = FileOperation::Kind;
  TempDir dir;
  const fs::path root = dir / "disk", scratch = dir / "after-power-loss";
  const fs::path before_first = dir / "before-first", before_second = dir / "before-second";
  fs::create_directories(root);
  const fs::path saved = root / "ckpt";
  const auto record_save = [&](const fs::path& before, const RunSpec& spec) {
    fs::copy(root, before, fs::copy_options::recursive);
    FileOperationLog log;
    const CheckpointRun result = run<ZeRO<3>>(spec);
    REQUIRE(succeeded(result));
    return std::pair{Saved{result.parameters, spec.first_step + spec.steps}, log.operations()};
  };
  const auto [first, first_save] = record_save(before_first, {.world = 2, .steps = 2, .save = saved});
  const auto [second, second_save] =
      record_save(before_second, {.world = 2, .first_step = 2, .steps = 1, .load = saved, .save = saved});
  const auto count = [&](Kind kind) {
    return std::count_if(second_save.begin(), second_save.end(), [&](const auto& op) { return op.kind == kind; });
  };
  // Two rank files and the metadata, each written and fsynced under a temporary name, renamed and
  // fsynced again with the whole tree; the swap, and its parent fsynced.
  CHECK(count(Kind::create_file) == 3);
  CHECK(count(Kind::fsync_file) == 6);
  CHECK(count(Kind::exchange) == 1);
  const auto all = [](const RecordedOperation&) { return true; };

  const ReplayOutcome over_nothing = replay_save(first_save, all, root, before_first, std::nullopt, first, scratch);
  INFO(joined(over_nothing.neither));
  CHECK(over_nothing.neither.empty());
  CHECK(over_nothing.finished_save_durable);
  CHECK(over_nothing.previous > 0);
  CHECK(over_nothing.next > 0);

  const ReplayOutcome over_first = replay_save(second_save, all, root, before_second, first, second, scratch);
  INFO(joined(over_first.neither));
  CHECK(over_first.neither.empty());
  CHECK(over_first.finished_save_durable);
  CHECK(over_first.previous > 0);
  CHECK(over_first.next > 0);

  // The controls: the second save as if the code had left out one kind of fsync.
  const auto without = [&](auto left_out) {
    return replay_save(second_save, [&](const RecordedOperation& op) { return !left_out(op); }, root, before_second,
                       first, second, scratch);
  };
  // The files' contents: the new directory comes into place with files that are empty.
  CHECK_FALSE(without([](const RecordedOperation& op) { return op.kind == Kind::fsync_file; }).neither.empty());
  // The names in the new directory: it comes into place empty.
  CHECK_FALSE(without([&](const RecordedOperation& op) {
                return op.kind == Kind::fsync_directory && op.path != root;
              }).neither.empty());
  // The swap in the parent directory: never anything but the previous checkpoint, so the finished
  // save is lost.
  const ReplayOutcome no_parent_fsync = without([&](const RecordedOperation& op) {
    return op.kind == Kind::fsync_directory && op.path == root;
  });
  CHECK(no_parent_fsync.neither.empty());
  CHECK_FALSE(no_parent_fsync.finished_save_durable);
}
