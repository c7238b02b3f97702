#!/usr/bin/env python3
"""polyshard's host AdamW against torch.optim.AdamW(fused=True) on the CPU, in the same run.

Both update the same number of fp32 parameters with fp32 state, at 1 thread, 2 threads and every
core (torch.set_num_threads; polyshard's bench_adamw sets its own thread count per case), and the
table gives elements per second and polyshard's speed-up. PyTorch's fused CPU AdamW takes
gradients of the parameters' dtype only, so the mixed-precision row (bf16 gradients in, the bf16
compute copy out in the same pass) has no PyTorch counterpart; its figure is polyshard's alone.

Usage: pytorch_adamw.py BENCH_ADAMW [--n ELEMENTS] [--reps R] [--json FILE]
  BENCH_ADAMW  the bench_adamw program (build/release/benchmarks/optim/bench_adamw)
Needs PyTorch (pip install torch: PyPI's wheel brings its CUDA libraries, which load without a
GPU; see docs/benchmarks.md).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def torch_adamw(torch, n, threads, reps, fused):
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    param = torch.nn.Parameter(torch.rand(n, generator=gen) * 2 - 1)
    param.grad = (torch.rand(n, generator=gen) * 2 - 1) * 1e-2
    # polyshard's AdamWConfig defaults: PyTorch's (lr 1e-3, betas 0.9/0.999, eps 1e-8, wd 1e-2).
    opt = torch.optim.AdamW([param], fused=fused, foreach=None if fused else True)
    opt.step()  # state allocated, first touches done
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - start)
    times.sort()
    return n / times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bench_adamw")
    ap.add_argument("--n", type=int, default=32 << 20)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json")
    args = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        sys.exit(f"pytorch_adamw.py: PyTorch does not load ({e}); see docs/benchmarks.md")

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "adamw.json")
        subprocess.run([args.bench_adamw, "--n", str(args.n), "--reps", str(args.reps), "--json", out],
                       check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            ours = json.load(f)

    cores = os.cpu_count() or 1
    thread_counts = sorted({1, min(2, cores), cores})
    widest = ours["widest_isa"]

    def polyshard_rate(prefix, threads):
        rates = [r["elements_per_s"] for r in ours["adamw"]
                 if r["kernel"] == f"{prefix} ({widest})" and r["threads"] == threads]
        return rates[0] if rates else None

    rows = []
    for t in thread_counts:
        fused = torch_adamw(torch, args.n, t, args.reps, fused=True)
        foreach = torch_adamw(torch, args.n, t, args.reps, fused=False)
        rows.append({"threads": t, "torch_fused": fused, "torch_foreach": foreach,
                     "polyshard_fp32": polyshard_rate("adamw fp32", t),
                     "polyshard_mixed_one_pass": polyshard_rate("mixed, one pass", t)})

    print(f"AdamW over {args.n} fp32 elements on the CPU, median of {args.reps} steps; torch {torch.__version__}, "
          f"polyshard on {widest}; machine bandwidth {ours['bandwidth_gb_per_s']:.1f} GB/s (bench_adamw, same run)")
    print(f"{'threads':>7} {'torch fused':>13} {'torch foreach':>14} {'polyshard':>13} {'x fused':>8}"
          f" {'polyshard mixed':>16}")
    for r in rows:
        def fmt(x):
            return f"{x:.3e}" if x else "-"
        ratio = r["polyshard_fp32"] / r["torch_fused"] if r["polyshard_fp32"] else float("nan")
        print(f"{r['threads']:>7} {fmt(r['torch_fused']):>13} {fmt(r['torch_foreach']):>14} "
              f"{fmt(r['polyshard_fp32']):>13} {ratio:>7.2f}x {fmt(r['polyshard_mixed_one_pass']):>16}")
    print("(elements per second; x fused: polyshard fp32 over torch fused, target >= 2x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "adamw_vs_pytorch", "elements": args.n, "runs": args.reps,
                       "torch": torch.__version__, "widest_isa": widest,
                       "bandwidth_gb_per_s": ours["bandwidth_gb_per_s"], "rows": rows}, f, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
