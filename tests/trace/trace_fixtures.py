"""Writers of synthetic run files for the trace tools' tests: per-rank event
logs (events_rNNNNN.jsonl) with clock lines that map a rank's local
monotonic clock to global time, and hang dumps (hang_rNNNNN.json).  Events
are given in GLOBAL nanoseconds; the writer converts them to the rank's
local clock so the tools must undo it.  Also the Chrome-trace checks the
merge test makes (nesting per thread), and the pass/fail tally."""
import json
import os
import subprocess
import sys

BIN = os.environ.get("MS_BIN") or (sys.argv[1] if len(sys.argv) > 1 else "build/megascale")
MS = 1_000_000  # ns per ms

passed = failed = 0


def ok(cond, what, detail=""):
    """Count a check; on failure print what was expected and what came."""
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print(f"FAIL: {what}\n{str(detail)[-3000:]}", flush=True)
    return cond


def summary():
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


def run(*args):
    p = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, errors="replace")
    return p.returncode, p.stdout, p.stderr


def coord_of(rank, shape):
    """rank = tp + TP * (dp + DP * pp)."""
    dp, pp, tp = shape
    return {"dp": rank // tp % dp, "pp": rank // (tp * dp), "tp": rank % tp}


class RankLog:
    """One rank's event log.  clocks: [(global_ns_from, offset_ns, err_ns)]:
    from that global time on, local = global - offset."""

    def __init__(self, rank, world, shape, host, clocks=((0, 0, 0),), wall_ns=1_700_000_000 * 10**9):
        self.rank, self.world, self.shape, self.host = rank, world, shape, host
        self.coord = None  # the header's coord: None: the position formula's
        self.wall_ns = wall_ns  # the header's: when the run opened the log
        self.run = None  # the header's "run" (16 hex digits), None: not said
        self.clocks = list(clocks)
        self.lines = []

    def offset(self, g):
        off = self.clocks[0][1]
        for start, o, _ in self.clocks:
            if g >= start:
                off = o
        return off

    def local(self, g):
        return g - self.offset(g)

    def span(self, lane, name, g0, g1, **args):
        o = self.offset(g0)  # one offset per span: durations are local
        self.lines.append(dict(type="span", name=name, lane=lane, t0=g0 - o, t1=g1 - o, **args))

    def mark(self, lane, name, g, **args):
        self.lines.append(dict(type="mark", name=name, lane=lane, t=self.local(g), **args))

    def raw(self, text):
        self.lines.append(text)

    def write(self, d, truncate_last=0):
        dp, pp, tp = self.shape
        header = dict(type="header", version=1, rank=self.rank, world=self.world, host=self.host,
                      pid=1000 + self.rank, coord=self.coord or coord_of(self.rank, self.shape),
                      shape=dict(dp=dp, pp=pp, tp=tp), mono_ns=1000, wall_ns=self.wall_ns)
        if self.run:
            header["run"] = self.run
        out = [json.dumps(header)]
        for start, o, e in self.clocks:
            out.append(json.dumps(dict(type="clock", mono_ns=start - o, offset_ns=o, err_ns=e)))
        # spans in order of local start, as a recorder flushes them
        spans = sorted((l for l in self.lines if isinstance(l, dict)),
                       key=lambda l: l.get("t0", l.get("t", 0)))
        out += [json.dumps(l) for l in spans]
        out += [l for l in self.lines if isinstance(l, str)]
        text = "\n".join(out) + "\n"
        if truncate_last:
            text = text[:-truncate_last]
        path = os.path.join(d, f"events_r{self.rank:05d}.jsonl")
        with open(path, "w") as f:
            f.write(text)
        return path


def hang_dump(d, rank, world, shape, host, groups, reason="timeout", grid=True, **extra):
    """groups: [(name, ranks, issued, completed, [in-flight ops])]; an op is
    (op, seq, peer, tag, age_s[, state]) (state "posted" unless given).  extra: more top-level keys (wall_s,
    unresponsive, exited)."""
    dp, pp, tp = shape
    obj = dict(type="hang_dump", version=1, rank=rank, world=world, host=host, pid=99,
               reason=reason, wall_s=1.7e9, groups=[])
    if grid:
        obj["coord"] = coord_of(rank, shape)
        obj["shape"] = dict(dp=dp, pp=pp, tp=tp)
    for name, ranks, issued, completed, ops in groups:
        last = (dict(op="all_reduce", seq=completed, bytes=4096, age_s=7.2)
                if completed > 0 else None)
        obj["groups"].append(dict(
            name=name, ranks=ranks, issued_seq=issued, completed_seq=completed,
            last_completed=last,
            in_flight=[dict(op=o, seq=s, peer=p, tag=t, bytes=4096, age_s=a,
                            state=(st[0] if st else "posted"))
                       for o, s, p, t, a, *st in ops]))
    obj.update(extra)
    with open(os.path.join(d, f"hang_r{rank:05d}.json"), "w") as f:
        json.dump(obj, f)


def nesting_errors(events, tol=1e-6):
    """Complete events that partially overlap another on their (pid, tid)."""
    by_thread = {}
    for e in events:
        if e.get("ph") == "X":
            by_thread.setdefault((e["pid"], e["tid"]), []).append(e)
    bad = []
    for key, evs in by_thread.items():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []
        for e in evs:
            end = e["ts"] + e["dur"]
            while stack and stack[-1] <= e["ts"] + tol:
                stack.pop()
            if stack and end > stack[-1] + tol:
                bad.append((key, e["name"], e["ts"], end, stack[-1]))
            stack.append(end)
    return bad
