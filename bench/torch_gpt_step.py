"""PyTorch peer for bench/cpu_step.py: the same GPT-2 (tests/torch/gpt_ref.py,
fp32, tied head, AdamW with decay on 2-D tensors, grad clipping) trained on
random tokens with the same batch, sequence and thread count.  Prints one
JSON line per step: {"step": s, "ms": ...}.
usage: torch_gpt_step.py LAYERS DIM HEADS VOCAB B T STEPS THREADS"""
import argparse
import json
import math
import os
import sys
import time

ARGS = ("LAYERS", "DIM", "HEADS", "VOCAB", "B", "T", "STEPS", "THREADS")


def positive(s):
    try:
        n = int(s)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{s!r} is not a positive integer")
    return n


def parse_args():
    ap = argparse.ArgumentParser(prog="torch_gpt_step.py", description=__doc__.split("\nusage:")[0])
    helps = {"DIM": "a multiple of HEADS", "T": "at most 1024 (the position table's rows)"}
    for name in ARGS:
        ap.add_argument(name, type=positive, help=helps.get(name, "a positive integer"))
    a = ap.parse_args()
    if a.DIM % a.HEADS:
        ap.error(f"DIM {a.DIM} is not divisible by HEADS {a.HEADS}")
    if a.T > 1024:
        ap.error(f"T {a.T}: must be at most 1024 (the position table's rows)")
    return [getattr(a, name) for name in ARGS]


def main():
    L, C, H, V, B, T, steps, threads = parse_args()
    import torch  # after the arguments: --help and a usage error need no PyTorch
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                    "torch"))
    import gpt_ref
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    Vp = (V + 127) // 128 * 128
    names = gpt_ref.param_names(L, "serial")
    p = {}
    for n in names:
        if n == "wte.weight":
            shape = (Vp, C)
        elif n == "wpe.weight":
            shape = (1024, C)
        else:
            i = n.split(".")
            kind = ".".join(i[2:]) if n.startswith("h.") else n
            shape = {"ln_1.weight": (C,), "ln_1.bias": (C,), "ln_2.weight": (C,), "ln_2.bias": (C,),
                     "attn.c_attn.weight": (C, 3 * C), "attn.c_attn.bias": (3 * C,),
                     "attn.c_proj.weight": (C, C), "attn.c_proj.bias": (C,),
                     "mlp.c_fc.weight": (C, 4 * C), "mlp.c_fc.bias": (4 * C,),
                     "mlp.c_proj.weight": (4 * C, C), "mlp.c_proj.bias": (C,),
                     "ln_f.weight": (C,), "ln_f.bias": (C,)}[kind]
        t = torch.randn(shape) * 0.02 if len(shape) == 2 else torch.ones(shape)
        p[n] = t.requires_grad_(True)
    decay = [p[n] for n in names if p[n].ndim == 2]
    nodecay = [p[n] for n in names if p[n].ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": nodecay, "weight_decay": 0.0}], lr=6e-4,
                            betas=(0.9, 0.95), eps=1e-8)
    for s in range(steps):
        tok = torch.randint(0, V, (B, T))
        tgt = torch.randint(0, V, (B, T))
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = gpt_ref.forward(p, tok, L, H, "serial", 0)[:, :, :V]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(p.values()), 1.0)
        opt.step()
        ms = (time.perf_counter() - t0) * 1e3
        print(json.dumps({"step": s + 1, "ms": ms, "loss": loss.item()}), flush=True)


if __name__ == "__main__":
    main()
