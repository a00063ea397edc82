"""Checkpoint directories against a user's mistakes (label cli; issue 13,
defects 2, 3 and 11), on one process:
 - pruning (--ckpt-keep) never follows a step_* symbolic link: the link
   survives and the directory it points into is untouched;
 - a second `megascale train` on a --ckpt-dir that a running trainer holds
   fails fast (exit 2) naming the directory and the holder (pid, host); the
   first finishes normally; a trainer killed with -9 leaves the lock free
   for the run that resumes after it;
 - `ckpt reshard --out` and `ckpt export --out` refuse a checkpoint
   directory (the source's own, another run's), the commit itself and its
   files, and change nothing; a fresh --out still works; an export over an
   existing file is refused without --force; --out onto a
   regular file says so (not a complaint about its staging directory);
 - --resume of a step directory that does not exist or has no
   manifest.json says which (not "no valid checkpoint" of a root);
 - --resume of an older commit of the same directory (a rollback) sets the
   newer commits aside, so a later --resume auto continues the rollback.
Environment: MS_BIN."""
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time

from ckpt_common import (BIN, TINY, Workspace, losses, ok, resumed_at, run, slots, step_dir,
                         summary, tree, verify)


def test_prune_symlink(ws):
    other = ws.path("other_run")
    r = run(ws, ws.train_args("--steps", "2", "--ckpt-dir", other))
    ok(r.returncode == 0 and verify(step_dir(other, 2)), "the other run commits step 2", r.stderr)
    before = tree(other)
    mine = ws.path("prune_run")
    r = run(ws, ws.train_args("--steps", "2", "--ckpt-dir", mine, "--ckpt-every", "2"))
    ok(r.returncode == 0 and verify(step_dir(mine, 2)), "the pruning run commits step 2", r.stderr)
    os.symlink(step_dir(other, 2), step_dir(mine, 1))
    # a fresh start is refused: a link to a commit counts as one (before, the
    # fresh start passed over it and a later --resume auto followed it)
    os.makedirs(ws.path("link_fresh"))
    os.symlink(step_dir(other, 2), step_dir(ws.path("link_fresh"), 3))
    r = run(ws, ws.train_args("--steps", "6", "--ckpt-dir", ws.path("link_fresh")))
    ok(r.returncode == 2 and "already holds the checkpoints of a run" in r.stderr,
       "a fresh start in a directory holding a step_* link to a commit: refused", r.stderr)
    r = run(ws, ws.train_args("--steps", "6", "--ckpt-dir", mine, "--ckpt-every", "2",
                              "--ckpt-keep", "1", "--resume", "auto"))
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


def refused(r, needle):
    return r.returncode == 2 and needle in r.stderr and "nothing was written" in r.stderr


def test_out_refusals(ws):
    src_root, other = ws.path("lock_run"), ws.path("other_run")
    steps = sorted(n for n in os.listdir(src_root) if n.startswith("step_"))
    src = os.path.join(src_root, steps[-1])
    shard = os.path.join(src, sorted(n for n in os.listdir(src) if n.endswith(".safetensors"))[0])
    before_src, before_other = tree(src_root), tree(other)
    cases = [
        (["reshard", src, "--dp", "2", "--out", src_root], "reshard into the source's directory",
         "is the checkpoint"),
        (["reshard", src, "--dp", "2", "--out", src], "reshard into the commit itself",
         "is the checkpoint"),
        (["reshard", src, "--dp", "2", "--out", other], "reshard into another run's directory",
         "is a checkpoint directory"),
        (["reshard", src, "--dp", "2", "--out", os.path.join(other, "sub")],
         "reshard into a new directory inside a checkpoint directory", "lies in"),
        (["export", src, "--out", shard], "export over the commit's own shard", "a file of the"),
        (["export", src, "--out", os.path.join(src, "manifest.json")],
         "export over the commit's manifest", "a file of the"),
        (["export", src_root, "--out", os.path.join(src_root, "latest")],
         "export over the directory's latest", "lies in"),
        (["export", src, "--out", os.path.join(other, "model.safetensors")],
         "export into another run's checkpoint directory", "lies in"),
    ]
    for args, what, needle in cases:
        r = subprocess.run([BIN, "ckpt", *args], capture_output=True, text=True, errors="replace")
        ok(refused(r, needle), f"{what}: refused (exit 2)", f"rc={r.returncode}\n{r.stderr}")
    ok(tree(src_root) == before_src, "the source's directory is unchanged",
       f"{before_src}\n{tree(src_root)}")
    ok(tree(other) == before_other, "the other run's directory is unchanged",
       f"{before_other}\n{tree(other)}")
    ok(verify(src), "the source commit still verifies")
    out, exp = ws.path("fresh_reshard"), ws.path("fresh.safetensors")
    r = subprocess.run([BIN, "ckpt", "reshard", src, "--dp", "2", "--out", out],
                       capture_output=True, text=True)
    n = int(os.path.basename(src)[5:])
    ok(r.returncode == 0 and verify(step_dir(out, n)), "reshard into a new directory works",
       r.stderr)
    r = subprocess.run([BIN, "ckpt", "export", src, "--out", exp], capture_output=True, text=True)
    ok(r.returncode == 0 and os.path.getsize(exp) > 0, "export to a new file works", r.stderr)
    # an export already there is a saved model: replaced only with --force
    open(exp, "ab").write(b"mark")
    size = os.path.getsize(exp)
    r = subprocess.run([BIN, "ckpt", "export", src, "--out", exp], capture_output=True, text=True)
    ok(refused(r, f"--out {exp} exists: --force 1 replaces it") and os.path.getsize(exp) == size,
       "export over an existing file: refused, the file kept", f"rc={r.returncode}\n{r.stderr}")
    r = subprocess.run([BIN, "ckpt", "export", src, "--out", exp, "--force"], capture_output=True,
                       text=True)
    ok(r.returncode == 0 and os.path.getsize(exp) == size - 4, "export --force replaces it",
       r.stderr)
    afile = ws.path("a_regular_file")
    open(afile, "w").write("kept\n")
    r = subprocess.run([BIN, "ckpt", "reshard", src, "--dp", "2", "--out", afile],
                       capture_output=True, text=True)
    ok(r.returncode != 0 and "exists and is not a directory" in r.stderr and
       ".tmp" not in r.stderr and open(afile).read() == "kept\n",
       "reshard --out onto a regular file names it, and leaves it", r.stderr)
    # ... before the source is validated: a directory whose commits all fail their CRC
    # (before, the CRC work came first and the error was "no valid checkpoint", exit 3)
    damaged = ws.path("damaged_root")
    shutil.copytree(src_root, damaged)
    for st in (n for n in os.listdir(damaged) if n.startswith("step_")):
        for f in (n for n in os.listdir(os.path.join(damaged, st)) if n.endswith(".safetensors")):
            with open(os.path.join(damaged, st, f), "r+b") as fh:
                fh.seek(-8, 2)
                b = fh.read(1)
                fh.seek(-1, 1)
                fh.write(bytes([b[0] ^ 0x04]))
    for args in (["reshard", damaged, "--dp", "2", "--out", afile],
                 ["export", damaged, "--out", ws.path("no_such_dir/x.safetensors")]):
        tool = args[0]
        r = subprocess.run([BIN, "ckpt", *args], capture_output=True, text=True)
        ok(r.returncode == 2 and "--out" in r.stderr and "CRC" not in r.stderr,
           f"{tool} --out unusable, the source damaged: the --out refusal comes first", r.stderr)
    # DIR/latest for the tools of a whole directory: that directory
    r = subprocess.run([BIN, "ckpt", "list", os.path.join(src_root, "latest")],
                       capture_output=True, text=True)
    ok(r.returncode == 0 and os.path.basename(src) in r.stdout and "(latest)" in r.stdout,
       "ckpt list DIR/latest lists DIR (before: opendir: Not a directory)", r.stdout + r.stderr)
    r = subprocess.run([BIN, "ckpt", "shm", os.path.join(src_root, "latest")],
                       capture_output=True, text=True)
    ok(r.returncode == 0 and "latest" not in r.stdout, "ckpt shm DIR/latest looks for DIR's",
       r.stdout + r.stderr)


def test_resume_step_dir(ws):
    root = ws.path("lock_run")
    missing, empty = step_dir(root, 99999), step_dir(root, 99998)
    os.makedirs(empty)
    for path, needle in [(missing, "no such step directory"),
                         (empty, "no manifest.json: not a committed checkpoint")]:
        r = run(ws, ws.train_args("--steps", "2", "--resume", path))
        ok(r.returncode != 0 and needle in r.stderr and path in r.stderr,
           f"--resume {os.path.basename(path)} says what is wrong ({needle})", r.stderr)
    os.rmdir(empty)


def test_rollback(ws):
    """--resume DIR/step_E of a directory that holds newer commits (step_6 and
    step_8 when stage 2 keeps up): those are another history from there on,
    set aside (not deleted), so that a later --resume auto continues the
    rollback, not the old step_8.  Which steps commit depends on how fast
    stage 2 persists (a checkpoint due while the last one still persists is
    skipped), so E is the first history's oldest commit, whatever it is."""
    d = ws.path("rollback")
    keep = ["--ckpt-every", "2", "--ckpt-keep", "10", "--ckpt-dir", d]
    r = run(ws, ws.train_args("--steps", "8", *keep))
    steps = lambda: sorted(int(n[5:]) for n in os.listdir(d) if n.startswith("step_"))
    first = steps() if os.path.isdir(d) else []
    ok(r.returncode == 0 and len(first) >= 2 and first[-1] == 8,
       f"the first history commits step 8 and an earlier one (committed: {first})", r.stderr)
    if len(first) < 2:
        return
    e = first[0]
    newer = [f"step_{k:08d}" for k in first[1:]]
    r = run(ws, ws.train_args("--steps", "8", *keep, "--lr", "1e-3", "--resume", step_dir(d, e),
                              "--inject-fault", "kill@7"))
    aside = [n for n in os.listdir(d) if n.startswith("abandoned-")]
    moved = sorted(os.listdir(os.path.join(d, aside[0]))) if aside else []
    ok(r.returncode != 0 and resumed_at(r.stderr) == e and "another history" in r.stderr
       and moved == ["latest", *newer]
       and verify(os.path.join(d, aside[0], "step_00000008")),
       f"the rollback to step {e} sets the newer commits aside, whole", r.stderr + str(moved))
    # the rollback's newest commit on disk, or a newer host-memory snapshot
    # of it (step 6, when the kill came before stage 2 persisted it)
    second = steps()
    r = run(ws, ws.train_args("--steps", "8", *keep, "--lr", "1e-3", "--resume", "auto"))
    at = resumed_at(r.stderr)
    ok(r.returncode == 0 and second and at is not None and second[-1] <= at < 8
       and "abandoned-" not in r.stderr,
       f"--resume auto then continues the rollback (step {at}; on disk {second}), "
       "not the old history's step 8", r.stderr)


def test_rollback_latest(ws):
    """--resume DIR/latest, after latest was pointed at an older commit, is that commit: a
    rollback like --resume DIR/step_E (the newer commits set aside).  Before, it was not seen
    as one: the newer commits were replaced one by one as the run committed its steps, and
    one of the old history was left for --resume auto to continue on top of the new."""
    d = ws.path("rollback_latest")
    keep = ["--ckpt-every", "2", "--ckpt-keep", "10", "--ckpt-dir", d]
    r = run(ws, ws.train_args("--steps", "8", *keep))
    steps = sorted(int(n[5:]) for n in os.listdir(d) if n.startswith("step_")) \
        if os.path.isdir(d) else []
    ok(r.returncode == 0 and len(steps) >= 2, f"a first history ({steps})", r.stderr)
    if len(steps) < 2:
        return
    with open(os.path.join(d, "latest"), "w") as f:
        f.write(f"step_{steps[0]:08d}\n")
    r = run(ws, ws.train_args("--steps", str(steps[0] + 1), *keep, "--lr", "1e-3", "--resume",
                              os.path.join(d, "latest")))
    aside = [n for n in os.listdir(d) if n.startswith("abandoned-")]
    moved = sorted(n for n in os.listdir(os.path.join(d, aside[0])) if n.startswith("step_")) \
        if aside else []
    ok(r.returncode == 0 and resumed_at(r.stderr) == steps[0] and "another history" in r.stderr
       and moved == [f"step_{k:08d}" for k in steps[1:]] and "replaced an older" not in r.stderr,
       f"--resume DIR/latest naming step {steps[0]}: the newer commits set aside", r.stderr +
       str(moved))


def test_rollback_spelling(ws):
    """A rollback to the directory's own commit spelled DIR/step_N/. or through a link to it is
    the rollback it is: the newer commits set aside.  Before, the parent of the spelling was
    compared with --ckpt-dir, the commit was called another run's, and the --new-run that the
    refusal advised moved the commit itself away (then: no such file, and --resume auto started
    from scratch).  `ckpt list` of such a spelling lists the commit's directory."""
    d = ws.path("rollback_spelling")
    keep = ["--ckpt-every", "2", "--ckpt-keep", "10", "--ckpt-dir", d]
    r = run(ws, ws.train_args("--steps", "4", *keep))
    steps = sorted(int(n[5:]) for n in os.listdir(d) if n.startswith("step_")) \
        if os.path.isdir(d) else []
    ok(r.returncode == 0 and len(steps) >= 2, f"a first history ({steps})", r.stderr)
    if len(steps) < 2:
        return
    e = steps[0]
    lst = subprocess.run([BIN, "ckpt", "list", step_dir(d, e) + "/."], capture_output=True,
                         text=True, env=ws.env)
    ok(lst.returncode == 0 and f"step_{steps[-1]:08d}" in lst.stdout,
       "ckpt list DIR/step_N/. lists DIR", lst.stdout + lst.stderr)
    link = ws.path("rollback_spelling_link")
    os.symlink(step_dir(d, e), link)
    for spelled in (step_dir(d, e) + "/.", link):
        r = run(ws, ws.train_args("--steps", str(e + 1), *keep, "--resume", spelled))
        aside = [n for n in os.listdir(d) if n.startswith("abandoned-")]
        ok(r.returncode == 0 and resumed_at(r.stderr) == e and "another history" in r.stderr and
           aside and "another run" not in r.stderr and os.path.isdir(step_dir(d, e)),
           f"--resume {spelled[len(ws.path('')):]}: a rollback to the directory's own step {e}",
           r.stderr)
        for a in aside:  # the next spelling rolls back again
            for n in os.listdir(os.path.join(d, a)):
                if n.startswith("step_"):
                    os.rename(os.path.join(d, a, n), os.path.join(d, n))
            shutil.rmtree(os.path.join(d, a))
        if os.path.isdir(step_dir(d, e + 1)):
            shutil.rmtree(step_dir(d, e + 1))


def test_slot_taken(ws):
    """This rank's snapshot name in the snapshot directory taken by a FIFO: bad input (exit 3)
    naming it and what it is, and the FIFO is left alone.  Before: "size snapshot to N bytes:
    Invalid argument", exit 4 (a storage fault)."""
    d = ws.path("slot_taken")
    os.makedirs(d)
    h = 1469598103934665603
    for b in os.path.realpath(d).encode():
        h = ((h ^ b) * 1099511628211) & (2**64 - 1)
    fifo = os.path.join(ws.shm, f"megascale-ckpt-{h:016x}-r00000-s0")
    os.mkfifo(fifo)
    r = run(ws, ws.train_args("--steps", "2", "--ckpt-dir", d))
    ok(r.returncode == 3 and f"{fifo}: not a regular file (a FIFO)" in r.stderr and
       os.path.exists(fifo), "a FIFO where the snapshot goes: exit 3 naming it", r.stderr)
    os.unlink(fifo)


def test_prune_killed(ws):
    """A run killed while it prunes (SIGKILL at its second unlinkat, by strace's fault
    injection) leaves every commit whole: a pruned one goes out of sight in one rename
    before its files go.  Before, the kill left a commit with its manifest and no shard,
    which verify, list and every resume reported as damaged."""
    if subprocess.run(["strace", "-o", "/dev/null", "true"], capture_output=True).returncode:
        print("SKIP: prune killed: strace cannot trace here (not installed, or no ptrace)")
        return
    d = ws.path("prune_killed")
    cmd = [BIN, *ws.train_args("--steps", "5", "--ckpt-every", "1", "--ckpt-keep", "1",
                               "--ckpt-dir", d)]
    subprocess.run(["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=unlinkat", "-e",
                    "inject=unlinkat:signal=KILL:when=2", *cmd], capture_output=True, text=True,
                   timeout=120, env=ws.env)
    v = subprocess.run([BIN, "ckpt", "verify", d], capture_output=True, text=True, env=ws.env)
    ok(os.path.isdir(d) and v.returncode == 0, "killed while pruning: every commit verifies",
       v.stdout + v.stderr + str(os.listdir(d) if os.path.isdir(d) else None))
    subprocess.run([BIN, "ckpt", "shm", d, "--remove", "1", "--force", "1"], capture_output=True,
                   env=ws.env)


def test_other_histories(ws):
    """Mistakes that lost or hid an earlier run's commits (each was exit 0 or
    left the directory changed): a --resume of another directory's commit
    into a directory holding a run; a --resume DIR/step_N that does not
    exist (the newer commits were moved before it failed); a --ckpt-dir that
    is a commit; --save-weights inside a commit; --new-run's earlier metrics;
    another --data-order than the checkpoint's."""
    def kept(d):  # the directory's contents, but its lock (the last holder's pid)
        return {k: v for k, v in tree(d).items() if k != "lock"}
    a, b = ws.path("hist_a"), ws.path("hist_b")
    a_m = ws.path("hist_a.jsonl")
    r = run(ws, ws.train_args("--steps", "4", "--ckpt-dir", a, "--ckpt-every", "2", "--metrics",
                              a_m))
    r2 = run(ws, ws.train_args("--steps", "6", "--ckpt-dir", b, "--ckpt-every", "6", "--seed", "2"))
    ok(r.returncode == 0 and r2.returncode == 0, "two runs, A (steps 2, 4) and B (step 6)",
       r.stderr + r2.stderr)
    before = kept(a)
    r = run(ws, ws.train_args("--steps", "10", "--ckpt-dir", a, "--ckpt-every", "2", "--resume",
                              step_dir(b, 6)))
    ok(r.returncode == 2 and f"is not a checkpoint of --ckpt-dir {a}" in r.stderr
       and "--new-run" in r.stderr and kept(a) == before,
       "--resume B/step_6 into A, which holds A's commits: refused, A unchanged", r.stderr)
    a_old = open(a_m).read() if os.path.exists(a_m) else ""
    r = run(ws, ws.train_args("--steps", "8", "--ckpt-dir", a, "--ckpt-every", "2", "--resume",
                              step_dir(b, 6), "--new-run", "--metrics", a_m))
    prev = [n for n in os.listdir(a) if n.startswith("previous-")]
    ok(r.returncode == 0 and resumed_at(r.stderr) == 6 and prev
       and sorted(n for n in os.listdir(os.path.join(a, prev[0])) if n.startswith("step_"))
       == ["step_00000002", "step_00000004"],
       "... with --new-run: A's commits moved aside, B's step 6 continued in A", r.stderr)
    moved = os.path.join(a, prev[0], "hist_a.jsonl") if prev else ""
    ok(a_old and moved and os.path.exists(moved) and open(moved).read() == a_old
       and '"step": 2' not in open(a_m).read().replace('"step":2', '"step": 2'),
       "... and A's metrics moved with them (not trimmed and appended to)", r.stderr)
    # a clean stop's word (CKPT_DIR/stopped, for the supervisor) outlives a refused start
    # and goes with an accepted one
    open(os.path.join(a, "stopped"), "w").write("step 8\n")
    r = run(ws, ws.train_args("--steps", "10", "--ckpt-dir", a))
    ok(r.returncode == 2 and os.path.exists(os.path.join(a, "stopped")),
       "a refused start leaves CKPT_DIR/stopped", r.stderr)
    # refused later, once the commit is read: another model (it was removed as the directory
    # was opened, and a supervisor then took the stopped job's end for a crash)
    r = run(ws, ws.train_args("--steps", "10", "--ckpt-dir", a, "--resume", "auto", "--dim",
                              "64"))
    ok(r.returncode == 2 and "another model" in r.stderr
       and os.path.exists(os.path.join(a, "stopped")),
       "a start refused by the commit's model leaves CKPT_DIR/stopped", r.stderr)
    r = run(ws, ws.train_args("--steps", "9", "--ckpt-dir", a, "--resume", "auto"))
    ok(r.returncode == 0 and not os.path.exists(os.path.join(a, "stopped")),
       "an accepted start removes CKPT_DIR/stopped", r.stderr)
    # refused by the data position (a sequential cursor past a smaller shard's end), after
    # the snapshot slots were made: they go (two empty /dev/shm files, each a rank's share
    # of the weights and moments, stayed until the next accepted start)
    sq = ws.path("seq_pos")
    r = run(ws, ws.train_args("--steps", "10", "--ckpt-dir", sq, "--data-order", "sequential"))
    small = ws.path("small.bin")
    with open(small, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, 100, *([0] * 253)))
        f.write(struct.pack("<100H", *([7] * 100)))
    r = run(ws, ["train", "--train-data", small, *TINY, "--steps", "12", "--ckpt-dir", sq,
                 "--data-order", "sequential", "--resume", "auto"])
    ok(r.returncode != 0 and "resume at step 10" in r.stderr and slots(ws.shm, sq) == {},
       "a start refused by the data position leaves no snapshot slot", r.stderr
       + str(slots(ws.shm, sq)))
    # a shard added under the same glob: the cursor continues in other data, said (the glob
    # string was the same, so nothing was)
    dd = ws.path("grown")
    os.makedirs(dd)
    shutil.copy(ws.shard, os.path.join(dd, "a_000.bin"))
    glob_ = os.path.join(dd, "a_*.bin")
    gk = ws.path("grown_ck")
    r = run(ws, ["train", "--train-data", glob_, *TINY, "--steps", "3", "--ckpt-dir", gk])
    shutil.copy(ws.shard, os.path.join(dd, "a_001.bin"))
    r2 = run(ws, ["train", "--train-data", glob_, *TINY, "--steps", "4", "--ckpt-dir", gk,
                  "--resume", "auto"])
    ok(r.returncode == 0 and r2.returncode == 0 and resumed_at(r2.stderr) == 3
       and "changed since the checkpoint (1 shard(s)" in r2.stderr and "2 and " in r2.stderr,
       "a shard added under the same --train-data glob: the resume says the data changed",
       r.stderr[-1500:] + r2.stderr[-1500:])
    r3 = run(ws, ["train", "--train-data", glob_, *TINY, "--steps", "5", "--ckpt-dir", gk,
                  "--resume", "auto"])
    ok(r3.returncode == 0 and "changed since the checkpoint" not in r3.stderr,
       "... and not again once a commit has the new data set", r3.stderr[-1500:])
    # another --seq under the shuffle: its position counts windows of the old length
    r4 = run(ws, ["train", "--train-data", glob_, *TINY, "--steps", "6", "--ckpt-dir", gk,
                  "--resume", "auto", "--seq", "8"])
    ok(r4.returncode == 0 and "batch 4 x seq 8 differs from the checkpoint's 4 x 16" in r4.stderr
       and "names another place in the epoch" in r4.stderr,
       "another --seq on a shuffle resume: the warning says the position moved", r4.stderr[-1500:])
    # a mistyped rollback target: nothing moved
    c = ws.path("hist_c")
    run(ws, ws.train_args("--steps", "6", "--ckpt-dir", c, "--ckpt-every", "2",
                          "--ckpt-keep", "5"))
    before = kept(c)
    r = run(ws, ws.train_args("--steps", "6", "--ckpt-dir", c, "--resume", step_dir(c, 3)))
    ok(r.returncode == 3 and "nothing was moved" in r.stderr and kept(c) == before,
       "--resume DIR/step_3 that does not exist: an error, the newer commits not moved", r.stderr)
    r = run(ws, ws.train_args("--steps", "6", "--ckpt-dir", c, "--resume", step_dir(c, 2),
                              "--dim", "48"))
    ok(r.returncode == 2 and "nothing was moved" in r.stderr and kept(c) == before,
       "--resume DIR/step_2 of another model: refused, the newer commits not moved", r.stderr)
    # a rollback target whose data fails its CRC (one byte flipped): found before anything
    # moves (before, the newer commits went aside, the load then failed, and --resume auto
    # found no valid commit left in the directory)
    p = os.path.join(step_dir(c, 2), "shard-00000-of-00001.safetensors")
    with open(p, "r+b") as f:
        f.seek(-8, 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x04]))
    before = kept(c)
    r = run(ws, ws.train_args("--steps", "6", "--ckpt-dir", c, "--resume", step_dir(c, 2)))
    ok(r.returncode == 3 and "nothing was moved" in r.stderr and "CRC" in r.stderr and
       kept(c) == before,
       "--resume DIR/step_2 with a damaged shard: refused, the newer commits not moved",
       r.stderr)
    # a commit as --ckpt-dir; an output inside a commit
    r = run(ws, ws.train_args("--steps", "8", "--ckpt-dir", step_dir(c, 6), "--resume", "auto"))
    ok(r.returncode == 2 and "is a commit (it holds manifest.json)" in r.stderr
       and kept(c) == before, "--ckpt-dir DIR/step_6: refused, the commit unchanged", r.stderr)
    inside = os.path.join(step_dir(c, 6), "model.safetensors")
    r = run(ws, ws.train_args("--steps", "8", "--ckpt-dir", c, "--resume", "auto",
                              "--save-weights", inside))
    ok(r.returncode == 2 and "inside the commit" in r.stderr and kept(c) == before,
       "--save-weights inside a commit (pruned with it): refused at start-up", r.stderr)
    # --new-run with --out-dir: the earlier run's metrics go with its commits
    od = ws.path("hist_od")
    r = run(ws, ws.train_args("--steps", "4", "--ckpt-every", "2", "--out-dir", od))
    old_metrics = open(os.path.join(od, "metrics.jsonl")).read() if r.returncode == 0 else ""
    r = run(ws, ws.train_args("--steps", "2", "--out-dir", od, "--new-run"))
    prev = [n for n in os.listdir(os.path.join(od, "ckpt")) if n.startswith("previous-")]
    moved = os.path.join(od, "ckpt", prev[0], "metrics.jsonl") if prev else ""
    ok(r.returncode == 0 and old_metrics and moved and open(moved).read() == old_metrics
       and os.path.exists(os.path.join(od, "ckpt", prev[0], "train.cfg")),
       "--new-run --out-dir: the earlier run's metrics.jsonl and train.cfg moved with its "
       "commits (the metrics were truncated)", r.stderr)
    # names a commit never gets are not listed as commits (a ninth zero was
    # listed as step_00000020, step_99999999999 as an overflowed step)
    for junk in ("step_000000020", "step_+0000040", "step_99999999999"):
        os.makedirs(os.path.join(c, junk))
    r = subprocess.run([BIN, "ckpt", "list", c], capture_output=True, text=True)
    ok(r.returncode == 0 and "step_000000020" not in r.stdout and "step_00000020" not in r.stdout
       and "1215752191" not in r.stdout and "0000040" not in r.stdout,
       "ckpt list: only step_%08d names are commits", r.stdout + r.stderr)
    for junk in ("step_000000020", "step_+0000040", "step_99999999999"):
        os.rmdir(os.path.join(c, junk))
    # --init-from is the first start's: when the file is gone, a resume takes
    # the model's shape from its commit (it failed: "open: No such file")
    init, d = ws.path("init.safetensors"), ws.path("hist_init")
    r = subprocess.run([BIN, "ckpt", "export", c, "--out", init], capture_output=True, text=True)
    r = run(ws, ws.train_args("--steps", "6", "--ckpt-dir", d, "--ckpt-every", "2", "--init-from",
                              init, "--inject-fault", "term@3"))
    os.remove(init)
    r = run(ws, ws.train_args("--steps", "6", "--ckpt-dir", d, "--ckpt-every", "2", "--init-from",
                              init, "--resume", "auto"))
    ok(r.returncode == 0 and f"--init-from {init} is gone" in r.stderr and resumed_at(r.stderr),
       "--init-from gone, --resume auto: the run goes on from its commit", r.stderr)
    r = run(ws, ws.train_args("--steps", "6", "--ckpt-dir", ws.path("hist_init2"), "--init-from",
                              init))
    ok(r.returncode == 3 and "--init-from" in r.stderr, "--init-from gone on a first start: an error",
       r.stderr)
    # another data order: the cursor would mean another place in the data
    r = run(ws, ws.train_args("--steps", "8", "--ckpt-dir", c, "--resume", "auto",
                              "--data-order", "sequential"))
    ok(r.returncode == 2 and "--data-order sequential differs from the checkpoint's shuffle"
       in r.stderr and kept(c) == before, "another --data-order than the checkpoint's: refused",
       r.stderr)


def main():
    ws = Workspace("ms_ckpt_guard_")
    try:
        test_prune_symlink(ws)
        test_prune_killed(ws)
        test_rollback_latest(ws)
        test_rollback_spelling(ws)
        test_slot_taken(ws)
        test_lock(ws)
        test_out_refusals(ws)
        test_resume_step_dir(ws)
        test_rollback(ws)
        test_other_histories(ws)
    finally:
        ws.close()
    sys.exit(summary())


if __name__ == "__main__":
    main()
