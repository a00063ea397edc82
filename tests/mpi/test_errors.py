"""A multi-rank command's errors are printed once, by rank 0, naming the
failing ranks (issue 13; src/train/train_gate.c).  Before, every rank
printed its own line: four copies of the same message under -np 4.

- the same bad option on every rank (before MPI starts): one line, "(all 3
  ranks)", exit 2; a bad option on rank 2 only: one line naming rank 2 and
  its host, every rank ending at once;
- the same set-up failure on every rank (a missing --init-from), and for
  `megascale eval`: one line;
- one rank's validation share holding a bad token: the cause (rank 1) and
  the consequence (rank 0), one line each;
- every rank stopping on non-finite gradients: one line;
- one rank failing while the others wait for it in a step's all-reduce
  (a bad token in its training batch): the gate cannot meet them, and the
  failing rank prints its own error within seconds, with no word about the
  gate.
Environment: MS_BIN (the binary)."""
import os
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpi_common import MPIRUN, finish, mpi, mpmd, ok, start  # noqa: E402


def error_lines(err, cmd="train"):
    return [l for l in err.splitlines() if l.startswith(f"megascale {cmd}: error")]


def write_tokens(path, toks):
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253)))
        f.write(struct.pack(f"<{len(toks)}H", *toks))


def expect_one(label, r, *needles, rc=None, cmd="train", count=1):
    lines = error_lines(r.stderr, cmd)
    good = (len(lines) == count and all(any(n in l for l in lines) for n in needles) and
            r.returncode != 0 and (rc is None or r.returncode == rc))
    ok(good, f"{label}: {count} error line(s) naming {needles} (got {len(lines)}, rc "
       f"{r.returncode})", r.stderr)
    return lines


def main():
    if not MPIRUN:
        print("SKIP: mpirun not found (install openmpi-bin)")
        sys.exit(77)
    d, shard = start("ms_errors_")
    host = socket.gethostname()
    base = ["train", "--train-data", shard, "--vocab", "256", "--layers", "2", "--dim", "32",
            "--heads", "2", "--seq-max", "32", "--seq", "16", "--batch", "4", "--steps", "3",
            "--log-every", "100", "--threads", "1", "--trace-dir", "none"]

    # --- options that fail before MPI starts ---
    t0 = time.time()
    r = mpi(3, *base, "--batch", "6", "--lr", "nan", timeout=120)
    el = time.time() - t0
    expect_one("--lr nan on every rank", r, "(all 3 ranks)", "--lr expects a finite number", rc=2)
    ok(el < 30, f"... and the job ends at once ({el:.1f} s)")
    t0 = time.time()
    r = mpmd([(2, [*base, "--batch", "6"]), (1, [*base, "--batch", "6", "--eps", "-1"])],
             timeout=120)
    el = time.time() - t0
    expect_one("--eps -1 on rank 2 only", r, f"(rank 2 of 3 on {host})", "--eps")
    ok(el < 30, f"... and the job ends at once ({el:.1f} s)")

    # --- set-up: the same failure everywhere; train and eval ---
    r = mpi(2, *base, "--init-from", os.path.join(d, "missing.safetensors"), timeout=120)
    expect_one("a missing --init-from", r, "(all 2 ranks)", "missing.safetensors")
    r = mpi(2, "eval", "--weights", os.path.join(d, "missing.safetensors"), "--val-data", shard,
            timeout=120)
    expect_one("eval: missing weights", r, "(all 2 ranks)", "missing.safetensors", cmd="eval")
    r = mpi(2, "eval", "--val-data", shard, timeout=120)
    expect_one("eval: no weights named (before MPI)", r, "(all 2 ranks)", "--weights", cmd="eval",
               rc=2)

    # --- an output rank 0 alone checks (--save-weights, --metrics in a missing directory):
    # one line, at once, and nothing written; rank 1 went on into the clock sync, timed out
    # 6 s later with a second line, and made the missing directory's trace/ (so the same
    # command then passed the check)
    for opt, name in (("--save-weights", "w.safetensors"), ("--metrics", "m.jsonl")):
        missing = os.path.join(d, f"nodir{opt}")
        t0 = time.time()
        r = mpi(2, *base[:-2], opt, os.path.join(missing, name), timeout=120)
        el = time.time() - t0
        expect_one(f"{opt} in a missing directory, checked by rank 0", r,
                   f"(rank 0 of 2 on {host})", opt, rc=2)
        ok(el < 20 and not os.path.exists(missing) and "comm:" not in r.stderr,
           f"... at once ({el:.1f} s), the directory not made, no rank timed out", r.stderr)

    # --- one rank's validation share holds a bad token ---
    val = os.path.join(d, "val.bin")
    toks = [i % 200 for i in range(4000)]
    toks[200] = 300  # in rank 1's half of the 16 sequences of 16+1
    write_tokens(val, toks)
    r = mpi(2, *base, "--val-data", val, "--val-batches", "4", timeout=120)
    lines = expect_one("a bad token in rank 1's validation share", r, f"(rank 1 of 2 on {host})",
                       "token 300 at position 200", "(rank 0 of 2", count=2)
    if lines:
        print("\n".join(lines))

    # --- every rank stops on non-finite gradients ---
    r = mpi(2, *base, "--steps", "6", "--inject-fault", "nan-grad@2+", "--max-bad-steps", "1",
            timeout=120)
    expect_one("non-finite gradients on every rank", r, "(all 2 ranks)", "--max-bad-steps", rc=6)

    # --- one rank fails while the others wait in a step's all-reduce ---
    bad = os.path.join(d, "bad_train.bin")
    toks = [i % 200 for i in range(6000)]
    toks[600] = 300
    write_tokens(bad, toks)
    t0 = time.time()
    args = [a if a != shard else bad for a in base]
    r = mpi(2, *args, "--steps", "20", "--data-order", "sequential", timeout=120)
    el = time.time() - t0
    lines = error_lines(r.stderr)
    ok(any("token 300 at position 600" in l for l in lines) and "gate" not in r.stderr and
       el < 60, f"one rank's bad batch: its own line, nothing about the gate ({el:.1f} s)",
       r.stderr)
    finish(d)


if __name__ == "__main__":
    main()
