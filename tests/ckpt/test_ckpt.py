"""Checkpoints end to end on one process (label cli): bitwise resume (2N
steps straight == N steps, stop, resume N: identical per-step losses and
final-weights hash) for two configurations, a real SIGTERM mid-run with its
final checkpoint, keep-K, time-based checkpoints, the `megascale ckpt` tools
(list, inspect, verify, export -> sample / --init-from, reshard -> resume on
another layout), the manifest's fields, /dev/shm cleanup after a clean
finish, the metrics' line per commit (and a resumed run's trim of them),
orphaned host-memory snapshots (`ckpt shm-orphans`: their directory gone,
never one a live process holds; the trainer's warning), and bad arguments.
Environment: MS_BIN."""
import fcntl
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time

from ckpt_common import (BIN, Workspace, ckpt_lines, committed_steps, losses, ok, rel_err,
                         resumed_at, run, sha, shard_sizes, step_dir, summary, verify)


def bitwise_case(ws, name, extra, shm_env=None):
    """16 steps straight vs 8, a clean stop (SIGTERM, injected), 8 more."""
    ref_m, ref_w = ws.path(f"{name}_ref.jsonl"), ws.path(f"{name}_ref.st")
    c = ws.path(f"{name}_ckpt")
    r = run(ws, ws.train_args("--steps", "16", *extra, "--metrics", ref_m, "--save-weights", ref_w))
    ok(r.returncode == 0, f"{name}: straight run", r.stderr)
    a_m, b_m, b_w = ws.path(f"{name}_a.jsonl"), ws.path(f"{name}_b.jsonl"), ws.path(f"{name}_b.st")
    r1 = run(ws, ws.train_args("--steps", "16", *extra, "--ckpt-dir", c, "--ckpt-every", "4",
                               "--metrics", a_m), fault="signal:term@8", env=shm_env)
    ok(r1.returncode == 0 and "interrupted: stopping after step 8" in r1.stderr,
       f"{name}: SIGTERM stops at the step boundary", r1.stderr)
    ok(verify(step_dir(c, 8)), f"{name}: the final checkpoint (step 8) is committed", r1.stderr)
    r2 = run(ws, ws.train_args("--steps", "16", *extra, "--ckpt-dir", c, "--ckpt-every", "4",
                               "--resume", "auto", "--metrics", b_m, "--save-weights", b_w),
             env=shm_env)
    ok(r2.returncode == 0 and resumed_at(r2.stderr) == 8, f"{name}: resumes at step 8", r2.stderr)
    ref, got = losses(ref_m), losses(a_m) + losses(b_m)
    ok(len(ref) == 16 and got == ref, f"{name}: per-step losses bit-identical", f"{ref}\n{got}")
    ok(sha(ref_w) is not None and sha(ref_w) == sha(b_w), f"{name}: final parameters hash equal")
    if not extra:  # the finished run started again: it says so, and its weights stay
        r3 = run(ws, ws.train_args("--steps", "16", "--ckpt-dir", c, "--resume", "auto",
                                   "--save-weights", b_w), env=shm_env)
        ok(r3.returncode == 0 and "the checkpoint is at step 16 and --steps is 16: nothing to "
           "train" in r3.stderr, f"{name}: a finished run started again says it has nothing to "
           "train", r3.stderr)
        ok(sha(b_w) == sha(ref_w), f"{name}: ... and its final weights are the same")
    print(f"{name}: 16 losses bit-identical, weights sha256 {str(sha(b_w))[:16]} equal", flush=True)
    return c


def test_manifest(ws, c):
    m = json.load(open(os.path.join(step_dir(c, 16), "manifest.json")))
    need = ["format", "version", "manifest_crc32c", "step", "created", "layout", "model",
            "optimizer", "trainer", "tensors", "files", "slices"]
    ok(all(k in m for k in need) and m["format"] == "megascale-checkpoint" and m["step"] == 16
       and m["version"] == 2,
       "manifest top-level fields", str(list(m)))
    ok(m["layout"] == {"world": 1, "dp": 1, "tp": 1, "pp": 1, "vpp": 1,
                        "zero": 0}, "manifest layout",
       str(m["layout"]))
    tr = m["trainer"]
    ok(all(k in tr for k in ("step", "opt_steps", "seed", "rng", "data_cursor", "lr_schedule"))
       and tr["opt_steps"] == 16 and tr["seed"] == "1337", "manifest trainer state", str(tr))
    ok(m["tensors"]["wte.weight"] == {"shape": [256, 32], "dtype": "F32"},
       "wte has the logical (vocab) shape", str(m["tensors"]["wte.weight"]))
    sl = m["slices"]
    ok(len(sl) == 3 * len(m["tensors"]) and
       {s["state"] for s in sl} == {"param", "m", "v"} and
       all(k in sl[0] for k in ("tensor", "file", "key", "offset", "shape", "range", "crc32c")),
       "slices: param/m/v of every tensor with box, range, CRC", json.dumps(sl[:1]))
    # a manifest without a checksum of its own (format version 1, as before it) whose layout's
    # world is not dp x tp x pp, or that lists a file twice: refused (verify passed both)
    for what, edit, needle in (
            ("world 1000000", lambda x: x["layout"].update(world=1000000),
             "layout: world 1000000 is not dp 1 x tp 1 x pp 1"),
            ("a file twice", lambda x: x["files"].append(dict(x["files"][0])),
             "is listed twice")):
        bad = ws.path("bad_manifest")
        shutil.rmtree(bad, ignore_errors=True)
        shutil.copytree(step_dir(c, 16), os.path.join(bad, "step_00000016"))
        x = json.loads(json.dumps(m))
        x["version"] = 1
        del x["manifest_crc32c"]
        edit(x)
        json.dump(x, open(os.path.join(bad, "step_00000016", "manifest.json"), "w"))
        r = subprocess.run([BIN, "ckpt", "verify", os.path.join(bad, "step_00000016")],
                           capture_output=True, text=True)
        ok(r.returncode == 3 and needle in r.stderr, f"a version 1 manifest with {what}: refused",
           r.stdout + r.stderr)
    shutil.rmtree(bad, ignore_errors=True)


def test_tools(ws, c, ref_w, ref_m):
    r = subprocess.run([BIN, "ckpt", "list", c], capture_output=True, text=True)
    lines = [l for l in r.stdout.splitlines() if "committed" in l]
    # (a snapshot still queued when the next one is taken is superseded, so
    # which older steps exist depends on timing)
    ok(r.returncode == 0 and 2 <= len(lines) <= 3 and "step_00000016" in lines[0] and
       "(latest)" in lines[0] and any("step_00000008" in l for l in lines),
       "list: at most 3 commits (--ckpt-keep 3), the newest first and latest", r.stdout + r.stderr)
    ok("no host-memory snapshots of" in r.stdout, "no host-memory snapshot left after a clean finish",
       r.stdout)
    # a commit given to list or shm: its directory's (it listed nothing, exit 0)
    r2 = subprocess.run([BIN, "ckpt", "list", step_dir(c, 16)], capture_output=True, text=True)
    ok(r2.returncode == 0 and r2.stdout == r.stdout, "list of a commit lists its directory",
       r2.stdout + r2.stderr)
    # a latest that names no commit is said (a resume takes the newest valid one)
    dang = ws.path("dangling")
    shutil.copytree(c, dang)
    open(os.path.join(dang, "latest"), "w").write("step_00000099\n")
    r2 = subprocess.run([BIN, "ckpt", "list", dang], capture_output=True, text=True)
    ok(r2.returncode == 0 and f"{dang}/latest names step_00000099, which is not a commit" in
       r2.stdout and "(latest)" not in r2.stdout, "list: a latest that names no commit is said",
       r2.stdout + r2.stderr)
    shutil.rmtree(dang)
    r = subprocess.run([BIN, "ckpt", "inspect", c], capture_output=True, text=True)
    ok(r.returncode == 0 and "step       16" in r.stdout and "dp 1" in r.stdout and
       "wte.weight" in r.stdout and "(256, 32)" in r.stdout and "cursor" in r.stdout,
       "inspect: step, layout, tensors, data cursor", r.stdout + r.stderr)
    r = subprocess.run([BIN, "ckpt", "verify", c], capture_output=True, text=True)
    ok(r.returncode == 0 and r.stdout.count(": ok") == len(lines), "verify: every commit's CRCs",
       r.stdout + r.stderr)
    exp = ws.path("export.safetensors")
    r = subprocess.run([BIN, "ckpt", "export", c, "--format", "safetensors", "--out", exp],
                       capture_output=True, text=True)
    ok(r.returncode == 0 and sha(exp) == sha(ref_w),
       "export: the same file as --save-weights of the run", r.stdout + r.stderr)
    # another model's config.json beside --out: kept unless --force 1 (it was replaced)
    hfd = ws.path("hf_dir")
    os.makedirs(hfd)
    open(os.path.join(hfd, "config.json"), "w").write('{"mine": 1}')
    r = subprocess.run([BIN, "ckpt", "export", c, "--out", os.path.join(hfd, "model.safetensors")],
                       capture_output=True, text=True)
    ok(r.returncode == 2 and "config.json exists beside --out" in r.stderr and
       open(os.path.join(hfd, "config.json")).read() == '{"mine": 1}' and
       os.listdir(hfd) == ["config.json"], "export: a config.json there is kept without --force",
       r.stderr)
    r = subprocess.run([BIN, "ckpt", "export", c, "--out", os.path.join(hfd, "model.safetensors"),
                        "--force", "1"], capture_output=True, text=True)
    ok(r.returncode == 0 and '"mine"' not in open(os.path.join(hfd, "config.json")).read(),
       "export --force 1 replaces it", r.stderr)
    r = subprocess.run([BIN, "sample", "--weights", exp, "--tokens", "8", "--prompt", "In"],
                       capture_output=True, text=True)
    ok(r.returncode == 0, "sample --weights loads the export", r.stderr)
    r = run(ws, ["train", "--train-data", ws.shard, "--init-from", exp, "--seq", "16", "--batch",
                 "4", "--steps", "1", "--threads", "1", "--peak-flops", "1e11"])
    ok(r.returncode == 0 and "weights: loaded" in r.stderr, "train --init-from loads the export",
       r.stderr)
    # a reshard that fails part way (a file-size limit: a disk that fills) leaves
    # no --out: its job file made every retry "a checkpoint directory", refused
    out = ws.path("resharded")

    def small_files():  # (SIGXFSZ as the shell leaves it: it ended the tools without a word)
        resource.setrlimit(resource.RLIMIT_FSIZE, (50000, 50000))

    r = subprocess.run([BIN, "ckpt", "reshard", step_dir(c, 8), "--dp", "2", "--out", out],
                       capture_output=True, text=True, preexec_fn=small_files)
    ok(r.returncode == 4 and "File too large" in r.stderr and not os.path.exists(out),
       "reshard that fails on a write leaves no --out (no job file)", r.stderr)
    big = ws.path("too_big.safetensors")
    r = subprocess.run([BIN, "ckpt", "export", step_dir(c, 8), "--out", big],
                       capture_output=True, text=True, preexec_fn=small_files)
    ok(r.returncode == 4 and f"{big}.tmp." in r.stderr and "File too large" in r.stderr and
       not [n for n in os.listdir(ws.dir) if n.startswith("too_big")],
       "export past a file-size limit: the error names the file, nothing is left", r.stderr)
    limited, slots_before = ws.path("limited"), sorted(os.listdir(ws.shm))
    r = subprocess.run([BIN, *ws.train_args("--steps", "2", "--ckpt-dir", limited)],
                       capture_output=True, text=True, env=ws.env, preexec_fn=small_files)
    ok(r.returncode == 4 and "size snapshot to" in r.stderr and "File too large" in r.stderr and
       sorted(os.listdir(ws.shm)) == slots_before, "train past a file-size limit: exit 4 naming its snapshot, "
       "none left (empty) in the snapshot directory", r.stderr + str(os.listdir(ws.shm)))
    # ... nor one that a SIGTERM (Ctrl-C) ends while it writes: before, --out and its job file
    # were left, and every retry was refused
    p = subprocess.Popen([BIN, "ckpt", "reshard", step_dir(c, 8), "--dp", "3000", "--out", out],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0, seen = time.time(), False
    while p.poll() is None and time.time() - t0 < 60:
        if os.path.exists(os.path.join(out, "job")):
            seen = True
            p.send_signal(signal.SIGTERM)
            break
        time.sleep(0.002)
    rc = p.wait(timeout=60)
    ok(seen and rc == -signal.SIGTERM and not os.path.exists(out),
       "a reshard ended by SIGTERM while it writes leaves no --out", f"seen {seen}, rc {rc}")
    # offline reshard to dp 2, then a single process resumes from that layout
    r = subprocess.run([BIN, "ckpt", "reshard", step_dir(c, 8), "--dp", "2", "--out", out],
                       capture_output=True, text=True)
    ok(r.returncode == 0 and verify(step_dir(out, 8)), "reshard --dp 2 writes a valid commit",
       r.stdout + r.stderr)
    m = json.load(open(os.path.join(step_dir(out, 8), "manifest.json")))
    ok(m["layout"]["dp"] == 2 and len(m["files"]) == 2, "the resharded commit has 2 shards",
       str(m["layout"]))
    # two reshards into one new --out at the same moment: both passed the check of --out
    # (it was new), and both wrote into it; now one holds its lock and commits, and the other
    # is refused (the lock held, or the commit already there), naming --out
    out2 = ws.path("resharded_twice")
    ps = [subprocess.Popen([BIN, "ckpt", "reshard", step_dir(c, 8), "--dp", str(dp), "--out", out2],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
          for dp in (300, 3)]
    res = [(p.wait(timeout=300), p.communicate()[1]) for p in ps]
    won = [i for i, (rc, _) in enumerate(res) if rc == 0]
    lost = [e for rc, e in res if rc != 0]
    why = ("is in use by another run", "was written by another command meanwhile",
           "is a checkpoint directory")
    ok(len(won) == 1 and len(lost) == 1 and out2 in lost[0] and any(w in lost[0] for w in why),
       "two reshards into one --out: one commits, the other is refused naming --out",
       str(res))
    m2 = json.load(open(os.path.join(step_dir(out2, 8), "manifest.json")))
    ok(won and verify(step_dir(out2, 8)) and m2["layout"]["dp"] == (300, 3)[won[0]] and
       not [n for n in os.listdir(out2) if n.startswith(".step_")],
       "two reshards into one --out: the winner's commit is whole, no staging left",
       f"{m2['layout']} {os.listdir(out2)}")
    rm = ws.path("reshard_resume.jsonl")
    r = run(ws, ws.train_args("--steps", "16", "--resume", step_dir(out, 8), "--metrics", rm))
    err = rel_err(losses(ref_m)[8:], losses(rm))
    ok(r.returncode == 0 and resumed_at(r.stderr) == 8 and err <= 1e-5,
       f"resume from the dp2 layout on one process (rel {err:.1e})", r.stderr)
    test_latest(ws, c, ref_m)


def test_latest(ws, c, ref_m):
    """DIR/latest, the pointer file, stands for the commit it names wherever
    a checkpoint is taken; a latest file that names no commit is refused."""
    latest = os.path.join(c, "latest")
    r = subprocess.run([BIN, "ckpt", "verify", latest], capture_output=True, text=True)
    ok(r.returncode == 0 and r.stdout.strip() == f"{step_dir(c, 16)}: ok",
       "verify DIR/latest: the commit it names", r.stdout + r.stderr)
    r = subprocess.run([BIN, "ckpt", "inspect", latest], capture_output=True, text=True)
    ok(r.returncode == 0 and "step       16" in r.stdout, "inspect DIR/latest", r.stdout + r.stderr)
    r = subprocess.run([BIN, "sample", "--weights", latest, "--tokens", "4", "--prompt", "In"],
                       capture_output=True, text=True)
    ok(r.returncode == 0, "sample --weights DIR/latest", r.stderr)
    rm = ws.path("latest_resume.jsonl")
    r = run(ws, ws.train_args("--steps", "18", "--resume", latest, "--metrics", rm))
    ok(r.returncode == 0 and resumed_at(r.stderr) == 16, "train --resume DIR/latest", r.stderr)
    bad = ws.path("badlatest")
    os.makedirs(bad)
    shutil.copytree(step_dir(c, 16), step_dir(bad, 16))
    for text in ("step_00000099\n", "step_16; rm -rf /\n", "../step_00000016\n"):
        open(os.path.join(bad, "latest"), "w").write(text)
        r = subprocess.run([BIN, "ckpt", "verify", os.path.join(bad, "latest")],
                           capture_output=True, text=True)
        ok(r.returncode != 0 and "is a file, not a checkpoint" in r.stderr,
           f"a latest file that names no commit ({text.strip()!r}) is refused", r.stderr)


def test_sigterm(ws):
    """A real SIGTERM in the middle of a long run: the step ends, the final
    checkpoint commits, exit 0; the resume continues from there."""
    c, m = ws.path("sig_ckpt"), ws.path("sig.jsonl")
    p = subprocess.Popen([BIN, *ws.train_args("--steps", "1000000", "--lr-schedule", "constant",
                                              "--ckpt-dir", c, "--ckpt-every", "1000000",
                                              "--metrics", m)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ws.env)
    t0 = time.time()
    while time.time() - t0 < 60 and len(losses(m)) < 20:
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    n = len(losses(m))
    ok(p.returncode == 0 and "interrupted" in err and verify(step_dir(c, n)),
       f"SIGTERM: final checkpoint of step {n} committed, exit 0", err[-2000:])
    r = run(ws, ws.train_args("--steps", str(n + 3), "--lr-schedule", "constant", "--ckpt-dir", c,
                              "--resume", "auto", "--metrics", ws.path("sig2.jsonl")))
    ok(r.returncode == 0 and resumed_at(r.stderr) == n and len(losses(ws.path("sig2.jsonl"))) == 3,
       "the resumed run continues at that step", r.stderr)


def check_ckpt_lines(m, c, want, t0, t1, what):
    """The commit lines of metrics file m: exactly the steps `want`, in that
    order, each once, with the fields of docs/formats.md, its bytes the sum
    of the shard files of c/step_N on disk (and in its manifest), stall and
    persist times >= 0, committed between t0 and t1, after its step's line."""
    lines = [json.loads(l) for l in open(m)] if os.path.exists(m) else []
    got = ckpt_lines(m)
    ok([g["step"] for g in got] == want, f"{what}: one ckpt line per commit, in step order",
       json.dumps(got))
    ok(all(list(g) == ["type", "step", "bytes", "stall_ms", "persist_ms", "wall"] for g in got),
       f"{what}: ckpt line fields", json.dumps(got[:1]))
    for g in got:
        disk, listed = shard_sizes(c, g["step"])
        ok(g["bytes"] > 0 and g["bytes"] == sum(disk.values()) == sum(listed.values()) and disk,
           f"{what}: step {g['step']}: bytes = the shard files on disk",
           f"{g} vs {disk} / {listed}")
        ok(g["persist_ms"] >= 0 and g["stall_ms"] is not None and g["stall_ms"] >= 0,
           f"{what}: step {g['step']}: stall and persist times", str(g))
        ok(t0 <= g["wall"] <= t1, f"{what}: step {g['step']}: wall is the commit's time",
           f"{t0} <= {g['wall']} <= {t1}")
        at = [i for i, o in enumerate(lines) if "loss" in o and o["step"] == g["step"]]
        ok(len(at) == 1 and lines.index(g) > at[0],
           f"{what}: step {g['step']}: the ckpt line follows its step's line", str(at))
    ok(all(a["wall"] <= b["wall"] for a, b in zip(got, got[1:])), f"{what}: walls in order",
       json.dumps(got))


def test_metrics_ckpt_lines(ws):
    """--ckpt-every 5 --steps 12: a ckpt line per commit the log reports
    (a checkpoint due while the one before is still queued for stage 2 is
    not taken), the final 12 among them; with every checkpoint
    persisted in order (an armed fault that never fires), exactly 5, 10 and
    12.  Stopped at 7 and resumed from the commit of 5: the ckpt line of 7
    is dropped with the step lines after 5, then 10 and 12 follow."""
    c, m = ws.path("ml_ckpt"), ws.path("ml.jsonl")
    t0 = time.time()
    r = run(ws, ws.train_args("--steps", "12", "--ckpt-dir", c, "--ckpt-every", "5",
                              "--metrics", m))
    want = committed_steps(r.stderr)
    ok(r.returncode == 0 and want[-1:] == [12] and set(want) <= {5, 10, 12},
       "metrics ckpt lines: the run commits the final checkpoint", r.stderr)
    check_ckpt_lines(m, c, want, t0, time.time(), "ckpt-every 5, 12 steps")
    c, m = ws.path("ml_ord_ckpt"), ws.path("ml_ord.jsonl")
    t0 = time.time()
    r = run(ws, ws.train_args("--steps", "12", "--ckpt-dir", c, "--ckpt-every", "5",
                              "--metrics", m), fault="signal:term@1000")
    ok(r.returncode == 0 and committed_steps(r.stderr) == [5, 10, 12],
       "metrics ckpt lines: persisted in order, three commits", r.stderr)
    check_ckpt_lines(m, c, [5, 10, 12], t0, time.time(), "in order, 12 steps")

    c2, m2 = ws.path("ml2_ckpt"), ws.path("ml2.jsonl")
    t0 = time.time()
    keep = ["--ckpt-keep", "4"]  # 5, 7, 10, 12 all stay, to compare with the lines
    r = run(ws, ws.train_args("--steps", "12", "--ckpt-dir", c2, "--ckpt-every", "5", *keep,
                              "--metrics", m2), fault="signal:term@7")
    ok(r.returncode == 0 and [g["step"] for g in ckpt_lines(m2)] == [5, 7],
       "stopped at 7: the lines of 5 and of the final 7", r.stderr + str(ckpt_lines(m2)))
    r = run(ws, ws.train_args("--steps", "12", "--ckpt-dir", c2, "--ckpt-every", "5", *keep,
                              "--resume", step_dir(c2, 5), "--metrics", m2),
            fault="signal:term@1000")
    ok(r.returncode == 0 and resumed_at(r.stderr) == 5, "resumed from the commit of 5", r.stderr)
    steps = [o["step"] for o in map(json.loads, open(m2)) if "loss" in o]
    ok(steps == list(range(1, 13)), "the resumed metrics hold each step once", str(steps))
    check_ckpt_lines(m2, c2, [5, 10, 12], t0, time.time(), "resumed at 5")


def test_every_min(ws):
    c = ws.path("min_ckpt")
    r = run(ws, ws.train_args("--steps", "30", "--ckpt-dir", c, "--ckpt-every-min", "0.00002"))
    ok(r.returncode == 0 and r.stderr.count("stage 1 copied") >= 3,
       "--ckpt-every-min: checkpoints by time", r.stderr)


def test_shm_orphans(ws):
    """A run killed mid-persist leaves its two slots; once its directory is
    deleted nothing reaches them: `ckpt shm-orphans` lists them, --remove 1
    removes them, except one that a live process holds (here a shared flock,
    as a running trainer holds its slots); the next run warns about them."""
    shm = os.path.join(ws.shm, "orphans")  # a private snapshot directory
    os.mkdir(shm)
    env = dict(ws.env, MS_CKPT_SHM_DIR=shm)
    root = ws.path("orphans_run")
    r = run(ws, ws.train_args("--steps", "10", "--ckpt-dir", root, "--ckpt-every", "5"),
            fault="stage2:start@10", env=env)
    slots = sorted(os.path.join(shm, n) for n in os.listdir(shm))
    ok(r.returncode == -9 and len(slots) == 2, "orphans: a killed run leaves its two slots",
       r.stderr + str(slots))

    def orphans(*extra):
        return subprocess.run([BIN, "ckpt", "shm-orphans", *extra], capture_output=True,
                              text=True, env=env)

    r = orphans("--remove", "1")
    ok(r.returncode == 0 and "no orphaned snapshots" in r.stdout and
       all(os.path.exists(p) for p in slots), "orphans: none while the directory exists",
       r.stdout + r.stderr)
    shutil.rmtree(root)
    r = orphans()
    ok(r.returncode == 0 and all(f"orphan   {p}" in r.stdout for p in slots) and
       f"{os.path.realpath(root)} is gone" in r.stdout and "2 orphaned snapshot(s)" in r.stdout and
       all(os.path.exists(p) for p in slots), "orphans: listed (directory gone), not removed",
       r.stdout + r.stderr)
    fd = os.open(slots[0], os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        r = orphans("--remove", "1")
        ok(r.returncode == 0 and f"removed  {slots[1]}" in r.stdout and
           f"held     {slots[0]}" in r.stdout and os.path.exists(slots[0]) and
           not os.path.exists(slots[1]), "orphans: removed, except the one a process holds",
           r.stdout + r.stderr)
    finally:
        os.close(fd)
    r = run(ws, ws.train_args("--steps", "1", "--ckpt-dir", ws.path("orphans_next")), env=env)
    ok(r.returncode == 0 and "1 snapshot(s) in " + shm in r.stderr and
       "belong to checkpoint directories that are gone" in r.stderr and
       "megascale ckpt shm-orphans --remove 1" in r.stderr,
       "orphans: the next run warns about them", r.stderr)
    r = orphans("--remove", "1")
    ok(r.returncode == 0 and f"removed  {slots[0]}" in r.stdout and os.listdir(shm) == [],
       "orphans: the last one removed once nobody holds it", r.stdout + str(os.listdir(shm)))
    r = orphans(shm)
    ok(r.returncode == 2 and "takes no PATH" in r.stderr, "orphans: a PATH is refused", r.stderr)
    # a run killed while it persisted step 10 (step 5 committed): its step-10
    # snapshot is the only copy of that state; `ckpt shm --remove 1` keeps it
    # (it was removed without a word), --force 1 removes it
    shm2 = os.path.join(ws.shm, "newer")
    os.mkdir(shm2)
    env2 = dict(ws.env, MS_CKPT_SHM_DIR=shm2)
    root2 = ws.path("newer_run")
    r = run(ws, ws.train_args("--steps", "10", "--ckpt-dir", root2, "--ckpt-every", "5"),
            fault="stage2:start@10", env=env2)
    r = subprocess.run([BIN, "ckpt", "shm", root2, "--remove", "1"], capture_output=True,
                       text=True, env=env2)
    left = os.listdir(shm2)
    ok(r.returncode == 0 and "step 10 is newer than every commit (the newest is step 5)" in r.stdout
       and len(left) == 1, "ckpt shm --remove 1 keeps a snapshot newer than every commit",
       r.stdout + r.stderr + str(left))
    r = subprocess.run([BIN, "ckpt", "shm", root2, "--remove", "1", "--force", "1"],
                       capture_output=True, text=True, env=env2)
    ok(r.returncode == 0 and os.listdir(shm2) == [], "... --force 1 removes it",
       r.stdout + r.stderr)
    # a FIFO of a snapshot's name (anyone may make one in /dev/shm), a FIFO as a
    # checkpoint directory's latest and job: each hung its reader for ever (the
    # open of a FIFO without a writer), `train` at start-up too (its scan)
    fifo = os.path.join(shm, "megascale-ckpt-0000000000000000-r00000-s0")
    os.mkfifo(fifo)
    croot = ws.path("fifo_run")

    def no_hang(args, what, env=env):
        try:
            return subprocess.run([BIN, *args], capture_output=True, text=True, env=env,
                                  timeout=60)
        except subprocess.TimeoutExpired:
            ok(False, f"{what}: no hang")
            return None

    r = no_hang(["ckpt", "shm-orphans", "--remove", "1"], "orphans with a FIFO")
    ok(r is not None and r.returncode == 0 and os.path.exists(fifo) and
       f"kept     {fifo}  (a FIFO, not a snapshot)" in r.stdout,
       "orphans: a FIFO of a snapshot's name is no snapshot, kept and said, no hang",
       r.stdout + r.stderr if r else "")
    # a link and a file of junk of a snapshot's name: kept and said (the link was skipped
    # unsaid, the junk called "format version 0 ... an older format")
    link, junk = (os.path.join(shm, f"megascale-ckpt-000000000000000{i}-r00000-s0")
                  for i in (1, 2))
    os.symlink("/etc/passwd", link)
    open(junk, "w").write("junk\n")
    r = no_hang(["ckpt", "shm-orphans", "--remove", "1"], "orphans with a link and junk")
    ok(r is not None and r.returncode == 0 and os.path.islink(link) and os.path.exists(junk) and
       f"kept     {link}  (a symbolic link, not a snapshot)" in r.stdout and
       f"unknown  {junk}  (not a snapshot: shorter than a snapshot's header; kept)" in r.stdout
       and "older format" not in r.stdout, "orphans: a link and junk are kept and said",
       r.stdout + r.stderr if r else "")
    os.remove(link)
    os.remove(junk)
    r = no_hang(ws.train_args("--steps", "2", "--ckpt-dir", croot, "--ckpt-every", "1"),
                "train beside a FIFO")
    ok(r is not None and r.returncode == 0, "train starts beside the FIFO",
       r.stderr[-1500:] if r else "")
    for name in ("latest", "job"):
        os.remove(os.path.join(croot, name))
        os.mkfifo(os.path.join(croot, name))
    r = no_hang(["ckpt", "list", croot], "ckpt list with FIFOs")
    ok(r is not None and r.returncode == 0 and "step_00000002" in r.stdout,
       "ckpt list: a FIFO as latest or job does not hang", r.stdout + r.stderr if r else "")
    r = no_hang(["ckpt", "shm", croot, "--remove", "1"], "ckpt shm with FIFOs")
    ok(r is not None and r.returncode in (0, 3) and os.path.exists(fifo),
       "ckpt shm: a FIFO as job does not hang; the FIFO in shm is kept",
       r.stdout + r.stderr if r else "")
    os.remove(fifo)


def test_errors(ws, c):
    r = run(ws, ws.train_args("--steps", "2", "--resume", "auto"))
    ok(r.returncode == 2 and "--resume auto needs --ckpt-dir" in r.stderr,
       "--resume auto without --ckpt-dir", r.stderr)
    r = run(ws, ws.train_args("--steps", "2", "--resume", ws.path("nothing")))
    ok(r.returncode != 0 and "No such file or directory" in r.stderr and "nothing" in r.stderr,
       "--resume of a path that does not exist is named", r.stderr)
    os.makedirs(ws.path("empty"))
    r = run(ws, ws.train_args("--steps", "2", "--resume", ws.path("empty")))
    ok(r.returncode != 0 and "neither a checkpoint" in r.stderr and "empty" in r.stderr,
       "--resume of a directory without checkpoints is named", r.stderr)
    r = run(ws, ["train", "--train-data", ws.shard, "--dim", "64", "--vocab", "256", "--layers",
                 "2", "--heads", "2", "--seq-max", "32", "--seq", "16", "--batch", "4", "--steps",
                 "2", "--threads", "1", "--resume", c])
    ok(r.returncode != 0 and "holds another model" in r.stderr and "dim 32" in r.stderr,
       "resuming another model names both", r.stderr)
    r = run(ws, ws.train_args("--steps", "2", "--ckpt-dir", ws.path("x")), fault="stage9:boom")
    ok(r.returncode != 0 and "stage9:boom" in r.stderr, "a bad MS_CKPT_FAULT is named", r.stderr)
    r = subprocess.run([BIN, "ckpt", "verify", ws.dir], capture_output=True, text=True)
    ok(r.returncode != 0 and "no checkpoints" in r.stderr, "verify of a directory without any",
       r.stderr)
    r = subprocess.run([BIN, "ckpt", "frobnicate", c], capture_output=True, text=True)
    ok(r.returncode == 2 and "unknown ckpt command" in r.stderr, "unknown ckpt command", r.stderr)


def main():
    ws = Workspace("ms_ckpt_cli_")
    try:
        # the default snapshot directory (/dev/shm) for this one
        env = dict(ws.env)
        env.pop("MS_CKPT_SHM_DIR")
        c = bitwise_case(ws, "adamw_shuffle", [], shm_env=env)
        bitwise_case(ws, "lamb_seq_accum", ["--optimizer", "lamb", "--lr", "2e-2", "--data-order",
                                            "sequential", "--micro-batch", "2"])
        r = subprocess.run([BIN, "ckpt", "shm", c], capture_output=True, text=True)
        ok("no host-memory snapshots of" in r.stdout, "/dev/shm is clean after a finished run", r.stdout)
        test_manifest(ws, c)
        test_tools(ws, c, ws.path("adamw_shuffle_b.st"), ws.path("adamw_shuffle_ref.jsonl"))
        test_sigterm(ws)
        test_metrics_ckpt_lines(ws)
        test_every_min(ws)
        test_shm_orphans(ws)
        test_errors(ws, c)
    finally:
        ws.close()
    sys.exit(summary())


if __name__ == "__main__":
    main()
