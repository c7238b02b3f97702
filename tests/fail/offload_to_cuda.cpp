// Offload targets are host memory (Cpu) and NVMe; offloading to the compute device is not offloading.
// expect: 'Where' must be Cpu or Nvme
#include "polyshard/policy/strategy.hpp"

using namespace polyshard;

#ifdef POLYSHARD_FAIL
using Composition = Strategy<ShardParameters<>, OffloadParameters<Cuda>>;
#else
using Composition = Strategy<ShardParameters<>, OffloadParameters<Cpu>>;
#endif

// sizeof needs the complete type, which instantiates it and its static_asserts.
static_assert(sizeof(Composition) > 0);
