"""The dashboard (src/supervisor/sup_dash*.c) on a real job: a 4-rank
(dp2 x tp2) job under `megascale launch --dashboard 0`; rank 2 is killed
(kill -9) mid-run, once the browser has seen the loss curve grow, and the
driver restarts the job from its checkpoint:

1. the API while the job runs: 401 and an empty body without the token or
   with a wrong one, 404 for unknown paths and for every path that tries to
   reach the file system, 400 for a malformed argument, 405 for POST; the
   status is live, the metrics grow between two looks and come in bounded
   pages;
2. the browser (tests/dashboard/browser.mjs: headless Chromium driven by
   playwright-core, started with the API checks of 1.): the loss curve gains points while the job trains, the
   fault appears in the event log and on the grid, training goes on, the
   screenshot is not blank; the page reads the job's end and stops asking
   before the server exits (no request of it fails), no script error.  Skipped, with the reason, where
   Chromium or playwright-core cannot be had;
3. after the job: `megascale dashboard RUN_DIR` serves the finished run from
   its files: state done, the fault on rank 2, every step of the metrics
   file, every event of the events file, the checkpoints, the heat map.

Environment: MS_BIN (the megascale binary), MS_SRC (the source tree)."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "mpi"))
from mpi_common import BIN, finish, ok, start  # noqa: E402

SRC = os.environ.get("MS_SRC", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
# Long enough that the browser (a few seconds to start on two busy cores)
# sees the job train before it ends: 220 steps were once enough, and ended
# first after the communication thread got faster.
STEPS = 500
TRAIN = ["--vocab", "256", "--layers", "4", "--dim", "128", "--heads", "4", "--seq-max", "32",
         "--seq", "32", "--batch", "16", "--steps", str(STEPS), "--dp", "2", "--tp", "2",
         "--threads", "1", "--lr", "1e-3", "--log-every", "50", "--peak-flops", "1e11",
         "--ckpt-every", "10", "--val-every", "50", "--data-order", "sequential",
         # 40 ms more a step on every rank (~50 ms a step without): the page must see the curve
         # grow, the fault and the curve grow again before step 500, and Chromium can take
         # 20 s and more to come up on busy cores (it came up at step 489 of 500)
         "--inject-fault", "slow=40@1+"]
LAUNCH = ["--np", "4", "--heartbeat-timeout", "10", "--backoff", "0.2", "--grace", "5",
          "--startup-timeout", "120", "--straggler-rounds", "0", "--dashboard", "0"]


def fetch(url, method="GET", headers=None):
    """(status, body bytes) of one request to this machine."""
    req = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def raw_get(addr, path):
    """A request whose path goes to the server byte for byte (no client
    normalisation of '..')."""
    import socket
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(f"GET {path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
    data = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        data += b
    s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    m = re.match(rb"HTTP/1\.\d (\d+)", head)
    return (int(m.group(1)) if m else -1), body


def api(base, token, path):
    code, body = fetch(f"{base}{path}{'&' if '?' in path else '?'}token={token}")
    return json.loads(body) if code == 200 else None


def all_metrics(base, token):
    """Every step point, page by page."""
    pts, since = [], 0
    for _ in range(1000):
        r = api(base, token, f"/api/metrics?since={since}")
        pts += r["steps"]
        if not r["more"]:
            return pts, r
        since = r["steps"][-1][0]
    return pts, r


def check_api(base, addr, token):
    code, body = fetch(f"{base}/api/status")
    ok(code == 401 and body == b"", "no token: 401 and an empty body", f"{code} {body[:80]!r}")
    code, body = fetch(f"{base}/api/status?token={'0' * 32}")
    ok(code == 401 and body == b"", "a wrong token: 401", f"{code}")
    code, body = fetch(f"{base}/?token={token[:-1]}")
    ok(code == 401, "a token cut short: 401", f"{code}")
    code, _ = fetch(f"{base}/api/status", headers={"Authorization": f"Bearer {token}"})
    ok(code == 200, "the token as a bearer header: 200", f"{code}")
    code, _ = fetch(f"{base}/nope?token={token}")
    ok(code == 404, "an unknown path: 404", f"{code}")
    leaks = []
    for p in ["/../../../../etc/passwd", "/static/../../../../etc/passwd", "//etc/passwd",
              "/etc/passwd", "/%2e%2e/%2e%2e/etc/passwd", "/static/%2e%2e/%2e%2e/etc/hostname",
              "/events.jsonl", "/api/../events.jsonl", "/api/status/../../driver.json",
              "/" + os.path.abspath(os.path.join(SRC, "README.md"))]:
        code, body = raw_get(addr, f"{p}?token={token}")
        if code != 404 or b"root:" in body or b"job_start" in body or b"MegaScale" in body:
            leaks.append(f"{p}: {code} {body[:60]!r}")
    ok(not leaks, "no path of a request reaches the file system (10 tries: 404 each)",
       "; ".join(leaks))
    code, _ = fetch(f"{base}/api/metrics?since=abc&token={token}")
    ok(code == 400, "a malformed since: 400", f"{code}")
    code, _ = fetch(f"{base}/api/status?token={token}", method="POST")
    ok(code == 405, "POST: 405", f"{code}")
    st, t_end = None, time.time() + 120
    while time.time() < t_end and not (st and st["layout"] and st["last"]):
        time.sleep(0.2)
        st = api(base, token, "/api/status")
    ok(st and st["live"] and len(st["ranks"]) == 4 and (st["layout"] or {}).get("tp") == 2,
       "the live status: 4 ranks, the layout", json.dumps(st)[:300])
    n0 = len(all_metrics(base, token)[0])
    time.sleep(3)
    pts, last = all_metrics(base, token)
    ok(len(pts) > n0, f"the metrics grow while the job trains ({n0} -> {len(pts)} steps)")
    page = api(base, token, "/api/metrics?since=0")
    ok(page is not None and len(page["steps"]) <= 5000 and page["columns"][0] == "step",
       "a metrics reply is bounded and has its columns")


def watch_to_end(base, token, seen):
    """A page left open: the status and the events every 0.5 s until the
    server is gone; seen["last"]: the last status read."""
    while True:
        try:
            code, body = fetch(f"{base}/api/status?token={token}")
            if code == 200:
                seen["last"] = json.loads(body)
            fetch(f"{base}/api/events?since=1000000&token={token}")
        except (OSError, ValueError):
            return
        time.sleep(0.5)


def rank_pid(run, rank):
    """The pid of `rank` in the newest launch (its rank_up event)."""
    pid = None
    for line in open(os.path.join(run, "events.jsonl")):
        e = json.loads(line)
        if e["event"] == "launch":
            pid = None
        elif e["event"] == "rank_up" and e["rank"] == rank:
            pid = e["pid"]
    return pid


def browser_start(url, d, args=None):
    """Start the browser test (its Popen), or (77, why) where it cannot run.
    Started before the API checks: Chromium takes long to start on busy
    cores, and the job must still train when the page is up.  args: browser.mjs's
    options past --url (default: the live job's checks)."""
    here = os.path.join(SRC, "tests", "dashboard")
    if not os.path.exists("/usr/bin/chromium"):
        return 77, "browser: SKIP: /usr/bin/chromium is missing (Debian package chromium)"
    if not os.path.exists(os.path.join(here, "browser.mjs")):
        return 77, f"browser: SKIP: {here}/browser.mjs is missing"
    if not shutil.which("node"):
        return 77, "browser: SKIP: node is not installed (Debian package nodejs)"
    if not os.path.exists(os.path.join(here, "node_modules", "playwright-core")):
        if not shutil.which("npm"):
            return 77, "browser: SKIP: playwright-core is missing and npm is not installed"
        r = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--loglevel=error"],
                           cwd=here, capture_output=True, text=True)
        if r.returncode:
            return 77, "browser: SKIP: npm install of playwright-core failed: " + r.stderr[-300:]
    if args is None:
        args = ["--shot", os.path.join(d, "dashboard.png"), "--fault-rank", "2", "--model",
                "d6 (4 layers, dim 128, 4 heads, vocab 256)", "--to-end", "--timeout", "240"]
    return subprocess.Popen(["node", os.path.join(here, "browser.mjs"), "--url", url, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def browser_finish(p, run):
    """Follow the browser test; once the page has seen the curve grow, kill
    -9 rank 2 (the fault it must then show).  (rc, output)."""
    if isinstance(p, tuple):
        return p
    out = []
    for line in p.stdout:
        out.append(line)
        if "without a reload" in line:  # the page is live: now the fault
            pid = rank_pid(run, 2)
            out.append(f"test: kill -9 rank 2 (pid {pid})\n")
            if pid:
                os.kill(pid, signal.SIGKILL)
    p.wait(300)
    return p.returncode, "".join(out)


def stop_server(p):
    """End a `megascale dashboard` this test started: SIGTERM, then SIGKILL after 10 s."""
    p.terminate()
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:
        p.kill()


def check_offline(run, d):
    r = subprocess.run([BIN, "dashboard", run, "--bind", "localhost"], capture_output=True,
                       text=True, timeout=30)
    ok(r.returncode == 2 and "--bind 'localhost'" in r.stderr,
       "megascale dashboard --bind localhost: a usage error naming the option (exit 2)",
       f"{r.returncode} {r.stderr}")
    p = subprocess.Popen([BIN, "dashboard", run, "--port", "0"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        m = re.search(r"(http://([0-9.]+:\d+))/\?token=([0-9a-f]{32})", line)
        ok(m is not None, "megascale dashboard prints its URL with a token", line)
        if not m:
            return
        base, token = m.group(1), m.group(3)
        st = api(base, token, "/api/status")
        ok(st and not st["live"] and st["job"]["state"] == "done" and st["job"]["restarts"] == 1,
           "afterwards: the run is done after 1 restart", json.dumps(st and st["job"]))
        r2 = st["ranks"][2] if st else {}
        ok(r2.get("faults") == 1 and "at step" in (r2.get("last_fault") or ""),
           "afterwards: rank 2 shows its fault", json.dumps(r2))
        pts, last = all_metrics(base, token)
        file_steps = sorted({json.loads(l)["step"] for l in open(os.path.join(run, "metrics.jsonl"))
                             if '"loss"' in l})
        ok([p[0] for p in pts] == file_steps and file_steps[-1] == STEPS,
           f"afterwards: every step of the metrics file ({len(pts)} of {len(file_steps)})")
        ok(len(last["val"]) >= 4, "afterwards: the validation points", json.dumps(last["val"]))
        first = api(base, token, "/api/metrics")  # no since: from the first
        ok(first and first["val"] and first["val"][0][0] == 0,
           "afterwards: the validation loss of step 0 too", json.dumps(first and first["val"][:2]))
        evs, since = [], -1
        while True:
            r = api(base, token, f"/api/events?since={since}")
            evs += r["events"]
            since = r["next"]
            if not r["more"]:
                break
        n_file = sum(1 for _ in open(os.path.join(run, "events.jsonl")))
        ok(len(evs) == n_file and [e["seq"] for e in evs] == list(range(n_file)),
           f"afterwards: every event ({len(evs)} of {n_file}), in order")
        ck = api(base, token, "/api/checkpoints")["checkpoints"]
        ok(len(ck) >= 10 and all(c["bytes"] and c["bytes"] > 0 for c in ck),
           f"afterwards: the checkpoints with their sizes ({len(ck)})", json.dumps(ck[:2]))
        hm = api(base, token, "/api/heatmap")
        ok(hm and len(hm["ranks"]) == 4 and len(hm["steps"]) == 200 and hm["steps"][-1] == STEPS,
           "afterwards: the heat map of the last 200 steps",
           json.dumps(hm and hm["steps"][-3:]))
    finally:
        stop_server(p)


def check_big(run, d):
    """The finished run copied with oversized files: an event whose detail is 512 KiB and 300
    more checkpoints.  The page shows the detail cut and the checkpoints past the newest 200 in
    one line, redraws the log on a click, with no error (30 such details froze it for half a
    minute; 4,096 checkpoints were redrawn on every poll)."""
    big = os.path.join(d, "big")
    shutil.copytree(run, big, ignore=shutil.ignore_patterns("ckpt", "trace", "*.lock"))
    with open(os.path.join(big, "events.jsonl"), "a") as f:
        f.write(json.dumps({"time": time.time(), "t": 1.0, "event": "anomaly", "kind": "test",
                            "detail": "x" * (1 << 19)}) + "\n")
    with open(os.path.join(big, "metrics.jsonl"), "a") as f:
        for i in range(300):
            f.write(json.dumps({"type": "ckpt", "step": 100000 + i, "bytes": 1000,
                                "stall_ms": 1, "persist_ms": 2, "wall": time.time()}) + "\n")
    p = subprocess.Popen([BIN, "dashboard", big, "--port", "0"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        m = re.search(r"(http://[0-9.]+:\d+/\?token=[0-9a-f]{32})", p.stdout.readline())
        ok(m is not None, "the oversized run's dashboard prints its URL")
        if not m:
            return
        page = browser_start(m.group(1), d, ["--shot", os.path.join(d, "big.png"), "--big",
                                             "--timeout", "120"])
        if isinstance(page, tuple):
            print(page[1])
            return
        out, _ = page.communicate(timeout=300)
        print(out.strip())
        ok(page.returncode == 0, "oversized files: the detail cut, the old checkpoints one line, "
           "the log redrawn on a click, no error", out[-2000:])
    finally:
        stop_server(p)


def check_config_metrics(d, shard):
    """The driver adds --metrics RUN_DIR/metrics.jsonl only when the train
    options name none, also not when their --config file does."""
    run = os.path.join(d, "cfg")
    os.makedirs(run)
    mine = os.path.join(d, "mine.jsonl")
    cfg = os.path.join(d, "train.conf")
    open(cfg, "w").write(f"# a config file\nsteps = 3\nmetrics = {mine}   # here\n")
    r = subprocess.run([BIN, "launch", "--np", "1", "--run-dir", run, "--", "--config", cfg,
                        "--train-data", shard, *TRAIN[:12], "--ckpt-dir",
                        os.path.join(run, "ckpt")], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    start_ev = next((json.loads(l) for l in open(os.path.join(run, "events.jsonl"))
                     if '"job_start"' in l), {})
    ok(r.returncode == 0 and start_ev.get("metrics") == mine and os.path.exists(mine) and
       not os.path.exists(os.path.join(run, "metrics.jsonl")),
       "the --config file's metrics is the job's (the driver adds none)",
       json.dumps(start_ev) + r.stderr[-1500:])


def main():
    d, shard = start("ms_dash_")
    check_config_metrics(d, shard)
    run = os.path.join(d, "run")
    cmd = [BIN, "launch", *LAUNCH, "--run-dir", run, "--",
           "--train-data", shard, "--val-data", shard, *TRAIN, "--ckpt-dir",
           os.path.join(run, "ckpt")]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           errors="replace", env=env)
    page = None
    try:
        info, t_end = None, time.time() + 60
        while time.time() < t_end and job.poll() is None and not info:
            try:
                info = json.load(open(os.path.join(run, "dashboard.json")))
            except (OSError, ValueError):
                time.sleep(0.1)
        ok(info is not None, "the driver wrote RUN_DIR/dashboard.json")
        if not info:
            return d
        mode = os.stat(os.path.join(run, "dashboard.json")).st_mode & 0o777
        ok(mode == 0o600, f"dashboard.json is private (mode {mode:o})")
        url, token = info["url"], info["token"]
        m = re.match(r"(http://(127\.0\.0\.1:\d+))/\?token=", url)
        ok(m is not None, "the dashboard is on loopback", url)
        base, addr = m.group(1), m.group(2)
        seen = {}
        watcher = threading.Thread(target=watch_to_end, args=(base, token, seen), daemon=True)
        watcher.start()
        page = browser_start(url, d)
        if job.poll() is None:
            check_api(base, addr, token)
        else:
            ok(False, "the job still runs for the API checks (it ended too early)")
        rc, out = browser_finish(page, run)
        print(out.strip())
        if rc == 77:  # no browser: the same fault, for the checks afterwards
            print("browser test: SKIP (reason above)")
            pid = rank_pid(run, 2)
            if pid:
                os.kill(pid, signal.SIGKILL)
        else:
            ok(rc == 0, "the browser sees the curve grow, the fault in the log and on the grid",
               out[-2000:])
        out, err = job.communicate(timeout=600)
        ok(job.returncode == 0, "the job finishes after the fault", err[-3000:])
        watcher.join(30)
        end = (seen.get("last") or {})
        ok(not watcher.is_alive() and end.get("live") is False
           and end.get("job", {}).get("state") == "done" and end.get("summary"),
           "a page left open reads the job's end (done, not live, the summary) before the "
           "server goes", json.dumps(end)[:400])
        ok("dashboard: http://127.0.0.1:" in err, "the driver printed the dashboard's URL")
    finally:
        if isinstance(page, subprocess.Popen) and page.poll() is None:
            page.kill()
            page.wait(30)
        if job.poll() is None:
            job.terminate()
            job.wait(30)
    check_offline(run, d)
    check_big(run, d)
    return d


if __name__ == "__main__":
    finish(main())
