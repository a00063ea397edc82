"""The several-hosts test bed for the tests (test_hosts.py, test_hosts_sup.py):
scripts/test-hosts under a prefix and a /24 of 198.18.0.0/15 of this test's
own, so two tests (or two engineers) never share a bed; removed at exit,
on SIGTERM / SIGINT and on failure, with every process still running in it.

    bed = Bed.start(4, slots=2)       # or exits 77 (skipped) with the reason
    hf = bed.hostfile([("1", 2), ("2", 2)])   # host numbers and slots
    r = bed.mpirun(4, hf, ["train", ...])
    bed.link(2, "down")

Environment: MS_BIN (the megascale binary)."""
import atexit
import glob
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "test-hosts")
BIN = os.environ.get("MS_BIN", "")
MPIRUN = shutil.which("mpirun")


def skip(why):
    print(f"SKIP: {why}")
    sys.exit(77)


def can_run():
    """None when the bed can be built here, else why not."""
    if os.geteuid() != 0:
        return "not root (network namespaces need root)"
    if not MPIRUN:
        return "mpirun not found (apt-get install openmpi-bin)"
    for tool, pkg in (("ip", "iproute2"), ("tc", "iproute2"), ("unshare", "util-linux")):
        if not shutil.which(tool):
            return f"{tool} not found (apt-get install {pkg})"
    probe = f"msprobe{os.getpid() % 100000}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode:
        return f"ip netns does not work here: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


class Bed:
    def __init__(self, n, slots):
        self.n = n
        # a prefix and a /24 nobody else uses (checked by `up` itself too)
        used = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True,
                              text=True).stdout
        free = [x for x in range(1, 250) if f" 198.19.{x}." not in used]
        self.net = f"198.19.{random.choice(free)}"
        self.prefix = "mst" + "".join(random.choice("abcdefghijkmnpqrstuvwxyz") for _ in range(4))
        self.env_bed = dict(os.environ, MSHOST_PREFIX=self.prefix, MSHOST_NET=self.net)
        self.dir = tempfile.mkdtemp(prefix=f"ms_{self.prefix}_")
        self.up = False
        self.procs = []
        atexit.register(self.down)
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, self._on_signal)
        r = self.tool("up", str(n), str(slots))
        if r.returncode:
            self.down()
            raise RuntimeError(f"test-hosts up failed: {r.stderr}")
        self.up = True
        self.mca = dict(l.split("=", 1) for l in self.tool("env").stdout.split())
        self.names = [f"{self.prefix}{i}" for i in range(1, n + 1)]

    @classmethod
    def start(cls, n, slots=1):
        why = can_run()
        if why:
            skip(why)
        return cls(n, slots)

    def _on_signal(self, sig, frame):
        self.down()
        sys.exit(128 + sig)

    def tool(self, *args):
        return subprocess.run([SCRIPT, *args], capture_output=True, text=True, env=self.env_bed,
                              timeout=60)

    def name(self, i):
        """Host i (1-based) by its name."""
        return self.names[i - 1]

    def hostfile(self, hosts, name=None):
        """A hostfile of [(host number, slots), ...]; its path."""
        path = os.path.join(self.dir, name or ("hosts_" + "_".join(f"{h}x{s}" for h, s in hosts)))
        with open(path, "w") as f:
            for h, s in hosts:
                f.write(f"{self.name(h)} slots={s}\n")
        return path

    def env(self, **extra):
        """The environment of an mpirun on the bed: Open MPI's launch agent,
        TCP and shared memory (inside a host only) on the bed's subnet."""
        e = dict(os.environ, OMP_NUM_THREADS="1", **self.mca)
        e.update(extra)
        return e

    def cmd(self, n, hostfile, args, mpirun_args=()):
        return [MPIRUN, "--allow-run-as-root", "--hostfile", hostfile, *mpirun_args, "-np",
                str(n), BIN, *args]

    def mpirun(self, n, hostfile, args, mpirun_args=(), timeout=180):
        return subprocess.run(self.cmd(n, hostfile, args, mpirun_args), capture_output=True,
                              text=True, errors="replace", env=self.env(), timeout=timeout)

    def popen(self, n, hostfile, args, mpirun_args=(), argv=None, out=subprocess.PIPE):
        """mpirun (or argv) in the background, stdout and stderr together
        (into a pipe, or the open file `out`: a pipe stays open as long as
        any process that inherited it, e.g. a daemon left on a host whose
        link is down); killed by down() if it still runs."""
        p = subprocess.Popen(argv or self.cmd(n, hostfile, args, mpirun_args), stdout=out,
                             stderr=subprocess.STDOUT, text=True, errors="replace",
                             env=self.env())
        self.procs.append(p)
        return p

    def link(self, i, how):
        r = self.tool("link", self.name(i), how)
        assert r.returncode == 0, r.stderr

    def delay(self, i, ms):
        """MS ms more in each direction of host i's link (netem); None, or
        test-hosts' message when it cannot (a kernel without netem)."""
        r = self.tool("delay", self.name(i), str(ms))
        return r.stderr.strip() or "failed" if r.returncode else None

    def loss(self, i, pct):
        """PCT % of host i's frames lost in each direction; None or why not."""
        r = self.tool("loss", self.name(i), str(pct))
        return r.stderr.strip() or "failed" if r.returncode else None

    def private(self, i, path):
        r = self.tool("private", self.name(i), path)
        assert r.returncode == 0, r.stderr

    def clear_private(self, i):
        p = f"/run/{self.prefix}/private.{self.name(i)}"
        if os.path.exists(p):
            os.remove(p)

    def kill_left(self):
        """Kill, by pid, processes of this bed left in the root namespace (an
        mpirun whose driver was killed): those whose command line names the
        bed's prefix (its hostfiles, its node names).  A killed mpirun leaves
        its session directory (TMP/ompi.HOST.UID/pid.PID) behind: removed once
        the process is gone."""
        killed = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            try:
                cmd = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
            except OSError:
                continue
            if self.prefix in cmd and "test_hosts" not in cmd:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                    killed.append(pid)
                except OSError:
                    pass
        for pid in killed:
            for _ in range(100):
                if not os.path.exists(f"/proc/{pid}"):
                    break
                time.sleep(0.05)
            for top in glob.glob(os.path.join(tempfile.gettempdir(), f"ompi.*.{os.geteuid()}")):
                shutil.rmtree(os.path.join(top, f"pid.{pid}"), ignore_errors=True)

    def down(self):
        """Remove the bed (namespaces, veths, bridge, qdiscs, its processes)."""
        if getattr(self, "_downed", False):
            return
        self._downed = True
        for p in getattr(self, "procs", []):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.tool("down")  # kills what runs in the namespaces
        self.kill_left()
        # Open MPI's session directories of the bed's hosts (their orteds
        # were killed with the namespaces): TMP/ompi.HOST.UID
        for top in glob.glob(os.path.join(tempfile.gettempdir(), f"ompi.{self.prefix}*")):
            shutil.rmtree(top, ignore_errors=True)
        shutil.rmtree(self.dir, ignore_errors=True)
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        if self.prefix in left:
            print(f"WARNING: namespaces of {self.prefix} left: {left}")
