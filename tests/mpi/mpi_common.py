"""Shared by the multi-rank trainer tests (test_dp.py, test_tp.py, test_val.py,
test_pp.py, test_ranks.py): check counting, running the binary under mpirun
(one program, or several: MPMD), reading metrics, comparing weights files
with one process, a small text shard, and the files of Open MPI a job
leaves (its ranks' shared-memory segments, mpirun's session directory).
Environment: MS_BIN (the megascale binary)."""
import glob
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "torch"))
import gpt_ref  # noqa: E402

BIN = os.environ["MS_BIN"]
MPIRUN = shutil.which("mpirun")
counts = {"passed": 0, "failed": 0}


def ok(cond, what, detail=""):
    """Count one check; on failure print it with the tail of detail."""
    if cond:
        counts["passed"] += 1
    else:
        counts["failed"] += 1
        print(f"FAIL: {what}\n{detail[-3000:]}")


def mpi(n, *args, timeout=300, env=None, survive=False):
    """Run `megascale ARGS` as n ranks under mpirun --oversubscribe.
    survive: add --enable-recovery, so that when one rank dies mpirun lets
    the others report it instead of killing them at once (a race)."""
    extra = ["--enable-recovery"] if survive else []
    cmd = [MPIRUN, "--allow-run-as-root", "--oversubscribe", *extra, "-np", str(n), BIN, *args]
    return subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout,
                          env=env)


def mpmd(apps, timeout=300, env=None):
    """Run one job of several programs (Open MPI's MPMD syntax: `mpirun -np
    N1 PROG1 : -np N2 PROG2 ...`), ranks numbered in the order given.  apps:
    a list of (n, args), args being megascale's arguments, or a whole
    command when it starts with "env" (to set a variable on those ranks
    only)."""
    cmd = [MPIRUN, "--allow-run-as-root", "--oversubscribe"]
    for i, (n, args) in enumerate(apps):
        prog = list(args) if args[0] == "env" else [BIN, *args]
        cmd += ([":"] if i else []) + ["-np", str(n), *prog]
    return subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout,
                          env=env)


def losses(path):
    """The per-step training losses of a --metrics file (a last line without its newline is
    still being written)."""
    return [json.loads(l)["loss"] for l in open(path) if '"loss"' in l and l.endswith("\n")]


def compare_weights(a, b, C):
    """Worst per-tensor relative L2 difference of two weights files, and
    where.  The attention key bias is compared on its q and v parts only: its
    gradient is exactly zero in exact arithmetic, so Adam/LAMB turn rounding
    noise into steps of random sign (see tests/torch/test_gpt.py)."""
    x, _ = gpt_ref.read_safetensors(a)
    y, _ = gpt_ref.read_safetensors(b)
    if sorted(x) != sorted(y):
        return 1.0, f"tensor names differ: {sorted(set(x) ^ set(y))}"
    worst, where = 0.0, ""
    for k in x:
        u, v = x[k], y[k]
        if u.shape != v.shape:
            return 1.0, f"{k}: shape {u.shape} vs {v.shape}"
        if k.endswith("attn.c_attn.bias"):
            keep = np.r_[0:C, 2 * C:3 * C]
            u, v = u[keep], v[keep]
        e = np.linalg.norm(u - v) / max(np.linalg.norm(u), 1e-30)
        if e > worst:
            worst, where = e, k
    return worst, where


def run_against_one(d, label, n, layout, base, extra, C, w_keep=None):
    """Train `base + extra` in one process and as n ranks with `layout`
    (both writing metrics and final weights), then check: both succeed, the
    loss curves agree within 1e-5 relative, the loss falls, and the final
    weights agree within 1e-5 relative in L2 per tensor.  w_keep: where to
    copy the single-process weights the first time (for a later
    --init-from case).  Returns (one, many) CompletedProcess, or None when a
    run failed."""
    m1, m2 = os.path.join(d, "m1.jsonl"), os.path.join(d, "m2.jsonl")
    w1, w2 = os.path.join(d, "w1.st"), os.path.join(d, "w2.st")
    for f in (m1, m2, w1, w2):
        if os.path.exists(f):
            os.remove(f)
    one = subprocess.run([BIN, *base, *extra, "--metrics", m1, "--save-weights", w1],
                         capture_output=True, text=True, errors="replace")
    many = mpi(n, *base, *extra, *layout, "--metrics", m2, "--save-weights", w2)
    if one.returncode or many.returncode:
        ok(False, f"{label}: runs succeed", one.stderr + many.stdout + many.stderr)
        return None
    if w_keep and not os.path.exists(w_keep):
        shutil.copy(w1, w_keep)
    a, b = losses(m1), losses(m2)
    err = max(abs(x - y) / abs(x) for x, y in zip(a, b)) if a and len(a) == len(b) else 1
    ok(err <= 1e-5, f"{label}: loss curve = single process (rel {err:.2e})", f"{a}\n{b}")
    ok(a[-1] < a[0] - 0.3, f"{label}: the loss falls", str(a))
    werr, where = compare_weights(w1, w2, C)
    ok(werr <= 1e-5, f"{label}: final weights = single process (worst {werr:.2e} {where})")
    print(f"{label}: loss rel {err:.2e}, weights rel {werr:.2e} ({where})")
    return one, many


def overlap_run(d, n, args, mode):
    """Train `args` as n ranks with --overlap mode, writing metrics and
    final weights in d (named after the mode): (losses, weights bytes,
    metrics records), or None when the run failed (counted as a failed
    check).  For the bitwise on/off comparisons of test_overlap_*.py."""
    tag = mode.replace(",", "_")
    m, w = os.path.join(d, f"m_{tag}.jsonl"), os.path.join(d, f"w_{tag}.st")
    for f in (m, w):
        if os.path.exists(f):
            os.remove(f)
    r = mpi(n, *args, "--overlap", mode, "--metrics", m, "--save-weights", w)
    if r.returncode:
        ok(False, f"{' '.join(args[-6:])} --overlap {mode}: the run succeeds", r.stdout + r.stderr)
        return None
    recs = [json.loads(l) for l in open(m) if '"loss"' in l]
    return losses(m), open(w, "rb").read(), recs


def redo_bitwise(d, label, n, layout, base, extra=()):
    """A transient NaN gradient on the last rank (nan-grad@3:N-1) is redone
    by every rank from its own copy of the step's micro-batches: check that
    the fault's run redid step 3 and skipped nothing, and that its final
    weights are bitwise those of the same layout without the fault."""
    w0, w1 = os.path.join(d, "redo0.st"), os.path.join(d, "redo1.st")
    m1 = os.path.join(d, "redo1.jsonl")
    args = [*base, *layout, *extra, "--steps", "4"]
    r0 = mpi(n, *args, "--save-weights", w0)
    r1 = mpi(n, *args, "--save-weights", w1, "--metrics", m1, "--inject-fault",
             f"nan-grad@3:{n - 1}")
    if r0.returncode or r1.returncode:
        ok(False, f"{label} redo: runs succeed", r0.stderr + r1.stderr)
        return
    steps = [json.loads(l) for l in open(m1) if '"loss"' in l]
    ok([s["redone"] for s in steps] == [0, 0, 1, 0] and not any(s["skipped"] for s in steps),
       f"{label}: a NaN gradient on rank {n - 1} makes every rank redo step 3", r1.stderr)
    ok(open(w0, "rb").read() == open(w1, "rb").read(),
       f"{label}: after the redo the weights are bitwise those of a run without the fault")


def vader_segments(pids):
    """The Open MPI shared-memory segments (/dev/shm/vader_segment.*) the processes pids map."""
    segs = set()
    for pid in pids:
        try:
            for line in open(f"/proc/{pid}/maps"):
                f = line.split()
                if len(f) >= 6 and os.path.basename(f[5]).startswith("vader_segment."):
                    segs.add(f[5])
        except OSError:
            pass
    return segs


def session_dirs(pid):
    """mpirun pid's session directories (TMP/ompi.HOST.UID/pid.PID)."""
    return glob.glob(os.path.join(tempfile.gettempdir(), f"ompi.*.{os.geteuid()}", f"pid.{pid}"))


def start(prefix):
    """Skip (exit 77) without mpirun; otherwise a temporary directory holding
    a byte-level text shard t.bin: returns (dir, shard path)."""
    if not MPIRUN:
        print("SKIP: mpirun not found (apt-get install openmpi-bin)")
        sys.exit(77)
    d = tempfile.mkdtemp(prefix=prefix)
    shard = os.path.join(d, "t.bin")
    text = ("In the beginning God created the heaven and the earth. And the earth was without "
            "form, and void; and darkness was upon the face of the deep. " * 300).encode()
    header = [0] * 256
    header[0], header[1], header[2] = 20240520, 1, len(text)
    open(shard, "wb").write(struct.pack("<256i", *header) + struct.pack(f"<{len(text)}H", *text))
    return d, shard


def finish(d):
    """Print "N passed, N failed", remove d when all passed, exit."""
    print(f"{counts['passed']} passed, {counts['failed']} failed")
    if not counts["failed"]:
        shutil.rmtree(d)
    sys.exit(1 if counts["failed"] else 0)
