#!/usr/bin/env python3
"""polyshard-train against an oracle that shares no code with it: GPT-2 written here in NumPy
float64 from its definitions (Hugging Face's modeling_gpt2: Conv1D x W + b, the tanh GELU,
LayerNorm with eps 1e-5, causal attention, the head tied to wte), with its backward pass derived
by hand, PyTorch's AdamW and clip_grad_norm_ formulas, and nothing of polyshard but the weights it
exports. On a token file of one window (every row of every batch is the same sequence):

- the gradient of every parameter: one SGD step at learning rate 1 from the exported initial
  weights moves each weight by minus its gradient;
- AdamW with weight decay and clipping for three steps: every step's loss, and every final weight;

each at 1 and 3 ranks (one row a rank). A missing NumPy or safetensors fails the test: this is
the project's independent oracle, never skipped.

usage: check_numpy_oracle.py PROGRAM WORK_DIR
"""
import json
import os
import subprocess
import sys

import numpy as np
from safetensors.numpy import load_file

TOKENS = [3, 1, 4, 1, 5, 9, 2, 6, 5]  # one window of 8 inputs and their 8 targets
MODEL = ["--layers", "2", "--heads", "2", "--embd", "16", "--seq", "8", "--vocab", "11"]
BATCH = 3
LR, BETAS, EPS, DECAY, CLIP, STEPS = 1e-2, (0.9, 0.999), 1e-8, 0.1, 0.05, 3


def run(program, *args):
    done = subprocess.run([program, *args], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        sys.exit(f"{program} {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")


def weights(directory):
    """The exported weights by GPT2Model's names, in float64 (the tied head is wte)."""
    tensors = load_file(os.path.join(directory, "model.safetensors"))
    return {k.removeprefix("transformer."): v.astype(np.float64) for k, v in tensors.items() if k != "lm_head.weight"}


def layer_norm(x, w, b):
    """y, and what its backward reads: the normalized x and the standard deviation."""
    mean = x.mean(axis=-1, keepdims=True)
    sigma = np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + 1e-5)
    xhat = (x - mean) / sigma
    return xhat * w + b, (xhat, sigma)


def layer_norm_backward(dy, saved, w):
    """dx, dw and db of layer_norm for the gradient dy of its output."""
    xhat, sigma = saved
    dxhat = dy * w
    dx = (dxhat - dxhat.mean(axis=-1, keepdims=True) - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True)) / sigma
    return dx, (dy * xhat).sum(axis=(0, 1)), dy.sum(axis=(0, 1))


GELU_K = np.sqrt(2.0 / np.pi)


def gelu(x):
    return 0.5 * x * (1.0 + np.tanh(GELU_K * (x + 0.044715 * x ** 3)))


def gelu_backward(dy, x):
    t = np.tanh(GELU_K * (x + 0.044715 * x ** 3))
    return dy * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * GELU_K * (1 + 3 * 0.044715 * x * x))


def loss_and_grads(w, cfg, inputs, targets, tied=True):
    """The batch's mean cross-entropy and the gradient of every parameter, in float64. `tied`
    False leaves out the head's share of wte's gradient (a control: a model whose head is not wte)."""
    b, t = inputs.shape
    c, h = cfg["n_embd"], cfg["n_head"]
    d = c // h
    g = {k: np.zeros_like(v) for k, v in w.items()}
    x = w["wte.weight"][inputs] + w["wpe.weight"][np.arange(t)]
    mask = np.tril(np.ones((t, t), dtype=bool))
    saved = []
    for i in range(cfg["n_layer"]):
        p = f"h.{i}."
        x0 = x
        a_in, xhat1 = layer_norm(x0, w[p + "ln_1.weight"], w[p + "ln_1.bias"])
        qkv = a_in @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = (qkv[..., j * c:(j + 1) * c].reshape(b, t, h, d).transpose(0, 2, 1, 3) for j in range(3))
        scores = np.where(mask, q @ k.transpose(0, 1, 3, 2) / np.sqrt(d), -np.inf)
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        att = (probs @ v).transpose(0, 2, 1, 3).reshape(b, t, c)
        x1 = x0 + att @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        m_in, xhat2 = layer_norm(x1, w[p + "ln_2.weight"], w[p + "ln_2.bias"])
        pre = m_in @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"]
        act = gelu(pre)
        x = x1 + act @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
        saved.append((x0, a_in, xhat1, q, k, v, probs, att, x1, m_in, xhat2, pre, act))
    final, xhat_f = layer_norm(x, w["ln_f.weight"], w["ln_f.bias"])
    logits = final @ w["wte.weight"].T
    shifted = logits - logits.max(axis=-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    rows, cols = np.meshgrid(np.arange(b), np.arange(t), indexing="ij")
    loss = -logp[rows, cols, targets].mean()

    dlogits = np.exp(logp)
    dlogits[rows, cols, targets] -= 1
    dlogits /= b * t
    if tied:
        g["wte.weight"] += np.einsum("btv,btc->vc", dlogits, final)  # the head
    dx, g["ln_f.weight"], g["ln_f.bias"] = layer_norm_backward(dlogits @ w["wte.weight"], xhat_f, w["ln_f.weight"])
    for i in reversed(range(cfg["n_layer"])):
        p = f"h.{i}."
        x0, a_in, xhat1, q, k, v, probs, att, x1, m_in, xhat2, pre, act = saved[i]
        # x = x1 + gelu(ln_2(x1) W_fc + b_fc) W_proj + b_proj
        g[p + "mlp.c_proj.weight"] += np.einsum("bti,bto->io", act, dx)
        g[p + "mlp.c_proj.bias"] += dx.sum(axis=(0, 1))
        dpre = gelu_backward(dx @ w[p + "mlp.c_proj.weight"].T, pre)
        g[p + "mlp.c_fc.weight"] += np.einsum("bti,bto->io", m_in, dpre)
        g[p + "mlp.c_fc.bias"] += dpre.sum(axis=(0, 1))
        dx1, g[p + "ln_2.weight"], g[p + "ln_2.bias"] = layer_norm_backward(
            dpre @ w[p + "mlp.c_fc.weight"].T, xhat2, w[p + "ln_2.weight"])
        dx1 = dx1 + dx
        # x1 = x0 + attention(ln_1(x0)) W_proj + b_proj
        g[p + "attn.c_proj.weight"] += np.einsum("bti,bto->io", att, dx1)
        g[p + "attn.c_proj.bias"] += dx1.sum(axis=(0, 1))
        datt = (dx1 @ w[p + "attn.c_proj.weight"].T).reshape(b, t, h, d).transpose(0, 2, 1, 3)
        dv = probs.transpose(0, 1, 3, 2) @ datt
        dprobs = datt @ v.transpose(0, 1, 3, 2)
        dscores = probs * (dprobs - (dprobs * probs).sum(axis=-1, keepdims=True)) / np.sqrt(d)
        dq, dk = dscores @ k, dscores.transpose(0, 1, 3, 2) @ q
        dqkv = np.concatenate([z.transpose(0, 2, 1, 3).reshape(b, t, c) for z in (dq, dk, dv)], axis=-1)
        g[p + "attn.c_attn.weight"] += np.einsum("bti,bto->io", a_in, dqkv)
        g[p + "attn.c_attn.bias"] += dqkv.sum(axis=(0, 1))
        dx0, g[p + "ln_1.weight"], g[p + "ln_1.bias"] = layer_norm_backward(
            dqkv @ w[p + "attn.c_attn.weight"].T, xhat1, w[p + "ln_1.weight"])
        dx = dx0 + dx1
    np.add.at(g["wte.weight"], inputs, dx)
    g["wpe.weight"][:t] += dx.sum(axis=0)
    return loss, g


def adamw(w, cfg, inputs, targets, clip=CLIP):
    """STEPS steps of torch.optim.AdamW after torch.nn.utils.clip_grad_norm_: losses and weights."""
    m = {k: np.zeros_like(v) for k, v in w.items()}
    s = {k: np.zeros_like(v) for k, v in w.items()}
    losses = []
    for step in range(1, STEPS + 1):
        loss, g = loss_and_grads(w, cfg, inputs, targets)
        losses.append(loss)
        norm = np.sqrt(sum((v ** 2).sum() for v in g.values()))
        coefficient = clip / (norm + 1e-6)
        if coefficient < 1:
            g = {k: v * coefficient for k, v in g.items()}
        for k in w:
            w[k] = w[k] * (1 - LR * DECAY)
            m[k] = BETAS[0] * m[k] + (1 - BETAS[0]) * g[k]
            s[k] = BETAS[1] * s[k] + (1 - BETAS[1]) * g[k] ** 2
            m_hat, s_hat = m[k] / (1 - BETAS[0] ** step), s[k] / (1 - BETAS[1] ** step)
            w[k] = w[k] - LR * m_hat / (np.sqrt(s_hat) + EPS)
    return losses, w


def worst(got, want, scale):
    """The largest |got - want| of each tensor over `scale` (a number or a tensor name's number)."""
    return max((np.abs(got[k] - want[k]).max() / scale(k), k) for k in want)


def main(program, work):
    os.makedirs(work, exist_ok=True)
    data = os.path.join(work, "tokens.bin")
    np.array(TOKENS, dtype=np.uint16).tofile(data)  # nanoGPT's format: raw uint16 ids
    init = os.path.join(work, "init")
    run(program, *MODEL, "--data", data, "--batch", str(BATCH), "--steps", "0", "--export-hf", init)
    cfg = json.load(open(os.path.join(init, "config.json")))
    w0 = weights(init)
    inputs = np.array([TOKENS[:-1]] * BATCH)
    targets = np.array([TOKENS[1:]] * BATCH)
    loss0, grads = loss_and_grads(dict(w0), cfg, inputs, targets)
    losses, final = adamw(dict(w0), cfg, inputs, targets)
    # The controls, which the checks below must tell apart: the head's gradient left out of wte's,
    # and the same steps unclipped.
    _, untied = loss_and_grads(dict(w0), cfg, inputs, targets, tied=False)
    _, unclipped = adamw(dict(w0), cfg, inputs, targets, clip=np.inf)
    moved = max(np.abs(final[k] - w0[k]).max() for k in w0)
    common = ["--init-hf", init, "--seq", "8", "--data", data, "--batch", str(BATCH)]
    for world in (1, 3):
        # One SGD step at learning rate 1: the weights move by minus the gradient. Float weights
        # near 1 (LayerNorm's) carry 1.2e-7 of rounding into the difference.
        sgd = os.path.join(work, f"sgd-{world}")
        run(program, *common, "--world-size", str(world), "--steps", "1", "--optimizer", "sgd", "--lr", "1",
            "--export-hf", sgd)
        w1 = weights(sgd)
        got = {k: w0[k] - w1[k] for k in w0}
        tolerance = lambda k: 1e-6 + 1e-4 * np.abs(grads[k]).max()  # noqa: E731
        error, name = worst(got, grads, tolerance)
        control, _ = worst(got, untied, tolerance)
        print(f"world {world}: gradients (loss {loss0:.6f}): worst {name} at {error:.3f} of its tolerance;"
              f" against an untied head's, {control:.0f} times it")
        if error > 1 or control <= 1:
            sys.exit(f"world {world}: the gradient of {name} is not GPT-2's, or the check cannot tell")

        adam = os.path.join(work, f"adamw-{world}")
        metrics = os.path.join(work, f"adamw-{world}.jsonl")
        run(program, *common, "--world-size", str(world), "--steps", str(STEPS), "--optimizer", "adamw",
            "--lr", str(LR), "--weight-decay", str(DECAY), "--clip", str(CLIP), "--metrics", metrics,
            "--export-hf", adam)
        reported = [json.loads(line)["loss"] for line in open(metrics)]
        for step, (a, b) in enumerate(zip(reported, losses)):
            if abs(a - b) > 1e-6 * abs(b):
                sys.exit(f"world {world}: step {step}'s loss is {a}, the oracle's {b}")
        # Adam divides by the root of the second moment: a gradient element near zero turns its
        # float rounding into a visible part of an update of size lr (0.1% of lr a step).
        trained = weights(adam)
        error, name = worst(trained, final, lambda k: 1e-3 * LR * STEPS)
        control, _ = worst(trained, unclipped, lambda k: 1e-3 * LR * STEPS)
        print(f"world {world}: AdamW with clipping, {STEPS} steps: losses {', '.join(f'{x:.6f}' for x in reported)};"
              f" worst weight {name} at {error:.3f} of its tolerance (weights moved up to {moved:.4f});"
              f" against the unclipped steps, {control:.0f} times it")
        if len(reported) != STEPS or error > 1 or control <= 1:
            sys.exit(f"world {world}: the AdamW run ends away from the oracle ({name})")
    print("polyshard-train computes the gradient and the AdamW steps of the NumPy GPT-2")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
