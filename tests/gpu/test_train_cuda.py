"""The trainer on the CUDA backend against the CPU backend, end to end:

1. a 20-step run on --device cuda follows the CPU backend's loss curve
   within bf16 tolerance (every step within 3% relative; the loss falls by
   the same amount), serial block and parallel block with a sliding window;
2. DP2 x TP2 on ONE GPU (four ranks sharing it, the communicator staging
   device buffers through pinned host memory, bf16 reductions over MPI)
   follows the single-GPU run (1% relative per step; final weights within
   5% relative L2 per tensor: tensor parallelism sums partial products in
   bf16), and PP2 x DP2 likewise (final weights within 1%);
3. --device cuda without a usable GPU fails with a clear message, a bad
   --comm is named, --comm nccl without NCCL fails naming the group and
   --comm mpi stages (only on the emulator, which can pretend to have no GPU
   and has no NCCL); MS_CUDA_PROFILE (or --cuda-profile) prints its per-op
   table and --cuda-fuse-gelu 0 reaches the backend (everywhere).

MS_BIN is the program under test: the real megascale (label gpu, on a GPU
machine) or megascale_emu (label cuda_emu: the same trainer with the CUDA
backend's kernels running on the CPU emulator of tests/cuda_emu, which is
how CI runs this without a GPU).  MS_GPU_SIZE=small keeps the model tiny
(the emulator runs every GPU thread as a CPU fiber).  Exits 77 (skipped)
when there is no GPU."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from array import array

BIN = os.environ["MS_BIN"]
EMU = os.environ.get("MS_GPU_EMU") == "1"
MPIRUN = shutil.which("mpirun")
counts = {"passed": 0, "failed": 0}


def ok(cond, what, detail=""):
    if cond:
        counts["passed"] += 1
    else:
        counts["failed"] += 1
        print(f"FAIL: {what}\n{detail[-3000:]}")


def run(args, n=1, env=None, timeout=1800):
    cmd = [BIN, *args]
    if n > 1:
        cmd = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", str(n), *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=env,
                          timeout=timeout)


def losses(path):
    return [json.loads(l)["loss"] for l in open(path) if '"loss"' in l]


def read_st(path):
    """name -> array('f') of an f32 safetensors file."""
    b = open(path, "rb").read()
    (hl,) = struct.unpack("<Q", b[:8])
    hdr = json.loads(b[8:8 + hl])
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        assert v["dtype"] == "F32", (k, v["dtype"])
        s, e = v["data_offsets"]
        a = array("f")
        a.frombytes(b[8 + hl + s:8 + hl + e])
        out[k] = a
    return out


def weights_err(a, b, C):
    """Worst per-tensor relative L2 difference.  The attention key bias is
    compared on its q and v parts only: its gradient is exactly zero in exact
    arithmetic, so Adam turns rounding noise into steps of random sign (see
    tests/torch/test_gpt.py)."""
    x, y = read_st(a), read_st(b)
    worst, where = 0.0, ""
    for k in x:
        u, v = x[k], y[k]
        if k.endswith("attn.c_attn.bias"):
            u, v = u[:C] + u[2 * C:], v[:C] + v[2 * C:]
        num = sum((p - q) ** 2 for p, q in zip(u, v)) ** 0.5
        den = max(sum(p * p for p in u) ** 0.5, 1e-30)
        if os.environ.get("MS_GPU_VERBOSE"):
            print(f"  {k}: {num / den:.2e}")
        if num / den > worst:
            worst, where = num / den, k
    return worst, where


def curve_err(a, b):
    if not a or len(a) != len(b):
        return 1.0
    return max(abs(x - y) / abs(x) for x, y in zip(a, b))


def main():
    d = tempfile.mkdtemp(prefix="ms_gpu_")
    shard = os.path.join(d, "t.bin")
    text = ("In the beginning God created the heaven and the earth. And the earth was without "
            "form, and void; and darkness was upon the face of the deep. " * 300).encode()
    header = [0] * 256
    header[0], header[1], header[2] = 20240520, 1, len(text)
    open(shard, "wb").write(struct.pack("<256i", *header) + struct.pack(f"<{len(text)}H", *text))

    probe = run(["train", "--train-data", shard, "--device", "cuda", "--vocab", "256",
                 "--layers", "1", "--dim", "64", "--heads", "1", "--seq-max", "16", "--seq", "16",
                 "--batch", "1", "--steps", "1", "--peak-flops", "1e12"])
    if probe.returncode and "no usable GPU" in probe.stderr:
        print("SKIP: " + probe.stderr.strip().splitlines()[-1])
        shutil.rmtree(d)
        sys.exit(77)
    ok(probe.returncode == 0, "a one-step CUDA run succeeds", probe.stderr)

    if EMU:  # the emulator runs every GPU thread on the CPU: keep it tiny
        C, H, L, T, B = 64, 2, 2, 32, 4
    else:
        C, H, L, T, B = 256, 4, 4, 128, 16
    # lr 1e-3 with a 5-step warm-up: a smooth curve.  At 3e-3 without one
    # both backends spiked at step 6 (loss 2.9 -> 7.5) and on the H200 bf16
    # rounding put the CUDA curve 3.6% off the CPU's after the spike, though
    # the final losses agreed to 0.2%: a parity test needs a stable run.
    base = ["train", "--train-data", shard, "--vocab", "256", "--layers", str(L), "--dim", str(C),
            "--heads", str(H), "--seq-max", str(T), "--seq", str(T), "--batch", str(B),
            "--steps", "20", "--lr", "1e-3", "--warmup", "5", "--log-every", "100",
            "--peak-flops", "1e12",
            "--threads", "1", "--eps", "1e-6", "--data-order", "sequential"]

    # 1. CUDA vs CPU, 20 steps
    for label, extra in (("serial", []), ("parallel W=8", ["--block", "parallel",
                                                           "--attn-window", "8"])):
        mc, mg = os.path.join(d, "cpu.jsonl"), os.path.join(d, "gpu.jsonl")
        cpu = run([*base, *extra, "--device", "cpu", "--metrics", mc])
        gpu = run([*base, *extra, "--device", "cuda", "--metrics", mg])
        if cpu.returncode or gpu.returncode:
            ok(False, f"{label}: both runs succeed", cpu.stderr + gpu.stderr)
            continue
        a, b = losses(mc), losses(mg)
        err = curve_err(a, b)
        ok(err <= 3e-2, f"{label}: CUDA loss curve follows the CPU's (worst rel {err:.2e})",
           f"cpu {a}\ncuda {b}")
        ok(b[-1] < b[0] - 0.3, f"{label}: the CUDA loss falls", str(b))
        drop_c, drop_g = a[0] - a[-1], b[0] - b[-1]
        ok(abs(drop_c - drop_g) <= 0.05 * drop_c + 0.02,
           f"{label}: same loss drop (cpu {drop_c:.4f}, cuda {drop_g:.4f})")
        print(f"cuda vs cpu {label}: worst step rel {err:.2e}; final {a[-1]:.4f} vs {b[-1]:.4f}")

    # 2. several ranks on one GPU through MPI staging vs one GPU
    if not MPIRUN:
        print("note: mpirun not found; the multi-rank cases are not run")
    else:
        w1 = os.path.join(d, "w1.st")
        m1 = os.path.join(d, "one.jsonl")
        one = run([*base, "--device", "cuda", "--metrics", m1, "--save-weights", w1])
        ok(one.returncode == 0, "single-GPU reference run succeeds", one.stderr)
        # (label, ranks, layout, final-weights bound): tensor parallelism sums
        # row-parallel partial products in bf16 (each partial rounded, then the
        # sum rounded again: ~2^-9 relative per layer that one GPU does not
        # have), which Adam's normalised steps carry into every weight: ~1e-2
        # relative after 20 steps (seen: 1.0-2.0e-2 on the emulator).  Data
        # and pipeline parallelism only move and sum fp32 gradients: ~2e-3.
        for label, n, layout, wtol in (("dp2 x tp2", 4, ["--dp", "2", "--tp", "2"], 5e-2),
                                       ("pp2 x dp2", 4, ["--pp", "2", "--dp", "2"], 1e-2)):
            m2, w2 = os.path.join(d, "many.jsonl"), os.path.join(d, "w2.st")
            many = run([*base, *layout, "--device", "cuda", "--metrics", m2, "--save-weights",
                        w2], n=n)
            if one.returncode or many.returncode:
                ok(False, f"{label} on one GPU: run succeeds", many.stdout + many.stderr)
                continue
            ok("staged through pinned host memory" in many.stderr,
               f"{label}: the log says device buffers are staged",
               many.stderr)
            a, b = losses(m1), losses(m2)
            err = curve_err(a, b)
            ok(err <= 1e-2, f"{label}: loss curve = single GPU (worst rel {err:.2e})",
               f"one {a}\nmany {b}")
            werr, where = weights_err(w1, w2, C)
            ok(werr <= wtol,
               f"{label}: final weights = single GPU within {wtol:g} (worst {werr:.2e} {where})")
            print(f"{label} on one GPU: loss rel {err:.2e}, weights rel {werr:.2e} ({where})")

    # the op profile: every kind of op is timed and the table is printed
    r = run([*base[:base.index("--steps")], "--steps", "2", "--device", "cuda", "--peak-flops",
             "1e12"], env=dict(os.environ, MS_CUDA_PROFILE="1"))
    table = r.stderr[r.stderr.find("cuda profile ("):]
    ok(r.returncode == 0 and all(op in table for op in (
        "attention_fwd", "attention_bwd", "layernorm_bwd", "classifier_fwd_bwd", "adamw_step",
        "gemm NN", "gemm TN", "+gelu")), "MS_CUDA_PROFILE prints the per-op table", r.stderr)
    # the same options on the command line (they win over the environment)
    r = run([*base[:base.index("--steps")], "--steps", "2", "--device", "cuda", "--peak-flops",
             "1e12", "--cuda-profile", "1", "--cuda-fuse-gelu", "0"],
            env=dict(os.environ, MS_CUDA_PROFILE="0", MS_CUDA_FUSE_GELU="1"))
    ok(r.returncode == 0 and "cuda profile (" in r.stderr and "GeLU unfused" in r.stderr,
       "--cuda-profile 1 and --cuda-fuse-gelu 0 reach the backend", r.stderr)
    # --recompute gelu: the backward's recomputed GeLU is the forward's, so the forward runs it
    # unfused (cuBLASLt's fused one is of the fp32 product, the recompute's of the kept bf16
    # value): the bits of --cuda-fuse-gelu 0 without recompute (they differed from step 2)
    sts = []
    for extra in (["--recompute", "gelu"], ["--recompute", "none", "--cuda-fuse-gelu", "0"]):
        w = os.path.join(d, f"rc{len(sts)}.st")
        r = run([*base[:base.index("--steps")], "--steps", "3", "--device", "cuda",
                 "--peak-flops", "1e12", *extra, "--save-weights", w])
        sts.append(open(w, "rb").read() if r.returncode == 0 and os.path.exists(w) else None)
    ok(sts[0] is not None and sts[0] == sts[1],
       "--recompute gelu on cuda: the same bits as the unfused GeLU without recompute")
    # a head size past the attention's 128: refused when the model is made (it aborted with a
    # core dump in the first forward)
    r = run([*base[:base.index("--dim")], "--dim", "256", "--heads", "1",
             *base[base.index("--heads") + 2:base.index("--steps")], "--steps", "1", "--device",
             "cuda", "--peak-flops", "1e12"])
    ok(r.returncode == 2 and "head size 256" in r.stderr and "(128)" in r.stderr,
       "a head size of 256 on cuda: a usage error naming the limit", r.stderr[-800:])

    # 3. no GPU: a clear error (the emulator can pretend); --comm choices
    if EMU:
        short = [*base[:base.index("--steps")], "--steps", "1", "--device", "cuda",
                 "--peak-flops", "1e12"]
        r = run([*short, "--comm", "bogus"])
        ok(r.returncode != 0 and "--comm bogus" in r.stderr, "a bad --comm is named", r.stderr)
        if MPIRUN:  # the emulator has no NCCL: auto stages, nccl refuses
            r = run([*short, "--dp", "2", "--comm", "nccl"], n=2)
            ok(r.returncode != 0 and "--comm nccl: dp group" in r.stderr,
               "--comm nccl without NCCL fails naming the group", r.stdout + r.stderr)
            r = run([*short, "--dp", "2", "--comm", "mpi"], n=2)
            ok(r.returncode == 0 and "as --comm mpi asks" in r.stderr,
               "--comm mpi stages device buffers", r.stdout + r.stderr)
        # the peak probed, not given: a device this slow gets a smaller probe (its
        # 8192^3 bf16 product ran for more than 10 minutes here before)
        try:
            r = run([*base[:base.index("--steps")], "--steps", "3", "--device", "cuda"],
                    timeout=300)
            line = next((l for l in r.stderr.splitlines() if "MFU against a peak" in l), "")
            ok(r.returncode == 0 and "not 8192^3" in line and "bf16) on cuda-emu" in line,
               "the peak probe on a slow device is sized to it, and says so", r.stderr[-1500:])
        except subprocess.TimeoutExpired:
            ok(False, "the peak probe on a slow device is sized to it", "ran past 300 s")
        env = dict(os.environ, MS_EMU_NO_DEVICE="1")
        r = run(base + ["--device", "cuda"], env=env)
        ok(r.returncode != 0 and "no usable GPU" in r.stderr,
           "--device cuda without a GPU names the problem", r.stderr)

    print(f"{counts['passed']} passed, {counts['failed']} failed")
    if not counts["failed"]:
        shutil.rmtree(d)
    sys.exit(1 if counts["failed"] else 0)


if __name__ == "__main__":
    main()
