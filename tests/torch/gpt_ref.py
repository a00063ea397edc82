"""Reference GPT-2 in PyTorch, with Hugging Face GPT-2 parameter names, for
parity tests and the CPU benchmark.  Mirrors src/model: pre-LN blocks, serial
or parallel block, causal attention with an optional sliding window W (query
t sees keys t-W+1..t), tanh-GeLU, tied LM head; plus a safetensors reader and
the LAMB update as MegaScale-C defines it."""
import json
import math
import struct

import numpy as np
import torch
import torch.nn.functional as F

ST_DTYPES = {"F32": np.float32, "I32": np.int32, "F64": np.float64, "I64": np.int64,
             "U8": np.uint8}


def read_safetensors(path):
    """Return ({name: np.ndarray}, metadata dict)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, e in header.items():
        b, e_ = e["data_offsets"]
        arr = np.frombuffer(raw[base + b:base + e_], dtype=ST_DTYPES[e["dtype"]])
        out[name] = arr.reshape(e["shape"]).copy()
    return out, meta


def layer_names(block):
    names = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
             "attn.c_proj.weight", "attn.c_proj.bias"]
    if block == "serial":
        names += ["ln_2.weight", "ln_2.bias"]
    return names + ["mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"]


def param_names(n_layer, block):
    names = ["wte.weight", "wpe.weight"]
    for i in range(n_layer):
        names += [f"h.{i}.{n}" for n in layer_names(block)]
    return names + ["ln_f.weight", "ln_f.bias"]


def attention(qkv, n_head, window):
    B, T, C3 = qkv.shape
    C = C3 // 3
    q, k, v = qkv.split(C, dim=2)
    hs = C // n_head
    q = q.view(B, T, n_head, hs).transpose(1, 2)
    k = k.view(B, T, n_head, hs).transpose(1, 2)
    v = v.view(B, T, n_head, hs).transpose(1, 2)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
    i = torch.arange(T).view(T, 1)
    j = torch.arange(T).view(1, T)
    mask = j <= i
    if window and window > 0:
        mask = mask & (j > i - window)
    att = att.masked_fill(~mask, float("-inf"))
    att = F.softmax(att, dim=-1)
    y = att @ v
    return y.transpose(1, 2).contiguous().view(B, T, C)


def gelu(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def forward(p, tokens, n_layer, n_head, block, window):
    """p: dict name -> tensor (requires_grad as the caller likes).  Returns
    logits (B,T,V)."""
    B, T = tokens.shape
    x = p["wte.weight"][tokens] + p["wpe.weight"][:T]
    C = x.shape[-1]
    for i in range(n_layer):
        g = lambda n: p[f"h.{i}.{n}"]
        ln1 = F.layer_norm(x, (C,), g("ln_1.weight"), g("ln_1.bias"), 1e-5)
        a = attention(ln1 @ g("attn.c_attn.weight") + g("attn.c_attn.bias"), n_head, window)
        a = a @ g("attn.c_proj.weight") + g("attn.c_proj.bias")
        if block == "serial":
            x = x + a
            h = F.layer_norm(x, (C,), g("ln_2.weight"), g("ln_2.bias"), 1e-5)
        else:
            h = ln1
        mlp = gelu(h @ g("mlp.c_fc.weight") + g("mlp.c_fc.bias"))
        mlp = mlp @ g("mlp.c_proj.weight") + g("mlp.c_proj.bias")
        x = x + mlp if block == "serial" else x + a + mlp
    x = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], 1e-5)
    return x @ p["wte.weight"].t()


def lamb_step(params, grads, state, lr, t, b1, b2, eps, wd_of):
    """MegaScale-C's LAMB: bias-corrected moments, u = mhat/(sqrt(vhat)+eps)
    + wd*w, trust ratio |w|/|u| (1 when either is 0), w -= lr*ratio*u."""
    with torch.no_grad():
        for name, w in params.items():
            g = grads[name]
            m, v = state.setdefault(name, (torch.zeros_like(w), torch.zeros_like(w)))
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            mhat = m / (1 - b1 ** t)
            vhat = v / (1 - b2 ** t)
            u = mhat / (vhat.sqrt() + eps) + wd_of(name) * w
            wn, un = w.norm().item(), u.norm().item()
            ratio = wn / un if wn > 0 and un > 0 else 1.0
            w.sub_(lr * ratio * u)
