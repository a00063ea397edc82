#!/usr/bin/python3
"""bench/cpu_step: megascale vs PyTorch on the CPU, same model, same
threads, same run.  For each case it trains N steps with each program on
random tokens and reports the median ms/step (first steps dropped as warm-up),
tokens/s, peak RSS and the ratio megascale/PyTorch in tokens/s.  It also
measures the machine's limits in the same run (`megascale diag`: the sgemm
rate at 2048^3 and the memory bandwidth of three STREAM-style kernels,
copy, triad and an in-place update, before and after the cases and just
before and after each megascale run, the best of them all) and prints, for
megascale, the step's fraction of the sgemm peak (the model's FLOPs per
step / step time / peak; and "near": against the better of the two probes
around that run, since a shared machine's speed moves from minute to
minute) and the optimizer's
fraction of the bandwidth (36 bytes a parameter: the gradient norm reads g,
AdamW reads w, g, m, v and writes w, m, v and g = 0, the next step's zeroed
gradients / its time; against the best of
the three kernels, the in-place update as a rule, which has the
optimizer's access pattern), the machine's limit for the step (its FLOPs
at the sgemm rate plus the optimizer's bytes at the bandwidth) and so the
largest speedup over PyTorch the machine allows, and the instruction set
the binary was compiled for and the CPU has.
With --cpu-dtype fp32,bf16 (the default) each case also runs megascale's
bf16 mode (--cpu-dtype bf16: bf16 activations and GEMMs, fp32 master
weights) against the same fp32 PyTorch run, where the CPU has AVX512-BF16.
With --optimizer adamw,lamb (the default) each case also runs megascale
with LAMB, whose optimizer moves 48 bytes a parameter (the norm reads g;
the moments read g, w, m, v and write u, m, v; the trust-ratio step reads
w, u and writes w and u = 0); PyTorch has no LAMB, so those rows compare
with its AdamW step and print no "max".  With --cpu-dtype bf16 either
optimizer also writes the bf16 copy of the weights: 2 bytes a parameter
more.
With --llmc DIR (or LLMC_DIR), a checkout of karpathy/llm.c that the user
provides (megascale neither ships nor fetches it), each case also runs
llm.c's CPU trainer: bench/llmc_step.c, built here against DIR/train_gpt2.c
with llm.c's own flags (-Ofast -march=native -fopenmp), on a random model
file in llm.c's format of the case's shape and the same tokens.
usage: bench/cpu_step.py [--bin build/megascale] [--steps N] [--threads 2]
                         [--cases d12:4:64,d6:8:256] [--cpu-dtype fp32,bf16]
                         [--optimizer adamw,lamb] [--llmc DIR]"""
import argparse
import itertools
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
# the optimizer's bytes a parameter (see the docstring)
OPT_BYTES = {"adamw": 36, "lamb": 48}
PRESETS = {"d6": (6, 384, 6), "d12": (12, 768, 12), "d24": (24, 1024, 16)}


def write_shard(path, n, vocab, seed=1):
    import random
    rnd = random.Random(seed)
    header = [0] * 256
    header[0], header[1], header[2] = 20240520, 1, n
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{n}H", *[rnd.randrange(vocab) for _ in range(n)]))


def write_llmc_model(path, L, C, H, V=50257, Vp=50304, max_t=1024, seed=1):
    """A model file in llm.c's format (gpt2_build_from_checkpoint: 256 int32
    header words, then the fp32 tensors in its order) of the given shape:
    layer-norm weights 1, biases 0, the rest N(0, 0.02)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    header = np.zeros(256, np.int32)
    header[:8] = [20240326, 3, max_t, V, L, H, C, Vp]
    tensors = [((Vp, C), "n"), ((max_t, C), "n"), ((L, C), 1), ((L, C), 0), ((L, 3 * C, C), "n"),
               ((L, 3 * C), 0), ((L, C, C), "n"), ((L, C), 0), ((L, C), 1), ((L, C), 0),
               ((L, 4 * C, C), "n"), ((L, 4 * C), 0), ((L, C, 4 * C), "n"), ((L, C), 0),
               ((C,), 1), ((C,), 0)]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        for shape, init in tensors:
            if init == "n":
                a = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
            else:
                a = np.full(shape, init, np.float32)
            f.write(a.tobytes())


def build_llmc(src, out_dir):
    """(path of bench/llmc_step built against the llm.c checkout src, None) or
    (None, why not)."""
    if not src:
        return None, ("no llm.c checkout given (--llmc DIR or LLMC_DIR: a clone of "
                      "karpathy/llm.c, built here with its own flags)")
    if not os.path.isfile(os.path.join(src, "train_gpt2.c")):
        return None, f"{src}/train_gpt2.c does not exist (--llmc names a checkout of llm.c)"
    exe = os.path.join(out_dir, "llmc_step")
    cc = os.environ.get("CC", "cc")
    r = subprocess.run([cc, "-Ofast", "-march=native", "-fopenmp", "-DOMP", "-Wno-unused-result",
                        "-I", src, os.path.join(HERE, "llmc_step.c"), "-o", exe, "-lm"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return None, f"building llm.c's train_gpt2.c from {src} failed: {r.stderr.strip()[-400:]}"
    return exe, None


def json_ms(out):
    """The "ms" of each JSON line a peer prints, one a step (torch_gpt_step.py,
    llmc_step.c)."""
    return [json.loads(l)["ms"] for l in out.splitlines() if l.startswith("{")]


def measure(cmd, env, parse):
    """Run cmd as a child, return (ms list, peak RSS MB)."""
    import resource
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    pid = os.fork()
    if pid == 0:
        fd = os.open(os.path.join(env["MS_BENCH_DIR"], "child.out"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        fe = os.open(os.path.join(env["MS_BENCH_DIR"], "child.err"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fe, 2)
        os.execvpe(cmd[0], cmd, env)
    _, status, ru = os.wait4(pid, 0)
    out = open(os.path.join(env["MS_BENCH_DIR"], "child.out")).read()
    if status != 0:
        err = open(os.path.join(env["MS_BENCH_DIR"], "child.err")).read()
        sys.exit(f"bench: {cmd[0]} failed (status {status}):\n{err[-3000:]}")
    return parse(out), ru.ru_maxrss / 1024.0


def machine_limits(binary, threads):
    """(sgemm GFLOP/s, {copy, triad, update} GB/s) from one `megascale diag
    --json` run."""
    out = subprocess.run([binary, "diag", "--json", "--threads", str(threads), "--fail-exit", "0"],
                         capture_output=True, text=True).stdout
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    mem = checks["memory"]
    return checks["gemm"]["value"], {"copy": mem["value"], "triad": mem.get("triad_gbps", 0),
                                     "update": mem.get("update_gbps", 0)}


def bf16_refused(binary):
    """None if `megascale train --cpu-dtype bf16` starts here, else its
    reason (no oneDNN in the build, a CPU without AVX512-BF16)."""
    r = subprocess.run([binary, "train", "--cpu-dtype", "bf16", "--steps", "1"],
                       capture_output=True, text=True)
    for line in r.stderr.splitlines():
        if "--cpu-dtype bf16: " in line:
            return line.split("--cpu-dtype bf16: ", 1)[1]
    return None


def isa_line(binary):
    """(the line naming the binary's and the CPU's instruction sets and the OpenBLAS
    core, the core's name or None, whether megascale chose it over OpenBLAS's own)."""
    ver = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
    flags = set()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    cpu = "AVX-512" if "avx512f" in flags else "AVX2 (no AVX-512)" if "avx2" in flags else "SSE"
    parts = ver.split("; ")
    built = next((p for p in parts if p.startswith("compiled for")), ver)
    blas = next((p for p in parts if p.startswith("OpenBLAS core")), "")
    gemm = next((p for p in parts if p.startswith("fp32 GEMMs")), "")
    core = blas.split()[2] if blas else None
    return (f"{built}; the CPU has {cpu}; {gemm + '; ' if gemm else ''}"
            f"{blas or 'OpenBLAS core unknown'}", core, "set by megascale" in blas)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "build", "megascale"))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cases", default="d12:4:64,d6:8:256")
    ap.add_argument("--torch-blas", choices=("same", "own"), default="same",
                    help="same: when megascale replaced OpenBLAS's own choice of kernels "
                         "(OPENBLAS_CORETYPE), PyTorch runs with the same kernels; own: with "
                         "what OpenBLAS picks by itself")
    ap.add_argument("--llmc", default=os.environ.get("LLMC_DIR"),
                    help="a checkout of karpathy/llm.c: each case also runs its CPU trainer "
                         "(train_gpt2.c, built with -Ofast -march=native -fopenmp)")
    ap.add_argument("--cpu-dtype", default="fp32,bf16",
                    help="megascale's --cpu-dtype values to run, each against the same PyTorch "
                         "(fp32) run; bf16 is left out, with the reason, where the CPU lacks it")
    ap.add_argument("--optimizer", default="adamw,lamb",
                    help="megascale's --optimizer values to run, each with each --cpu-dtype "
                         "and against the same PyTorch AdamW run")
    a = ap.parse_args()
    if a.warmup < 0 or a.steps <= a.warmup:
        sys.exit(f"bench: --steps {a.steps} must exceed --warmup {a.warmup} (>= 0): the medians "
                 "are over the steps after the warm-up")
    if a.threads < 1:
        sys.exit(f"bench: --threads {a.threads}: must be at least 1")
    cases = []
    for case in a.cases.split(","):
        parts = case.split(":")
        if (len(parts) != 3 or parts[0] not in PRESETS or not parts[1].isdigit()
                or not parts[2].isdigit() or int(parts[1]) < 1 or int(parts[2]) < 1):
            sys.exit(f"bench: --cases {case}: not model:B:T with model one of "
                     f"{', '.join(PRESETS)} and B, T positive integers (e.g. d12:4:64)")
        cases.append((parts[0], int(parts[1]), int(parts[2])))
    opts = a.optimizer.split(",")
    for o in opts:
        if o not in OPT_BYTES:
            sys.exit(f"bench: --optimizer {o}: not one of {', '.join(OPT_BYTES)}")
    if not os.access(a.bin, os.X_OK):
        sys.exit(f"bench: --bin {a.bin}: no such executable (build it first: make build)")
    missing = subprocess.run(["/usr/bin/python3", "-c", "import numpy, torch"],
                             capture_output=True, text=True)
    if missing.returncode != 0:
        sys.exit("bench: the PyTorch peer cannot run: /usr/bin/python3 lacks numpy or torch ("
                 + (missing.stderr.strip().splitlines() or ["?"])[-1]
                 + "); install them with scripts/install-deps.sh --test")
    isa, core, chosen = isa_line(a.bin)
    dtypes = a.cpu_dtype.split(",")
    for dt in dtypes:
        if dt not in ("fp32", "bf16"):
            sys.exit(f"bench: --cpu-dtype {dt}: not one of fp32, bf16")
    bf16_missing = bf16_refused(a.bin) if "bf16" in dtypes else None
    if bf16_missing:
        print(f"bf16 rows left out: {bf16_missing}")
        dtypes.remove("bf16")
        if not dtypes:
            sys.exit("bench: nothing to run: --cpu-dtype asks only for bf16, which this CPU or "
                     "build lacks (above)")
    rows = []
    gemm0, bw0 = machine_limits(a.bin, a.threads)
    probes = [(gemm0, bw0)]
    with tempfile.TemporaryDirectory() as d:
        shard = os.path.join(d, "rand.bin")
        write_shard(shard, 1 << 20, 50257)
        env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), MS_BENCH_DIR=d)
        llmc, llmc_missing = build_llmc(a.llmc, d)
        if llmc_missing:
            print(f"llm.c column left out: {llmc_missing}")
        for model, B, T in cases:
            case = f"{model}:{B}:{T}"
            L, C, H = PRESETS[model]
            metrics = os.path.join(d, "m.jsonl")
            torch_cmd = ["/usr/bin/python3", os.path.join(HERE, "torch_gpt_step.py"), str(L), str(C),
                         str(H), "50257", str(B), str(T), str(a.steps), str(a.threads)]
            torch_env = dict(env)
            if a.torch_blas == "same" and chosen and core:
                torch_env["OPENBLAS_CORETYPE"] = core
            torch_ms, torch_rss = measure(torch_cmd, torch_env, json_ms)
            tm = statistics.median(torch_ms[a.warmup:])
            lm = lrss = None
            if llmc:
                model_file = os.path.join(d, "llmc_model.bin")
                write_llmc_model(model_file, L, C, H)
                llmc_ms, lrss = measure([llmc, model_file, shard, str(B), str(T), str(a.steps)], env,
                                        json_ms)
                lm = statistics.median(llmc_ms[a.warmup:])
                os.remove(model_file)

            def parse_ours(_):
                lines = [json.loads(l) for l in open(metrics)]
                cfg = next(l for l in lines if l.get("type") == "config")
                steps = [l for l in lines if "loss" in l]
                return ([s["ms"] for s in steps], [s["mfu"] for s in steps],
                        [s["data_ms"] for s in steps], [s.get("dev_opt_ms", 0) for s in steps],
                        cfg["flops_per_token"], cfg["params"])
            for dt, opt_name in itertools.product(dtypes, opts):
                ours_cmd = [a.bin, "train", "--model", model, "--train-data", shard, "--batch",
                            str(B), "--seq", str(T), "--steps", str(a.steps), "--threads",
                            str(a.threads), "--data-order", "sequential", "--metrics", metrics,
                            "--log-every", "1000", "--cpu-dtype", dt, "--optimizer", opt_name]
                near0 = machine_limits(a.bin, a.threads)
                (ours_ms, ours_mfu, ours_data, ours_opt, fpt, params), ours_rss = measure(
                    ours_cmd, env, parse_ours)
                near1 = machine_limits(a.bin, a.threads)
                probes += [near0, near1]
                near = max(near0[0], near1[0])  # sgemm GFLOP/s around this run
                om = statistics.median(ours_ms[a.warmup:])
                mfu = statistics.median(ours_mfu[a.warmup:])
                wait = 100 * sum(ours_data[a.warmup:]) / sum(ours_ms[a.warmup:])
                opt = statistics.median(ours_opt[a.warmup + 1:] or [0])  # of the previous step
                label = " ".join([case] + [x for x in (dt, opt_name)
                                           if x not in ("fp32", "adamw")])
                rows.append((label, om, B * T / om * 1e3, ours_rss, mfu, wait, tm,
                             B * T / tm * 1e3, torch_rss, fpt * B * T, opt, params, lm, lrss,
                             near, dt, opt_name))
    probes.append(machine_limits(a.bin, a.threads))
    gemm = max(g for g, _ in probes)
    kinds = {k: max(m[k] for _, m in probes) for k in bw0}
    best = max(kinds, key=kinds.get)
    bw = kinds[best]
    print(f"\nmachine: sgemm {gemm:.1f} GFLOP/s at 2048^3 (best of {len(probes)} probes: first "
          f"{probes[0][0]:.1f}, last {probes[-1][0]:.1f}, lowest {min(g for g, _ in probes):.1f}); "
          "memory " + ", ".join(f"{k} {v:.2f}" for k, v in kinds.items())
          + f" GB/s (best of {len(probes)}), bandwidth = {best} {bw:.2f} GB/s; {a.threads} "
          f"threads; {isa}")
    if chosen:
        print("PyTorch ran with " + (f"OPENBLAS_CORETYPE={core} too (the same kernels; "
                                     "--torch-blas own for OpenBLAS's own choice)"
                                     if a.torch_blas == "same" else
                                     "the kernels OpenBLAS picks by itself (--torch-blas own)"))
    print(f"\n{'case':<17} {'ours ms':>9} {'ours tok/s':>10} {'ours RSS':>9} {'MFU':>6} "
          f"{'of sgemm':>8} {'near':>7} {'sgemm':>6} {'opt ms':>7} {'opt bw':>7} {'data wait':>9} "
          f"{'torch ms':>9} "
          f"{'torch tok/s':>11} {'torch RSS':>9} {'speedup':>8} {'limit ms':>8} {'max':>6}"
          + (f" {'llm.c ms':>9} {'llm.c RSS':>9} {'vs llm.c':>8}" if llmc else ""))
    for (case, om, ot, orss, mfu, wait, tm, tt, trss, flops, opt, params, lm, lrss, near, dt,
         opt_name) in rows:
        of_gemm = flops / (om / 1e3) / (gemm * 1e9)
        of_near = flops / (om / 1e3) / (near * 1e9)
        # the optimizer's bytes at the bandwidth (bf16: and the weights' bf16 copy)
        opt_s = (OPT_BYTES[opt_name] + (2 if dt == "bf16" else 0)) * params / (bw * 1e9)
        opt_bw = opt_s / (opt / 1e3) if opt > 0 else 0
        # the machine's limit for this step: its FLOPs at the best sgemm
        # rate plus the optimizer's time at the bandwidth (fp32 rows only:
        # a bf16 row's GEMMs are not bound by the fp32 rate)
        lim = f"{'-':>8} {'-':>6}"
        if dt == "fp32":
            limit = (flops / (gemm * 1e9) + opt_s) * 1e3
            most = f"{tm / limit:5.2f}x" if opt_name == "adamw" else f"{'-':>6}"
            lim = f"{limit:8.1f} {most}"
        print(f"{case:<17} {om:9.1f} {ot:10.0f} {orss:8.0f}M {100 * mfu:5.1f}% "
              f"{100 * of_gemm:7.1f}% {100 * of_near:6.1f}% {near:6.1f} {opt:7.1f} "
              f"{100 * opt_bw:6.1f}% {wait:8.3f}% "
              f"{tm:9.1f} {tt:11.0f} {trss:8.0f}M {ot / tt:7.2f}x {lim}"
              + (f" {lm:9.1f} {lrss:8.0f}M {lm / om:7.2f}x" if lm else ""))
    print(f"(median of {a.steps - a.warmup} steps after {a.warmup} warm-up steps, "
          f"{a.threads} threads; case = model:B:T, and bf16: --cpu-dtype bf16 against the same "
          f"fp32 PyTorch run; MFU against the trainer's probed peak (a bf16 GEMM's in bf16); of "
          f"sgemm = the step's FLOPs / time / the fp32 sgemm rate above, the best of all probes "
          f"(bf16 GEMMs can exceed it); near = the same against the better of the two probes "
          f"taken just before and just after this run (sgemm, GFLOP/s: the machine's speed moves "
          f"from minute to minute on shared hosts); opt bw = the optimizer's bytes (AdamW 36 B "
          f"a parameter, LAMB 48, 2 more with bf16) / its time / the bandwidth above; "
          f"limit ms = the step's FLOPs at the sgemm rate plus the optimizer's bytes at the "
          f"bandwidth, the fastest this "
          f"machine allows an fp32 step; max = PyTorch's ms / limit ms, the largest speedup "
          f"over PyTorch this machine allows (AdamW rows; a lamb row runs LAMB against "
          f"PyTorch's AdamW); vs llm.c = llm.c's ms / ours; "
          f"data wait = time the step waited for its batch / step time)")


if __name__ == "__main__":
    main()
