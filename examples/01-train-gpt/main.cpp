// polyshard-train: trains a GPT on byte-level text under a data-parallel strategy, on ranks that
// are threads of this process or MPI processes, and reports loss, speed, traffic and memory.
#include <array>
#include <cstdio>
#include <deque>
#include <numeric>
#include <span>
#include <thread>

#include "command_line.hpp"
#include "families.hpp"
#include "polyshard/comm/any_communicator.hpp"
#include "polyshard/comm/thread_communicator.hpp"
#include "polyshard/data/builtin_corpus.hpp"
#include "polyshard/data/token_file.hpp"
#include "polyshard/io/hf_gpt2.hpp"
#include "polyshard/optim/detail/elementwise.hpp"
#include "polyshard/tensor/cpu/blas.hpp"
#ifdef POLYSHARD_WITH_MPI
#include "polyshard/comm/mpi_communicator.hpp"
#endif
#ifdef POLYSHARD_WITH_CUDA
#include <cstdlib>

#include "polyshard/core/cuda/runtime.hpp"
#include "train_cuda.hpp"
#endif

using namespace polyshard;

namespace {

/// Whether --device auto trains on GPUs, as Lightning's accelerator="auto" picks one: where this
/// build has CUDA and NCCL, each rank this process runs (`local_ranks`: their ranks on this
/// machine) has a GPU of its own (its --parallel-devices entry, else GPU r), and the run asks for
/// nothing only host models do (--sample-every). Otherwise the host.
bool auto_picks_cuda([[maybe_unused]] const train::Options& o, [[maybe_unused]] std::span<const int> local_ranks) {
#ifdef POLYSHARD_WITH_CUDA
  if (o.sample_every > 0) return false;
  const auto devices = cuda::available_devices();
  if (!devices) return false;
  for (const int r : local_ranks) {
    if (!o.parallel_devices.empty() && r >= std::ssize(o.parallel_devices)) return false;
    if (train::rank_device(o, r) >= devices.count) return false;
  }
  return true;
#else
  return false;
#endif
}

int run(int argc, char** argv) {
  train::Options o;
  if (!train::parse(argc, argv, o)) return 0;
  if (o.device == "auto" && o.backend != "mpi") {  // under mpirun, once each process knows its rank (below)
    std::vector<int> ranks(static_cast<std::size_t>(o.world_size));
    std::iota(ranks.begin(), ranks.end(), 0);
    o.device = auto_picks_cuda(o, ranks) ? "cuda" : "cpu";
  }
#ifndef POLYSHARD_WITH_CUDA
  POLYSHARD_CHECK(o.device != "cuda", "polyshard-train: --device ", o.device,
                  " needs a build with CUDA and NCCL (none was found when this one was configured)");
#endif
  bool on_gpus = o.device == "cuda";
  // --init-hf: the model's sizes are the directory's config.json.
  if (!o.init_hf.empty()) {
    const GptConfig hf = read_hf_gpt2_config(std::filesystem::path(o.init_hf) / "config.json");
    POLYSHARD_CHECK(o.vocab == 0 || o.vocab == hf.vocab_size, "polyshard-train: --vocab ", o.vocab, " differs from ",
                    o.init_hf, "'s vocab_size ", hf.vocab_size);
    POLYSHARD_CHECK(o.seq <= hf.block_size, "polyshard-train: --seq ", o.seq, " is longer than ", o.init_hf,
                    "'s n_positions ", hf.block_size);
    o.layers = hf.n_layer;
    o.heads = hf.n_head;
    o.embd = hf.n_embd;
    o.vocab = hf.vocab_size;
    o.positions = hf.block_size;
  }
  // The format from --data-format or the file; the vocabulary from --vocab or the format.
  auto format_of = [&](const std::string& path) {
    return o.data_format == "auto" ? detect_token_format(path) : parse_token_format(o.data_format);
  };
  const TokenFormat format = o.data.empty() ? TokenFormat::text : format_of(o.data);
  if (o.vocab == 0) o.vocab = format == TokenFormat::text ? ByteTokenizer::vocab_size : gpt2_vocab_size;
  POLYSHARD_CHECK(!o.data.empty() || o.vocab >= ByteTokenizer::vocab_size, "polyshard-train: the built-in corpus ",
                  "is tokenized as bytes, which needs --vocab of at least 256, not ", o.vocab);
  train::Datasets data{o.data.empty() ? TextDataset::from_text(builtin_corpus(), "<built-in corpus>")
                                      : read_token_file(o.data, format, o.vocab),
                       std::nullopt};
  if (!o.val_data.empty()) data.validation = read_token_file(o.val_data, format_of(o.val_data), o.vocab);
  data.bytes = format == TokenFormat::text;
  if (o.sample_every > 0) {
    POLYSHARD_CHECK(!on_gpus, "polyshard-train: --sample-every generates on host models; --device cuda does not "
                              "sample (its cached attention has no device kernel)");
    data.prompt = train::prompt_tokens(o.prompt, data.bytes, o.vocab, data.train);
    const std::int64_t positions = model_positions(o);
    POLYSHARD_CHECK(std::int64_t(data.prompt.size()) + o.sample_tokens - 1 <= positions, "polyshard-train: --prompt's ",
                    data.prompt.size(), " tokens and --sample-tokens ", o.sample_tokens, " exceed the model's ",
                    positions, " positions (--seq)");
  }
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  if (o.backend == "mpi") {
#ifdef POLYSHARD_WITH_MPI
    MpiSession session(&argc, &argv);
    MpiCommunicator comm = MpiCommunicator::world();
    if (o.device == "auto") {  // every process must choose alike, whatever GPUs its own machine has
      std::array<float, 1> with_gpu{auto_picks_cuda(o, std::array{train::local_rank(comm.rank())}) ? 1.0f : 0.0f};
      comm.all_reduce(std::span<float>(with_gpu));
      o.device = with_gpu[0] == static_cast<float>(comm.size()) ? "cuda" : "cpu";
      on_gpus = o.device == "cuda";
    }
    train::resolve_micro_batch(o, comm.size());
    cpu::set_blas_threads(o.threads > 0 ? o.threads : 1);
    Trace trace(comm.rank());
    try {
      if (on_gpus) {
#ifdef POLYSHARD_WITH_CUDA
        const int device = train::rank_device(o, train::local_rank(comm.rank()));
        train::train_on_cuda(o, data, comm.rank(), comm.size(), device,
                             [&](std::span<float> id) { comm.broadcast(id, 0); }, o.trace.empty() ? nullptr : &trace);
#endif
      } else {
        AnyCommunicator ranks = AnyCommunicator::borrow(comm);
        train::train_named_strategy<Cpu>(o, ranks, data, o.trace.empty() ? nullptr : &trace);
      }
    } catch (const polyshard::Error& e) {
      // An error of this rank alone (a file it cannot write) would leave the others waiting in
      // a collective until it times out: end the whole job now, saying why.
      MpiSession::abort(e.what(), 2);
    }
    // One file per process: FILE.rank<r>.json.
    if (!o.trace.empty()) Trace::write_json(o.trace + ".rank" + std::to_string(comm.rank()) + ".json", {&trace});
    return 0;
#else
    polyshard::detail::throw_error("polyshard-train: --backend mpi needs a build with MPI (none was found)");
#endif
  }
  // Ranks as threads share the cores: each rank's BLAS and optimizer get their share.
  const int world = static_cast<int>(o.world_size);
  train::resolve_micro_batch(o, world);
  cpu::set_blas_threads(o.threads > 0 ? o.threads : std::max(1, cores / world));
  if (world > 1) set_optimizer_threads(1);
  std::deque<Trace> traces;  // a deque: traces hold mutexes and never move
  for (int r = 0; r < world; ++r) traces.emplace_back(r);
  if (on_gpus) {
#ifdef POLYSHARD_WITH_CUDA
    run_ranks(world, [&](ThreadCommunicator& boot) {
      train::train_on_cuda(o, data, boot.rank(), world, train::rank_device(o, boot.rank()),
                           [&](std::span<float> id) { boot.broadcast(id, 0); },
                           o.trace.empty() ? nullptr : &traces[static_cast<std::size_t>(boot.rank())]);
    });
#endif
  } else {
    train::with_family(o, []<train::Family>() {});  // an unknown --strategy fails here, before any rank starts
    run_ranks(world, [&](ThreadCommunicator& comm) {
      AnyCommunicator ranks = AnyCommunicator::borrow(comm);
      train::train_named_strategy<Cpu>(o, ranks, data,
                                       o.trace.empty() ? nullptr : &traces[static_cast<std::size_t>(comm.rank())]);
    });
  }
  if (!o.trace.empty()) {
    std::vector<const Trace*> all;
    for (const Trace& t : traces) all.push_back(&t);
    Trace::write_json(o.trace, all);  // one file, one process per rank
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const polyshard::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
