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

Next to it, the bubble of the same schedule replayed with the step's own
measured FWD and BWD times and free messages (replay_fracs): each stage
runs its ops in the order it ran them, an op starting when the stage's
previous op and its input (the FWD of the previous virtual stage, the BWD
of the next one) are done.  The (p-1)/(v*m) formula holds for stages of
equal speed; on shared cores one stage often computes slower than the
other, and the replay gives what the schedule alone makes of that.  The
measured bubble minus the replayed one is what the messages and the
waking of threads added.
usage: bench/pp_overlap.py [--bin build/megascale] [--pp 2] [--vpp 1]
         [--layers 4] [--dim 256] [--heads 4] [--vocab 50257] [--seq 64]
         [--batch 8] [--micro-batch 1] [--steps 8] [--skip 2] [--repeat 1]
         [--threads 1]"""
import argparse
import atexit
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
        rank, coord = ev[0]["rank"], ev[0]["coord"]
        stage, pp = coord["pp"], ev[0]["shape"]["pp"]
        spans = [e for e in ev if e.get("type") == "span" and e.get("lane") == "compute"]
        windows = {e["step"]: (e["t0"], e["t1"]) for e in spans if e["name"] == "step"}
        for k, (t0, t1) in windows.items():
            if k <= skip:
                continue
            r = dict(stage=stage, pp=pp, pipe=(coord.get("dp", 0), coord.get("tp", 0)),
                     step=(t1 - t0) / 1e6, pp_wait=0.0, bubble=0.0, emb=0.0, fb=[], ops=[])
            for e in spans:
                if e["name"] in ("fwd", "bwd") and e.get("step") == k:
                    r["fb"].append((e["t0"], e["t1"]))
                    r["ops"].append((e["t0"], e["t1"], e["name"], e.get("mb", 0), e.get("chunk", 0)))
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


def replay(ranks):
    """The makespan (ns) of one pipeline's step replayed with its measured
    op times and free messages.  ranks: the stats of one pipeline's ranks,
    one per stage.  Virtual stage v = chunk * pp + stage (the interleaved
    schedule's layout); FWD(mb, v) needs FWD(mb, v - 1), BWD(mb, v) needs
    BWD(mb, v + 1).  None when the ops cannot be replayed in their order (a
    trace with ops missing)."""
    pp = ranks[0]["pp"]
    lists = {x["stage"]: sorted(x["ops"]) for x in ranks}
    nv = pp * (1 + max(c for ops in lists.values() for *_, c in ops))
    done, free, pos = {}, {s: 0.0 for s in lists}, {s: 0 for s in lists}
    left = sum(len(o) for o in lists.values())
    while left:
        moved = False
        for s, ops in lists.items():
            while pos[s] < len(ops):
                t0, t1, name, mb, c = ops[pos[s]]
                v = c * pp + s
                dep = (name, mb, v - 1) if name == "fwd" else (name, mb, v + 1)
                if not (0 <= dep[2] < nv):
                    dep = None
                if dep is not None and dep not in done:
                    break
                start = max(free[s], done[dep] if dep is not None else 0.0)
                free[s] = done[(name, mb, v)] = start + (t1 - t0)
                pos[s] += 1
                left -= 1
                moved = True
        if not moved:
            return None
    return max(free.values())


def replay_fracs(steps):
    """For each complete step (as bubble_fracs takes them), the bubble of
    the schedule replayed with the step's own op times and free messages
    (replay): (longest pipeline's replayed makespan - busy) / busy, busy
    the busiest rank's compute, as in bubble_fracs.  Steps that cannot be
    replayed are left out."""
    fracs = []
    for s in steps:
        pipes = {}
        for x in s.values():
            pipes.setdefault(x["pipe"], []).append(x)
        spans = [replay(p) for p in pipes.values()]
        if any(m is None for m in spans):
            continue
        busy = max(x["busy"] for x in s.values())
        fracs.append((max(spans) / 1e6 - busy) / busy)
    return fracs


def complete_steps(stats):
    """The steps of step_stats that every rank traced, each with its FWDs
    and BWDs (what bubble_fracs and replay_fracs take)."""
    ranks = {r for s in stats.values() for r in s}
    return [s for s in stats.values() if len(s) == len(ranks) and all(x["fb"] for x in s.values())]


def report(label, stats, want):
    ranks = sorted({r for s in stats.values() for r in s})
    steps = complete_steps(stats)
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
    rf = replay_fracs(steps)
    if rf:
        g = statistics.median(rf)
        print(f"  the schedule replayed with these compute times and free messages: {g:.4f} "
              f"(ratio {g / want:.2f}); the messages added {f - g:+.4f} "
              f"({(f - g) / want:+.2f} of the formula)")


def check(ap, a):
    """The options' values against each other, before anything runs; a bad
    one is a usage error."""
    for name in ("vpp", "layers", "dim", "heads", "seq", "batch", "micro_batch", "steps",
                 "repeat"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} {getattr(a, name)}: must be at least 1")
    if a.pp < 2:
        ap.error(f"--pp {a.pp}: must be at least 2 (the bench measures a pipeline)")
    for name in ("skip", "threads"):  # --threads 0: the trainer's all cores
        if getattr(a, name) < 0:
            ap.error(f"--{name} {getattr(a, name)}: must be at least 0")
    if a.steps <= a.skip:
        ap.error(f"--steps {a.steps}: must be more than --skip {a.skip} (the medians are over "
                 "the steps after the first --skip)")
    if not 2 <= a.vocab <= 65536:
        ap.error(f"--vocab {a.vocab}: must be in 2..65536 (the shard's tokens are 16-bit)")
    if a.dim % a.heads:
        ap.error(f"--dim {a.dim} is not divisible by --heads {a.heads}")
    if a.layers % (a.pp * a.vpp):
        ap.error(f"--layers {a.layers} is not a multiple of --pp {a.pp} x --vpp {a.vpp} (each "
                 "stage's chunks hold whole blocks)")
    if a.batch % a.micro_batch:
        ap.error(f"--batch {a.batch} is not a multiple of --micro-batch {a.micro_batch}")
    if a.vpp > 1 and (a.batch // a.micro_batch) % a.pp:
        ap.error(f"--vpp {a.vpp}: the interleaved schedule needs the micro-batches a step "
                 f"(--batch / --micro-batch = {a.batch // a.micro_batch}) to be a multiple of "
                 f"--pp {a.pp}")
    if not (os.path.isfile(a.bin) and os.access(a.bin, os.X_OK)):
        ap.error(f"--bin {a.bin}: not an executable file (cmake --build build)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "build", "megascale"))
    for name, default in (("pp", 2), ("vpp", 1), ("layers", 4), ("dim", 256), ("heads", 4),
                          ("vocab", 50257), ("seq", 64), ("batch", 8), ("micro-batch", 1),
                          ("steps", 8), ("skip", 2), ("repeat", 1), ("threads", 1)):
        ap.add_argument("--" + name, type=int, default=default)
    a = ap.parse_args()
    check(ap, a)
    mpirun = shutil.which("mpirun")
    if not mpirun:
        sys.exit("bench: mpirun not found (apt-get install openmpi-bin)")
    d = tempfile.mkdtemp(prefix="ms_pp_overlap_")
    atexit.register(shutil.rmtree, d, True)  # also when a run fails (sys.exit)
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
