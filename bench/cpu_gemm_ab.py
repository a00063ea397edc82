#!/usr/bin/python3
"""bench/cpu_gemm_ab: the CPU backend's fp32 GEMMs compared in the trainer.
For each case it trains with each MS_CPU_GEMM value in turn (openblas,
auto, ... one run each, then again, --pairs rounds: alternating, so that
the machine's load falls on every value alike) and prints each run's
median ms/step (first steps dropped as warm-up), each value's median over
the rounds, and each value's time over the first value's, round by round
and their median.  The peers are the same binary with another GEMM, so
the ratio says what the GEMM alone is worth to the step; bench_cpu_gemm
(build/tests) times the GEMMs themselves, shape by shape.

What each value runs is read from `megascale --version` under it ("fp32
GEMMs: own AVX2 kernel ..."); a value this CPU cannot run stops the bench
with megascale's reason.  To see an AVX2 machine's figures on an AVX-512
one: --gemm openblas,own-avx2 with MS_BLAS_CORE=keep
OPENBLAS_CORETYPE=Haswell in the environment (docs/perf.md, "The own GEMM
on AVX2 CPUs").

usage: bench/cpu_gemm_ab.py [--bin build/megascale] [--cases d12:4:64,d6:8:256]
                            [--gemm openblas,auto] [--pairs 3] [--steps 7]
                            [--warmup 2] [--threads 2]"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from cpu_step import PRESETS, isa_line, measure, write_shard  # noqa: E402


def gemm_name(binary, value):
    """What MS_CPU_GEMM=value runs, from --version; exits with megascale's
    reason where it cannot run here."""
    r = subprocess.run([binary, "--version"], capture_output=True, text=True,
                       env=dict(os.environ, MS_CPU_GEMM=value))
    part = next((p for p in r.stdout.strip().split("; ") if p.startswith("fp32 GEMMs")), None)
    if r.returncode != 0 or part is None:
        sys.exit(f"cpu_gemm_ab: MS_CPU_GEMM={value}: {(r.stderr or r.stdout).strip()[-400:]}")
    name = part[len("fp32 GEMMs: "):]
    if not name.startswith(("own ", "OpenBLAS")):  # the reason it cannot run
        sys.exit(f"cpu_gemm_ab: {name}")
    return name


def parse_cases(ap, text):
    """--cases as [(case, model, B, T)], each case MODEL:B:T (B and T as
    strings); a bad case is a usage error."""
    out = []
    for case in text.split(","):
        parts = case.split(":")
        if len(parts) != 3:
            ap.error(f"--cases: case '{case}' is not MODEL:B:T (for example d12:4:64)")
        model, B, T = parts
        if model not in PRESETS:
            ap.error(f"--cases: case {case}: model {model} is not one of {', '.join(PRESETS)}")
        if not re.fullmatch(r"[0-9]+", B) or int(B) < 1:
            ap.error(f"--cases: case {case}: B {B} is not a positive integer")
        if not re.fullmatch(r"[0-9]+", T) or not 1 <= int(T) <= 1024:
            ap.error(f"--cases: case {case}: T {T} is not in 1..1024 (the models' seq-max)")
        out.append((case, model, str(int(B)), str(int(T))))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "build", "megascale"))
    ap.add_argument("--cases", default="d12:4:64,d6:8:256",
                    help=f"MODEL:B:T, comma-separated; MODEL one of {', '.join(PRESETS)}, "
                    "T at most 1024")
    ap.add_argument("--gemm", default="openblas,auto",
                    help="MS_CPU_GEMM values, comma-separated; the first is the baseline")
    ap.add_argument("--pairs", type=int, default=3, help="rounds of one run per value")
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2,
                    help="first steps of each run left out of its median (0 <= W < --steps)")
    ap.add_argument("--threads", type=int, default=2, help="at least 1")
    a = ap.parse_args()
    values = a.gemm.split(",")
    if len(values) < 2 or "" in values or len(set(values)) < len(values):
        ap.error(f"--gemm {a.gemm}: needs two different values or more, comma-separated")
    if a.pairs < 1:
        ap.error(f"--pairs {a.pairs}: must be at least 1")
    if a.warmup < 0 or a.steps <= a.warmup:
        ap.error(f"--steps {a.steps} --warmup {a.warmup}: need 0 <= --warmup < --steps (the "
                 "median is over the steps after the warm-up)")
    if a.threads < 1:
        ap.error(f"--threads {a.threads}: must be at least 1 (OMP_NUM_THREADS and the "
                 "trainer's --threads)")
    cases = parse_cases(ap, a.cases)
    if not (os.path.isfile(a.bin) and os.access(a.bin, os.X_OK)):
        ap.error(f"--bin {a.bin}: not an executable file (cmake --build build)")
    names = {v: gemm_name(a.bin, v) for v in values}
    print("machine:", isa_line(a.bin)[0])
    print("fp32 GEMMs: " + ", ".join(f"{v} = {names[v]}" for v in values))
    print(f"(median ms/step of steps {a.warmup + 1}-{a.steps} a run, {a.threads} threads; "
          f"the values alternate, {a.pairs} rounds)")
    with tempfile.TemporaryDirectory() as d:
        shard = os.path.join(d, "rand.bin")
        write_shard(shard, 1 << 20, 50257)
        metrics = os.path.join(d, "m.jsonl")

        def parse(_):
            return [json.loads(l)["ms"] for l in open(metrics) if '"loss"' in l]
        for case, model, B, T in cases:
            runs = {v: [] for v in values}
            for _ in range(a.pairs):
                for v in values:
                    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), MS_BENCH_DIR=d,
                               MS_CPU_GEMM=v)
                    cmd = [a.bin, "train", "--model", model, "--train-data", shard, "--batch", B,
                           "--seq", T, "--steps", str(a.steps), "--threads", str(a.threads),
                           "--data-order", "sequential", "--metrics", metrics, "--log-every",
                           "1000", "--cpu-dtype", "fp32"]
                    ms, _ = measure(cmd, env, parse)
                    runs[v].append(statistics.median(ms[a.warmup:]))
            base = runs[values[0]]
            for v in values:
                print(f"{case:<10} {v:<12} " + " ".join(f"{x:8.1f}" for x in runs[v])
                      + f"   median {statistics.median(runs[v]):8.1f} ms")
            for v in values[1:]:
                r = [x / y for x, y in zip(runs[v], base)]
                m = statistics.median(r)
                print(f"{case:<10} {v} / {values[0]}: " + " ".join(f"{x:.3f}" for x in r)
                      + f" -> median {m:.3f} ({abs(1 - m) * 100:.1f}% "
                      + ("faster" if m < 1 else "slower") + ")")


if __name__ == "__main__":
    main()
