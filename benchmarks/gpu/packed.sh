#!/usr/bin/env bash
# The GPU checks and benchmarks from a build made on the development machine, so that no device
# time goes to building. Here: build the release tree, then ../shared/tools/gpu-pack (it packs the
# GPU programs, the CTest files and the libraries into .gpu/); on the GPU machine (the device tool,
# carrying .gpu), from the repository root:
#   bash .gpu/gpu-run bash "$ROOT/benchmarks/gpu/packed.sh" OUT_DIR [quick]
# ($ROOT: the absolute path of the repository where it was packed). Runs, each writing a log and
# JSON, all packed again into OUT_DIR/results.tar after every step (a run cut short keeps what it
# finished; the device tool brings back a few files only): the fused attention's tests
# under compute-sanitizer (memcheck, racecheck, initcheck), the attention benchmark against
# PyTorch's scaled_dot_product_attention, GPT-2 small training with the fused attention and
# without it and at the unpadded vocabulary 50257, against PyTorch eager and torch.compile, then
# every GPU test.
set -uo pipefail
dest=${1:?OUT_DIR}
quick=${2:-}
out=$(mktemp -d)
mkdir -p "$dest"
save() { tar -cf "$dest/results.tar" -C "$out" .; }
here=$(cd "$(dirname "$0")" && pwd)
python=$(ls /opt/torch/.venv/bin/python3 2>/dev/null || command -v python3)
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
for tool in memcheck racecheck initcheck; do
  compute-sanitizer --tool "$tool" --error-exitcode 3 tests/tensor/test_cuda_transformer "[attention]" \
    > "$out/sanitizer-$tool.log" 2>&1
  echo "compute-sanitizer --tool $tool, fused attention tests: exit $? ($(tail -1 "$out/sanitizer-$tool.log"))"
done
save
benchmarks/tensor/bench_attention_cuda --json "$out/bench_attention_cuda.json" 2>&1 | tee "$out/attention.log"
PYTHONUNBUFFERED=1 "$python" "$here/pytorch_attention.py" --json "$out/pytorch_attention.json" 2>&1 | tee -a "$out/attention.log"
save
steps=(); [ -n "$quick" ] && steps=(--steps 10)
benchmarks/train/bench_train_cuda "${steps[@]}" --json "$out/train_fused.json" 2>&1 | tee "$out/train.log"
POLYSHARD_FUSED_ATTENTION=0 benchmarks/train/bench_train_cuda "${steps[@]}" --json "$out/train_materialized.json" 2>&1 |
  tail -3 | tee -a "$out/train.log"
benchmarks/train/bench_train_cuda "${steps[@]}" --vocab 50257 --json "$out/train_vocab50257.json" 2>&1 |
  tail -3 | tee -a "$out/train.log"
PYTHONUNBUFFERED=1 "$python" "$here/pytorch_gpt2.py" ${quick:+--steps 10} --json "$out/pytorch_gpt2.json" 2>&1 |
  tail -8 | tee -a "$out/train.log"
save
ctest -L gpu --output-on-failure --timeout 240 > "$out/tests.log" 2>&1
echo "ctest -L gpu: exit $?"; tail -15 "$out/tests.log"
save
