"""Pipeline overlap (--overlap, issue 14's pp part): the decoupled schedule
with the tied-embedding sum overlapped with the cool-down (--overlap all)
computes bitwise what the coupled blocking schedule with the blocking
all-reduce computes (--overlap none, and --overlap dp,tp: pp off alone):
the same per-step losses in the metrics files and byte-identical
--save-weights files, for pp2 and pp2 --vpp 2, the serial and the parallel
block, pp2 x dp2 --vpp 2 (ZeRO's embedding reduce-scatter after the
exchange) and pp2 x tp2, parallel block (pp off alone).  Also: the metrics carry the per-dimension waits.  Runs under
mpirun --oversubscribe.  Environment: MS_BIN."""
from mpi_common import finish, ok, overlap_run, start

MODES = ["all", "none", "dp,tp"]


def main():
    d, shard = start("ms_ovpp_")
    base = ["train", "--train-data", shard, "--vocab", "256", "--layers", "4", "--dim", "64",
            "--heads", "4", "--seq-max", "32", "--seq", "32", "--batch", "8", "--micro-batch", "2",
            "--steps", "6", "--lr", "3e-3", "--log-every", "100", "--threads", "1"]
    par = ["--block", "parallel", "--attn-window", "8"]
    # (label, ranks, options, modes compared with "all")
    cases = [
        ("pp2 serial", 2, ["--pp", "2"], MODES),
        ("pp2 parallel", 2, ["--pp", "2", *par], MODES),
        ("pp2 vpp2 serial", 2, ["--pp", "2", "--vpp", "2"], MODES),
        ("pp2 vpp2 parallel", 2, ["--pp", "2", "--vpp", "2", *par], MODES),
        ("pp2 x dp2 vpp2 serial", 4, ["--pp", "2", "--dp", "2", "--vpp", "2"], ["all", "none"]),
        ("pp2 x tp2 parallel", 4, ["--pp", "2", "--tp", "2", *par], ["all", "dp,tp"]),
    ]
    for label, n, extra, modes in cases:
        runs = {mode: overlap_run(d, n, [*base, *extra], mode) for mode in modes}
        ref = runs["all"]
        if not ref:
            continue
        ok(len(ref[0]) == 6 and ref[0][-1] < ref[0][0], f"{label}: 6 steps, the loss falls",
           str(ref[0]))
        keys = ("pp_wait_ms", "bubble_ms", "tp_wait_ms", "dp_wait_ms")
        ok(all(k in r for r in ref[2] for k in keys), f"{label}: metrics carry {keys}",
           str(ref[2][:1]))
        for mode in modes[1:]:
            got = runs[mode]
            if not got:
                continue
            ok(got[0] == ref[0], f"{label}: --overlap {mode} losses bitwise those of all",
               f"{ref[0]}\n{got[0]}")
            ok(got[1] == ref[1], f"{label}: --overlap {mode} final weights byte-identical")
        print(f"{label}: {', '.join(modes)} bitwise equal"
              if all(runs[m] and runs[m][:2] == ref[:2] for m in modes) else f"{label}: differ")
    finish(d)


if __name__ == "__main__":
    main()
