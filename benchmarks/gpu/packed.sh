#!/usr/bin/env bash
# The GPU checks and benchmarks from a build made on the development machine, so that no device
# time goes to building. Here: build the release tree, then ../shared/tools/gpu-pack (it packs the
# GPU programs, the CTest files and the libraries into .gpu/); on the GPU machine (the device tool,
# carrying .gpu), from the repository root:
#   bash .gpu/gpu-run bash "$ROOT/benchmarks/gpu/packed.sh" OUT_DIR [quick]
# ($ROOT: the absolute path of the repository where it was packed). Steps, most telling first, each
# under a time limit of its own so that one slow step cannot eat the lease: the fused attention's
# tests, every GPU test, the attention benchmark against PyTorch's scaled_dot_product_attention,
# GPT-2 small training (fused attention, materialized attention, vocabulary 50257) and GPT-2
# medium against PyTorch eager and torch.compile, compute-sanitizer (memcheck, initcheck,
# racecheck) over the fused attention's tests, then a per-kernel time breakdown (Nsight Compute). Each step writes a log and JSON; all are packed again into
# OUT_DIR/results.tar after every step (a run cut short keeps what it finished; the device tool
# brings back a few files only).
#
# With `speed` as a third argument: the GPU tests, the attention benchmarks and the training runs
# of `train` (no sanitizers, no per-kernel breakdown): what a change to a kernel is measured by.
#
# With `train` as a third argument, only the GPU tests and the training runs (GPT-2 small, vocabulary
# 50257, medium and small through the engine, each also from the POLYSHARD_COMPARE builds, then
# PyTorch's; the fused MLP and loss each turned off run in the full mode only): about 4 minutes on
# an H200.
#
# POLYSHARD_KERNEL (optional, any mode): a kernel-name pattern (a regular expression) and a test
# filter of test_cuda_transformer, "PATTERN:FILTER": the kernel is timed alone by Nsight Compute
# in GPT-2 small's steps (bench_train_cuda --quick: two layers), in this build and in each
# POLYSHARD_COMPARE build, and the filtered tests run under compute-sanitizer (memcheck, racecheck,
# initcheck): a changed kernel's time and hazards, right after the GPU tests.
#
# POLYSHARD_CPU_BENCH (optional, any mode): an absolute path to a folder holding bench_overlap
# built on the development machine (a host program: gpu-pack takes GPU programs only); it runs
# last, on the GPU machine's cores, where the communication threads have cores of their own.
#
# POLYSHARD_COMPARE (optional): folders, relative to the build tree, each holding a
# bench_attention_cuda and a bench_train_cuda built from another commit (copied there before
# packing: gpu-pack takes every GPU program of the tree). Each runs right after this build's
# attention and GPT-2 small benchmarks, so that before and after come from the same run.
set -uo pipefail
dest=${1:?OUT_DIR}
quick=${2:-}
only=${3:-all}
out=$(mktemp -d)
mkdir -p "$dest"
save() { tar -cf "$dest/results.tar" -C "$out" .; }
step() { # step SECONDS LOG COMMAND...: runs COMMAND under a limit, its output to LOG and a summary line
  local limit=$1 log=$2; shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$out/$log" 2>&1
  local rc=$?
  echo "== $log: exit $rc in $((SECONDS - start)) s"
  save
  return $rc
}
here=$(cd "$(dirname "$0")" && pwd)
python=$(ls /opt/torch/.venv/bin/python3 2>/dev/null || command -v python3)
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"

if [[ $only == all ]]; then
  step 120 attention-tests.log tests/tensor/test_cuda_transformer "[attention]"
  tail -4 "$out/attention-tests.log"
fi
step 300 gpu-tests.log ctest -L gpu -j3 --output-on-failure --timeout 240
grep -E "tests passed|Failed|\*\*\*" "$out/gpu-tests.log" | head -20

if [ -n "${POLYSHARD_KERNEL:-}" ]; then
  pattern=${POLYSHARD_KERNEL%%:*} filter=${POLYSHARD_KERNEL#*:}
  for build in . ${POLYSHARD_COMPARE:-}; do
    bench=benchmarks/train/bench_train_cuda; [ "$build" != . ] && bench=$build/bench_train_cuda
    name=$(basename "$(cd "$build" && pwd)")
    step 60 "ncu-kernel-$name.log" ncu --metrics gpu__time_duration.sum -k "regex:$pattern" --launch-count 4 \
      "$bench" --quick
    grep -E "$pattern|gpu__time_duration" "$out/ncu-kernel-$name.log" | head -8
  done
  for tool in memcheck racecheck initcheck; do
    step 60 "sanitizer-kernel-$tool.log" compute-sanitizer --tool "$tool" --error-exitcode 3 \
      tests/tensor/test_cuda_transformer "$filter"
    tail -n 2 "$out/sanitizer-kernel-$tool.log"
  done
fi

[[ $only == all || $only == speed ]] && {
step 90 attention-bench.log benchmarks/tensor/bench_attention_cuda --json "$out/bench_attention_cuda.json"
PYTHONUNBUFFERED=1 step 120 attention-torch.log "$python" "$here/pytorch_attention.py" --json "$out/pytorch_attention.json"
tail -n 8 "$out/attention-bench.log" "$out/attention-torch.log"
}

steps=(); [ -n "$quick" ] && steps=(--steps 10)
step 90 train-fused.log benchmarks/train/bench_train_cuda "${steps[@]}" --json "$out/train_fused.json"
for other in ${POLYSHARD_COMPARE:-}; do
  name=$(basename "$other")
  [[ $only == all || $only == speed ]] &&
    step 60 "compare-$name-attention.log" "$other/bench_attention_cuda" --json "$out/compare_${name}_attention.json" &&
    tail -n 6 "$out/compare-$name-attention.log"
  step 90 "compare-$name-train.log" "$other/bench_train_cuda" "${steps[@]}" --json "$out/compare_${name}_train.json"
  tail -n 3 "$out/compare-$name-train.log"
done
[[ $only == all ]] && POLYSHARD_FUSED_ATTENTION=0 step 90 train-materialized.log benchmarks/train/bench_train_cuda \
  "${steps[@]}" --json "$out/train_materialized.json"
# The fused MLP and the loss's gradient in the forward, each turned off alone: what each is worth.
[[ $only == all ]] && POLYSHARD_FUSED_MLP=0 step 90 train-unfused-mlp.log \
  benchmarks/train/bench_train_cuda "${steps[@]}" --json "$out/train_unfused_mlp.json"
[[ $only == all ]] && POLYSHARD_FUSED_LOSS=0 step 90 train-loss-in-backward.log \
  benchmarks/train/bench_train_cuda "${steps[@]}" --json "$out/train_loss_in_backward.json"
step 90 train-vocab50257.log benchmarks/train/bench_train_cuda "${steps[@]}" --vocab 50257 --json "$out/train_vocab50257.json"
step 120 train-medium.log benchmarks/train/bench_train_cuda "${steps[@]}" --medium --json "$out/train_medium.json"
step 90 train-engine.log benchmarks/train/bench_train_cuda "${steps[@]}" --engine --json "$out/train_engine.json"
# Activation checkpointing, and DeepSpeed's cpu_checkpointing beside it: the device memory the
# host copies save and the step time they cost (full mode only).
[[ $only == all ]] && step 90 train-checkpoint.log benchmarks/train/bench_train_cuda "${steps[@]}" --checkpoint \
  --json "$out/train_checkpoint.json"
[[ $only == all ]] && step 90 train-cpu-checkpointing.log benchmarks/train/bench_train_cuda "${steps[@]}" \
  --cpu-checkpointing --json "$out/train_cpu_checkpointing.json"
for other in ${POLYSHARD_COMPARE:-}; do
  name=$(basename "$other")
  step 120 "compare-$name-train-medium.log" "$other/bench_train_cuda" "${steps[@]}" --medium \
    --json "$out/compare_${name}_train_medium.json"
  step 90 "compare-$name-train-engine.log" "$other/bench_train_cuda" "${steps[@]}" --engine \
    --json "$out/compare_${name}_train_engine.json"
done
for f in "$out"/train-*.log "$out"/compare-*-train*.log; do [ -e "$f" ] && tail -n 3 "$f"; done
peak=$("$python" -c 'import json,sys; print(json.load(open(sys.argv[1]))["peak_tflops"])' "$out/train_fused.json" 2>/dev/null || echo 0)
PYTHONUNBUFFERED=1 step 240 train-torch.log "$python" "$here/pytorch_gpt2.py" ${quick:+--steps 10} --peak-tflops "$peak" \
  --json "$out/pytorch_gpt2.json"
tail -n 4 "$out/train-torch.log"
# POLYSHARD_TORCH_MEDIUM=0 skips PyTorch's medium runs (a minute and a half) where this lease
# already has them.
[[ ${POLYSHARD_TORCH_MEDIUM:-1} != 0 ]] && PYTHONUNBUFFERED=1 step 240 train-torch-medium.log \
  "$python" "$here/pytorch_gpt2.py" ${quick:+--steps 10} --layers 24 --width 1024 --heads 16 --peak-tflops "$peak" --json "$out/pytorch_gpt2_medium.json"
[ -e "$out/train-torch-medium.log" ] && tail -n 4 "$out/train-torch-medium.log"

# Offload on one GPU, in speed mode: GPT-2 small's shape (vocabulary 50257), batch 8 x 1024,
# bf16, AdamW, through polyshard-train: ZeRO-2 without offload, then ZeRO-Offload with pageable
# (staged) and page-locked host buffers, and with the delayed parameter update; each with its
# per-step metrics (JSON lines).
if [[ $only == speed && -x bin/polyshard-train ]]; then
  gpt2=(--device cuda --layers 12 --heads 12 --embd 768 --seq 1024 --vocab 50257 --batch 8 --steps 12
        --precision bf16-mixed --optimizer adamw --log-every 4)
  runs=("zero2" "zero_offload --pin-memory false" "zero_offload --pin-memory true"
        "zero_offload --pin-memory true --delayed-parameter-update true")
  for i in "${!runs[@]}"; do
    # shellcheck disable=SC2086
    step 90 "offload-$i.log" bin/polyshard-train "${gpt2[@]}" --strategy ${runs[$i]} --metrics "$out/offload_$i.jsonl"
    echo "-- ${runs[$i]}"; tail -n 2 "$out/offload-$i.log"
  done
fi

if [ -n "${POLYSHARD_CPU_BENCH:-}" ] && [ -x "$POLYSHARD_CPU_BENCH/bench_overlap" ]; then
  nproc > "$out/cpus.txt"
  step 150 overlap.log "$POLYSHARD_CPU_BENCH/bench_overlap" --json "$out/bench_overlap.json"
  tail -n 18 "$out/overlap.log"
fi

[[ $only == all ]] || exit 0
for tool in memcheck initcheck racecheck; do
  step 120 "sanitizer-$tool.log" compute-sanitizer --tool "$tool" --error-exitcode 3 tests/tensor/test_cuda_transformer "[attention]"
  tail -2 "$out/sanitizer-$tool.log"
done
# The model's ops and the head with its loss, under memcheck and initcheck. initcheck does not
# see the stores of the kernels cuBLASLt picks on Hopper: first the probe that shows it (a
# product's output, right at every element, reported uninitialized when copied back; expected
# to report), then the model's tests with every product's output cleared before cuBLASLt writes
# it (POLYSHARD_CLEAR_PRODUCT_OUTPUTS=1, tensor/cuda/matmul.hpp), so that what initcheck reports
# there is memory nothing wrote.
step 60 sanitizer-initcheck-probe.log compute-sanitizer --tool initcheck tests/tensor/test_cuda_matmul "[fresh-output]"
grep -E "ERROR SUMMARY" "$out/sanitizer-initcheck-probe.log" | head -1
for prog in autograd/test_cuda_autograd nn/test_cuda_gpt; do
  for tool in memcheck initcheck; do
    log="sanitizer-$tool-$(basename "$prog").log"
    POLYSHARD_CLEAR_PRODUCT_OUTPUTS=1 step 60 "$log" compute-sanitizer --tool "$tool" --error-exitcode 3 "tests/$prog"
    tail -n 1 "$out/$log"
  done
done

# Where a step's GPU time goes: every kernel of about two steps of a 2-layer GPT-2 (vocabulary
# 50304), each timed alone by Nsight Compute, summed per kernel name.
step 100 ncu-kernels.log ncu --metrics gpu__time_duration.sum --launch-skip 200 --launch-count 150 \
  --print-summary per-kernel --csv benchmarks/train/bench_train_cuda --quick --json "$out/ncu_train.json"
