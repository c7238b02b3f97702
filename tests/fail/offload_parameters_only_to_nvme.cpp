// DeepSpeed's offload_param alone goes to host memory: on NVMe the masters and the optimizer
// state go with the parameters, which is OffloadParameters<Nvme>.
// expect: on NVMe the masters and optimizer state go with them: use OffloadParameters<Nvme>
#include "polyshard/policy/strategy.hpp"

using namespace polyshard;

#ifdef POLYSHARD_FAIL
using Composition = Strategy<ShardParameters<>, OffloadParametersOnly<Nvme>>;
#else
using Composition = Strategy<ShardParameters<>, OffloadParametersOnly<Cpu>>;
#endif

// sizeof needs the complete type, which instantiates it and its static_asserts.
static_assert(sizeof(Composition) > 0);
