"""Pipeline parallelism (1F1B and interleaved 1F1B, with the tied wte copy on
the last stage) against one process: the same 10-step loss curve within 1e-5
relative and the same final weights (1e-5 relative in L2 per tensor; the
attention key bias only on its q and v parts, see test_tp.py) for every
layout of {1,2}^3 with pp2 (pp2, pp2 x dp2, pp2 x tp2, pp2 x tp2 x dp2) and
--vpp 2 (pp2, pp2 x dp2), the serial and the parallel block (with a sliding
window), AdamW and LAMB, micro-batches of 1 and 2; --init-from spread over
the stages; validation through the pipeline; the bubble in the profile
line; the redo of a transient NaN gradient on the last stage (bitwise);
then the layout errors.  --eps 1e-6 for the reason given at the top
of test_tp.py.  Runs under mpirun --oversubscribe.  Environment: MS_BIN."""
import json
import os
import subprocess

from mpi_common import BIN, finish, mpi, ok, redo_bitwise, run_against_one, start


def main():
    d, shard = start("ms_pp_")
    C = 64
    base = ["train", "--train-data", shard, "--vocab", "256", "--layers", "4", "--dim", str(C),
            "--heads", "4", "--seq-max", "32", "--seq", "32", "--batch", "8", "--steps", "10",
            "--lr", "3e-3", "--log-every", "100", "--peak-flops", "1e11", "--threads", "1",
            "--eps", "1e-6"]
    w_init = os.path.join(d, "init.st")
    lamb = ["--optimizer", "lamb", "--lr", "2e-2"]
    par = ["--block", "parallel", "--attn-window", "8"]
    # (label, ranks, layout flags, options for both runs)
    cases = [
        ("pp2 serial adamw mb1", 2, ["--pp", "2"], ["--micro-batch", "1"]),
        ("pp2 x dp2 parallel window lamb mb2", 4, ["--pp", "2", "--dp", "2"],
         ["--micro-batch", "2", *lamb, *par]),
        ("pp2 x tp2 serial lamb mb1", 4, ["--pp", "2", "--tp", "2"], ["--micro-batch", "1", *lamb]),
        ("pp2 x tp2 x dp2 parallel window adamw mb1", 8, ["--pp", "2", "--tp", "2", "--dp", "2"],
         ["--micro-batch", "1", *par]),
        ("pp2 vpp2 serial lamb mb1 (+val)", 2, ["--pp", "2", "--vpp", "2"],
         ["--micro-batch", "1", *lamb, "--val-data", shard, "--val-every", "5",
          "--val-batches", "2"]),
        ("pp2 x dp2 vpp2 parallel window adamw mb2", 4, ["--pp", "2", "--dp", "2", "--vpp", "2"],
         ["--micro-batch", "2", *par]),
        ("pp2 init-from", 2, ["--pp", "2"],
         ["--micro-batch", "2", "--init-from", w_init, "--lr", "1e-3"]),
    ]
    for label, n, layout, extra in cases:
        r = run_against_one(d, label, n, layout, base, extra, C, w_keep=w_init)
        if not r:
            continue
        many = r[1]
        m1, m2 = os.path.join(d, "m1.jsonl"), os.path.join(d, "m2.jsonl")
        ok("pipeline: 2 stages" in many.stderr, f"{label}: rank 0 prints the pipeline",
           many.stderr)
        if "--val-data" in extra:
            v1 = [json.loads(l)["val_loss"] for l in open(m1) if "val_loss" in l]
            v2 = [json.loads(l)["val_loss"] for l in open(m2) if "val_loss" in l]
            verr = max(abs(x - y) / abs(x) for x, y in zip(v1, v2)) if v1 and len(v1) == len(v2) else 1
            ok(verr <= 1e-5, f"{label}: validation through the pipeline (rel {verr:.2e})",
               f"{v1}\n{v2}")
        bub = [float(l.split("bubble ")[1].split()[0]) for l in many.stderr.splitlines()
               if "profile]" in l]
        ok(len(bub) == n and max(bub) > 0, f"{label}: the profile reports the bubble", str(bub))

    # a transient NaN gradient on the last stage: every stage redoes the step
    redo_bitwise(d, "pp2", 2, ["--pp", "2"], base, ["--micro-batch", "2"])

    # layout errors, each named
    r = mpi(2, *base, "--pp", "2", "--layers", "3")
    ok(r.returncode != 0 and "3 layers" in r.stderr and "--pp 2" in r.stderr,
       "layers not divisible by pp*vpp", r.stderr)
    r = mpi(2, *base, "--pp", "2", "--vpp", "2", "--layers", "6")
    ok(r.returncode != 0 and "6 layers" in r.stderr and "--vpp 2" in r.stderr,
       "layers not divisible by pp*vpp (vpp)", r.stderr)
    r = mpi(2, *base, "--pp", "2", "--vpp", "2", "--micro-batch", "8")
    ok(r.returncode != 0 and "n_micro=1" in r.stderr and "interleaved" in r.stderr,
       "n_micro invalid for the interleaved schedule", r.stderr)
    ok("fewer micro-batches than stages" not in r.stderr,
       "no 1F1B bubble advice before the interleaved schedule's error", r.stderr)
    r = mpi(2, *base, "--pp", "2", "--batch", "16384", "--micro-batch", "1", "--seq", "1",
            "--steps", "1")
    ok(r.returncode != 0 and "16384 micro-batches" in r.stderr and "--micro-batch" in r.stderr,
       "too many micro-batches for the message tags: the options named", r.stderr)
    r = mpi(2, *base, "--pp", "2", "--dp", "2")
    ok(r.returncode != 0 and "2 ranks" in r.stderr and "--pp 2" in r.stderr,
       "world size != tp*pp*dp is named", r.stderr)
    r = mpi(2, *base, "--pp", "2", "--ckpt-dir", os.path.join(d, "ck"))
    ok(r.returncode == 0 and "committed" in r.stderr,  # resumes: tests/ckpt/test_ckpt_mpi.py
       "checkpoints with pp commit", r.stderr)
    r = subprocess.run([BIN, *base, "--vpp", "2"], capture_output=True, text=True)
    ok(r.returncode != 0 and "--pp >= 2" in r.stderr, "--vpp without --pp", r.stderr)

    finish(d)


if __name__ == "__main__":
    main()
