#!/usr/bin/python3
"""bench/pp_overlap: the pipeline's exposed communication with --overlap all
against --overlap none (pp off), run back to back (--repeat times,
alternating) on the same machine, and its measured bubble against the
schedule's (p-1)/(v*m).  From the per-rank event logs (src/trace), per
stage, the median over steps (the first --skip left out) of: the step,
pp_wait (blocked on the pp and embedding groups: the metrics' pp_wait_ms),
bubble (blocked on pipeline receives: bubble_ms), embedding (the tied wte
sum's share of pp_wait) and compute (the step's FWD + BWD spans).  The
measured bubble is the simulator's definition (schedule.h) on real times:
(makespan - busy) / busy, makespan from the first FWD to the last BWD over
all stages, busy the busiest stage's compute.
usage: bench/pp_overlap.py [--bin build/megascale] [--pp 2] [--vpp 1]
         [--layers 4] [--dim 256] [--heads 4] [--vocab 50257] [--seq 64]
         [--batch 8] [--micro-batch 1] [--steps 8] [--skip 2] [--repeat 1]
         [--threads 1]"""
import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from cpu_step import write_shard  # noqa: E402


def step_stats(trace_dir, skip):
    """{step: {rank: dict(stage, step, pp_wait, bubble, emb, busy, fb)}} in ms."""
    out = {}
    for f in sorted(glob.glob(os.path.join(trace_dir, "events_r*.jsonl"))):
        ev = [json.loads(l) for l in open(f)]
        rank, stage = ev[0]["rank"], ev[0]["coord"]["pp"]
        spans = [e for e in ev if e.get("type") == "span" and e.get("lane") == "compute"]
        windows = {e["step"]: (e["t0"], e["t1"]) for e in spans if e["name"] == "step"}
        for k, (t0, t1) in windows.items():
            if k <= skip:
                continue
            r = dict(stage=stage, step=(t1 - t0) / 1e6, pp_wait=0.0, bubble=0.0, emb=0.0, fb=[])
            for e in spans:
                if e["name"] in ("fwd", "bwd") and e.get("step") == k:
                    r["fb"].append((e["t0"], e["t1"]))
                if e["name"] == "wait" and t0 <= e["t0"] <= t1:
                    ms = (e["t1"] - e["t0"]) / 1e6
                    if e.get("group") in ("pp", "embedding"):
                        r["pp_wait"] += ms
                    if e.get("group") == "embedding":
                        r["emb"] += ms
                    if e.get("group") == "pp" and e.get("op") == "recv":
                        r["bubble"] += ms
            r["busy"] = sum(b - a for a, b in r["fb"]) / 1e6
            out.setdefault(k, {})[rank] = r
    return out


def bubble_fracs(steps):
    """The measured bubble of each complete step (a {rank: stats} of
    step_stats): (makespan - busy) / busy, the makespan from the first FWD
    to the last BWD over all ranks (one host: one monotonic clock), busy the
    busiest rank's compute."""
    fracs = []
    for s in steps:
        t0 = min(a for x in s.values() for a, _ in x["fb"])
        t1 = max(b for x in s.values() for _, b in x["fb"])
        busy = max(x["busy"] for x in s.values())
        fracs.append(((t1 - t0) / 1e6 - busy) / busy)
    return fracs


def report(label, stats, want):
    ranks = sorted({r for s in stats.values() for r in s})
    steps = [s for s in stats.values() if len(s) == len(ranks) and all(x["fb"] for x in s.values())]
    if not steps:
        sys.exit(f"bench: {label}: no complete step in the event logs")
    fracs = bubble_fracs(steps)
    print(f"--overlap {label} ({len(steps)} steps)")
    for r in ranks:
        med = {k: statistics.median(s[r][k] for s in steps)
               for k in ("step", "pp_wait", "bubble", "emb", "busy")}
        print(f"  rank {r} stage {steps[0][r]['stage']}: step {med['step']:.1f} ms | pp_wait "
              f"{med['pp_wait']:.1f} ms | bubble {med['bubble']:.1f} ms | embedding {med['emb']:.1f}"
              f" ms | compute {med['busy']:.1f} ms")
    f = statistics.median(fracs)
    print(f"  measured bubble {f:.4f}, schedule (p-1)/(v*m) {want:.4f} (ratio {f / want:.2f})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "build", "megascale"))
    for name, default in (("pp", 2), ("vpp", 1), ("layers", 4), ("dim", 256), ("heads", 4),
                          ("vocab", 50257), ("seq", 64), ("batch", 8), ("micro-batch", 1),
                          ("steps", 8), ("skip", 2), ("repeat", 1), ("threads", 1)):
        ap.add_argument("--" + name, type=int, default=default)
    a = ap.parse_args()
    mpirun = shutil.which("mpirun")
    if not mpirun:
        sys.exit("bench: mpirun not found (apt-get install openmpi-bin)")
    d = tempfile.mkdtemp(prefix="ms_pp_overlap_")
    shard = os.path.join(d, "t.bin")
    write_shard(shard, 200000, a.vocab)
    args = ["train", "--train-data", shard, "--vocab", str(a.vocab), "--layers", str(a.layers),
            "--dim", str(a.dim), "--heads", str(a.heads), "--seq-max", str(a.seq), "--seq",
            str(a.seq), "--batch", str(a.batch), "--micro-batch", str(a.micro_batch), "--steps",
            str(a.steps), "--pp", str(a.pp), "--vpp", str(a.vpp), "--threads", str(a.threads),
            "--lr", "1e-3", "--log-every", "100"]
    m = a.batch // a.micro_batch
    want = (a.pp - 1) / (a.vpp * m)
    print(f"pp {a.pp} vpp {a.vpp}, {m} micro-batches, model L{a.layers} C{a.dim} V{a.vocab} "
          f"T{a.seq}, --threads {a.threads}")
    for i in range(a.repeat):
        for mode in ("all", "none"):
            out = os.path.join(d, f"{mode}{i}")
            os.makedirs(out)
            cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(a.pp), a.bin, *args,
                   "--overlap", mode, "--metrics", os.path.join(out, "m.jsonl")]
            p = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
            if p.returncode:
                sys.exit(f"bench: --overlap {mode} failed:\n{p.stderr[-3000:]}")
            report(mode, step_stats(os.path.join(out, "trace"), a.skip), want)
    shutil.rmtree(d)


if __name__ == "__main__":
    main()
