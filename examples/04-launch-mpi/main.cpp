// Training under mpirun: one process per rank, an MpiCommunicator over MPI_COMM_WORLD, and the
// same Engine code as with ranks as threads. Every process checks that it ends with the
// parameters of a one-process DDP run it computes itself; the job exits 0 only if all agree.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <polyshard/comm/mpi_communicator.hpp>
#include <polyshard/comm/thread_communicator.hpp>
#include <polyshard/data/data.hpp>
#include <polyshard/engine/engine.hpp>
#include <polyshard/nn/nn.hpp>
#include <polyshard/optim/optim.hpp>
#include <polyshard/policy/policy.hpp>

using namespace polyshard;

namespace {

using Parameters = std::vector<std::pair<std::string, std::vector<float>>>;

const GptConfig config{.vocab_size = 256, .block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 24};

// [train]
/// One rank's part of a short training run under strategy S: the same code whether `comm` is a
/// ThreadCommunicator (ranks as threads) or an MpiCommunicator (ranks as processes).
template <class S, Communicator Comm>
Parameters train_rank(Comm& comm) {
  static const TextDataset data = TextDataset::from_text(builtin_corpus(1 << 14));
  const std::int64_t global_batch = 8;
  Gpt<float> model(config);
  Engine<S, Gpt<float>, Comm, Sgd<float>> engine(model, comm, SgdConfig{.lr = 0.1, .momentum = 0.9});
  const BatchSampler sampler(data, config.block_size, global_batch, /*seed=*/5);
  const RowRange rows = rank_rows(global_batch, comm.rank(), comm.size());
  const double share = double(rows.end - rows.begin) / double(global_batch);
  for (int step = 0; step < 4; ++step) {
    const Batch b = sampler.batch(step, comm.rank(), comm.size());
    engine.zero_grad();
    Var<float> loss = engine.forward([&] { return model.loss(b.inputs, b.targets); });
    engine.backward(loss, share);
    engine.step(0.1);
  }
  return engine.full_parameters();  // a collective: every rank gets the whole model
}
// [train]

double max_difference(const Parameters& a, const Parameters& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    for (std::size_t j = 0; j < a[i].second.size(); ++j)
      worst = std::max(worst, double(std::abs(a[i].second[j] - b[i].second[j])));
  return worst;
}

}  // namespace

// [main]
int main(int argc, char** argv) {
  MpiSession session(&argc, &argv);  // MPI_Init_thread; at exit MPI_Finalize, or MPI_Abort after a failed collective
  // Declared after the session, so destroyed before MPI_Finalize. Collectives time out after
  // POLYSHARD_COMM_TIMEOUT seconds (300 by default; CommOptions sets it in code).
  MpiCommunicator comm = MpiCommunicator::world();
  try {
    using ZeRO3ByBlock = Strategy<ShardParameters<true>, WrapByType<Block>>;
    const Parameters mine = train_rank<ZeRO3ByBlock>(comm);
    Parameters reference;  // the same run as one process, to compare with
    run_ranks(1, [&](ThreadCommunicator& one) { reference = train_rank<DDP>(one); });
    const double diff = max_difference(mine, reference);
    float failed = diff <= 1e-6 ? 0.0f : 1.0f;
    comm.all_reduce(std::span<float>(&failed, 1));  // every rank's verdict
    std::printf("rank %d of %d: max |parameter - one process's| = %.3g\n", comm.rank(), comm.size(), diff);
    if (comm.rank() == 0) std::printf("%s\n", failed == 0 ? "every rank trained like one process" : "MISMATCH");
    return failed == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    // Any error on one rank ends the whole job now, with its message: returning instead would
    // leave this rank in MPI_Finalize and the others waiting in their next collective.
    MpiSession::abort(e.what());
  }
}
// [main]
