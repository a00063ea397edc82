"""The troubleshooting tools on real multi-rank runs (docs/operations.md,
"Troubleshooting"):

1. the merged timeline of a dp2 x pp2 run (4 ranks): every rank named with
   its coordinates and host, spans on their lanes, properly nested, no
   negative durations, one flow arrow per pipeline send, and every receive
   ending after its send started within the stated clock skew;
2. a straggler made from outside: rank 1 of a dp2 run stopped and continued
   (SIGSTOP / SIGCONT, half the time) is named by `trace stragglers`, and
   rank 0, which waited for it, is not;
3. an injected straggler on tp2 x pp2 (4 ranks, ~12 ms of compute a step):
   rank 2 of stage 1 with --inject-fault slow=60 (its sleep stands for
   slower compute) is named by `trace stragglers`, its tp peer and stage 0
   are not;
4. a hang in compute on tp2 x pp2: rank 1 (stage 0) stops making progress
   (--inject-fault hang); ranks 0, 2 and 3 time out in different ops and
   ask each other for dumps, and each keeps the dump of its own timeout
   (what it waited in), so `trace hang` names rank 1, not rank 0;
5. a hang: rank 5 of an 8-rank dp2 x tp2 x pp2 run stopped with SIGSTOP;
   the others time out (--comm-timeout), write hang dumps, and `trace hang`
   names rank 5, with its coordinates, as the suspect;
6. a hang under the supervisor (`megascale launch`), restarted: the new
   attempt's ranks move the failed one's logs and hang dumps to DIR/prev/,
   where `trace hang` names the hung rank and `trace merge` reads them;
7. --trace-max-mb on a dp2 run: each rank's log rotates to .1, the two stay
   within the bound, and `trace merge` / `stragglers` read across the
   rotation.

Runs under mpirun --oversubscribe.  Environment: MS_BIN."""
import glob
import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "mpi"))
from mpi_common import BIN, MPIRUN, finish, mpi, ok, start  # noqa: E402

TINY = ["--vocab", "256", "--layers", "4", "--dim", "64", "--heads", "4", "--seq-max", "32",
        "--seq", "32", "--lr", "1e-3", "--log-every", "1", "--peak-flops", "1e11",
        "--threads", "1"]


def tool(*args, timeout=120):
    return subprocess.run([BIN, "trace", *args], capture_output=True, text=True, errors="replace",
                          timeout=timeout)


def tool_json(name, tdir, *extra):
    """`trace NAME DIR --json [EXTRA...]`: the finished process and its report ({} when
    unreadable)."""
    t = tool(name, tdir, "--json", *extra)
    try:
        return t, json.loads(t.stdout)
    except ValueError:
        return t, {}


def nesting_errors(events):
    """Complete events per (pid, tid) that partially overlap an earlier one."""
    by = {}
    for e in events:
        by.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"], e["name"]))
    bad = []
    for key, spans in by.items():
        spans.sort(key=lambda s: (s[0], -s[1]))
        stack = []
        for b, e, n in spans:
            while stack and stack[-1][1] <= b + 1e-3:
                stack.pop()
            if stack and e > stack[-1][1] + 1e-3:
                bad.append((key, n, b, e, stack[-1]))
            stack.append((b, e, n))
    return bad


def check_merge(d, shard):
    tdir = os.path.join(d, "t_merge")
    # validation passes too: a pass's span starts before the ZeRO all-gather
    # its first forward waits for (it was put after it: overlapping its parent)
    r = mpi(4, "train", "--train-data", shard, *TINY, "--batch", "8", "--micro-batch", "1",
            "--steps", "6", "--pp", "2", "--dp", "2", "--trace-dir", tdir, "--val-data", shard,
            "--val-every", "2", "--val-batches", "1")
    ok(r.returncode == 0, "dp2 x pp2 run with tracing", r.stderr)
    files = sorted(f for f in os.listdir(tdir) if f.startswith("events_r")) if r.returncode == 0 else []
    ok(files == [f"events_r{i:05d}.jsonl" for i in range(4)], "one event log per rank", str(files))
    out = os.path.join(d, "merged.json")
    m = tool("merge", tdir, "-o", out)
    ok(m.returncode == 0, "trace merge", m.stderr + m.stdout)
    if m.returncode != 0:
        return
    ok("overlap their parent" not in m.stderr, "merge: every span nests (validation passes too)",
       m.stderr)
    tr = json.load(open(out))
    ev = tr["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in ev
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    for rank in range(4):
        pp, dp = rank // 2, rank % 2  # tp 1: rank = pp*2 + dp
        ok(f"rank {rank} (dp {dp}, pp {pp}, tp 0)" in names.get(rank, ""),
           f"rank {rank} named with its coordinates", str(names))
    order = {e["pid"]: e["args"]["sort_index"] for e in ev
             if e.get("ph") == "M" and e.get("name") == "process_sort_index"}
    ok(sorted(order, key=order.get) == [0, 1, 2, 3], "processes sorted by (pp, dp, tp)", str(order))
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    xs = [e for e in ev if e.get("ph") == "X"]
    lane = lambda e: threads.get((e["pid"], e["tid"]), "")
    fb = [e for e in xs if e["name"] in ("fwd", "bwd")]
    ok(fb and all(lane(e) == "compute" for e in fb), "fwd/bwd spans on the compute lane",
       str(set(map(lane, fb))))
    ok(all("step" in e["args"] and "mb" in e["args"] for e in fb), "fwd/bwd carry step and mb")
    pp_sends = [e for e in xs if e["name"] == "send" and lane(e).startswith("comm:pp")]
    pp_recvs = [e for e in xs if e["name"] == "recv" and lane(e).startswith("comm:pp")]
    ok(len(pp_sends) > 0 and len(pp_sends) == len(pp_recvs), "pipeline sends and receives on comm:pp",
       f"{len(pp_sends)} sends, {len(pp_recvs)} recvs")
    # every point-to-point op (the pipeline's, and the clock references on comm:world)
    sends = [e for e in xs if e["name"] == "send" and lane(e).startswith("comm:")]
    recvs = [e for e in xs if e["name"] == "recv" and lane(e).startswith("comm:")]
    rs = [e for e in xs if e["name"] == "reduce_scatter" and lane(e).startswith("comm:dp")]
    ok(len(rs) > 0, "ZeRO reduce-scatters on comm:dp", str(len(rs)))
    waits = [e for e in xs if e["name"] == "wait" and lane(e) == "compute"]
    ok(len(waits) > 0, "the compute lane shows its waits on communication", str(len(waits)))
    ok(all(e["dur"] >= 0 and e["ts"] >= 0 for e in xs), "no negative times or durations")
    bad = nesting_errors(xs)
    ok(not bad, "complete events nest properly on every track", str(bad[:5]))
    fs = {e["id"]: e for e in ev if e.get("ph") == "f"}
    ss = [e for e in ev if e.get("ph") == "s"]
    ok(len(ss) == len(sends) and all(s["id"] in fs for s in ss),
       "one flow arrow per send, each with its end", f"{len(ss)} flows, {len(sends)} sends")
    ok(sum(1 for s in ss if lane(s).startswith("comm:pp")) == len(pp_sends),
       "one flow arrow per pipeline send", f"{len(pp_sends)} pipeline sends")
    skew = tr.get("otherData", {}).get("clock_skew_us", None)
    ok(isinstance(skew, (int, float)) and skew >= 0, "the residual clock skew is in the metadata",
       str(tr.get("otherData")))
    # every receive ends after its send started, within the clocks' error: the stated skew
    # bounds each rank's offset to rank 0's clock, so two other ranks' errors add up (2 x skew)
    span_at = {}
    for e in sends + recvs:
        span_at.setdefault((e["pid"], e["tid"]), []).append(e)

    def enclosing(f):
        for e in span_at.get((f["pid"], f["tid"]), []):
            if e["ts"] - 1e-3 <= f["ts"] <= e["ts"] + e["dur"] + 1e-3:
                return e
        return None
    late = 0
    for s in ss:
        a, b = enclosing(s), enclosing(fs.get(s["id"], s))
        if a is None or b is None or b["ts"] + b["dur"] < a["ts"] - 2 * (skew or 0) - 1:
            late += 1
    ok(late == 0, "clocks aligned: each receive ends after its send starts", f"{late} of {len(ss)}")


def rank_pids(tag, n, deadline):
    """{rank: pid} of the ranks whose environment has MS_TEST_TAG=tag."""
    found = {}
    while time.time() < deadline and len(found) < n:
        for p in os.listdir("/proc"):
            if not p.isdigit():
                continue
            try:
                env = open(f"/proc/{p}/environ", "rb").read().split(b"\0")
            except OSError:
                continue
            if f"MS_TEST_TAG={tag}".encode() not in env:
                continue
            for kv in env:
                if kv.startswith(b"OMPI_COMM_WORLD_RANK="):
                    found[int(kv.split(b"=")[1])] = int(p)
        time.sleep(0.2)
    return found


def launch(n, args, tag):
    env = dict(os.environ, MS_TEST_TAG=tag, OMP_NUM_THREADS="1")
    cmd = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-x", "MS_TEST_TAG", "-np", str(n),
           BIN, *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            errors="replace", env=env)


def steps_done(metrics):
    try:
        return sum(1 for l in open(metrics) if '"loss"' in l)
    except OSError:
        return 0


def check_straggler(d, shard):
    tdir, metrics = os.path.join(d, "t_strag"), os.path.join(d, "strag.jsonl")
    args = ["train", "--train-data", shard, *TINY, "--dim", "128", "--batch", "64", "--seq", "32",
            "--steps", "40", "--dp", "2", "--trace-dir", tdir, "--metrics", metrics]
    p = launch(2, args, "strag")
    pids = rank_pids("strag", 2, time.time() + 60)
    t_end = time.time() + 240
    while steps_done(metrics) < 4 and p.poll() is None and time.time() < t_end:
        time.sleep(0.1)
    victim = pids.get(1)
    cycles = 0
    # rank 1 runs a quarter of the time, in windows of 20 ms: a step's compute must be longer
    # than a window (batch 64: ~40 ms on a fast AMD Zen 5 core) so that every step of rank 1 is
    # stopped inside its compute; with ~10 ms steps most fit in a window and the stops land
    # in rank 1's waits instead, which do not count as compute
    while victim and p.poll() is None and time.time() < t_end:
        try:
            os.kill(victim, signal.SIGSTOP)
            time.sleep(0.06)
            os.kill(victim, signal.SIGCONT)
            time.sleep(0.02)
            cycles += 1
        except ProcessLookupError:
            break
    out, err = p.communicate(timeout=120)
    ok(p.returncode == 0 and cycles > 10, "dp2 run with rank 1 stopped and continued",
       f"rc {p.returncode}, {cycles} cycles, pids {pids}\n{err}")
    # the relative score only (a window longer than the run turns the individual one off):
    # a loaded CI machine slows every rank now and then, which the individual score sees
    # as drift; it is tested on synthetic logs in test_trace_tools.py
    r = tool("stragglers", tdir, "--json", "--window", "1000")
    ok(r.returncode == 0, "trace stragglers --json", r.stderr + r.stdout)
    try:
        rep = json.loads(r.stdout)
    except ValueError:
        rep = {}
    medians = [f"rank {k.get('rank')} {k.get('median_ms') or 0:.1f} ms" for k in rep.get("ranks", [])]
    print("note: compute medians " + ", ".join(medians))
    ok(rep.get("stragglers") == [1], "the stopped rank is the straggler, the waiting one is not",
       r.stdout + r.stderr)
    t = tool("stragglers", tdir, "--window", "1000", "--png", os.path.join(d, "heat.png"))
    ok(t.returncode == 0 and "rank 1" in t.stdout and "STRAGGLER" in t.stdout,
       "text report names rank 1", t.stdout + t.stderr)
    png = open(os.path.join(d, "heat.png"), "rb").read(8) if t.returncode == 0 else b""
    ok(png == b"\x89PNG\r\n\x1a\n", "heat map written as PNG")


def check_slow_fault(d, shard):
    tdir = os.path.join(d, "t_slow")
    # dim 128, batch 32: about 12 ms of compute a step on a Zen 5 core.  With batch 8 and
    # dim 64 (2 ms) the four ranks on two cores were each preempted for a whole time slice
    # or not at all, and a loaded CI run read rank 1 at 0.748 of its tp peer, named with
    # the slowed rank; over 12 ms the slices average out (0.97-0.98 beside a CPU hog)
    r = mpi(4, "train", "--train-data", shard, *TINY, "--dim", "128", "--batch", "32", "--steps",
            "12", "--tp", "2", "--pp", "2", "--trace-dir", tdir, "--inject-fault", "slow=60@2+:2")
    ok(r.returncode == 0, "tp2 x pp2 run with rank 2 slowed", r.stderr[-3000:])
    # the relative score only, as in check_straggler: a tp peer's last window once read
    # 1.38x its best on a loaded CI machine (individual 0.73), and was named with the slowed
    # rank.  That peer is behind no rank of its stage now (test_trace_tools.py,
    # test_individual_stage), but both ranks of stage 0 slowing together on such a machine
    # would still be named, as a throttled node should be
    t, rep = tool_json("stragglers", tdir, "--window", "1000")
    medians = [f"rank {k.get('rank')} {k.get('median_ms') or 0:.1f} ms" for k in rep.get("ranks", [])]
    print("note: tp2 x pp2 compute medians " + ", ".join(medians))
    ok(t.returncode == 0 and rep.get("stragglers") == [2],
       "the slowed rank 2 (pp 1, tp 0) is the straggler, its tp peer and stage 0 are not",
       t.stdout + t.stderr)


def check_stage_hang(d, shard):
    tdir = os.path.join(d, "t_stage_hang")
    r = mpi(4, "train", "--train-data", shard, *TINY, "--batch", "8", "--steps", "30", "--tp",
            "2", "--pp", "2", "--trace-dir", tdir, "--comm-timeout", "5", "--inject-fault",
            "hang@6:1")
    ok(r.returncode != 0, "tp2 x pp2 with rank 1 hung fails after the timeout", r.stderr[-2000:])
    t, rep = tool_json("hang", tdir)
    ok([s.get("rank") for s in rep.get("suspects", [])] == [1],
       "rank 1 is the suspect (its tp peer's dump still shows the all-reduce it waited in)",
       t.stdout + t.stderr + tool("hang", tdir).stdout)


def check_hang(d, shard):
    tdir, metrics = os.path.join(d, "t_hang"), os.path.join(d, "hang.jsonl")
    args = ["train", "--train-data", shard, *TINY, "--batch", "8", "--micro-batch", "1",
            "--steps", "100000", "--dp", "2", "--tp", "2", "--pp", "2", "--trace-dir", tdir,
            "--metrics", metrics, "--comm-timeout", "10"]
    p = launch(8, args, "hang")
    pids = rank_pids("hang", 8, time.time() + 90)
    t_end = time.time() + 200
    while steps_done(metrics) < 3 and p.poll() is None and time.time() < t_end:
        time.sleep(0.1)
    victim = pids.get(5)
    if victim:
        os.kill(victim, signal.SIGSTOP)
    try:
        out, err = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
    for pid in pids.values():  # nothing of the job is left behind (SIGKILL ends a stopped
        try:                   # process; a SIGCONT first would let it write a late dump)
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    ok(victim and p.returncode != 0, "the job with a stopped rank fails after the timeout",
       f"rc {p.returncode}, pids {pids}\n{err}")
    # (mpirun sends SIGCONT before it kills the job, so rank 5 may write a late dump too)
    dumps = sorted(f for f in os.listdir(tdir) if f.startswith("hang_r")) if os.path.isdir(tdir) else []
    live = [f"hang_r{r:05d}.json" for r in range(8) if r != 5]
    ok(all(f in dumps for f in live), "every live rank wrote a hang dump", str(dumps) + err[-2000:])
    stale = []
    for f in live:
        try:
            stale.append([u["rank"] for u in json.load(open(os.path.join(tdir, f)))["unresponsive"]])
        except (OSError, ValueError, KeyError):
            stale.append(None)
    # A dump may not name it when written after mpirun's SIGCONT let rank 5 beat again.
    # (One asked for by a rank whose op timed out less than the board's 2 s staleness after
    # the stop, which an op that waited seconds before rank 5 stopped can, named it "alive"
    # until dumps waited for an ambiguous heartbeat age to settle: a loaded CI run had 3 of
    # 7 name it, one with --comm-timeout 6 had 1 of 7; test_comm_fault_stopped-late.)
    ok(sum(s == [5] for s in stale) >= 2 and all(s in ([5], []) for s in stale),
       "their dumps name rank 5 as unresponsive (its heartbeat), and no other rank", str(stale))
    r, rep = tool_json("hang", tdir)
    ok(r.returncode == 0, "trace hang --json", r.stderr + r.stdout)
    sus = rep.get("suspects", [])
    ok([s.get("rank") for s in sus] == [5], "rank 5 is the suspect", r.stdout)
    ok(sus and sus[0].get("coord") == {"dp": 0, "pp": 1, "tp": 1}, "with its coordinates",
       str(sus))
    t = tool("hang", tdir)
    ok(t.returncode == 0 and "rank 5 (dp 0, pp 1, tp 1)" in t.stdout, "text report names it",
       t.stdout + t.stderr)


def check_restart_prev(d, shard):
    """The attempt that hung, kept in DIR/prev/ when the supervisor restarts."""
    run = os.path.join(d, "restart")
    tdir = os.path.join(run, "trace")
    cmd = [BIN, "launch", "--np", "2", "--faults", "hang@4:1", "--max-restarts", "1", "--diag", "0",
           "--heartbeat-timeout", "60", "--backoff", "0.2", "--grace", "3", "--startup-timeout",
           "120", "--run-dir", run, "--", "--train-data", shard, *TINY, "--batch", "8",
           "--steps", "8", "--dp", "2", "--comm-timeout", "3", "--trace-dir", tdir,
           "--ckpt-dir", os.path.join(run, "ckpt"), "--ckpt-every", "100"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=200,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
        rc, err = r.returncode, r.stderr
    except subprocess.TimeoutExpired as e:
        rc, err = -1, str(e.stderr)
    ok(rc == 0, "launch: the hung attempt is restarted and the job finishes", err[-3000:])
    prev = os.path.join(tdir, "prev")
    files = sorted(os.listdir(prev)) if os.path.isdir(prev) else []
    ok(files == ["events_r00000.jsonl", "events_r00001.jsonl", "hang_r00000.json",
                 "hang_r00001.json"], "DIR/prev holds the failed attempt's logs and dumps",
       str(files))
    now = sorted(f for f in os.listdir(tdir) if f != "prev") if os.path.isdir(tdir) else []
    ok(now == ["events_r00000.jsonl", "events_r00001.jsonl"],
       "DIR holds the finished attempt's logs, no dump of the earlier hang", str(now))
    t, rep = tool_json("hang", prev)
    ok([s.get("rank") for s in rep.get("suspects", [])] == [1],
       "trace hang DIR/prev names the hung rank 1", t.stdout + t.stderr)
    out = os.path.join(d, "prev.json")
    m = tool("merge", prev, "-o", out)
    steps = set()
    if m.returncode == 0:
        steps = {e["args"].get("step") for e in json.load(open(out))["traceEvents"]
                 if e.get("ph") == "X" and e.get("name") == "step" and e.get("pid") == 1}
    ok(m.returncode == 0 and steps and max(steps) == 3,
       "trace merge DIR/prev: the failed attempt's timeline, rank 1's last step the one before "
       "its hang", m.stderr + str(sorted(s for s in steps if s is not None)))


def log_steps(path):
    """(header pid, the steps of the log's "step" spans) of one event log file."""
    lines = [json.loads(l) for l in open(path) if l.strip()]
    return lines[0]["pid"], {l["step"] for l in lines if l.get("name") == "step"}


def check_rotation(d, shard):
    tdir = os.path.join(d, "t_rot")
    r = mpi(2, "train", "--train-data", shard, *TINY, "--batch", "8", "--steps", "40", "--dp",
            "2", "--trace-dir", tdir, "--trace-max-mb", "0.2", "--inject-fault", "slow=40@1+",
            "--val-batches", "1")
    ok(r.returncode == 0, "dp2 run with --trace-max-mb 0.2", r.stderr[-2000:])
    both = {}
    for rank in range(2):
        log = os.path.join(tdir, f"events_r{rank:05d}.jsonl")
        if not os.path.exists(log + ".1"):
            ok(False, f"rank {rank}: the log rotated to .1", str(os.listdir(tdir)))
            continue
        size = os.path.getsize(log) + os.path.getsize(log + ".1")
        ok(size <= 0.2 * 1048576 + 1024, f"rank {rank}: the log and its .1 within the bound",
           f"{size} bytes")
        (pid0, s0), (pid1, s1) = log_steps(log + ".1"), log_steps(log)
        ok(pid0 == pid1 and s0, f"rank {rank}: the .1 is the same process's, with steps",
           f"{pid0} {pid1} {s0} {s1}")
        both[rank] = s0 | s1
    # a bound smaller than one flush of events: the log rotates once a flush, never twice
    # (the second rotation replaced the first's .1, and the compute lane, drained first, was
    # lost: trace stragglers found no fwd/bwd spans), and says it runs past its bound
    tsmall = os.path.join(d, "t_rot_small")
    r2 = mpi(2, "train", "--train-data", shard, *TINY, "--batch", "8", "--steps", "30", "--dp",
             "2", "--trace-dir", tsmall, "--trace-max-mb", "0.01", "--val-batches", "1")
    lanes = set()
    for f in glob.glob(os.path.join(tsmall, "events_r*.jsonl*")):
        lanes |= {json.loads(l).get("lane") for l in open(f) if l.strip()}
    ok(r2.returncode == 0 and "compute" in lanes and "one flush of events holds more" in r2.stderr,
       "--trace-max-mb smaller than a flush: the compute lane is kept, with a warning",
       f"{lanes} {r2.stderr[-1500:]}")
    out = os.path.join(d, "rot.json")
    m = tool("merge", tdir, "-o", out)
    merged = {}
    if m.returncode == 0:
        for e in json.load(open(out))["traceEvents"]:
            if e.get("ph") == "X" and e.get("name") == "step":
                merged.setdefault(e["pid"], set()).add(e["args"]["step"])
    ok(m.returncode == 0 and merged == both and all(both.values()),
       "trace merge reads each rank's .1 then its log", f"{merged} {both} {m.stderr}")
    t = tool("stragglers", tdir, "--json")
    try:
        ranks = {x["rank"]: x for x in json.loads(t.stdout)["ranks"]}
    except (ValueError, KeyError):
        ranks = {}
    ok(t.returncode == 0 and all(ranks.get(k, {}).get("steps", 0) > 0 for k in range(2)),
       "trace stragglers reads the rotated logs: both ranks scored", t.stdout + t.stderr)


def main():
    d, shard = start("ms_trace_")
    check_merge(d, shard)
    check_straggler(d, shard)
    check_slow_fault(d, shard)
    check_stage_hang(d, shard)
    check_hang(d, shard)
    check_restart_prev(d, shard)
    check_rotation(d, shard)
    finish(d)


if __name__ == "__main__":
    main()
