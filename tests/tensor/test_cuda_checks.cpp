// Host-side checks of the CUDA half, run on every machine (no GPU needed): arguments are
// validated before any device call, so CI exercises these sentences wherever it runs; and a
// machine without a usable device gets a named error from device memory, never a crash.
#include <catch2/catch.hpp>

#include <cstdint>

#include "support/error_of.hpp"
#include "polyshard/core/cuda/runtime.hpp"
#include "polyshard/tensor/cuda/matmul.hpp"
#include "polyshard/tensor/cuda/ops.hpp"
#include "polyshard/tensor/cuda/transformer_kernels.hpp"

using namespace polyshard;

namespace {
/// A distinct 256-byte-aligned address that no check dereferences.
template <class T>
T* fake(std::uintptr_t slot) {
  return reinterpret_cast<T*>(slot << 20);
}
/// A device tensor of this shape that holds no memory: shape checks run, nothing is allocated.
Tensor<float, Cuda> shaped(const Shape& shape) { return Tensor<float, Cuda>::unmaterialized(shape); }
}  // namespace

TEST_CASE("cuda::matmul refuses bad arguments with a sentence, before it touches a device", "[cuda][tensor]") {
  // C (64, 48) = A (64, 40) B (40, 48), packed; the pointers are 256-byte aligned and never read.
  cuda::MatmulArgs<float> base;
  base.m = 64, base.n = 48, base.k = 40;
  base.a = fake<float>(1), base.lda = 40;
  base.b = fake<float>(2), base.ldb = 48;
  base.c = fake<float>(3), base.ldc = 48;
  struct Fake {
    float* p;
    float* data() const { return p; }
  };
  const Fake bias{fake<float>(4)}, aux{fake<float>(5)};
  using Catch::Contains;

  auto args = base;
  args.lda = 39;
  CHECK_THROWS_WITH(cuda::matmul(args, nullptr), Contains("lda = 39") && Contains("(m, k)"));
  args = base;
  args.trans_b = true;  // B stored (n, k) = (48, 40): ldb must be at least 40
  args.ldb = 30;
  CHECK_THROWS_WITH(cuda::matmul(args, nullptr), Contains("ldb = 30") && Contains("transposed"));
  args = base;
  args.ldc = 47;
  CHECK_THROWS_WITH(cuda::matmul(args, nullptr), Contains("ldc = 47"));
  args = base;
  args.k = 0;
  CHECK_THROWS_WITH(cuda::matmul(args, nullptr), Contains("k = 0"));
  args = base;
  args.epilogue = cuda::Epilogue::Bias;
  CHECK_THROWS_WITH(cuda::matmul(args, nullptr), Contains("needs the bias it adds"));
  args = base;
  args.bias = bias.data();
  CHECK_THROWS_WITH(cuda::matmul(args, nullptr), Contains("does not add one"));
  args = base;
  args.epilogue = cuda::Epilogue::BiasGradA;
  args.trans_a = true;
  args.lda = 64;  // A stored (k, m) = (40, 64)
  CHECK_THROWS_WITH(cuda::matmul(args, nullptr), Contains("needs bias_grad"));
  args.bias = bias.data();
  CHECK_THROWS_WITH(cuda::matmul(args, nullptr), Contains("does not add one"));
  args = base;
  args.epilogue = cuda::Epilogue::BiasGeluAux;
  args.bias = bias.data();
  args.aux = aux.data();
  args.aux_ld = 52;
  CHECK_THROWS_WITH(cuda::matmul(args, nullptr), Contains("divisible by 8"));
  args.aux_ld = 56;
  args.batch_count = 2;
  args.stride_a = 64 * 40;
  args.stride_c = 64 * 48;
  CHECK_THROWS_WITH(cuda::matmul(args, nullptr), Contains("takes one product"));
  args = base;
  args.epilogue = cuda::Epilogue::DGelu;
  args.aux = aux.data();
  args.beta = 1.0f;
  CHECK_THROWS_WITH(cuda::matmul(args, nullptr), Contains("beta must be 0"));
  args = base;
  args.epilogue = cuda::Epilogue::BiasGradA;
  args.bias_grad = bias.data();
  CHECK_THROWS_WITH(cuda::matmul(args, nullptr), Contains("only when A is a transposed view"));
  args.epilogue = cuda::Epilogue::BiasGradB;
  args.trans_b = true;
  args.ldb = 40;
  CHECK_THROWS_WITH(cuda::matmul(args, nullptr), Contains("only when B is not transposed"));
  args = base;
  args.batch_count = 2;
  args.stride_c = 64 * 48 - 1;
  CHECK_THROWS_WITH(cuda::matmul(args, nullptr), Contains("overlap"));
  args = base;
  args.a = reinterpret_cast<const float*>(reinterpret_cast<const char*>(base.a) + 2);
  CHECK_THROWS_WITH(cuda::matmul(args, nullptr), Contains("aligned to their 4-byte elements"));
  args = base;
  args.c = nullptr;
  CHECK_THROWS_WITH(cuda::matmul(args, nullptr), Contains("a null C"));

  // An empty product is no error and touches nothing.
  args = base;
  args.m = 0;
  CHECK_NOTHROW(cuda::matmul(args, nullptr));
}

TEST_CASE("a strided batch tells the heuristic the alignment of its least aligned item", "[cuda][tensor]") {
  using cuda::detail::batch_alignment;
  CHECK(batch_alignment(256, 0, 2) == 256);  // a shared operand keeps its own
  CHECK(batch_alignment(256, 43, 2) == 2);   // 86-byte steps
  CHECK(batch_alignment(256, 24, 2) == 16);  // 48-byte steps
  CHECK(batch_alignment(16, 64, 4) == 16);   // never above the first item's
}

TEST_CASE("device ops check shapes before any device work, with the host ops' sentences", "[cuda][tensor]") {
  using test::error_of;
  using Catch::Contains;
  CHECK_THAT(error_of([] { layer_norm_forward(shaped({4, 8}), shaped({7}), shaped({7}), 1e-5, shaped({4, 8}),
                                             shaped({4}), shaped({4})); }),
             Contains("layer_norm") && Contains("(7,)"));
  CHECK_THAT(error_of([] { matmul_into(shaped({4, 8}), shaped({7, 3}), shaped({4, 3})); }),
             Contains("matmul: inner dimensions differ"));
  CHECK_THAT(error_of([] { matmul_into(shaped({4, 8}), shaped({8, 3}), shaped({3, 4})); }),
             Contains("matmul: output shape"));
  CHECK_THAT(error_of([] { add_into(shaped({4, 8}), shaped({8, 4}), shaped({4, 8})); }), Contains("add"));
  CHECK_THAT(error_of([] { gelu_forward(shaped({4, 8}), shaped({4, 9})); }), Contains("gelu"));
  CHECK_THAT(error_of([] { softmax_forward(shaped({8, 4}).transpose(), shaped({4, 8})); }),
             Contains("not contiguous"));
  CHECK_THAT(error_of([] { causal_self_attention_forward(shaped({2, 5, 10}), 4, shaped({2, 5, 3}),
                                                         shaped({2, 4, 5, 5})); }),
             Contains("causal_self_attention") && Contains("n_head = 4"));
  CHECK_THAT(error_of([] {
               cross_entropy_forward(shaped({6, 11}), Tensor<std::int32_t, Cuda>::unmaterialized({5}), shaped({6}),
                                     shaped({6}));
             }),
             Contains("cross_entropy targets"));
}

TEST_CASE("without a usable device, device memory is a named error, with one, it is memory", "[cuda][core]") {
  const auto devices = cuda::available_devices();
  if (devices) {
    CHECK(devices.reason.empty());
    CHECK(Tensor<float, Cuda>::empty(Shape{4}).numel() == 4);
    return;
  }
  INFO("no device here: " << devices.reason);
  CHECK_FALSE(devices.reason.empty());
  const std::string error = test::error_of([] { Tensor<float, Cuda>::empty(Shape{4}); });
  CHECK_THAT(error, Catch::Contains("polyshard: cudaGetDevice") && Catch::Contains("failed"));
}

TEST_CASE("transformer launchers name the op and the bad size", "[cuda][tensor]") {
  CHECK_THROWS_WITH(cuda::softmax_forward<float>(nullptr, nullptr, 4, 0, nullptr),
                    Catch::Contains("softmax") && Catch::Contains("got 0"));
  CHECK_THROWS_WITH(cuda::gelu_forward<float>(nullptr, nullptr, -3, nullptr),
                    Catch::Contains("gelu") && Catch::Contains("-3"));
  CHECK_THROWS_WITH(cuda::attention_permute_forward<float>(nullptr, nullptr, nullptr, nullptr, 1, 4, 0, 8, nullptr),
                    Catch::Contains("attention_permute") && Catch::Contains("n_head"));
  CHECK_THROWS_WITH(cuda::column_sum<float>(nullptr, {reinterpret_cast<float*>(16), false}, 100, 8, nullptr, 0, nullptr),
                    Catch::Contains("column_sum") && Catch::Contains("workspace"));
}
