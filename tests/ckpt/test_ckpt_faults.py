"""Checkpoint faults, each its own case (label faults), on one process with
MS_CKPT_FAULT (src/ckpt/ckpt_fault.c):
 - kill -9 in stage 1 (mid-copy) and at five points of stage 2 (before the
   shard, half a shard written, after the shard, after the manifest, after
   the commit rename): the commit before survives, no damaged directory
   is loaded, the run resumes from the newest complete /dev/shm snapshot
   (or, without it, from the newest commit) and continues bit for bit;
 - a truncated shard, one flipped bit in a shard, a missing manifest, a
   manifest from another step, a manifest whose model contradicts its
   tensors, a slice range outside its box, a one-character edit of the
   manifest's opt_steps or data cursor (its manifest_crc32c fails; verify
   and load share one validation): the loader names the file (and tensor),
   falls back to the previous commit and the run continues bit for bit; a
   commit of format version 1 (no manifest checksum) still verifies, says
   so, and loads;
 - a fresh start in a directory with no commits but an earlier run's
   snapshot (killed before its first commit) is refused, naming it, unless
   --new-run, which disowns it: a later --resume auto continues the new
   run, not the earlier one;
 - a snapshot damaged in /dev/shm (one byte of its data flipped after a
   killed run; the fault stage2:flip-shm before a persist): the resume
   warns naming the slot file and takes the commit instead (final weights
   and the commits it makes equal to a clean resume from that commit), the
   persist fails naming the slot and leaves the commits as they were;
 - a full or failing disk: injected ENOSPC / EIO on the shard's and the
   manifest's write and fsync (training goes on, nothing is committed for
   that step, nothing older is touched), the same on the final checkpoint
   (non-zero exit, resume from the previous commit), and a real ENOSPC on a
   600 KB tmpfs when this process may mount one;
 - a disk slower than the checkpoint interval (stage2:slow on every persist):
   every due checkpoint is taken and commits, training waits for the disk
   and says so, and a crash restarts at the last due checkpoint (at most
   --ckpt-every steps redone), bit for bit.
Environment: MS_BIN."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

from ckpt_common import (BIN, Workspace, committed_steps, flip_snapshot_byte, losses,
                         manifest_reseal, manifest_to_v1, nan_snapshot_word, ok, resumed_at, run,
                         sha, slots, step_dir, summary, tree, verify)


def leftovers(root):
    return [n for n in os.listdir(root) if n.startswith(".step_")]


def continue_case(ws, label, root, ref_m, ref_w, expect, steps="20", must=None, extra=()):
    """Resume in root; the run must start at `expect` and match the reference."""
    m, w = ws.path("cont.jsonl"), ws.path("cont.st")
    for f in (m, w):
        if os.path.exists(f):
            os.remove(f)
    r = run(ws, ws.train_args("--steps", steps, "--ckpt-dir", root, "--ckpt-every", "5",
                              "--resume", "auto", "--metrics", m, "--save-weights", w, *extra))
    got = resumed_at(r.stderr)
    ref = losses(ref_m)
    ok(r.returncode == 0 and got == expect, f"{label}: resumes at step {expect} (got {got})",
       r.stderr)
    for needle in must or []:
        ok(needle in r.stderr, f"{label}: the reason is printed ({needle})", r.stderr)
    ok(got is not None and losses(m) == ref[got:] and sha(w) == sha(ref_w),
       f"{label}: continues bit for bit", f"{ref}\n{losses(m)}")
    return r


def kill_cases(ws, ref_m, ref_w):
    points = [("stage1:mid", 5), ("stage2:start", 10), ("stage2:mid-shard", 10),
              ("stage2:after-shard", 10), ("stage2:after-manifest", 10),
              ("stage2:after-commit", 10)]
    for point, from_shm in points:
        root = ws.path("kill_" + point.replace(":", "_"))
        r = run(ws, ws.train_args("--steps", "20", "--ckpt-dir", root, "--ckpt-every", "5"),
                fault=f"{point}@10")
        ok(r.returncode == -9 and f"injected fault {point}" in r.stderr,
           f"{point}: the process is killed (-9)", f"rc={r.returncode}\n{r.stderr}")
        committed = point == "stage2:after-commit"
        ok(verify(step_dir(root, 5)), f"{point}: the previous commit (step 5) is intact")
        ok(os.path.isdir(step_dir(root, 10)) == committed and
           (not committed or verify(step_dir(root, 10))),
           f"{point}: step 10 is {'committed' if committed else 'not a commit'}",
           str(os.listdir(root)))
        # a copy has no snapshots in /dev/shm (they are keyed by the directory): commits only
        copy = root + "_noshm"
        shutil.copytree(root, copy)
        continue_case(ws, f"{point} (no snapshot)", copy, ref_m, ref_w, 10 if committed else 5)
        must = ["incomplete snapshot of step 10"] if point == "stage1:mid" else None
        continue_case(ws, f"{point} (snapshot)", root, ref_m, ref_w, from_shm, must=must)
        if from_shm == 10 and not committed:
            ok(verify(step_dir(root, 10)) or verify(step_dir(root, 20)),
               f"{point}: the resumed snapshot is persisted")
    # killed between checkpoints, before the second slot was ever filled:
    # the empty slot is passed over without a warning
    root = ws.path("kill_between")
    r = run(ws, ws.train_args("--steps", "20", "--ckpt-dir", root, "--ckpt-every", "5"),
            fault="kill@7")
    ok(r.returncode == -9, "killed at step 7", f"rc={r.returncode}\n{r.stderr}")
    r = continue_case(ws, "killed at step 7", root, ref_m, ref_w, 5)
    ok("empty snapshot slot" not in r.stderr and "resume: ignoring" not in r.stderr,
       "killed at step 7: the slot never filled is passed over silently", r.stderr)


def damage_cases(ws, ref_m, ref_w):
    # every due checkpoint is taken, however slow stage 2 is (slow_disk_case)
    pristine = ws.path("pristine")
    r = run(ws, ws.train_args("--steps", "10", "--ckpt-dir", pristine, "--ckpt-every", "5"))
    ok(r.returncode == 0 and verify(step_dir(pristine, 5)) and verify(step_dir(pristine, 10)),
       "two commits to damage", r.stderr)
    shard = "shard-00000-of-00001.safetensors"

    def truncate(d):
        p = os.path.join(d, shard)
        os.truncate(p, os.path.getsize(p) - 1000)

    def flip(d):
        p = os.path.join(d, shard)
        with open(p, "r+b") as f:
            f.seek(os.path.getsize(p) - 4096)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0x04]))

    def no_manifest(d):
        os.remove(os.path.join(d, "manifest.json"))

    def other_step(d):
        shutil.copy(os.path.join(os.path.dirname(d), "step_00000005", "manifest.json"),
                    os.path.join(d, "manifest.json"))

    def edit_manifest(d, edit):  # on purpose: resealed, to reach the checks behind the checksum
        p = os.path.join(d, "manifest.json")
        m = json.load(open(p))
        edit(m)
        json.dump(m, open(p, "w"))
        manifest_reseal(p)

    def edit_digit(d, field):  # one character, as a hand edit would (not resealed)
        p = os.path.join(d, "manifest.json")
        text = open(p).read()
        at = text.index(f'"{field}":\t') + len(f'"{field}":\t')
        open(p, "w").write(text[:at] + str((int(text[at]) + 1) % 10) + text[at + 1:])

    def huge_manifest(d):  # 8 GB (sparse): refused from its size, not read into memory
        os.truncate(os.path.join(d, "manifest.json"), 8 << 30)

    def opt_steps_edited(d):  # 10 -> 20
        edit_digit(d, "opt_steps")

    def cursor_edited(d):  # the data cursor's position
        edit_digit(d, "pos")

    def model_contradicts(d):  # the tensors are vocab 256's
        edit_manifest(d, lambda m: m["model"].update(vocab_size=300))

    def box_too_small(d):  # ln_f.bias's range [0, 32) in a box of 16
        edit_manifest(d, lambda m: next(s for s in m["slices"] if s["tensor"] == "ln_f.bias"
                                        and s["state"] == "param").update(shape=[16]))

    # values no trainer writes (resealed: a buggy writer or a hand edit with its checksum
    # redone): verified as ok before, and resume advised --data-order random, itself refused
    def unknown_order(d):
        edit_manifest(d, lambda m: m["trainer"]["data"].update(order="random"))

    def beta1_out_of_range(d):
        edit_manifest(d, lambda m: m["trainer"]["optimizer"].update(beta1=7))

    def unknown_optimizer(d):
        edit_manifest(d, lambda m: m.update(optimizer="sgd"))

    cases = [("truncated shard", truncate, [shard, "truncated"]),
             ("flipped bit", flip, [shard, "CRC32C", "tensor '"]),
             ("missing manifest", no_manifest, ["no manifest.json"]),
             ("huge manifest", huge_manifest, ["manifest.json: larger than a manifest of 1 "
                                               "shard file(s) can be"]),
             ("manifest of another step", other_step, ["holds step 5, but the directory is step 10"]),
             # what loading rejects, verify rejects too, and resume falls back
             ("model contradicting its tensors", model_contradicts, ["but its model", "vocab 300"]),
             ("slice range outside its box", box_too_small, ["ln_f.bias", "outside its box of 16"]),
             ("opt_steps edited", opt_steps_edited, ["manifest.json", "manifest_crc32c says"]),
             ("data cursor edited", cursor_edited, ["manifest.json", "manifest_crc32c says"]),
             ("unknown data order", unknown_order, ["trainer data", "unknown data order "
                                                    "'random'"]),
             ("beta1 out of range", beta1_out_of_range, ["trainer optimizer: beta1 7"]),
             ("unknown optimizer", unknown_optimizer, ["optimizer", "unknown optimizer 'sgd'"])]
    for label, damage, needles in cases:
        root = ws.path("damage_" + label.replace(" ", "_"))
        shutil.copytree(pristine, root)
        damage(step_dir(root, 10))
        r = subprocess.run([BIN, "ckpt", "verify",
                            step_dir(root, 10)], capture_output=True, text=True)
        ok(r.returncode != 0 and all(n in r.stderr for n in needles),
           f"{label}: verify names it", r.stderr)
        continue_case(ws, label, root, ref_m, ref_w, 5, steps="10",
                      must=["step_00000010 is not usable"] + needles)
        ok(verify(step_dir(root, 5)), f"{label}: the older commit is untouched")
    # the same-step commit replaces the damaged step 10 where the file system has no
    # atomic exchange (RENAME_EXCHANGE fails with EINVAL on NFS; before, every later commit of
    # that step failed): the older directory is moved aside, the new one takes its name
    root = ws.path("damage_noexchange")
    shutil.copytree(pristine, root)
    flip(step_dir(root, 10))
    r = continue_case(ws, "no atomic exchange", root, ref_m, ref_w, 5, steps="10",
                      extra=("--ckpt-fault", "io:noexchange@10"),
                      must=["the older one was moved aside first"])
    ok(r.returncode == 0 and verify(step_dir(root, 10)) and
       not [n for n in os.listdir(root) if n.startswith(".step_")],
       "no atomic exchange: step 10 committed and verifies, nothing hidden is left",
       str(os.listdir(root)) + r.stderr[-1500:])
    # a commit written before manifests had a checksum (format version 1) still loads
    root = ws.path("damage_version1")
    shutil.copytree(pristine, root)
    shutil.rmtree(step_dir(root, 10))
    manifest_to_v1(os.path.join(step_dir(root, 5), "manifest.json"))
    r = subprocess.run([BIN, "ckpt", "verify", step_dir(root, 5)], capture_output=True,
                       text=True)
    ok(r.returncode == 0 and "format version 1" in r.stdout and "checksum" in r.stdout,
       "version 1: verify passes and says the manifest has no checksum", r.stdout + r.stderr)
    continue_case(ws, "version 1", root, ref_m, ref_w, 5, steps="10")


def io_cases(ws, ref20_m, ref20_w, ref10_m, ref10_w):
    for point, msg in [("io:enospc-shard", "No space left on device"),
                       ("io:eio-fsync-shard", "Input/output error"),
                       ("io:enospc-manifest", "No space left on device"),
                       ("io:eio-fsync-manifest", "Input/output error")]:
        root = ws.path(point.replace(":", "_"))
        m = ws.path("io.jsonl")
        r = run(ws, ws.train_args("--steps", "20", "--ckpt-dir", root, "--ckpt-every", "5",
                                  "--metrics", m), fault=f"{point}@10")
        ok(r.returncode == 0 and "step 10 was NOT committed" in r.stderr and msg in r.stderr,
           f"{point}: reported, training goes on", r.stderr)
        ok(losses(m) == losses(ref20_m), f"{point}: training is unaffected")
        ok(not os.path.exists(step_dir(root, 10)) and not leftovers(root) and
           all(verify(step_dir(root, s)) for s in (5, 15, 20)),
           f"{point}: no step 10, no leftovers, the other commits valid", str(os.listdir(root)))
    # the directory's fsync after the commit rename fails: the commit stands (it was reported
    # "NOT committed" while step_10 was in place), with a warning, and the run is unaffected
    root = ws.path("io_eio_fsync_commit")
    m = ws.path("io.jsonl")
    r = run(ws, ws.train_args("--steps", "20", "--ckpt-dir", root, "--ckpt-every", "5",
                              "--metrics", m), fault="io:eio-fsync-commit@10")
    ok(r.returncode == 0 and "step 10 is committed" in r.stderr and
       "Input/output error" in r.stderr and "NOT committed" not in r.stderr,
       "io:eio-fsync-commit: the commit stands, with a warning", r.stderr)
    ok(losses(m) == losses(ref20_m) and not leftovers(root) and
       all(verify(step_dir(root, s)) for s in (10, 15, 20)),
       "io:eio-fsync-commit: training unaffected, step 10 committed", str(os.listdir(root)))
    # the final checkpoint fails: exit non-zero, the previous commit stays
    root = ws.path("final_eio")
    r = run(ws, ws.train_args("--steps", "10", "--ckpt-dir", root, "--ckpt-every", "5"),
            fault="io:eio-fsync-shard@10")
    ok(r.returncode == 4 and "the last checkpoint (step 10) was not committed" in r.stderr,
       "a failed final checkpoint is an error", r.stderr)
    ok(verify(step_dir(root, 5)) and not os.path.exists(step_dir(root, 10)),
       "final failure: step 5 intact, no step 10")
    copy = root + "_noshm"
    shutil.copytree(root, copy)
    continue_case(ws, "after a failed final checkpoint (no snapshot)", copy, ref10_m, ref10_w, 5,
                  steps="10")
    continue_case(ws, "after a failed final checkpoint (snapshot)", root, ref10_m, ref10_w, 10,
                  steps="10")
    ok(verify(step_dir(root, 10)), "the snapshot is persisted after the resume")


SHARD = "shard-00000-of-00001.safetensors"


def shm_damage_cases(ws, ref20_m, ref20_w, ref10_m, ref10_w):
    # (a) a run killed before the persist of step 10 leaves a complete
    # snapshot of step 10 (newer than the commit of step 5); one byte of it
    # flipped in /dev/shm: the resume must not use it
    root = ws.path("shm_flip")
    r = run(ws, ws.train_args("--steps", "20", "--ckpt-dir", root, "--ckpt-every", "5"),
            fault="stage2:start@10")
    ok(r.returncode == -9 and verify(step_dir(root, 5)), "shm flip: killed before persisting 10",
       r.stderr)
    clean = root + "_clean"  # the same commits, no snapshot: a clean resume from step 5
    shutil.copytree(root, clean)
    s10 = [p for p, (step, complete) in slots(ws.shm, root).items() if step == 10 and complete]
    ok(len(s10) == 1, "shm flip: one complete snapshot of step 10", str(slots(ws.shm, root)))
    if len(s10) != 1:
        return
    flip_snapshot_byte(s10[0])
    r = subprocess.run([BIN, "ckpt", "shm", root], capture_output=True, text=True, env=ws.env)
    ok(r.returncode == 0 and "fails its data CRC" in r.stdout and s10[0] in r.stdout,
       "shm flip: `ckpt shm` shows the snapshot as damaged", r.stdout + r.stderr)
    continue_case(ws, "clean resume from the commit", clean, ref20_m, ref20_w, 5)
    clean_w = sha(ws.path("cont.st"))
    continue_case(ws, "resume past a damaged snapshot", root, ref20_m, ref20_w, 5,
                  must=["resume: not resuming from " + s10[0], "fails its data CRC"])
    ok(sha(ws.path("cont.st")) == clean_w, "shm flip: final weights equal the clean resume's")
    # (a2) the same damage as a NaN over a weight: named as damage by the data CRC (it was
    # said as weights an update made NaN or Inf)
    nroot = ws.path("shm_nan")
    r = run(ws, ws.train_args("--steps", "20", "--ckpt-dir", nroot, "--ckpt-every", "5"),
            fault="stage2:start@10")
    n10 = [p for p, (step, complete) in slots(ws.shm, nroot).items() if step == 10 and complete]
    ok(r.returncode == -9 and len(n10) == 1, "shm nan: killed before persisting 10", r.stderr)
    if len(n10) == 1:
        nan_snapshot_word(n10[0])
        continue_case(ws, "resume past a snapshot damaged into a NaN", nroot, ref20_m, ref20_w, 5,
                      must=["fails its data CRC (damaged in host memory: its weights read NaN"])
    # what the resumed run committed is what the clean one did (which steps
    # are committed besides the final one depends on timing: superseded
    # snapshots), so no damaged data became a commit
    steps = [s for s in (10, 15, 20) if os.path.isdir(step_dir(root, s))]
    ok(20 in steps and all(verify(step_dir(root, s)) for s in steps),
       "shm flip: the resumed run's commits are valid", str(os.listdir(root)))
    for step in steps:
        if os.path.isdir(step_dir(clean, step)):
            ok(sha(os.path.join(step_dir(root, step), SHARD)) ==
               sha(os.path.join(step_dir(clean, step), SHARD)),
               f"shm flip: commit {step} equals the clean resume's")

    # (b) stage2:flip-shm: a bit of the snapshot flipped in /dev/shm after
    # stage 1, before its persist: that persist fails, training goes on
    root = ws.path("persist_flip")
    m = ws.path("persist_flip.jsonl")
    r = run(ws, ws.train_args("--steps", "20", "--ckpt-dir", root, "--ckpt-every", "5",
                              "--metrics", m), fault="stage2:flip-shm@10")
    named = [l for l in r.stderr.splitlines() if "step 10 was NOT committed" in l]
    ok(r.returncode == 0 and len(named) == 1 and "fails its data CRC" in named[0] and
       ws.shm in named[0] and "megascale-ckpt-" in named[0],
       "persist flip: step 10 is not committed, the slot is named", r.stderr)
    ok(losses(m) == losses(ref20_m), "persist flip: training is unaffected")
    ok(os.path.isdir(root) and not os.path.exists(step_dir(root, 10)) and
       not leftovers(root) and all(verify(step_dir(root, s)) for s in (5, 15, 20)),
       "persist flip: no step 10, no leftovers, the other commits valid",
       str(os.listdir(root) if os.path.isdir(root) else root))
    # the final checkpoint: the commit before stays as it was, byte for byte;
    # the resume afterwards passes over the damaged snapshot
    root = ws.path("final_flip")
    r = run(ws, ws.train_args("--steps", "10", "--ckpt-dir", root, "--ckpt-every", "5"),
            fault="signal:term@5")
    ok(r.returncode == 0 and verify(step_dir(root, 5)), "final flip: commit of step 5", r.stderr)
    before, latest = tree(step_dir(root, 5)), sha(os.path.join(root, "latest"))
    r = run(ws, ws.train_args("--steps", "10", "--ckpt-dir", root, "--ckpt-every", "5",
                              "--resume", "auto"), fault="stage2:flip-shm@10")
    ok(r.returncode == 3 and "the last checkpoint (step 10) was not committed" in r.stderr and
       "fails its data CRC" in r.stderr, "final flip: a failed final checkpoint is an error (3)",
       r.stderr)
    ok(tree(step_dir(root, 5)) == before and not os.path.exists(step_dir(root, 10)) and
       not leftovers(root) and sha(os.path.join(root, "latest")) == latest,
       "final flip: step 5 as it was, no step 10, latest unchanged", str(os.listdir(root)))
    continue_case(ws, "after a damaged final snapshot", root, ref10_m, ref10_w, 5, steps="10",
                  must=["resume: not resuming from ", "fails its data CRC"])


def fresh_start_case(ws):
    """Run A dies in its first persist (no commit; its snapshot of step 10
    in slot 0); run B starts fresh there (--seed 7) and dies in its first
    persist (step 5).  --resume auto must continue B from step 5, never A."""
    m7, w7 = ws.path("ref7.jsonl"), ws.path("ref7.st")
    r = run(ws, ws.train_args("--steps", "20", "--seed", "7", "--metrics", m7, "--save-weights",
                              w7))
    ok(r.returncode == 0, "reference run of --seed 7", r.stderr)
    root = ws.path("fresh_over_snapshot")
    r = run(ws, ws.train_args("--steps", "20", "--ckpt-dir", root, "--ckpt-every", "10"),
            fault="stage2:start@10")
    ok(r.returncode == -9 and not any(n.startswith("step_") for n in os.listdir(root)) and
       (10, 1) in slots(ws.shm, root).values(), "run A: killed before its first commit, "
       "its step 10 in host memory", f"{r.stderr}\n{slots(ws.shm, root)}")
    before = slots(ws.shm, root)
    r = run(ws, ws.train_args("--steps", "20", "--seed", "7", "--ckpt-dir", root, "--ckpt-every",
                              "5"))
    ok(r.returncode == 2 and "its earlier run left step 10 in host memory" in r.stderr and
       "pass --resume auto to continue that run, or --new-run" in r.stderr and
       slots(ws.shm, root) == before,
       "run B without --new-run: refused, A's snapshot named and kept (before, it was disowned "
       "with advice to pass --resume auto, which then started from scratch)",
       f"rc={r.returncode}\n{r.stderr}\n{slots(ws.shm, root)}")
    r = run(ws, ws.train_args("--steps", "20", "--seed", "7", "--ckpt-dir", root, "--ckpt-every",
                              "5", "--new-run", "1"), fault="stage2:start@5")
    ok(r.returncode == -9 and "holds step 10 of an earlier run" in r.stderr and
       "this run disowns it" in r.stderr,
       "run B (--new-run): killed in its first persist; A's snapshot is named as disowned",
       r.stderr)
    continue_case(ws, "fresh start over a snapshot", root, m7, w7, 5, extra=("--seed", "7"))


def new_run_over_newer_snapshot_case(ws):
    """--new-run over a run that committed step 5 and died in the persist of step 10 (its
    snapshot the only copy of step 10): the start names that snapshot as disowned (before,
    --new-run moved DIR/job aside first, and the snapshot went unnamed, to be found later as
    "written by another job").  Over a finished run (its snapshot is its last commit's) no
    such warning: a commit holds it."""
    root = ws.path("newrun_over_snapshot")
    r = run(ws, ws.train_args("--steps", "20", "--ckpt-dir", root, "--ckpt-every", "5"),
            fault="stage2:start@10")
    ok(r.returncode == -9 and committed_steps(r.stderr) == [5], "the earlier run: step 5 committed, "
       "killed in the persist of step 10", f"{r.returncode}\n{r.stderr}")
    r = run(ws, ws.train_args("--steps", "2", "--ckpt-dir", root, "--new-run", "1"))
    ok(r.returncode == 0 and "holds step 10 of an earlier run" in r.stderr and
       "this run disowns it" in r.stderr, "--new-run over a snapshot newer than every commit: "
       "named as disowned", r.stderr)
    r = run(ws, ws.train_args("--steps", "2", "--ckpt-dir", root, "--new-run", "1"))
    ok(r.returncode == 0 and "disowns" not in r.stderr,
       "--new-run over a finished run: no snapshot named (its last commit holds it)", r.stderr)


def foreign_resume_missing_case(ws):
    """--resume of another directory's checkpoint that is not there (a typo), into a directory
    that holds a run's commits: an error that names the missing path, with or without
    --new-run, and nothing moved (before, --new-run set the commits aside, then failed, and
    the next --resume auto started from scratch; without it the error said the directory held
    another run's checkpoints and advised --new-run)."""
    root = ws.path("foreign_missing")
    r = run(ws, ws.train_args("--steps", "2", "--ckpt-dir", root, "--ckpt-every", "2"))
    ok(r.returncode == 0 and committed_steps(r.stderr) == [2], "a run commits step 2", r.stderr)
    missing = ws.path("no_such_run") + "/ckpt"
    for extra in ((), ("--new-run", "1")):
        r = run(ws, ws.train_args("--steps", "4", "--ckpt-dir", root, "--resume", missing,
                                  *extra))
        left = sorted(n for n in os.listdir(root) if n.startswith(("step_", "previous")))
        ok(r.returncode != 0 and f"--resume {missing}: No such file or directory" in r.stderr
           and "nothing was moved" in r.stderr and left == ["step_00000002"],
           f"--resume of a missing path{' with --new-run' if extra else ''}: named, nothing "
           "moved", f"rc {r.returncode}, {left}\n{r.stderr[-1500:]}")
    empty = ws.path("empty_dir")
    os.makedirs(empty, exist_ok=True)
    r = run(ws, ws.train_args("--steps", "4", "--ckpt-dir", root, "--resume", empty,
                              "--new-run", "1"))
    left = sorted(n for n in os.listdir(root) if n.startswith(("step_", "previous")))
    ok(r.returncode != 0 and "neither a checkpoint" in r.stderr and left == ["step_00000002"],
       "--new-run --resume of a directory that holds no checkpoint: refused, nothing moved",
       f"rc {r.returncode}, {left}\n{r.stderr[-1500:]}")
    r = run(ws, ws.train_args("--steps", "4", "--ckpt-dir", root, "--resume", "auto"))
    ok(r.returncode == 0 and "step_00000002" in r.stderr and "step     1/" not in r.stderr,
       "then --resume auto continues from its step 2", r.stderr[-1500:])


def slow_disk_case(ws, ref_m, ref_w):
    """Every persist 150 ms slower (stage2:slow), a checkpoint every 2 steps of
    ~1 ms: both /dev/shm slots are soon busy (one persisting, one queued), and a
    checkpoint due then waits for the persist before the queued one.  Before, it
    was skipped (`none taken, the one of step N still waits for stage 2`): 7 of
    the 9 due before step 20 were, and a crash at step 20 restarted from step 4,
    redoing 15 steps for a --ckpt-every of 2."""
    slow = "stage2:slow=150@1+"
    root = ws.path("slow_disk")
    r = run(ws, ws.train_args("--steps", "12", "--ckpt-dir", root, "--ckpt-every", "2",
                              "--ckpt-keep", "10"), fault=slow)
    ok(r.returncode == 0 and committed_steps(r.stderr) == [2, 4, 6, 8, 10, 12] and
       "both snapshot slots were busy" in r.stderr and "none taken" not in r.stderr,
       "slow disk: every due checkpoint commits, in order; the wait is said", r.stderr)
    ok(all(verify(step_dir(root, s)) for s in range(2, 13, 2)), "slow disk: each one verifies")
    root = ws.path("slow_disk_crash")
    r = run(ws, ws.train_args("--steps", "20", "--ckpt-dir", root, "--ckpt-every", "2",
                              "--inject-fault", "kill@20"), fault=slow)
    taken = [int(l.split("checkpoint: step ")[1].split(":")[0]) for l in r.stderr.splitlines()
             if "checkpoint: step " in l and ": stage 1 copied" in l]
    ok(r.returncode == -9 and taken == list(range(2, 20, 2)),
       "slow disk: killed at step 20, every due checkpoint taken before", r.stderr)
    continue_case(ws, "slow disk: the restart", root, ref_m, ref_w, 18)


def tmpfs_case(ws, ref_m, ref_w):
    if os.geteuid() != 0 or not shutil.which("mount"):
        print("SKIP: real full disk (needs root to mount a tmpfs)")
        return
    mnt = tempfile.mkdtemp(prefix="ms_ckpt_full_")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", mnt],
                      capture_output=True).returncode != 0:
        print("SKIP: real full disk (mount -t tmpfs failed)")
        os.rmdir(mnt)
        return
    try:
        root = os.path.join(mnt, "ckpt")
        r = run(ws, ws.train_args("--steps", "20", "--ckpt-dir", root, "--ckpt-every", "5",
                                  "--ckpt-keep", "2"))
        ok(r.returncode == 4 and "No space left on device" in r.stderr and
           "NOT committed" in r.stderr, "a full disk (600 KB tmpfs) is reported", r.stderr)
        # which checkpoints fit depends on which snapshots were superseded
        steps = sorted(int(n[5:]) for n in os.listdir(root) if n.startswith("step_"))
        ok(steps and all(verify(step_dir(root, s)) for s in steps) and not leftovers(root),
           "full disk: the commits that fit are intact, no partial directory",
           str(os.listdir(root)))
        copy = ws.path("full_copy")
        shutil.copytree(root, copy)
        continue_case(ws, "after a full disk", copy, ref_m, ref_w, steps[-1] if steps else -1)
    finally:
        subprocess.run(["umount", mnt])
        os.rmdir(mnt)


def main():
    ws = Workspace("ms_ckpt_faults_")
    try:
        refs = {}
        for n in ("20", "10"):
            m, w = ws.path(f"ref{n}.jsonl"), ws.path(f"ref{n}.st")
            r = run(ws, ws.train_args("--steps", n, "--metrics", m, "--save-weights", w))
            ok(r.returncode == 0, f"reference run of {n} steps", r.stderr)
            refs[n] = (m, w)
        kill_cases(ws, *refs["20"])
        damage_cases(ws, *refs["10"])
        io_cases(ws, *refs["20"], *refs["10"])
        shm_damage_cases(ws, *refs["20"], *refs["10"])
        fresh_start_case(ws)
        new_run_over_newer_snapshot_case(ws)
        foreign_resume_missing_case(ws)
        slow_disk_case(ws, *refs["20"])
        tmpfs_case(ws, *refs["20"])
    finally:
        ws.close()
    sys.exit(summary())


if __name__ == "__main__":
    main()
