#!/usr/bin/env python3
"""The PyTorch side of the GPT-2 small training comparison: the same model, batch and precision
as polyshard's GPU benchmark (124M parameters: 12 layers, 768 wide, 12 heads, sequence 1024,
vocabulary 50304, tied embedding; bf16 compute under autocast with fp32 master weights; AdamW),
run eagerly and under torch.compile on the same GPU. Prints a table and writes JSON.

Model flops per token: 6 N + 6 L C T (N parameters, L layers, C width, T sequence), the same
formula polyshard's benchmark uses; MFU is against the bf16 matrix-product peak measured by
bench_matmul_cuda in the same run (--peak-tflops), not a datasheet number.
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(width)
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width)
        self.c_fc = nn.Linear(width, 4 * width)
        self.mlp_proj = nn.Linear(4 * width, width)

    def forward(self, x):  # x: (B, T, C)
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)  # each (B, T, C)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))  # (B, H, T, D)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, vocab, context, layers, width, heads):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as in GPT-2
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):  # idx, targets: (B, T)
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, V)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def measure(mode, args):
    torch.manual_seed(0)
    model = Gpt(args.vocab, args.seq, args.layers, args.width, args.heads).cuda()
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    step_model = torch.compile(model) if mode == "compile" else model
    x = torch.randint(0, args.vocab, (args.batch, args.seq), device="cuda")
    y = torch.randint(0, args.vocab, (args.batch, args.seq), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    tokens = args.batch * args.seq
    flops_per_token = 6 * n_params + 6 * args.layers * args.width * args.seq
    tok_s = tokens / seconds
    mfu = tok_s * flops_per_token / (args.peak_tflops * 1e12) if args.peak_tflops > 0 else float("nan")
    del model, opt, step_model
    torch.cuda.empty_cache()
    return {"framework": "pytorch", "mode": mode, "params": n_params, "step_ms": seconds * 1e3,
            "tokens_per_s": tok_s, "mfu": mfu, "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--modes", default="eager,compile")
    p.add_argument("--peak-tflops", type=float, default=0.0, help="measured bf16 matmul peak (bench_matmul_cuda)")
    p.add_argument("--json", default="pytorch_gpt2.json")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: the PyTorch GPT-2 comparison did not run")
        return
    torch.backends.cuda.matmul.allow_tf32 = True
    rows = []
    for mode in args.modes.split(","):
        torch.cuda.reset_peak_memory_stats()
        rows.append(measure(mode, args))
    print(f"GPT-2 L{args.layers} C{args.width} H{args.heads} vocabulary {args.vocab}, batch {args.batch} x {args.seq} "
          f"tokens, bf16 autocast, fp32 master, fused AdamW "
          f"({torch.cuda.get_device_name()}, torch {torch.__version__})")
    print(f"{'run':<18}{'step ms':>10}{'tokens/s':>12}{'MFU':>8}{'peak GiB':>10}")
    for r in rows:
        print(f"{'pytorch ' + r['mode']:<18}{r['step_ms']:>10.1f}{r['tokens_per_s']:>12.0f}{r['mfu'] * 100:>7.1f}%"
              f"{r['peak_memory_gib']:>10.1f}")
    with open(args.json, "w") as f:
        json.dump({"batch": args.batch, "seq": args.seq, "peak_tflops": args.peak_tflops, "runs": rows}, f, indent=1)


if __name__ == "__main__":
    main()
