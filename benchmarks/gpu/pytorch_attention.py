#!/usr/bin/env python3
"""PyTorch's side of bench_attention_cuda: torch.nn.functional.scaled_dot_product_attention with
is_causal=True on the same shapes (bf16, B = 8, H = 12, T = 1024, head dimensions 64 and 128),
forward and forward+backward, medians of CUDA-event-timed samples of 5 calls. The backward is
forward+backward less the forward. Prints a table and writes JSON.
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F


def median_ms(fn, repeats, inner=5):
    for _ in range(2):
        fn()
    samples = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) / inner)
    return statistics.median(samples)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default="pytorch_attention.json")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    rows = []
    b, h, t = 8, 12, 1024
    for d in (64, 128):
        gen = torch.Generator(device="cuda").manual_seed(1)
        q, k, v = (torch.rand(b, h, t, d, device="cuda", generator=gen, dtype=torch.bfloat16).mul_(2).sub_(1)
                   .requires_grad_() for _ in range(3))
        dout = torch.rand(b, h, t, d, device="cuda", generator=gen, dtype=torch.bfloat16)

        def forward():
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def both():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            out.backward(dout)

        fwd = median_ms(forward, args.repeats)
        total = median_ms(both, args.repeats)
        flops = 2.0 * b * h * t * t * d
        rows.append({"head dim": d, "heads": h, "path": "torch SDPA", "forward ms": fwd,
                     "backward ms": total - fwd, "forward+backward ms": total,
                     "forward TFLOP/s": flops / (fwd * 1e-3) / 1e12,
                     "backward TFLOP/s": 2.5 * flops / ((total - fwd) * 1e-3) / 1e12})
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
    print("| head dim | path | forward ms | backward ms | forward+backward ms | forward TFLOP/s | backward TFLOP/s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['head dim']} | {r['path']} | {r['forward ms']:.3f} | {r['backward ms']:.3f} | "
              f"{r['forward+backward ms']:.3f} | {r['forward TFLOP/s']:.1f} | {r['backward TFLOP/s']:.1f} |")
    with open(args.json, "w") as f:
        json.dump({"benchmark": "torch scaled_dot_product_attention, causal, bf16", "rows": rows}, f)


if __name__ == "__main__":
    main()
