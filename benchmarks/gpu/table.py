#!/usr/bin/env python3
"""One table of the GPU figures in a results folder (benchmarks/gpu/run.sh writes it): GEMM
through polyshard against cuBLASLt called directly, fused AdamW against the device's copy
bandwidth, and GPT-2 small training tokens/s and MFU beside PyTorch's.
  table.py DIR          print the table
  table.py --peak DIR   print only the measured bf16 matrix-product peak, TFLOP/s
"""
import json
import os
import sys


def load(folder, name):
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def main():
    args = sys.argv[1:]
    peak_only = args[:1] == ["--peak"]
    folder = args[-1] if args else "build/gpu/results"
    matmul = load(folder, "bench_matmul_cuda.json")
    peak = max((r.get("measured bf16 peak TFLOP/s", 0) for r in matmul["rows"]), default=0) if matmul else 0
    if peak_only:
        print(f"{peak:.1f}")
        return
    lines = ["| measure | polyshard | reference | ratio | target |", "|---|---|---|---|---|"]
    if matmul:
        rows = matmul["rows"]
        ratios = [r["ratio %"] for r in rows]
        worst = min(rows, key=lambda r: r["ratio %"])
        lines.append(f"| GEMM TFLOP/s, {len(rows)} GPT-2 shapes (bf16), worst: {worst['shape MxNxK']} {worst['op']} "
                     f"| {worst['polyshard TFLOP/s']:.0f} | cuBLASLt {worst['cuBLASLt TFLOP/s']:.0f} "
                     f"| {min(ratios):.1f}% (mean {sum(ratios) / len(ratios):.1f}%) | >= 95% |")
        lines.append(f"| measured bf16 matrix-product peak | {peak:.0f} TFLOP/s | | | |")
    adamw = load(folder, "bench_adamw_cuda.json")
    if adamw:
        copy, fused = adamw["rows"][0], adamw["rows"][1]
        lines.append(f"| fused AdamW GB/s (fp32 master and state, bf16 grad and copy) | {fused['GB/s']:.0f} "
                     f"| device copy {copy['GB/s']:.0f} | {fused['% of copy']:.1f}% | >= 85% |")
    torch = load(folder, "pytorch_gpt2.json")
    if torch:
        by_mode = {r["mode"]: r for r in torch["runs"]}
        for mode, r in by_mode.items():
            lines.append(f"| GPT-2 small tokens/s, PyTorch {mode} | | {r['tokens_per_s']:.0f} (MFU {100 * r['mfu']:.1f}%) | | |")
        ref = by_mode.get("compile") or next(iter(by_mode.values()))
        # The layers driven directly, then the same model through the engine (DDP over NCCL).
        for name, label in (("polyshard_gpt2.json", "polyshard"), ("polyshard_gpt2_engine.json", "polyshard engine")):
            ours = load(folder, name)
            if not ours:
                lines.append(f"| GPT-2 small tokens/s, {label} | not measured (bench_train_cuda did not run) | | | |")
                continue
            if peak > 0:  # against the same measured peak as PyTorch's MFU
                flops = 6 * ours["params"] + 6 * ours["layers"] * 768 * ours["seq"]
                ours["mfu"] = ours["tokens_per_s"] * flops / (peak * 1e12)
            lines.append(f"| GPT-2 small tokens/s, {label} | {ours['tokens_per_s']:.0f} (MFU {100 * ours['mfu']:.1f}%) "
                         f"| torch.compile {ref['tokens_per_s']:.0f} | {ours['tokens_per_s'] / ref['tokens_per_s']:.2f}x "
                         f"| >= 1.1x, MFU >= 45% |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
