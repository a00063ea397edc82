"""The fixed validation set across layouts (issue 13).  One model's
validation loss (the step-0 pass of a run started --init-from its weights)
in one process with micro-batches of 8, 2 and 1 and as dp2 (micro-batches
of 4 and 1), tp2, pp2 and tp2 x dp2: equal within 1e-6 relative.  Before,
each layout scored a set of its own (--val-batches x micro-batch x dp
sequences): this model read 3.98630 in one process and 3.98454 as dp2 with
micro-batches of 1 and as pp2 with micro-batches of 2.  `megascale eval`
of the same weights alone and under mpirun (dp2, tp2, pp2, tp2 x dp2)
gives the same number; eval of a dp2 run's checkpoint, in one process and
as tp2, gives that run's last val_loss; a token outside the vocabulary in
one dp rank's share stops every rank at once (the reader names the
shard).  Runs under mpirun --oversubscribe.  Environment: MS_BIN."""
import json
import os
import struct
import subprocess

from mpi_common import BIN, finish, mpi, ok, start

SET = ["--val-batches", "4"]  # 4 x --batch 8 sequences of 32+1 tokens


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def val0(path):
    """The first val_loss of a --metrics file (None if there is none)."""
    v = [json.loads(l)["val_loss"] for l in open(path) if "val_loss" in l] if os.path.exists(path) else []
    return v[0] if v else None


def last_val(path):
    v = [json.loads(l)["val_loss"] for l in open(path) if "val_loss" in l]
    return v[-1] if v else None


def eval_loss(r):
    """val_loss of a `megascale eval --json` run (None on failure)."""
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])["val_loss"] if r.returncode == 0 else None
    except (ValueError, IndexError, KeyError):
        return None


def main():
    d, shard = start("ms_val_")
    model = ["--vocab", "256", "--layers", "2", "--dim", "64", "--heads", "4", "--seq-max", "32",
             "--seq", "32", "--batch", "8", "--threads", "1"]
    base = ["train", "--train-data", shard, *model, "--log-every", "100", "--peak-flops", "1e11",
            "--trace-dir", "none"]
    w = os.path.join(d, "w.st")
    r = subprocess.run([BIN, *base, "--steps", "10", "--lr", "3e-3", "--save-weights", w],
                       capture_output=True, text=True)
    ok(r.returncode == 0, "a 10-step run saves its weights", r.stderr)
    if r.returncode:
        finish(d)
    probe = [*base, "--init-from", w, "--steps", "1", "--lr", "1e-9", "--val-data", shard, *SET]

    m1 = os.path.join(d, "one.jsonl")
    r = subprocess.run([BIN, *probe, "--metrics", m1], capture_output=True, text=True)
    ref = val0(m1)
    ok(r.returncode == 0 and ref is not None, "one process validates", r.stderr)
    if ref is None:
        finish(d)
    print(f"one process: val_loss {ref!r}")

    # --- the training runs' validation: every layout scores the same set ---
    for mb in ("1", "2"):
        mp = os.path.join(d, f"mb{mb}.jsonl")
        r = subprocess.run([BIN, *probe, "--micro-batch", mb, "--metrics", mp],
                           capture_output=True, text=True)
        v = val0(mp)
        ok(r.returncode == 0 and v is not None and rel(v, ref) <= 1e-6,
           f"one process mb{mb}: val_loss = mb8's (rel {rel(v, ref) if v else 1:.1e})",
           f"{v} vs {ref}\n{r.stderr}")
        print(f"one process mb{mb}: val_loss {v!r}")
    layouts = [("dp2", 2, ["--dp", "2"]), ("dp2 mb1", 2, ["--dp", "2", "--micro-batch", "1"]),
               ("tp2", 2, ["--tp", "2"]), ("pp2 mb2", 2, ["--pp", "2", "--micro-batch", "2"]),
               ("tp2 x dp2", 4, ["--tp", "2", "--dp", "2"])]
    for label, n, lay in layouts:
        mp = os.path.join(d, "many.jsonl")
        if os.path.exists(mp):
            os.remove(mp)
        r = mpi(n, *probe, *lay, "--metrics", mp)
        v = val0(mp)
        ok(r.returncode == 0 and v is not None and rel(v, ref) <= 1e-6,
           f"train {label}: val_loss = one process's (rel {rel(v, ref) if v else 1:.1e})",
           f"{v} vs {ref}\n{r.stderr}")
        print(f"train {label}: val_loss {v!r}")

    # --- megascale eval of the same weights, alone and under mpirun ---
    ev = ["eval", "--weights", w, "--val-data", shard, *SET, "--batch", "8", "--seq", "32",
          "--threads", "1", "--json"]
    r = subprocess.run([BIN, *ev], capture_output=True, text=True)
    v = eval_loss(r)
    ok(v is not None and rel(v, ref) <= 1e-6, "eval alone = the trainer's val_loss",
       f"{v} vs {ref}\n{r.stdout}{r.stderr}")
    for label, n, lay in [("dp2", 2, []), ("tp2", 2, ["--tp", "2"]),
                          ("pp2", 2, ["--pp", "2", "--micro-batch", "2"]),
                          ("tp2 x dp2", 4, ["--tp", "2"])]:
        r = mpi(n, *ev, *lay)
        v = eval_loss(r)
        lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
        ok(v is not None and rel(v, ref) <= 1e-6 and len(lines) == 1,
           f"eval {label}: one line (rank 0), the same val_loss (rel {rel(v, ref) if v else 1:.1e})",
           f"{v} vs {ref}\n{r.stdout}{r.stderr}")
        print(f"eval {label}: val_loss {v!r}")

    # --- a dp2 run's checkpoint: eval alone and as tp2 gives its last val_loss ---
    ck, mp = os.path.join(d, "ck"), os.path.join(d, "dp2.jsonl")
    r = mpi(2, *base, "--dp", "2", "--steps", "4", "--lr", "3e-3", "--val-data", shard, *SET,
            "--ckpt-dir", ck, "--metrics", mp)
    last = last_val(mp) if r.returncode == 0 else None
    ok(last is not None, "a dp2 run with a checkpoint validates", r.stderr)
    if last is not None:
        ce = ["eval", "--ckpt", ck, "--val-data", shard, *SET, "--threads", "1", "--json"]
        r = subprocess.run([BIN, *ce], capture_output=True, text=True)
        v = eval_loss(r)
        ok(v is not None and rel(v, last) <= 1e-6,
           "eval alone of a dp2 checkpoint = the run's last val_loss", f"{v} vs {last}\n{r.stderr}")
        r = mpi(2, *ce, "--tp", "2")
        v = eval_loss(r)
        ok(v is not None and rel(v, last) <= 1e-6,
           "eval tp2 of a dp2 checkpoint = the run's last val_loss", f"{v} vs {last}\n{r.stderr}")
    subprocess.run([BIN, "ckpt", "shm", ck, "--remove", "1", "--force", "1"], capture_output=True)

    # --- a bad token in rank 1's share only: every rank stops, rank 1 names it ---
    text = open(shard, "rb").read()[1024:]
    toks = list(struct.unpack(f"<{len(text) // 2}H", text))[:2000]
    toks[800] = 300  # sequence 25 of 32: dp rank 1 scores sequences 16..31
    bad = os.path.join(d, "bad.bin")
    header = [0] * 256
    header[0], header[1], header[2] = 20240520, 1, len(toks)
    open(bad, "wb").write(struct.pack("<256i", *header) + struct.pack(f"<{len(toks)}H", *toks))
    r = mpi(2, "eval", "--weights", w, "--val-data", bad, *SET, "--batch", "8", "--seq", "32",
            "--threads", "1", timeout=120, env=dict(os.environ, MS_COMM_TIMEOUT="60"))
    ok(r.returncode != 0 and "bad.bin: token 300 at position 800" in r.stderr and
       "other rank(s) failed to read --val-data" in r.stderr,
       "a bad token in one dp rank's share: it names the shard, the other says so", r.stderr)

    finish(d)


if __name__ == "__main__":
    main()
