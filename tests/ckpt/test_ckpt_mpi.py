"""Checkpoints under mpirun (labels mpi, faults): with --dp 2 (ZeRO-2: each
rank saves its own runs of parameters, m and v), 2N steps straight equal N
steps, a clean stop and N resumed steps bit for bit (losses and final
weights), also when the SIGTERM reaches one rank alone (both ranks stop
after the same step), rank 0's metrics with a line per commit whose bytes are both
ranks' shards together; a commit saved by dp 2 resumes on one process and one saved by
one process resumes on dp 2 (losses within 1e-5 relative); rank 1 killed
after writing its shard: no commit for that step, the survivors resume from
the snapshots both ranks hold in /dev/shm (or, without them, the previous
commit) bit for bit; the same with rank 1's snapshot of that step damaged
in /dev/shm (one byte flipped): rank 1 names it, every rank passes over it
to the commit, bit for bit; rank 0 killed in stage 1: the ranks agree on
the newest snapshot they all hold; a checkpoint every step, faster than
stage 2 persists them: the ranks persist the same steps and every persist
commits.  Environment: MS_BIN."""
import os
import re
import shutil
import subprocess
import sys
import time

from ckpt_common import (BIN, MPIRUN, Workspace, ckpt_lines, committed_steps, flip_snapshot_byte, losses,
                         mpi, ok, rel_err, resumed_at, run, sha, shard_sizes, slots, step_dir,
                         summary, verify)


def main():
    if not MPIRUN:
        print("SKIP: mpirun not found (apt-get install openmpi-bin)")
        sys.exit(77)
    ws = Workspace("ms_ckpt_mpi_")
    try:
        dp2 = ["--dp", "2"]
        ref2_m, ref2_w = ws.path("ref2.jsonl"), ws.path("ref2.st")
        ref1_m = ws.path("ref1.jsonl")
        r = mpi(ws, 2, ws.train_args("--steps", "20", *dp2, "--metrics", ref2_m,
                                     "--save-weights", ref2_w))
        ok(r.returncode == 0, "dp2 straight run", r.stderr)
        r = run(ws, ws.train_args("--steps", "20", "--metrics", ref1_m))
        ok(r.returncode == 0, "dp1 straight run", r.stderr)

        # dp2: stop at 10, resume: bit for bit
        c = ws.path("dp2")
        a_m, b_m, b_w = ws.path("a.jsonl"), ws.path("b.jsonl"), ws.path("b.st")
        r = mpi(ws, 2, ws.train_args("--steps", "20", *dp2, "--ckpt-dir", c, "--ckpt-every", "5",
                                     "--metrics", a_m), fault="signal:term@10")
        ok(r.returncode == 0 and verify(step_dir(c, 10)), "dp2: stop at step 10, committed",
           r.stderr)
        check_ckpt_bytes(a_m, c, [5, 10], "dp2: stopped at 10")  # in order: a fault is armed
        r = mpi(ws, 2, ws.train_args("--steps", "20", *dp2, "--ckpt-dir", c, "--ckpt-every", "5",
                                     "--resume", "auto", "--metrics", b_m, "--save-weights", b_w))
        got = losses(a_m) + losses(b_m)
        ok(r.returncode == 0 and resumed_at(r.stderr) == 10 and got == losses(ref2_m) and
           sha(b_w) == sha(ref2_w), "dp2: resume is bitwise (losses and weights)",
           r.stderr + f"\n{losses(ref2_m)}\n{got}")
        print(f"dp2 stop/resume: {len(got)} losses bit-identical, weights equal", flush=True)
        want = committed_steps(r.stderr)  # 15 may be superseded by 20 (no fault armed)
        ok(want[-1:] == [20] and set(want) <= {15, 20}, "dp2: resumed run commits 20", r.stderr)
        check_ckpt_bytes(b_m, c, want, "dp2: resumed at 10")

        # a SIGTERM that reaches rank 1 alone, between two steps (as a driver's or a
        # scheduler's stop reaches the ranks at different moments): every rank stops after
        # the same step and the final checkpoint commits.  Before, rank 1 left the loop on
        # its own flag while rank 0 went on into the next step's collectives: both waited
        # until the communicator timeout and nothing was committed.
        t = ws.path("term1")
        t_m, u_m, u_w = ws.path("t.jsonl"), ws.path("u.jsonl"), ws.path("u.st")
        r = mpi(ws, 2, ws.train_args("--steps", "20", *dp2, "--ckpt-dir", t, "--ckpt-every", "50",
                                     "--metrics", t_m), fault="term@10:1")
        stops = [l for l in r.stderr.splitlines() if "interrupted: stopping after step" in l]
        ok(r.returncode == 0 and verify(step_dir(t, 10)) and len(stops) == 2 and
           all(l.endswith("after step 10 of 20") for l in stops),
           "dp2: SIGTERM on rank 1 alone: both ranks stop after step 10, committed", r.stderr)
        r = mpi(ws, 2, ws.train_args("--steps", "20", *dp2, "--ckpt-dir", t, "--resume", "auto",
                                     "--metrics", u_m, "--save-weights", u_w))
        ok(r.returncode == 0 and resumed_at(r.stderr) == 10 and
           losses(t_m) + losses(u_m) == losses(ref2_m) and sha(u_w) == sha(ref2_w),
           "dp2: resumed after the one-rank SIGTERM, bitwise", r.stderr)

        # layouts: dp2 -> dp1 and dp1 -> dp2
        x = ws.path("x21")
        mpi(ws, 2, ws.train_args("--steps", "20", *dp2, "--ckpt-dir", x), fault="signal:term@10")
        m = ws.path("x21.jsonl")
        r = run(ws, ws.train_args("--steps", "20", "--ckpt-dir", x, "--resume", "auto",
                                  "--metrics", m))
        err = rel_err(losses(ref1_m)[10:], losses(m))
        ok(r.returncode == 0 and resumed_at(r.stderr) == 10 and err <= 1e-5,
           f"saved by dp2, resumed by one process (rel {err:.1e})", r.stderr)
        y = ws.path("x12")
        run(ws, ws.train_args("--steps", "20", "--ckpt-dir", y), fault="signal:term@10")
        m = ws.path("x12.jsonl")
        r = mpi(ws, 2, ws.train_args("--steps", "20", *dp2, "--ckpt-dir", y, "--resume", "auto",
                                     "--metrics", m))
        err = rel_err(losses(ref2_m)[10:], losses(m))
        ok(r.returncode == 0 and resumed_at(r.stderr) == 10 and err <= 1e-5,
           f"saved by one process, resumed by dp2 (rel {err:.1e})", r.stderr)

        # a commit of another model (--attn-window 4 here), refused on every rank at once:
        # rank 0 names it.  Before, rank 0 went on into one more all-reduce than the others and
        # waited there until they had gone (its line said the collective, only rank 1's the
        # reason), seconds later
        t0 = time.time()
        r = mpi(ws, 2, ws.train_args("--steps", "20", *dp2, "--attn-window", "4", "--resume",
                                     step_dir(c, 10), "--ckpt-dir", ws.path("other_model")))
        took = time.time() - t0
        first = next((l for l in r.stderr.splitlines() if "megascale train: error" in l), "")
        ok(r.returncode == 2 and "(rank 0 of 2" in first and "holds another model" in first and
           "all_reduce" not in r.stderr and took < 20,
           f"dp2: a commit of another model refused on every rank, rank 0 says why ({took:.1f} s)",
           r.stderr[-3000:])

        # rank 1 killed after its shard of step 10
        k = ws.path("kill")
        r = mpi(ws, 2, ws.train_args("--steps", "20", *dp2, "--ckpt-dir", k, "--ckpt-every", "5"),
                fault="stage2:after-shard@10:1")
        ok(r.returncode != 0 and verify(step_dir(k, 5)) and not os.path.exists(step_dir(k, 10)),
           "rank 1 killed in stage 2: step 5 intact, no step 10", r.stderr[-3000:])
        copy = k + "_noshm"
        shutil.copytree(k, copy)
        for root, want in ((k, 10), (copy, 5)):
            m, w = ws.path("kc.jsonl"), ws.path("kc.st")
            r = mpi(ws, 2, ws.train_args("--steps", "20", *dp2, "--ckpt-dir", root, "--ckpt-every",
                                         "5", "--resume", "auto", "--metrics", m,
                                         "--save-weights", w))
            ok(r.returncode == 0 and resumed_at(r.stderr) == want and
               losses(m) == losses(ref2_m)[want:] and sha(w) == sha(ref2_w),
               f"after the kill: resume at {want} ({'snapshots' if want == 10 else 'commit'}), "
               "bitwise", r.stderr)

        # the same kill, then one byte of rank 1's snapshot of step 10 flipped:
        # no rank may load step 10, all of them go back to the commit of 5
        k = ws.path("kill_flip")
        r = mpi(ws, 2, ws.train_args("--steps", "20", *dp2, "--ckpt-dir", k, "--ckpt-every", "5"),
                fault="stage2:after-shard@10:1")
        bad = [p for p, (step, complete) in slots(ws.shm, k).items()
               if "-r00001-" in p and step == 10 and complete]
        ok(r.returncode != 0 and len(bad) == 1, "rank 1 killed again: its snapshot of step 10",
           r.stderr[-2000:] + str(slots(ws.shm, k)))
        for p in bad:
            flip_snapshot_byte(p)
        m, w = ws.path("kf.jsonl"), ws.path("kf.st")
        r = mpi(ws, 2, ws.train_args("--steps", "20", *dp2, "--ckpt-dir", k, "--ckpt-every", "5",
                                     "--resume", "auto", "--metrics", m, "--save-weights", w))
        ok(r.returncode == 0 and resumed_at(r.stderr) == 5 and bad and
           f"resume: not resuming from {bad[0]}" in r.stderr and "fails its data CRC" in r.stderr
           and losses(m) == losses(ref2_m)[5:] and sha(w) == sha(ref2_w),
           "rank 1's snapshot damaged: every rank resumes from the commit of 5, bitwise", r.stderr)

        # rank 0 killed halfway through stage 1 of step 10: only rank 1 holds
        # a complete snapshot of 10, so the ranks agree on step 5
        s1 = ws.path("stage1")
        r = mpi(ws, 2, ws.train_args("--steps", "20", *dp2, "--ckpt-dir", s1, "--ckpt-every", "5"),
                fault="stage1:mid@10:0")
        ok(r.returncode != 0, "rank 0 killed in stage 1", r.stderr[-2000:])
        m = ws.path("s1.jsonl")
        r = mpi(ws, 2, ws.train_args("--steps", "20", *dp2, "--ckpt-dir", s1, "--ckpt-every", "5",
                                     "--resume", "auto", "--metrics", m))
        ok(r.returncode == 0 and resumed_at(r.stderr) == 5 and losses(m) == losses(ref2_m)[5:] and
           "incomplete snapshot of step 10" in r.stderr,
           "the ranks agree on the newest snapshot all of them hold", r.stderr)

        # a checkpoint every step of a fast model: stage 2 falls behind.  A snapshot still
        # queued for it on one rank used to be replaced there and not on the other (whose
        # persist thread had started it), so the ranks persisted different steps and no
        # checkpoint committed again; then every rank skipped while one was queued anywhere;
        # now every rank waits until its queued one has started, and takes each checkpoint.
        # Rank 1's persists are slower (stage2:slow): its queue is the one that is full
        fast = ws.path("fast")
        r = mpi(ws, 2, ws.train_args("--steps", "300", *dp2, "--ckpt-dir", fast, "--ckpt-every",
                                     "1", "--ckpt-keep", "2"), fault="stage2:slow=2@1+:1")
        done = committed_steps(r.stderr)
        ok(r.returncode == 0 and "NOT committed" not in r.stderr and "out of step" not in r.stderr
           and done == list(range(1, 301)) and verify(step_dir(fast, 300)),
           "a checkpoint every step: each one commits, in order, the last at step 300",
           r.stderr[-3000:])
        layouts(ws)
    finally:
        ws.close()
    sys.exit(summary())


def check_ckpt_bytes(m, c, want, what):
    """Rank 0's metrics m have one commit line per step of `want`, in order,
    each with bytes = the sum of both ranks' shard files of c/step_N."""
    got = ckpt_lines(m)
    ok([g["step"] for g in got] == want, f"{what}: a ckpt line per commit", str(got))
    for g in got:
        disk, listed = shard_sizes(c, g["step"])
        ok(len(disk) == 2 and g["bytes"] == sum(disk.values()) == sum(listed.values()) and
           g["bytes"] > max(disk.values()) and g["persist_ms"] >= 0,
           f"{what}: step {g['step']}: bytes = both ranks' shards", f"{g} vs {disk} / {listed}")


# The tensor / pipeline layouts: the model of tests/mpi/test_tp.py (eps 1e-6)
TP_MODEL = ["--vocab", "256", "--layers", "4", "--dim", "64", "--heads", "4", "--seq-max", "32",
            "--seq", "32", "--batch", "8", "--micro-batch", "2", "--threads", "1",
            "--peak-flops", "1e11", "--eps", "1e-6", "--log-every", "100", "--lr", "3e-3"]


def layouts(ws):
    """DP2 x TP2 x PP2 stop / resume bit for bit; tp2 x pp2 -> one process,
    one process -> tp2 x dp2 (losses within 1e-5 relative)."""
    def args(*extra):
        return ["train", "--train-data", ws.shard, *TP_MODEL, "--steps", "8", *extra]
    g = ["--dp", "2", "--tp", "2", "--pp", "2"]
    ref_m, ref_w, ref1_m = ws.path("g_ref.jsonl"), ws.path("g_ref.st"), ws.path("g1_ref.jsonl")
    r = mpi(ws, 8, args(*g, "--metrics", ref_m, "--save-weights", ref_w))
    ok(r.returncode == 0, "dp2 tp2 pp2 straight run", r.stderr)
    r = run(ws, args("--metrics", ref1_m))
    ok(r.returncode == 0, "one process straight run", r.stderr)
    c, a_m, b_m, b_w = ws.path("g"), ws.path("ga.jsonl"), ws.path("gb.jsonl"), ws.path("gb.st")
    r = mpi(ws, 8, args(*g, "--ckpt-dir", c, "--metrics", a_m), fault="signal:term@4")
    ok(r.returncode == 0 and verify(step_dir(c, 4)), "dp2 tp2 pp2: stop at step 4, committed",
       r.stderr)
    shutil.rmtree(ws.shm, ignore_errors=True)  # resume from the commit, not the snapshots
    os.makedirs(ws.shm)
    r = mpi(ws, 8, args(*g, "--ckpt-dir", c, "--resume", "auto", "--metrics", b_m,
                        "--save-weights", b_w))
    got = losses(a_m) + losses(b_m)
    ok(r.returncode == 0 and resumed_at(r.stderr) == 4 and got == losses(ref_m) and
       sha(b_w) == sha(ref_w), "dp2 tp2 pp2: resume is bitwise (losses and weights)",
       r.stderr + f"\n{losses(ref_m)}\n{got}")
    x, m = ws.path("t22"), ws.path("t22.jsonl")
    mpi(ws, 4, args("--tp", "2", "--pp", "2", "--ckpt-dir", x), fault="signal:term@4")
    r = run(ws, args("--ckpt-dir", x, "--resume", "auto", "--metrics", m))
    err = rel_err(losses(ref1_m)[4:], losses(m))
    ok(r.returncode == 0 and resumed_at(r.stderr) == 4 and err <= 1e-5,
       f"saved by tp2 pp2, resumed by one process (rel {err:.1e})", r.stderr)
    r = subprocess.run([BIN, "ckpt", "list", x], capture_output=True, text=True)
    ok(r.returncode == 0 and "step        4  committed  dp 1 x tp 2 x pp 2" in r.stdout,
       "ckpt list: each commit's whole layout (it said dp 1 for tp2 x pp2)", r.stdout + r.stderr)
    y, m = ws.path("t1"), ws.path("t1.jsonl")
    run(ws, args("--ckpt-dir", y), fault="signal:term@4")
    # the same shard by another path: a warning that the data differs, said
    # once (rank 0), not by each of the 4 ranks
    same = os.path.join(os.path.dirname(ws.shard), ".", os.path.basename(ws.shard))
    r = mpi(ws, 4, ["train", "--train-data", same, *TP_MODEL, "--steps", "8", "--tp", "2", "--dp",
                    "2", "--ckpt-dir", y, "--resume", "auto", "--metrics", m])
    err = rel_err(losses(ref1_m)[4:], losses(m))
    ok(r.returncode == 0 and resumed_at(r.stderr) == 4 and err <= 1e-5,
       f"saved by one process, resumed by tp2 dp2 (rel {err:.1e})", r.stderr)
    warned = r.stderr.count("differs from the checkpoint's")
    ok(warned == 1, f"resume by 4 ranks: the --train-data warning once ({warned} times)", r.stderr)
    # a crash in stage 2 under tp2 leaves snapshots of step 4 (the commit is of 2); a resume
    # under dp2 (the same world) cannot use them: the commit is loaded, and rank 0 says why
    # once (each rank said "ignoring SLOT (another job or layout)" for each slot)
    z, m = ws.path("snap_layout"), ws.path("snap_layout.jsonl")
    r = mpi(ws, 2, args("--tp", "2", "--ckpt-dir", z, "--ckpt-every", "2"),
            fault="stage2:after-shard@4:1")
    ok(r.returncode != 0 and verify(step_dir(z, 2)) and not os.path.exists(step_dir(z, 4)),
       "tp2: rank 1 killed in stage 2 of step 4, the commit of 2 intact", r.stderr[-2000:])
    r = mpi(ws, 2, args("--dp", "2", "--ckpt-dir", z, "--resume", "auto", "--metrics", m))
    err = rel_err(losses(ref1_m)[2:], losses(m))
    said = r.stderr.count("was written by another layout")
    # (which step rank 0's newest snapshot holds depends on when mpirun stopped it)
    ok(r.returncode == 0 and resumed_at(r.stderr) == 2 and err <= 1e-5 and said == 1
       and re.search(r"host-memory snapshot \S+ \(step \d+\) was written by another layout",
                     r.stderr),
       f"tp2's snapshots, resumed by dp2: from the commit, said once ({said} times, rel "
       f"{err:.1e})", r.stderr)
    print("tp/pp layouts: bitwise resume on dp2 tp2 pp2, resharding across layouts", flush=True)


if __name__ == "__main__":
    main()
