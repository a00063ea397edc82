"""Tests of `megascale diag`, the node self-test: every check passes on this
machine; --json is one valid object with every check; each injected fault
(diag:gemm, diag:memory, diag:comm, diag:storage) fails exactly its check
with exit code 9 (diag:slow, a GEMM at a tenth of its speed, fails none
without a history); a history of much faster GEMMs fails the gemm check as
slow ("slow": failed on its speed alone, which wrong results are not), but
only a history of 3 runs or more (one or two earlier runs are reported, not
judged), and passing results are appended to the history; --node-map names the
report's node and --history-dir keeps one history per node; a storage
directory that cannot be written fails storage naming the path; bad options
exit 2.  The memory check reports STREAM's triad and an in-place update
beside its copy.  With --mpi: the comm check on 2 ranks under mpirun (loopback +
all-reduce), a fault injected on one rank fails that rank only, and one
injected on a node (--node-map) fails that node's rank only, each node with
its own history file.
Small sizes keep it short.  Needs only the Python standard library.
Environment: MS_BIN (the binary)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

BIN = os.environ.get("MS_BIN") or sys.argv[1]
CHECKS = ["gemm", "memory", "comm", "storage"]
SMALL = ["--gemm-n", "48", "--gemm-speed-n", "192", "--mem-mb", "8", "--storage-mb", "4",
         "--threads", "2"]
passed = failed = 0


def ok(cond, what, detail=""):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print(f"FAIL: {what}\n{detail[-3000:]}")


def run(*args, mpi=0):
    pre = []
    if mpi:
        pre = [shutil.which("mpirun"), "--allow-run-as-root", "--oversubscribe", "-np", str(mpi)]
    p = subprocess.run([*pre, BIN, "diag", *SMALL, *args], capture_output=True, text=True,
                       errors="replace", timeout=120)
    return p.returncode, p.stdout, p.stderr


def run_json(*args, mpi=0):
    """(rc, [report per rank], raw output); a report that is not JSON is None."""
    rc, out, err = run("--json", *args, mpi=mpi)
    reports = []
    for line in out.splitlines():
        try:
            reports.append(json.loads(line))
        except ValueError:
            reports.append(None)
    return rc, reports, out + err


def verdicts(rep):
    return {c["name"]: c["ok"] for c in rep["checks"]} if rep else {}


def test_pass(d):
    sd = os.path.join(d, "store")
    os.mkdir(sd)
    rc, out, err = run("--storage-dir", sd)
    lines = out.splitlines()
    ok(rc == 0 and lines and lines[-1] == "diag: PASS", "all checks pass (text)", out + err)
    for name in CHECKS:
        row = [l for l in lines if l.startswith(name + " ")]
        ok(row and row[0].split()[-1] == "PASS", f"table row {name}: PASS", out)
    ok("CRC32C match" in out and "read" in out, "storage reports both rates", out)
    ok(os.listdir(sd) == [], "the storage test file is removed", str(os.listdir(sd)))
    rc, reps, raw = run_json("--storage-dir", sd)
    ok(rc == 0 and len(reps) == 1 and reps[0] is not None, "--json prints one JSON object", raw)
    r = reps[0] if reps and reps[0] else {}
    ok(r.get("ok") is True and isinstance(r.get("host"), str) and r.get("rank") == 0,
       "JSON: host, rank, ok", raw)
    ok([c["name"] for c in r.get("checks", [])] == CHECKS, "JSON: every check, in order", raw)
    for c in r.get("checks", []):
        ok(c["ok"] is True and not c["skipped"] and isinstance(c["value"], (int, float))
           and c["value"] > 0 and isinstance(c["unit"], str) and isinstance(c["detail"], str),
           f"JSON check {c['name']}: ok with a positive value", json.dumps(c))
    st = {c["name"]: c for c in r.get("checks", [])}.get("storage", {})
    ok(st.get("read_mbps", 0) > 0 and st.get("unit") == "MB/s", "JSON storage: read MB/s", raw)
    mem = {c["name"]: c for c in r.get("checks", [])}.get("memory", {})
    ok(mem.get("triad_gbps", 0) > 0 and mem.get("update_gbps", 0) > 0
       and "triad" in mem.get("detail", "") and "in-place update" in mem.get("detail", ""),
       "JSON memory: the triad's and the in-place update's GB/s beside the copy's", raw)
    rc, reps, raw = run_json()
    st = {c["name"]: c for c in reps[0]["checks"]}.get("storage", {}) if reps and reps[0] else {}
    ok(rc == 0 and st.get("skipped") is True and "--storage-dir" in st.get("detail", ""),
       "no --storage-dir: storage skipped with a reason, still a pass", raw)


def test_faults(d):
    sd = os.path.join(d, "store_f")
    os.mkdir(sd)
    for name in CHECKS:
        rc, reps, raw = run_json("--storage-dir", sd, "--inject-fault", f"diag:{name}")
        v = verdicts(reps[0] if reps else None)
        want = {n: n != name for n in CHECKS}
        ok(rc == 9 and v == want, f"diag:{name} fails exactly {name}, exit 9", f"rc={rc}\n{raw}")
        detail = {c["name"]: c["detail"] for c in reps[0]["checks"]}.get(name, "") if v else ""
        ok(f"injected fault diag:{name}" in detail, f"diag:{name}: the detail says so", raw)
    # a GEMM that writes NaN (in its first element, the next one off by a hair) fails: before,
    # the next element's finite error replaced the NaN as the maximum, and it passed
    rc, reps, raw = run_json("--storage-dir", sd, "--inject-fault", "diag:nan")
    v = verdicts(reps[0] if reps else None)
    g = {c["name"]: c for c in reps[0]["checks"]}.get("gemm", {}) if v else {}
    ok(rc == 9 and v == {n: n != "gemm" for n in CHECKS} and "WRONG RESULTS" in
       g.get("detail", "") and "[injected fault diag:nan]" in g.get("detail", "") and
       "max rel error nan" in g.get("detail", ""),
       "diag:nan: a GEMM that writes NaN fails the gemm check, its error NaN (before, the "
       "fault was an element off by one, and a later layout's error replaced a NaN)",
       f"rc={rc}\n{raw}")
    rc, out, err = run("--storage-dir", sd, "--inject-fault", "diag:gemm,diag:storage")
    ok(rc == 9 and out.splitlines()[-1:] == ["diag: FAIL (gemm, storage)"],
       "text: the last line names the failed checks", out + err)
    ok(os.listdir(sd) == [], "storage file removed after a failure", str(os.listdir(sd)))
    # a slow device (a tenth of its speed) fails nothing by itself: only a history or,
    # in the supervisor, the other nodes show it (tests/supervisor/test_nodes.py)
    rc, reps, raw = run_json("--inject-fault", "diag:slow")
    g = {c["name"]: c for c in reps[0]["checks"]}.get("gemm", {}) if reps and reps[0] else {}
    ok(rc == 0 and g.get("ok") is True and "[injected fault diag:slow]" in g.get("detail", ""),
       "diag:slow: the GEMM slowed, passing without a history, the detail says so", raw)
    # diag:blip is the same here (the supervisor leaves it out when it measures again)
    rc, reps, raw = run_json("--inject-fault", "diag:blip")
    g = {c["name"]: c for c in reps[0]["checks"]}.get("gemm", {}) if reps and reps[0] else {}
    ok(rc == 0 and g.get("ok") is True and "[injected fault diag:blip]" in g.get("detail", ""),
       "diag:blip: the GEMM slowed as by diag:slow, the detail names diag:blip", raw)
    rc, reps, raw = run_json("--min-mem-gbps", "1e9")
    ok(rc == 9 and verdicts(reps[0] if reps else None).get("memory") is False,
       "--min-mem-gbps above the bandwidth fails memory", raw)


def test_history(d):
    h = os.path.join(d, "hist.jsonl")
    fast = {"check": "gemm", "value": 1e7, "unit": "GFLOP/s", "device": "cpu", "size": 192,
            "local_rank": 0}
    with open(h, "w") as f:
        for _ in range(3):
            f.write(json.dumps(fast) + "\n")
    rc, reps, raw = run_json("--history", h)
    g = {c["name"]: c for c in reps[0]["checks"]}.get("gemm", {}) if reps and reps[0] else {}
    ok(rc == 9 and g.get("ok") is False and "SLOW" in g.get("detail", "") and h in g["detail"],
       "a history of 1e7 GFLOP/s makes gemm fail as slow, naming the file", raw)
    ok(abs(g.get("limit", 0) - 0.7 * 1e7) < 1, "the limit is 0.7 x the median", json.dumps(g))
    ok(g.get("slow") is True and all(c.get("slow") is False for c in reps[0]["checks"]
                                     if c["name"] != "gemm"),
       "the failed gemm says slow (its speed alone), the passing checks do not", raw)
    lines = open(h).read().splitlines()
    ok(len(lines) == 4 and json.loads(lines[-1])["check"] == "memory",
       "a failing gemm is not recorded; the passing memory result is", "\n".join(lines))
    rc, reps, raw = run_json("--history", h, "--slow-factor", "0")
    lines = open(h).read().splitlines()
    ok(rc == 0 and len(lines) == 6, "--slow-factor 0 passes; both results appended", raw)
    last = [json.loads(l) for l in lines[-2:]]
    ok(sorted(e["check"] for e in last) == ["gemm", "memory"] and
       all(e["value"] > 0 and e["size"] in (192, 8) and e["device"] in ("cpu", "host")
           for e in last), "history entries: check, value, device, size", "\n".join(lines))
    ok(not [n for n in os.listdir(d) if ".tmp" in n], "no temp files left", str(os.listdir(d)))
    # wrong results against that history: failed, but not as slow (no second chance)
    rc, reps, raw = run_json("--history", h, "--inject-fault", "diag:gemm")
    g = {c["name"]: c for c in reps[0]["checks"]}.get("gemm", {}) if reps and reps[0] else {}
    ok(rc == 9 and g.get("ok") is False and g.get("slow") is False
       and "WRONG RESULTS" in g.get("detail", "") and "SLOW" in g.get("detail", ""),
       "wrong results and slow: failed, not slow alone", raw)
    rc, reps, raw = run_json("--min-mem-gbps", "1e9")
    m = {c["name"]: c for c in reps[0]["checks"]}.get("memory", {}) if reps and reps[0] else {}
    ok(rc == 9 and m.get("ok") is False and m.get("slow") is True,
       "below --min-mem-gbps: memory failed on its speed alone", raw)
    # one or two earlier runs are no history to fail a node on (one of them may have been
    # a busy moment): a thousand times as fast is reported, not judged
    for runs in (1, 2):
        h1 = os.path.join(d, f"hist_{runs}run.jsonl")
        with open(h1, "w") as f:
            for _ in range(runs):
                f.write(json.dumps(fast) + "\n")
        rc, reps, raw = run_json("--history", h1)
        g = {c["name"]: c for c in reps[0]["checks"]}.get("gemm", {}) if reps and reps[0] else {}
        ok(rc == 0 and g.get("ok") is True and g.get("limit") is None
           and f"of {runs} run(s) in {h1}: not judged (fewer than 3)" in g.get("detail", ""),
           f"a history of {runs} run(s) 1000x as fast: reported, not judged", raw)
    h2 = os.path.join(d, "hist2.jsonl")
    for i in range(4):  # a lenient factor: tiny products on a loaded 2-core machine vary 30x
        rc, reps, raw = run_json("--history", h2, "--slow-factor", "0.001")
        ok(rc == 0, f"a fresh history: run {i + 1} passes", raw)
        g = {c["name"]: c for c in reps[0]["checks"]}.get("gemm", {}) if reps and reps[0] else {}
        if i == 1:
            ok("median" in g.get("detail", "") and "not judged" in g["detail"]
               and g.get("limit") is None, "the second run reports the first", json.dumps(g))
    ok("median" in g.get("detail", "") and "not judged" not in g["detail"]
       and g.get("limit") is not None, "the fourth run compares with the first three",
       json.dumps(g))
    # a file that is no history (a shard, a log) given by mistake: rewriting it
    # as one kept its last 2000 lines only; it is named and left as it is
    foreign = os.path.join(d, "not_history.bin")
    data = bytes(range(256)) * 64 + b"\nplain text, no JSON\n"
    open(foreign, "wb").write(data)
    rc, out, err = run("--history", foreign, "--slow-factor", "0.001")
    ok(rc == 2 and f"--history {foreign} holds a NUL byte: not a diag history" in err
       and open(foreign, "rb").read() == data, "--history FILE that is no history: refused, kept",
       f"rc={rc}\n{err}")
    # JSON lines that are not diag entries (a corpus, a run's metrics): any
    # JSON object passed, and the append cut the file to its last 2000 lines
    for name, lines in (("corpus.jsonl", [{"text": f"doc {i}"} for i in range(3000)]),
                        ("metrics.jsonl", [{"step": i, "loss": 2.5} for i in range(1, 2500)]),
                        ("mixed.jsonl", [{"check": "gemm", "device": "cpu", "value": 100.0},
                                         {"step": 1}])):
        other = os.path.join(d, name)
        text = "".join(json.dumps(x) + "\n" for x in lines)
        open(other, "w").write(text)
        rc, out, err = run("--history", other, "--slow-factor", "0.001")
        ok(rc == 2 and f"--history {other} holds JSON objects that are not diag entries" in err
           and open(other).read() == text, f"--history {name}: refused, kept", f"rc={rc}\n{err}")
    # damaged entries: a value beyond any device (1e308 GFLOP/s: every later run was SLOW,
    # and a failed run is not appended, so the node failed for good) or not a number ("fast":
    # the whole file was refused without a line named): skipped, each named once
    dam = os.path.join(d, "damaged.jsonl")
    ent = {"check": "gemm", "unit": "GFLOP/s", "device": "cpu", "size": 192, "local_rank": 0}
    with open(dam, "w") as f:
        for v in (1e308, 1e308, 1e308, 1e308, "fast"):
            f.write(json.dumps(dict(ent, value=v)) + "\n")
    rc, out, err = run("--history", dam)
    ok(rc == 0 and f"{dam}:1: a gemm entry whose value is beyond any device; line skipped" in err
       and f"{dam}:5: a gemm entry whose value is not a number; line skipped" in err
       and err.count(f"{dam}:1:") == 1 and "SLOW" not in out + err,
       "a history's damaged entries: skipped, each line named once; the node passes",
       f"rc={rc}\n{out}\n{err}")
    empty = os.path.join(d, "no_entries.jsonl")
    open(empty, "w").write("not json\n")
    rc, out, err = run("--history", empty, "--slow-factor", "0.001")
    ok(rc == 2 and "holds no diag entry" in err, "--history with no diag entry: refused", err)
    hd = os.path.join(d, "hist_foreign")
    os.makedirs(hd)
    open(os.path.join(hd, "node0.jsonl"), "wb").write(data)
    rc, out, err = run("--node-map", "node0", "--history-dir", hd, "--slow-factor", "0.001")
    ok(rc == 0 and "not a diag history" in err and "not added to the history" in err
       and open(os.path.join(hd, "node0.jsonl"), "rb").read() == data,
       "--history-dir: a NODE.jsonl that is no history is not rewritten (a warning)", err)


def test_nodes(d):
    hd = os.path.join(d, "hist_nodes", "sub")  # created if missing; a lenient factor: see above
    rc, reps, raw = run_json("--node-map", "node0", "--history-dir", hd)
    r = reps[0] if reps and reps[0] else {}
    ok(rc == 0 and r.get("node") == "node0", "JSON: the node --node-map names", raw)
    f = os.path.join(hd, "node0.jsonl")
    lines = open(f).read().splitlines() if os.path.exists(f) else []
    ok(sorted(json.loads(l)["check"] for l in lines) == ["gemm", "memory"],
       "--history-dir: the passing results go to DIR/NODE.jsonl", str(os.listdir(d)))
    g = {c["name"]: c for c in r.get("checks", [])}.get("gemm", {})
    ok("no comparable history yet in " + f in g.get("detail", ""),
       "the gemm check reads the node's file", json.dumps(g))
    rc, out, err = run("--node-map", "node0", "--history-dir", hd, "--slow-factor", "0.001")
    ok(rc == 0 and "node node0" in out.splitlines()[0] and len(open(f).read().splitlines()) == 4,
       "text: the first line names the node; the second run appends to its file", out + err)
    rc, reps, raw = run_json()
    r = reps[0] if reps and reps[0] else {}
    ok(rc == 0 and isinstance(r.get("node"), str) and r.get("node"),
       "without --node-map the node is the host name", raw)
    rc, reps, raw = run_json("--inject-fault", "diag:memory:node=other", "--node-map", "node0")
    ok(rc == 0 and verdicts(reps[0] if reps else None).get("memory") is True,
       "diag:memory:node=other does not fire on node0", raw)
    rc, reps, raw = run_json("--inject-fault", "diag:memory:node=node0", "--node-map", "node0")
    ok(rc == 9 and verdicts(reps[0] if reps else None).get("memory") is False,
       "diag:memory:node=node0 fires on node0", raw)


def test_storage_errors(d):
    f = os.path.join(d, "plainfile")
    open(f, "w").write("x")
    bad = os.path.join(f, "sub")
    rc, reps, raw = run_json("--storage-dir", bad)
    st = {c["name"]: c for c in reps[0]["checks"]}.get("storage", {}) if reps and reps[0] else {}
    ok(rc == 9 and st.get("ok") is False and bad in st.get("detail", "")
       and "Not a directory" in st.get("detail", ""),
       "an unwritable storage dir fails storage naming the path and errno", raw)
    missing = os.path.join(d, "no", "such", "dir")
    rc, out, err = run("--storage-dir", missing)
    ok(rc == 9 and missing in out and "diag: FAIL (storage)" in out,
       "a missing storage dir fails storage naming it", out + err)


def test_usage():
    for args, needle in [(["--no-such-option", "1"], "--no-such-option"),
                         (["--gemm-n", "0"], "--gemm-n"), (["--slow-factor", "2"], "--slow-factor"),
                         (["--mem-mb", "x"], "--mem-mb"), (["--comm-timeout", "0"], "--comm-timeout"),
                         (["--comm-timeout", "1e300"], "--comm-timeout must be in (0,1e6]"),
                         (["--fail-exit", "5"], "--fail-exit must be in [0,1]"),
                         (["--inject-fault", "diag:bogus"], "diag:bogus"),
                         (["--inject-fault", "exit"], "not a fault of the self-test"),
                         (["--node-map", "a,,b"], "--node-map: node name 2 is empty"),
                         (["--node-map", "a b"], "--node-map: node name 1 'a b'"),
                         (["--history", "h.jsonl", "--history-dir", "hd"], "--history-dir hd"),
                         # (both passed without a word: the check skipped, the fault untried)
                         (["--storage-dir", ""], "--storage-dir is empty"),
                         (["--inject-fault", "diag:gemm:1"],
                          "rank 1 is not one of this run's 1 process(es)"),
                         (["--device", "nosuch"], "nosuch"), (["extra"], "extra")]:
        rc, out, err = run(*args)
        ok(rc == 2 and needle in err, f"bad option {args}: exit 2 naming it", f"rc={rc}\n{err}")
    p = subprocess.run([BIN, "diag", "--help"], capture_output=True, text=True)
    ok(p.returncode == 0 and "--storage-dir" in p.stdout and "9" in p.stdout, "--help", p.stdout)


def test_mpi(d):
    rc, reps, raw = run_json("--threads", "1", mpi=2)
    ok(rc == 0 and len(reps) == 2 and all(reps), "2 ranks: one JSON report each", raw)
    ranks = sorted(r["rank"] for r in reps if r)
    ok(ranks == [0, 1] and all(r["world"] == 2 and r["ok"] for r in reps if r),
       "2 ranks: both pass", raw)
    for r in reps:
        c = {x["name"]: x for x in r["checks"]}.get("comm", {}) if r else {}
        ok(c.get("ok") is True and "over 2 rank(s)" in c.get("detail", "")
           and "previous rank" in c.get("detail", ""), f"rank {r and r['rank']}: comm over 2",
           json.dumps(c))
    rc, reps, raw = run_json("--threads", "1", "--inject-fault", "diag:comm@1:1", mpi=2)
    by = {r["rank"]: r for r in reps if r}
    ok(rc == 9 and sorted(by) == [0, 1], "a fault on rank 1: both report, mpirun exits 9",
       f"rc={rc}\n{raw}")
    ok(by.get(0, {}).get("ok") is True and verdicts(by.get(1)) ==
       {"gemm": True, "memory": True, "comm": False, "storage": True},
       "only rank 1's comm check fails", raw)
    hd = os.path.join(d, "hist_mpi")
    rc, reps, raw = run_json("--threads", "1", "--node-map", "node0,node1", "--history-dir", hd,
                             "--inject-fault", "diag:gemm:node=node1", mpi=2)
    by = {r["rank"]: r for r in reps if r}
    ok(rc == 9 and by.get(0, {}).get("node") == "node0" and by.get(1, {}).get("node") == "node1",
       "2 ranks, --node-map node0,node1: each report names its node", f"rc={rc}\n{raw}")
    ok(by.get(0, {}).get("ok") is True and verdicts(by.get(1)) ==
       {"gemm": False, "memory": True, "comm": True, "storage": True},
       "diag:gemm:node=node1 fails rank 1's gemm only", raw)
    files = sorted(os.listdir(hd)) if os.path.isdir(hd) else []
    hist = {n: [json.loads(l)["check"] for l in open(os.path.join(hd, n))]
            for n in files if n.endswith(".jsonl")}
    ok(sorted(hist) == ["node0.jsonl", "node1.jsonl"] and sorted(hist["node0.jsonl"]) ==
       ["gemm", "memory"] and hist["node1.jsonl"] == ["memory"],
       "one history per node; node1's failing gemm is not recorded", str(hist))


def main():
    d = tempfile.mkdtemp(prefix="ms_diag_")
    if "--mpi" in sys.argv:
        if not shutil.which("mpirun"):
            print("SKIP: mpirun not found (apt-get install openmpi-bin)")
            sys.exit(77)
        test_mpi(d)
    else:
        test_pass(d)
        test_faults(d)
        test_history(d)
        test_nodes(d)
        test_storage_errors(d)
        test_usage()
    print(f"{passed} passed, {failed} failed")
    if not failed:
        shutil.rmtree(d)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
