"""End-to-end tests of `megascale trace merge|stragglers|hang` on synthetic
run files (tests/trace/trace_fixtures.py): a 4-rank dp2 x pp2 pipeline run
with p2p, overlapping reduce-scatters, nested waits and skewed clocks; a
straggler pair; 8-rank hang dumps; and bad input.
Environment: MS_BIN (the binary)."""
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trace_fixtures import BIN, MS, RankLog, hang_dump, nesting_errors, ok, run, summary  # noqa: E402,E501

# ---- 1. merge --------------------------------------------------------------------------------

SHAPE4 = (2, 2, 1)  # dp, pp, tp: rank = dp + 2 * pp
CLOCKS4 = {  # rank: [(global from, offset, err)]
    0: [(0, 0, 0)],
    1: [(0, 1_000_000, 300)],
    2: [(0, 5_000_000, 2000), (150 * MS, 5_000_300, 1500)],  # a new sync line mid-run
    3: [(0, -2_000_000, 800)],
}
STEPS, MBS = 3, 2


def pipeline_logs():
    """Every rank's log; step s starts at global 100 ms * s.  Returns the
    logs and the sends as (src, dst, tag, global t0)."""
    logs = {r: RankLog(r, 4, SHAPE4, "hostA" if r < 2 else "hostB", CLOCKS4[r]) for r in range(4)}
    sends = []
    for s in range(1, STEPS + 1):
        base = 100 * MS * s
        for r, log in logs.items():
            pp, dp = r // 2, r % 2
            log.span("compute", "step", base, base + 90 * MS, step=s)
            log.span("data", "prefetch", base + 1 * MS, base + 3 * MS, step=s + 1)
            # three reduce-scatters in flight at once, then an all-reduce waited on
            for k, (a, b) in enumerate([(70, 80), (72, 85), (74, 78)]):
                log.span("comm:dp", "reduce_scatter", base + a * MS, base + b * MS,
                         posted=log.local(base + a * MS) + 1000, group="dp", seq=3 * s + k,
                         bytes=1 << 20)
            log.span("comm:dp", "all_reduce", base + 86 * MS, base + 88 * MS, group="dp",
                     seq=100 + s, bytes=4)
            log.span("compute", "wait", base + 86 * MS, base + 88 * MS, op="all_reduce",
                     group="dp", seq=100 + s, peer=-1, bytes=4)
            log.mark("compute", "loss", base + 89 * MS, step=s, value=2.5)
            peer = r + 2 if pp == 0 else r - 2
            for m in range(MBS):
                f0 = base + m * 12 * MS
                b1 = base + 50 * MS + m * 12 * MS
                if pp == 0:
                    log.span("compute", "fwd", f0, f0 + 10 * MS, step=s, mb=m, chunk=0)
                    log.span("compute", "data_wait", f0, f0 + MS // 2, step=s)
                    log.span("comm:pp", "send", f0 + 10 * MS, f0 + 10 * MS + MS // 2, peer=peer,
                             tag=0, group="pp", bytes=8192)
                    sends.append((r, peer, 0, f0 + 10 * MS))
                    log.span("comm:pp", "recv", b1 + 9 * MS, b1 + 10 * MS + 700_000, peer=peer,
                             tag=1, group="pp", bytes=8192)
                    log.span("compute", "bwd", b1 + 11 * MS, b1 + 21 * MS, step=s, mb=m, chunk=0)
                    log.span("compute", "wait", b1 + 11 * MS, b1 + 11 * MS + 300_000, op="recv",
                             group="pp", peer=peer)
                else:
                    log.span("comm:pp", "recv", f0 + 9 * MS, f0 + 10 * MS + 800_000, peer=peer,
                             tag=0, group="pp", bytes=8192)
                    log.span("compute", "fwd", f0 + 11 * MS, f0 + 21 * MS, step=s, mb=m, chunk=0)
                    log.span("compute", "wait", f0 + 11 * MS, f0 + 11 * MS + 200_000, op="recv",
                             group="pp", peer=peer)
                    log.span("compute", "bwd", b1, b1 + 10 * MS, step=s, mb=m, chunk=0)
                    log.span("comm:pp", "send", b1 + 10 * MS, b1 + 10 * MS + MS // 2, peer=peer,
                             tag=1, group="pp", bytes=8192)
                    sends.append((r, peer, 1, b1 + 10 * MS))
    logs[0].span("ckpt", "persist", 150 * MS, 260 * MS, step=1, bytes=1 << 30)
    logs[1].raw('{"type":"dropped","count":7}')
    logs[1].raw('{"type":"future_kind","x":1}')  # unknown types are ignored
    return logs, sends


def check_processes(tr, what):
    ev = tr["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in ev
             if e.get("ph") == "M" and e["name"] == "process_name"}
    for r in range(4):
        want = f"rank {r} (dp {r % 2}, pp {r // 2}, tp 0) {'hostA' if r < 2 else 'hostB'}"
        ok(names.get(r) == want, f"{what}: process {r} named with its place and host",
           f"want {want!r}, got {names.get(r)!r}")
    order = {e["pid"]: e["args"]["sort_index"] for e in ev
             if e.get("ph") == "M" and e["name"] == "process_sort_index"}
    ok(sorted(order, key=order.get) == [0, 1, 2, 3], f"{what}: processes sorted by (pp, dp, tp)",
       order)
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev
               if e.get("ph") == "M" and e["name"] == "thread_name"}
    ok(threads.get((0, 1)) == "compute" and threads.get((0, 2)) == "data" and
       threads.get((0, 3)) == "ckpt", f"{what}: compute/data/ckpt are tids 1/2/3", threads)
    dp_subs = sorted(n for (p, t), n in threads.items() if p == 1 and n.startswith("comm:dp"))
    ok(dp_subs == ["comm:dp #0", "comm:dp #1", "comm:dp #2"],
       f"{what}: three overlapping reduce-scatters need three comm:dp sub-threads", dp_subs)
    ok(all(t >= 10 for (p, t), n in threads.items() if n.startswith("comm:")),
       f"{what}: comm lanes from tid 10 up", threads)


def check_events(tr, logs, what):
    ev = tr["traceEvents"]
    xs = [e for e in ev if e.get("ph") == "X"]
    n_spans = sum(1 for log in logs.values() for l in log.lines
                  if isinstance(l, dict) and l["type"] == "span")
    ok(len(xs) == n_spans, f"{what}: one complete event per span", f"{len(xs)} vs {n_spans}")
    bad = [e for e in xs if e["dur"] < 0 or e["ts"] < 0]
    ok(not bad, f"{what}: every X event has ts >= 0 and dur >= 0", bad[:3])
    ok(min(e["ts"] for e in xs) == 0, f"{what}: the earliest event is at ts 0",
       min(e["ts"] for e in xs))
    nest = nesting_errors(ev)
    ok(not nest, f"{what}: complete events nest on every (pid, tid)", nest[:5])
    # clocks aligned: rank 2's first fwd starts at global 111 ms (origin 100 ms)
    f2 = min((e for e in xs if e["pid"] == 2 and e["name"] == "fwd"), key=lambda e: e["ts"])
    ok(abs(f2["ts"] - 11000.0) < 0.01, f"{what}: rank 2's clock offset undone", f2)
    ok(f2.get("args", {}).get("mb") == 0 and f2["args"].get("step") == 1 and f2["cat"] == "compute",
       f"{what}: args and cat copied", f2)
    late = min((e for e in xs if e["pid"] == 2 and e["name"] == "fwd" and e["ts"] > 50000),
               key=lambda e: e["ts"])
    ok(abs(late["ts"] - 111000.0) < 0.01, f"{what}: rank 2's second clock line used", late)
    marks = [e for e in ev if e.get("ph") == "i"]
    ok(len(marks) == 4 * STEPS and all(e["args"]["value"] == 2.5 for e in marks),
       f"{what}: marks become instant events", marks[:2])


def check_flows(tr, sends, what):
    ev = tr["traceEvents"]
    xs = [e for e in ev if e.get("ph") == "X"]
    skew = tr["otherData"]["clock_skew_us"]
    starts = {e["id"]: e for e in ev if e.get("ph") == "s"}
    ends = {e["id"]: e for e in ev if e.get("ph") == "f"}
    ok(len(starts) == len(sends) == len(ends) and set(starts) == set(ends),
       f"{what}: one flow pair per send", f"{len(starts)} s, {len(ends)} f, {len(sends)} sends")
    bad = []
    for fid, s in starts.items():
        f = ends.get(fid, {})
        snd = [x for x in xs if x["pid"] == s["pid"] and x["tid"] == s["tid"] and
               x["name"] == "send" and x["ts"] <= s["ts"] <= x["ts"] + x["dur"]]
        rcv = [x for x in xs if x["pid"] == f.get("pid") and x["tid"] == f.get("tid") and
               x["name"] == "recv" and x["ts"] <= f["ts"] <= x["ts"] + x["dur"]]
        good = (len(snd) == 1 and len(rcv) == 1 and f.get("bp") == "e" and s["cat"] == "p2p" and
                rcv[0]["args"]["peer"] == s["pid"] and snd[0]["args"]["peer"] == f["pid"] and
                rcv[0]["args"]["tag"] == snd[0]["args"]["tag"] and
                rcv[0]["ts"] + rcv[0]["dur"] >= snd[0]["ts"] - skew)
        if not good:
            bad.append((s, f, snd, rcv))
    ok(not bad, f"{what}: flows bound to their send and recv spans, recv ends after send starts",
       bad[:2])


def test_merge(d):
    logs, sends = pipeline_logs()
    for log in logs.values():
        log.write(d)
    out = os.path.join(d, "merged.json")
    rc, so, se = run("trace", "merge", d, "-o", out)
    ok(rc == 0, "merge exits 0", so + se)
    if rc:
        return
    try:
        tr = json.load(open(out))
    except ValueError as e:
        ok(False, "merge writes valid JSON", e)
        return
    ok(tr.get("displayTimeUnit") == "ms" and isinstance(tr.get("traceEvents"), list),
       "Chrome trace object", list(tr))
    od = tr.get("otherData", {})
    ok(od.get("ranks") == 4 and od.get("clock_skew_us") == 2.0 and od.get("dropped_events") == 7
       and od.get("source") == d, "otherData: ranks, skew (largest err), drops, source", od)
    ok("4 rank(s)" in so and f"{len(sends)} flow(s)" in so and out in so and "2.000 us" in so,
       "summary line: ranks, flows, skew, output", so)
    ok("dropped 7 events" in se, "dropped events reported", se)
    ok(not [n for n in os.listdir(d) if ".tmp" in n], "no temp file left", os.listdir(d))
    check_processes(tr, "merge")
    check_events(tr, logs, "merge")
    check_flows(tr, sends, "merge")
    rc, so, se = run("trace", "merge", d)
    ok(rc == 0 and os.path.exists(os.path.join(d, "trace.json")), "default output DIR/trace.json",
       so + se)
    # the same run without clock correction would put rank 2's recvs before the sends
    if rc == 0:
        tr2 = json.load(open(os.path.join(d, "trace.json")))
        ok(len(tr2["traceEvents"]) == len(tr["traceEvents"]), "both outputs the same size")


def test_merge_clock_step(d):
    """Rank 1's clock offset moves back 5 us at a clock line that falls
    between two back-to-back spans on each lane: they must not overlap on
    their thread.  Its recv is posted long before rank 0's send: the arrow
    must still go forward in time (send start -> recv end)."""
    def write(rank, lines):
        header = dict(type="header", version=1, rank=rank, world=2, host="h", pid=1 + rank,
                      coord=dict(dp=0, pp=rank, tp=0), shape=dict(dp=1, pp=2, tp=1), mono_ns=0,
                      wall_ns=1_700_000_000 * 10**9)
        with open(os.path.join(d, f"events_r{rank:05d}.jsonl"), "w") as f:
            f.write("\n".join(json.dumps(x) for x in [header] + lines) + "\n")
    span = lambda lane, name, t0, t1, **a: dict(type="span", name=name, lane=lane, t0=t0, t1=t1, **a)
    clock = lambda mono, off: dict(type="clock", mono_ns=mono, offset_ns=off, err_ns=0)
    write(0, [clock(0, 0), span("comm:pp", "send", 500_000, 510_000, peer=1, tag=0, group="pp")])
    write(1, [clock(0, 10_000), span("compute", "step", 1_000, 100_000, step=1),
              span("comm:dp", "all_reduce", 1_000, 100_000, group="dp", seq=1),
              clock(100_000, 5_000), span("compute", "step", 100_000, 200_000, step=2),
              span("comm:dp", "all_reduce", 100_000, 200_000, group="dp", seq=2),
              span("comm:pp", "recv", 200_000, 520_000, peer=0, tag=0, group="pp")])
    out = os.path.join(d, "m.json")
    rc, so, se = run("trace", "merge", d, "-o", out)
    tr = json.load(open(out)) if rc == 0 else {"traceEvents": []}
    bad = nesting_errors(tr["traceEvents"])
    ok(rc == 0 and not bad, "a clock line between two spans: no overlap on their thread",
       str(bad) + so + se)
    s = [e for e in tr["traceEvents"] if e.get("ph") == "s"]
    f = [e for e in tr["traceEvents"] if e.get("ph") == "f"]
    ok(len(s) == len(f) == 1 and f[0]["ts"] >= s[0]["ts"], "flow arrows go forward in time",
       f"{s} {f}")


def test_merge_mark_after_span(d):
    """A mark after a span of its lane has ended, the clock's offset changed between them:
    the mark takes its own time's offset.  It took the ended span's (the span was still on
    the nesting stack): 5 us early here."""
    header = dict(type="header", version=1, rank=0, world=1, host="h", pid=1, mono_ns=0,
                  wall_ns=1_700_000_000 * 10**9)
    lines = [header, dict(type="clock", mono_ns=0, offset_ns=0, err_ns=0),
             dict(type="span", name="step", lane="compute", t0=1_000, t1=100_000, step=1),
             dict(type="clock", mono_ns=120_000, offset_ns=5_000, err_ns=0),
             dict(type="mark", name="ckpt", lane="compute", t=150_000)]
    with open(os.path.join(d, "events_r00000.jsonl"), "w") as f:
        f.write("\n".join(json.dumps(x) for x in lines) + "\n")
    out = os.path.join(d, "m.json")
    rc, so, se = run("trace", "merge", d, "-o", out)
    ev = json.load(open(out))["traceEvents"] if rc == 0 else []
    marks = [e for e in ev if e.get("name") == "ckpt"]
    spans = [e for e in ev if e.get("name") == "step" and e.get("ph") == "X"]
    ok(rc == 0 and len(marks) == 1 and abs(marks[0]["ts"] - spans[0]["ts"] - 154.0) < 1e-3,
       "a mark after an ended span takes its own clock offset", f"{marks} {spans}\n{se}")


def test_merge_no_clock(d):
    """Rank 1 of 3 has no clock lines and its host's monotonic clock is an
    hour ahead: it is aligned by the wall clock to a rank with clock lines
    (rank 0's clock), not taken as rank 0's clock itself (an hour off)."""
    def write(rank, mono, lines):
        header = dict(type="header", version=1, rank=rank, world=3, host=f"h{rank}", pid=1,
                      mono_ns=mono, wall_ns=1_700_000_000 * 10**9)
        with open(os.path.join(d, f"events_r{rank:05d}.jsonl"), "w") as f:
            f.write("\n".join(json.dumps(x) for x in [header] + lines) + "\n")
    span = lambda t0: dict(type="span", name="fwd", lane="compute", t0=t0, t1=t0 + MS, step=1)
    clock = lambda mono, off: dict(type="clock", mono_ns=mono, offset_ns=off, err_ns=0)
    hour = 3600 * 10**9
    write(0, 0, [clock(0, 0), span(5 * MS)])  # the same instant on every rank: 5 ms after
    write(1, hour, [span(hour + 5 * MS)])  # the headers (taken at one wall-clock instant)
    write(2, 7 * MS, [clock(7 * MS, -7 * MS), span(12 * MS)])
    out = os.path.join(d, "m.json")
    rc, so, se = run("trace", "merge", d, "-o", out)
    xs = [e for e in json.load(open(out))["traceEvents"] if e.get("ph") == "X"] if rc == 0 else []
    ts = sorted((e["pid"], e["ts"]) for e in xs)
    ok(rc == 0 and len(ts) == 3 and max(t for _, t in ts) - min(t for _, t in ts) < 1e-3 and
       "1 log(s) without clock lines, aligned to rank 0" in se,
       "a rank without clock lines aligned by the wall clock to the clocked ranks", f"{ts}\n{se}")


def test_merge_far_clock(d):
    """A rank without clock lines whose header's clocks are far from the others' (each
    under 2^62, their difference not): left on its own clock with a warning.  Before, the
    offset wrapped past 2^63 and its spans 2^63 ns apart came out 1 us apart."""
    big = 2**62 - 1
    rows = {0: ([dict(type="clock", mono_ns=0, offset_ns=0, err_ns=0)], 0, 1),
            1: ([], -big, big)}
    for rank, (clocks, mono, wall) in rows.items():
        header = dict(type="header", version=1, rank=rank, world=2, host="h", pid=1,
                      mono_ns=mono, wall_ns=wall)
        t = [0, MS] if rank == 0 else [-big, big - 1000]
        spans = [dict(type="span", name="fwd", lane="compute", t0=x, t1=x + 1, step=1) for x in t]
        with open(os.path.join(d, f"events_r{rank:05d}.jsonl"), "w") as f:
            f.write("\n".join(json.dumps(x) for x in [header] + clocks + spans) + "\n")
    out = os.path.join(d, "m.json")
    rc, so, se = run("trace", "merge", d, "-o", out)
    xs = [e for e in json.load(open(out))["traceEvents"] if e.get("ph") == "X" and e["pid"] == 1] \
        if rc == 0 else []
    gap = max(e["ts"] for e in xs) - min(e["ts"] for e in xs) if len(xs) == 2 else 0
    ok(rc == 0 and "too far from rank 0's to align it" in se and gap > 1e12,
       "a rank whose header clocks are too far to align: left unaligned, said, no wrap",
       f"rc={rc} gap={gap}\n{se}")


def test_mixed_grid(d):
    """A log of another run of the same world but another grid (a tp2 x dp2 run's rank 2
    among a pp2 x dp2 run's logs): skipped with a warning, not mixed in (its coordinates
    clashed with the others' and the straggler of the newer run went unnamed)."""
    for rank in range(4):
        other = rank == 2
        log = RankLog(rank, 4, (2, 1, 2) if other else (2, 2, 1), "h",
                      wall_ns=(1_700_000_000 - (3 if other else 0)) * 10**9)
        for s in range(1, 21):
            t = 1000 * MS * s
            log.span("compute", "step", t, t + 100 * MS, step=s)
            log.span("compute", "fwd", t, t + (60 if rank == 3 else 20) * MS, step=s, mb=0)
        log.write(d)
    rc, so, se = run("trace", "stragglers", d, "--json")
    j = json.loads(so) if rc == 0 else {}
    ok(rc == 0 and "events_r00002.jsonl: skipped: a log of another run (grid (dp 2, pp 1, tp 2)"
       in se and 2 not in [x["rank"] for x in j.get("ranks", [])],
       "a log of another grid of the same world is skipped with a warning", so + se)


def test_merge_rotated_p2p(d):
    """Ranks 0 and 1 exchange one transfer each way per step (the dp ring's send and recv),
    each span carrying its step.  Each rank's log rotated at its own time: rank 0's oldest
    kept ops are of step 3, rank 1's of step 4, and rank 1 dropped its recv of step 7 (a full
    buffer).  Each send is paired with the recv of its own step; those whose partner is gone
    are left unmatched.  The k-th send was paired with the k-th recv: a step apart, the
    arrows went backwards in time (54 flows, 27 backwards on a real run)."""
    first, steps = {0: 3, 1: 4}, 10
    logs = {r: RankLog(r, 2, (2, 1, 1), "h") for r in range(2)}
    for r, log in logs.items():
        for s in range(first[r], steps + 1):
            base = 100 * MS * s
            log.span("compute", "step", base, base + 90 * MS, step=s)
            log.span("comm:dp", "send", base + 10 * MS, base + 11 * MS, step=s, group="dp",
                     peer=1 - r, tag=29, bytes=64)
            if not (r == 1 and s == 7):
                log.span("comm:dp", "recv", base + 9 * MS, base + 12 * MS, step=s, group="dp",
                         peer=1 - r, tag=29, bytes=64)
        log.write(d)
    out = os.path.join(d, "m.json")
    rc, so, se = run("trace", "merge", d, "-o", out)
    tr = json.load(open(out)) if rc == 0 else {"traceEvents": [], "otherData": {}}
    ev = tr["traceEvents"]
    xs = [e for e in ev if e.get("ph") == "X" and e["name"] in ("send", "recv")]
    starts = {e["id"]: e for e in ev if e.get("ph") == "s"}
    ends = {e["id"]: e for e in ev if e.get("ph") == "f"}
    pairs = []
    for fid, a in starts.items():
        b = ends.get(fid, {})
        snd = [x for x in xs if x["pid"] == a["pid"] and x["name"] == "send" and
               x["ts"] <= a["ts"] <= x["ts"] + x["dur"]]
        rcv = [x for x in xs if x["pid"] == b.get("pid") and x["name"] == "recv" and
               x["ts"] <= b.get("ts", -1) <= x["ts"] + x["dur"]]
        pairs.append((a["pid"], snd[0]["args"]["step"] if len(snd) == 1 else None,
                      rcv[0]["args"]["step"] if len(rcv) == 1 else None))
    # 0 -> 1: steps 4..10 without 7 (rank 1 has no recv of 3, lost that of 7); 1 -> 0: 4..10
    want = sorted([(0, s, s) for s in range(4, 11) if s != 7] + [(1, s, s) for s in range(4, 11)])
    od = tr["otherData"]
    ok(rc == 0 and sorted(pairs) == want and od.get("unmatched_sends") == 2 and
       od.get("unmatched_recvs") == 1,
       "merge: each send paired with the recv of its step after rotation, the rest unmatched",
       f"{sorted(pairs)}\n{od}\n{se}")


# ---- 2. stragglers ---------------------------------------------------------------------------

def straggler_logs(d, steps=10):
    """Rank 0: fwd 25 ms holding a 15 ms data_wait, bwd 40 ms holding a 30 ms
    wait -> 20 ms of compute; rank 1: fwd 20 + bwd 20 = 40 ms, no waits."""
    for r in range(2):
        log = RankLog(r, 2, (2, 1, 1), "hostA" if r == 0 else "hostB")
        for s in range(1, steps + 1):
            t = 1000 * MS * s
            warm = 5 if s == 1 else 1  # a slow first step, skipped as warm-up
            log.span("compute", "step", t, t + 200 * MS * warm, step=s)
            if r == 0:
                log.span("compute", "fwd", t, t + 25 * MS * warm, step=s, mb=0)
                log.span("compute", "data_wait", t + 1 * MS, t + 16 * MS, step=s)
                log.span("compute", "bwd", t + 100 * MS * warm, t + 140 * MS * warm, mb=0)
                log.span("compute", "wait", t + 100 * MS * warm + MS, t + 100 * MS * warm + 31 * MS,
                         op="all_reduce", group="dp", seq=s)
            else:
                log.span("compute", "fwd", t, t + 20 * MS * warm, step=s, mb=0)
                log.span("compute", "bwd", t + 100 * MS * warm, t + 120 * MS * warm, step=s, mb=0)
        log.write(d)


def test_other_run_same_world(d):
    """A log of another start of a job with the same world and grid (its header's "run"
    differs) opened before the newest log (one an earlier start left, or one copied in):
    skipped with a warning, its rank named as one without a log (before, it was mixed in: a
    healthy job's rank named a straggler, send/receive arrows backwards in time)."""
    for r in range(3):
        log = RankLog(r, 3, (3, 1, 1), "h",
                      wall_ns=(1_600_000_000 if r == 2 else 1_700_000_000) * 10**9)
        log.run = ("b" if r == 2 else "a") * 16
        for s in range(1, 11):
            t = 1000 * MS * s
            slow = 5 if r == 2 else 1  # the other run's rank: a straggler there
            log.span("compute", "step", t, t + 100 * MS * slow, step=s)
            log.span("compute", "fwd", t, t + 20 * MS * slow, step=s, mb=0)
            log.span("compute", "bwd", t + 50 * MS, t + 50 * MS + 20 * MS * slow, step=s, mb=0)
        log.write(d)
    rc, so, se = run("trace", "stragglers", d)
    ok(rc == 0 and "events_r00002.jsonl: skipped: a log of another run (run bbbbbbbbbbbbbbbb;" in
       se and "is of run aaaaaaaaaaaaaaaa)" in se and
       "no event log for 1 of the 3 ranks: 2" in se and "STRAGGLER" not in so,
       "a log of another run of the same world: skipped, its rank without a log", so + se)


def test_stand_in_logs(d):
    """A rank whose log is missing but whose events_rNNNNN.jsonl.new (killed while it rotated
    its log) or .1 (its older half) is there: that file is read in its place, with a warning
    (before: "no event log for 1 of the 2 ranks", its events left out)."""
    for tail in (".new", ".1"):
        dd = os.path.join(d, tail[1:])
        os.makedirs(dd)
        straggler_logs(dd)
        os.rename(os.path.join(dd, "events_r00001.jsonl"),
                  os.path.join(dd, "events_r00001.jsonl" + tail))
        rc, so, se = run("trace", "merge", dd, "-o", os.path.join(dd, "m.json"))
        ok(rc == 0 and f"events_r00001.jsonl{tail}: the rank's log" in se and
           "is missing: read in its place" in se and "merged 2 rank(s)" in so + se and
           "no event log" not in se, f"a rank with only its log's {tail}: read in its place",
           so + se)


def test_stragglers(d):
    straggler_logs(d)
    rc, so, se = run("trace", "stragglers", d)
    ok(rc == 0, "stragglers exits 0", so + se)
    lines = so.splitlines()
    row = {int(l.split()[0]): l for l in lines if l.strip() and l.split()[0].isdigit()}
    ok("STRAGGLER" in row.get(1, "") and "ok" in row.get(0, "") and "STRAGGLER" not in row.get(0, ""),
       "rank 1 is the straggler, rank 0 (long nested waits) is not", so)
    ok("stragglers: rank 1 (dp 1, pp 0, tp 0) on hostB" in so, "stragglers line", so)
    png = os.path.join(d, "heat.png")
    rc, so, se = run("trace", "stragglers", d, "--json", "--png", png, "--threshold", "0.8")
    try:
        j = json.loads(so)
    except ValueError:
        j = None
    ok(rc == 0 and j is not None, "--json prints only JSON", so + se)
    if j:
        r = {x["rank"]: x for x in j["ranks"]}
        ok(j["stragglers"] == [1] and j["threshold"] == 0.8 and j["window"] == 5,
           "JSON stragglers, threshold, window", j)
        ok(abs(r[0]["median_ms"] - 20.0) < 1e-6 and abs(r[1]["median_ms"] - 40.0) < 1e-6,
           "compute = fwd + bwd minus the nested waits", r)
        ok(abs(r[1]["relative"] - 0.5) < 1e-9 and r[0]["relative"] == 1.0 and
           r[1]["straggler"] is True and r[0]["straggler"] is False, "relative scores", r)
        ok(r[0]["steps"] == 9 and r[0]["coord"] == {"dp": 0, "pp": 0, "tp": 0} and
           r[1]["host"] == "hostB", "warm-up step skipped; coord, host", r)
    data = open(png, "rb").read() if os.path.exists(png) else b""
    ok(data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000, "--png writes a PNG", len(data))
    ok(not [n for n in os.listdir(d) if ".tmp" in n], "no temp PNG left", os.listdir(d))


def rotate_logs(d, other_pid=(), later=None):
    """Split each rank's log as --trace-max-mb rotates it: the first half of
    its spans in events_rNNNNN.jsonl.1, the rest in a file that starts with
    a later header (1 s later, or later[rank] s) saying when the log was opened,
    and the clock sample.  Ranks in other_pid: the .1 is another process's (an
    earlier run's)."""
    for name in sorted(os.listdir(d)):
        if not (name.startswith("events_r") and name.endswith(".jsonl")):
            continue
        path = os.path.join(d, name)
        lines = open(path).read().splitlines()
        head, clocks = json.loads(lines[0]), [l for l in lines[1:] if '"clock"' in l]
        spans = [l for l in lines[1:] if '"clock"' not in l]
        half = len(spans) // 2
        old = dict(head, pid=head["pid"] + 7) if head["rank"] in other_pid else head
        with open(path + ".1", "w") as f:
            f.write("\n".join([json.dumps(old), *clocks, *spans[:half]]) + "\n")
        dt = (later or {}).get(head["rank"], 1) * 10**9
        new = dict(head, wall_ns=head["wall_ns"] + dt, mono_ns=head["mono_ns"] + dt,
                   opened_wall_ns=head["wall_ns"])
        with open(path, "w") as f:
            f.write("\n".join([json.dumps(new), *clocks[-1:], *spans[half:]]) + "\n")


def test_rotated(d):
    """A log rotated by --trace-max-mb is read as one: its .1, then the file."""
    straggler_logs(d)
    rotate_logs(d)
    rc, so, se = run("trace", "stragglers", d, "--json")
    try:
        r = {x["rank"]: x for x in json.loads(so)["ranks"]}
    except (ValueError, KeyError):
        r = {}
    ok(rc == 0 and all(r.get(k, {}).get("steps") == 9 for k in (0, 1)),
       "stragglers reads each rank's .1 and its log: every step scored", so + se)
    out = os.path.join(d, "merged.json")
    rc, so, se = run("trace", "merge", d, "-o", out)
    steps = {}
    if rc == 0:
        for e in json.load(open(out))["traceEvents"]:
            if e.get("ph") == "X" and e.get("name") == "step":
                steps.setdefault(e["pid"], set()).add(e["args"]["step"])
    ok(rc == 0 and steps == {0: set(range(1, 11)), 1: set(range(1, 11))},
       "merge: every step of both files of each rank", str(steps) + se)
    e = os.path.join(d, "earlier")
    os.makedirs(e)
    straggler_logs(e)
    rotate_logs(e, other_pid=(1,))
    rc, so, se = run("trace", "stragglers", e, "--json")
    try:
        r = {x["rank"]: x for x in json.loads(so)["ranks"]}
    except (ValueError, KeyError):
        r = {}
    ok(rc == 0 and r.get(0, {}).get("steps") == 9 and 0 < r.get(1, {}).get("steps", 0) < 9,
       "a .1 of another process (pid) is not read", so + se)
    # the ranks of a long run rotate at their own times, a day apart: one run all the same
    a = os.path.join(d, "apart")
    os.makedirs(a)
    straggler_logs(a)
    rotate_logs(a, later={0: 86400})
    rc, so, se = run("trace", "stragglers", a)
    ok(rc == 0 and "earlier run" not in se,
       "logs rotated a day apart: no warning of an earlier run's log", se)


def test_unscored(d):
    """A rank with too few steps to leave out its warm-up step, and one whose log
    is its header alone, are not scored: reported so, never as "ok"."""
    for r in range(4):
        log = RankLog(r, 4, (4, 1, 1), f"host{r}")
        for s in range(1, {0: 10, 1: 10, 2: 2, 3: 0}[r] + 1):
            t = 1000 * MS * s
            log.span("compute", "fwd", t, t + 20 * MS, step=s, mb=0)
        log.write(d)
    rc, so, se = run("trace", "stragglers", d)
    rows = {int(x.split()[0]): x for x in so.splitlines() if x.split() and x.split()[0].isdigit()}
    ok(rc == 0 and rows.get(0, "").endswith(" ok") and
       "not scored: 2 step(s): too few to leave out the warm-up step (3 needed)" in rows.get(2, "") and
       "not scored: no fwd/bwd spans" in rows.get(3, "") and " ok" not in rows.get(2, "") + rows.get(3, "") and
       "stragglers: none" in so and "not scored: rank 2 (2 step(s)" in so and
       "rank 3 (no fwd/bwd spans)" in so, "stragglers: ranks without a score say so and why", so + se)
    rc, so, se = run("trace", "stragglers", d, "--json")
    j = json.loads(so) if rc == 0 else {}
    r = {x["rank"]: x for x in j.get("ranks", [])}
    ok(rc == 0 and j.get("unscored") == [2, 3] and j.get("stragglers") == [] and
       [r[k]["scored"] for k in range(4)] == [True, True, False, False] and
       "too few" in r[2].get("unscored", "") and r[3].get("unscored") == "no fwd/bwd spans" and
       r[2]["relative"] is None and "unscored" not in r[0], "stragglers --json: scored, unscored", so + se)
    # a rank whose steps all lie before the newest 10,000,000 the report scores: said so
    # (it said "no fwd/bwd spans")
    old = os.path.join(d, "old")
    os.makedirs(old)
    for r in range(3):
        log = RankLog(r, 3, (3, 1, 1), f"host{r}")
        for s in range(1, 11):
            t = 1000 * MS * (s + 10)
            log.span("compute", "fwd", t, t + 20 * MS, step=s if r == 2 else 20_000_000 + s, mb=0)
        log.write(old)
    rc, so, se = run("trace", "stragglers", old, "--json")
    j = json.loads(so) if rc == 0 else {}
    r = {x["rank"]: x for x in j.get("ranks", [])}
    ok(rc == 0 and j.get("unscored") == [2] and
       r.get(2, {}).get("unscored") == "its steps 1..10 are before the newest 10000000 scored "
       "(from 10000011)", "stragglers: a rank older than the steps scored says so", so + se)
    # 9 scored steps, a window of 10: the individual score is none, not a healthy 1.0
    rc, so, se = run("trace", "stragglers", d, "--window", "10")
    rows = {int(x.split()[0]): x.split() for x in so.splitlines() if x.split() and x.split()[0].isdigit()}
    ok(rc == 0 and rows.get(0, [])[3:] == ["20.000", "1.000", "-", "9", "ok", "(relative", "score", "only)"],
       "stragglers: no individual score with fewer steps than --window", so + se)
    rc, so, se = run("trace", "stragglers", d, "--json", "--window", "10")
    j = json.loads(so) if rc == 0 else {}
    ok(rc == 0 and [x["individual"] for x in j.get("ranks", [])] == [None] * 4 and
       j["ranks"][0]["relative"] == 1.0, "stragglers --json: individual null under one window", so + se)


def test_json_flag(d):
    """--json of stragglers and hang: bare (last, before an option, before
    DIR), --json 0 / 1, --json=0; --json 2 is out of its range."""
    straggler_logs(d)
    write_hang(d)
    for cmd in ("stragglers", "hang"):
        for args, want in (([cmd, d, "--json"], True), ([cmd, d, "--json", "1"], True),
                           ([cmd, d, "--json", "0"], False), ([cmd, d, "--json=0"], False),
                           ([cmd, d, "--json=1"], True), ([cmd, "--json", d], True),
                           (["--json", cmd, d], True), ([cmd, "--json", "0", d], False),
                           ([cmd, d, "--json", "--threshold", "0.8"], True)):
            rc, so, se = run("trace", *args)
            try:
                json.loads(so)
                is_json = True
            except ValueError:
                is_json = False
            ok(rc == 0 and is_json == want, f"trace {' '.join(args)}: JSON {want}", so + se)
    rc, so, se = run("trace", "hang", d, "--json", "2")
    ok(rc == 2 and "--json must be in [0,1], got '2'" in se, "trace --json 2: out of range", se)


def test_individual(d):
    """A rank that halves its speed in its last 3 steps: a straggler when the other ranks kept
    theirs (the individual score, best window / last window: the relative one compares the
    medians, which half a run's slow steps do not move); when every rank slowed, or the run
    has one rank, the job slowed and no rank is named."""
    def write(sub, world, slow):
        dd = os.path.join(d, sub)
        os.makedirs(dd)
        for rank in range(world):
            log = RankLog(rank, world, (world, 1, 1), "hostA")
            for s in range(1, 12):
                t = 1000 * MS * s
                dur = 40 * MS if rank in slow and s > 8 else 20 * MS
                log.span("compute", "fwd", t, t + dur, step=s, mb=0)
                log.span("compute", "bwd", t + 100 * MS, t + 100 * MS + dur, step=s, mb=0)
            log.write(dd)
        rc, so, se = run("trace", "stragglers", dd, "--json")
        rt, st, et = run("trace", "stragglers", dd)
        return rc, (json.loads(so) if rc == 0 else {}), so + se, st + et
    rc, j, out, text = write("alone", 3, {1})
    r = {x["rank"]: x for x in j.get("ranks", [])}
    ok(rc == 0 and abs(r.get(1, {}).get("individual", 0) - 0.5) < 1e-9 and
       j.get("stragglers") == [1] and r[1].get("relative") == 1.0 and
       abs(j.get("job_individual", 0) - 1.0) < 1e-9,
       "individual score: best window / last window; the rank that slowed alone is named", out)
    # two ranks, one slowed: the job's score is the median of the ranks that did not slow
    # alone (it was the median of all, (0.5 + 1) / 2 < 0.75: the job "slowed too, no rank's
    # fault" next to the rank named for it)
    rc, j, out, text = write("pair", 2, {1})
    ok(rc == 0 and j.get("stragglers") == [1] and abs(j.get("job_individual", 0) - 1.0) < 1e-9
       and "STRAGGLER" in text and "as a whole" not in text,
       "two ranks, one slowed: a straggler, and the job did not slow", out + text)
    rc, j, out, text = write("all", 3, {0, 1, 2})
    ok(rc == 0 and j.get("stragglers") == [] and abs(j.get("job_individual", 0) - 0.5) < 1e-9,
       "every rank slowed: no straggler, the job's individual score 0.5", out)
    ok("stragglers: none" in text and "the job as a whole slowed" in text and
       text.count("ok (slowed with the others)") == 3, "every rank slowed: the text says so", text)
    rc, j, out, text = write("one", 1, {0})
    ok(rc == 0 and j.get("stragglers") == [] and abs(j.get("job_individual", 0) - 0.5) < 1e-9
       and "the job as a whole slowed" in text, "one rank that slowed: the job slowed", out + text)
    rc, j, out, text = write("none", 3, set())
    ok(rc == 0 and j.get("stragglers") == [] and "as a whole" not in text,
       "no rank slowed: no note", text)


def test_individual_stage(d):
    """tp2 x pp2 (ranks 2 and 3 are stage 1), 19 scored steps: windows of steps 16-20, 11-15
    and 6-10.  (a) Rank 2 computes 3x as long all run (a relative straggler); rank 3, its tp
    peer, ran its last 10 steps 1.5x slower (a loaded machine: CI read one such peer at
    0.73) but stays far faster than rank 2: rank 2 is named, rank 3 is not, it is behind no
    peer that kept its speed.  (b) Both ranks of stage 1 slow together in their last 10
    steps (a throttled node): both named.  (c) A dp4 stage where one rank slows in its last
    10 steps: named, behind its peers.  (d) A slowdown of the last 5 steps only (one
    window): no straggler yet, a slowdown must last two windows."""
    def write(sub, world, shape, dur_of):
        dd = os.path.join(d, sub)
        os.makedirs(dd)
        for rank in range(world):
            log = RankLog(rank, world, shape, "h")
            for s in range(1, 21):
                t = 1000 * MS * s
                dur = int(dur_of(rank, s) * MS)
                log.span("compute", "step", t, t + 100 * MS, step=s)
                log.span("compute", "fwd", t, t + dur, step=s, mb=0)
            log.write(dd)
        rc, so, se = run("trace", "stragglers", dd, "--json")
        rt, st, et = run("trace", "stragglers", dd)
        j = json.loads(so) if rc == 0 else {}
        return {x["rank"]: x for x in j.get("ranks", [])}, j, so + se + st + et, st
    r, j, out, text = write("peer", 4, (1, 2, 2), lambda rank, s: 60 if rank == 2 else
                            30 if rank == 3 and s > 10 else 20)
    ok(j.get("stragglers") == [2] and abs(r.get(3, {}).get("individual", 0) - 20 / 30) < 1e-6
       and r[3].get("behind_stage") is False and r[2].get("behind_stage") is True and
       "ok (slower than before, but not behind its stage's other ranks)" in text,
       "a tp peer that slowed beside a slower rank is not named; the slow rank is", out)
    r, j, out, text = write("stage", 4, (1, 2, 2), lambda rank, s: 40 if rank >= 2 and s > 10
                            else 20)
    ok(j.get("stragglers") == [2, 3] and r.get(2, {}).get("behind_stage") is True,
       "a stage whose ranks all slowed together: both named", out)
    r, j, out, text = write("dp4", 4, (4, 1, 1), lambda rank, s: 40 if rank == 1 and s > 10
                            else 20)
    ok(j.get("stragglers") == [1] and r.get(1, {}).get("behind_stage") is True and
       r[1].get("last_ms") == 40 and r[0].get("last_ms") == 20,
       "dp4, one rank slowed: named, behind its peers", out)
    r, j, out, text = write("brief", 4, (4, 1, 1), lambda rank, s: 40 if rank == 1 and s > 15
                            else 20)
    ok(j.get("stragglers") == [] and r.get(1, {}).get("individual") == 1.0,
       "dp4, one rank slowed for its last window only: not named yet", out)


def test_individual_noise(d):
    """Eight ranks of the same speed, 12% of step-to-step noise (lognormal, seeded), 1,000
    steps: nobody slowed, nobody is named.  Before, the individual score compared the last
    window with the best of the run's 200 windows (a minimum, which falls as the run grows),
    and these runs named a rank in most seeds.  Then one rank slows by half for its last 20
    steps in the same noise: it alone is named."""
    import random

    def write(sub, seed, slow):
        rnd = random.Random(seed)
        dd = os.path.join(d, sub)
        os.makedirs(dd)
        for rank in range(8):
            log = RankLog(rank, 8, (8, 1, 1), "h")
            for s in range(1, 1001):
                t = 100 * MS * s
                ms = 10 * rnd.lognormvariate(0, 0.12) * (1.5 if rank == slow and s > 980 else 1)
                log.span("compute", "step", t, t + 30 * MS, step=s)
                log.span("compute", "fwd", t, t + int(ms * MS), step=s, mb=0)
            log.write(dd)
        rc, so, se = run("trace", "stragglers", dd, "--json")
        return (json.loads(so) if rc == 0 else {}), so + se
    named = []
    for seed in (1, 2, 3):
        j, out = write(f"noise{seed}", seed, None)
        named.append(j.get("stragglers"))
    ok(named == [[], [], []], "12% noise over 1,000 steps: no straggler in any of 3 seeds",
       str(named))
    j, out = write("slow", 4, 5)
    ok(j.get("stragglers") == [5], "the same noise, rank 5 1.5x slower for 20 steps: named",
       out[-3000:])


def test_strag_noise(d):
    """What noise and small runs made look like a straggler, and what still is one.  Each run:
    ranks of `times` (ms of compute per step, the first step the warm-up), steps of `step_ms`.
    (a) two ranks whose steps take 10 or 20 ms at random, rank 1 drew more 20s: its median is
    twice rank 0's (relative 0.5, named), but its faster quarter is no slower than rank 0's
    slower quarter: noise, not named; (b) a run of 5 steps: too short to judge, and said so;
    (c) a lag that is consistent but small against the step (0.45 against 0.3 ms of compute
    in 8 ms steps: a tiny model on a shared machine, named): no cost to the job, not named;
    (d) a consistent, large lag is still named: against its one peer with two ranks, and among
    four ranks."""
    def write(sub, times, step_ms):
        dd = os.path.join(d, sub)
        os.makedirs(dd)
        world = len(times)
        for rank, row in enumerate(times):
            log = RankLog(rank, world, (world, 1, 1), "h")
            for k, ms in enumerate(row):
                t, s = 1000 * MS * (k + 1), k + 1
                log.span("compute", "step", t, t + int(step_ms * MS), step=s)
                log.span("compute", "fwd", t, t + int(ms * MS), step=s, mb=0)
            log.write(dd)
        rc, so, se = run("trace", "stragglers", dd, "--json")
        rt, st, et = run("trace", "stragglers", dd)
        return (json.loads(so) if rc == 0 else {}), so + se, st + et
    fast, slow = [10] * 7 + [20] * 4, [10] * 4 + [20] * 7  # 11 scored steps each
    j, out, text = write("noise", [[50] + fast[::2] + fast[1::2], [50] + slow[1::2] + slow[::2]],
                         40)
    r = {x["rank"]: x for x in j.get("ranks", [])}
    ok(j.get("stragglers") == [] and r.get(1, {}).get("relative") == 0.5 and
       r[1]["consistent"] is False and "its step times overlap the fastest's: noise" in text and
       "stragglers: none" in text and "a pipeline stage of 2 ranks" in text,
       "two ranks, times that overlap: a median twice the other's is noise, no straggler",
       out + text)
    j, out, text = write("short", [[50, 10, 10, 10, 10], [50, 20, 20, 20, 20]], 40)
    ok(j.get("stragglers") == [] and [x["judged"] for x in j.get("ranks", [])] == [False] * 2 and
       "too short to judge: 2 rank(s) have fewer than 8 scored steps" in " ".join(j["notes"]) and
       "ok? (too few steps to judge)" in text and "note: too short to judge" in text,
       "a run of 5 steps: scores shown, too short to judge, said so", out + text)
    j, out, text = write("small", [[5] + [0.3] * 12, [5] + [0.45] * 12], 8)
    r = {x["rank"]: x for x in j.get("ranks", [])}
    ok(j.get("stragglers") == [] and r.get(1, {}).get("consistent") is True and
       r[1]["lag_small"] is True and "ok (slower, by under 5% of a step: no cost)" in text,
       "a consistent lag of 2% of a step: no straggler", out + text)
    j, out, text = write("pair", [[50] + [10, 11] * 6, [50] + [20, 22] * 6], 40)
    ok(j.get("stragglers") == [1] and "STRAGGLER (slower than its one peer)" in text,
       "two ranks, a consistent lag of 25% of a step: named against its one peer", out + text)
    j, out, text = write("four", [[50] + [10, 11] * 6] * 2 + [[50] + [20, 22] * 6] +
                         [[50] + [10, 11] * 6], 40)
    ok(j.get("stragglers") == [2] and "STRAGGLER\n" in text and "pipeline stage of 2" not in text,
       "four ranks, one slower: named", out + text)


def test_resumed(d):
    """A run resumed at step 5,000,000: its logs hold steps 5,000,001-5,000,010
    only.  The first of them (the set-up after the resume) is the warm-up
    step left out, and the report spans the logged steps, not 1-5,000,010."""
    for r in range(2):
        log = RankLog(r, 2, (2, 1, 1), "h")
        for s in range(5_000_001, 5_000_011):
            t = 1000 * MS * (s - 5_000_000)
            dur = (10 + 10 * r) * MS * (5 if s == 5_000_001 else 1)
            log.span("compute", "fwd", t, t + dur, step=s, mb=0)
        log.write(d)
    png = os.path.join(d, "heat.png")
    rc, so, se = run("trace", "stragglers", d, "--png", png)
    ok(rc == 0 and "steps 5000001-5000010" in so and "last 8000 steps" not in se,
       "the report spans the logged steps", so + se)
    rc, so, se = run("trace", "stragglers", d, "--json")
    j = json.loads(so) if rc == 0 else {}
    ok([x["steps"] for x in j.get("ranks", [])] == [9, 9] and j["stragglers"] == [1],
       "the first step after a resume is the warm-up step left out", so + se)


def test_stages(d):
    """dp2 x pp2: the last stage (which also computes the loss) takes 3x the
    first's compute on both its ranks; no rank is a straggler.  Rank 1 is 2x
    slower than rank 0 of its stage: it is, though faster than stage 1."""
    for r in range(4):
        log = RankLog(r, 4, (2, 2, 1), "hostA")
        dur = {0: 10, 1: 20, 2: 30, 3: 30}[r] * MS
        for s in range(1, 11):
            t = 1000 * MS * s
            log.span("compute", "fwd", t, t + dur, step=s, mb=0)
            log.span("compute", "bwd", t + 100 * MS, t + 100 * MS + dur, step=s, mb=0)
        log.write(d)
    rc, so, se = run("trace", "stragglers", d, "--json")
    j = json.loads(so) if rc == 0 else {}
    rel = {x["rank"]: x["relative"] for x in j.get("ranks", [])}
    ok(rc == 0 and j.get("stragglers") == [1] and rel == {0: 1.0, 1: 0.5, 2: 1.0, 3: 1.0},
       "relative scores within a pipeline stage: the slower last stage is no straggler", so + se)


def peak_rss_kb(*args):
    """Exit code and peak resident memory (KiB) of `megascale ARGS` run alone (a fresh
    process: getrusage of the children would give the largest child so far)."""
    code = ("import resource, subprocess, sys; "
            "r = subprocess.run(sys.argv[1:], capture_output=True); "
            "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    p = subprocess.run([sys.executable, "-c", code, BIN, *map(str, args)], capture_output=True,
                       text=True)
    rc, kb = p.stdout.split()
    return int(rc), int(kb)


def peak_anon_kb(*args):
    """Exit code and the largest anonymous resident memory (KiB: the heap, without the
    libraries' pages) of `megascale ARGS`, sampled every 5 ms.  Its peak resident memory
    hides some 60 MB of heap: the libraries' destructors page in that much of their files at
    exit."""
    p = subprocess.Popen([BIN, *map(str, args)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    peak = 0
    while p.poll() is None:
        try:
            with open(f"/proc/{p.pid}/status") as f:
                for line in f:
                    if line.startswith("RssAnon:"):
                        peak = max(peak, int(line.split()[1]))
        except OSError:
            pass
        time.sleep(0.005)
    return p.wait(), peak


def memory_bound(what, held, base, bound, detail=""):
    """held KiB over base under bound; a sanitizer's shadow memory and quarantine
    grow with every allocation made, freed or not, so a sanitized build is not
    held to it (MS_SANITIZER, set by the test registry) and the check says so."""
    san = os.environ.get("MS_SANITIZER", "none")
    if san != "none":
        print(f"memory bound not checked ({san} sanitizer build): {what}, {held} KiB over {base}")
        return True
    return held < bound


def write_many_spans(d, spans, world):
    """world ranks of `spans` fwd spans each, written fast."""
    for r in range(world):
        head = dict(type="header", version=1, rank=r, world=world, host="h", pid=1,
                    coord=dict(dp=r, pp=0, tp=0), shape=dict(dp=world, pp=1, tp=1), mono_ns=0,
                    wall_ns=1_700_000_000 * 10**9)
        line = '{"type":"span","name":"fwd","lane":"compute","t0":%d,"t1":%d,"step":%d}\n'
        with open(os.path.join(d, f"events_r{r:05d}.jsonl"), "w") as f:
            f.write(json.dumps(head) + "\n" +
                    "".join(line % (2000 * i, 2000 * i + 1000 + r, i // 20 + 1)
                            for i in range(spans)))
    return small_log(d)


def small_log(d, steps=1):
    """DIR/small: one rank of `steps` fwd spans, the baseline of a memory check."""
    small = os.path.join(d, "small")
    os.makedirs(small)
    log = RankLog(0, 1, (1, 1, 1), "h")
    for s in range(1, steps + 1):
        log.span("compute", "fwd", s * MS, s * MS + MS // 2, step=s)
    log.write(small)
    return small


def test_stragglers_memory(d):
    """24 ranks of 70,000 compute spans each: the ranks are read one at a time, so memory
    holds one rank's spans (about 7 MB here), not the run's (about 180 MB: it grew with the
    ranks, and a long run's logs are gigabytes a rank).  (The process's resident memory
    starts near 230 MB, the CUDA libraries, and that much heap fits under its peak.)"""
    small = write_many_spans(d, 70000, 24)
    rc0, base = peak_rss_kb("trace", "stragglers", small)
    rc, big = peak_rss_kb("trace", "stragglers", d)
    ok(rc0 == 0 and rc == 0 and memory_bound("stragglers", big - base, base, 15_000),
       "stragglers: memory holds one rank's spans at a time", f"{big - base} KiB over {base}")


def test_stragglers_long(d):
    """A long job: 32 ranks whose logs span steps 1-300,000 (one step in 1,000 logged, so that
    the files stay small).  Each rank's row is scored as it is read and freed, and only the
    newest 8,000 steps a rank are kept for the heat map, so memory holds one rank's row (2.4
    MB here); it held every rank's row and then a ranks x steps matrix of them (150 MB here,
    and 10,000 ranks x a week of steps do not fit in any memory).  The scores are the same:
    rank 5 computes twice as long (relative), rank 7 slowed in its last 10 steps (individual,
    while the others kept their speed)."""
    world, every, steps = 32, 1000, 300
    for r in range(world):
        head = dict(type="header", version=1, rank=r, world=world, host=f"h{r}", pid=1,
                    coord=dict(dp=r, pp=0, tp=0), shape=dict(dp=world, pp=1, tp=1), mono_ns=0,
                    wall_ns=1_700_000_000 * 10**9)
        line = '{"type":"span","name":"fwd","lane":"compute","t0":%d,"t1":%d,"step":%d}\n'
        rows = []
        for k in range(steps):
            dur = (40 if r == 5 else 60 if r == 7 and k >= steps - 10 else 20) * MS + r
            rows.append(line % (k * 1000 * MS, k * 1000 * MS + dur, 1 + k * every))
        with open(os.path.join(d, f"events_r{r:05d}.jsonl"), "w") as f:
            f.write(json.dumps(head) + "\n" + "".join(rows))
    small = small_log(d, 3)
    png = os.path.join(d, "heat.png")
    rc0, base = peak_rss_kb("trace", "stragglers", small, "--png", png)
    rc, big = peak_rss_kb("trace", "stragglers", d, "--png", png)
    ok(rc0 == 0 and rc == 0 and memory_bound("stragglers", big - base, base, 40_000),
       "stragglers of a long job: memory holds one rank's row, not ranks x steps",
       f"{big - base} KiB over {base}")
    rc, so, se = run("trace", "stragglers", d, "--json", "--png", png)
    j = json.loads(so) if rc == 0 else {}
    r = {x["rank"]: x for x in j.get("ranks", [])}
    ok(rc == 0 and j.get("stragglers") == [5, 7] and len(r) == world and
       all(x["steps"] == steps - 1 for x in r.values()) and
       abs(r[5]["median_ms"] - 40.000005) < 1e-9 and abs(r[5]["relative"] - 0.5) < 1e-6 and
       abs(r[7]["median_ms"] - 20.000007) < 1e-9 and abs(r[7]["individual"] - 1 / 3) < 1e-6 and
       abs(r[0]["individual"] - 1.0) < 1e-12 and "showing the last 8000 steps" in se and
       os.path.getsize(png) > 1000,
       "stragglers of a long job: the slow rank and the one that slowed named, heat map drawn",
       so[:600] + se)


def test_merge_memory(d):
    """24 ranks of 20,000 spans: merge reads the logs twice, one rank at a time (lay out,
    then write), so memory holds one rank's spans; it held every rank's, and room for a
    thread per span of every rank (1 GB of heap for 16 ranks of 250,000 spans; now 72 MB).
    The timeline is the same (the tests above)."""
    small = write_many_spans(d, 20000, 24)
    out = os.path.join(d, "m.json")
    rc0, base = peak_rss_kb("trace", "merge", small, "-o", out)
    rc, big = peak_rss_kb("trace", "merge", d, "-o", out)
    n = sum(1 for e in json.load(open(out))["traceEvents"] if e.get("ph") == "X") if rc == 0 else 0
    ok(rc0 == 0 and rc == 0 and n == 24 * 20000 and memory_bound("merge", big - base, base, 8_000),
       "merge: memory holds one rank's spans at a time", f"{n} events; {big - base} KiB over {base}")


def test_merge_p2p_memory(d):
    """32 ranks in send/recv pairs (rank 2k sends to 2k + 1), 12,000 transfers each: the sends
    and recvs are set aside in a file next to the output as each rank is written, sorted, and
    paired reading a few of each rank's at a time, so memory holds one rank's; it held every
    transfer of the run (22 MB here, and a long job's pipeline sends and recvs are billions).
    The flows are the same (the tests above: every send paired with its recv)."""
    world, n = 32, 12000
    if os.environ.get("MS_SANITIZER", "none") != "none":  # memory not checked: the pairing only
        n = 1000
    for r in range(world):
        head = dict(type="header", version=1, rank=r, world=world, host="h", pid=1,
                    coord=dict(dp=0, pp=r, tp=0), shape=dict(dp=1, pp=world, tp=1), mono_ns=0,
                    wall_ns=1_700_000_000 * 10**9)
        clock = dict(type="clock", mono_ns=0, offset_ns=0, err_ns=0)
        name, peer = ("send", r + 1) if r % 2 == 0 else ("recv", r - 1)
        line = ('{"type":"span","name":"%s","lane":"comm:pp","group":"pp","t0":%%d,"t1":%%d,'
                '"peer":%d,"tag":0}\n' % (name, peer))
        with open(os.path.join(d, f"events_r{r:05d}.jsonl"), "w") as f:
            f.write(json.dumps(head) + "\n" + json.dumps(clock) + "\n" +
                    "".join(line % (10_000 * i, 10_000 * i + 5000 + 1000 * (r % 2))
                            for i in range(n)))
    small = small_log(d)
    out = os.path.join(d, "m.json")
    rc0, base = peak_anon_kb("trace", "merge", small, "-o", out)
    rc, big = peak_anon_kb("trace", "merge", d, "-o", out)
    od = json.load(open(out))["otherData"] if rc == 0 else {}
    ok(rc0 == 0 and rc == 0 and od.get("flows") == world // 2 * n and
       od.get("unmatched_sends") == 0 and od.get("unmatched_recvs") == 0 and
       memory_bound("merge p2p", big - base, base, 10_000) and
       not [x for x in os.listdir(d) if ".p2p." in x or ".tmp" in x],
       "merge: sends and recvs paired holding one rank's, nothing left behind",
       f"{od}; {big - base} KiB over {base}")


# ---- 3. hang ---------------------------------------------------------------------------------

SHAPE8 = (2, 2, 2)


def groups_of(r):
    """(name, ranks) of rank r's tp, dp and pp groups on the dp2 pp2 tp2 grid."""
    tp, dp, pp = r % 2, r // 2 % 2, r // 4
    return {"tp": [4 * pp + 2 * dp, 4 * pp + 2 * dp + 1], "dp": [4 * pp + tp, 4 * pp + 2 + tp],
            "pp": [2 * dp + tp, 4 + 2 * dp + tp]}


def write_hang(d, skip=(), behind=None, extra=lambda r: {}):
    """Ranks 0-3 wait for grads from their pp peer (recv); ranks 4-7 wait in
    tp all_reduce #12; `behind`: a rank that issued only #11 on tp and waits
    in nothing."""
    for r in range(8):
        if r in skip:
            continue
        g = groups_of(r)
        groups = []
        for name in ("tp", "dp", "pp"):
            issued = completed = 11 if name == "tp" else 6
            ops = []
            if name == "tp" and r >= 4 and r != behind:
                issued, ops = 12, [("all_reduce", 12, -1, -1, 6.9 + 0.01 * r)]
            if name == "pp" and r < 4:
                issued, ops = 7, [("recv", 7, r + 4, 1, 6.5)]
            groups.append((name, g[name], issued, completed, ops))
        hang_dump(d, r, 8, SHAPE8, "hostA" if r < 4 else "hostB", groups,
                  reason="peer_request" if r == behind else "timeout", **extra(r))


def test_hang_missing(d):
    write_hang(d, skip=(5,))
    RankLog(5, 8, SHAPE8, "hostB5").write(d)  # its host comes from the events header
    rc, so, se = run("trace", "hang", d, "--json")
    try:
        j = json.loads(so)
    except ValueError:
        j = {}
    ok(rc == 0 and j, "hang --json exits 0 with JSON", so + se)
    sus = [s["rank"] for s in j.get("suspects", [])]
    ok(sus == [5], "the rank without a dump is the one suspect", sus)
    if sus == [5]:
        s = j["suspects"][0]
        ok(s["host"] == "hostB5" and s["coord"] == {"dp": 0, "pp": 1, "tp": 1} and
           "wrote no dump" in s["reasons"][0], "suspect host, coord, reason", s)
    ok(j.get("world") == 8 and j.get("shape") == {"dp": 2, "pp": 2, "tp": 2} and
       j.get("missing") == [5] and j.get("dumps") == [0, 1, 2, 3, 4, 6, 7],
       "world, shape, dumps, missing", j)
    w = {x["rank"]: x for x in j.get("waiting", [])}
    ok(w.get(4, {}).get("op") == "all_reduce" and w[4]["group"] == "tp" and w[4]["seq"] == 12 and
       w.get(0, {}).get("op") == "recv", "waiting: each rank's oldest op", w)
    rc, so, se = run("trace", "hang", d)
    ok(rc == 0 and "world 8 = dp 2 x pp 2 x tp 2" in so and "pp stage 1" in so and
       "no dump" in so and "all_reduce #12 on 'tp' [4,5]" in so and
       "suspects: rank 5 (dp 0, pp 1, tp 1) on hostB5: wrote no dump" in so, "hang text report",
       so + se)


def test_hang_stand_in(d):
    """Rank 5 wrote no dump and ended while it rotated its log: only events_r00005.jsonl.new
    is there.  Its host and coordinates come from that file's header, as from the log's
    (before, the hang report said "unknown"); rank 6's dump of an earlier hang (another pid
    than its older half events_r00006.jsonl.1) is skipped, as beside a log."""
    write_hang(d, skip=(5,), extra=lambda r: dict(pid=99 if r == 6 else 1000 + r))
    log = RankLog(5, 8, SHAPE8, "hostB5")
    log.coord = {"dp": 1, "pp": 1, "tp": 0}
    log.write(d)
    os.rename(os.path.join(d, "events_r00005.jsonl"), os.path.join(d, "events_r00005.jsonl.new"))
    for r in (0, 1, 2, 3, 4, 6, 7):
        RankLog(r, 8, SHAPE8, "hostA" if r < 4 else "hostB").write(d)  # pid 1000 + rank
    os.rename(os.path.join(d, "events_r00006.jsonl"), os.path.join(d, "events_r00006.jsonl.1"))
    rc, so, se = run("trace", "hang", d, "--json")
    try:
        j = json.loads(so)
    except ValueError:
        j = {}
    sus = {s["rank"]: s for s in j.get("suspects", [])}
    ok(rc == 0 and 5 in sus and sus[5]["host"] == "hostB5" and
       sus[5]["coord"] == {"dp": 1, "pp": 1, "tp": 0},
       "a rank without a dump or log: host and coordinates from its .jsonl.new", so + se)
    ok(rc == 0 and j.get("missing") == [5, 6] and
       "hang_r00006.json: skipped: another run's dump (pid 99; rank 6's event log here is from "
       "pid 1006" in se, "a dump of an earlier hang is skipped beside a .jsonl.1", so + se)


def test_hang_placed(d):
    """A grid placed host by host (mpirun dealt the ranks out round-robin):
    rank 5's position is not the formula's (dp 0, pp 1, tp 1).  It wrote no
    dump; its coordinates come from its event log's header, as its host."""
    write_hang(d, skip=(5,))
    log = RankLog(5, 8, SHAPE8, "hostB5")
    log.coord = {"dp": 1, "pp": 1, "tp": 0}
    log.write(d)
    rc, so, se = run("trace", "hang", d, "--json")
    try:
        sus = json.loads(so).get("suspects", [])
    except ValueError:
        sus = []
    ok(rc == 0 and [s["rank"] for s in sus] == [5] and
       sus[0]["coord"] == {"dp": 1, "pp": 1, "tp": 0} and sus[0]["host"] == "hostB5",
       "a rank without a dump: coordinates from its log's header", so + se)


def test_hang_placed_table(d):
    """dp2 x pp2 placed host by host over ranks dealt out round-robin: rank 1 is at (dp 0,
    pp 1) and rank 2 at (dp 1, pp 0), where the position formula puts them the other way
    round.  Rank 1 wrote no dump (its header says where it is).  The state tables draw each
    rank at its own coordinates: the missing rank under pp stage 1, dp 0.  Before, they were
    filled by the formula: "no dump" under pp 0, dp 1, and rank 2's "wait" under pp 1."""
    where = {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1)}  # rank: (dp, pp)
    op = [("all_reduce", 5, -1, -1, 10.0)]
    for rank in (0, 2, 3):
        dp, pp = where[rank]
        hang_dump(d, rank, 4, (2, 2, 1), f"host{rank}", [("world", [0, 1, 2, 3], 5, 4, op)],
                  coord={"dp": dp, "pp": pp, "tp": 0})  # its own, not the formula's
    log = RankLog(1, 4, (2, 2, 1), "host1")
    log.coord = {"dp": 0, "pp": 1, "tp": 0}
    log.write(d)
    rc, so, se = run("trace", "hang", d)
    stages = so.split("pp stage ")
    table = {int(b[0]): [ln for ln in b.splitlines() if ln.startswith("  dp ")]
             for b in stages[1:3]} if len(stages) >= 3 else {}
    ok(rc == 0 and len(table) == 2 and "wait" in table[0][0] and "wait" in table[0][1] and
       "wait" not in table[1][0] and "wait" in table[1][1],
       "the state tables place each rank at its own coordinates", so + se)


def test_hang_rerun(d):
    """A restarted job hangs again in the same directory: rank 5 stops and
    writes no dump this time, but its dump of the first hang (another pid
    than its new event log's) is still there, and calls rank 6 unresponsive.
    It is skipped: rank 5 is the suspect, not rank 6."""
    for r in range(8):
        RankLog(r, 8, SHAPE8, "hostA" if r < 4 else "hostB").write(d)  # pid 1000 + rank
    write_hang(d, extra=lambda r: dict(pid=99 if r == 5 else 1000 + r,
                                       unresponsive=[{"rank": 6, "heartbeat_age_s": 5.0}]
                                       if r == 5 else []))
    rc, so, se = run("trace", "hang", d, "--json")
    j = json.loads(so) if rc == 0 else {}
    ok(rc == 0 and [s["rank"] for s in j.get("suspects", [])] == [5] and
       j.get("missing") == [5] and
       "hang_r00005.json: skipped: another run's dump (pid 99; rank 5's event log here is from "
       "pid 1005" in se, "a dump of an earlier hang is skipped", so + se)


def test_hang_smaller_rerun(d):
    """The job restarted with 2 ranks instead of 4 and hung again: ranks 2
    and 3 of the first run left their logs and dumps.  The newest dumps'
    world is analysed; the others are skipped with a warning."""
    for r in range(4):
        world, wall = (2, 1.7e9 + 600) if r < 2 else (4, 1.7e9)
        RankLog(r, world, (world, 1, 1), "h", wall_ns=int(wall * 1e9) - 10**9).write(d)
        others = [x for x in range(world) if x != r]
        ops = [("all_reduce", 3, -1, -1, 5.0)] if r != 1 else []
        hang_dump(d, r, world, (world, 1, 1), "h",
                  [("dp", list(range(world)), 3 if r != 1 else 2, 2, ops)], pid=1000 + r,
                  wall_s=wall, unresponsive=[{"rank": x, "heartbeat_age_s": 5.0} for x in others
                                             if r >= 2])
    rc, so, se = run("trace", "hang", d, "--json")
    j = json.loads(so) if rc == 0 else {}
    ok(rc == 0 and j.get("world") == 2 and [s["rank"] for s in j.get("suspects", [])] == [1] and
       "hang_r00002.json: skipped: a dump of another run (world 4" in se,
       "dumps of an earlier run with another world are skipped", so + se)
    # an offline tool's lines say the tool, not "r0" (a rank of the job it reads)
    ok("[megascale trace warn]" in se and "[megascale r0" not in se,
       "trace's warnings are tagged 'trace', not a rank", se)


def test_hang_behind(d):
    write_hang(d, behind=6)
    rc, so, se = run("trace", "hang", d, "--json")
    j = json.loads(so) if rc == 0 else {}
    sus = {s["rank"]: s for s in j.get("suspects", [])}
    ok(list(sus) == [6], "the member that never entered #12 is the one suspect", so + se)
    why = " ".join(sus.get(6, {}).get("reasons", []))
    ok("never entered all_reduce #12 on group 'tp' that rank 7 waits in" in why,
       "reason names the op, the group and the waiter", why)
    rc, so, se = run("trace", "hang", d)
    ok(rc == 0 and "SUSPECT" in so and "suspects: rank 6 (dp 1, pp 1, tp 0) on hostB" in so,
       "text report marks rank 6", so)


def test_hang_blocked(d):
    """dp2 x pp2, rank 2's training thread stopped (a real run's dumps with
    --inject-fault hang@4:2): ranks 1 and 3 wait in reduce_scatter #28 on dp;
    rank 0 never entered it because it waits to receive from rank 2; rank 2
    never entered it and waits in nothing.  Rank 2 is the one suspect, rank 0
    a note."""
    shape = (2, 2, 1)
    rs = ("reduce_scatter", 28, -1, -1, 5.0)
    dumps = {0: [("dp", [0, 1], 27, 27, []), ("pp", [0, 2], 3, 3, [("recv", 3, 2, 13, 5.0)])],
             1: [("dp", [0, 1], 28, 27, [rs]), ("pp", [1, 3], 3, 3, [])],
             2: [("dp", [2, 3], 27, 27, []), ("pp", [0, 2], 3, 3, [])],
             3: [("dp", [2, 3], 28, 27, [rs]), ("pp", [1, 3], 3, 3, [])]}
    for r, groups in dumps.items():
        hang_dump(d, r, 4, shape, "h", groups, reason="peer_request" if r == 2 else "timeout")
    rc, so, se = run("trace", "hang", d, "--json")
    j = json.loads(so) if rc == 0 else {}
    notes = {s["rank"]: " ".join(s["reasons"]) for s in j.get("notes", [])}
    ok(rc == 0 and [s["rank"] for s in j.get("suspects", [])] == [2] and
       "it waits itself, in recv from rank 2 on 'pp'" in notes.get(0, ""),
       "a rank behind that waits itself is a note, the idle one the suspect", so + se)


def test_hang_young_op(d):
    """tp2 x pp2, rank 3's training thread stopped (a real run's dumps with
    --inject-fault hang@4:3): rank 1 has waited 5 s to receive from it; rank 2
    entered the next all_reduce on 'gate' only 0.2 s before the dumps, which
    rank 0 (busy, waiting in nothing) had not reached yet.  That young op is
    no evidence: rank 3 is the one suspect, rank 0 not even a note."""
    shape = (1, 2, 2)
    gate = lambda r, issued, ops: ("gate", [0, 1, 2, 3], issued, 2, ops)
    dumps = {0: [gate(0, 2, [])],
             1: [gate(1, 2, []), ("embedding", [1, 3], 0, 0, [("recv", 0, 3, 1, 5.0)])],
             2: [gate(2, 3, [("all_reduce", 3, -1, -1, 0.2)])],
             3: [gate(3, 2, []), ("embedding", [1, 3], 0, 0, [])]}
    for r, groups in dumps.items():
        hang_dump(d, r, 4, shape, "h", groups, reason="timeout" if r == 1 else "peer_request")
    rc, so, se = run("trace", "hang", d, "--json")
    j = json.loads(so) if rc == 0 else {}
    ok(rc == 0 and [s["rank"] for s in j.get("suspects", [])] == [3] and not j.get("notes"),
       "an op entered just before the dumps is no evidence", so + se)


def test_hang_healthy(d):
    """Dumps of a job that runs (`launch --ctl dump`: reason "signal"): rank 0 posted its
    reduce_scatter #1 on 'dp' 0.01 s before, rank 1 had not reached it yet.  A wait that short
    is the ranks' normal wait for each other: no suspect, and the report says the job was
    making progress (before, rank 1 was named: "never entered reduce_scatter #1")."""
    shape = (2, 1, 1)
    dp = lambda ops, issued: ("dp", [0, 1], issued, 0, ops)
    hang_dump(d, 0, 2, shape, "h", [dp([("reduce_scatter", 1, -1, -1, 0.01)], 1)],
              reason="signal")
    hang_dump(d, 1, 2, shape, "h", [dp([], 0)], reason="signal")
    rc, so, se = run("trace", "hang", d, "--json")
    j = json.loads(so) if rc == 0 else {}
    ok(rc == 0 and not j.get("suspects") and not j.get("notes"),
       "the dumps of a job that runs: no suspect", so + se)
    rc, so, se = run("trace", "hang", d)
    ok(rc == 0 and "suspects: none found (no op in flight had waited 1.0 s" in so,
       "... and the report says it was making progress", so + se)


def test_hang_stale(d):
    """Rank 5 was stopped: the others' dumps say its heartbeat is stale; its
    own late dump says they exited (they gave up on it).  Rank 6 is behind
    on tp, a weaker finding: a note, not a suspect.  An absurd heartbeat age
    (a slot that never beat) is not evidence."""
    def extra(r):
        if r == 5:
            return dict(wall_s=1.7e9 + 60, exited=[0, 1, 4], unresponsive=[])
        stale = [dict(rank=5, heartbeat_age_s=6.0)]
        if r == 7:
            stale.append(dict(rank=2, heartbeat_age_s=18446744073.7))
        return dict(wall_s=1.7e9 + r * 0.01, unresponsive=stale, exited=[])
    write_hang(d, behind=6, extra=extra)
    rc, so, se = run("trace", "hang", d, "--json")
    j = json.loads(so) if rc == 0 else {}
    sus = [s["rank"] for s in j.get("suspects", [])]
    notes = [s["rank"] for s in j.get("notes", [])]
    ok(sus == [5] and notes == [6], "unresponsive rank is the suspect; the one behind a note",
       so + se)
    why = " ".join(j["suspects"][0]["reasons"]) if sus else ""
    ok("unresponsive" in why and "ranks 0, 1, 2, 3, 4, 6, 7" in why, "who saw it stale", why)
    rc, so, se = run("trace", "hang", d)
    ok(rc == 0 and "suspects: rank 5 (dp 0, pp 1, tp 1) on hostB: unresponsive" in so and
       "also (weaker evidence): rank 6" in so, "text: suspect and note", so)


def test_hang_nogrid(d):
    for r in range(2):
        hang_dump(d, r, 2, (2, 1, 1), "h", [("dp", [0, 1], 3, 2, [("all_reduce", 3, -1, -1, 1.0)])],
                  grid=False)
    rc, so, se = run("trace", "hang", d, "--json")
    j = json.loads(so) if rc == 0 else {}
    sus = {s["rank"]: " ".join(s["reasons"]) for s in j.get("suspects", [])}
    ok(j.get("shape") == {"dp": 2, "pp": 1, "tp": 1} and list(sus) == [0, 1] and
       "all 2 members of group 'dp' (ranks 0, 1) are in all_reduce #3" in sus[0],
       "no grid: dp = world; both in the op that never completed: the group is stuck", so + se)
    for r in range(2):  # nothing in flight anywhere: no evidence
        hang_dump(d, r, 2, (2, 1, 1), "h", [("dp", [0, 1], 3, 3, [])], grid=False)
    rc, so, se = run("trace", "hang", d)
    ok(rc == 0 and "suspects: none found" in so, "suspects: none found", so)


def test_hang_stuck_group(d):
    """dp2 x pp2 x tp2, the tp group [6, 7] of stage 1 stuck inside all_reduce #12 (both
    members in it for 300 s: a broken link).  Ranks 4, 5 wait for 6, 7 in a dp
    reduce-scatter, ranks 2, 3 to receive from 6, 7 (so they never entered their dp op that
    0, 1 wait in).  Before, 2, 3, 6 and 7 were equal suspects ("never entered ..., waits
    itself"); 6 and 7 are the ones, 2 and 3 notes."""
    def write(stuck_state="posted", p2p_stuck=False):
        for r in range(8):
            g = groups_of(r)
            groups = []
            for name in ("tp", "dp", "pp"):
                issued = completed = 11 if name == "tp" else 5
                ops = []
                if name == "tp" and r in (6, 7) and not p2p_stuck:
                    st = stuck_state if r == 7 else "posted"
                    issued, ops = 12, [("all_reduce", 12, -1, -1, 300.0, st)]
                if name == "dp" and r in (0, 1, 4, 5):
                    issued, ops = 6, [("reduce_scatter", 6, -1, -1, 250.0)]
                if name == "pp" and r in (2, 3):
                    issued, ops = 6, [("recv", 6, r + 4, 1, 280.0)]
                if name == "pp" and r in (6, 7) and p2p_stuck:  # the other end, posted too
                    ops = [("send", 6, r - 4, 1, 290.0)]
                groups.append((name, g[name], issued, completed, ops))
            hang_dump(d, r, 8, SHAPE8, "hostA" if r < 4 else "hostB", groups)
    write()
    rc, so, se = run("trace", "hang", d, "--json")
    j = json.loads(so) if rc == 0 else {}
    sus = {s["rank"]: " ".join(s["reasons"]) for s in j.get("suspects", [])}
    notes = [s["rank"] for s in j.get("notes", [])]
    ok(rc == 0 and list(sus) == [6, 7] and notes == [2, 3] and
       "all 2 members of group 'tp' (ranks 6, 7) are in all_reduce #12" in sus.get(6, ""),
       "a collective every member entered that never completed: its members are the suspects, "
       "the ranks waiting on them notes", so + se)
    # rank 7 has the op only queued behind others on its communication thread: not stuck
    write(stuck_state="queued")
    rc, so, se = run("trace", "hang", d, "--json")
    j = json.loads(so) if rc == 0 else {}
    ok(rc == 0 and not any("all 2 members" in " ".join(s["reasons"])
                           for s in j.get("suspects", []) + j.get("notes", [])),
       "an op still queued on one member is no stuck group", so + se)
    # a transfer both ends posted (recv on 2, send on 6) that never completed
    write(p2p_stuck=True)
    rc, so, se = run("trace", "hang", d, "--json")
    j = json.loads(so) if rc == 0 else {}
    sus = {s["rank"]: " ".join(s["reasons"]) for s in j.get("suspects", [])}
    ok(rc == 0 and list(sus) == [2, 3, 6, 7] and
       "its recv from rank 6 on 'pp' (280.0 s) and rank 6's matching send" in sus.get(2, "") and
       "its send to rank 2 on 'pp' (290.0 s) and rank 2's matching recv" in sus.get(6, ""),
       "both ends of a transfer posted and stuck: the pair are the suspects", so + se)


def test_hang_exited(d):
    """Rank 5 exited: it wrote no dump, and rank 4's dump (its host's) says its process was
    gone.  The report gives both; it said only "wrote no dump: stopped, hung in compute, or
    dead", dropping what the other dumps saw of a rank without a dump."""
    write_hang(d, skip=(5,), extra=lambda r: dict(exited=[5] if r == 4 else []))
    rc, so, se = run("trace", "hang", d, "--json")
    j = json.loads(so) if rc == 0 else {}
    sus = {s["rank"]: s["reasons"] for s in j.get("suspects", [])}
    ok(rc == 0 and list(sus) == [5] and "wrote no dump" in sus[5][0] and
       "exited: its process was gone in the dump of rank 4" in " ".join(sus[5]),
       "a rank without a dump that another dump saw exit: both reasons", so + se)
    rc, so, se = run("trace", "hang", d)
    ok(rc == 0 and "exited: its process was gone in the dump of rank 4" in so,
       "text: the exit reported", so + se)


def edit_dump(d, rank, edit):
    """Rank's hang dump in d changed by edit(its JSON); its path."""
    p = os.path.join(d, f"hang_r{rank:05d}.json")
    j = json.load(open(p))
    edit(j)
    json.dump(j, open(p, "w"))
    return p


def test_hang_bad_world(d):
    """One damaged dump (the newest) says world 100000: the world most of the newest hang's
    dumps agree on (8) is analysed and the damaged one skipped (it won, as the newest, and
    every good dump was skipped instead, with a line per rank of its world).  Alone, its
    text stays short: ranks without a dump in a row are one line, no state tables."""
    write_hang(d, extra=lambda r: dict(wall_s=1.7e9 + (9 if r == 3 else r)))
    p = edit_dump(d, 3, lambda j: j.update(world=100000))
    rc, so, se = run("trace", "hang", d, "--json")
    j = json.loads(so) if rc == 0 else {}
    ok(rc == 0 and j.get("world") == 8 and j.get("missing") == [3] and
       "hang_r00003.json: skipped: a dump of another run (world 100000" in se,
       "a damaged dump's world is outvoted by the others'", so[-500:] + se)
    alone = os.path.join(d, "alone")
    os.makedirs(alone)
    os.rename(p, os.path.join(alone, "hang_r00003.json"))
    rc, so, se = run("trace", "hang", alone)
    ok(rc == 0 and len(so.splitlines()) < 20 and "ranks 0-2 " not in so and
       "ranks 4-99999 (99996 ranks): no dump" in so and "state tables left out" in so,
       "a huge world alone: the text stays short", so[-2000:])


def test_hang_rank_past_world(d):
    """Two dumps; the newest, rank 1's, says world 1 (damaged: a rank past its world).  It
    is the one skipped, not rank 0's good dump of world 8 (before, rank 0's was skipped as of
    another run, the tie going to the newest, and then rank 1's failed the load: no analysis,
    exit 3).  And an op whose peer is no rank of the world is refused, named, as a group's
    member past it is."""
    write_hang(d, skip=range(2, 8), extra=lambda r: dict(wall_s=1.7e9 + r))
    p = edit_dump(d, 1, lambda j: j.update(world=1))
    rc, so, se = run("trace", "hang", d, "--json")
    j = json.loads(so) if rc == 0 else {}
    ok(rc == 0 and j.get("world") == 8 and j.get("dumps") == [0] and 1 in j.get("missing", [])
       and "hang_r00001.json: skipped: the dump of rank 1 says a world of 1 (damaged)" in se,
       "a dump whose rank is past its world is the one skipped", so[-500:] + se)
    os.remove(p)
    edit_dump(d, 0, lambda j: next(g for g in j["groups"] if g["name"] == "pp")["in_flight"][0]
              .update(peer=99))
    rc, so, se = run("trace", "hang", d)
    ok(rc == 3 and "hang_r00000.json: group 'pp': recv #7's \"peer\" is not a rank of world 8"
       in se, "an op's peer past the world: refused, named", f"rc={rc}\n{se}")


def test_hang_driver(d):
    """2 ranks on 2 hosts, rank 1 SIGSTOPped: the supervisor asked for the dumps while rank 1
    was silent, and rank 1 wrote its dump only after the SIGCONT before the stop, in the same
    reduce_scatter as rank 0; no rank of its host saw it stop.  Both looked stuck in one
    op that never completed (both suspects).  The driver's hang_driver.json names rank 1
    silent: it is the one suspect, rank 0 (that waited for it) is not even a note.  A driver
    file of another world or hang, an entry of another process, or a damaged file is skipped
    with a warning: the dumps alone speak."""
    for r, host in ((0, "mxh1"), (1, "mxh2")):
        hang_dump(d, r, 2, (2, 1, 1), host,
                  [("dp", [0, 1], 5, 4, [("reduce_scatter", 5, -1, -1, 9.0 + 0.1 * r)])],
                  reason="signal", wall_s=1.7e9 + 5 * r, unresponsive=[], exited=[])
    drv = os.path.join(d, "hang_driver.json")

    def suspects(what):
        rc, so, se = run("trace", "hang", d, "--json")
        j = json.loads(so) if rc == 0 else {}
        return ({s["rank"]: " ".join(s["reasons"]) for s in j.get("suspects", [])},
                [s["rank"] for s in j.get("notes", [])], so + se)

    sus, notes, out = suspects("no driver file")
    ok(list(sus) == [0, 1] and "all 2 members of group 'dp'" in sus[0],
       "without the driver's file: both look stuck in the op (as before)", out)

    def driver(**kw):
        obj = dict(type="hang_driver", version=1, by="hang", world=2, wall_s=1.7e9 - 0.5,
                   silent=[dict(rank=1, host="mxh2", pid=99, beat_age_s=8.0)])
        obj.update(kw)
        json.dump(obj, open(drv, "w"))

    driver()
    sus, notes, out = suspects("driver file")
    ok(list(sus) == [1] and notes == [] and
       "no heartbeat to the driver for 8.0 s when the dumps were asked for" in sus[1],
       "the rank silent to the driver is the one suspect, the one that waited is not", out)
    rc, so, se = run("trace", "hang", d)
    ok(rc == 0 and "suspects: rank 1 (dp 1, pp 0, tp 0) on mxh2: no heartbeat to the driver "
       "for 8.0 s" in so and "rank 0 (dp 0, pp 0, tp 0) mxh1: reduce_scatter #5" in so and
       "SUSPECT" in so and so.count("SUSPECT") == 1, "text: rank 1 the suspect", so + se)
    for kw, warn in ((dict(world=4), "hang_driver.json: skipped: of another run (world 4"),
                     (dict(wall_s=1.7e9 - 3600), "hang_driver.json: skipped: of another hang "
                      "(written 3605 s from the newest dump)"),
                     (dict(silent=[dict(rank=1, pid=1234, beat_age_s=8.0)]),
                      "hang_driver.json: rank 1 skipped: pid 1234, but its dump's is 99"),
                     (dict(version=2), "hang_driver.json: skipped: not a version 1")):
        driver(**kw)
        sus, notes, out = suspects(warn)
        ok(list(sus) == [0, 1] and warn in out, f"skipped: {warn}", out)
    open(drv, "wb").write(b"\0" * 100)
    sus, notes, out = suspects("NULs")
    ok(list(sus) == [0, 1] and "hang_driver.json: skipped: not a version 1" in out,
       "a damaged driver file: skipped with a warning", out)
    # a silent rank that wrote no dump at all: both reasons
    driver()
    os.remove(os.path.join(d, "hang_r00001.json"))
    sus, notes, out = suspects("no dump")
    ok(list(sus) == [1] and "wrote no dump" in sus[1] and "no heartbeat to the driver" in sus[1],
       "a silent rank without a dump: both reasons", out)


# ---- 4. bad input ----------------------------------------------------------------------------

def test_hang_huge(d):
    """A 4,096-rank job (dp 256 x tp 16) where ranks 5, 700 and 3000 wrote no dump and every
    other rank waits in dp all_reduce #6; the dp groups without a missing rank are stuck as a
    whole (notes).  Every list of the report was one entry a rank (17 MB of JSON and of text
    for 32,768 ranks): now each holds its first 32 and a count ("n_<list>"), the waiting ranks
    and the suspects are grouped by what they wait in (exact counts), the suspects themselves
    are all there, and the text is as short.  Then all 4,096 ranks stuck in tp all_reduce #12:
    4,096 suspects, listed 32 and grouped."""
    world, dp, tp = 4096, 256, 16
    shape = (dp, 1, tp)
    gone = (5, 700, 3000)

    def write(sub, stuck_tp):
        dd = os.path.join(d, sub)
        os.makedirs(dd)
        for r in range(world):
            if r in gone and not stuck_tp:
                continue
            tpg = [r // tp * tp + t for t in range(tp)]
            dpg = [r % tp + tp * x for x in range(dp)]
            if stuck_tp:
                groups = [("tp", tpg, 12, 11, [("all_reduce", 12, -1, -1, 30.0)]),
                          ("dp", dpg, 6, 6, [])]
            else:
                groups = [("tp", tpg, 11, 11, []),
                          ("dp", dpg, 6, 5, [("all_reduce", 6, -1, -1, 30.0)])]
            hang_dump(dd, r, world, shape, f"n{r // 8}", groups)
        rc, so, se = run("trace", "hang", dd, "--json")
        rt, st, et = run("trace", "hang", dd)
        return rc, (json.loads(so) if rc == 0 else {}), so + se, rt, st + et, len(so), len(st)
    rc, j, out, rt, text, n_json, n_text = write("missing", False)
    notes = world - len(gone) * dp  # the ranks of the 13 dp groups without a missing rank
    ok(rc == 0 and [s["rank"] for s in j.get("suspects", [])] == list(gone) and
       j.get("missing") == list(gone) and j.get("n_missing") == 3 and
       j.get("n_suspects") == 3 and j.get("n_dumps") == world - 3 and
       j.get("n_notes") == notes and j.get("n_waiting") == world - 3 and
       len(j.get("dumps", [])) == 32 and len(j.get("notes", [])) == 32 and
       len(j.get("waiting", [])) == 32 and j.get("truncated") is True and
       [(g["what"], g["n_ranks"], len(g["ranks"])) for g in j.get("waiting_by_op", [])] ==
       [("all_reduce #6 on 'dp'", world - 3, 32)] and
       [(g["what"], g["n_ranks"], g["ranks"]) for g in j.get("suspects_by_op", [])] ==
       [("no dump", 3, list(gone))] and n_json < 40_000,
       "hang --json of 4096 ranks: lists cut at 32, counts exact, the three culprits all there",
       f"{n_json} bytes\n" + out[:3000])
    # the text's bound: the state tables (a cell a rank, up to 4,096 ranks: 60 KB here), then
    # 32 lines a list; it was a line of 500 bytes or more a rank (2.5 MB here)
    ok(rt == 0 and n_text < 100_000 and "suspects: rank 700 (dp 43, pp 0, tp 12) on unknown: "
       "wrote no dump" in text and "  ... 4064 more rank(s) not listed (4096 in all); all 4096 "
       "by what they wait in:\n    no dump: 3 rank(s): 5, 700, 3000\n    all_reduce #6 on 'dp': "
       "4093 rank(s): 0, 1, 2," in text and
       f"more rank(s) with weaker evidence not listed ({notes} in all)" in text,
       "hang text of 4096 ranks: bounded, the culprits named, the rest grouped",
       f"{n_text} bytes\n" + text[-3000:])
    rc, j, out, rt, text, n_json, n_text = write("stuck", True)
    g = j.get("suspects_by_op", [])
    ok(rc == 0 and j.get("n_suspects") == world and len(j.get("suspects", [])) == 32 and
       [(x["what"], x["op"], x["group"], x["seq"], x["n_ranks"]) for x in g] ==
       [("all_reduce #12 on 'tp'", "all_reduce", "tp", 12, world)] and
       g[0]["ranks"] == list(range(32)) and n_json < 40_000 and rt == 0 and n_text < 100_000 and
       "... 4064 more suspect(s) not listed (4096 in all)" in text,
       "hang of 4096 stuck ranks: 32 suspects listed, all 4096 counted and grouped",
       f"{n_json} / {n_text} bytes\n" + out[:2000] + text[-2000:])


def test_bad_input(root):
    d = os.path.join(root, "trunc")
    os.makedirs(d)
    log = RankLog(0, 1, (1, 1, 1), "h")
    log.span("compute", "fwd", 0, 10 * MS, step=1)
    log.span("compute", "bwd", 20 * MS, 30 * MS, step=1)
    log.write(d, truncate_last=12)
    rc, so, se = run("trace", "merge", d)
    ok(rc == 0 and "events_r00000.jsonl:4: incomplete last line ignored" in se,
       "a truncated last line is ignored with a warning", so + se)
    d = os.path.join(root, "malformed")
    os.makedirs(d)
    path = log.write(d)
    lines = open(path).read().splitlines()
    lines[2] = lines[2][:-5]
    open(path, "w").write("\n".join(lines) + "\n")
    for cmd in ("merge", "stragglers"):
        rc, so, se = run("trace", cmd, d)
        ok(rc == 3 and f"{path}:3: malformed JSON line" in se,
           f"{cmd}: a malformed middle line fails naming file:line", f"rc={rc}\n{se}")
    d = os.path.join(root, "backwards")
    os.makedirs(d)
    log = RankLog(0, 1, (1, 1, 1), "h")
    log.lines.append(dict(type="span", name="fwd", lane="compute", t0=50, t1=10))
    path = log.write(d)
    rc, so, se = run("trace", "merge", d)
    ok(rc == 3 and f"{path}:3" in se and "ends before it starts" in se, "t1 < t0 is an error", se)
    # times whose difference, or sum with a clock offset, overflows int64 (before: garbage
    # durations, the overflow undefined)
    d = os.path.join(root, "huge_t")
    os.makedirs(d)
    log = RankLog(0, 1, (1, 1, 1), "h")
    log.lines.append(dict(type="span", name="fwd", lane="compute", t0=-9 * 10**18,
                          t1=9 * 10**18))
    path = log.write(d)
    for cmd in ("merge", "stragglers"):
        rc, so, se = run("trace", cmd, d)
        ok(rc == 3 and f"{path}:3" in se and "|t| < 2^62 ns" in se,
           f"{cmd}: a span of +-9e18 ns is an error naming the line", f"rc={rc}\n{se}")
    d = os.path.join(root, "empty")
    os.makedirs(d)
    for cmd, what in (("merge", "no event logs"), ("stragglers", "no event logs"),
                      ("hang", "no hang dumps")):
        rc, so, se = run("trace", cmd, d)
        ok(rc == 3 and d in se and what in se, f"{cmd} on an empty dir: clear error", se)
    rc, so, se = run("trace", "merge", os.path.join(root, "nope"))
    ok(rc == 3 and "nope: no such run directory" in se, "missing DIR named", se)
    # a new dp2 run in the directory of an older 4-rank run: ranks 2 and 3 of the old run are
    # dropped, not merged or scored with the new run's (they made ranks 0 and 1 stragglers)
    d = os.path.join(root, "rerun")
    os.makedirs(d)
    for r in range(4):
        world, dur, wall = (4, 5, 1_700_000_000) if r >= 2 else (2, 20, 1_700_000_900)
        log = RankLog(r, world, (world, 1, 1), "h", wall_ns=wall * 10**9)
        for s in range(1, 6):
            log.span("compute", "fwd", 1000 * MS * s, 1000 * MS * s + dur * MS, step=s)
        log.write(d)
    rc, so, se = run("trace", "stragglers", d, "--json")
    j = json.loads(so) if rc == 0 else {}
    ok(rc == 0 and [x["rank"] for x in j.get("ranks", [])] == [0, 1] and j["stragglers"] == [] and
       "events_r00002.jsonl: skipped: a log of another run (world 4" in se,
       "logs of an older run with another world are skipped, with a warning", so + se)
    rc, so, se = run("trace", "merge", d)
    ok(rc == 0 and "merged 2 rank(s)" in so and "events_r00003.jsonl: skipped" in se,
       "merge skips them too", so + se)
    # same world, but rank 1 did not start this time: its log is an hour older than rank 0's
    d = os.path.join(root, "samesize")
    os.makedirs(d)
    for r, wall in ((0, 1_700_003_600), (1, 1_700_000_000)):
        log = RankLog(r, 2, (2, 1, 1), "h", wall_ns=wall * 10**9)
        log.span("compute", "fwd", 0, 10 * MS, step=1)
        log.write(d)
    rc, so, se = run("trace", "merge", d)
    ok(rc == 0 and "events_r00001.jsonl: opened 3600 s before" in se and
       "events_r00000.jsonl, the newest log: one an earlier run left" in se,
       "a log much older than the others is warned about", so + se)
    # the stale log comes first (rank 0 of a 4-rank run; the 6-rank rerun's rank 0 has none):
    # the newest log (rank 3) is still the one named after the kept logs moved down
    d = os.path.join(root, "stalefirst")
    os.makedirs(d)
    for r in range(6):
        world = 4 if r == 0 else 6
        wall = {0: 1_700_000_000, 3: 1_700_009_001, 5: 1_700_000_100}.get(r, 1_700_009_000)
        log = RankLog(r, world, (world, 1, 1), "h", wall_ns=wall * 10**9)
        log.span("compute", "fwd", 0, 10 * MS, step=1)
        log.write(d)
    rc, so, se = run("trace", "merge", d)
    ok(rc == 0 and "merged 5 rank(s)" in so and
       "events_r00005.jsonl: opened 8901 s before " + os.path.join(d, "events_r00003.jsonl") in se,
       "the newest log is named right after a stale first one", so + se)
    # a rank whose log is empty (killed before its first flush), one with a cut header, one
    # without a log: the others are merged, and the missing ranks are named
    d = os.path.join(root, "holes")
    os.makedirs(d)
    for r in range(5):
        log = RankLog(r, 5, (5, 1, 1), "h")
        log.span("compute", "fwd", 0, 10 * MS, step=1)
        path = log.write(d)
        if r == 1:
            open(path, "w").close()
        elif r == 2:
            text = open(path).read()[:40]
            open(path, "w").write(text)
        elif r == 4:
            os.remove(path)
    rc, so, se = run("trace", "merge", d)
    ok(rc == 0 and "merged 2 rank(s)" in so and "events_r00001.jsonl: skipped: no header" in se and
       "events_r00002.jsonl: skipped: no header" in se and
       "no event log for 3 of the 5 ranks: 1, 2, 4" in se,
       "empty and cut logs are skipped, missing ranks named", so + se)
    for r in (0, 3):
        os.remove(os.path.join(d, f"events_r{r:05d}.jsonl"))
    rc, so, se = run("trace", "merge", d)
    ok(rc == 3 and "no event log has a header line" in se, "only empty logs: bad input", se)
    test_nul_logs(root)
    d = os.path.join(root, "onechar")  # one-character names were written as ""
    os.makedirs(d)
    log = RankLog(0, 1, (1, 1, 1), "h")
    log.span("q", "x", 0, 10)
    log.write(d)
    rc, so, se = run("trace", "merge", d, "-o", os.path.join(d, "m.json"))
    xs = [e for e in json.load(open(os.path.join(d, "m.json")))["traceEvents"]
          if e.get("ph") == "X"] if rc == 0 else []
    ok(len(xs) == 1 and xs[0]["name"] == "x" and xs[0]["cat"] == "q", "one-character names", xs)
    # bytes that are not UTF-8 in names and args, a host name cut inside a character: the
    # outputs stay UTF-8 (Perfetto and strict JSON readers refuse anything else), those bytes
    # become '?', and unicode that is valid passes as it is
    d = os.path.join(root, "badutf8")
    os.makedirs(d)
    log = RankLog(0, 1, (1, 1, 1), "\u00e9" * 200)  # 400 bytes: cut to fit 255
    log.span("compute", "fwd", 0, 10 * MS, step=1, note="N")
    log.span("compute", "bwd", 20 * MS, 30 * MS, step=1)
    log.span("compute", "x-\u2713", 40 * MS, 50 * MS)
    path = log.write(d)
    raw = open(path, "rb").read().replace(b'"note": "N"', b'"note": "a\xffb\xc3"')
    open(path, "wb").write(raw.replace(b'"x-', b'"x\xe2\x82-'))
    for r in range(2):  # both in one all-reduce that never completed: suspects, with hosts
        hang_dump(d, r, 2, (2, 1, 1), "h", [("dp", [0, 1], 1, 0, [("all_reduce", 1, -1, -1, 5.0)])])
    p = os.path.join(d, "hang_r00000.json")
    raw = open(p, "rb").read()
    open(p, "wb").write(raw.replace(b'"host": "h"', b'"host": "h\xfe"'))
    out = os.path.join(d, "m.json")
    rc, so, se = run("trace", "merge", d, "-o", out)
    try:
        tr = json.loads(open(out, "rb").read().decode("utf-8"))
        names = sorted(e["name"] for e in tr["traceEvents"] if e.get("ph") == "X")
        note = [e["args"]["note"] for e in tr["traceEvents"] if e.get("name") == "fwd"]
        host = [e["args"]["name"] for e in tr["traceEvents"] if e.get("name") == "process_name"]
    except (ValueError, OSError, KeyError) as e:
        names, note, host = str(e), [], []
    ok(rc == 0 and names == ["bwd", "fwd", "x??-\u2713"] and note == ["a?b?"] and len(host) == 1 and
       host[0].endswith("\u00e9" * 127 + "?"), "merge: invalid UTF-8 in, valid UTF-8 out", f"{names} {note}")
    for cmd in ("stragglers", "hang"):
        p = subprocess.run([BIN, "trace", cmd, d, "--json"], capture_output=True)
        try:
            j = json.loads(p.stdout.decode("utf-8"))
            good = p.returncode == 0 and (cmd != "hang" or j["suspects"][0]["host"] == "h?")
        except ValueError:
            good = False
        ok(good, f"{cmd} --json: valid UTF-8", p.stdout[-300:])
    d = os.path.join(root, "nofwd")
    os.makedirs(d)
    log = RankLog(0, 1, (1, 1, 1), "h")
    log.span("data", "prefetch", 0, 10)
    log.write(d)
    rc, so, se = run("trace", "stragglers", d)
    ok(rc == 3 and "no rank has fwd/bwd spans" in se, "stragglers without fwd/bwd: exit 3 (bad input)", se)
    d = os.path.join(root, "baddump")
    os.makedirs(d)
    open(os.path.join(d, "hang_r00000.json"), "w").write('{"type":"hang_dump", "rank": 0,')
    rc, so, se = run("trace", "hang", d)
    ok(rc == 3 and "hang_r00000.json" in se and "no readable hang dump" in se,
       "a truncated dump is named", se)
    # beside the others' dumps, a damaged one is skipped: its rank counts as one without a dump
    # (before, one empty file stopped the analysis)
    d = os.path.join(root, "baddump2")
    os.makedirs(d)
    dp = lambda ops, issued: ("dp", [0, 1, 2], issued, 0, ops)
    for r in (0, 2):
        hang_dump(d, r, 3, (3, 1, 1), "h", [dp([("all_reduce", 1, -1, -1, 5.0)], 1)])
    for bad in ("", '{"type":"hang_dump", "rank": 1,', "\x00\x01binary"):
        open(os.path.join(d, "hang_r00001.json"), "w").write(bad)
        rc, so, se = run("trace", "hang", d, "--json")
        j = json.loads(so) if rc == 0 else {}
        why = " ".join(str(s_.get("reasons", "")) for s_ in j.get("suspects", []))
        ok(rc == 0 and [s["rank"] for s in j.get("suspects", [])] == [1] and
           j.get("missing") == [1] and "hang_r00001.json" in se and "skipped: rank 1 counts" in se
           and "its dump is damaged" in why and "wrote no dump" not in why,
           f"a damaged dump ({bad[:12]!r}) beside good ones: skipped, its rank the suspect",
           f"rc={rc}\n{so}{se}")
    d = os.path.join(root, "v2")  # another version of the formats is refused, not misread
    os.makedirs(d)
    path = RankLog(0, 1, (1, 1, 1), "h").write(d)
    text = open(path).read().replace('"version": 1', '"version": 2', 1)
    open(path, "w").write(text)
    hang_dump(d, 0, 1, (1, 1, 1), "h", [], version=2)
    rc, so, se = run("trace", "merge", d)
    ok(rc == 3 and f"{path}:1: event log version 2; this build reads version 1" in se,
       "an event log of another version is refused", f"rc={rc}\n{se}")
    rc, so, se = run("trace", "hang", d)
    ok(rc == 3 and "hang_r00000.json: hang dump version 2; this build reads version 1" in se,
       "a hang dump of another version is refused", f"rc={rc}\n{se}")
    d = os.path.join(root, "hugeworld")  # one damaged dump took 13 GB, 150 s, 3 GB of text
    os.makedirs(d)
    hang_dump(d, 0, 1 << 24, (1 << 24, 1, 1), "h", [])
    rc, so, se = run("trace", "hang", d)
    ok(rc == 3 and "hang_r00000.json" in se and "<= 1048576" in se, "a world too big is refused",
       f"rc={rc}\n{se}")
    rc, so, se = run("trace", "stragglers", d, "--threshold", "2")
    ok(rc == 2 and "--threshold" in se, "bad option value: usage error", se)
    rc, so, se = run("trace", "frobnicate", d)
    ok(rc == 2 and "unknown trace command" in se, "unknown subcommand", se)
    rc, so, se = run("trace", "--help")
    ok(rc == 0 and "--threshold" in so and "merge DIR" in so and "hang DIR" in so,
       "--help from the option table", so)


def test_nul_logs(root):
    """A log of NUL bytes (the blocks a crash or power loss left unwritten) or of blank lines
    only has no header: it is skipped with a warning that names it, as an empty log is.  It
    was read as a rank with a zeroed header (world 0): "no event log for -1 of the 0 ranks",
    exit 0 with an empty timeline.  NUL bytes in a log's last line after the header are such
    a tail, ignored with a warning; NUL bytes in a line a newline ends fail naming
    file:line."""
    d = os.path.join(root, "nul")
    os.makedirs(d)
    path = os.path.join(d, "events_r00000.jsonl")
    open(path, "wb").write(b"\0" * 4096)
    for cmd in ("merge", "stragglers"):
        rc, so, se = run("trace", cmd, d)
        ok(rc == 3 and path + ": skipped: no header line (NUL bytes: a damaged event log" in se and
           "no event log has a header line" in se and "-1 of the 0" not in se and
           "world 0" not in se, f"{cmd}: a log of NUL bytes alone: skipped, bad input",
           f"rc={rc}\n{so}{se}")
    # rank 0 wrote no dump: its host is looked for in its log
    hang_dump(d, 1, 2, (2, 1, 1), "h", [("dp", [0, 1], 1, 0, [("all_reduce", 1, -1, -1, 5.0)])])
    rc, so, se = run("trace", "hang", d, "--json")
    j = json.loads(so) if rc == 0 else {}
    ok(rc == 0 and [s["rank"] for s in j.get("suspects", [])] == [0] and
       path + ": no header line (NUL bytes: a damaged event log)" in se,
       "hang: a NUL log beside the dumps is named, the analysis goes on", so + se)
    os.remove(os.path.join(d, "hang_r00001.json"))
    open(path, "w").write("\n \n\t\r\n")  # blank lines only
    rc, so, se = run("trace", "merge", d)
    ok(rc == 3 and path + ": skipped: no header line (the rank ended" in se and
       "-1 of the 0" not in se, "a log of blank lines only is an empty log", se)
    good = RankLog(1, 2, (2, 1, 1), "h")
    good.span("compute", "fwd", 0, 10 * MS, step=1)
    good.span("compute", "bwd", 20 * MS, 30 * MS, step=1)
    p1 = good.write(d)
    open(path, "wb").write(b"\0" * 4096)
    for cmd in ("merge", "stragglers"):
        rc, so, se = run("trace", cmd, d)
        ok(rc == 0 and path + ": skipped: no header line (NUL bytes" in se and
           "no event log for 1 of the 2 ranks: 0" in se,
           f"{cmd}: the NUL log skipped and its rank named, the others read", so + se)
    os.remove(path)
    text = open(p1, "rb").read()
    open(p1, "wb").write(text + b'{"type":"span","na' + b"\0" * 3000)  # a zeroed tail
    rc, so, se = run("trace", "merge", d, "-o", os.path.join(d, "m.json"))
    xs = [e for e in json.load(open(os.path.join(d, "m.json")))["traceEvents"]
          if e.get("ph") == "X"] if rc == 0 else []
    tail = text.count(b"\n") + 1
    ok(rc == 0 and f"{p1}:{tail}: last line ignored: NUL bytes" in se and len(xs) == 2,
       "a tail of NUL bytes is ignored with a warning, the lines before read", so + se)
    lines = text.split(b"\n")
    lines[2] = b"\0" * 10 + lines[2]
    open(p1, "wb").write(b"\n".join(lines))
    for cmd in ("merge", "stragglers"):
        rc, so, se = run("trace", cmd, d)
        ok(rc == 3 and f"{p1}:3: a NUL byte: a damaged event log" in se,
           f"{cmd}: NUL bytes in a middle line fail naming file:line", f"rc={rc}\n{se}")
    # a blank first line, then no header: it was read as a rank with a zeroed header too
    open(p1, "wb").write(b"\n" + b"\n".join(lines[1:]))
    rc, so, se = run("trace", "merge", d)
    ok(rc == 3 and f"{p1}:2: the header must be (only) the first line" in se,
       "a log whose first line after blank ones is not a header fails", f"rc={rc}\n{se}")
    # a line of 40 MiB without a newline (a foreign or damaged file): refused naming file:line,
    # without holding it in memory (getline read all of it, a multi-GB line all of memory)
    with open(p1, "wb") as f:
        f.write(text)
        f.write(b"x" * (40 << 20))
    rc, so, se = run("trace", "merge", d)
    ok(rc == 3 and f"{p1}:{tail}: a line longer than 16 MiB" in se,
       "a 40 MiB line is refused naming file:line", f"rc={rc}\n{se[-500:]}")
    os.remove(p1)


def run_bytes(args, timeout=60):
    """`megascale ARGS` (bytes allowed) with a time limit: (rc or "timeout", stdout bytes,
    stderr text)."""
    try:
        p = subprocess.run([BIN, *args], capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", b"", ""
    return p.returncode, p.stdout, p.stderr.decode("utf-8", "replace")


def test_bad_bytes_dir(root):
    """A run directory whose name is not UTF-8: the heat map (cairo takes only UTF-8: the
    whole PNG failed) and --json of stragglers and hang (its "dir" was copied raw: invalid
    JSON for strict readers) write '?' for the bad byte.  Names of a hang dump cut to fit
    their buffers end in '?', never inside a character."""
    d = os.path.join(os.fsencode(root), b"d\xe9x")
    os.makedirs(d)
    straggler_logs(os.fsdecode(d))
    long_name = "g" * 62 + "\u00e9"  # bytes 63-64 of a 64-byte name: cut inside
    for r in range(2):
        hang_dump(os.fsdecode(d), r, 2, (2, 1, 1), "h",
                  [(long_name, [0, 1], 1, 0, [("all_reduce" + "\u00e9" * 11, 1, -1, -1, 5.0)])])
    png = os.path.join(root, "heat.png")
    rc, so, se = run_bytes(["trace", "stragglers", d, "--png", png])
    ok(rc == 0 and os.path.exists(png), "stragglers --png: a directory name that is not UTF-8",
       se)
    for cmd in ("stragglers", "hang"):
        rc, so, se = run_bytes(["trace", cmd, d, "--json"])
        try:
            j = json.loads(so.decode("utf-8"))
        except ValueError as e:
            j = {"error": str(e)}
        ok(rc == 0 and j.get("dir") == os.fsdecode(d).replace("\udce9", "?"),
           f"{cmd} --json: the directory's bad byte as '?', valid UTF-8", f"{so[-300:]}\n{se}")
        if cmd == "hang":
            w = {x["rank"]: x for x in j.get("waiting", [])}
            ok(w.get(0, {}).get("group") == "g" * 62 + "?" and
               w[0].get("op") == "all_reduce" + "\u00e9" * 10 + "?",
               "hang: names cut to fit end in '?'", w)


def test_output_guard(d):
    """An output never replaces an input, nor takes a name the tools would read as one: the
    rotated .1 of an event log (merge -o DIR/events_r00000.jsonl.1 overwrote rank 0's older
    half), and a new events_r00005.jsonl / hang_r00009.json / hang_driver.json in DIR (read
    by every later command as a rank's log or dump, or the supervisor's record)."""
    straggler_logs(d)
    rotate_logs(d)
    old = os.path.join(d, "events_r00000.jsonl.1")
    before = open(old, "rb").read()
    for cmd, opt, path in (("merge", "-o", old),
                           ("merge", "-o", os.path.join(d, "events_r00005.jsonl")),
                           ("merge", "-o", os.path.join(d, "sub", "..", "hang_r00009.json")),
                           ("merge", "-o", os.path.join(d, "hang_driver.json")),
                           ("stragglers", "--png", os.path.join(d, "events_r00007.jsonl.1")),
                           ("stragglers", "--png", os.path.join(d, "events_r00001.jsonl.1"))):
        os.makedirs(os.path.join(d, "sub"), exist_ok=True)
        rc, so, se = run("trace", cmd, d, opt, path)
        ok(rc == 2 and "an output never replaces an input; nothing was written" in se and
           not (os.path.exists(path) and path != old and not path.endswith("r00001.jsonl.1")),
           f"trace {cmd} {opt} {os.path.basename(path)}: refused", f"rc={rc}\n{se}")
    ok(open(old, "rb").read() == before, "the rotated log is untouched")
    # nor a checkpoint's file: merge -o over a commit's manifest replaced it with a trace,
    # --png over its shard with a picture (the commit lost)
    commit = os.path.join(d, "ck", "step_00000006")
    os.makedirs(commit, exist_ok=True)
    files = {n: f"{n} of the commit".encode() for n in
             ("manifest.json", "shard-00000-of-00001.safetensors")}
    for n, b in files.items():
        open(os.path.join(commit, n), "wb").write(b)
    open(os.path.join(d, "ck", "latest"), "w").write("step_00000006\n")
    for cmd, opt, name in (("merge", "-o", "manifest.json"),
                           ("stragglers", "--png", "shard-00000-of-00001.safetensors"),
                           ("merge", "-o", "new.json"), ("merge", "-o", "../latest")):
        path = os.path.join(commit, name)
        rc, so, se = run("trace", cmd, d, opt, path)
        ok(rc == 2 and "an output never replaces a checkpoint's file; nothing was written" in se
           and all(open(os.path.join(commit, n), "rb").read() == b for n, b in files.items())
           and not os.path.exists(os.path.join(commit, "new.json")),
           f"trace {cmd} {opt} into a commit ({name}): refused", f"rc={rc}\n{se}")
    # (a rank's .new stands in for its missing log: refused too)
    rc, so, se = run("trace", "merge", d, "-o", os.path.join(d, "events_r00005.jsonl.new"))
    ok(rc == 2 and "is named as a file of the run" in se, "a rank's .new: refused as an output",
       se)
    rc, so, se = run("trace", "merge", d, "-o", os.path.join(d, "events_r00005.jsonl.old"))
    ok(rc == 0, "a name the tools do not read is written", se)


def test_fifo(d):
    """A FIFO named like a log or a dump: the open blocked for ever; refused, named."""
    straggler_logs(d)
    os.remove(os.path.join(d, "events_r00001.jsonl"))
    os.mkfifo(os.path.join(d, "events_r00001.jsonl"))
    for cmd in ("merge", "stragglers", "hang"):
        if cmd == "hang":
            write_hang(d)
            os.remove(os.path.join(d, "hang_r00003.json"))
            os.mkfifo(os.path.join(d, "hang_r00003.json"))
        rc, so, se = run_bytes(["trace", cmd, d], timeout=30)
        name = "hang_r00003.json" if cmd == "hang" else "events_r00001.jsonl"
        # (a dump among others is skipped, its rank one without a dump: the others still speak)
        ok(rc == (0 if cmd == "hang" else 3) and f"{name}: not a regular file (a FIFO)" in se,
           f"trace {cmd}: a FIFO in a file's place is refused, named", f"rc={rc}\n{se}")


def main():
    with tempfile.TemporaryDirectory(prefix="ms_trace_") as root:
        for name, fn in (("merge", test_merge), ("merge_clock_step", test_merge_clock_step),
                         ("merge_no_clock", test_merge_no_clock),
                         ("merge_far_clock", test_merge_far_clock),
                         ("mixed_grid", test_mixed_grid),
                         ("merge_mark_after_span", test_merge_mark_after_span),
                         ("merge_rotated_p2p", test_merge_rotated_p2p),
                         ("stragglers", test_stragglers), ("rotated", test_rotated),
                         ("unscored", test_unscored),
                         ("json_flag", test_json_flag),
                         ("individual", test_individual),
                         ("individual_stage", test_individual_stage),
                         ("individual_noise", test_individual_noise), ("stages", test_stages),
                         ("resumed", test_resumed), ("strag_noise", test_strag_noise),
                         ("stragglers_memory", test_stragglers_memory),
                         ("stragglers_long", test_stragglers_long),
                         ("merge_memory", test_merge_memory),
                         ("merge_p2p_memory", test_merge_p2p_memory),
                         ("hang_missing", test_hang_missing),
                         ("hang_stand_in", test_hang_stand_in),
                         ("hang_rank_past_world", test_hang_rank_past_world), ("hang_placed", test_hang_placed),
                         ("hang_placed_table", test_hang_placed_table),
                         ("hang_rerun", test_hang_rerun),
                         ("hang_smaller_rerun", test_hang_smaller_rerun),
                         ("hang_behind", test_hang_behind), ("hang_blocked", test_hang_blocked),
                         ("hang_young_op", test_hang_young_op),
                         ("hang_healthy", test_hang_healthy),
                         ("other_run_same_world", test_other_run_same_world),
                         ("stand_in_logs", test_stand_in_logs),
                         ("hang_stale", test_hang_stale),
                         ("hang_nogrid", test_hang_nogrid),
                         ("hang_stuck_group", test_hang_stuck_group),
                         ("hang_exited", test_hang_exited),
                         ("hang_bad_world", test_hang_bad_world),
                         ("hang_driver", test_hang_driver),
                         ("hang_huge", test_hang_huge),
                         ("output_guard", test_output_guard), ("fifo", test_fifo)):
            d = os.path.join(root, name)
            os.makedirs(d)
            fn(d)
        test_bad_input(root)
        test_bad_bytes_dir(root)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
