#!/usr/bin/env python3
"""Checks a directory polyshard-own-model --export wrote against Hugging Face's Llama.

The weights are loaded with the safetensors library, as transformers loads model.safetensors;
their names must be exactly LlamaForCausalLM's state dict for config.json's sizes. The logits
the program computed (check.safetensors) must equal those of a NumPy forward pass written here
from Hugging Face's modeling_llama definitions (RMSNorm, rotate-half rotary embeddings,
repeat_kv grouped-query attention, SwiGLU MLP, untied lm_head), in float64; and the tokens it
generated greedily with its key-value cache must be what that forward pass, run on each whole
prefix, finds most likely.

usage: check_hf.py DIR
"""
import json
import sys

import numpy as np
from safetensors.numpy import load_file


def expected_names(cfg):
    names = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        names |= {p + "input_layernorm.weight", p + "post_attention_layernorm.weight"}
        names |= {p + f"self_attn.{x}_proj.weight" for x in "qkvo"}
        names |= {p + f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")}
    return names


def rms_norm(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rotary(x, theta):
    """x: (B, T, H, d); q * cos + rotate_half(q) * sin at positions 0..T-1."""
    d = x.shape[-1]
    inv_freq = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    freqs = np.arange(x.shape[1], dtype=np.float64)[:, None] * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)  # (T, d)
    cos, sin = np.cos(emb)[None, :, None, :], np.sin(emb)[None, :, None, :]
    rotated = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], axis=-1)
    return x * cos + rotated * sin


def attention(x, w, p, cfg):
    b, t, c = x.shape
    h, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = c // h
    q = rotary((x @ w[p + "q_proj.weight"].T).reshape(b, t, h, d), cfg["rope_theta"])
    k = rotary((x @ w[p + "k_proj.weight"].T).reshape(b, t, kv, d), cfg["rope_theta"])
    v = (x @ w[p + "v_proj.weight"].T).reshape(b, t, kv, d)
    k, v = np.repeat(k, h // kv, axis=2), np.repeat(v, h // kv, axis=2)  # repeat_kv
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d)
    scores = np.where(np.tril(np.ones((t, t), dtype=bool)), scores, -np.inf)
    probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    out = np.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, t, c)
    return out @ w[p + "o_proj.weight"].T


def mlp(x, w, p):
    gate = x @ w[p + "gate_proj.weight"].T
    return (gate / (1.0 + np.exp(-gate)) * (x @ w[p + "up_proj.weight"].T)) @ w[p + "down_proj.weight"].T


def logits(ids, w, cfg):
    eps = cfg["rms_norm_eps"]
    x = w["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = x + attention(rms_norm(x, w[p + "input_layernorm.weight"], eps), w, p + "self_attn.", cfg)
        x = x + mlp(rms_norm(x, w[p + "post_attention_layernorm.weight"], eps), w, p + "mlp.")
    return rms_norm(x, w["model.norm.weight"], eps) @ w["lm_head.weight"].T


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-1])
        return 2
    root = sys.argv[1]
    with open(f"{root}/config.json") as f:
        cfg = json.load(f)
    weights = {k: v.astype(np.float64) for k, v in load_file(f"{root}/model.safetensors").items()}
    check = load_file(f"{root}/check.safetensors")
    missing = expected_names(cfg) - set(weights)
    unexpected = set(weights) - expected_names(cfg)
    if missing or unexpected:
        print(f"names differ from LlamaForCausalLM's: missing {sorted(missing)}, unexpected {sorted(unexpected)}")
        return 1
    want = logits(check["input_ids"].astype(np.int64), weights, cfg)
    got = check["logits"].astype(np.float64)
    error = np.max(np.abs(got - want)) / np.max(np.abs(want))
    print(f"{len(weights)} tensors with LlamaForCausalLM's names; logits {got.shape}: "
          f"max difference {error:.2e} of the largest logit")
    # The program computes in float32: a few roundings per op, over a dozen ops.
    if error > 1e-5:
        print("the logits differ from Hugging Face's Llama")
        return 1
    # Greedy generation with the program's key-value cache: every generated token must be the
    # most likely next token of the whole prefix computed afresh, wherever the runner-up is not
    # within float32 rounding of it.
    generated = check["generated"].astype(np.int64)
    full = logits(generated[None, :-1], weights, cfg)[0]  # (T - 1, vocab)
    prompt = len(generated) - 20
    checked = 0
    for p in range(prompt - 1, len(generated) - 1):
        top2 = np.sort(full[p])[-2:]
        if top2[1] - top2[0] < 1e-4 * np.max(np.abs(full[p])):
            continue
        checked += 1
        if np.argmax(full[p]) != generated[p + 1]:
            print(f"generated token {p + 1} is {generated[p + 1]}, the full forward's most likely is {np.argmax(full[p])}")
            return 1
    print(f"greedy generation with the key-value cache: {checked} of 20 tokens checked against the full forward")
    if checked < 15:
        print("too few tokens were clear of ties to check the generation")
        return 1
    print("the export is Hugging Face's Llama")
    return 0


if __name__ == "__main__":
    sys.exit(main())
