"""llm.c's model files as weights (issue 13): `--init-from`, `eval --weights`
and `sample --weights` read gpt2_124M.bin-style files, version 3 (fp32)
and 5 (bf16).  The files are written here the way llm.c's train_gpt2.py
writes them (256 int32 header words; wte padded to padded_vocab_size; each
kind of tensor for every layer in turn; matrices as torch.nn.Linear holds
them, (out, in)), from the weights a run saved as safetensors.  The fp32
file gives the very same validation loss and training losses as the
safetensors it came from (so every tensor, its place and its transpose are
right: a square c_proj left untransposed changes the loss); the bf16 file
the same loss as those weights rounded to bf16 (round to nearest even, as
torch's .to(bfloat16)).  Bad files are named with what is wrong: truncated,
an unknown version, heads that do not divide the width, a header out of
range, a shape the flags contradict.
Environment: MS_BIN (the binary)."""
import json
import os
import struct
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_cli import TINY, expect_error, ok, run, text_tokens, write_shard  # noqa: E402
import test_cli  # noqa: E402

MAGIC = 20240326


def read_st(path):
    """{name: (shape, [floats])} of an F32 safetensors file."""
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    hdr, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        assert v["dtype"] == "F32", v
        a, b = v["data_offsets"]
        out[k] = (v["shape"], list(struct.unpack(f"<{(b - a) // 4}f", data[a:b])))
    return out


def transpose(vals, rows, cols):
    """A (rows, cols) row-major matrix as (cols, rows)."""
    return [vals[r * cols + c] for c in range(cols) for r in range(rows)]


def to_bf16(x):
    (u,) = struct.unpack("<I", struct.pack("<f", x))
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def write_llmc(path, w, L, heads, version, pad_to=96, header_patch=None, cut=0):
    """llm.c's model file from HF-layout weights w (read_st).  llm.c pads
    the vocabulary to a multiple of 128; 96 here, so that 256 gets padding
    rows (288)."""
    V, C = w["wte.weight"][0]
    T = w["wpe.weight"][0][0]
    Vp = (V + pad_to - 1) // pad_to * pad_to
    hdr = [0] * 256
    hdr[:8] = [MAGIC, version, T, V, L, heads, C, Vp]
    for i, v in (header_patch or {}).items():
        hdr[i] = v
    vals = list(w["wte.weight"][1]) + [0.0] * ((Vp - V) * C)
    vals += w["wpe.weight"][1]
    kinds = [("ln_1.weight", 0), ("ln_1.bias", 0), ("attn.c_attn.weight", 1),
             ("attn.c_attn.bias", 0), ("attn.c_proj.weight", 1), ("attn.c_proj.bias", 0),
             ("ln_2.weight", 0), ("ln_2.bias", 0), ("mlp.c_fc.weight", 1), ("mlp.c_fc.bias", 0),
             ("mlp.c_proj.weight", 1), ("mlp.c_proj.bias", 0)]
    for kind, is_matrix in kinds:
        for l in range(L):
            shape, v = w[f"h.{l}.{kind}"]
            vals += transpose(v, *shape) if is_matrix else v  # HF (in, out) -> (out, in)
    vals += w["ln_f.weight"][1] + w["ln_f.bias"][1]
    body = (struct.pack(f"<{len(vals)}f", *vals) if version == 3 else
            struct.pack(f"<{len(vals)}H", *map(to_bf16, vals)))
    data = struct.pack("<256i", *hdr) + body
    with open(path, "wb") as f:
        f.write(data[:len(data) - cut] if cut else data)


def write_st(path, w, bf16=False):
    """An F32 (or BF16-rounded, stored as F32) safetensors file of w."""
    hdr, blobs, at = {}, [], 0
    for k, (shape, v) in w.items():
        if bf16:
            v = [struct.unpack("<f", struct.pack("<I", to_bf16(x) << 16))[0] for x in v]
        b = struct.pack(f"<{len(v)}f", *v)
        hdr[k] = {"dtype": "F32", "shape": shape, "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    hdr["__metadata__"] = {"n_head": "2"}
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def val_loss(weights, val):
    rc, out, err = run("eval", "--weights", weights, "--val-data", val, "--val-batches", "4",
                       "--batch", "4", "--seq", "16", "--json")
    try:
        return json.loads(out)["val_loss"] if rc == 0 else None, err
    except (ValueError, KeyError):
        return None, err + out


def losses(path):
    return [j["loss"] for j in map(json.loads, open(path)) if "loss" in j]


def main():
    d = tempfile.mkdtemp(prefix="ms_llmc_")
    train, val = os.path.join(d, "train.bin"), os.path.join(d, "val.bin")
    write_shard(train, text_tokens(20000))
    write_shard(val, text_tokens(3000))
    base = ["train", "--train-data", train, *TINY, "--trace-dir", "none"]
    st = os.path.join(d, "w.safetensors")
    rc, _, err = run(*base, "--steps", "8", "--lr", "3e-3", "--save-weights", st)
    ok(rc == 0, "a run saves its weights", err)
    if rc != 0:
        print(f"{test_cli.passed} passed, {test_cli.failed} failed")
        sys.exit(1)
    w = read_st(st)
    L = 2
    v3, v5 = os.path.join(d, "model_v3.bin"), os.path.join(d, "model_v5.bin")
    write_llmc(v3, w, L, 2, 3)
    write_llmc(v5, w, L, 2, 5)

    # --- eval: fp32 equals the safetensors, bf16 equals its weights rounded ---
    ref, err = val_loss(st, val)
    got3, err3 = val_loss(v3, val)
    ok(ref is not None and got3 == ref, f"eval of the v3 file = the safetensors' ({got3} vs {ref})",
       err + err3)
    r16 = os.path.join(d, "w16.safetensors")
    write_st(r16, w, bf16=True)
    ref16, err = val_loss(r16, val)
    got5, err5 = val_loss(v5, val)
    ok(ref16 is not None and got5 == ref16,
       f"eval of the v5 file = the weights rounded to bf16 ({got5} vs {ref16})", err + err5)
    ok(got5 is not None and ref is not None and abs(got5 - ref) / ref < 2e-2,
       f"bf16 is close to fp32 ({got5} vs {ref})")
    print(f"val_loss: safetensors {ref}, llm.c v3 {got3}; bf16 {ref16}, llm.c v5 {got5}")

    # --- --init-from: the same training losses ---
    runs = {}
    for name, src in (("st", st), ("v3", v3)):
        mp = os.path.join(d, f"m_{name}.jsonl")
        rc, _, err = run(*base, "--init-from", src, "--steps", "3", "--metrics", mp)
        runs[name] = losses(mp) if rc == 0 else None
        ok(rc == 0, f"--init-from the {name} weights trains", err)
    ok(runs["st"] and runs["st"] == runs["v3"],
       "--init-from the v3 file: the same losses as from the safetensors", str(runs))
    rc, out, err = run("sample", "--weights", v5, "--tokenizer", "bytes", "--prompt", "In",
                       "--tokens", "4")
    ok(rc == 0, "sample --weights takes the v5 file", err)

    # --- bad files, each named ---
    bad = os.path.join(d, "bad.bin")
    write_llmc(bad, w, L, 2, 3, cut=100)
    expect_error([*base, "--init-from", bad, "--steps", "1"], bad, "truncated",
                 what="a truncated llm.c file")
    write_llmc(bad, w, L, 2, 4)
    expect_error(["eval", "--weights", bad, "--val-data", val], bad, "version 4",
                 what="an unknown llm.c version")
    write_llmc(bad, w, L, 3, 3)
    expect_error(["eval", "--weights", bad, "--val-data", val], bad, "is not divisible by heads 3",
                 what="heads that do not divide the width")
    write_llmc(bad, w, L, 2, 3, header_patch={7: 100})
    expect_error(["eval", "--weights", bad, "--val-data", val], bad, "padded_vocab_size",
                 what="a padded vocabulary below the vocabulary")
    write_llmc(bad, w, L, 2, 3, header_patch={4: -1})
    expect_error(["eval", "--weights", bad, "--val-data", val], bad, "num_layers",
                 what="a negative layer count")
    expect_error(["train", "--train-data", train, "--seq", "16", "--batch", "4", "--init-from", v3,
                  "--dim", "64", "--steps", "1"], "--dim 64", v3,
                 what="--dim contradicting the file")
    print(f"{test_cli.passed} passed, {test_cli.failed} failed")
    if not test_cli.failed:  # kept after a failure, to look at
        shutil.rmtree(d, ignore_errors=True)
    sys.exit(1 if test_cli.failed else 0)


if __name__ == "__main__":
    main()
