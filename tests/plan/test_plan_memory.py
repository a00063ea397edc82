"""`megascale plan`'s memory per GPU against what the trainer allocates: tiny models trained
for two steps on the CPU backend, whose device-memory peak (the metrics' peak_dev_mb) is the
exact count of its be->alloc blocks and op scratch, and the planner's memory_gb_per_gpu for the
same model, layout and a CPU cluster file must agree within TOL.  One process: micro-batch,
sequence, width, vocabulary and a parallel block varied; with --mpi (under mpirun): tp2, dp2,
pp2 and pp2 x vpp2.  The trainer runs with --peak-flops and the planner with --probe 0, except
in the "probe" cases: without --peak-flops the trainer probes the peak with three 2048 x 2048
GEMM matrices on top of everything else, which the planner counts by default on a CPU cluster.
The "d6" cases take the position table's rows from the preset (seq-max 1024, not --seq) in
both; "bf16" trains with --cpu-dtype bf16 against a cluster of act_bytes 2 (dp2: the fp32
master weights whole on each rank, as ZeRO keeps them, plus the bf16 copy); "rc=MODE" gives
both --recompute MODE (the trainer's gelu, ln, gelu,ln: every block's GeLU or LayerNorm outputs
in one shared buffer; the planner accepted none|selective|full only).
Environment: MS_BIN."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ckpt"))
import ckpt_common as cc  # noqa: E402  (the workspace, its token shard, run and mpi)

TOL = 0.01
# name: model, sequence, batch, micro-batch, layout, block, and of "probe", "d6", "bf16", "rc=MODE"
ONE = [
    ("serial", (2, 32, 2, 256), 32, 4, 4, {}, "serial", ()),
    ("micro 2 of 8", (4, 64, 4, 256), 32, 8, 2, {}, "serial", ()),
    ("wide, long, vocab 512", (2, 128, 4, 512), 64, 4, 4, {}, "serial", ()),
    ("parallel block", (2, 64, 4, 256), 16, 4, 4, {}, "parallel", ()),
    ("seq-max 1024 of d6", (2, 32, 2, 256), 32, 4, 4, {}, "serial", ("d6",)),
    ("peak probed", (2, 32, 2, 256), 32, 4, 4, {}, "serial", ("probe",)),
    ("recompute gelu", (4, 64, 4, 256), 32, 8, 2, {}, "serial", ("rc=gelu",)),
    ("recompute ln", (4, 64, 4, 256), 32, 8, 2, {}, "serial", ("rc=ln",)),
    ("recompute gelu,ln", (4, 64, 4, 256), 32, 8, 2, {}, "serial", ("rc=gelu,ln",)),
    ("recompute ln, parallel", (2, 64, 4, 256), 16, 4, 4, {}, "parallel", ("rc=ln",)),
]
MPI = [
    ("tp2", (2, 64, 4, 256), 32, 4, 4, {"tp": 2}, "serial", ()),
    ("dp2", (2, 64, 4, 256), 32, 8, 4, {"dp": 2}, "serial", ()),
    ("pp2", (4, 64, 4, 256), 32, 8, 2, {"pp": 2}, "serial", ()),
    ("pp2 x vpp2", (4, 64, 4, 256), 32, 8, 2, {"pp": 2, "vpp": 2}, "serial", ()),
    ("dp2 bf16", (2, 64, 4, 256), 32, 8, 4, {"dp": 2}, "serial", ("bf16",)),
    ("pp2 probed, d6", (4, 64, 4, 256), 32, 8, 2, {"pp": 2}, "serial", ("probe", "d6")),
    ("tp2 recompute gelu", (2, 64, 4, 256), 32, 4, 4, {"tp": 2}, "serial", ("rc=gelu",)),
    ("pp2 recompute gelu,ln", (4, 64, 4, 256), 32, 8, 2, {"pp": 2}, "serial", ("rc=gelu,ln",)),
]


def cluster(ws, act_bytes=4):
    """The shipped CPU cluster file, at the trainer's one thread a rank (its op scratch is
    per thread) and the activations' bytes."""
    c = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "data", "clusters", "dev-cpu.json")))
    c["threads"] = 1
    c["act_bytes"] = act_bytes
    path = ws.path(f"cpu{act_bytes}.json")
    json.dump(c, open(path, "w"))
    return path


def check(ws, case):
    name, (layers, dim, heads, vocab), seq, batch, micro, layout, block, opts = case
    cl = cluster(ws, 2 if "bf16" in opts else 4)
    model = ["--layers", str(layers), "--dim", str(dim), "--heads", str(heads),
             "--vocab", str(vocab), "--block", block]
    if "d6" in opts:  # the preset's seq-max (1024) for the position table, in both
        model = ["--model", "d6", *model]
    ranks = layout.get("dp", 1) * layout.get("tp", 1) * layout.get("pp", 1)
    lay = [x for k, v in layout.items() for x in ("--" + k, str(v))]
    metrics = ws.path(f"m_{len(os.listdir(ws.dir))}.jsonl")
    args = ["train", "--train-data", ws.shard, *model, "--seq", str(seq),
            "--batch", str(batch), "--micro-batch", str(micro), "--steps", "2", "--threads", "1",
            "--log-every", "100", "--trace-dir", "none", "--metrics", metrics, *lay]
    if "d6" not in opts:
        args += ["--seq-max", str(seq)]
    if "probe" not in opts:
        args += ["--peak-flops", "1e11"]
    if "bf16" in opts:
        args += ["--cpu-dtype", "bf16"]
    rc = [x for o in opts if o.startswith("rc=") for x in ("--recompute", o[3:])]
    args += rc
    r = cc.run(ws, args) if ranks == 1 else cc.mpi(ws, ranks, args)
    if r.returncode != 0 and "--cpu-dtype bf16: " in r.stderr:
        print(f"SKIP {name}: the bf16 mode cannot run here: {r.stderr.strip().splitlines()[-1]}")
        return
    if not cc.ok(r.returncode == 0 and os.path.exists(metrics), f"{name}: trains", r.stderr):
        return
    steps = [json.loads(x) for x in open(metrics) if '"loss"' in x]
    measured = steps[-1].get("peak_dev_mb", 0) * 1e6
    popts = [x for k, v in layout.items() if k != "dp" for x in ("--" + k, str(v))]
    p = cc.run(ws, ["plan", "--cluster", cl, *model, "--seq", str(seq), "--batch", str(batch),
                    "--micro-batch", str(micro), "--gpus", str(ranks), "--features", "ours",
                    *popts, *rc, *([] if "probe" in opts else ["--probe", "0"]), "--json"])
    if not cc.ok(p.returncode == 0, f"{name}: plans", p.stderr):
        return
    j = json.loads(p.stdout)
    predicted = (j["memory_gb_per_gpu"] - j["memory"]["reserved_gb"]) * 1e9
    err = (predicted - measured) / measured if measured > 0 else float("inf")
    print(f"{name:24s} measured {measured / 1e6:8.3f} MB  predicted {predicted / 1e6:8.3f} MB"
          f"  {100 * err:+.2f}%")
    cc.ok(abs(err) <= TOL, f"{name}: predicted within {100 * TOL:.0f}% of the trainer's peak",
          json.dumps(j["memory"]))
    if layout.get("pp"):  # rank 0's figure is stage 0's: it must be the busiest stage
        cc.ok(j["memory"]["in_flight"] > 1, f"{name}: stage 0, holding the most sets, counts",
              json.dumps(j["memory"]))


def main():
    mpi = "--mpi" in sys.argv
    if mpi and not cc.MPIRUN:
        print("SKIP: no mpirun")
        return 77
    ws = cc.Workspace("ms_plan_mem_")
    for case in MPI if mpi else ONE:
        check(ws, case)
    ws.close()
    return cc.summary()


if __name__ == "__main__":
    sys.exit(main())
