"""Open MPI's shared-memory segments that killed jobs left in /dev/shm
(base/shm_sweep.h): the first rank of a host removes them at start-up, and
only them.  Fake segments of this host are made in /dev/shm: one that no
process uses (removed), one a live process holds open (kept), one of
another user (kept; as root, who can make one), one of another host name
(kept).  Then a normal 2-rank
job leaves no segment of its own.  A tp 2 job's batch-ring leader removes
a killed job's ring of this host (/dev/shm/megascale-batches-HOST-*), not
another host's, and leaves none of its own.  Runs under mpirun --oversubscribe.
Environment: MS_BIN."""
import os
import random
import socket
import subprocess
import time

from mpi_common import finish, mpi, ok, start, vader_segments


def main():
    d, shard = start("ms_shm_sweep_")
    host = socket.gethostname().split(".")[0]
    tag = "%08x" % random.getrandbits(32)  # no job of Open MPI has this id
    path = {k: f"/dev/shm/vader_segment.{h}.{os.geteuid():x}.{tag}.{i}"
            for i, (k, h) in enumerate([("stale", host), ("held", host), ("other_user", host),
                                        ("other_host", host + "x")])}
    # a batch ring of a killed job of this host, and one of another host's
    ring = {"stale_ring": f"/dev/shm/megascale-batches-{host}-99999-{tag}00000000",
            "other_host_ring": f"/dev/shm/megascale-batches-{host}x-99999-{tag}00000000"}
    path.update(ring)
    for p in path.values():
        with open(p, "wb") as f:
            f.truncate(4 << 20)
    holder = subprocess.Popen(["sleep", "300"], stdin=open(path["held"], "rb"))
    if os.geteuid() == 0:
        os.chown(path["other_user"], 65534, 65534)
    time.sleep(2.2)  # older than the sweep's 2 s
    base = ["train", "--train-data", shard, "--vocab", "256", "--layers", "1", "--dim", "32",
            "--heads", "2", "--seq-max", "16", "--seq", "16", "--batch", "4", "--steps", "2",
            "--threads", "1", "--peak-flops", "1e11", "--trace-dir", "none"]
    seen = []
    try:
        # the job's own segments, as its ranks map them mid-run
        p = subprocess.Popen(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2",
                              os.environ["MS_BIN"], *base, "--steps", "400"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        t_end = time.time() + 60
        while time.time() < t_end and p.poll() is None and len(seen) < 2:
            ranks = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True,
                                   text=True).stdout.split()
            seen = sorted(vader_segments([int(r) for r in ranks]))
            time.sleep(0.1)
        _, err = p.communicate(timeout=120)
        ok(p.returncode == 0 and len(seen) == 2, "a 2-rank job ran, its ranks mapping 2 segments",
           f"rc {p.returncode}, segments {seen}\n{err[-2000:]}")
        # (removed by this job, or by a job of a test running beside it: the
        # log line says which)
        ok(not os.path.exists(path["stale"]), "the stale segment was removed at start-up",
           err[-2000:])
        ok(os.path.exists(path["held"]) and os.path.exists(path["other_host"]) and
           (os.path.exists(path["other_user"]) or os.geteuid() != 0),  # chown needs root
           "kept: a segment a live process holds, another host's, another user's",
           str({k: os.path.exists(v) for k, v in path.items()}))
        left = [s for s in seen if os.path.exists(s)]
        ok(not left, "a job that ends leaves none of its own segments", str(left))

        # the holder gone, the next start removes what it held
        holder.kill()
        holder.wait()
        time.sleep(0.2)
        r = mpi(2, *base)
        ok(r.returncode == 0 and not os.path.exists(path["held"]),
           "a segment no longer held is removed at the next start", r.stderr[-2000:])
        ok(os.path.exists(path["stale_ring"]), "a dp job has no batch ring: it sweeps none")
        # tp 2: the ring's leader removes the rings of this host's killed jobs
        r = mpi(2, *base, "--tp", "2")
        ok(r.returncode == 0 and not os.path.exists(path["stale_ring"])
           and os.path.exists(path["other_host_ring"])
           and "removed 1 batch ring(s) of killed jobs" in r.stderr,
           "a ring leader removes a killed job's ring of its host, not another host's",
           r.stderr[-2000:] + str({k: os.path.exists(v) for k, v in ring.items()}))
        left = [n for n in os.listdir("/dev/shm") if n.startswith(f"megascale-batches-{host}-")]
        ok(not left, "... and its own ring is gone when it ends", str(left))
    finally:
        holder.kill()
        for p in path.values():
            if os.path.exists(p):
                os.remove(p)
    finish(d)


if __name__ == "__main__":
    main()
