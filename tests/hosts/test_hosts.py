"""Training across hosts for real: 4 hosts as network namespaces
(scripts/test-hosts, tests/hosts/testbed.py), Open MPI over TCP between them
(shared memory inside a host only), against one process and under link
faults:

1. dp2 x tp2 on 2 hosts x 2 slots: the loss curve and the final weights of
   one process (1e-5 relative), the layout line naming each rank's host,
   one batch reader per host;
2. the same with mpirun dealing ranks out round-robin (--map-by node): the
   grid is placed host by host (tp groups inside a host), same losses; and
   with host 2's link 1 ms slower each way and losing 5 % of its frames
   (test-hosts delay / loss): same losses;
3. pp2 x dp2 on 4 hosts x 1 slot: the losses of one process;
4. a checkpoint written by dp2 x tp2 across 2 hosts resumes on one host
   (4 slots) bit-exact: the final weights equal those of the run across
   hosts, byte for byte;
5. --ckpt-dir that one host does not share (its own empty directory at that
   path): refused at start-up, naming the ranks of that host;
6. a 2 s link flap of host 2 during training with --comm-timeout 10: the
   run finishes, its losses exactly those of the same run without the flap
   (TCP resent what the link lost), and the flap shows in the timers (one
   step's communication wait >= 1.5 s);
7. a 30 s outage of host 2's link with --comm-timeout 10: the ranks on host
   1 fail with an error naming the op and host 2, within the timeout (plus
   5 s of slack) of the link going down.  The link comes back once that
   error is seen (the rest of the 30 s would only make mpirun wait longer
   for host 2's output).

Skipped (exit 77) with the reason when not root, without mpirun, iproute2
or working network namespaces.  Environment: MS_BIN."""
import json
import os
import re
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "mpi"))
import testbed  # noqa: E402
from mpi_common import BIN, compare_weights, finish, losses, ok, start  # noqa: E402

C = 64


def base(shard, steps=10):
    return ["train", "--train-data", shard, "--vocab", "256", "--layers", "4", "--dim", str(C),
            "--heads", "4", "--seq-max", "32", "--seq", "32", "--batch", "8", "--steps",
            str(steps), "--lr", "3e-3", "--log-every", "100", "--peak-flops", "1e11",
            "--threads", "1", "--eps", "1e-6"]


def one_process(d, name, args):
    """One process in the root namespace: (metrics path, weights path)."""
    m, w = os.path.join(d, f"{name}1.jsonl"), os.path.join(d, f"{name}1.st")
    r = subprocess.run([BIN, *args, "--metrics", m, "--save-weights", w], capture_output=True,
                       text=True, errors="replace", env=dict(os.environ, OMP_NUM_THREADS="1"))
    ok(r.returncode == 0, f"{name}: the single process runs", r.stderr)
    return m, w


def curve_err(a, b):
    return max(abs(x - y) / abs(x) for x, y in zip(a, b)) if a and len(a) == len(b) else 1.0


def against_one(bed, d, label, n, hf, args, layout, mpirun_args=(), one=None):
    """args + layout under mpirun on hostfile hf against args in one process
    (or `one`, its files): the losses and the final weights within 1e-5
    relative.  Returns the CompletedProcess."""
    m1, w1 = one or one_process(d, label.split()[0], args)
    m2, w2 = os.path.join(d, "many.jsonl"), os.path.join(d, "many.st")
    for f in (m2, w2):
        if os.path.exists(f):
            os.remove(f)
    t0 = time.time()
    r = bed.mpirun(n, hf, [*args, *layout, "--metrics", m2, "--save-weights", w2], mpirun_args)
    el = time.time() - t0
    if r.returncode:
        ok(False, f"{label}: the run across hosts succeeds", r.stdout + r.stderr)
        return r
    a, b = losses(m1), losses(m2)
    err = curve_err(a, b)
    ok(err <= 1e-5, f"{label}: loss curve = one process (rel {err:.2e})", f"{a}\n{b}")
    werr, where = compare_weights(w1, w2, C)
    ok(werr <= 1e-5, f"{label}: final weights = one process (worst {werr:.2e} {where})")
    print(f"{label}: loss rel {err:.2e}, weights rel {werr:.2e}, {el:.1f} s over TCP")
    return r


def hosts_line(stderr):
    line = [l for l in stderr.splitlines() if "] hosts:" in l]
    return line[0] if line else ""


def placement(bed, d, shard):
    hf = bed.hostfile([(1, 2), (2, 2)])
    args, lay = base(shard), ["--tp", "2", "--dp", "2"]
    one = one_process(d, "dp2tp2", args)
    h1, h2 = bed.name(1), bed.name(2)
    r = against_one(bed, d, "dp2 x tp2 on 2 hosts x 2 slots", 4, hf, args, lay, one=one)
    want = (f"r0 {h1} (tp0 dp0 pp0), r1 {h1} (tp1 dp0 pp0), r2 {h2} (tp0 dp1 pp0), "
            f"r3 {h2} (tp1 dp1 pp0)")
    ok(want in hosts_line(r.stderr) and "on 2 host(s)" in hosts_line(r.stderr),
       "the layout line names each rank's host", hosts_line(r.stderr) or r.stderr)
    ok(f"other 1 tp rank(s) of host {h1} get its batches through shared memory" in r.stderr,
       "one batch reader per host", r.stderr)
    # round-robin numbering: rank 1 is on host 2, the grid still keeps tp inside a host
    r = against_one(bed, d, "dp2 x tp2 --map-by node", 4, hf, args, lay, ["--map-by", "node"],
                    one=one)
    want = (f"r0 {h1} (tp0 dp0 pp0), r1 {h2} (tp0 dp1 pp0), r2 {h1} (tp1 dp0 pp0), "
            f"r3 {h2} (tp1 dp1 pp0)")
    ok(want in hosts_line(r.stderr) and "placed host by host" in hosts_line(r.stderr),
       "--map-by node: the grid is placed host by host", hosts_line(r.stderr) or r.stderr)
    ok("span hosts" not in r.stderr, "--map-by node: no tp group spans hosts", r.stderr)

    # a slow, lossy link (1 ms each way, 5 % of the frames lost): TCP hides it
    why = bed.delay(2, 1) or bed.loss(2, 5)
    try:
        if why:
            ok(False, "test-hosts delay / loss", why)
        else:
            r = against_one(bed, d, "dp2 x tp2, host 2 +1 ms and 5 % loss", 4, hf, args, lay,
                            one=one)
    finally:
        bed.delay(2, 0), bed.loss(2, 0)

    hf4 = bed.hostfile([(1, 1), (2, 1), (3, 1), (4, 1)])
    args = [*base(shard), "--micro-batch", "2"]
    r = against_one(bed, d, "pp2 x dp2 on 4 hosts x 1 slot", 4, hf4, args,
                    ["--pp", "2", "--dp", "2"])
    names = [bed.name(i) for i in range(1, 5)]
    ok(all(f"r{i} {names[i]}" in hosts_line(r.stderr) for i in range(4)),
       "pp2 x dp2: one rank on each host", hosts_line(r.stderr) or r.stderr)


def checkpoint(bed, d, shard):
    """Written across 2 hosts, resumed on one: bit-exact."""
    ck = os.path.join(d, "ck")
    args = [*base(shard, 6), "--tp", "2", "--dp", "2", "--ckpt-every", "3", "--data-order",
            "sequential"]
    wa, wb = os.path.join(d, "across.st"), os.path.join(d, "one_host.st")
    r = bed.mpirun(4, bed.hostfile([(1, 2), (2, 2)]),
                   [*args, "--ckpt-dir", ck, "--save-weights", wa])
    ok(r.returncode == 0 and os.path.exists(os.path.join(ck, "step_00000003", "manifest.json")),
       "checkpoint: dp2 x tp2 across 2 hosts commits", r.stderr)
    r = bed.mpirun(4, bed.hostfile([(1, 4)]),
                   [*args, "--ckpt-dir", os.path.join(d, "ck_one"), "--resume",
                    os.path.join(ck, "step_00000003"), "--save-weights", wb])
    ok(r.returncode == 0 and "step 3" in r.stderr, "checkpoint: resumed at step 3 on one host",
       r.stderr)
    same = os.path.exists(wa) and os.path.exists(wb) and open(wa, "rb").read() == open(wb,
                                                                                     "rb").read()
    ok(same, "checkpoint: the run resumed on one host ends bitwise equal to the run across hosts")


def probe(bed, d, shard):
    """A --ckpt-dir that host 2 sees as its own empty directory."""
    priv = os.path.join(d, "private")
    os.makedirs(priv)
    bed.private(2, priv)
    try:
        r = bed.mpirun(4, bed.hostfile([(1, 2), (2, 2)]),
                       [*base(shard), "--tp", "2", "--dp", "2", "--log-every", "1",
                        "--ckpt-dir", os.path.join(priv, "ck")], timeout=120)
    finally:
        bed.clear_private(2)
    h1, h2 = bed.name(1), bed.name(2)
    ok(r.returncode != 0 and "is not one directory shared by every rank" in r.stderr and
       f"rank 2 (on {h2}) cannot see the probe file of rank 0 (on {h1})" in r.stderr and
       re.search(r"step +1/", r.stderr) is None,
       "a --ckpt-dir that host 2 does not share is refused at start-up, naming its ranks",
       r.stdout + r.stderr)
    ok(not [f for f in os.listdir(os.path.join(priv, "ck")) if f.startswith(".probe")],
       "the probe files are removed")


class Reader:
    """Lines of a process's output, each with the time it arrived."""

    def __init__(self, p):
        self.lines, self.p = [], p
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        for l in self.p.stdout:
            self.lines.append((time.time(), l))

    def text(self):
        return "".join(l for _, l in self.lines)


def steps_in(path):
    try:
        return [json.loads(l) for l in open(path) if '"loss"' in l]
    except (OSError, ValueError):
        return []


def wait_steps(path, n, p, timeout=90):
    t_end = time.time() + timeout
    while time.time() < t_end and p.poll() is None and len(steps_in(path)) < n:
        time.sleep(0.05)
    return len(steps_in(path)) >= n


def flap(bed, d, shard):
    """A 2 s flap of host 2 with --comm-timeout 10: survived, visible."""
    steps = 300
    args = [*base(shard, steps), "--layers", "2", "--tp", "2", "--dp", "2", "--comm-timeout",
            "10"]
    hf = bed.hostfile([(1, 2), (2, 2)])
    m0 = os.path.join(d, "noflap.jsonl")
    r = bed.mpirun(4, hf, [*args, "--metrics", m0])
    ok(r.returncode == 0, "flap: the run without a flap", r.stderr)
    m = os.path.join(d, "flap.jsonl")
    p = bed.popen(4, hf, [*args, "--metrics", m])
    out = Reader(p)
    try:
        if not wait_steps(m, 40, p):
            ok(False, "flap: the run reaches step 40", out.text())
            return
        at = len(steps_in(m))
        bed.link(2, "down")
        time.sleep(2.0)
        bed.link(2, "up")
        rc = p.wait(timeout=120)
    finally:
        bed.link(2, "up")
        if p.poll() is None:
            p.kill()
        p.wait()
    out.t.join(5)
    s = steps_in(m)
    ok(rc == 0 and len(s) == steps, f"flap: a 2 s flap (at step {at}) is survived, the run "
       f"finishes its {steps} steps", out.text())
    ok(losses(m0) == losses(m), "flap: the losses are exactly those of the run without a flap")
    worst = max(s, key=lambda x: x["wait_ms"]) if s else {"wait_ms": 0, "step": 0, "ms": 0}
    med = sorted(x["ms"] for x in s)[len(s) // 2] if s else 0
    ok(worst["wait_ms"] >= 1500 and worst["step"] > at - 5,
       f"flap: visible in the timers (step {worst['step']}: {worst['ms']:.0f} ms, "
       f"{worst['wait_ms']:.0f} ms of it waiting on communication; median step {med:.1f} ms)",
       str(worst))
    print(f"flap: step {worst['step']} took {worst['ms']:.0f} ms "
          f"(comm wait {worst['wait_ms']:.0f} ms), median step {med:.1f} ms")


def outage(bed, d, shard):
    """A 30 s outage of host 2 with --comm-timeout 10: an error naming host
    2 and the op, within the timeout."""
    timeout = 10
    args = [*base(shard, 100000), "--tp", "2", "--dp", "2", "--comm-timeout", str(timeout),
            "--layers", "2"]
    m = os.path.join(d, "outage.jsonl")
    p = bed.popen(4, bed.hostfile([(1, 2), (2, 2)]), [*args, "--metrics", m])
    out = Reader(p)
    h2 = bed.name(2)
    # "tensor parallel pass: " and the like may come before the op's own words;
    # the op is a collective ("all_reduce #12") or, when the link went down
    # inside wte's reduce-scatter by exchange, its receive from host 2
    pat = re.compile(r"error \(rank [01] of 4 on \S+\): (?:[^:]+: )?comm: "
                     r"(\w+ #\d+|recv from rank \d+|send to rank \d+) .* "
                     r"timed out .*" + re.escape(f"on host {h2}"))
    seen = None
    try:
        if not wait_steps(m, 20, p):
            ok(False, "outage: the run reaches step 20", out.text())
            return
        t_down = time.time()
        bed.link(2, "down")
        while time.time() - t_down < 30 and p.poll() is None and seen is None:
            seen = next(((t, l) for t, l in list(out.lines) if t >= t_down and pat.search(l)),
                        None)
            time.sleep(0.1)
        bed.link(2, "up")
        rc = p.wait(timeout=90)
    finally:
        bed.link(2, "up")
        if p.poll() is None:
            p.kill()
        p.wait()
    out.t.join(5)
    after = seen[0] - t_down if seen else float("inf")
    # a send or receive names the collective it belongs to
    named = seen is not None and ("#" in pat.search(seen[1]).group(1) or
                                  "reduce-scatter of wte" in seen[1])
    ok(seen is not None and named and after <= timeout + 5 and rc != 0,
       f"outage: the ranks of host 1 fail naming the op and host {h2} "
       f"({after:.1f} s after the link went down, --comm-timeout {timeout})", out.text())
    if seen:
        print("outage:", seen[1].strip()[:400])


def main():
    bed = testbed.Bed.start(4, slots=4)
    d, shard = start("ms_hosts_")
    try:
        for case in (placement, checkpoint, probe, flap, outage):
            t0 = time.time()
            case(bed, d, shard)
            print(f"-- {case.__name__}: {time.time() - t0:.1f} s")
    finally:
        bed.down()
    finish(d)


if __name__ == "__main__":
    main()
