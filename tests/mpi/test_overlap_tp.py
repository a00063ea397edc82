"""Tensor-parallel overlap (--overlap, src/model/gpt_tp.c): the GEMMs
pipelined with the all-gathers and reduce-scatters give bitwise the losses
and final weights of the same run waiting for each message at once
(--overlap none, and --overlap dp,pp: tp off, the others on), for tp2 with
the serial and the parallel block, tp4 (sums of four partial products, in
rank order), tp2 x dp2 with gradient accumulation, and dp2 x tp2 x pp2
(with --vpp 2 and the parallel block too: every dimension on, tp alone
off, tp alone on, all off); the metrics carry the per-dimension waits.  Runs under mpirun --oversubscribe.  Environment:
MS_BIN."""
from mpi_common import finish, mpi, ok, overlap_run, start


def bitwise(d, label, n, args, modes=("all", "none", "dp,pp")):
    """Run `args` as n ranks once per --overlap mode; check each run
    succeeds and all give the same losses and the same weights file.
    Returns the first mode's metrics records (None after a failed run)."""
    ref, recs = None, None
    for mode in modes:
        r = overlap_run(d, n, args, mode)
        if not r:
            return None
        got = r[:2]
        if ref is None:
            ref, recs = got, r[2]
            ok(len(got[0]) > 0 and got[0][-1] < got[0][0], f"{label}: the loss falls", str(got[0]))
        else:
            ok(got[0] == ref[0], f"{label}: --overlap {mode} gives the losses of --overlap "
               f"{modes[0]} bitwise", f"{got[0]}\n{ref[0]}")
            ok(got[1] == ref[1], f"{label}: --overlap {mode} gives the final weights of "
               f"--overlap {modes[0]} bitwise")
    return recs


def main():
    d, shard = start("ms_ovtp_")
    base = ["train", "--train-data", shard, "--vocab", "256", "--layers", "2", "--dim", "64",
            "--heads", "4", "--seq-max", "32", "--seq", "32", "--batch", "8", "--steps", "5",
            "--lr", "3e-3", "--log-every", "100", "--peak-flops", "1e11", "--threads", "1"]
    cases = [
        ("tp2 serial", 2, ["--tp", "2"]),
        ("tp2 parallel window", 2, ["--tp", "2", "--block", "parallel", "--attn-window", "8"]),
        ("tp4 parallel", 4, ["--tp", "4", "--block", "parallel"]),
        ("tp2 x dp2 serial accum lamb", 4,
         ["--tp", "2", "--dp", "2", "--micro-batch", "2", "--optimizer", "lamb"]),
        # all three dimensions at once (each on, each off, all off)
        ("dp2 x tp2 x pp2 serial", 8,
         ["--dp", "2", "--tp", "2", "--pp", "2", "--layers", "4", "--micro-batch", "1"]),
        ("dp2 x tp2 x pp2 vpp2 parallel", 8,
         ["--dp", "2", "--tp", "2", "--pp", "2", "--vpp", "2", "--layers", "4",
          "--micro-batch", "1", "--block", "parallel"]),
    ]
    for label, n, layout in cases:
        modes = ("all", "none", "dp,pp", "tp") if n == 8 else ("all", "none", "dp,pp")
        recs = bitwise(d, label, n, base + layout, modes)
        if recs and label == "tp2 serial":
            step = recs[-1]
            ok(all(k in step for k in ("tp_wait_ms", "dp_wait_ms", "pp_wait_ms")),
               "the metrics carry each dimension's waits", str(step))
            ok(step["tp_wait_ms"] <= step["wait_ms"] + 1e-3 and step["dp_wait_ms"] == 0,
               "tp2: the tp waits are part of all waits, no dp waits", str(step))

    r = mpi(2, *base, "--tp", "2", "--overlap", "tp,sp")
    ok(r.returncode != 0 and "--overlap tp,sp: 'sp' is not a dimension" in r.stderr,
       "an unknown --overlap dimension is named", r.stderr)
    finish(d)


if __name__ == "__main__":
    main()
