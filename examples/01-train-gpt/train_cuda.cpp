// polyshard-train on GPUs: the NCCL communicator of the ranks, then the strategy's device engine
// (strategies.cpp, built with POLYSHARD_TRAIN_ON_CUDA) on Gpt<CT, Cuda>, one GPU per rank.
#include "train_cuda.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <array>
#include <cstring>
#include <string>

#include "polyshard/core/cuda/error.hpp"
#include "polyshard/core/cuda/runtime.hpp"
#include "families.hpp"
#include "polyshard/comm/nccl_communicator.hpp"

namespace train {

void train_on_cuda(const Options& o, const Datasets& data, int rank, int world, int device,
                   const std::function<void(std::span<float>)>& share, polyshard::Trace* trace) {
  using namespace polyshard;
  const auto devices = cuda::available_devices();
  POLYSHARD_CHECK(devices && device < devices.count, "polyshard-train --device cuda: rank ", rank, " needs GPU ", device,
                  " but ", devices ? std::to_string(devices.count) + " are visible" : "none is usable (" + devices.reason + ")",
                  "; run with --device cpu, or with as many ranks as GPUs");
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (rank == 0) {
    const ncclResult_t rc = ncclGetUniqueId(&id);
    POLYSHARD_CHECK(rc == ncclSuccess, "polyshard-train: ncclGetUniqueId failed: ", ncclGetErrorString(rc));
  }
  // The id is opaque bytes; a broadcast of floats copies them bit for bit.
  std::array<float, sizeof(ncclUniqueId) / sizeof(float)> words;
  std::memcpy(words.data(), &id, sizeof(id));
  share(std::span<float>(words));
  std::memcpy(&id, words.data(), sizeof(id));
  NcclCommunicator comm(rank, world, id, device);  // says which device is missing, if one is
  POLYSHARD_CUDA_CHECK(cudaSetDevice(device));     // this thread's tensors live on `device`
  train_named_strategy<Cuda>(o, comm, data, trace);
}

}  // namespace train
