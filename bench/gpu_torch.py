"""PyTorch peer for bench/gpu_step.sh: GPT-2 (nanoGPT-style module: tied
head, GELU tanh, LayerNorm, F.scaled_dot_product_attention causal) trained
with bf16 autocast, fp32 master weights, fused AdamW (decay on 2-D tensors),
grad clipping 1.0, on random tokens with the same B, T and model as ours.
Eager or torch.compile.  Prints one JSON line per step and a summary line:
{"summary": 1, "median_ms": ..., "tok_s": ..., "peak_alloc_mb": ...,
 "peak_reserved_mb": ...}.
usage: gpu_torch.py --layers L --dim C --heads H --batch B --seq T
                    --steps N [--compile]"""
import argparse
import sys
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, self.H, C // self.H).transpose(1, 2)
        k = k.view(B, T, self.H, C // self.H).transpose(1, 2)
        v = v.view(B, T, self.H, C // self.H).transpose(1, 2)
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch < 2.0 (Debian's, for a CPU smoke test of this script)
            s = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y = s.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, C, H, V, Tmax):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(Tmax, C)
        self.h = nn.ModuleList([Block(C, H) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, V, bias=False)
        self.lm_head.weight = self.wte.weight
        for n, p in self.named_parameters():
            if p.ndim == 2:
                std = 0.02 / math.sqrt(2 * L) if n.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, tgt):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), tgt.view(-1))


def main():
    ap = argparse.ArgumentParser()
    for a in ("layers", "dim", "heads", "batch", "seq", "steps"):
        ap.add_argument("--" + a, type=int, required=True)
    ap.add_argument("--vocab", type=int, default=50304)  # GPT-2's 50257 padded (as llm.c)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--device", default="cuda")  # cpu: a smoke test of this script only
    a = ap.parse_args()
    for k in ("layers", "dim", "heads", "batch", "seq", "steps", "vocab"):
        if getattr(a, k) < 1:
            ap.error(f"--{k} must be >= 1, got {getattr(a, k)}")
    if a.device == "cuda" and not torch.cuda.is_available():  # a reason, not a traceback
        sys.exit("bench/gpu_torch.py: skipped: PyTorch sees no CUDA device here "
                 "(--device cpu runs the script's smoke test)")
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dev = a.device
    cuda = dev == "cuda"
    model = GPT(a.layers, a.dim, a.heads, a.vocab, 1024).to(dev)
    decay = [p for p in model.parameters() if p.ndim == 2]
    nodecay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": nodecay, "weight_decay": 0.0}], lr=6e-4,
                            betas=(0.9, 0.95), eps=1e-8, **({"fused": True} if cuda else {}))
    fwd = torch.compile(model) if a.compile else model
    times = []
    tokens = a.batch * a.seq
    for s in range(a.steps):
        tok = torch.randint(0, 50257, (a.batch, a.seq), device=dev)
        tgt = torch.randint(0, 50257, (a.batch, a.seq), device=dev)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast(device_type=dev, dtype=torch.bfloat16):
            loss = fwd(tok, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        lv = loss.item()  # one host sync per step, as ours
        ms = (time.perf_counter() - t0) * 1e3
        times.append(ms)
        print(json.dumps({"step": s + 1, "ms": round(ms, 3), "loss": lv}), flush=True)
    warm = times[min(len(times) - 1, 5 if not a.compile else 8):]
    med = statistics.median(warm)
    print(json.dumps({"summary": 1, "median_ms": med, "tok_s": tokens / med * 1e3,
                      "peak_alloc_mb": torch.cuda.max_memory_allocated() / 2**20 if cuda else 0,
                      "peak_reserved_mb": torch.cuda.max_memory_reserved() / 2**20 if cuda else 0}),
          flush=True)


if __name__ == "__main__":
    main()
