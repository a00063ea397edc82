"""Data parallelism (ZeRO-2) against one process: the same 10-step loss curve
within 1e-5 relative, and the same final weights (1e-5 relative in L2 per
tensor; the attention key bias, whose gradient is exactly zero in exact
arithmetic, is compared only on its q and v parts - see tests/torch/test_gpt.py),
for the serial and the parallel block, AdamW and LAMB, with gradient
accumulation and both data orders.  Then the layout errors, and a rank that
dies: every other rank must stop with an error naming it, within the
communicator's timeout.  Runs under mpirun --oversubscribe.
Environment: MS_BIN."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "torch"))
import gpt_ref  # noqa: E402

BIN = os.environ["MS_BIN"]
MPIRUN = shutil.which("mpirun")
passed = failed = 0


def ok(cond, what, detail=""):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print(f"FAIL: {what}\n{detail[-3000:]}")


def mpi(n, *args, timeout=300):
    cmd = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", str(n), BIN, *args]
    return subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout)


def losses(path):
    return [json.loads(l)["loss"] for l in open(path) if '"loss"' in l]


def compare_weights(a, b, C):
    x, _ = gpt_ref.read_safetensors(a)
    y, _ = gpt_ref.read_safetensors(b)
    worst, where = 0.0, ""
    for k in x:
        u, v = x[k], y[k]
        if k.endswith("attn.c_attn.bias"):
            keep = np.r_[0:C, 2 * C:3 * C]
            u, v = u[keep], v[keep]
        e = np.linalg.norm(u - v) / max(np.linalg.norm(u), 1e-30)
        if e > worst:
            worst, where = e, k
    return worst, where


def main():
    if not MPIRUN:
        print("SKIP: mpirun not found (apt-get install openmpi-bin)")
        sys.exit(77)
    d = tempfile.mkdtemp(prefix="ms_dp_")
    shard = os.path.join(d, "t.bin")
    text = ("In the beginning God created the heaven and the earth. And the earth was without "
            "form, and void; and darkness was upon the face of the deep. " * 300).encode()
    header = [0] * 256
    header[0], header[1], header[2] = 20240520, 1, len(text)
    open(shard, "wb").write(struct.pack("<256i", *header) + struct.pack(f"<{len(text)}H", *text))
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

    print(f"{passed} passed, {failed} failed")
    if not failed:
        shutil.rmtree(d)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
