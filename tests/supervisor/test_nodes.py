"""The supervisor with nodes and spares (`megascale launch --nodes 2 --spares 1`:
two nodes of one rank each on this host, and a spare), each case against the
fault-free run of the same job (dp2, checkpoints every 4 steps):

1. a persistent NaN on node1 (nan-grad from step 6 on that node, and its GEMM
   failing the self-test): detected as a persistent non-finite fault, diag
   names node1, it is evicted, the spare takes its place, the job finishes
   with weights bitwise equal to the fault-free run's;
2. a node failing diag: rank 1 is killed, diag finds node0's memory bad,
   node0 is evicted (not node1, where the crash was), the spare takes over;
3. a manual eviction (`megascale launch --ctl RUN evict node1`) while the job
   runs, `--ctl status`, and control lines that are refused (an unknown node,
   a wrong token, garbage);
4. a transient NaN (nan-grad at step 7 on rank 1, once): the step is redone in
   place, no restart, weights bitwise equal;
5. the driver itself killed (kill -9) and started again with the same command:
   it takes over the running job from the run directory, which finishes with
   no restart and bitwise-equal weights;
6. a straggler (node1 300 ms slower per step from step 4): detected by its
   compute-time score, node1 evicted, the spare takes over, bitwise equal;
7. a loss spike (lr x 100 at step 24): an anomaly event, no restart;
8. a checkpoint that fails to commit once (an fsync I/O error at step 8):
   reported and watched, the next checkpoint commits, no restart, bitwise
   equal weights;
9. a full disk (every checkpoint from step 8 fails with ENOSPC, and the
   storage check fails on every node): after --ckpt-fail-limit (2) failed
   commits the job is stopped, and the driver exits 7, saying why, nothing
   evicted.
10. the driver killed (kill -9) right after it accepted `--ctl evict node1`:
   the new driver stops the job, evicts node1 (no diag), the spare takes
   over, the eviction counted once, bitwise equal;
11. a new driver with other options than the running job it would take over
   (--np, --spares, a train option): refused (exit 2) naming the option and
   both values, the job and driver.json untouched; the same command then
   takes it over;
12. the driver killed, then rank 1 killed before a new driver starts: the
   new driver reports the crash of rank 1 (not a peer's comm error on rank
   0), restarts, bitwise equal;
13. the driver killed, then its whole job (mpirun and the ranks) before a new
   driver starts: the new driver reports that the job ended unwatched (a
   fault, kind exit), and its restart is counted, bitwise equal; it removes
   what the killed mpirun left on this host (every rank's shared-memory
   segment, mpirun's session directory);
14. a node slow from the start (its GEMM at a tenth of its speed,
   diag:slow on node1; it has no history to be slow against): the pre-flight
   self-test (--preflight 1, the nodes compared with each other) fails it
   before the first start, node1 is evicted, the job starts on node0 and the
   spare and runs without a fault, bitwise equal; the spare node2, as slow in
   the first measurement only (diag:blip: a busy moment), passes the second,
   which every node gets before any is evicted as slow;
15. a busy host: node1's history (the nodes all on this host) says it was a
   thousand times as fast; after a crash diag passes every node (a node's
   own history is compared only with --hostfile: on one host it is the
   host's past, shared by all), nothing is evicted, bitwise equal;
16. a node's own history (--hostfile: three "hosts" 127.0.0.1-3 on this
   machine, an mpirun that runs them here; --diag-peers 0), pre-flight:
   127.0.0.1, slow for a moment against its history of 3 runs (diag:blip),
   is measured once more and passes; 127.0.0.2, a thousand times slower than
   its history of one run, is not judged (a history of fewer than 3 runs);
   127.0.0.3, as slow against 3 runs, is slow again when measured once more
   and evicted; the job runs on 127.0.0.1 and 127.0.0.2, bitwise equal.
   (Before, one slow measurement against one earlier run evicted a node,
   the spare too: exit 6.)

Environment: MS_BIN (the megascale binary)."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_launch import BIN, TRAIN, events, finished, sha, wait_step  # noqa: E402
from mpi_common import MPIRUN, finish, ok, session_dirs, start, vader_segments  # noqa: E402

NODES = ["--np", "2", "--nodes", "2", "--spares", "1", "--heartbeat-timeout", "4",
         "--backoff", "0.2", "--grace", "3", "--startup-timeout", "120",
         "--straggler-rounds", "0", "--diag-slow-factor", "0.05"]


def cmd(d, name, shard, extra_launch=(), extra_train=()):
    run = os.path.join(d, name)
    return run, [BIN, "launch", *NODES, "--run-dir", run, *extra_launch, "--", "--train-data",
                 shard, *TRAIN, "--ckpt-dir", os.path.join(run, "ckpt"), "--metrics",
                 os.path.join(run, "m.jsonl"), "--save-weights",
                 os.path.join(run, "w.safetensors"), *extra_train]


def launch(d, name, shard, extra_launch=(), extra_train=()):
    run, c = cmd(d, name, shard, extra_launch, extra_train)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return run, subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 errors="replace", env=env)


def of(run, event):
    return [e for e in events(run) if e["event"] == event]


def node_sets(run):
    return [e.get("nodes") for e in of(run, "launch")]


def check_done(run, rc, err, ref_w, name):
    ok(rc == 0 and events(run) and events(run)[-1]["event"] == "job_done",
       f"{name}: the job finishes by itself", f"rc {rc}\n{err[-3000:]}")
    ok(sha(os.path.join(run, "w.safetensors")) == ref_w,
       f"{name}: final weights bitwise equal to the fault-free run")


def persistent_nan(d, shard, ref_w):
    run, p = launch(d, "nan", shard,
                    ["--faults", "nan-grad@6+:node=node1,diag:gemm:node=node1"],
                    ["--max-bad-steps", "0"])
    rc, err = finished(p)
    check_done(run, rc, err, ref_w, "persistent NaN")
    f = [e for e in of(run, "fault_detected") if e.get("action") not in ("redo", "skip")]
    ok(f and f[0]["kind"] == "nonfinite", "persistent NaN: detected as non-finite",
       str(f) + err[-2000:])
    ok(f and (f[0].get("rank"), f[0].get("node")) == (1, "node1") and
       "non-finite in the gradients of rank 1" in f[0].get("detail", ""),
       "persistent NaN: the fault names rank 1 on node1, whose own gradients it was in", str(f))
    diag = {e["node"]: e["ok"] for e in of(run, "diag") if "node" in e}
    ok(diag == {"node0": True, "node1": False, "node2": True},
       "persistent NaN: diag ran on every node and names node1", str(diag))
    ev = [(e["node"], e["by"]) for e in of(run, "evict")]
    ok(ev == [("node1", "diag")], "persistent NaN: node1 evicted by diag", str(ev))
    ok(node_sets(run) == ["node0,node1", "node0,node2"], "persistent NaN: the spare took over",
       str(node_sets(run)))
    try:
        bl = json.load(open(os.path.join(run, "blocklist.json")))
    except (OSError, ValueError):
        bl = {"blocked": []}
    ok([b["node"] for b in bl["blocked"]] == ["node1"], "persistent NaN: node1 on the blocklist",
       str(bl))


def diag_fails(d, shard, ref_w):
    run, p = launch(d, "diagnode", shard, ["--faults", "kill@6:1,diag:memory:node=node0"])
    rc, err = finished(p)
    check_done(run, rc, err, ref_w, "diag failure")
    f = of(run, "fault_detected")
    ok(f and (f[0]["kind"], f[0]["rank"], f[0]["node"]) == ("crash", 1, "node1"),
       "diag failure: the crash is rank 1 on node1", str(f))
    ev = [(e["node"], e["by"]) for e in of(run, "evict")]
    ok(ev == [("node0", "diag")], "diag failure: node0 (memory) evicted, not node1",
       str(ev) + str(of(run, "diag")) + err[-3000:])
    ok(node_sets(run) == ["node0,node1", "node1,node2"], "diag failure: the spare took over",
       str(node_sets(run)))


def ctl(run, *args):
    r = subprocess.run([BIN, "launch", "--ctl", run, *args], capture_output=True, text=True,
                       timeout=30)
    return r.returncode, r.stdout, r.stderr


def manual_evict(d, shard, ref_w):
    # from step 6 every step sleeps 150 ms (the slow fault: no change to the numerics; the
    # straggler check is off here), so that the job is still running when the control
    # commands below arrive: unslowed, its 40 steps take under half a second on a fast core
    run, p = launch(d, "evict", shard, ["--faults", "slow=150@6+"])
    wait_step(run, 8, p)
    rc_s, out_s, _ = ctl(run, "status")
    try:
        st = json.loads(out_s)
    except ValueError:
        st = {}
    ok(rc_s == 0 and [(n["node"], n["state"]) for n in st.get("nodes", [])] ==
       [("node0", "active"), ("node1", "active"), ("node2", "spare")],
       "--ctl status: the nodes and their state", out_s)
    rc_x, _, err_x = ctl(run, "evict", "node9")
    ok(rc_x == 1 and "no node" in err_x, "--ctl evict of an unknown node is refused", err_x)
    rc_b, _, _ = ctl(run, "evict", "../x")
    ok(rc_b == 2, "--ctl evict of a bad name is a usage error")
    cj = json.load(open(os.path.join(run, "control.json")))
    addr = cj["addr"]
    ok(oct(os.stat(os.path.join(run, "control.json")).st_mode & 0o777) == "0o600",
       "control.json is readable by its owner only")
    hb_token = json.load(open(os.path.join(run, "driver.json"))).get("token")
    ok(addr.startswith("127.0.0.1:") and cj.get("token") and cj["token"] != hb_token,
       "the control socket is on loopback with a token of its own (the ranks hold the "
       "heartbeat's)", json.dumps(cj))
    host, port = addr.rsplit(":", 1)
    # the heartbeat token every rank has in its environment is no control token
    s = socket.create_connection((host, int(port)), timeout=5)
    s.sendall(json.dumps({"v": 1, "token": hb_token, "cmd": "status"}).encode() + b"\n")
    reply = s.recv(4096)
    s.close()
    ok(b'"ok":false' in reply.replace(b" ", b""), "the heartbeat token is refused by the control "
       "socket", reply.decode(errors="replace"))
    for line in [b'{"v":1,"token":"00000000000000000000000000000000","cmd":"status"}\n',
                 b'{"v":1, garbage\n', b"y" * 5000 + b"\n"]:
        try:
            s = socket.create_connection((host, int(port)), timeout=5)
            s.sendall(line)
            s.recv(4096)
            s.close()
        except OSError:
            pass
    rc_e, out_e, err_e = ctl(run, "evict", "node1")
    ok(rc_e == 0 and "evicting" in out_e, "--ctl evict node1 is accepted", out_e + err_e)
    # the spare that eviction needs cannot be evicted meanwhile (it was, and the job ended
    # with exit 6 after the first answer had promised a restart on a spare)
    rc_s, out_s, err_s = ctl(run, "evict", "node2")
    ok(rc_s == 1 and "recovery is under way" in err_s + out_s,
       "--ctl evict of the spare a pending eviction needs is refused", out_s + err_s)
    rc, err = finished(p)
    check_done(run, rc, err, ref_w, "manual eviction")
    rej = {e["why"] for e in of(run, "ctl_rejected")}
    ok({"wrong token", "not a JSON object"} <= rej and len(of(run, "ctl_rejected")) >= 4,
       "bad control lines are refused, each named", str(rej))
    f = of(run, "fault_detected")
    ok(f and (f[0]["kind"], f[0]["node"]) == ("evicted", "node1"),
       "manual eviction: the event names node1", str(f))
    ok([(e["node"], e["by"]) for e in of(run, "evict")] == [("node1", "manual")] and
       node_sets(run) == ["node0,node1", "node0,node2"] and not of(run, "diag"),
       "manual eviction: no diag, the spare took over", str(node_sets(run)))
    ok("fault: evicted (node node1), step " in err and "rank -1" not in err,
       "manual eviction: the console names the node, and no rank (before, 'rank -1')", err)
    # the same job again (done: nothing to train): node1 stays on the blocklist, so no spare
    # is left (before, the banner said "+1 spare")
    _, p = launch(d, "evict", shard, ["--faults", "slow=150@6+"])
    rc, err = finished(p)
    ok(rc == 0 and "on 2 node(s) (+0 spare, 1 blocked (" in err,
       "launched again after the eviction: the banner counts no spare, one node blocked", err)


def transient_nan(d, shard, ref_w):
    run, p = launch(d, "transient", shard, ["--faults", "nan-grad@7:1"])
    rc, err = finished(p)
    check_done(run, rc, err, ref_w, "transient NaN")
    f = of(run, "fault_detected")
    ok(len(f) == 1 and f[0]["kind"] == "nonfinite" and f[0]["action"] == "redo" and
       f[0]["step"] in (6, 7), "transient NaN: one event, the step redone in place", str(f))
    ok(f and (f[0].get("rank"), f[0].get("ranks"), f[0].get("node"), f[0].get("step")) ==
       (1, [1], "node1", 7), "transient NaN: the event names rank 1 (node1) and step 7", str(f))
    ok(not of(run, "restart") and len(of(run, "launch")) == 1, "transient NaN: no restart")
    rec = [e for e in of(run, "recovered") if e.get("in_place")]
    ok(len(rec) == 1 and rec[0]["step"] == 7, "transient NaN: recovered in place at step 7",
       str(rec))


def redo_takeover(d, shard, ref_w):
    """A step redone in place (a transient NaN at step 4 on rank 1), then the driver killed
    and a new one started while the job trains on: the redo is said once.  Before, each
    rank's first beat to the new driver raised its count of steps redone from 0: the redo
    was said again, as a fault at the current step, and the summary counted two."""
    run, c = cmd(d, "redotk", shard, ["--faults", "nan-grad@4:1,slow=150@6+"])
    p1 = start_logged(run, c, "driver1.log")
    wait_step(run, 8, p1)
    kill_driver(run, p1)
    rc, err = relaunch(c)
    check_done(run, rc, err, ref_w, "a redo, then the driver killed")
    f = of(run, "fault_detected")
    summ = of(run, "summary")
    ok(of(run, "driver_resumed") and [(e["kind"], e["action"], e["step"]) for e in f] ==
       [("nonfinite", "redo", 4)] and summ and summ[-1]["faults"] == {"nonfinite": 1}
       and not of(run, "restart"),
       "a redo, then the driver killed: said once, one fault in the summary",
       f"{f} {summ[-1:] if summ else None}\n{err[-2000:]}")


def spike_takeover(d, shard):
    """The driver killed at step 7, a new one started once the job trained on to step 16
    without a driver: the loss spike at step 24 is still found (the detector needs the
    changes of 16 steps before it; the new driver goes on with those driver.json kept, and
    takes the steps it did not watch from the metrics).  Before, it started its history
    afresh and said no spike in its first 16 steps; then, with driver.json's alone, the steps
    unwatched were missing (5 + 7 changes by step 24)."""
    run, c = cmd(d, "spiketk", shard, ["--faults", "spike=100@24,slow=150@6+"])
    p1 = start_logged(run, c, "driver1.log")
    wait_step(run, 7, p1)
    kill_driver(run, p1)
    metrics_steps(run, 16)
    rc, err = relaunch(c)
    a = of(run, "anomaly")
    ok(rc == 0 and of(run, "driver_resumed") and len(a) == 1 and a[0]["kind"] == "loss_spike"
       and 24 <= a[0]["step"] <= 27, "a loss spike after a driver's take-over: found",
       f"{a}\n{err[-2000:]}")


def driver_killed(d, shard):
    # long enough that the job outlives the driver's restart (its ranks
    # reconnect within a few seconds); step 4's commit stands with a warning, which the
    # first driver says and the second must not say again (rank 0's beats still count it)
    run, c = cmd(d, "driver", shard, ["--faults", "io:eio-fsync-commit@4"],
                 extra_train=["--steps", "150"])
    env = dict(os.environ, OMP_NUM_THREADS="1")
    os.makedirs(run, exist_ok=True)
    log1 = open(os.path.join(run, "driver1.log"), "w")
    p1 = subprocess.Popen(c, stdout=log1, stderr=log1, env=env)
    wait_step(run, 8, p1)
    os.kill(p1.pid, signal.SIGKILL)
    p1.wait()
    log1.close()
    time.sleep(0.5)
    with open(os.path.join(run, "m.jsonl")) as f:  # the steps made meanwhile
        logged = max((json.loads(l).get("step", -1) for l in f if l.strip()), default=-1)
    p2 = subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          errors="replace", env=env)
    rc, err = finished(p2)
    ok(rc == 0 and events(run) and events(run)[-1]["event"] == "job_done",
       "driver killed: the job finishes by itself", f"rc {rc}\n{err[-3000:]}")
    res = of(run, "driver_resumed")
    ok(res and res[0]["adopted"] is True, "driver killed: the new driver takes over the job",
       str(res) + err[-2000:])
    ok(res and res[0]["step"] >= logged > 0, "driver killed: driver_resumed says the step the "
       "job had reached, from its metrics (before, the state's older one)",
       f"logged {logged}, {res}")
    ok(not of(run, "restart") and not of(run, "fault_detected"),
       "driver killed: no restart, no fault", str([e["event"] for e in events(run)]))
    summ = of(run, "summary")
    ok(summ and summ[-1]["steps"] == 150, "driver killed: the summary covers the whole job",
       str(summ))
    a = [e for e in of(run, "anomaly") if e["kind"] == "ckpt_durability"]
    ok([e["step"] for e in a] == [4],
       "driver killed: step 4's warned commit is one anomaly, not said again after the takeover",
       str(a))


def kill_driver(run, p):
    """kill -9 the driver p once driver.json names every rank's pid; returns that state."""
    st = {}
    for _ in range(100):
        try:
            with open(os.path.join(run, "driver.json")) as f:
                st = json.load(f)
        except (OSError, ValueError):
            st = {}
        if st.get("ranks") and all(r[0] > 0 for r in st["ranks"]):
            break
        time.sleep(0.05)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    return st


def metrics_steps(run, n, timeout=60):
    """Wait until the job's metrics hold n steps (at most timeout s); the steps they hold."""
    reached, t_end = 0, time.time() + timeout
    while reached < n and time.time() < t_end:
        try:
            reached = sum(1 for l in open(os.path.join(run, "m.jsonl")) if '"loss"' in l)
        except OSError:
            pass
        time.sleep(0.05)
    return reached


def start_logged(run, c, name):
    os.makedirs(run, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with open(os.path.join(run, name), "w") as log:
        return subprocess.Popen(c, stdout=log, stderr=log, env=env)


def relaunch(c):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return finished(subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     errors="replace", env=env))


def evict_takeover(d, shard, ref_w):
    """Before, the eviction lived only in the dead driver's memory: the new one adopted the
    stopping job, reported its end as a second fault (exit), ran diag and restarted on
    node0,node1 again.  Twice: as the driver left it (the fault counted), and as a driver
    killed between the ctl answer and counting the fault would have (driver.json edited)."""
    for counted in (True, False):
        name = "evict, then the driver killed" + ("" if counted else " before counting it")
        run, c = cmd(d, "evicttk" + ("" if counted else "2"), shard, ["--faults", "slow=150@6+"])
        p1 = start_logged(run, c, "driver1.log")
        wait_step(run, 8, p1)
        rc_e, out_e, err_e = ctl(run, "evict", "node1")
        os.kill(p1.pid, signal.SIGKILL)  # right after the answer
        p1.wait()
        ok(rc_e == 0 and "evicting" in out_e, f"{name}: accepted", out_e + err_e)
        if not counted:
            path = os.path.join(run, "driver.json")
            with open(path) as f:
                st = json.load(f)
            st["fault"]["booked"], st["faults"], st["pending_fault"] = False, [], -1
            with open(path, "w") as f:
                json.dump(st, f)
        rc, err = relaunch(c)
        check_done(run, rc, err, ref_w, name)
        ok([(e["node"], e["by"]) for e in of(run, "evict")] == [("node1", "manual")] and
           node_sets(run) == ["node0,node1", "node0,node2"] and not of(run, "diag"),
           f"{name}: the new driver evicts node1, the spare takes over",
           f"{of(run, 'evict')} {node_sets(run)}\n{err[-2000:]}")
        summ = of(run, "summary")
        ok([e["kind"] for e in of(run, "fault_detected")] == ["evicted"] and summ and
           summ[-1]["faults"] == {"evicted": 1} and summ[-1]["restarts"] == 1 and
           summ[-1].get("recover_max_s", -1) > 0,
           f"{name}: one fault, one restart, its recovery booked", str(summ))


def driver_options(d, shard, ref_w):
    """Before, a new driver took the running job over whatever its options said (another
    --np: ranks it does not know; another train option: a job it misjudges)."""
    run, c = cmd(d, "opts", shard, ["--faults", "slow=150@6+"])
    p1 = start_logged(run, c, "driver1.log")
    wait_step(run, 6, p1)
    st = kill_driver(run, p1)
    with open(os.path.join(run, "driver.json")) as f:
        saved = f.read()
    n_ev = len(events(run))
    i = c.index("--np")
    j = c.index("--spares")
    for name, bad, want in [("--np", c[:i + 1] + ["4"] + c[i + 2:], "the job has 2, this command "
                             "gives 4"),
                            ("--spares", c[:j + 1] + ["2"] + c[j + 2:], "node0,node1,node2, this "
                             "command's is node0,node1,node2,node3"),
                            ("--lr", c + ["--lr", "2e-3"], "the job has 0.001, this command gives "
                             "0.002")]:
        env = dict(os.environ, OMP_NUM_THREADS="1")
        r = subprocess.run(bad, capture_output=True, text=True, env=env, timeout=60)
        ok(r.returncode == 2 and name in r.stderr and want in r.stderr,
           f"a new driver with another {name} than the running job: refused, naming both values",
           f"rc {r.returncode}: {r.stderr[-800:]}")
    # the same command line, another value from a --config file or the environment: compared
    # by the effective values (before, only the command lines were: the changed file was taken
    # over without a word, and its value ran from the next restart on)
    changed, same_cfg = os.path.join(d, "opts-changed.cfg"), os.path.join(d, "opts-same.cfg")
    with open(changed, "w") as f:
        f.write("nonfinite-redo = 2\n")
    with open(same_cfg, "w") as f:  # and the options a start's rank 0 writes into train.cfg
        f.write(f'nonfinite-redo = 1\nresume = "auto"\npeak-cache = "{run}"\n')
    for name, bad, extra, want in [
            ("--config", c + ["--config", changed], {}, "the job has 1, this command gives 2"),
            ("MS_NONFINITE_REDO", c, {"MS_NONFINITE_REDO": "3"},
             "the job has 1, this command gives 3")]:
        env = dict(os.environ, OMP_NUM_THREADS="1", **extra)
        r = subprocess.run(bad, capture_output=True, text=True, env=env, timeout=60)
        want = "train option --nonfinite-redo: " + want
        ok(r.returncode == 2 and want in r.stderr,
           f"a new driver whose {name} gives another value than the running job's: refused, "
           "naming both values", f"rc {r.returncode}: {r.stderr[-800:]}")
    with open(os.path.join(run, "driver.json")) as f:
        same = f.read() == saved
    ok(same and len(events(run)) == n_ev and st.get("mpirun_pid") and
       os.path.exists(f"/proc/{st['mpirun_pid']}"),
       "refused drivers leave the job and driver.json untouched", f"same {same}")
    # the same options, --lr spelled 0.001 (the job's 1e-3): compared as numbers, not text
    # (and a --config file that gives the job's value is the same options)
    rc, err = relaunch(c + ["--lr", "0.001", "--config", same_cfg])
    check_done(run, rc, err, ref_w, "the same command (--lr 0.001 for 1e-3) after refused ones")
    res = of(run, "driver_resumed")
    ok(res and res[0]["adopted"] is True and not of(run, "fault_detected"),
       "the same command takes the job over", str(res))


def driver_gone(d, name, shard, label):
    """A 2-rank job of slow steps whose driver is killed (-9) at step 8: its run directory,
    its launch command (to take it over) and the dead driver's state."""
    run, c = cmd(d, name, shard, ["--faults", "slow=150@6+"])
    p1 = start_logged(run, c, "driver1.log")
    wait_step(run, 8, p1)
    st = kill_driver(run, p1)
    ok(len(st.get("ranks", [])) == 2, f"{label}: driver.json names the ranks", str(st))
    return run, c, st


def rank_gone_takeover(d, shard, ref_w):
    """Before, the dead rank had no connection to this driver to close: rank 0's error
    (a peer process exited) came first and was reported as a comm fault of rank 0."""
    run, c, st = driver_gone(d, "ranktk", shard, "rank gone in the take-over")
    # the ranks train on without a driver: rank 1 dies some steps later (the new driver's
    # fault said the step the dead one last saved, from driver.json)
    reached = metrics_steps(run, 14)
    if len(st.get("ranks", [])) == 2:
        os.kill(st["ranks"][1][0], signal.SIGKILL)
    rc, err = relaunch(c)
    check_done(run, rc, err, ref_w, "rank gone in the take-over")
    f = of(run, "fault_detected")
    ok(f and f[0]["step"] >= 14, f"rank gone in the take-over: the fault's step is the job's "
       f"(rank 1 killed after step {reached}), not the dead driver's last", str(f))
    ok(f and (f[0]["kind"], f[0]["rank"], f[0]["node"]) == ("crash", 1, "node1") and
       len(f) == 1 and of(run, "restart"),
       "rank gone in the take-over: the crash of rank 1, then a restart",
       f"{f}\n{err[-2000:]}")
    ok(f and f[0].get("host") == socket.gethostname(),
       "rank gone in the take-over: the fault names its host (from driver.json)", str(f))


def rank_stopped_takeover(d, shard, ref_w):
    """A rank stopped (SIGSTOP) while no driver watched never reconnects to the new one.
    Before, only --startup-timeout (600 s) applied to it, and the rank that waited for it was
    named for the hang after the progress limit (its node diagnosed, the stopped one not)."""
    run, c, st = driver_gone(d, "stoptk1", shard, "rank stopped in the take-over")
    metrics_steps(run, 12)
    if len(st.get("ranks", [])) == 2:
        os.kill(st["ranks"][1][0], signal.SIGSTOP)
    rc, err = relaunch(c)
    check_done(run, rc, err, ref_w, "rank stopped in the take-over")
    f = of(run, "fault_detected")
    ok(f and (f[0]["kind"], f[0]["rank"], f[0]["node"]) == ("hang", 1, "node1") and
       of(run, "restart"), "rank stopped in the take-over: a hang of rank 1 (node1), then a "
       "restart", f"{f}\n{err[-2000:]}")
    ok(f and f[0]["detect_s"] <= 4 + 3 + 2, "rank stopped in the take-over: found within the "
       "heartbeat timeout and a redial (4 + 3 s) of the takeover", str(f))


def job_gone_takeover(d, shard, ref_w):
    """Before, the new driver restarted a job that had ended while no driver watched with no
    fault and no restart counted: the summary said 0 restarts for two starts, and the
    restart limits did not apply."""
    run, c = cmd(d, "jobtk", shard, ["--faults", "slow=150@6+"])
    p1 = start_logged(run, c, "driver1.log")
    wait_step(run, 8, p1)
    st = kill_driver(run, p1)
    pids = [st.get("mpirun_pid", 0)] + [r[0] for r in st.get("ranks", [])]
    segs, sess = vader_segments(pids[1:]), session_dirs(pids[0])
    for pid in pids:
        if pid > 0:
            os.kill(pid, signal.SIGKILL)
    for _ in range(100):  # the ranks are the dead driver's orphans now: init reaps them
        if not any(pid > 0 and os.path.exists(f"/proc/{pid}") for pid in pids):
            break
        time.sleep(0.05)
    rc, err = relaunch(c)
    check_done(run, rc, err, ref_w, "job gone in the take-over")
    f = of(run, "fault_detected")
    summ = of(run, "summary")
    ok([(e["kind"], e["rank"]) for e in f] == [("exit", -1)] and
       "no driver watched" in f[0]["detail"] and len(of(run, "restart")) == 1 and summ and
       summ[-1]["restarts"] == 1 and summ[-1]["faults"] == {"exit": 1},
       "job gone in the take-over: a fault, the restart counted", f"{f} {summ}\n{err[-2000:]}")
    left = [x for x in segs | set(sess) if os.path.exists(x)]
    ok(len(segs) == 2 and len(sess) == 1 and not left and
       f"the job's mpirun (pid {pids[0]}) is gone; removed" in err,
       "job gone in the take-over: the new driver removes the killed mpirun's files (the ranks' "
       "shared-memory segments, its session directory)",
       f"segments {segs}, session {sess}, left {left}\n{err[-2000:]}")


def job_stopped_takeover(d, shard, ref_w):
    """The documented way to change a job's options while no driver runs: stop it (SIGUSR1 to
    its mpirun: the ranks take a final checkpoint) and launch again.  Before, the new driver
    counted that clean end as a fault (exit, rank -1), ran diag, and with --max-restarts 0
    gave up (exit 3)."""
    run, c = cmd(d, "stoptk", shard, ["--faults", "slow=150@6+"])
    p1 = start_logged(run, c, "driver1.log")
    wait_step(run, 8, p1)
    st = kill_driver(run, p1)
    mp = st.get("mpirun_pid", 0)
    if mp > 0:
        os.kill(mp, signal.SIGUSR1)
    for _ in range(400):  # the final checkpoint, then the ranks and mpirun end
        if not (mp > 0 and os.path.exists(f"/proc/{mp}")):
            break
        time.sleep(0.05)
    stopped = open(os.path.join(run, "ckpt", "stopped")).read() if os.path.exists(
        os.path.join(run, "ckpt", "stopped")) else ""
    ok(stopped.startswith("step "), "a clean stop: CKPT_DIR/stopped names its step", stopped)
    rc, err = relaunch(c + ["--max-restarts", "0"] if "--" not in c else
                       c[:c.index("--")] + ["--max-restarts", "0"] + c[c.index("--"):])
    check_done(run, rc, err, ref_w, "job stopped in the take-over")
    ok(not of(run, "fault_detected") and "was stopped while no driver watched it" in err,
       "job stopped in the take-over: no fault, started again", f"{of(run, 'fault_detected')}\n"
       f"{err[-2000:]}")
    ok(not os.path.exists(os.path.join(run, "ckpt", "stopped")),
       "the restarted job removed CKPT_DIR/stopped")


def straggler(d, shard, ref_w):
    run, p = launch(d, "straggler", shard,
                    ["--faults", "slow=300@4+:node=node1", "--straggler-rounds", "4"])
    rc, err = finished(p)
    check_done(run, rc, err, ref_w, "straggler")
    f = of(run, "fault_detected")
    ok(f and (f[0]["kind"], f[0]["rank"], f[0]["node"]) == ("straggler", 1, "node1"),
       "straggler: detected on rank 1, node1", str(f) + err[-2000:])
    ok([(e["node"], e["by"]) for e in of(run, "evict")] == [("node1", "straggler")] and
       node_sets(run) == ["node0,node1", "node0,node2"], "straggler: evicted, the spare took over",
       str(of(run, "evict")))


def spike(d, shard):
    run, p = launch(d, "spike", shard, ["--faults", "spike=100@24"])
    rc, err = finished(p)
    a = of(run, "anomaly")
    ok(rc == 0 and a and a[0]["kind"] == "loss_spike" and 24 <= a[0]["step"] <= 27,
       "loss spike: an anomaly event at the spike", str(a) + err[-2000:])
    ok(not of(run, "restart"), "loss spike: no restart")


def commit_once(d, shard, ref_w):
    """A commit that failed (step 8), and one that stood with a warning (step 16: the
    directory's fsync after the rename failed): the first is a watched fault, the second an
    anomaly that names the disk (before, only the rank's log said it)."""
    run, p = launch(d, "commit", shard, ["--faults", "io:eio-fsync-shard@8,io:eio-fsync-commit@16"])
    rc, err = finished(p)
    check_done(run, rc, err, ref_w, "a failed commit")
    f = of(run, "fault_detected")
    ok(len(f) == 1 and (f[0]["kind"], f[0]["action"]) == ("ckpt_commit", "watch")
       and 8 <= f[0]["step"] <= 12 and "step_00000008" in f[0]["detail"]
       and "Input/output" in f[0]["detail"], "a failed commit: step 8's, reported, watched", str(f))
    rec = [e for e in of(run, "recovered") if e.get("commit")]
    ok(rec and rec[0]["step"] == 12 and not of(run, "restart"),
       "a failed commit: the next one commits, no restart", str(rec))
    a = [e for e in of(run, "anomaly") if e["kind"] == "ckpt_durability"]
    ok(len(a) == 1 and (a[0]["step"], a[0]["rank"], a[0]["node"]) == (16, 0, "node0")
       and "fsync directory" in a[0]["detail"] and "step 16 is committed" in a[0]["detail"]
       and "committed with a warning" in err,
       "a commit with a warning: one ckpt_durability anomaly, step 16, rank 0 on node0",
       str(a) + err[-1500:])


def commit_rank(d, shard, ref_w):
    """A commit that failed on rank 1 alone: the event names rank 1 (node1), whose write
    failed, not the first rank whose beat reported the failure (the others say "rank 1
    failed to ..."; before, "another rank failed", and the event named them)."""
    run, p = launch(d, "commitrank", shard, ["--faults", "io:enospc-shard@8:1"])
    rc, err = finished(p)
    check_done(run, rc, err, ref_w, "a commit failed on rank 1")
    f = of(run, "fault_detected")
    ok(len(f) == 1 and (f[0]["kind"], f[0]["rank"], f[0]["node"]) == ("ckpt_commit", 1, "node1"),
       "a commit failed on rank 1: the event names rank 1 on node1", str(f))


def last_step_fault(d, shard, ref_w):
    """A crash during the final checkpoint (step 40 of 40): the restart resumes from that
    step's host-memory snapshot and is done with no step after it.  Before, no recovered
    event was written and the summary said no recovery time ("recover_p50_s": -1)."""
    run, p = launch(d, "laststep", shard, ["--faults", "stage2:mid-shard@40:1"])
    rc, err = finished(p)
    check_done(run, rc, err, ref_w, "a crash in the final checkpoint")
    rec, summ = of(run, "recovered"), of(run, "summary")
    ok(len(of(run, "fault_detected")) == 1 and rec and summ and summ[-1]["recover_p50_s"] >= 0,
       "a crash in the final checkpoint: recovered, with its time in the summary",
       f"{of(run, 'fault_detected')} {rec} {summ}\n{err[-1500:]}")


def storage_full(d, shard):
    run, p = launch(d, "storage", shard, ["--faults", "io:enospc-shard@8+,diag:storage"])
    rc, err = finished(p)
    f = of(run, "fault_detected")
    ok([(e["kind"], e["action"]) for e in f] == [("ckpt_commit", "watch"),
                                                  ("ckpt_commit", "restart")]
       and f[0]["disk_full"], "a full disk: two failed commits, then the job is stopped", str(f))
    ok(rc == 7 and "storage" in err and "every node" in err,
       "a full disk failing diag on every node: exit 7, saying why", f"rc {rc}\n{err[-2000:]}")
    ok(not of(run, "evict") and of(run, "job_failed"), "a full disk: nothing evicted, job_failed")


def preflight(d, shard, ref_w):
    run, p = launch(d, "preflight", shard, ["--preflight", "1", "--diag-peers", "1",
                                             "--diag-slow-factor", "0.5",
                                             "--faults",
                                             "diag:slow:node=node1,diag:blip:node=node2"])
    rc, err = finished(p)
    check_done(run, rc, err, ref_w, "pre-flight")
    diag = {e["node"]: (e["ok"], e["when"], e["failed"]) for e in of(run, "diag") if "node" in e}
    # node1's GEMM is slowed; its memory bandwidth may read slow too beside another test's
    # job on a loaded 2-core host (a CI run said "gemm, memory"): the GEMM must be among them
    n1 = diag.get("node1", (None, None, ""))
    ok(diag.get("node0") == (True, "preflight", "") and diag.get("node2") == (True, "preflight", "")
       and n1[:2] == (False, "preflight") and "gemm" in n1[2].split(", "),
       "pre-flight: diag on every node before the start fails node1's GEMM speed", str(diag))
    slow = [e["detail"] for e in of(run, "diag") if e.get("node") == "node1"]
    ok(slow and "x the median" in slow[0] and "of the other nodes" in slow[0],
       "pre-flight: node1 is slow against the other nodes", str(slow))
    ev = [(e["node"], e["by"]) for e in of(run, "evict")]
    ok(ev == [("node1", "diag")] and node_sets(run) == ["node0,node2"]
       and not of(run, "fault_detected") and not of(run, "restart"),
       "pre-flight: node1 evicted, the job starts on node0 and the spare, no fault, no restart",
       f"{ev} {node_sets(run)} {of(run, 'fault_detected')}")
    ok("pre-flight diag: node node1: FAIL" in err, "pre-flight: the log names node1", err[-2000:])
    # node2's blip is a tenth of its speed, against the median of node0 and node1 (a mean of
    # two): node0 measured in a busy moment of this machine (a third of node2's speed: a CI
    # run with other work beside it) hides it, so that it was slow at first is not asserted,
    # as in own_history below; that node1 is measured again, and node2 passes, is
    again = re.search(r"diag: node1(, node2)? slow against the other nodes; measuring every "
                      r"node once more before evicting", err)
    ok(again, "pre-flight: node2, slow in the first measurement only (diag:blip), is measured "
       "again with the others before anything is evicted, and passes"
       + (" (slow at first)" if again and again.group(1) else
          " (not slow even at first: this machine's load)"), err[-2000:])


def busy_host(d, shard, ref_w):
    # node1's history on this host says it was a thousand times as fast (measured while the
    # host was idle, say): on one host that is the host's past, shared by every node, not
    # node1's own, so the self-test after a fault must not fail node1 for it
    run = os.path.join(d, "busyhost")
    os.makedirs(os.path.join(run, "diag"))
    with open(os.path.join(run, "diag", "node1.jsonl"), "w") as f:
        for _ in range(3):
            for check, value, unit, device, size in (("gemm", 1e6, "GFLOP/s", "cpu", 1024),
                                                      ("memory", 1e5, "GB/s", "host", 64)):
                f.write(json.dumps({"check": check, "value": value, "unit": unit,
                                    "device": device, "size": size, "host": "h",
                                    "time": 1}) + "\n")
    run, p = launch(d, "busyhost", shard, ["--diag-slow-factor", "0.5", "--faults", "kill@6:1"])
    rc, err = finished(p)
    check_done(run, rc, err, ref_w, "busy host")
    diag = {e["node"]: (e["ok"], e["detail"]) for e in of(run, "diag") if "node" in e}
    ok(diag and all(v[0] for v in diag.values()),
       "busy host: diag passes every node, node1 slow only against the host's past", str(diag))
    ok(not of(run, "evict") and node_sets(run) == ["node0,node1", "node0,node1"],
       "busy host: nothing evicted, the restart on the same nodes", str(node_sets(run)))
    hist = open(os.path.join(run, "diag", "node1.jsonl")).read().splitlines()
    ok(len(hist) > 6, "busy host: the self-test's results are still kept in node1's history",
       str(len(hist)))


def own_history(d, shard, ref_w):
    # three hosts of this machine (127.0.0.1-3 are all loopback: the heartbeats' address
    # reaches each), run here by an mpirun that drops the hostfile: the supervisor behaves
    # as with --hostfile, so each node's speeds are compared with its own history
    base = os.path.join(d, "ownhist")
    os.makedirs(base)
    hosts = os.path.join(base, "hosts")
    with open(hosts, "w") as f:
        f.write("127.0.0.1 slots=1\n127.0.0.2 slots=1\n127.0.0.3 slots=1\n")
    wrap = os.path.join(base, "mpirun-here")
    with open(wrap, "w") as f:
        f.write(f"#!{sys.executable}\nimport os, sys\na = sys.argv[1:]\n"
                "while '--hostfile' in a:\n    i = a.index('--hostfile'); del a[i:i + 2]\n"
                "while '--map-by' in a:\n    i = a.index('--map-by'); del a[i:i + 2]\n"
                f"os.execv({MPIRUN!r}, [{MPIRUN!r}, '--oversubscribe', *a])\n")
    os.chmod(wrap, 0o755)
    # each node's GEMM speed as the supervisor's self-test measures it: 1024^3, the three
    # nodes at once, the median of the three
    p = subprocess.run([MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "3", BIN,
                        "diag", "--json", "--fail-exit", "0", "--gemm-n", "128",
                        "--gemm-speed-n", "1024", "--mem-mb", "64"], capture_output=True,
                       text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    speeds = sorted(c["value"] for l in p.stdout.splitlines() if l.startswith("{")
                    for c in json.loads(l)["checks"] if c["name"] == "gemm")
    speed = speeds[1] if len(speeds) == 3 else 0
    ok(speed > 0, "own history: this machine's GEMM speed measured", p.stdout + p.stderr)
    run = os.path.join(base, "run")
    os.makedirs(os.path.join(run, "diag"))
    # 127.0.0.1: its history at a quarter of this speed, so its floor is 0.075 x it: its
    # diag:blip (a tenth of its speed) mostly reads below, a second measurement above (the
    # nodes' speeds here vary by 5x from run to run with this machine's load: that it was
    # slow at first is not asserted, only that it is never evicted); 127.0.0.2: one run a
    # thousand times as fast (one earlier run is no history to fail a node on);
    # 127.0.0.3: three such runs
    for node, value, runs in (("127.0.0.1", speed / 4, 3), ("127.0.0.2", speed * 1000, 1),
                              ("127.0.0.3", speed * 1000, 3)):
        with open(os.path.join(run, "diag", node + ".jsonl"), "w") as f:
            for _ in range(runs):
                f.write(json.dumps({"check": "gemm", "value": value, "unit": "GFLOP/s",
                                    "device": "cpu", "size": 1024, "host": "h",
                                    "time": 1}) + "\n")  # no local_rank: any
    run, p = launch(base, "run", shard, ["--hostfile", hosts, "--mpirun", wrap, "--preflight",
                                         "1", "--diag-peers", "0", "--diag-slow-factor", "0.3",
                                         "--faults", "diag:blip:node=127.0.0.1"])
    rc, err = finished(p)
    check_done(run, rc, err, ref_w, "own history")
    diag = {e["node"]: (e["ok"], e["failed"], e["detail"]) for e in of(run, "diag")
            if "node" in e}
    ok({n: v[0] for n, v in diag.items()} ==
       {"127.0.0.1": True, "127.0.0.2": True, "127.0.0.3": False},
       "own history: only 127.0.0.3 fails the pre-flight self-test", str(diag))
    ok(re.search(r"diag: (127\.0\.0\.1, )?127\.0\.0\.3 slow against its own history; "
                 r"measuring every node once more before evicting", err),
       "own history: the nodes slow against their history are measured once more", err[-3000:])
    d1, d2, d3 = (diag.get(n, (0, "", ""))[2] for n in ("127.0.0.1", "127.0.0.2", "127.0.0.3"))
    ok(not d1 or ("passed when measured once more" in d1 and "SLOW" in d1
                  and "[injected fault diag:blip]" in d1),
       "own history: 127.0.0.1, slow the first time only (diag:blip), passes"
       + (" (slow at first)" if d1 else " (not slow even at first: this machine's load)"), d1)
    h2 = [json.loads(l) for l in open(os.path.join(run, "diag", "127.0.0.2.jsonl"))]
    ok(not d2 and len([e for e in h2 if e["check"] == "gemm"]) > 1,
       "own history: one earlier run does not judge 127.0.0.2 (it passes, its result kept)",
       f"{d2} {h2}")
    ok(diag.get("127.0.0.3", (0, ""))[1] == "gemm" and "SLOW" in d3
       and "slow again when measured once more" in d3,
       "own history: 127.0.0.3, slow in both measurements, fails gemm", d3)
    ev = [(e["node"], e["by"]) for e in of(run, "evict")]
    ok(ev == [("127.0.0.3", "diag")] and node_sets(run) == ["127.0.0.1,127.0.0.2"],
       "own history: 127.0.0.3 evicted, the job on 127.0.0.1 and 127.0.0.2",
       f"{ev} {node_sets(run)}")


def main():
    d, shard = start("ms_sup_nodes_")
    run, p = launch(d, "ref", shard)
    rc, err = finished(p)
    ok(rc == 0 and not of(run, "fault_detected"), "the fault-free run", err[-3000:])
    ref_w = sha(os.path.join(run, "w.safetensors"))
    ok(ref_w is not None, "the fault-free run saved its weights")
    cases = {"nan": lambda: persistent_nan(d, shard, ref_w),
             "diag": lambda: diag_fails(d, shard, ref_w),
             "evict": lambda: manual_evict(d, shard, ref_w),
             "transient": lambda: transient_nan(d, shard, ref_w),
             "driver": lambda: driver_killed(d, shard),
             "redotk": lambda: redo_takeover(d, shard, ref_w),
             "spiketk": lambda: spike_takeover(d, shard),
             "straggler": lambda: straggler(d, shard, ref_w),
             "spike": lambda: spike(d, shard),
             "commit": lambda: commit_once(d, shard, ref_w),
             "commitrank": lambda: commit_rank(d, shard, ref_w),
             "laststep": lambda: last_step_fault(d, shard, ref_w),
             "storage": lambda: storage_full(d, shard),
             "evicttk": lambda: evict_takeover(d, shard, ref_w),
             "options": lambda: driver_options(d, shard, ref_w),
             "ranktk": lambda: rank_gone_takeover(d, shard, ref_w),
             "rankstoptk": lambda: rank_stopped_takeover(d, shard, ref_w),
             "jobtk": lambda: job_gone_takeover(d, shard, ref_w),
             "stoptk": lambda: job_stopped_takeover(d, shard, ref_w),
             "preflight": lambda: preflight(d, shard, ref_w),
             "busyhost": lambda: busy_host(d, shard, ref_w),
             "ownhist": lambda: own_history(d, shard, ref_w)}
    for name in sys.argv[1:] or cases:  # a few by name while developing
        cases[name]()
    finish(d)


if __name__ == "__main__":
    main()
