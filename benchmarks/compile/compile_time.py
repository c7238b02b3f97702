#!/usr/bin/env python3
"""What polyshard costs to compile, as a table and JSON.

1. A researcher's translation unit: one_engine.cpp (one strategy's engine over Gpt<float>, with a
   forward, a backward and a step), compiled as a user would (no precompiled header, no ccache)
   with the release flags, the same with the precompiled CPU kernels opted in (the unit alone:
   the kernel library is compiled once, see docs/building.md), the sanitizer stage's flags, and
   the front end alone; the median of --repeat runs, wall seconds and the compiler's peak memory.
2. With --build DIR (a configured and built tree, e.g. build/release): the compile time of that
   build from its .ninja_log, summed over its translation units and as CPU time (ninja runs more
   jobs than there are cores: at each instant the running jobs share the cores, so the CPU time
   is the busy time weighted by min(jobs, cores), where the sum counts each job's whole wall
   time), and its --top slowest translation units compiled again (their commands from
   compile_commands.json, without the launcher) for their peak memory.

Usage: benchmarks/compile/compile_time.py [--build build/release] [--top 3] [--repeat 3]
                                          [--json compile_time.json]
"""
import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def eigen_include():
    try:
        flags = subprocess.run(["pkg-config", "--cflags-only-I", "eigen3"], capture_output=True, text=True,
                               check=True).stdout.split()
        return [f for f in flags if f.startswith("-I")] or ["-I/usr/include/eigen3"]
    except (OSError, subprocess.CalledProcessError):
        return ["-I/usr/include/eigen3"]


def timed(cmd, cwd=None):
    """Runs a compiler command; returns (wall seconds, peak resident MiB of its children)."""
    # getrusage(RUSAGE_CHILDREN) keeps the largest child seen so far: run each command in a
    # fresh interpreter so that every figure is its own.
    probe = ("import resource,subprocess,sys,time,json;t=time.perf_counter();"
             "r=subprocess.run(sys.argv[1:],stdout=subprocess.DEVNULL,stderr=subprocess.PIPE,text=True);"
             "w=time.perf_counter()-t;"
             "print(json.dumps([r.returncode,w,resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,r.stderr[-2000:]]))")
    out = subprocess.run([sys.executable, "-c", probe] + cmd, capture_output=True, text=True, cwd=cwd)
    rc, wall, maxrss_kb, err = json.loads(out.stdout)
    if rc != 0:
        sys.exit(f"compile_time: the command failed ({rc}):\n{' '.join(cmd)}\n{err}")
    return wall, maxrss_kb / 1024.0


def researcher_tu(cxx, repeat):
    source = os.path.join(ROOT, "benchmarks", "compile", "one_engine.cpp")
    base = [cxx, "-std=c++20", "-I", os.path.join(ROOT, "include")] + eigen_include() + ["-DNDEBUG"]
    obj = os.path.join(tempfile.mkdtemp(), "one_engine.o")
    variants = [
        ("release: -O3 -march=native", ["-O3", "-march=native", "-fno-math-errno", "-c", source, "-o", obj]),
        ("release, precompiled kernels (opt-in)",
         ["-O3", "-march=native", "-fno-math-errno", "-DPOLYSHARD_PRECOMPILED", "-c", source, "-o", obj]),
        ("sanitizers: -O1 -g1 ASan+UBSan", ["-O1", "-g1", "-fsanitize=address,undefined", "-c", source, "-o", obj]),
        ("front end only: -fsyntax-only", ["-fsyntax-only", source]),
    ]
    rows = []
    for name, flags in variants:
        runs = [timed(base + flags) for _ in range(repeat)]
        rows.append({"translation unit": "one_engine.cpp: Engine<ZeRO<3>, Gpt<float>, ThreadCommunicator, AdamW<float>>",
                     "flags": name, "seconds": statistics.median(r[0] for r in runs),
                     "peak MiB": max(r[1] for r in runs), "runs": repeat})
    return rows


def build_figures(build, top):
    log = os.path.join(build, ".ninja_log")
    if not os.path.exists(log):
        sys.exit(f"compile_time: {log} not found: build the tree first (cmake --build {build})")
    # Each ninja run counts its times from its own start, and ninja rewrites the log out of order
    # when it compacts it; the third field, the output's modification time in nanoseconds, puts
    # every job of every run on one clock (it is the job's end). The last build of each output
    # counts.
    spans = {}
    with open(log) as f:
        for line in f:
            if line.startswith("#"):
                continue
            start, end, mtime, output, _ = line.rstrip("\n").split("\t")
            seconds = (int(end) - int(start)) / 1000.0
            spans[output] = (int(mtime) / 1e9 - seconds, int(mtime) / 1e9)
    compile_spans = {o: span for o, span in spans.items() if o.endswith(".o") or o.endswith(".gch")}
    compiles = {o: end - start for o, (start, end) in compile_spans.items()}
    total = sum(compiles.values())
    cpu = cpu_seconds(compile_spans.values(), os.cpu_count() or 1)
    commands = {}
    db = os.path.join(build, "compile_commands.json")
    if os.path.exists(db):
        for entry in json.load(open(db)):
            args = shlex.split(entry["command"])
            if "-o" in args:
                commands[os.path.normpath(args[args.index("-o") + 1])] = (entry["directory"], args)
    slowest = []
    for output, seconds in sorted(compiles.items(), key=lambda kv: -kv[1])[:top]:
        row = {"translation unit": output, "build seconds": seconds}
        found = commands.get(os.path.normpath(output))
        if found:
            directory, args = found
            # Drop the launcher (cmake -E env ... ccache): the compiler runs on its own.
            while args and not os.path.basename(args[0]).startswith(("g++", "c++", "clang++", "nvcc")):
                args = args[1:]
            args = [a if a != output else os.path.join(tempfile.mkdtemp(), "tu.o") for a in args]
            seconds_alone, mib = timed(args, cwd=directory)
            row.update({"seconds alone": seconds_alone, "peak MiB": mib})
        slowest.append(row)
    return {"build": build, "translation units": len(compiles), "total compile seconds": total,
            "compile CPU seconds": cpu, "slowest": slowest}


def cpu_seconds(spans, cores):
    """CPU time of jobs that ran over `spans` (start, end) on `cores` cores, each busy interval
    weighted by min(running jobs, cores): what the compilers had of the machine."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    running, last, cpu = 0, 0.0, 0.0
    for t, step in events:
        cpu += (t - last) * min(running, cores)
        running, last = running + step, t
    return cpu


def print_table(title, rows, columns):
    print(f"\n{title}")
    widths = [max([len(c)] + [len(fmt(r.get(c))) for r in rows]) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(fmt(r.get(c)).ljust(w) for c, w in zip(columns, widths)))


def fmt(v):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.1f}"
    return str(v)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", help="a built tree whose .ninja_log and compile_commands.json to read")
    p.add_argument("--top", type=int, default=3)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--cxx", default=os.environ.get("CXX", "g++"))
    p.add_argument("--json", default="compile_time.json")
    p.add_argument("--skip-tu", action="store_true", help="only the --build figures")
    a = p.parse_args()
    result = {"cpus": os.cpu_count(), "compiler": subprocess.run([a.cxx, "--version"], capture_output=True,
                                                                 text=True).stdout.splitlines()[0]}
    print(f"compiler: {result['compiler']}; {result['cpus']} CPUs; each figure the median of {a.repeat} runs")
    if not a.skip_tu:
        result["researcher"] = researcher_tu(a.cxx, a.repeat)
        print_table("A researcher's translation unit (no precompiled header, no cache)", result["researcher"],
                    ["flags", "seconds", "peak MiB"])
    if a.build:
        b = build_figures(a.build, a.top)
        result["build"] = b
        print(f"\nBuild {b['build']}: {b['translation units']} translation units, "
              f"{b['total compile seconds']:.0f} s of compiling summed over them (.ninja_log), "
              f"{b['compile CPU seconds']:.0f} CPU seconds on {os.cpu_count()} cores")
        print_table(f"The {a.top} slowest translation units", b["slowest"],
                    ["translation unit", "build seconds", "seconds alone", "peak MiB"])
    with open(a.json, "w") as f:
        json.dump(result, f, indent=1)
    print(f"\nJSON: {a.json}")


if __name__ == "__main__":
    main()
