#!/usr/bin/env python3
"""polyshard-train on token files: makes a nanoGPT file (uint16 ids) and an llm.c file (its
256-int32 header, then the same ids), trains a few steps on each, and checks that the
vocabulary is the one asked for, that a token outside it stops the run with the file, the byte
offset and the value, that --val-data's validation loss comes when asked and is the same on
one process and on three ranks, and that --sample-every draws token ids on the steps asked for,
deterministically.

usage: check_token_files.py PROGRAM WORK_DIR
"""
import json
import math
import struct
import subprocess
import sys


def run(program, *args):
    return subprocess.run([program, *args], capture_output=True, text=True, timeout=300)


def first_loss(metrics):
    with open(metrics) as f:
        return json.loads(f.readline())["loss"]


def main():
    program, work = sys.argv[1], sys.argv[2]
    ids = [(i * 7919 + i // 13) % 300 for i in range(4000)]  # ids up to 299
    nanogpt, llmc = f"{work}/tokens.bin", f"{work}/tokens-llmc.bin"
    with open(nanogpt, "wb") as f:
        f.write(struct.pack(f"<{len(ids)}H", *ids))
    with open(llmc, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(ids), *([0] * 253)))
        f.write(struct.pack(f"<{len(ids)}H", *ids))
    common = ["--steps", "3", "--batch", "4", "--seq", "16", "--layers", "1", "--embd", "32", "--heads", "2"]
    failures = []

    # A vocabulary of 300 fits the ids; the first loss is near ln(300) for a fresh model.
    for path, fmt in ((nanogpt, "auto"), (llmc, "auto"), (llmc, "llmc")):
        metrics = f"{work}/tokens-metrics.jsonl"
        r = run(program, "--data", path, "--data-format", fmt, "--vocab", "300", "--metrics", metrics, *common)
        if r.returncode != 0:
            failures.append(f"{path} ({fmt}): exit {r.returncode}\n{r.stdout}\n{r.stderr}")
        elif abs(first_loss(metrics) - math.log(300)) > 0.3:
            failures.append(f"{path} ({fmt}): first loss {first_loss(metrics)}, not near ln(300)")

    # Without --vocab a token file gets GPT-2's 50257 ids: the first loss is near ln(50257).
    metrics = f"{work}/tokens-metrics-gpt2.jsonl"
    r = run(program, "--data", nanogpt, "--metrics", metrics, *common)
    if r.returncode != 0 or abs(first_loss(metrics) - math.log(50257)) > 0.3:
        failures.append(f"default vocabulary: exit {r.returncode}\n{r.stdout}\n{r.stderr}")

    # The first id of 200 or more, at its byte offset in each file, is outside a vocabulary of 200.
    first_outside = next(i for i, t in enumerate(ids) if t >= 200)
    for path, offset in ((nanogpt, 2 * first_outside), (llmc, 1024 + 2 * first_outside)):
        r = run(program, "--data", path, "--vocab", "200", *common)
        want = f"token {ids[first_outside]} at byte offset {offset} is not below the vocabulary size 200"
        if r.returncode == 0 or path not in r.stderr or want not in r.stderr:
            failures.append(f"{path} with --vocab 200: exit {r.returncode}, expected '{want}' in\n{r.stderr}")

    # --val-data: a validation loss at every second step and at the end, on the same batches
    # whatever the world size and strategy (one process under DDP, three ranks under ZeRO-3).
    val_losses = {}
    for name, extra in (("ddp-1", []), ("zero3-3", ["--strategy", "zero3", "--world-size", "3"])):
        metrics = f"{work}/val-metrics-{name}.jsonl"
        r = run(program, "--data", nanogpt, "--val-data", llmc, "--vocab", "300", "--eval-every", "2",
                "--eval-batches", "3", "--metrics", metrics, *common, *extra)
        if r.returncode != 0:
            failures.append(f"--val-data ({name}): exit {r.returncode}\n{r.stdout}\n{r.stderr}")
            continue
        with open(metrics) as f:
            lines = [json.loads(line) for line in f]
        has = ["val_loss" in line for line in lines]
        if has != [False, True, True]:
            failures.append(f"--val-data ({name}): val_loss on steps {has}, expected on the second and the last")
        else:
            val_losses[name] = [line["val_loss"] for line in lines if "val_loss" in line]
    if len(val_losses) == 2:
        a, b = val_losses["ddp-1"], val_losses["zero3-3"]
        if any(abs(x - y) > 1e-5 * abs(x) for x, y in zip(a, b)):
            failures.append(f"validation losses differ between one process and three ranks: {a} vs {b}")

    # --sample-every: token ids drawn after the second and the last step, under ZeRO-3 on three
    # ranks as on one process, each below the vocabulary, the same again for the same seed.
    samples = {}
    for name, extra in (("ddp-1", []), ("ddp-1-again", []), ("zero3-3", ["--strategy", "zero3", "--world-size", "3"])):
        metrics = f"{work}/sample-metrics-{name}.jsonl"
        r = run(program, "--data", nanogpt, "--val-data", llmc, "--vocab", "300", "--eval-every", "2",
                "--sample-every", "2", "--sample-tokens", "6", "--prompt", "5,7 9", "--top-k", "40",
                "--metrics", metrics, *common, *extra)
        if r.returncode != 0:
            failures.append(f"--sample-every ({name}): exit {r.returncode}\n{r.stdout}\n{r.stderr}")
            continue
        with open(metrics) as f:
            drawn = [json.loads(line).get("sample") for line in f]
        printed = [line for line in r.stdout.splitlines() if "| sample: " in line]
        if [d is not None for d in drawn] != [False, True, True] or len(printed) != 2:
            failures.append(f"--sample-every ({name}): samples {drawn}, printed {printed}; expected two")
        elif any(len(d) != 6 or not all(0 <= t < 300 for t in d) for d in drawn if d is not None):
            failures.append(f"--sample-every ({name}): samples {drawn} are not 6 ids below 300")
        elif printed[0].split("| sample: ")[1] != " ".join(map(str, drawn[1])):
            failures.append(f"--sample-every ({name}): printed '{printed[0]}', sampled {drawn[1]}")
        else:
            samples[name] = drawn
    if len(samples) == 3 and samples["ddp-1"] != samples["ddp-1-again"]:
        failures.append(f"the same seed drew {samples['ddp-1']} and then {samples['ddp-1-again']}")
    r = run(program, "--data", nanogpt, "--vocab", "300", "--sample-every", "1", "--prompt", "5,x", *common)
    if r.returncode == 0 or "--prompt '5,x': 'x' is not a token id below the vocabulary size 300" not in r.stderr:
        failures.append(f"--prompt 5,x: exit {r.returncode}, stderr {r.stderr}")

    if failures:
        print("\n".join(failures))
        return 1
    print("token files: nanoGPT and llm.c files train with the vocabulary asked for, ids outside it are errors, "
          "the validation loss is the same on one process and on three ranks, and samples come as asked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
