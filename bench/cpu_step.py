#!/usr/bin/python3
"""bench/cpu_step: megascale vs PyTorch on the CPU, same model, same
threads, same run.  For each case it trains N steps with each program on
random tokens and reports the median ms/step (first steps dropped as warm-up),
tokens/s, peak RSS and the ratio megascale/PyTorch in tokens/s.
usage: bench/cpu_step.py [--bin build/megascale] [--steps N] [--threads 2]
                         [--cases d12:4:64,d6:8:256]"""
import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PRESETS = {"d6": (6, 384, 6), "d12": (12, 768, 12), "d24": (24, 1024, 16)}


def write_shard(path, n, vocab, seed=1):
    import random
    rnd = random.Random(seed)
    header = [0] * 256
    header[0], header[1], header[2] = 20240520, 1, n
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{n}H", *[rnd.randrange(vocab) for _ in range(n)]))


def measure(cmd, env, parse):
    """Run cmd as a child, return (ms list, peak RSS MB)."""
    import resource
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    pid = os.fork()
    if pid == 0:
        fd = os.open(os.path.join(env["MS_BENCH_DIR"], "child.out"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        fe = os.open(os.path.join(env["MS_BENCH_DIR"], "child.err"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fe, 2)
        os.execvpe(cmd[0], cmd, env)
    _, status, ru = os.wait4(pid, 0)
    out = open(os.path.join(env["MS_BENCH_DIR"], "child.out")).read()
    if status != 0:
        err = open(os.path.join(env["MS_BENCH_DIR"], "child.err")).read()
        sys.exit(f"bench: {cmd[0]} failed (status {status}):\n{err[-3000:]}")
    return parse(out), ru.ru_maxrss / 1024.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "build", "megascale"))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cases", default="d12:4:64,d6:8:256")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        shard = os.path.join(d, "rand.bin")
        write_shard(shard, 1 << 20, 50257)
        env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), MS_BENCH_DIR=d)
        for case in a.cases.split(","):
            model, B, T = case.split(":")
            B, T = int(B), int(T)
            L, C, H = PRESETS[model]
            metrics = os.path.join(d, "m.jsonl")
            ours_cmd = [a.bin, "train", "--model", model, "--train-data", shard, "--batch", str(B),
                        "--seq", str(T), "--steps", str(a.steps), "--threads", str(a.threads),
                        "--data-order", "sequential", "--metrics", metrics, "--log-every", "1000"]

            def parse_ours(_):
                steps = [json.loads(l) for l in open(metrics) if '"loss"' in l]
                return ([s["ms"] for s in steps], [s["mfu"] for s in steps],
                        [s["data_ms"] for s in steps])
            (ours_ms, ours_mfu, ours_data), ours_rss = measure(ours_cmd, env, parse_ours)
            torch_cmd = ["/usr/bin/python3", os.path.join(HERE, "torch_gpt_step.py"), str(L), str(C),
                         str(H), "50257", str(B), str(T), str(a.steps), str(a.threads)]
            torch_ms, torch_rss = measure(torch_cmd, env,
                                          lambda out: [json.loads(l)["ms"] for l in out.splitlines() if l.startswith("{")])
            om = statistics.median(ours_ms[a.warmup:])
            tm = statistics.median(torch_ms[a.warmup:])
            mfu = statistics.median(ours_mfu[a.warmup:])
            wait = 100 * sum(ours_data[a.warmup:]) / sum(ours_ms[a.warmup:])
            rows.append((case, om, B * T / om * 1e3, ours_rss, mfu, wait, tm, B * T / tm * 1e3,
                         torch_rss))
    print(f"\n{'case':<12} {'ours ms':>9} {'ours tok/s':>10} {'ours RSS':>9} {'MFU':>6} "
          f"{'data wait':>9} {'torch ms':>9} {'torch tok/s':>11} {'torch RSS':>9} {'speedup':>8}")
    for case, om, ot, orss, mfu, wait, tm, tt, trss in rows:
        print(f"{case:<12} {om:9.1f} {ot:10.0f} {orss:8.0f}M {100 * mfu:5.1f}% {wait:8.3f}% "
              f"{tm:9.1f} {tt:11.0f} {trss:8.0f}M {ot / tt:7.2f}x")
    print(f"(median of {a.steps - a.warmup} steps after {a.warmup} warm-up steps, "
          f"{a.threads} threads; case = model:B:T; MFU against the probed sgemm peak; "
          f"data wait = time the step waited for its batch / step time)")


if __name__ == "__main__":
    main()
