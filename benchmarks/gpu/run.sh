#!/usr/bin/env bash
# Everything polyshard measures on a GPU, in one command on the GPU machine: builds the CUDA code
# for sm_90a, runs every GPU test (each compares kernels with their CPU twins), then the GEMM and
# AdamW benchmarks and PyTorch's GPT-2 small on the same GPU, and prints one table.
#   benchmarks/gpu/pack_deps.sh          # here, once: headers the GPU machine lacks
#   benchmarks/gpu/run.sh [OUT_DIR]      # there (the device tool: carry .gpu-deps)
# Results (JSON and logs) go to OUT_DIR (default build/gpu/results).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:-build/gpu/results}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader 2>&1 | tee "$out/gpu.txt"
prefix=()
[ -d .gpu-deps/usr ] && prefix=(-DCMAKE_PREFIX_PATH="$PWD/.gpu-deps/usr")
# NCCL from PyTorch's wheels where the toolkit has none.
nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null || true)
[ -n "$nccl" ] && prefix+=(-DPOLYSHARD_NCCL_INCLUDE_DIR="$nccl/include" -DPOLYSHARD_NCCL_LIBRARY="$(ls "$nccl"/lib/libnccl.so* | head -1)")
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DPOLYSHARD_ENABLE_CUDA=ON -DPOLYSHARD_ENABLE_MPI=OFF -DPOLYSHARD_BUILD_EXAMPLES=ON "${prefix[@]}" \
  > "$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
gpu_tests="test_cuda_core test_cuda_tensor test_cuda_matmul test_cuda_transformer test_cuda_optimizers test_cuda_unit_kernels test_cuda_autograd test_cuda_gpt polyshard-cuda-tensors"
# Where NCCL was found: the device engines, and polyshard-train --device cuda (its checkpoints).
ninja -C build/gpu -t query test_comm_nccl >/dev/null 2>&1 && gpu_tests+=" test_comm_nccl test_cuda_engine polyshard-train"
cmake --build build/gpu --target $gpu_tests bench_matmul_cuda bench_adamw_cuda bench_train_cuda > "$out/build.log" 2>&1 ||
  { grep -E 'error' -A3 "$out/build.log" | head -60; exit 1; }
status=0
ctest --test-dir build/gpu -L gpu --output-on-failure --timeout 300 2>&1 | tee "$out/tests.log" | tail -25 || status=1
build/gpu/benchmarks/tensor/bench_matmul_cuda --json "$out/bench_matmul_cuda.json" 2>&1 | tee "$out/matmul.log"
build/gpu/benchmarks/optim/bench_adamw_cuda --json "$out/bench_adamw_cuda.json" 2>&1 | tee "$out/adamw.log"
build/gpu/benchmarks/train/bench_train_cuda --json "$out/polyshard_gpt2.json" 2>&1 | tee "$out/train.log"
build/gpu/benchmarks/train/bench_train_cuda --engine --json "$out/polyshard_gpt2_engine.json" 2>&1 | tee -a "$out/train.log"
# Offload: GPT-2 small's shape (vocab 50257), batch 8 x 1024, bf16, AdamW, one GPU, through
# polyshard-train: ZeRO-2 without offload, ZeRO-Offload with pageable (staged) and page-locked
# host buffers, and with the delayed parameter update; each with its Chrome trace.
if [ -x build/gpu/examples/01-train-gpt/polyshard-train ]; then
  gpt2=(--device cuda --layers 12 --heads 12 --embd 768 --seq 1024 --vocab 50257 --batch 8 --steps 12
        --precision bf16-mixed --optimizer adamw --log-every 1)
  runs=("zero2" "zero_offload --pin-memory false" "zero_offload --pin-memory true"
        "zero_offload --pin-memory true --delayed-parameter-update true")
  for i in "${!runs[@]}"; do
    echo "== offload run $i: --strategy ${runs[$i]}" | tee -a "$out/offload.log"
    # shellcheck disable=SC2086
    build/gpu/examples/01-train-gpt/polyshard-train "${gpt2[@]}" --strategy ${runs[$i]} \
      --trace "$out/offload_trace_$i.json" --metrics "$out/offload_$i.jsonl" 2>&1 | tee -a "$out/offload.log" | tail -3
  done
fi
peak=$(python3 benchmarks/gpu/table.py --peak "$out" 2>/dev/null || echo 0)
PYTHONUNBUFFERED=1 python3 benchmarks/gpu/pytorch_gpt2.py --peak-tflops "$peak" --json "$out/pytorch_gpt2.json" 2>&1 |
  tee "$out/pytorch.log" | tail -6
python3 benchmarks/gpu/table.py "$out"
exit $status
