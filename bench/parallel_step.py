#!/usr/bin/python3
"""bench/parallel_step: tokens/s of one model trained by one process against
the same model under a parallel layout (mpirun; default dp2 with ZeRO-2;
--tp/--pp add tensor and pipeline parallelism), same global batch,
same machine, same run; then each rank's median step split into compute,
exposed communication, data wait and pipeline bubble (from the trainer's
per-rank profile line).
usage: bench/parallel_step.py [--bin build/megascale] [--model d12] [--batch 8]
                              [--seq 64] [--steps 6] [--dp 2] [--tp 1] [--pp 1]"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from cpu_step import PRESETS, write_shard  # noqa: E402


def run(cmd, metrics):
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    if p.returncode != 0:
        sys.exit(f"bench: {' '.join(cmd[:6])} ... failed:\n{p.stderr[-3000:]}")
    steps = [json.loads(l) for l in open(metrics) if '"loss"' in l]
    prof = {}
    for line in p.stderr.splitlines():
        m = re.search(r"\[megascale r(\d+) profile\].*step ([\d.]+) ms \| compute ([\d.-]+) ms \| "
                      r"exposed comm ([\d.]+) ms \| data wait ([\d.]+) ms \| bubble ([\d.]+) ms", line)
        if m:
            prof[int(m.group(1))] = [float(x) for x in m.groups()[1:]]
    return steps, prof


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "build", "megascale"))
    ap.add_argument("--model", default="d12")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=6, help="at least 2: the first is a warm-up")
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    a = ap.parse_args()
    for name in ("batch", "seq", "dp", "tp", "pp"):
        if getattr(a, name) < 1:
            ap.error(f"--{name} {getattr(a, name)}: must be at least 1")
    if a.seq > 1024:
        ap.error(f"--seq {a.seq}: must be at most 1024 (the model presets' seq-max)")
    if a.steps < 2:
        ap.error(f"--steps {a.steps}: must be at least 2 (the median is over the steps after "
                 "the first, a warm-up)")
    if a.batch % a.dp:
        ap.error(f"--batch {a.batch} is not a multiple of --dp {a.dp} (each replica trains "
                 "batch / dp sequences a step)")
    if a.model in PRESETS:
        layers, _, heads = PRESETS[a.model]
        if heads % a.tp:
            ap.error(f"--tp {a.tp} does not divide the {heads} heads of {a.model}")
        if layers % a.pp:
            ap.error(f"--pp {a.pp} does not divide the {layers} layers of {a.model}")
    if a.batch // a.dp * a.seq % a.tp:
        ap.error(f"--tp {a.tp}: a micro-batch of {a.batch // a.dp} x --seq {a.seq} rows is not "
                 "divisible by it (make --seq a multiple of --tp)")
    if not (os.path.isfile(a.bin) and os.access(a.bin, os.X_OK)):
        ap.error(f"--bin {a.bin}: not an executable file (cmake --build build)")
    mpirun = shutil.which("mpirun")
    if not mpirun:
        sys.exit("bench: mpirun not found (apt-get install openmpi-bin)")
    cores = os.cpu_count()
    with tempfile.TemporaryDirectory() as d:
        shard = os.path.join(d, "rand.bin")
        write_shard(shard, 1 << 20, 50257)
        common = ["train", "--model", a.model, "--train-data", shard, "--batch", str(a.batch),
                  "--seq", str(a.seq), "--steps", str(a.steps), "--data-order", "sequential",
                  "--log-every", "1000"]
        m1 = os.path.join(d, "one.jsonl")
        one, p1 = run([a.bin, *common, "--threads", str(cores), "--metrics", m1], m1)
        m2 = os.path.join(d, "dp.jsonl")
        world = a.dp * a.tp * a.pp
        dp, p2 = run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(world), a.bin,
                      *common, "--dp", str(a.dp), "--tp", str(a.tp), "--pp", str(a.pp),
                      "--metrics", m2], m2)
    med = lambda steps: statistics.median(s["tok_s"] for s in steps[1:])
    t1, t2 = med(one), med(dp)
    print(f"\n{a.model}, global batch {a.batch} x {a.seq} tokens, {cores} cores, median of "
          f"{a.steps - 1} steps after 1 warm-up step")
    print(f"{'run':<28} {'tok/s':>9} {'ratio':>7}")
    print(f"{'1 process, ' + str(cores) + ' threads':<28} {t1:9.0f} {1:7.2f}x")
    layout = f"dp{a.dp} tp{a.tp} pp{a.pp}, {max(1, cores // world)} thr/rank"
    print(f"{layout:<28} {t2:9.0f} {t2 / t1:7.2f}x")
    print(f"\n{'rank':<7} {'step ms':>9} {'compute ms':>11} {'exposed comm ms':>16} "
          f"{'data wait ms':>13} {'bubble ms':>10}")
    for label, prof in (("1p", p1), ("par", p2)):
        for r in sorted(prof):
            s, c, x, w, b = prof[r]
            print(f"{label + ' r' + str(r):<7} {s:9.1f} {c:11.1f} {x:16.1f} {w:13.2f} {b:10.1f}")


if __name__ == "__main__":
    main()
