"""Data parallelism (ZeRO-2) against one process: the same 10-step loss curve
within 1e-5 relative, and the same final weights (1e-5 relative in L2 per
tensor; the attention key bias, whose gradient is exactly zero in exact
arithmetic, is compared only on its q and v parts - see tests/torch/test_gpt.py),
for the serial and the parallel block, AdamW and LAMB, with gradient
accumulation and both data orders (sequential with accumulation on a shard
that the run wraps around: the step's batch moves to the next shard whole,
whatever the split into ranks and micro-batches); a transient NaN gradient on one rank redone
by all, bitwise; a fault targeted at a node (--node-map) firing there only.
Then the layout errors, and a rank that
dies: every other rank must stop with an error naming it, within the
communicator's timeout.  Runs under mpirun --oversubscribe.
Environment: MS_BIN."""
import os
import struct
import time

from mpi_common import finish, mpi, ok, redo_bitwise, run_against_one, start


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
        label = "dp2 " + " ".join(extra)
        r = run_against_one(d, label, 2, ["--dp", "2"], base, extra, C)
        if r:
            ok("ZeRO-2" in r[1].stderr, f"{label}: rank 0 prints the layout", r[1].stderr)

    # sequential order with accumulation on a shard of 5 steps and 100 tokens:
    # step 6 wraps to its start whole, on one process as on dp2 (a per-micro-
    # batch decision read tokens 1280..1376 on one process, 1280..1344 on dp2)
    short = os.path.join(d, "short.bin")
    toks = open(shard, "rb").read()[1024:1024 + 2 * (5 * 256 + 100)]
    header = [0] * 256
    header[0], header[1], header[2] = 20240520, 1, len(toks) // 2
    open(short, "wb").write(struct.pack("<256i", *header) + toks)
    run_against_one(d, "dp2 sequential micro-batch 1, wrapping", 2, ["--dp", "2"],
                    [*base, "--train-data", short],
                    ["--data-order", "sequential", "--micro-batch", "1"], C)

    # a transient NaN gradient on one rank: every rank redoes the step, bitwise
    redo_bitwise(d, "dp2", 2, ["--dp", "2"], base)

    # a node-targeted fault fires only on its node: rank 1 is node b
    env = dict(os.environ, MS_COMM_TIMEOUT="20")
    r = mpi(2, *base, "--dp", "2", "--steps", "4", "--node-map", "a,b", "--inject-fault",
            "exit@2:node=b", env=env, timeout=120, survive=True)
    ok("step 2: injected fault: rank 1 exits" in r.stderr and "rank 0 exits" not in r.stderr,
       "exit@2:node=b with --node-map a,b: rank 1 exits, rank 0 does not", r.stderr)
    r = mpi(2, *base, "--dp", "2", "--steps", "2", "--inject-fault", "exit@2:node=c",
            env=dict(os.environ, MS_NODE_MAP="a,b"))
    ok(r.returncode == 0, "a fault on a node of no rank never fires (MS_NODE_MAP)", r.stderr)

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
    r = mpi(3, *base, "--dp", "3", "--batch", "6", "--steps", "50", "--inject-fault", "exit@3:1",
            env=env, timeout=120, survive=True)
    el = time.time() - t0
    named = [l for l in r.stderr.splitlines() if "error" in l and "rank 1" in l and "r1 " not in l]
    # with --enable-recovery mpirun itself exits 0; each survivor's own exit
    # is its "megascale train: error (rank R of N on HOST):" line (it then exits 5:
    # communication)
    ok(named and el < 60 and r.stderr.count("megascale train: error (rank ") >= 2,
       f"a dead rank is named by the survivors ({el:.1f}s)", r.stderr)
    if named:
        print("survivor says:", named[0][:300])

    finish(d)


if __name__ == "__main__":
    main()
