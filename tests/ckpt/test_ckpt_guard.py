"""Checkpoint directories against a user's mistakes (label cli; issue 13),
on one process:
 - pruning (--ckpt-keep) never follows a step_* symbolic link: the link
   survives and the directory it points into is untouched;
 - a second `megascale train` on a --ckpt-dir that a running trainer holds
   fails fast (exit 2) naming the directory and the holder (pid, host); the
   first finishes normally; a trainer killed with -9 leaves the lock free
   for the run that resumes after it.
Environment: MS_BIN."""
import os
import signal
import socket
import subprocess
import sys
import time

from ckpt_common import (BIN, Workspace, losses, ok, resumed_at, run, step_dir, summary, tree,
                         verify)


def test_prune_symlink(ws):
    other = ws.path("other_run")
    r = run(ws, ws.train_args("--steps", "2", "--ckpt-dir", other))
    ok(r.returncode == 0 and verify(step_dir(other, 2)), "the other run commits step 2", r.stderr)
    before = tree(other)
    mine = ws.path("prune_run")
    os.makedirs(mine)
    os.symlink(step_dir(other, 2), step_dir(mine, 1))
    r = run(ws, ws.train_args("--steps", "6", "--ckpt-dir", mine, "--ckpt-every", "2",
                              "--ckpt-keep", "1"))
    ok(r.returncode == 0 and verify(step_dir(mine, 6)), "the pruning run commits step 6", r.stderr)
    ok(not os.path.exists(step_dir(mine, 2)) and not os.path.exists(step_dir(mine, 4)),
       "--ckpt-keep 1 still prunes the run's own older commits", str(sorted(os.listdir(mine))))
    ok(os.path.islink(step_dir(mine, 1)), "the step_* symbolic link survives pruning",
       str(sorted(os.listdir(mine))) + "\n" + r.stderr)
    ok(tree(other) == before, "the linked directory's files are untouched",
       f"{before}\n{tree(other)}")
    ok(verify(step_dir(other, 2)), "the other run's commit still verifies")


def wait_losses(m, n, p, limit=60):
    t0 = time.time()
    while time.time() - t0 < limit and len(losses(m)) < n and p.poll() is None:
        time.sleep(0.05)
    return len(losses(m)) >= n


def long_run(ws, c, m, *extra):
    return subprocess.Popen([BIN, *ws.train_args("--steps", "1000000", "--lr-schedule", "constant",
                                                 "--ckpt-dir", c, "--ckpt-every", "1000000",
                                                 "--metrics", m, *extra)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ws.env)


def test_lock(ws):
    c, m1 = ws.path("lock_run"), ws.path("lock1.jsonl")
    p = long_run(ws, c, m1)
    try:
        ok(wait_losses(m1, 3, p), "the first trainer runs")
        t0 = time.time()
        r = run(ws, ws.train_args("--steps", "3", "--ckpt-dir", c, "--metrics",
                                  ws.path("lock2.jsonl")), timeout=60)
        dt = time.time() - t0
        ok(r.returncode == 2 and "in use by another run" in r.stderr and c in r.stderr and
           f"pid {p.pid}" in r.stderr and socket.gethostname() in r.stderr,
           "a second trainer on the same --ckpt-dir is refused, naming the directory and holder",
           f"rc={r.returncode}\n{r.stderr}")
        ok(dt < 20, f"... and fails fast ({dt:.1f} s)")
        ok(not losses(ws.path("lock2.jsonl")), "the refused trainer trained nothing")
        ok(p.poll() is None, "the first trainer is still running")
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    n = len(losses(m1))
    ok(p.returncode == 0 and verify(step_dir(c, n)), f"the first finishes: step {n} committed",
       err[-2000:])
    # a trainer killed with -9 (the supervisor's stop) leaves the lock free
    m3 = ws.path("lock3.jsonl")
    p = long_run(ws, c, m3, "--resume", "auto")
    try:
        ok(wait_losses(m3, 2, p), "a resumed trainer runs")
    finally:
        p.kill()
        p.wait()
    r = run(ws, ws.train_args("--steps", str(n + 2), "--lr-schedule", "constant", "--ckpt-dir", c,
                              "--resume", "auto"))
    ok(r.returncode == 0 and resumed_at(r.stderr) == n,
       "after kill -9 the next trainer takes the lock and resumes", r.stderr)


def main():
    ws = Workspace("ms_ckpt_guard_")
    try:
        test_prune_symlink(ws)
        test_lock(ws)
    finally:
        ws.close()
    sys.exit(summary())


if __name__ == "__main__":
    main()
