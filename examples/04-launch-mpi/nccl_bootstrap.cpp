// One GPU per MPI rank: an NCCL communicator bootstrapped over MPI, then one all-reduce of a
// device buffer, checked. Where this process sees no CUDA device it says so and exits 0.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <exception>
#include <span>
#include <vector>

#include <polyshard/comm/mpi_communicator.hpp>
#include <polyshard/comm/nccl_communicator.hpp>

using namespace polyshard;

int main(int argc, char** argv) {
  MpiSession session(&argc, &argv);
  MpiCommunicator world = MpiCommunicator::world();
  try {
    if (NcclCommunicator::device_count() == 0) {
      if (world.rank() == 0) std::printf("no CUDA device: nothing to run\n");
      return 0;
    }
    // [nccl]
    // The ranks on this machine, numbered from 0, take one GPU each.
    MPI_Comm node = MPI_COMM_NULL;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world.rank(), MPI_INFO_NULL, &node);
    int local_rank = 0, local_ranks = 1;
    MPI_Comm_rank(node, &local_rank);
    MPI_Comm_size(node, &local_ranks);
    MPI_Comm_free(&node);
    POLYSHARD_CHECK(local_ranks <= NcclCommunicator::device_count(), "NCCL needs one GPU per rank: ", local_ranks,
                    " ranks on this machine, ", NcclCommunicator::device_count(), " GPUs");
    // Rank 0 makes NCCL's unique id, MPI broadcasts it, every rank joins on its GPU.
    NcclCommunicator nccl = NcclCommunicator::bootstrap(world, /*device=*/local_rank);
    // [nccl]

    const int n = 1024;
    float* buf = nullptr;  // (n) on this rank's GPU
    POLYSHARD_CHECK(cudaMalloc(reinterpret_cast<void**>(&buf), n * sizeof(float)) == cudaSuccess, "cudaMalloc failed");
    std::vector<float> host(n, static_cast<float>(world.rank() + 1));
    cudaMemcpy(buf, host.data(), n * sizeof(float), cudaMemcpyHostToDevice);
    nccl.all_reduce(std::span<float>(buf, n));  // blocks until the collective finished on the device
    cudaMemcpy(host.data(), buf, n * sizeof(float), cudaMemcpyDeviceToHost);
    cudaFree(buf);
    const float want = static_cast<float>(world.size() * (world.size() + 1) / 2);
    int wrong = 0;
    for (float x : host) wrong += x != want;
    std::printf("rank %d on GPU %d: all_reduce over %d NCCL rank(s) %s\n", nccl.rank(), nccl.device(), nccl.size(),
                wrong == 0 ? "correct" : "WRONG");
    return wrong == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    MpiSession::abort(e.what());  // a failed NCCL call on one rank ends the whole job
  }
}
