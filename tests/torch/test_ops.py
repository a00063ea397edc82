#!/usr/bin/env python3
"""test_ops.py - PyTorch parity of the CPU backend's ops.

Runs ops_dump (path in argv[1], or $MS_OPS_DUMP) to get every op's inputs
and outputs, recomputes each op in float64 with torch (autograd for the
backward ops) and checks max|ours - ref| / max|ref| <= 1e-5 per array.
Prints one line per array and a final "N passed, N failed"; exits 1 on any
failure and 77 (skip) when torch cannot be imported.
"""
import os
import struct
import subprocess
import sys
import tempfile

TOL = 1e-5


def import_torch():
    """Import torch; if this interpreter lacks it but the system python3 has
    it (a pyenv/venv python first on PATH), re-run the test with that one."""
    try:
        import numpy  # noqa: F401
        import torch  # noqa: F401
        return
    except ImportError as e:
        err = e
    for cand in ("/usr/bin/python3",):
        if (os.path.exists(cand) and os.path.realpath(cand) != os.path.realpath(sys.executable)
                and not os.environ.get("MS_TORCH_REEXEC")):
            ok = subprocess.run([cand, "-c", "import torch, numpy"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if ok.returncode == 0:
                os.environ["MS_TORCH_REEXEC"] = "1"
                os.execv(cand, [cand] + sys.argv)
    print(f"SKIP: torch/numpy not importable ({err}); install python3-torch")
    sys.exit(77)


import_torch()
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

torch.set_default_dtype(torch.float64)


def load(path):
    """Returns {case: {array: np.ndarray float32}} from an ops_dump file."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"MSOPDUMP":
        raise ValueError(f"{path}: bad magic")
    (version,) = struct.unpack_from("<I", data, 8)
    if version != 1:
        raise ValueError(f"{path}: unsupported version {version}")
    off, cases = 12, {}
    while off < len(data):
        (n,) = struct.unpack_from("<I", data, off)
        name = data[off + 4:off + 4 + n].decode()
        off += 4 + n
        (nd,) = struct.unpack_from("<I", data, off)
        dims = struct.unpack_from(f"<{nd}Q", data, off + 4)
        off += 4 + 8 * nd
        count = int(np.prod(dims)) if nd else 1
        if off + 4 * count > len(data):
            raise ValueError(f"{path}: {name} truncated")
        arr = np.frombuffer(data, dtype="<f4", count=count, offset=off).reshape(dims)
        off += 4 * count
        case, arr_name = name.split("/", 1)
        cases.setdefault(case, {})[arr_name] = arr
    return cases


class Checker:
    def __init__(self):
        self.passed = self.failed = 0

    def check(self, case, name, ours, ref):
        ours = np.asarray(ours, dtype=np.float64)
        ref = ref.detach().numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref)
        ref = ref.astype(np.float64)
        if ours.shape != ref.shape:
            ok, msg = False, f"shape {ours.shape} vs {ref.shape}"
        else:
            scale = max(np.abs(ref).max(), 1e-30) if ref.size else 1.0
            err = np.abs(ours - ref).max() / scale if ref.size else 0.0
            ok = bool(err <= TOL)
            msg = f"rel err {err:.3g}"
        print(f"{'ok  ' if ok else 'FAIL'} {case:28s} {name:8s} {msg}")
        if ok:
            self.passed += 1
        else:
            self.failed += 1


def t(a, grad=False):
    return torch.tensor(np.asarray(a, dtype=np.float64), requires_grad=grad)


def check_embedding(ck, cs, d):
    tok = torch.tensor(d["tok"].astype(np.int64))
    wte, wpe = t(d["wte"], True), t(d["wpe"], True)
    T = tok.shape[1]
    out = wte[tok] + wpe[:T].unsqueeze(0)
    (out * t(d["dout"])).sum().backward()
    ck.check(cs, "out", d["out"], out)
    ck.check(cs, "dwte", d["dwte"], wte.grad)
    ck.check(cs, "dwpe", d["dwpe"], wpe.grad)


def check_layernorm(ck, cs, d):
    x, w, b = t(d["inp"], True), t(d["w"], True), t(d["b"], True)
    out = F.layer_norm(x, (x.shape[1],), w, b, eps=1e-5)
    (out * t(d["dout"])).sum().backward()
    xd = x.detach()
    ck.check(cs, "out", d["out"], out)
    ck.check(cs, "mean", d["mean"], xd.mean(1))
    ck.check(cs, "rstd", d["rstd"], 1.0 / torch.sqrt(xd.var(1, unbiased=False) + 1e-5))
    ck.check(cs, "dinp", d["dinp"], x.grad)
    ck.check(cs, "dw", d["dw"], w.grad)
    ck.check(cs, "db", d["db"], b.grad)


def check_gemm(ck, cs, d):
    ta, tb, alpha, beta, gelu = d["params"].tolist()
    A, B = t(d["A"]), t(d["B"])
    A = A.T if ta else A
    B = B.T if tb else B
    if gelu:
        pre = A @ B + t(d["bias"])
        ck.check(cs, "pre", d["pre"], pre)
        ck.check(cs, "C", d["C"], F.gelu(pre, approximate="tanh"))
    else:
        ck.check(cs, "C", d["C"], alpha * (A @ B) + beta * t(d["C0"]) + t(d["bias"]))


def check_elementwise(ck, cases):
    d = cases["bias_bwd"]
    ck.check("bias_bwd", "dbias", d["dbias"], t(d["dout"]).sum(0))
    d = cases["gelu"]
    x = t(d["x"], True)
    y = F.gelu(x, approximate="tanh")
    (y * t(d["dy"])).sum().backward()
    ck.check("gelu", "y", d["y"], y)
    ck.check("gelu", "dx", d["dx"], x.grad)
    d = cases["residual"]
    ck.check("residual", "out", d["out"], t(d["a"]) + t(d["b"]))


def check_attention(ck, cs, d):
    B, T, C, NH, W = (int(v) for v in d["params"].tolist())
    hs = C // NH
    qkv = t(d["qkv"], True)
    q, k, v = (z.view(B, T, NH, hs).transpose(1, 2) for z in qkv.split(C, dim=2))
    s = (q @ k.transpose(-1, -2)) / (hs ** 0.5)
    i = torch.arange(T).view(T, 1)
    j = torch.arange(T).view(1, T)
    mask = j <= i
    if W > 0:
        mask = mask & (j > i - W)
    P = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1)
    out = (P @ v).transpose(1, 2).reshape(B, T, C)
    (out * t(d["dout"])).sum().backward()
    ck.check(cs, "out", d["out"], out)
    ck.check(cs, "P", d["P"], P)
    masked = np.broadcast_to(~mask.numpy(), d["P"].shape)
    zero = not np.any(d["P"][masked] != 0.0)
    print(f"{'ok  ' if zero else 'FAIL'} {cs:28s} P=0      masked probabilities exactly 0")
    if zero:
        ck.passed += 1
    else:
        ck.failed += 1
    ck.check(cs, "dqkv", d["dqkv"], qkv.grad)


def check_classifier(ck, cs, d):
    V, Vp, dloss = d["params"].tolist()
    V, Vp = int(V), int(Vp)
    x, wte = t(d["x"], True), t(d["wte"], True)
    tgt = torch.tensor(d["targets"].astype(np.int64))
    losses = F.cross_entropy(x @ wte[:V].T, tgt, reduction="none")
    (dloss * losses.sum()).backward()
    ck.check(cs, "losses", d["losses"], losses)
    ck.check(cs, "dx", d["dx"], x.grad)
    ck.check(cs, "dwte", d["dwte"], wte.grad)  # padded rows: torch's grad is 0 there


def check_optim(ck, cases):
    d = cases["adamw"]
    lr, b1, b2, eps, wd, gs = d["params"].tolist()
    w = t(d["w0"], True)
    opt = torch.optim.AdamW([w], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    for step in (1, 2, 3):
        w.grad = t(d[f"g{step}"]) * gs
        opt.step()
    st = opt.state[w]
    ck.check("adamw", "w", d["w"], w)
    ck.check("adamw", "m", d["m"], st["exp_avg"])
    ck.check("adamw", "v", d["v"], st["exp_avg_sq"])

    d = cases["lamb"]
    b1, b2, eps, wd, step_t, gs, step = d["params"].tolist()
    w, g = t(d["w"]), t(d["g"]) * gs
    m = b1 * t(d["m0"]) + (1 - b1) * g
    v = b2 * t(d["v0"]) + (1 - b2) * g * g
    u = (m / (1 - b1 ** step_t)) / (torch.sqrt(v / (1 - b2 ** step_t)) + eps) + wd * w
    ck.check("lamb", "u", d["u"], u)
    ck.check("lamb", "m", d["m"], m)
    ck.check("lamb", "v", d["v"], v)
    ck.check("lamb", "sq", d["sq"], torch.stack([(w * w).sum(), (u * u).sum()]))
    ck.check("lamb", "w_new", d["w_new"], w - step * t(d["u"]))

    d = cases["reduce"]
    x = t(d["x"])
    ck.check("reduce", "sums", d["sums"], torch.stack([x.sum(), (x * x).sum()]))


def main():
    exe = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("MS_OPS_DUMP")
    if not exe:
        print("usage: test_ops.py PATH_TO_ops_dump")
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ops.bin")
        rc = subprocess.run([exe, path]).returncode
        if rc != 0:
            print(f"FAIL: {exe} exited with {rc}")
            print("0 passed, 1 failed")
            return 1
        cases = load(path)
    ck = Checker()
    for cs, d in sorted(cases.items()):
        if cs == "embedding":
            check_embedding(ck, cs, d)
        elif cs == "layernorm":
            check_layernorm(ck, cs, d)
        elif cs.startswith("gemm"):
            check_gemm(ck, cs, d)
        elif cs.startswith("attention"):
            check_attention(ck, cs, d)
        elif cs.startswith("classifier"):
            check_classifier(ck, cs, d)
    check_elementwise(ck, cases)
    check_optim(ck, cases)
    print(f"{ck.passed} passed, {ck.failed} failed")
    return 1 if ck.failed else 0


if __name__ == "__main__":
    sys.exit(main())
