"""Data-parallel overlap (ZeRO-2, --overlap): a dp2 run with the
communication hidden behind compute (--overlap all: reduce-scatters started
as each bucket's gradients are final, wte's classifier part early and its
lookup rows by a small exchange, all-gathers started by the optimiser bucket
by bucket) must be bitwise the run with every op waited at once (--overlap
none, and --overlap tp,pp: dp off alone): the same losses in the metrics and
the same final weights file, byte for byte.  Cases: the serial and the
parallel block, AdamW and LAMB, gradient accumulation (--micro-batch 2: only
the last micro-batch's backward communicates).  Then a bad --overlap value
is refused with a message naming it.  Runs under mpirun --oversubscribe.
Environment: MS_BIN."""
from mpi_common import finish, mpi, ok, overlap_run, start


def run(d, base, extra, overlap):
    """One dp2 run with --overlap `overlap`: (losses, weights bytes, dp_wait
    per step), or None when it failed."""
    r = overlap_run(d, 2, [*base, *extra, "--dp", "2"], overlap)
    return r and (r[0], r[1], [x["dp_wait_ms"] for x in r[2]])


def main():
    d, shard = start("ms_ovdp_")
    base = ["train", "--train-data", shard, "--vocab", "256", "--layers", "2", "--dim", "64",
            "--heads", "4", "--seq-max", "32", "--seq", "32", "--batch", "8", "--steps", "6",
            "--lr", "3e-3", "--log-every", "100", "--peak-flops", "1e11", "--threads", "1"]
    cases = [["--optimizer", "adamw"],
             ["--optimizer", "lamb", "--lr", "2e-2", "--block", "parallel"],
             ["--optimizer", "adamw", "--block", "parallel", "--micro-batch", "2"],
             ["--optimizer", "lamb", "--lr", "2e-2", "--micro-batch", "2"]]
    for extra in cases:
        label = "dp2 " + " ".join(extra)
        on = run(d, base, extra, "all")
        if not on:
            continue
        ok(len(on[0]) == 6 and on[0][-1] < on[0][0] - 0.3, f"{label}: the loss falls", str(on[0]))
        ok(all(w >= 0 for w in on[2]), f"{label}: the metrics carry dp_wait_ms", str(on[2]))
        for off in ("none", "tp,pp"):
            r = run(d, base, extra, off)
            if not r:
                continue
            ok(r[0] == on[0], f"{label}: --overlap {off} gives bitwise the losses of --overlap all",
               f"{on[0]}\n{r[0]}")
            ok(r[1] == on[1],
               f"{label}: --overlap {off} gives bitwise the final weights of --overlap all")
        print(f"{label}: on and off bitwise equal")

    r = mpi(2, *base, "--dp", "2", "--overlap", "bogus")
    ok(r.returncode != 0 and "--overlap bogus" in r.stderr and "'bogus' is not a dimension"
       in r.stderr, "--overlap bogus is refused, naming the value", r.stderr)
    # an empty value or entry: refused (it ran, taken as all, and the metrics said "")
    for v, what in (("", "value"), ("dp,,tp", "entry"), ("dp,", "entry")):
        r = mpi(2, *base, "--dp", "2", "--overlap", v)
        ok(r.returncode == 2 and f"--overlap '{v}': an empty {what}" in r.stderr,
           f"--overlap '{v}' is refused", r.stderr)
    finish(d)


if __name__ == "__main__":
    main()
