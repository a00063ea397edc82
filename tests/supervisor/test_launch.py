"""The supervisor (`megascale launch`, src/supervisor) on real faults, each
against a fault-free run of the same job (dp2, 2 ranks, checkpoints every 4
steps):

1. kill -9 of rank 1 mid-run: detected as a crash of rank 1 (its heartbeat
   connection closes), the job is stopped and restarted from the newest
   commit, finishes by itself, and its final weights are bitwise equal to
   the fault-free run's;
2. SIGSTOP of rank 0: detected as a hang of rank 0 (no heartbeat), the same
   recovery, bitwise-equal weights; the driver records rank 0 silent when it
   asks for the hang dumps (event hang_dumps, trace/prev/hang_driver.json)
   and `trace hang` of them names it with that evidence; SIGSTOP of rank 1
   with a short --comm-timeout: rank 0 reports the timeout, the fault is
   rank 1's;
3. a crash loop (rank 1 exits at step 10 in every attempt): stopped after
   --no-progress-restarts restarts with exit code 4 ("do not requeue"); the
   job probes its peak (no --peak-flops) in the first attempt only: the
   restarts read it from RUN_DIR/peak-HOST.json, written by one rank;
   The metrics' first line says the heartbeat token is set, never what it is.
4. the heartbeat socket: beats with a wrong token, a malformed line, an
   oversized line, no token and bytes that are no text are rejected (events
   "beat_rejected") and do not disturb the job (an out-of-order sequence
   number needs the job's token and a rank's own connection: not sent here;
   tests/unit/test_sup_beat.c checks that rule, sup_beat_admit);
5. pp 2 x dp 2 (4 ranks) with a large vocabulary: the last stage's ranks
   compute the head and the loss too, about twice the first stage's time,
   and are not reported as stragglers (a rank is compared with its stage);
   every step's compute time is above 0 on every rank (the checkpoint
   thread's waits are not the trainer's).
6. tp 2 x pp 2 on 2 nodes, rank 3 hangs (it beats, makes no step): the
   fault names rank 3 on node1, the one rank not blocked in communication;
   again with more micro-batches a step than the tp group's shared-memory
   batch ring holds, where rank 2, the ring's leader, waits for rank 3 to
   read a batch (a wait its heartbeats count as one for a rank); before the
   stop every rank writes its hang dump (SIGUSR2 from the driver), and
   `trace hang` of them names rank 3 alone (the ring's waits are in them);
7. `--ctl RUN_DIR dump` on a running job (before 6): every rank writes its
   hang dump, `trace hang` reads them, the job goes on;
8. the same layout as 6, rank 3 slowed instead: rank 2's wait for it in the
   ring is data time, not compute, so rank 3 alone is the straggler.

Environment: MS_BIN (the megascale binary)."""
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "mpi"))
from mpi_common import BIN, finish, ok, start  # noqa: E402

TRAIN = ["--vocab", "256", "--layers", "4", "--dim", "128", "--heads", "4", "--seq-max", "32",
         "--seq", "32", "--batch", "16", "--steps", "40", "--dp", "2", "--threads", "1",
         "--lr", "1e-3", "--log-every", "10", "--peak-flops", "1e11", "--ckpt-every", "4",
         "--data-order", "sequential"]
LAUNCH = ["--np", "2", "--heartbeat-timeout", "4", "--backoff", "0.2", "--grace", "3",
          "--startup-timeout", "120"]


def events(run):
    try:
        return [json.loads(l) for l in open(os.path.join(run, "events.jsonl"))]
    except OSError:
        return []


def sha(path):
    try:
        return hashlib.sha256(open(path, "rb").read()).hexdigest()
    except OSError:
        return None


def launch(d, name, shard, extra_train=(), extra_launch=()):
    run = os.path.join(d, name)
    cmd = [BIN, "launch", *LAUNCH, "--run-dir", run, *extra_launch, "--", "--train-data", shard,
           *TRAIN, "--ckpt-dir", os.path.join(run, "ckpt"), "--metrics",
           os.path.join(run, "m.jsonl"), "--save-weights", os.path.join(run, "w.safetensors"),
           *extra_train]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return run, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 errors="replace", env=env)


def wait_step(run, step, p, timeout=120):
    """The pids of the ranks once rank 0 has logged `step` steps."""
    t_end = time.time() + timeout
    while time.time() < t_end and p.poll() is None:
        try:
            n = sum(1 for l in open(os.path.join(run, "m.jsonl")) if '"loss"' in l)
        except OSError:
            n = 0
        if n >= step:
            break
        time.sleep(0.02)
    pids = {}
    for e in events(run):
        if e["event"] == "rank_up":
            pids[e["rank"]] = e["pid"]
    return pids


def finished(p, timeout=300):
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
    # killed ranks leave host-memory snapshots behind: remove those of this job
    ckpt = p.args[p.args.index("--ckpt-dir") + 1] if "--ckpt-dir" in p.args else None
    if ckpt:
        subprocess.run([BIN, "ckpt", "shm", ckpt, "--remove", "1", "--force", "1"],
                       capture_output=True)
    return p.returncode, err


def faults(run):
    return [(e["kind"], e["rank"]) for e in events(run) if e["event"] == "fault_detected"]


def check_recovery(d, shard, ref_w, name, sig, victim):
    run, p = launch(d, name, shard)
    pids = wait_step(run, 12, p)
    if victim in pids:
        os.kill(pids[victim], sig)
    rc, err = finished(p)
    ev = events(run)
    kind = "crash" if sig == signal.SIGKILL else "hang"
    ok(rc == 0, f"{name}: the job finishes by itself", err[-3000:])
    ok(faults(run)[:1] == [(kind, victim)], f"{name}: the fault is a {kind} of rank {victim}",
       str(faults(run)) + err[-2000:])
    ok(any(e["event"] == "restart" for e in ev) and ev[-1]["event"] == "job_done",
       f"{name}: restarted, then done", str([e["event"] for e in ev]))
    ok(sha(os.path.join(run, "w.safetensors")) == ref_w,
       f"{name}: final weights bitwise equal to the fault-free run")
    summ = [e for e in ev if e["event"] == "summary"]
    ok(summ and summ[0]["faults"] == {kind: 1} and summ[0]["restarts"] == 1
       and 0 < summ[0]["ettr"] <= 1, f"{name}: the summary counts it", str(summ))
    det = [e["detect_s"] for e in ev if e["event"] == "fault_detected"]
    limit = 1.0 if kind == "crash" else 4 + 1.0
    ok(det and det[0] <= limit, f"{name}: detected within {limit} s", str(det))
    if sig == signal.SIGSTOP:
        check_silent_dumps(run, name, ev, victim)
    print(f"{name}: detected in {det[0] if det else '?'} s; {err.strip().splitlines()[-1]}")


def check_all_killed(d, shard, ref_w):
    """kill -9 of every rank at once: one crash (of whichever end the driver read first), the
    others named in its detail as gone too (before, their ends were in no record); restarted,
    and bitwise the fault-free run."""
    run, p = launch(d, "killall", shard)
    pids = wait_step(run, 12, p)
    for pid in pids.values():
        os.kill(pid, signal.SIGKILL)
    rc, err = finished(p)
    f = [e for e in events(run) if e["event"] == "fault_detected"]
    others = [r for r in pids if f and r != f[0].get("rank")]
    want = "; also gone: rank" + ("s " if len(others) > 1 else " ") + ", ".join(map(str, others))
    ok(rc == 0 and len(f) == 1 and f[0]["kind"] == "crash" and len(pids) >= 2 and
       want in f[0].get("detail", ""),
       "every rank killed at once: one crash, the other ranks named as gone too",
       f"rc {rc}, {f}, pids {pids}\n{err[-2000:]}")
    ok(sha(os.path.join(run, "w.safetensors")) == ref_w,
       "every rank killed at once: final weights bitwise equal to the fault-free run")


def check_comm_lost_peer(d, shard):
    """Rank 1 SIGSTOPped with a --comm-timeout shorter than the heartbeat
    timeout: rank 0's collective times out first and rank 0 reports the
    error, but the fault is rank 1's, the rank that went silent (its process
    lives: on another host the driver could not even look), with rank 0 as
    reported_by.  It was booked on rank 0, the survivor, on its node."""
    run, p = launch(d, "comm_stop", shard, ["--comm-timeout", "5"],
                    ["--heartbeat-timeout", "30"])
    pids = wait_step(run, 12, p)
    if 1 in pids:
        os.kill(pids[1], signal.SIGSTOP)
    rc, err = finished(p)
    first = next((e for e in events(run) if e["event"] == "fault_detected"), {})
    ok(rc == 0 and first.get("kind") == "comm" and first.get("rank") == 1
       and first.get("reported_by") == 0 and "went silent" in first.get("detail", ""),
       "comm timeout on rank 0 after rank 1 stopped: the fault is rank 1's, reported by rank 0",
       json.dumps(first) + err[-2000:])


def check_silent_dumps(run, name, ev, victim):
    """The stopped rank was silent when the driver asked for the hang dumps: the event
    hang_dumps names it, and so does TRACE_DIR/hang_driver.json, which the restart moved to
    prev/ with the dumps; `trace hang` of them names it, with the driver's evidence (a rank
    stopped on a host without another rank writes a dump like its victims' once resumed)."""
    hd = [e for e in ev if e["event"] == "hang_dumps"]
    prev = os.path.join(run, "trace", "prev")
    try:
        drv = json.load(open(os.path.join(prev, "hang_driver.json")))
    except (OSError, ValueError) as e:
        drv = {"error": str(e)}
    ok(len(hd) == 1 and [x["rank"] for x in hd[0].get("silent", [])] == [victim] and
       hd[0]["silent"][0]["beat_age_s"] >= 3 and drv.get("type") == "hang_driver" and
       drv.get("by") == "hang" and drv.get("world") == 2 and
       [x.get("rank") for x in drv.get("silent", [])] == [victim] and
       not os.path.exists(os.path.join(run, "trace", "hang_driver.json")),
       f"{name}: the driver recorded rank {victim} silent (event, prev/hang_driver.json)",
       f"{hd}\n{drv}")
    t = subprocess.run([BIN, "trace", "hang", prev, "--json"], capture_output=True, text=True)
    try:
        sus = {s["rank"]: " ".join(s["reasons"]) for s in json.loads(t.stdout)["suspects"]}
    except (ValueError, KeyError, TypeError):
        sus = {}
    ok(list(sus) == [victim] and "no heartbeat to the driver" in sus[victim],
       f"{name}: trace hang names rank {victim} with the driver's evidence",
       t.stdout[-2000:] + t.stderr[-1000:])


def check_crash_loop(d, shard):
    run, p = launch(d, "loop", shard, ["--inject-fault", "exit@10:1", "--peak-flops", "0"],
                    ["--no-progress-restarts", "2", "--max-restarts", "8"])
    rc, err = finished(p)
    ev = events(run)
    peaks = re.findall(r"MFU against a peak of [\d.]+ GFLOP/s per rank: (probed|cached in \S+)",
                       err)
    caches = [n for n in os.listdir(run) if n.startswith("peak-") and n.endswith(".json")]
    try:
        entries = json.load(open(os.path.join(run, caches[0])))["entries"]
    except (IndexError, OSError, ValueError, KeyError):
        entries = []
    ok(len(peaks) == 3 and peaks[0] == "probed" and len(caches) == 1
       and all(x == f"cached in {os.path.abspath(run)}/{caches[0]}:" for x in peaks[1:])
       and len(entries) == 1 and entries[0]["key"]["ranks_on_host"] == 2,
       "crash loop: the first attempt probes the peak, the restarts read the run dir's cache",
       str(peaks) + str(entries) + err[-2000:])
    ok(rc == 4, "crash loop: exit code 4 (no progress, do not requeue)", f"rc {rc}\n{err[-3000:]}")
    ok("no progress" in err and ev and ev[-1]["event"] == "job_failed",
       "crash loop: says why and records it", err[-2000:])
    ok(len([e for e in ev if e["event"] == "launch"]) == 3, "crash loop: two restarts, then stop",
       str([e["event"] for e in ev]))
    acts = [e.get("action") for e in ev if e["event"] == "fault_detected"]
    ok(acts == ["restart", "restart", "stop"],
       "crash loop: the faults' actions say restart, restart, then stop (the policy gives up "
       "on the third)", str(acts))


def check_bad_beats(d, shard):
    # 400 steps (about 8 s): the job must outlive the 5 sends (1.5 s); at 40
    # steps a fast machine finished it during them and the last send failed
    run, p = launch(d, "beats", shard, extra_train=("--steps", "400"))
    wait_step(run, 2, p)
    hb = [e["heartbeat"] for e in events(run) if e["event"] == "job_start"]
    sent = 0
    if hb:
        host, port = hb[0].rsplit(":", 1)
        lines = [b'{"v":1,"token":"00000000000000000000000000000000","rank":0,"world":2,"pid":1,'
                 b'"host":"x","seq":1,"step":999,"phase":"train"}\n',
                 b'{"v":1, not json\n', b'x' * 10000 + b'\n',
                 b'{"v":1,"rank":0}\n', b'\x00\xff\xfe garbage\n']
        for line in lines:
            try:
                s = socket.create_connection((host, int(port)), timeout=5)
                s.sendall(line)
                time.sleep(0.3)
                s.close()
                sent += 1
            except OSError:
                pass
    rc, err = finished(p)
    rej = [e for e in events(run) if e["event"] == "beat_rejected"]
    ok(rc == 0 and sent == 5 and len(rej) >= 4, "bad beats are rejected, the job is undisturbed",
       f"rc {rc}, sent {sent}, rejected {[e['why'] for e in rej]}\n{err[-2000:]}")
    ok(not faults(run), "bad beats raise no fault", str(faults(run)))
    whys = {e["why"] for e in rej}
    ok("wrong token" in whys and "not a JSON object" in whys and "line too long" in whys,
       "each named", str(whys))


def check_stages(d, shard):
    """pp 2 x dp 2 with a large vocabulary: the last stage also computes the
    head and the loss, so its ranks' compute time is about twice the first
    stage's on every step.  The straggler detector compares a rank with the
    ranks of its own stage (the beats say it): no straggler is reported."""
    run = os.path.join(d, "stages")
    # the default 10 rounds in a row: the old detector, which compared the
    # last stage with every rank, scored it ~0.5 on every step; 4 rounds let
    # a rank that shares its core with a checkpoint persist or another test
    # cross the threshold by chance
    cmd = [BIN, "launch", "--np", "4", "--nodes", "2", "--straggler-rounds", "10",
           *LAUNCH[2:], "--run-dir", run, "--", "--train-data", shard, *TRAIN, "--pp", "2",
           "--ckpt-dir", os.path.join(run, "ckpt"), "--metrics", os.path.join(run, "m.jsonl")]
    cmd[cmd.index("--vocab") + 1], cmd[cmd.index("--steps") + 1] = "4096", "24"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         errors="replace", env=env)
    rc, err = finished(p)
    rows = []
    try:
        rows = [json.loads(l)["compute_ms"] for l in open(os.path.join(run, "compute.jsonl"))]
    except (OSError, ValueError, KeyError):
        pass
    late = rows[6:]
    ratio = (sum(r[2] + r[3] for r in late) / max(1e-9, sum(r[0] + r[1] for r in late))
             if late else 0)
    strag = [e for e in events(run) if e["event"] in ("anomaly", "fault_detected")
             and e.get("kind") == "straggler"]
    # a step's compute_ms is its time less the trainer's own waits: the
    # checkpoint thread's collectives (a commit every 4 steps) are not in it
    zero = [i + 1 for i, r in enumerate(rows) if min(r) <= 0]
    ok(len(rows) == 24 and not zero, "pp2 x dp2: every step has a compute time on every rank "
       "(a checkpoint's persist does not take it to 0)", f"steps with a 0: {zero}")
    # the last stage must really be heavier (else "no straggler" tests nothing)
    ok(ratio > 1.3, f"pp2 x dp2: the last stage's compute time is {ratio:.2f} x the first's "
       "(> 1.3: the head and the loss)", str(late[:3]))
    ok(rc == 0 and not strag, "pp2 x dp2: the heavier last stage is no straggler "
       f"(its compute time {ratio:.2f} x the first stage's)", f"rc {rc} {strag}\n{err[-2000:]}")


def check_stage_hang(d, shard, tag="", extra=()):
    """tp 2 x pp 2 on 2 nodes, rank 3 (stage 1, node1) hangs at step 8: every
    rank stops making steps and beats on; the one to blame is the rank that
    waits in no communication (its beats say so), not rank 0 of stage 0,
    which waits for it in the pipeline's recv.  extra "--micro-batch 2":
    eight micro-batches a step, more than the tp group's batch ring holds,
    so that rank 2, the ring's leader on the same host, waits for rank 3 to
    read the oldest slot: a wait in shared memory that its beats must count
    as a wait for a rank, as they count a collective."""
    run = os.path.join(d, "stage_hang" + tag.replace(" ", "_"))
    cmd = [BIN, "launch", "--np", "4", "--nodes", "2", "--max-restarts", "0", "--diag", "0",
           *LAUNCH[2:], "--run-dir", run, "--", "--train-data", shard, *TRAIN, "--tp", "2",
           "--pp", "2", "--ckpt-dir", os.path.join(run, "ckpt"), "--inject-fault", "hang@8:3",
           *extra]
    cmd[cmd.index("--dp") + 1] = "1"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         errors="replace", env=env)
    rc, err = finished(p)
    det = [e for e in events(run) if e["event"] == "fault_detected"]
    ok(rc == 3 and [(e["kind"], e["rank"], e["node"]) for e in det] == [("hang", 3, "node1")],
       f"tp2 x pp2{tag}: the hung rank 3 of stage 1 is named, not a peer waiting for it",
       f"rc {rc} {det}\n{err[-2000:]}")
    ok(det and "waits in no communication" in det[0]["detail"], f"tp2 x pp2{tag}: the detail "
       "says why", str(det))
    # before the stop, every rank wrote its hang dump (SIGUSR2), which `trace hang` reads:
    # the ring's waits are in them as waits for a rank
    dumps = [e for e in events(run) if e["event"] == "hang_dumps"]
    ok(len(dumps) == 1 and dumps[0]["ranks"] == 4 and dumps[0]["asked"] == 4 and
       dumps[0].get("silent") == [],
       f"tp2 x pp2{tag}: the driver asked for the hang dumps and all 4 came (none silent)",
       str(dumps))
    hint = re.search(r"hang dumps: 4 of 4 rank\(s\) wrote theirs in [0-9.]+ s \(([^)]*)\)", err)
    ok(hint and hint.group(1) == "megascale trace hang " + os.path.join(run, "trace"),
       f"tp2 x pp2{tag}: no restart follows (--max-restarts 0): the hint names the dumps' "
       "directory, not the prev/ a restart would move them to", hint and hint.group(1))
    t = subprocess.run([BIN, "trace", "hang", os.path.join(run, "trace"), "--json"],
                       capture_output=True, text=True)
    try:
        sus = [s["rank"] for s in json.loads(t.stdout)["suspects"]]
    except (ValueError, KeyError, TypeError):
        sus = None
    ok(t.returncode == 0 and sus == [3], f"tp2 x pp2{tag}: trace hang of the dumps names rank 3",
       t.stdout[-2000:] + t.stderr[-1000:])


def check_ring_straggler(d, shard):
    """tp 2 x pp 2 on 2 nodes, eight micro-batches a step (more than the tp
    group's batch ring holds), rank 3 slowed by 60 ms a step: rank 2, its
    ring's leader on the same host, waits in the ring for rank 3 to read.
    That wait is data time, not compute: the beats' compute time of rank 2
    stays near stage 0's, and the straggler named is rank 3 alone."""
    run = os.path.join(d, "ring_straggler")
    cmd = [BIN, "launch", "--np", "4", "--nodes", "2", "--max-restarts", "0", "--diag", "0",
           "--straggler-rounds", "4", *LAUNCH[2:], "--run-dir", run, "--", "--train-data", shard,
           *TRAIN, "--tp", "2", "--pp", "2", "--micro-batch", "2", "--steps", "16",
           "--ckpt-dir", os.path.join(run, "ckpt"), "--inject-fault", "slow=60@3+:3"]
    cmd[cmd.index("--dp") + 1] = "1"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         errors="replace", env=env)
    rc, err = finished(p)
    strag = [e.get("rank") for e in events(run) if e.get("event") == "anomaly"
             and e.get("kind") == "straggler"]
    ok(rc == 0 and strag == [3], "tp2 x pp2, ring full: the slowed rank 3 is the straggler, "
       "not its ring's leader", f"rc {rc} {strag}\n{err[-2000:]}")
    rows = []
    try:
        rows = [json.loads(l)["compute_ms"] for l in open(os.path.join(run, "compute.jsonl"))]
    except (OSError, ValueError, KeyError):
        pass
    med = [sorted(r[k] for r in rows[4:])[len(rows[4:]) // 2] if rows[4:] else 0
           for k in range(4)]
    ok(len(rows) >= 12 and med[2] < 0.5 * med[3] and med[2] < 2 * max(med[0], med[1]),
       "rank 2's wait for rank 3 in the ring is not its compute (beats' compute medians "
       f"{[round(m, 1) for m in med]} ms)", str(rows[-3:]))


def check_ctl_dump(d, shard):
    """`megascale launch --ctl RUN_DIR dump` on a running job: both ranks
    write their hang dumps, `trace hang` reads them, and the job goes on
    making steps."""
    run, p = launch(d, "ctldump", shard, ["--steps", "100000"])
    wait_step(run, 5, p)
    r = subprocess.run([BIN, "launch", "--ctl", run, "dump"], capture_output=True, text=True,
                       timeout=30)
    tdir = os.path.join(run, "trace")
    dumps = sorted(f for f in os.listdir(tdir) if f.startswith("hang_r")) \
        if os.path.isdir(tdir) else []
    ok(r.returncode == 0 and "2 of 2 rank(s) wrote their hang dump" in r.stdout
       and dumps == ["hang_r00000.json", "hang_r00001.json"],
       "--ctl dump: every rank of a running job writes its hang dump", r.stdout + r.stderr + str(dumps))
    try:
        drv = json.load(open(os.path.join(tdir, "hang_driver.json")))
    except (OSError, ValueError) as e:
        drv = {"error": str(e)}
    ok(drv.get("by") == "ctl" and drv.get("silent") == [] and drv.get("world") == 2,
       "--ctl dump: the driver's file beside the dumps, no rank silent", str(drv))
    # (a snapshot of a running job: an op may be in flight in it, so no verdict is checked)
    t = subprocess.run([BIN, "trace", "hang", tdir], capture_output=True, text=True)
    ok(t.returncode == 0 and "2 dump(s), 0 missing" in t.stdout and "(dump: signal)" in t.stdout,
       "trace hang reads them", t.stdout[-1500:] + t.stderr[-500:])
    n0 = sum(1 for l in open(os.path.join(run, "m.jsonl")) if '"loss"' in l)
    wait_step(run, n0 + 3, p)
    n1 = sum(1 for l in open(os.path.join(run, "m.jsonl")) if '"loss"' in l)
    ok(p.poll() is None and n1 >= n0 + 3 and not faults(run),
       "the job goes on after the dumps, no fault", f"steps {n0} -> {n1}")
    p.send_signal(signal.SIGTERM)
    finished(p)
    bad = subprocess.run([BIN, "launch", "--ctl", run, "dump", "node0"], capture_output=True,
                         text=True)
    ok(bad.returncode == 2 and "usage" in bad.stderr, "--ctl dump takes no node", bad.stderr)


def main():
    d, shard = start("ms_sup_")
    run, p = launch(d, "ref", shard)
    rc, err = finished(p)
    ok(rc == 0 and not faults(run), "the fault-free run", err[-3000:])
    ref_w = sha(os.path.join(run, "w.safetensors"))
    ok(ref_w is not None, "the fault-free run saved its weights")
    try:  # the job's heartbeat token is in the driver's state (mode 0600) alone
        token = json.load(open(os.path.join(run, "driver.json")))["token"]
        metrics = open(os.path.join(run, "m.jsonl")).read()
        first = json.loads(metrics.split("\n", 1)[0])
    except (OSError, ValueError, KeyError) as e:
        token, metrics, first = None, "", {"error": str(e)}
    ok(token and token not in metrics
       and first.get("options", {}).get("heartbeat-token") == "(secret)",
       "the metrics (mode 0644) say the heartbeat token is set, not what it is", str(first)[:600])
    check_recovery(d, shard, ref_w, "kill9", signal.SIGKILL, 1)
    check_recovery(d, shard, ref_w, "sigstop", signal.SIGSTOP, 0)
    check_all_killed(d, shard, ref_w)
    check_comm_lost_peer(d, shard)
    check_crash_loop(d, shard)
    check_bad_beats(d, shard)
    check_stages(d, shard)
    check_ctl_dump(d, shard)
    check_stage_hang(d, shard)
    check_stage_hang(d, shard, " ring full", ["--micro-batch", "2"])
    check_ring_straggler(d, shard)
    finish(d)


if __name__ == "__main__":
    main()
