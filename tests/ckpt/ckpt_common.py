"""Helpers shared by the checkpoint tests: the binary, a tiny model, a token
shard, running commands, reading losses and commit lines, the sizes of a
commit's shards, the /dev/shm snapshots (their step, one byte of their data
flipped), a manifest's checksum (resealed after a deliberate edit, or
dropped as in a version-1 commit), and the pass/fail tally."""
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

BIN = os.environ.get("MS_BIN") or (sys.argv[1] if len(sys.argv) > 1 else "build/megascale")
MPIRUN = shutil.which("mpirun")
TINY = ["--vocab", "256", "--layers", "2", "--dim", "32", "--heads", "2", "--seq-max", "32",
        "--seq", "16", "--batch", "4", "--threads", "1", "--peak-flops", "1e11",
        "--log-every", "100", "--lr", "3e-3"]

passed = failed = 0


def ok(cond, what, detail=""):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print(f"FAIL: {what}\n{detail[-3000:]}", flush=True)
    return cond


def summary():
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


class Workspace:
    """A temporary directory with a token shard, and a private snapshot
    directory in /dev/shm (MS_CKPT_SHM_DIR) so tests never touch another
    job's snapshots; both removed by close() when everything passed."""

    def __init__(self, prefix):
        self.dir = tempfile.mkdtemp(prefix=prefix)
        shm_root = "/dev/shm" if os.path.isdir("/dev/shm") else self.dir
        self.shm = tempfile.mkdtemp(prefix=prefix, dir=shm_root)
        self.shard = self.path("train.bin")
        text = ("In the beginning God created the heaven and the earth. And the earth was "
                "without form, and void; and darkness was upon the face of the deep. " * 300)
        data = text.encode()
        header = [0] * 256
        header[0], header[1], header[2] = 20240520, 1, len(data)
        with open(self.shard, "wb") as f:
            f.write(struct.pack("<256i", *header) + struct.pack(f"<{len(data)}H", *data))
        self.env = dict(os.environ, MS_CKPT_SHM_DIR=self.shm, OMP_NUM_THREADS="1")
        self.env.pop("MS_CKPT_FAULT", None)

    def path(self, *p):
        return os.path.join(self.dir, *p)

    def train_args(self, *extra):
        return ["train", "--train-data", self.shard, *TINY, *extra]

    def close(self):
        shutil.rmtree(self.shm, ignore_errors=True)
        if not failed:
            shutil.rmtree(self.dir, ignore_errors=True)
        else:
            print("kept", self.dir)


def run(ws, args, fault=None, timeout=180, env=None):
    e = dict(env or ws.env)
    if fault:
        e["MS_CKPT_FAULT"] = fault
    return subprocess.run([BIN, *args], capture_output=True, text=True, errors="replace",
                          env=e, timeout=timeout)


def mpi(ws, n, args, fault=None, timeout=180):
    cmd = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", str(n),
           "-x", "MS_CKPT_SHM_DIR", "-x", "OMP_NUM_THREADS", "-x", "MS_COMM_TIMEOUT"]
    e = dict(ws.env, MS_COMM_TIMEOUT="20")
    if fault:
        e["MS_CKPT_FAULT"] = fault
        cmd += ["-x", "MS_CKPT_FAULT"]
    return subprocess.run(cmd + [BIN, *args], capture_output=True, text=True, errors="replace",
                          env=e, timeout=timeout)


def losses(path):
    """The losses of a --metrics file, read while its trainer may still be writing: a line
    without its newline yet is being appended (a write across a page boundary shows its first
    part to a reader first) and is left for the next read."""
    if not os.path.exists(path):
        return []
    return [json.loads(l)["loss"] for l in open(path) if '"loss"' in l and l.endswith("\n")]


def ckpt_lines(path):
    """The metrics file's commit lines ({"type":"ckpt", ...}), in file order."""
    if not os.path.exists(path):
        return []
    return [o for o in map(json.loads, open(path)) if o.get("type") == "ckpt"]


def sha(path):
    if not os.path.exists(path):
        return None
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def rel_err(a, b):
    if len(a) != len(b) or not a:
        return float("inf")
    return max(abs(x - y) / max(abs(x), 1e-30) for x, y in zip(a, b))


def resumed_at(stderr):
    """The step a run says it continued at (None: it did not resume)."""
    for line in stderr.splitlines():
        if "resume: continuing at step" in line:
            return int(line.split("continuing at step")[1].split()[0])
    return None


def committed_steps(stderr):
    """The steps rank 0's log says were committed ("checkpoint: step N
    committed to ..."), in log order."""
    return [int(l.split("checkpoint: step ")[1].split()[0]) for l in stderr.splitlines()
            if "checkpoint: step " in l and " committed to " in l]


def verify(path):
    r = subprocess.run([BIN, "ckpt", "verify", path], capture_output=True, text=True,
                       errors="replace")
    return r.returncode == 0


def step_dir(root, step):
    return os.path.join(root, f"step_{step:08d}")


def shard_sizes(root, step):
    """The sizes on disk of the shard files of the commit step_N under root,
    and the sizes its manifest lists for them: (disk, manifest), each a
    {name: bytes} dict ({} when missing)."""
    d = step_dir(root, step)
    if not os.path.isdir(d):
        return {}, {}
    disk = {n: os.path.getsize(os.path.join(d, n)) for n in os.listdir(d)
            if n.endswith(".safetensors")}
    mf = os.path.join(d, "manifest.json")
    listed = {f["name"]: f["bytes"] for f in json.load(open(mf))["files"]} if os.path.exists(mf) else {}
    return disk, listed


def tree(root):
    """Every entry under root (links not followed): relative path -> the
    link's target, 'dir', or the file's sha256; to show nothing changed."""
    out = {}
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(d, n)
            rel = os.path.relpath(p, root)
            if os.path.islink(p):
                out[rel] = "-> " + os.readlink(p)
            elif os.path.isdir(p):
                out[rel] = "dir"
            else:
                out[rel] = sha(p)
    return out


def slots(shm, root):
    """The snapshot files in shm of the checkpoint directory root (named by
    the FNV-1a 64 of its real path): {path: (step, complete)} from their
    header (docs/formats.md, "Host-memory snapshots")."""
    h = 1469598103934665603
    for b in os.path.realpath(root).encode():
        h = ((h ^ b) * 1099511628211) & (2**64 - 1)
    out = {}
    for n in sorted(os.listdir(shm)):
        if n.startswith(f"megascale-ckpt-{h:016x}-"):
            with open(os.path.join(shm, n), "rb") as f:
                hdr = f.read(32)
            complete, = struct.unpack_from("<I", hdr, 12)
            step, = struct.unpack_from("<q", hdr, 24)
            out[os.path.join(shm, n)] = (step, complete)
    return out


def flip_snapshot_byte(path):
    """Flip one bit of a byte in the middle of the snapshot's data."""
    with open(path, "r+b") as f:
        data_off, data_elems = struct.unpack_from("<QQ", f.read(72), 56)
        at = data_off + data_elems * 4 // 2 + 2
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x10]))


def nan_snapshot_word(path):
    """Write 0xffffffff (a NaN) over the first float of the snapshot's data (a weight)."""
    with open(path, "r+b") as f:
        data_off, _ = struct.unpack_from("<QQ", f.read(72), 56)
        f.seek(data_off)
        f.write(b"\xff\xff\xff\xff")


def _crc32c_table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


_CRC32C = _crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = _CRC32C[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def manifest_reseal(path):
    """Recompute the manifest_crc32c of DIR/manifest.json after an edit made
    on purpose (docs/formats.md: the CRC32C of the file with its 8 digits
    read as zeros), so that a test reaches the checks behind the checksum."""
    text = open(path, "rb").read()
    m = re.search(rb'"manifest_crc32c"\s*:\s*"([0-9a-fA-F]{8})"', text)
    if not m:  # a version-1 manifest: nothing to reseal
        return
    zeroed = text[:m.start(1)] + b"00000000" + text[m.end(1):]
    with open(path, "wb") as f:
        f.write(zeroed[:m.start(1)] + b"%08x" % crc32c(zeroed) + zeroed[m.end(1):])


def manifest_to_v1(path):
    """Rewrite a manifest as a commit of format version 1 wrote it: no
    manifest_crc32c (cJSON's layout, tabs, is kept)."""
    text = open(path).read()
    text = re.sub(r'\n\t"manifest_crc32c":\t"[0-9a-fA-F]{8}",', "", text)
    text = text.replace('"version":\t2,', '"version":\t1,', 1)
    open(path, "w").write(text)
