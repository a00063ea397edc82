#!/usr/bin/env python3
"""Regenerate the fuzz harnesses' seed corpora (tests/fuzz/corpus/NAME/).

The valid seeds come from the project's own tools, run on a few kilobytes
of data/kjv.txt.gz with a model of one layer and width 8: token shards
(`megascale data prepare`), tokenizers (`data tokenizer-train`), exported
weights, a checkpoint's shard and manifest (`train`, and `train --tp 2`
under mpirun), a config file (the options of that run, from its metrics'
config line), heartbeat lines (a listener on loopback), and the run
files of two `megascale launch` jobs (one done, one whose rank keeps
crashing) for the dashboard's model.  The malformed seeds are written
here: a few of each format, each one wrong in one way.  Steps that need
mpirun are skipped without it.

    tests/fuzz/make_corpus.py [--bin build/megascale] [--out tests/fuzz/corpus]

Seeds stay small (the script fails on one over 64 KiB, or on more than
1 MiB in all).  Run files carry times and pids, so a rerun changes the
bytes, not what the seeds cover.
"""
import argparse
import gzip
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
TOKEN = "0123456789abcdef0123456789abcdef"  # the harnesses' job token (fuzz_beat.c)
TINY = ["--vocab", "256", "--layers", "1", "--dim", "8", "--heads", "1", "--seq-max", "8",
        "--seq", "8", "--threads", "1", "--data-order", "sequential"]
MAX_SEED, MAX_TOTAL = 64 << 10, 1 << 20


def run(cmd, cwd, timeout=300):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, errors="replace",
                       timeout=timeout)
    if p.returncode != 0 and "launch" not in cmd:
        sys.exit(f"make_corpus: {' '.join(cmd)} failed:\n{p.stderr[-2000:]}")
    return p


def mpirun():
    exe = shutil.which("mpirun")
    if not exe:
        return None
    extra = ["--allow-run-as-root"] if os.getuid() == 0 else []
    return [exe, "--oversubscribe", *extra]


class Corpus:
    def __init__(self, out):
        self.out = out

    def put(self, name, seed, data):
        d = os.path.join(self.out, name)
        os.makedirs(d, exist_ok=True)
        if isinstance(data, str):
            data = data.encode()
        if len(data) > MAX_SEED:
            sys.exit(f"make_corpus: seed {name}/{seed} is {len(data)} bytes (> {MAX_SEED})")
        with open(os.path.join(d, seed), "wb") as f:
            f.write(data)

    def copy(self, name, seed, path, limit=None):
        data = open(path, "rb").read()
        self.put(name, seed, data[:limit] if limit else data)


def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def safetensors(header, data=b"", hlen=None):
    h = json.dumps(header).encode() if not isinstance(header, bytes) else header
    return struct.pack("<Q", len(h) if hlen is None else hlen) + h + data


def shard(version, tokens, count=None, magic=20240520):
    hdr = struct.pack("<3i", magic, version, len(tokens) if count is None else count)
    body = struct.pack(f"<{len(tokens)}{'H' if version == 1 else 'I'}", *tokens)
    return hdr + bytes(1024 - len(hdr)) + body


def llmc(version=3, L=1, H=2, C=8, V=16, Vp=24, T=8, cut=0, words=None):
    """An llm.c model file (src/ckpt/llmc.h) of small counting values."""
    hdr = [20240326, version, T, V, L, H, C, Vp] + [0] * 248
    for i, v in (words or {}).items():
        hdr[i] = v
    n = Vp * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
    vals = [((i * 37) % 101 - 50) / 64.0 for i in range(max(n, 0))]
    body = (struct.pack(f"<{len(vals)}f", *vals) if version == 3 else
            struct.pack(f"<{len(vals)}H", *(struct.unpack("<I", struct.pack("<f", v))[0] >> 16
                                             for v in vals)))
    data = struct.pack("<256i", *hdr) + body
    return data[:len(data) - cut] if cut else data


def llmc_seeds(c):
    c.put("llmc", "v3-two-layers.bin", llmc(L=2))
    c.put("llmc", "v5-padded.bin", llmc(version=5, V=13, Vp=16))
    c.put("llmc", "bad-truncated.bin", llmc(cut=3))
    c.put("llmc", "bad-version.bin", llmc(version=4))
    c.put("llmc", "bad-heads.bin", llmc(H=3))
    c.put("llmc", "bad-padded-vocab.bin", llmc(V=30, Vp=24))
    c.put("llmc", "header-only.bin", llmc()[:1024])


def tokenizer(pattern, specials=(b"<|endoftext|>",), extra=(), name=b"fuzz"):
    """A tokenizer file (tokenizer.h): the 256 bytes, `extra` merged tokens,
    the specials; both CRC32Cs right."""
    toks = [bytes([b]) for b in range(256)] + list(extra)
    nt, ns = len(toks), len(specials)
    body = name + pattern + b"".join(struct.pack("<H", len(t)) for t in toks) + b"".join(toks)
    body += b"".join(struct.pack("<II", nt + i, len(s)) for i, s in enumerate(specials))
    body += b"".join(specials)
    tb, sb = sum(map(len, toks)), sum(map(len, specials))
    size = 64 + len(body)
    head = b"MSTOKBPE" + struct.pack("<6I3Q", 1, 64, nt, ns, len(name), len(pattern), tb, sb, size)
    head += struct.pack("<I", crc32c(body))
    return head + struct.pack("<I", crc32c(head)) + body


def config_of(metrics):
    """The options of a run's metrics config line as a config file."""
    cfg = json.loads(open(metrics).readline())
    lines = ["# the options of a 2-step run (its metrics' config line)"]
    for k, v in cfg["options"].items():
        if v is not None and k not in ("train-data", "val-data", "ckpt-dir", "ckpt-shm-dir",
                                       "metrics", "save-weights"):
            lines.append(f"{k} = {v}")
    return "\n".join(lines) + "\n"


def beats(binary, work):
    """Heartbeat lines of a 3-step run, as the driver's listener reads them."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    got = []

    def serve():
        c, _ = srv.accept()
        got.extend(c.makefile("rb"))

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    run([binary, "train", "--train-data", "shards/data_train_*.bin", *TINY, "--batch", "2",
         "--steps", "3", "--heartbeat", f"127.0.0.1:{srv.getsockname()[1]}",
         "--heartbeat-token", TOKEN, "--node-map", "node7", "--ckpt-dir", "hb",
         "--ckpt-shm-dir", "shm"], work)
    t.join(5)
    srv.close()
    # The harness's world is 8 ranks; this run had one.
    return [l.replace(b'"world":1,', b'"world":8,') for l in got]


def bad_manifests(c, path):
    """A real manifest, each time with one thing wrong."""
    text = open(path, "rb").read()
    c.put("manifest", "bad-truncated.json", text[:len(text) // 2])
    m = json.loads(text)

    def put(seed, edit):
        x = json.loads(text)
        edit(x)
        c.put("manifest", seed, json.dumps(x))

    put("bad-version.json", lambda x: x.update(version=m["version"] + 1))
    put("bad-step.json", lambda x: x["trainer"].update(step=m["step"] + 1))
    put("bad-file-name.json", lambda x: x["files"][0].update(name="../shard"))
    put("bad-slice-tensor.json", lambda x: x["slices"][0].update(tensor="nope"))
    put("bad-shape.json", lambda x: x["tensors"][next(iter(m["tensors"]))].update(shape=[1, 2, 3]))
    put("bad-model.json", lambda x: x["model"].update(n_head=3))
    # was MS_ERR_ARG (a usage error, exit 2) without the file's name: now MS_ERR_FORMAT
    put("bad-lr-schedule.json", lambda x: x["trainer"]["lr_schedule"].update(kind="linear"))


def valid_seeds(c, binary, work):
    text = gzip.open(os.path.join(ROOT, "data", "kjv.txt.gz")).read(20000)
    open(os.path.join(work, "small.txt"), "wb").write(text)
    open(os.path.join(work, "tiny.txt"), "wb").write(text[:3000])
    os.makedirs(os.path.join(work, "shm"))
    run([binary, "data", "prepare", "--input", "small.txt", "--out", "shards", "--tokenizer",
         "bytes", "--shard-tokens", "2000", "--val-fraction", "0.1"], work)
    c.copy("shard", "bytes-2000.bin", os.path.join(work, "shards", "data_train_000000.bin"))
    run([binary, "data", "prepare", "--input", "tiny.txt", "--out", "gpt2", "--shard-tokens",
         "300", "--val-fraction", "0"], work)
    c.copy("shard", "gpt2-300.bin", os.path.join(work, "gpt2", "data_train_000000.bin"))
    for v in (257, 300):
        run([binary, "data", "tokenizer-train", "--input", "tiny.txt", "--vocab-size", str(v),
             "--out", f"t{v}.tok"], work)
        c.copy("tokenizer", f"bpe{v}.tok", os.path.join(work, f"t{v}.tok"))

    run([binary, "train", "--train-data", "shards/data_train_*.bin", "--val-data",
         "shards/data_val_*.bin", *TINY, "--batch", "2", "--steps", "2", "--val-every", "1",
         "--val-batches", "1", "--ckpt-dir", "ckpt", "--ckpt-shm-dir", "shm", "--save-weights",
         "w.safetensors", "--metrics", "m.jsonl"], work)
    step = os.path.join(work, "ckpt", "step_00000002")
    c.copy("safetensors", "weights.safetensors", os.path.join(work, "w.safetensors"))
    c.copy("safetensors", "ckpt-shard.safetensors",
           os.path.join(step, "shard-00000-of-00001.safetensors"))
    c.copy("manifest", "dp1.json", os.path.join(step, "manifest.json"))
    bad_manifests(c, os.path.join(step, "manifest.json"))
    c.put("config", "run.cfg", config_of(os.path.join(work, "m.jsonl")))
    c.put("beat", "run.txt", b"".join(beats(binary, work)))

    mpi = mpirun()
    if not mpi:
        print("make_corpus: no mpirun: the tp2 checkpoint and launch seeds are left as they are")
        return
    run([*mpi, "-np", "2", binary, "train", "--train-data", "shards/data_train_*.bin", *TINY,
         "--heads", "2", "--batch", "4", "--steps", "1", "--tp", "2", "--ckpt-dir", "tp2",
         "--ckpt-shm-dir", "shm"], work)
    step = os.path.join(work, "tp2", "step_00000001")
    c.copy("manifest", "tp2.json", os.path.join(step, "manifest.json"))
    c.copy("safetensors", "tp2-shard1.safetensors",
           os.path.join(step, "shard-00001-of-00002.safetensors"))
    launch = [binary, "launch", "--np", "2", "--heartbeat-timeout", "4", "--backoff", "0.2",
              "--grace", "3", "--startup-timeout", "120"]
    train = ["--train-data", "shards/data_train_*.bin", "--val-data", "shards/data_val_*.bin",
             *TINY, "--batch", "4", "--dp", "2", "--ckpt-every", "3", "--ckpt-shm-dir", "shm",
             "--val-every", "2", "--val-batches", "1"]
    for name, extra in (("done", ["--steps", "6"]),
                        ("crashing", ["--steps", "8", "--inject-fault", "exit@5:1"])):
        rd = os.path.join(work, name)
        run([*launch, "--run-dir", rd, "--", *train, "--ckpt-dir", os.path.join(rd, "ckpt"),
             "--metrics", os.path.join(rd, "m.jsonl"), *extra], work)
        lines = []
        for prefix, f in (("m", "m.jsonl"), ("e", "events.jsonl"), ("c", "compute.jsonl")):
            lines += [prefix.encode() + l for l in open(os.path.join(rd, f), "rb")]
        c.put("dash", f"run-{name}.txt", b"".join(lines))


def malformed_seeds(c):
    llmc_seeds(c)
    st = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    c.put("safetensors", "bad-hlen-past-end.safetensors", safetensors(st, bytes(8), hlen=1 << 20))
    c.put("safetensors", "bad-truncated-data.safetensors", safetensors(st, bytes(4)))
    c.put("safetensors", "bad-overlap.safetensors", safetensors(
        {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
         "b": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}}, bytes(8)))
    c.put("safetensors", "bad-meta.safetensors", safetensors(
        {"__metadata__": {"format": 1}, **st}, bytes(8)))
    c.put("safetensors", "bad-duplicate.safetensors", safetensors(
        b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
        b'"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', bytes(8)))
    c.put("safetensors", "gap-and-empty.safetensors", safetensors(
        {"__metadata__": {"format": "pt"}, "e": {"dtype": "I64", "shape": [0, 3],
                                                 "data_offsets": [3, 3]},
         "x": {"dtype": "BF16", "shape": [1, 2], "data_offsets": [8, 12]}}, bytes(12)))

    c.put("shard", "v2-big-ids.bin", shard(2, [0, 65535, 65536, 100000, 2**31 - 1, 2**32 - 1]))
    c.put("shard", "bad-count.bin", shard(1, [1, 2, 3], count=4))
    c.put("shard", "bad-version.bin", shard(3, [1, 2]))
    c.put("shard", "llama3.bin", shard(7, [0, 128000, 128255, 2**31 - 1], magic=20240801))
    c.put("shard", "llama3-bad-version.bin", shard(2, [1, 2], magic=20240801))
    c.put("shard", "header-only.bin", shard(1, []))

    pat = b"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
    c.put("tokenizer", "bytes-gpt2-pattern.tok", tokenizer(pat, extra=(b"th", b"the", b" the")))
    c.put("tokenizer", "empty-match-pattern.tok", tokenizer(b"a*|(?=b)", extra=(b"aa",)))
    # \C matches one byte: the next match starts inside a UTF-8 character
    c.put("tokenizer", "byte-pattern.tok", tokenizer(b"\\C\\X|\\C", extra=(b"\xc3\xa9",)))
    c.put("tokenizer", "two-specials.tok", tokenizer(b"\\S+|\\s+", specials=(b"<|a|>", b"<|b|>")))
    c.copy("tokenizer", "gpt2-truncated.tok", os.path.join(ROOT, "data", "gpt2.tok"), 4096)
    bad = bytearray(tokenizer(b"."))
    bad[70] ^= 1
    c.put("tokenizer", "bad-body-crc.tok", bytes(bad))

    c.put("config", "all-forms.cfg",
          "# comment\n\n  model = d12   # trailing comment\n--layers=2\nlr = 3e-4\n"
          "seed = 18446744073709551615\nbeta1 = 0.0\nblock = parallel\nthreads = 1024\n"
          "heartbeat = \nckpt-every-min = 0.5\n")
    c.put("config", "bad-range.cfg", "beta1 = 1\n")
    c.put("config", "bad-number.cfg", "lr = nan\nsteps = 12x\n")
    c.put("config", "bad-line.cfg", "steps 12\n")
    c.put("config", "bad-nested-config.cfg", "config = other.cfg\n")
    c.put("config", "bad-nul.cfg", b"steps = 1\n\0steps = 2\n")

    tok = TOKEN
    c.put("beat", "ckpt-and-error.txt",
          f'{{"v":1,"token":"{tok}","rank":7,"world":8,"pid":4194304,"host":"h\\tx","seq":9,'
          f'"step":5,"phase":"error","step_ms":null,"loss":1e308,"grad_norm":0,"comm_bytes":1,'
          f'"compute_ms":2.5,"redone":3,"ckpt_commit":4,"ckpt_failed":1,'
          f'"ckpt_error":"disk full","error":"rank 7: boom"}}\n')
    c.put("beat", "ctl.txt", f'{{"v":1,"token":"{tok}","cmd":"status"}}\n'
                             f'{{"v":1,"token":"{tok}","cmd":"evict","node":"node-1.a_b"}}\n'
                             f'{{"v":1,"token":"{tok}","cmd":"evict","node":"../x"}}  \r\n')
    c.put("beat", "bad-fields.txt",
          f'{{"v":1,"v":1,"token":"{tok}"}}\n{{"v":2}}\n[1,2]\n{{"v":1,"token":"{tok}"}} x\n'
          f'{{"v":1,"token":"{tok}","rank":8,"world":8}}\n')

    c.put("dash", "layout-heat.txt",
          'm{"type":"config","layout":{"world":3,"dp":1,"tp":3,"pp":1},'
          '"options":{"model":"d6","steps":300}}\n'
          'e{"time":1,"event":"job_start","np":3,"pool":"n0,n1,n2,","straggler_score":0.9}\n'
          'e{"time":2,"event":"launch","attempt":1,"nodes":"n0,,n2"}\n'
          'e{"time":3,"event":"rank_up","rank":2,"node":"n2","host":"h"}\n'
          'c{"step":1,"compute_ms":[10,11,30]}\nc{"step":2,"compute_ms":[10,null,-1]}\n'
          'c{"step":1025,"compute_ms":[1,2,3]}\nc{"step":3,"compute_ms":[1,2]}\n'
          'm{"step":2,"loss":1,"wall":5}\nm{"step":1,"loss":2}\nm{"step":3,"val_loss":2}\n'
          'm{"type":"ckpt","step":2,"bytes":10}\nr\n'
          'e{"time":4,"event":"fault_detected","kind":"straggler","rank":1,"step":2}\n'
          'e{"time":5,"event":"evict","node":"n0","reason":"diag"}\n'
          'e{"time":6,"event":"anomaly","kind":"straggler","rank":2}\n'
          'e{"time":7,"event":"summary","outcome":"stopped","ettr":0.5,"steps":3}\n'
          'e{"event":"job_start","np":2}\n{"no":"prefix"}\nnot json\n')


def docs_seeds(c):
    """JSON Lines inputs of data prepare (fuzz_docs)."""
    c.put("docs", "lines.jsonl",
          '{"id": 0, "text": "Hello, world.\\n"}\n\n  {"text": "na\\u00efve \\"q\\" \\\\ end"}  \r\n'
          '{"text": ""}\n{"text": "x\\\\u0000y", "meta": {"text": "\\u0000"}}\n{"text": "last"}')
    c.put("docs", "bad-lines.jsonl",
          '{"text": "fine"}\n[1, 2]\n{"text": "unterminated\n{"text": "a"} x\n{"body": "x"}\n'
          '{"text": 5}\n{"text": null}\n{"text": "abc\\u0000def"}\n{"text": "\\u0000"}\n'
          '{"text": "\\ud800 lone surrogate"}\n{"text": "ok"}\n')
    c.put("docs", "gzip.jsonl", b"\x1f\x8b\x08\x00" + bytes(12))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "megascale"))
    ap.add_argument("--out", default=os.path.join(HERE, "corpus"))
    a = ap.parse_args()
    binary = os.path.abspath(a.bin)
    c = Corpus(os.path.abspath(a.out))
    with tempfile.TemporaryDirectory(prefix="ms_fuzz_corpus_") as work:
        valid_seeds(c, binary, work)
    malformed_seeds(c)
    docs_seeds(c)
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(c.out) for f in fs)
    if total > MAX_TOTAL:
        sys.exit(f"make_corpus: the corpus is {total} bytes (> {MAX_TOTAL})")
    print(f"make_corpus: {c.out}: {total} bytes")


if __name__ == "__main__":
    main()
