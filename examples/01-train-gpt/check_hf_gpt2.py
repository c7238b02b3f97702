#!/usr/bin/env python3
"""polyshard-train and Hugging Face's GPT-2: --export-hf writes a save_pretrained directory whose
names, shapes and config.json are GPT2LMHeadModel's, and whose weights, run through a NumPy
GPT-2 written here from Hugging Face's modeling_gpt2 definitions (Conv1D x W + b, the tanh GELU,
LayerNorm with eps 1e-5, the head tied to wte), continue the prompt greedily with the tokens the
program sampled at temperature 0 with its key-value cache. --init-hf then starts a run from the
directory: the sizes come from config.json and the weights come back exactly.

usage: check_hf_gpt2.py PROGRAM WORK_DIR
"""
import json
import subprocess
import sys

import numpy as np
from safetensors.numpy import load_file

PROMPT = "ROMEO: "
NEW = 24


def run(program, *args):
    return subprocess.run([program, *args], capture_output=True, text=True, timeout=300)


def layer_norm(x, w, b):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * w + b


def gelu_new(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def logits(ids, w, cfg):
    t, c, h = len(ids), cfg["n_embd"], cfg["n_head"]
    x = w["wte.weight"][ids] + w["wpe.weight"][np.arange(t)]
    for i in range(cfg["n_layer"]):
        p = f"h.{i}."
        a = layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"]) @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = (a[:, j * c:(j + 1) * c].reshape(t, h, c // h).transpose(1, 0, 2) for j in range(3))
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(c // h)
        scores = np.where(np.tril(np.ones((t, t), dtype=bool)), scores, -np.inf)
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        out = (probs @ v).transpose(1, 0, 2).reshape(t, c)
        x = x + out @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        m = layer_norm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"]) @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"]
        x = x + gelu_new(m) @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    return layer_norm(x, w["ln_f.weight"], w["ln_f.bias"]) @ w["wte.weight"].T


def expected_shapes(cfg):
    c, v, n = cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"]
    shapes = {"wte.weight": (v, c), "wpe.weight": (n, c), "ln_f.weight": (c,), "ln_f.bias": (c,)}
    for i in range(cfg["n_layer"]):
        p = f"h.{i}."
        shapes.update({p + "ln_1.weight": (c,), p + "ln_1.bias": (c,), p + "ln_2.weight": (c,), p + "ln_2.bias": (c,),
                       p + "attn.c_attn.weight": (c, 3 * c), p + "attn.c_attn.bias": (3 * c,),
                       p + "attn.c_proj.weight": (c, c), p + "attn.c_proj.bias": (c,),
                       p + "mlp.c_fc.weight": (c, 4 * c), p + "mlp.c_fc.bias": (4 * c,),
                       p + "mlp.c_proj.weight": (4 * c, c), p + "mlp.c_proj.bias": (c,)})
    return shapes


def main():
    program, work = sys.argv[1], sys.argv[2]
    out, again = f"{work}/hf-gpt2", f"{work}/hf-gpt2-again"
    metrics = f"{work}/hf-gpt2-metrics.jsonl"
    r = run(program, "--layers", "2", "--heads", "2", "--embd", "32", "--seq", "32", "--batch", "8", "--steps", "40",
            "--lr", "3e-3", "--strategy", "zero3", "--world-size", "2", "--sample-every", "40", "--sample-tokens",
            str(NEW), "--temperature", "0", "--prompt", PROMPT, "--metrics", metrics, "--export-hf", out)
    if r.returncode != 0:
        print(f"polyshard-train --export-hf: exit {r.returncode}\n{r.stdout}\n{r.stderr}")
        return 1
    with open(f"{out}/config.json") as f:
        cfg = json.load(f)
    if cfg.get("model_type") != "gpt2" or cfg.get("architectures") != ["GPT2LMHeadModel"]:
        print(f"config.json is not GPT-2's: {cfg}")
        return 1
    weights = {k: v.astype(np.float64) for k, v in load_file(f"{out}/model.safetensors").items()}
    shapes = {k: v.shape for k, v in weights.items()}
    if shapes != expected_shapes(cfg):
        print(f"names or shapes differ from GPT2LMHeadModel's: {sorted(set(shapes.items()) ^ set(expected_shapes(cfg).items()))}")
        return 1

    # The program's greedy sample against the NumPy model recomputing each whole prefix.
    with open(metrics) as f:
        sampled = [json.loads(line) for line in f][-1]["sample"]
    tokens = list(PROMPT.encode())
    checked = 0
    for n in range(NEW):
        row = logits(np.array(tokens), weights, cfg)[-1]
        top2 = np.sort(row)[-2:]
        if top2[1] - top2[0] > 1e-4 * np.max(np.abs(row)):
            checked += 1
            if int(np.argmax(row)) != sampled[n]:
                print(f"token {n} of the sample is {sampled[n]}; GPT-2's most likely next token is {int(np.argmax(row))}")
                return 1
        tokens.append(sampled[n])
    if checked < NEW * 3 // 4:
        print(f"only {checked} of {NEW} tokens were clear of ties")
        return 1

    # --init-hf: no size flags given, config.json's apply; the weights come back bit for bit.
    r = run(program, "--init-hf", out, "--steps", "0", "--seq", "16", "--world-size", "3", "--strategy", "zero1",
            "--export-hf", again)
    header = "polyshard-train: GPT 2 layers, 2 heads, width 32, sequence 16"
    if r.returncode != 0 or header not in r.stdout:
        print(f"polyshard-train --init-hf: exit {r.returncode}, expected '{header}'\n{r.stdout}\n{r.stderr}")
        return 1
    back = load_file(f"{again}/model.safetensors")
    raw = load_file(f"{out}/model.safetensors")
    if set(back) != set(raw) or any(not np.array_equal(back[k], raw[k]) for k in raw):
        print("the weights --init-hf loaded and --export-hf wrote again differ")
        return 1
    r = run(program, "--init-hf", out, "--seq", "64", "--steps", "0")
    if r.returncode == 0 or "--seq 64 is longer than" not in r.stderr:
        print(f"--init-hf with a longer --seq: exit {r.returncode}\n{r.stderr}")
        return 1
    print(f"Hugging Face GPT-2: the export is GPT2LMHeadModel's; {checked} of {NEW} greedy tokens checked against a "
          "NumPy GPT-2; --init-hf loads it back exactly")
    return 0


if __name__ == "__main__":
    sys.exit(main())
