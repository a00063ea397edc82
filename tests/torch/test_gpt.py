"""Model parity with PyTorch: for the serial and the parallel block, with and
without a sliding window, the C model's logits, loss and every parameter
gradient match a float64 PyTorch reference on the same weights and batch
within 1e-5 relative (max|ours-ref| / max|ref| per tensor), and 5 optimiser
steps of AdamW and of LAMB (with clipping and a warmup+cosine schedule)
give the same losses (1e-5 relative) and weights (1e-5 relative in L2 per
tensor).
usage: test_gpt.py GPT_DUMP_BINARY"""
import os
import subprocess
import sys
import tempfile

try:
    import torch
except ImportError:
    print("SKIP: python3-torch is not installed (apt-get install python3-torch)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_ref  # noqa: E402

torch.set_default_dtype(torch.float64)
TOL = 1e-5
passed = failed = 0


def check(what, ours, ref, tol=TOL, norm="max"):
    """Relative error max|ours-ref|/max|ref| (norm="max"), or the L2 version
    |ours-ref|_2/|ref|_2 (norm="l2", for weights after several adaptive
    steps, where an element with a near-zero gradient may take a step that
    is only approximately determined)."""
    global passed, failed
    ours = torch.as_tensor(ours, dtype=torch.float64)
    ref = torch.as_tensor(ref, dtype=torch.float64)
    if ours.shape != ref.shape:
        err = float("inf")
    elif norm == "l2":
        scale = ref.norm().item()
        err = (ours - ref).norm().item() / (scale if scale > 0 else 1.0)
    else:
        scale = ref.abs().max().item()
        err = (ours - ref).abs().max().item() / (scale if scale > 0 else 1.0)
    if err <= tol and ours.shape == ref.shape:
        passed += 1
    else:
        failed += 1
        i = int((ours - ref).abs().flatten().argmax()) if ours.shape == ref.shape else 0
        print(f"  FAIL {what}: rel err {err:.3e} > {tol:.0e} (shape {tuple(ours.shape)} vs "
              f"{tuple(ref.shape)}; worst element {i}: ours {ours.flatten()[i].item():.9g} "
              f"ref {ref.flatten()[i].item():.9g})")
    return err


def run_case(binary, L, C, H, V, TMAX, block, W, B, T, steps, opt, clip):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "dump.safetensors")
        subprocess.run([binary, out, str(L), str(C), str(H), str(V), str(TMAX), block, str(W),
                        str(B), str(T), str(steps), opt, str(clip)], check=True)
        arr, meta = gpt_ref.read_safetensors(out)
    names = gpt_ref.param_names(L, block)
    p = {n: torch.tensor(arr["init." + n], requires_grad=True) for n in names}
    tok = torch.tensor(arr["tokens"], dtype=torch.long)
    tgt = torch.tensor(arr["targets"], dtype=torch.long)
    label = f"{block} W={W} L={L} C={C} H={H} V={V} B={B} T={T} {opt}"
    logits = gpt_ref.forward(p, tok[0], L, H, block, W)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), tgt[0].reshape(-1))
    loss.backward()
    worst = max(check(f"{label} logits", arr["logits"], logits.detach()),
                check(f"{label} loss", arr["loss"], loss.detach().reshape(1)))
    for n in names:
        worst = max(worst, check(f"{label} grad {n}", arr["grad." + n], p[n].grad))
    # optimiser steps: same batches, lrs from the dump (warmup + cosine)
    w = {n: torch.tensor(arr["init." + n], requires_grad=True) for n in names}
    decay = lambda n: 0.1 if n.endswith(".weight") and arr["init." + n].ndim == 2 else 0.0
    if opt == "adamw":
        groups = [{"params": [w[n] for n in names if decay(n) > 0], "weight_decay": 0.1},
                  {"params": [w[n] for n in names if decay(n) == 0], "weight_decay": 0.0}]
        o = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    state = {}
    for s in range(steps):
        for t in w.values():
            t.grad = None
        lg = gpt_ref.forward(w, tok[s], L, H, block, W)
        ls = torch.nn.functional.cross_entropy(lg.reshape(-1, V), tgt[s].reshape(-1))
        ls.backward()
        worst = max(worst, check(f"{label} step {s} loss", arr["step_loss"][s:s + 1],
                                 ls.detach().reshape(1)))
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(list(w.values()), clip)
        lr = float(arr["step_lr"][s])
        if opt == "adamw":
            for g in o.param_groups:
                g["lr"] = lr
            o.step()
        else:
            gpt_ref.lamb_step(w, {n: w[n].grad for n in names}, state, lr, s + 1, 0.9, 0.95,
                              1e-8, decay)
    for n in names:
        ours, ref = arr["final." + n], w[n].detach()
        if n.endswith("attn.c_attn.bias"):
            # The key bias adds q.b_k to every score of a row, which softmax
            # ignores: its gradient is exactly zero in exact arithmetic, so
            # Adam/LAMB turn rounding noise into full-size steps of random
            # sign in any implementation.  Check that its gradient is noise
            # (relative to the other biases) and compare the q and v parts.
            # With W = 1 each token attends only to itself: q gets no
            # gradient either.
            g = torch.as_tensor(arr["grad." + n])
            zero = torch.arange(0 if W == 1 else C, 2 * C)
            worst = max(worst, check(f"{label} grad {n}[k] is ~0", g[zero] / g.abs().max(),
                                     torch.zeros(len(zero)), tol=1e-5))
            keep = torch.cat([torch.arange(0, C) if W != 1 else torch.arange(0),
                              torch.arange(2 * C, 3 * C)])
            ours, ref = torch.as_tensor(ours)[keep], ref[keep]
        worst = max(worst, check(f"{label} final {n}", ours, ref, norm="l2"))
    print(f"{label}: worst rel err {worst:.2e}")


def main():
    binary = sys.argv[1]
    cases = [
        # L C H V TMAX block W B T steps opt clip
        (2, 48, 4, 211, 32, "serial", 0, 2, 16, 5, "adamw", 1.0),
        (2, 48, 4, 211, 32, "parallel", 0, 2, 16, 5, "adamw", 1.0),
        (2, 48, 4, 211, 32, "serial", 5, 2, 16, 5, "lamb", 1.0),
        (2, 48, 4, 211, 32, "parallel", 5, 2, 16, 5, "lamb", 0.0),
        (3, 64, 2, 300, 24, "serial", 1, 3, 13, 5, "lamb", 0.5),
        (1, 32, 4, 128, 16, "parallel", 16, 1, 9, 5, "adamw", 0.0),
    ]
    for c in cases:
        run_case(binary, *c)
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
