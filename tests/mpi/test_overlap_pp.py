"""Pipeline overlap (--overlap, issue 14's pp part): the decoupled schedule
with the tied-embedding sum overlapped with the cool-down (--overlap all)
computes bitwise what the coupled blocking schedule with the blocking
all-reduce computes (--overlap none, and --overlap dp,tp: pp off alone):
the same per-step losses in the metrics files and byte-identical
--save-weights files, for pp2 and pp2 --vpp 2, the serial and the parallel
block, pp2 x dp2 --vpp 2 (ZeRO's embedding reduce-scatter after the
exchange) and pp2 x tp2, parallel block (pp off alone).  Also: the metrics carry the per-dimension waits, and
bench/pp_overlap.py's replay of a traced step (the schedule with the
measured compute times and free messages) is never longer than the step
was, and gives the formula (p-1)/(v*m) exactly when every FWD costs 1 and
every BWD 2.  Runs under mpirun --oversubscribe.  Environment: MS_BIN."""
import os
import sys

from mpi_common import finish, ok, overlap_run, start

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import pp_overlap  # noqa: E402

MODES = ["all", "none", "dp,tp"]


def check_replay(d, label, want):
    """The replay of the last run's traced steps (d/trace): at most the
    measured bubble of each step, and `want` with unit costs."""
    steps = pp_overlap.complete_steps(pp_overlap.step_stats(os.path.join(d, "trace"), 1))
    measured, replayed = pp_overlap.bubble_fracs(steps), pp_overlap.replay_fracs(steps)
    ok(len(steps) >= 3 and len(replayed) == len(steps),
       f"{label}: every traced step replays", f"{len(steps)} steps, {len(replayed)} replayed")
    ok(all(r <= m + 1e-9 for r, m in zip(replayed, measured)),
       f"{label}: the replay with free messages is never longer than the step",
       f"{replayed}\n{measured}")
    for s in steps:
        for x in s.values():
            t, ops = 0.0, []
            for _, _, name, mb, c in sorted(x["ops"]):
                dt = 1e6 if name == "fwd" else 2e6
                ops.append((t, t + dt, name, mb, c))
                t += dt
            x["ops"], x["busy"] = ops, t / 1e6
    unit = pp_overlap.replay_fracs(steps)
    ok(unit and all(abs(u - want) < 1e-12 for u in unit),
       f"{label}: with FWD 1 and BWD 2 the replay gives (p-1)/(v*m) = {want}", str(unit))



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
    # the bubble (p-1)/(v*m) of the layouts whose last run's trace is replayed:
    # 8 / 2 = 4 micro-batches a step, 2 a rank under dp2
    replay = {"pp2 serial": 1 / 4, "pp2 vpp2 serial": 1 / 8, "pp2 x dp2 vpp2 serial": 1 / 4}
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
        if label in replay:
            check_replay(d, label, replay[label])
        print(f"{label}: {', '.join(modes)} bitwise equal"
              if all(runs[m] and runs[m][:2] == ref[:2] for m in modes) else f"{label}: differ")
    finish(d)


if __name__ == "__main__":
    main()
