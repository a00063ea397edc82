"""Data parallelism (ZeRO-2) against one process: the same 10-step loss curve
within 1e-5 relative, and the same final weights (1e-5 relative in L2 per
tensor; the attention key bias, whose gradient is exactly zero in exact
arithmetic, is compared only on its q and v parts - see tests/torch/test_gpt.py),
for the serial and the parallel block, AdamW and LAMB, with gradient
accumulation and both data orders.  Then the layout errors, and a rank that
dies: every other rank must stop with an error naming it, within the
communicator's timeout.  Runs under mpirun --oversubscribe.
Environment: MS_BIN."""
import os
import subprocess
import time

from mpi_common import BIN, MPIRUN, compare_weights, finish, losses, mpi, ok, start


def main():
    d, shard = start("ms_dp_")
    C = 64
    base = ["train", "--train-data", shard, "--vocab", "256", "--layers", "2", "--dim", str(C),
            "--heads", "4", "--seq-max", "32", "--seq", "32", "--batch", "8", "--steps", "10",
            "--lr", "3e-3", "--log-every", "100", "--peak-flops", "1e11", "--threads", "1"]
    cases = [["--optimizer", "adamw", "--data-order", "sequential"],
             ["--optimizer", "lamb", "--lr", "2e-2", "--block", "parallel", "--attn-window", "8"],
             ["--optimizer", "adamw", "--micro-batch", "2", "--data-order", "shuffle"]]
    for extra in cases:
        label = " ".join(extra)
        m1, m2 = os.path.join(d, "m1.jsonl"), os.path.join(d, "m2.jsonl")
        w1, w2 = os.path.join(d, "w1.st"), os.path.join(d, "w2.st")
        one = subprocess.run([BIN, *base, *extra, "--metrics", m1, "--save-weights", w1],
                             capture_output=True, text=True)
        two = mpi(2, *base, *extra, "--dp", "2", "--metrics", m2, "--save-weights", w2)
        if one.returncode or two.returncode:
            ok(False, f"{label}: runs succeed", one.stderr + two.stdout + two.stderr)
            continue
        a, b = losses(m1), losses(m2)
        err = max(abs(x - y) / abs(x) for x, y in zip(a, b)) if len(a) == len(b) == 10 else 1
        ok(err <= 1e-5, f"{label}: dp2 loss curve = single process (rel {err:.2e})", f"{a}\n{b}")
        ok(a[-1] < a[0] - 0.5, f"{label}: the loss falls", str(a))
        werr, where = compare_weights(w1, w2, C)
        ok(werr <= 1e-5, f"{label}: dp2 final weights = single process (worst {werr:.2e} {where})")
        ok("ZeRO-2" in two.stderr, f"{label}: rank 0 prints the layout", two.stderr)
        print(f"{label}: loss rel {err:.2e}, weights rel {werr:.2e}")

    # layout errors
    r = mpi(2, *base, "--dp", "3")
    ok(r.returncode != 0 and "2 ranks" in r.stderr and "--dp 3" in r.stderr,
       "world size != tp*pp*dp is named", r.stderr)
    r = mpi(2, *base, "--dp", "2", "--batch", "6", "--micro-batch", "2")
    ok(r.returncode != 0 and "--batch 6" in r.stderr, "batch not divisible by dp x micro-batch",
       r.stderr)

    # a rank that dies: the others stop with an error naming it, within the timeout
    env = dict(os.environ, MS_COMM_TIMEOUT="20")
    t0 = time.time()
    r = subprocess.run([MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "3", BIN, *base,
                        "--dp", "3", "--batch", "6", "--steps", "50",
                        "--inject-fault", "exit@3:1"], capture_output=True, text=True,
                       errors="replace", env=env, timeout=120)
    el = time.time() - t0
    named = [l for l in r.stderr.splitlines() if "error" in l and "rank 1" in l and "r1 " not in l]
    ok(r.returncode != 0 and named and el < 60,
       f"a dead rank is named by the survivors ({el:.1f}s)", r.stderr)
    if named:
        print("survivor says:", named[0][:300])

    finish(d)


if __name__ == "__main__":
    main()
