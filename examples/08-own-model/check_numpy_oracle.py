#!/usr/bin/env python3
"""The Llama-style model's gradient against an oracle that shares no code with polyshard: the
NumPy float64 forward pass of check_hf.py (Hugging Face's modeling_llama definitions: RMSNorm,
rotate-half rotary embeddings, grouped-query attention, SwiGLU, an untied head) and its mean
cross-entropy, differentiated by central finite differences.

polyshard-own-model --export DIR writes the weights before and after one SGD step at learning
rate 1 of ZeRO-3 at world size 3 (each weight moves by minus its gradient of the global batch's
mean loss) and the batch with its loss. Checked here:

- the loss of the weights before the step, to 1e-6 relative;
- in every tensor, the element of largest gradient and 8 drawn at random: each gradient within
  1e-4 of the tensor's largest (plus 1e-7, the rounding of the step in float32) of its central
  difference (step 1e-4 in float64, whose error, of the order of the step squared times the
  loss's third derivative, is far below that);

and controls that must fail: the same gradients against the finite differences of a model whose
MLP swaps its gate and up projections (a module wired to the wrong weight), and the loss against
the weights after the step. A missing NumPy or safetensors fails the test.

usage: check_numpy_oracle.py DIR
"""
import json
import os
import sys

import numpy as np
from safetensors.numpy import load_file

import check_hf

H = 1e-4
SAMPLES = 8
RELATIVE, ABSOLUTE = 1e-4, 1e-7


def mean_loss(weights, cfg, ids, targets):
    z = check_hf.logits(ids, weights, cfg)
    z = z - z.max(axis=-1, keepdims=True)
    log_probs = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return -np.mean(np.take_along_axis(log_probs, targets[..., None], axis=-1))


def finite_difference(weights, cfg, ids, targets, name, index):
    w = weights[name].reshape(-1)
    saved = w[index]
    w[index] = saved + H
    up = mean_loss(weights, cfg, ids, targets)
    w[index] = saved - H
    down = mean_loss(weights, cfg, ids, targets)
    w[index] = saved
    return (up - down) / (2 * H)


def swapped_mlp(x, w, p):
    """The MLP with its gate and up projections exchanged: the control's wiring mistake."""
    gate = x @ w[p + "up_proj.weight"].T
    return (gate / (1.0 + np.exp(-gate)) * (x @ w[p + "gate_proj.weight"].T)) @ w[p + "down_proj.weight"].T


def worst_excess(weights, cfg, ids, targets, grads, names, rng_seed):
    """max over the checked elements of |gradient - finite difference| / tolerance, and where."""
    rng = np.random.default_rng(rng_seed)
    worst, where = 0.0, ""
    for name in names:
        g = grads[name].reshape(-1)
        scale = np.max(np.abs(g))
        picks = {int(np.argmax(np.abs(g)))} | {int(i) for i in rng.integers(0, g.size, SAMPLES)}
        for i in sorted(picks):
            fd = finite_difference(weights, cfg, ids, targets, name, i)
            excess = abs(g[i] - fd) / (RELATIVE * scale + ABSOLUTE)
            if excess > worst:
                worst, where = excess, f"{name}[{i}]: {g[i]:.6e} against {fd:.6e}"
    return worst, where


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-1])
        return 2
    root = sys.argv[1]
    with open(os.path.join(root, "config.json")) as f:
        cfg = json.load(f)
    before = {k: v.astype(np.float64) for k, v in load_file(os.path.join(root, "gradient_before.safetensors")).items()}
    after = {k: v.astype(np.float64) for k, v in load_file(os.path.join(root, "gradient_after.safetensors")).items()}
    batch = load_file(os.path.join(root, "gradient_batch.safetensors"))
    ids, targets = batch["input_ids"].astype(np.int64), batch["targets"].astype(np.int64)
    grads = {k: before[k] - after[k] for k in before}
    if set(before) != check_hf.expected_names(cfg) or set(after) != set(before):
        print("the exported weights do not have LlamaForCausalLM's names")
        return 1
    failed = False

    want = mean_loss(before, cfg, ids, targets)
    got = float(batch["loss"][0])
    stale = mean_loss(after, cfg, ids, targets)
    print(f"loss of batch {ids.shape}: polyshard {got:.8f}, NumPy {want:.8f} (relative {abs(got - want) / want:.1e}); "
          f"the weights after the step give {stale:.8f}")
    if abs(got - want) > 1e-6 * want:
        print("the loss differs from the NumPy Llama's")
        failed = True
    if abs(got - stale) <= 1e-6 * stale:
        print("control: the loss also matches the weights after the step, so the check cannot tell them apart")
        failed = True

    names = sorted(before)
    worst, where = worst_excess(before, cfg, ids, targets, grads, names, 0)
    print(f"gradients of {len(names)} tensors, {SAMPLES} drawn elements and the largest of each, against finite "
          f"differences: worst {worst:.3f} of the tolerance ({where})")
    if worst > 1:
        print("a gradient differs from the NumPy Llama's")
        failed = True

    mlp_names = [n for n in names if "gate_proj" in n or "up_proj" in n]
    check_hf.mlp, original = swapped_mlp, check_hf.mlp
    control, _ = worst_excess(before, cfg, ids, targets, grads, mlp_names, 0)
    check_hf.mlp = original
    print(f"control, the gate and up projections swapped in the NumPy model: {control:.0f} times the tolerance")
    if control <= 1:
        print("control: the check does not see an MLP wired to the wrong projections")
        failed = True

    if failed:
        return 1
    print("polyshard's ZeRO-3 at 3 ranks computes the gradient of the NumPy Llama")
    return 0


if __name__ == "__main__":
    sys.exit(main())
