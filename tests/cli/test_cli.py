"""End-to-end tests of the megascale binary: training, sampling, weights
round trips, determinism, interruption, and every kind of bad input named by
the foundation issue (each must fail with a message naming the file and the
problem, and exit non-zero).  Needs only the Python standard library.
Environment: MS_BIN (the binary)."""
import hashlib
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

BIN = os.environ.get("MS_BIN") or sys.argv[1]
passed = failed = 0
TINY = ["--vocab", "256", "--layers", "2", "--dim", "32", "--heads", "2", "--seq-max", "32",
        "--seq", "16", "--batch", "4", "--threads", "2", "--log-every", "100"]


def ok(cond, what, detail=""):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print(f"FAIL: {what}\n{detail[-3000:]}")


def run(*args, expect_rc=0, env=None):
    p = subprocess.run([BIN, *args], capture_output=True, text=True, errors="replace", env=env)
    return p.returncode, p.stdout, p.stderr


def expect_error(args, *needles, what, env=None):
    rc, out, err = run(*args, env=env)
    good = rc != 0 and all(n in err for n in needles)
    ok(good, f"{what}: expected failure mentioning {needles}", f"rc={rc}\nstderr:\n{err}")


def write_shard(path, tokens, magic=20240520, version=1, count=None, truncate=0):
    header = [0] * 256
    header[0], header[1], header[2] = magic, version, len(tokens) if count is None else count
    fmt = "H" if version == 1 else "I"
    data = struct.pack("<256i", *header) + struct.pack(f"<{len(tokens)}{fmt}", *tokens)
    with open(path, "wb") as f:
        f.write(data[:len(data) - truncate] if truncate else data)


def text_tokens(n):
    text = ("In the beginning God created the heaven and the earth. " * 400).encode()
    return list(text[:n])


def test_data(d):
    """`data prepare` / `tokenizer-train` / `inspect`, and their bad input."""
    docs = os.path.join(d, "docs")
    os.makedirs(docs)
    for i in range(3):
        open(os.path.join(docs, f"doc{i}.txt"), "w").write(
            f"Document {i}: In the beginning God created the heaven and the earth.\n" * 200)
    out = os.path.join(d, "shards")
    rc, _, err = run("data", "prepare", "--input", docs, "--tokenizer", "gpt2", "--out", out,
                     "--name", "t", "--val-fraction", "0.2", "--shard-tokens", "2000")
    names = sorted(os.listdir(out)) if rc == 0 else []
    ok(rc == 0 and "t_val_000000.bin" in names and "t_train_000001.bin" in names
       and not any(".tmp" in n for n in names), "prepare writes val + rotating train shards",
       err + str(names))
    ok("3 document(s)" in err and "bytes/token" in err and "MB/s" in err, "prepare summary", err)
    # 3 documents -> 3 end-of-text tokens (50256) spread over the shards
    eots = 0
    for n in names:
        raw = open(os.path.join(out, n), "rb").read()
        toks = struct.unpack(f"<{(len(raw) - 1024) // 2}H", raw[1024:])
        eots += toks.count(50256)
        ok(max(toks) < 50257, f"{n}: ids within the GPT-2 vocabulary")
    ok(eots == 3, "one end-of-text token after each document", str(eots))
    rc, outp, err = run("data", "inspect", os.path.join(out, "t_val_000000.bin"), "--count", "8")
    ok(rc == 0 and "Document 0: In the" in outp, "inspect decodes with gpt2", outp + err)
    # bytes of no valid UTF-8 sequence are \xHH, a valid sequence itself (the raw bytes went
    # to the terminal)
    raw = os.path.join(d, "rawbytes.bin")
    write_shard(raw, [0xff, 0x41, 0xc3, 0xa9, 0xe2, 0x82, 0x1b, 0xc2, 0x85, 0xe2, 0x80, 0xae])
    rc, outp, err = run("data", "inspect", raw, "--tokenizer", "bytes")
    ok(rc == 0 and '"\\xffA\u00e9\\xe2\\x82\\x1b\\xc2\\x85\\xe2\\x80\\xae"' in outp,
       "inspect: invalid UTF-8 and control bytes as \\xHH, valid UTF-8 as it is", outp + err)
    # a trained tokenizer round-trips through prepare/inspect
    tokf = os.path.join(d, "mine.tok")
    rc, _, err = run("data", "tokenizer-train", "--input", docs, "--vocab-size", "300",
                     "--out", tokf)
    ok(rc == 0 and os.path.exists(tokf) and "bytes/token" in err, "tokenizer-train", err)
    out2 = os.path.join(d, "shards2")
    rc, _, err = run("data", "prepare", "--input", docs, "--tokenizer", tokf, "--out", out2)
    rc2, outp, err2 = run("data", "inspect", os.path.join(out2, "data_train_000000.bin"),
                          "--tokenizer", tokf, "--count", "12")
    ok(rc == 0 and rc2 == 0 and "Document" in outp, "prepare + inspect with a trained tokenizer",
       err + err2 + outp)
    # bad input
    empty = os.path.join(d, "empty.txt")
    open(empty, "w").close()
    expect_error(["data", "prepare", "--input", empty, "--out", os.path.join(d, "o1")],
                 "empty.txt", "empty", what="prepare: empty input")
    expect_error(["data", "prepare", "--input", os.path.join(d, "nope*.txt"), "--out",
                  os.path.join(d, "o2")], "nope*.txt", what="prepare: no input files")
    rc, ver, _ = run("--version")
    ok(rc == 0 and re.match(r"megascale \d+\.\d+\.\d+ \(git [^)]+\), backends: cpu", ver),
       "--version names the release, the commit and the backends", ver)
    # the commit is the checkout's at the build, not at CMake's configure
    # (git describe: a hash, or TAG-N-gHASH, or TAG; -dirty may differ)
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    desc = subprocess.run(["git", "-C", src, "describe", "--always", "--dirty"],
                          capture_output=True, text=True)
    if desc.returncode == 0 and desc.stdout.strip():
        want = desc.stdout.strip().removesuffix("-dirty")
        m = re.search(r"\(git ([^)]+)\)", ver)
        ok(m and m.group(1).removesuffix("-dirty") == want,
           f"--version's commit is the checkout's {want} (a stale build says another)", ver)
    for name in ("../x", "a/b", ".hidden", ""):  # issue 13: --name never leaves --out
        expect_error(["data", "prepare", "--input", docs, "--out", os.path.join(d, "o4"),
                      "--name", name], "--name", "plain file name", what=f"prepare: --name '{name}'")
    ok(not os.path.exists(os.path.join(d, "x_train_000000.bin")), "prepare: nothing outside --out")
    unreadable = os.path.join(d, "dir_as_file.txt")
    os.makedirs(unreadable)
    expect_error(["data", "prepare", "--input", os.path.join(d, "dir_as_*.txt"), "--out",
                  os.path.join(d, "o3")],
                 "matches only directories", "dir_as_file.txt",
                 what="prepare: a glob that matches a directory")
    bad = os.path.join(d, "bad.tok")
    raw = bytearray(open(tokf, "rb").read())
    raw[200] ^= 0x40
    open(bad, "wb").write(raw)
    expect_error(["data", "prepare", "--input", docs, "--tokenizer", bad, "--out",
                  os.path.join(d, "o4")], "bad.tok", what="prepare: corrupt tokenizer file")
    ok(not os.path.exists(os.path.join(d, "o4")) or not os.listdir(os.path.join(d, "o4")),
       "a failed prepare leaves no shard")
    # --data-dir (env MS_DATA_DIR): where "gpt2" is read from; the command line wins
    nodata = os.path.join(d, "nodata")
    shard = os.path.join(out, "t_val_000000.bin")
    expect_error(["data", "inspect", shard], f"--data-dir (env MS_DATA_DIR) {nodata} does not exist",
                 what="inspect: MS_DATA_DIR that does not exist", env=clean_env(MS_DATA_DIR=nodata))
    _, helptext, _ = run("data", "--help")
    m = re.search(r"--data-dir STR .*\[(.*?)\] \(env MS_DATA_DIR\)", helptext)
    shipped = m.group(1) if m else ""
    rc, outp, err = run("data", "inspect", shard, "--data-dir", shipped,
                        env=clean_env(MS_DATA_DIR=nodata))
    ok(m and rc == 0 and "Document 0: In the" in outp, "--data-dir overrides MS_DATA_DIR",
       helptext + outp + err)
    write_shard(os.path.join(d, "foreign.bin"), text_tokens(100), magic=777)
    expect_error(["data", "inspect", os.path.join(d, "foreign.bin")], "foreign.bin", "magic",
                 what="inspect: a foreign file")
    # prepare into a directory that holds another data set's shards: refused
    # without --force (issue 13, defect 6); --force leaves no stale shard
    fo = os.path.join(d, "shards_f")
    prep = ["data", "prepare", "--input", docs, "--tokenizer", "bytes", "--out", fo,
            "--val-fraction", "0.1"]
    rc, _, err = run(*prep, "--shard-tokens", "3000")
    before = sorted(os.listdir(fo)) if rc == 0 else []
    open(os.path.join(fo, "notes.txt"), "w").write("not a shard")
    ok(rc == 0 and len(before) > 4, "prepare: several shards", err + str(before))
    old = open(os.path.join(fo, "data_train_000000.bin"), "rb").read() if before else b""
    rc, _, err = run(*prep, "--shard-tokens", "100000")
    ok(rc == 2 and "already holds" in err and "--force" in err and "data_train_000000.bin" in err
       and sorted(os.listdir(fo)) == sorted(before + ["notes.txt"])
       and open(os.path.join(fo, "data_train_000000.bin"), "rb").read() == old,
       "prepare into another data set's shards is refused and changes nothing", err)
    rc, _, err = run(*prep, "--shard-tokens", "100000", "--name", "other")
    ok(rc == 0, "another --name in the same --out is fine", err)
    rc, _, err = run(*prep, "--shard-tokens", "100000", "--force", "1")
    names = sorted(os.listdir(fo))
    ok(rc == 0 and [n for n in names if n.startswith("data_")] ==
       ["data_train_000000.bin", "data_val_000000.bin"] and "notes.txt" in names
       and "other_train_000000.bin" in names and f"removed {len(before) - 2} old shard(s)" in err,
       "--force replaces the shards and removes the stale ones, nothing else", err + str(names))
    test_data_paths(d, docs)


def test_data_paths(d, docs):
    """Names and paths that look like patterns or prefixes of others: --force
    removes only NAME's own shards under --out; an input that exists is read
    as it is; tokenizer-train keeps what --out holds."""
    fx = os.path.join(d, "names")
    bare = ["data", "prepare", "--tokenizer", "bytes", "--val-fraction", "0"]
    prep = bare + ["--input", docs]
    rc, _, err = run(*prep, "--out", fx, "--name", "x_train")
    rc2, _, err2 = run(*prep, "--out", fx, "--name", "x", "--force", "1")
    ok(rc == 0 and rc2 == 0 and os.path.exists(os.path.join(fx, "x_train_train_000000.bin"))
       and os.path.exists(os.path.join(fx, "x_train_000000.bin")) and "removed" not in err2,
       "--force with --name x leaves --name x_train's shards alone", err + err2)
    g1, gp = os.path.join(d, "g1"), os.path.join(d, "g[1]")
    rc, _, err = run(*prep, "--out", g1)
    rc2, _, err2 = run(*prep, "--out", gp, "--force", "1")
    rc3, _, err3 = run(*prep, "--out", gp, "--shard-tokens", "3000")
    ok(rc == 0 and rc2 == 0 and os.listdir(g1) == ["data_train_000000.bin"]
       and rc3 == 2 and "already holds" in err3,
       "--out g[1] is that directory, not a pattern matching g1", err + err2 + err3)
    lit = os.path.join(d, "lit")
    os.makedirs(os.path.join(lit, "sub"))
    open(os.path.join(lit, "a[1].txt"), "w").write("hello world\n")
    open(os.path.join(lit, "a1.txt"), "w").write("OTHER FILE\n")
    rc, _, err = run(*bare, "--input", os.path.join(lit, "a[1].txt"), "--out",
                     os.path.join(d, "lit_o"))
    toks = tokens_of(os.path.join(d, "lit_o", "data_train_000000.bin")) if rc == 0 else []
    ok(rc == 0 and bytes(toks) == b"hello world\n", "an input named a[1].txt is that file",
       err + str(toks[:20]))
    rc, _, err = run(*bare, "--input", lit, "--out", os.path.join(d, "lit_d"))
    ok(rc == 0 and "2 document(s)" in err, "a directory input skips its subdirectories", err)
    expect_error([*bare, "--input", fx, "--out", fx, "--name", "x", "--force", "1"],
                 "a shard of", what="prepare: an input that is a shard it replaces")
    # tokenizer-train: documents are learnt apart; --out is kept unless --force
    xy = os.path.join(d, "xy.jsonl")
    open(xy, "w").write('{"text": "xy"}\n' * 500)
    tok = os.path.join(d, "xy.tok")
    rc, _, err = run("data", "tokenizer-train", "--input", xy, "--vocab-size", "300", "--out", tok)
    ok(rc == 0 and "vocabulary 258," in err, "tokenizer-train learns no token across documents",
       err)
    expect_error(["data", "tokenizer-train", "--input", xy, "--vocab-size", "300", "--out", tok],
                 "exists", "--force", what="tokenizer-train: an existing --out")
    rc, _, err = run("data", "tokenizer-train", "--input", xy, "--vocab-size", "300", "--out", tok,
                     "--force", "1")
    ok(rc == 0, "tokenizer-train --force 1 replaces --out", err)
    copy = os.path.join(d, "xy_copy.jsonl")
    shutil.copy(xy, copy)
    expect_error(["data", "tokenizer-train", "--input", copy, "--vocab-size", "300", "--out",
                  copy, "--force", "1"], "is the input", what="tokenizer-train: --out = --input")
    ok(open(copy).read() == open(xy).read(), "tokenizer-train never overwrites its input")
    # config values: a '#' inside quotes is the value's; a negative count is refused
    cfg = os.path.join(d, "hash.cfg")
    open(cfg, "w").write(f'out = "{d}/o#6"  # where\ntokenizer = bytes\nval_fraction = 0\n')
    rc, _, err = run("data", "prepare", "--config", cfg, "--input", docs)
    ok(rc == 0 and os.path.exists(os.path.join(d, "o#6", "data_train_000000.bin")),
       "a quoted config value keeps its '#'", err)
    # ... and its own quote: the closing one is followed by nothing or a comment
    open(cfg, "w").write(f'out = "{d}/o"q" # a "comment"\ntokenizer = bytes\nval_fraction = 0\n')
    rc, _, err = run("data", "prepare", "--config", cfg, "--input", docs)
    ok(rc == 0 and os.path.exists(os.path.join(d, 'o"q', "data_train_000000.bin")),
       "a quoted config value keeps a quote inside it; a comment after it may hold quotes", err)
    open(cfg, "w").write('out = "unterminated\n')
    expect_error(["data", "prepare", "--config", cfg, "--input", docs], "hash.cfg:1", "closing",
                 what="config: an unterminated quote")
    expect_error([*prep, "--out", os.path.join(d, "neg"), "--shard-tokens", " -1"],
                 "non-negative", what="--shard-tokens ' -1'")
    # inspect: llama-3 ids are not decoded with GPT-2; ids beyond a tokenizer are marked
    ll = os.path.join(d, "llama.bin")
    write_shard(ll, [1, 2, 128255], magic=20240801, version=7)
    rc, out, err = run("data", "inspect", ll)
    ok(rc == 0 and "128255" in out and "llama-3" in out, "inspect shows a llama-3 shard's ids",
       out + err)
    wide = os.path.join(d, "wide.bin")
    write_shard(wide, [70000, 72, 105], version=2)
    rc, out, err = run("data", "inspect", wide, "--tokenizer", "bytes")
    ok(rc == 0 and "<|id 70000|>Hi" in out, "inspect marks an id beyond the tokenizer", out + err)
    # every id below 256 with the default tokenizer: bytes, or GPT-2 ids of
    # plain ASCII ("a!b!" is 64 0 65 0): both shown (it decoded as bytes only)
    ab = os.path.join(d, "ab.bin")
    write_shard(ab, [64, 0, 65, 0])
    rc, out, err = run("data", "inspect", ab)
    ok(rc == 0 and 'decoded (bytes, as every id is below 256): "@\\x00A\\x00"' in out
       and 'decoded (gpt2): "a!b!"' in out, "inspect: ids below 256 decoded both ways", out + err)


def tokens_of(path):
    raw = open(path, "rb").read()
    return list(struct.unpack(f"<{(len(raw) - 1024) // 2}H", raw[1024:]))


# Every environment variable megascale reads besides the launcher's, by
# subcommand: each is an option of the table (docs/user-guide.md).
ENV_OPTIONS = {
    "train": {"MS_COMM_TIMEOUT": "comm-timeout", "MS_COMM_NCCL_SYNC": "comm-nccl-sync",
              "MS_CKPT_SHM_DIR": "ckpt-shm-dir", "MS_CKPT_FAULT": "ckpt-fault",
              "MS_CUDA_PROFILE": "cuda-profile", "MS_CUDA_FUSE_GELU": "cuda-fuse-gelu",
              "MS_CPU_PROFILE": "cpu-profile", "MS_CPU_DTYPE": "cpu-dtype",
              "MS_HEARTBEAT": "heartbeat", "MS_HEARTBEAT_TOKEN": "heartbeat-token",
              "MS_HEARTBEAT_ATTEMPT": "heartbeat-attempt",
              "MS_NONFINITE_REDO": "nonfinite-redo", "MS_NODE_MAP": "node-map"},
    "sample": {"MS_DATA_DIR": "data-dir", "MS_CUDA_PROFILE": "cuda-profile",
               "MS_CUDA_FUSE_GELU": "cuda-fuse-gelu"},
    "eval": {"MS_COMM_TIMEOUT": "comm-timeout", "MS_COMM_NCCL_SYNC": "comm-nccl-sync",
             "MS_CUDA_PROFILE": "cuda-profile", "MS_CUDA_FUSE_GELU": "cuda-fuse-gelu",
             "MS_CPU_DTYPE": "cpu-dtype"},
    "data": {"MS_DATA_DIR": "data-dir"},
    "ckpt": {"MS_CKPT_SHM_DIR": "ckpt-shm-dir"},
}


def clean_env(**extra):
    """This environment without any of the option variables, plus extra."""
    e = {k: v for k, v in os.environ.items()
         if not any(k in names for names in ENV_OPTIONS.values())}
    e.update(extra)
    return e


def test_env_switches(d, base):
    """The variables outside the options: a value they do not take is an error, never
    passed over (MS_ISA_CHECK=x checked, MS_BLAS_CORE=kep did not keep); more threads than
    the host's CPUs are a warning; a small --peak-flops is printed with its digits."""
    env = dict(os.environ, MS_ISA_CHECK="x")
    rc, _, err = run("--version", env=env)
    ok(rc == 2 and "MS_ISA_CHECK: 'x' is neither 0" in err, "MS_ISA_CHECK=x is an error", err)
    env = dict(os.environ, MS_BLAS_CORE="kep")
    rc, _, err = run(*base, "--steps", "1", env=env)
    ok(rc == 2 and "MS_BLAS_CORE: 'kep' is not 'keep'" in err, "MS_BLAS_CORE=kep is an error", err)
    cpus = len(os.sched_getaffinity(0))  # what this process may run on (taskset, a cpuset)
    rc, _, err = run(*base, "--steps", "1", "--threads", str(cpus + 1), "--peak-flops", "1e6")
    ok(rc == 0 and f"{cpus + 1} thread(s) on a rank that may run on {cpus} CPU(s)" in err
       and "a peak of 0.001000 GFLOP/s" in err,
       "more threads than the CPUs a rank may run on: a warning; a small peak keeps its digits",
       err)


def test_env_options(d, base):
    """The env column: --help names each variable, the environment sets the
    option, the command line overrides it, a bad value is named."""
    for cmd, names in ENV_OPTIONS.items():
        _, out, _ = run(cmd, "--help")
        for env, opt in names.items():
            ok(re.search(rf"^  --{opt} \S+ .*\(env {env}\)$", out, re.M),
               f"{cmd} --help lists --{opt} with (env {env})", out)
    _, out, _ = run("train", "--help")
    ok(sorted(re.findall(r"\(env (\w+)\)", out)) == sorted(ENV_OPTIONS["train"]),
       "train --help names exactly the train options' variables", out)

    def options(*extra, **env):
        mp = os.path.join(d, "env.jsonl")
        if os.path.exists(mp):
            os.remove(mp)
        rc, _, err = run(*base, "--steps", "1", "--metrics", mp, *extra, env=clean_env(**env))
        lines = [json.loads(l) for l in open(mp)] if rc == 0 else []
        cfg = [o for o in lines if o.get("type") == "config"]
        return cfg[0]["options"] if cfg else {"error": err}

    shm = os.path.join(d, "shm_env")
    o = options(MS_COMM_TIMEOUT="77", MS_CUDA_FUSE_GELU="0", MS_CKPT_SHM_DIR=shm)
    ok(o.get("comm-timeout") == 77 and o.get("cuda-fuse-gelu") == 0
       and o.get("ckpt-shm-dir") == shm and o.get("comm-nccl-sync") == 0,
       "the environment sets its options (the metrics' config line)", str(o))
    o = options("--comm-timeout", "55", "--cuda-fuse-gelu", "1", MS_COMM_TIMEOUT="77",
                MS_CUDA_FUSE_GELU="0")
    ok(o.get("comm-timeout") == 55 and o.get("cuda-fuse-gelu") == 1,
       "the command line overrides the environment", str(o))
    o = options()
    ok(o.get("comm-timeout") == 300 and o.get("ckpt-shm-dir") == "/dev/shm"
       and o.get("cuda-fuse-gelu") == 1 and o.get("ckpt-fault") is None,
       "defaults without the environment", str(o))
    expect_error([*base, "--steps", "1"], "environment MS_COMM_TIMEOUT", "--comm-timeout",
                 what="a bad environment value is named", env=clean_env(MS_COMM_TIMEOUT="soon"))
    expect_error([*base, "--steps", "2", "--ckpt-dir", os.path.join(d, "ck_env")],
                 "MS_CKPT_FAULT", "stage9:boom", what="a bad MS_CKPT_FAULT is named",
                 env=clean_env(MS_CKPT_FAULT="stage9:boom"))
    # no hidden knobs: only the option parser and the run context (the
    # launcher's rank variables, MS_LOG_LEVEL) read the environment
    src = os.environ.get("MS_SRC")
    if src:
        readers = []
        for root, _, files in os.walk(os.path.join(src, "src")):
            for f in files:
                path = os.path.join(root, f)
                rel = os.path.relpath(path, src)
                if not f.endswith((".c", ".h", ".cu", ".cuh")) or rel.startswith("src/cli/") \
                        or rel == "src/base/ctx.c":
                    continue
                if "getenv(" in open(path, errors="replace").read():
                    readers.append(rel)
        ok(not readers, "no library code calls getenv", str(readers))


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest() if os.path.exists(path) else path


def step_lines(path):
    return [json.loads(l) for l in open(path) if '"loss"' in l] if os.path.exists(path) else []


def test_nonfinite(d, base):
    """A transient NaN gradient (nan-grad@3) is redone from the same
    micro-batches: bitwise the run without it; --nonfinite-redo 0 skips the
    step, and no checkpoint holds it; a persistent one stops the run."""
    w0, m0 = os.path.join(d, "nf0.safetensors"), os.path.join(d, "nf0.jsonl")
    w1, m1 = os.path.join(d, "nf1.safetensors"), os.path.join(d, "nf1.jsonl")
    run(*base, "--steps", "5", "--metrics", m0, "--save-weights", w0)
    rc, _, err = run(*base, "--steps", "5", "--metrics", m1, "--save-weights", w1,
                     "--inject-fault", "nan-grad@3")
    s1 = step_lines(m1)
    ok(rc == 0 and [s["redone"] for s in s1] == [0, 0, 1, 0, 0]
       and not any(s["skipped"] for s in s1), "a transient NaN gradient: step 3 redone, none skipped",
       err + str(s1))
    ok("step 3: non-finite gradient" in err and "redoing the step (1 of 1)" in err,
       "a warning names the redone step", err)
    ok("non-finite in the gradients of rank 0" in err and
       [s.get("nan_ranks") for s in s1] == [None, None, [0], None, None],
       "the warning and the metrics name the rank whose gradients were not finite",
       err + str(s1))
    ok(rc == 0 and sha256(w1) == sha256(w0), "after the redo the weights are bitwise those of a run "
       "without the fault", f"{sha256(w1)} vs {sha256(w0)}")
    ok([s["loss"] for s in s1] == [s["loss"] for s in step_lines(m0)],
       "after the redo the losses are those of a run without the fault")
    ok(all(isinstance(s.get("wait_ms"), (int, float)) and s["compute_ms"] >= 0 and
           abs(s["compute_ms"] - max(0, s["ms"] - s["wait_ms"] - s["data_ms"])) < 0.01 for s in s1),
       "metrics: compute_ms = ms - wait_ms - data_ms", str(s1[:2]))
    ck, shm = os.path.join(d, "ck_nf"), os.path.join(d, "shm_nf")
    os.makedirs(shm)
    rc, _, err = run(*base, "--steps", "4", "--metrics", m1, "--nonfinite-redo", "0",
                     "--inject-fault", "nan-grad@3", "--ckpt-dir", ck, "--ckpt-every", "3",
                     "--ckpt-shm-dir", shm)
    s1 = step_lines(m1)
    ok(rc == 0 and [s["skipped"] for s in s1] == [False, False, True, False]
       and [s["redone"] for s in s1] == [0] * 4 and "the update was skipped" in err,
       "--nonfinite-redo 0: the NaN step is skipped", err)
    steps = sorted(n for n in os.listdir(ck) if n.startswith("step_")) if rc == 0 else []
    ok(steps == ["step_00000004"] and "none taken, in a streak of skipped" in err,
       "no checkpoint of a skipped step; the next clean step's is taken", err + str(steps))
    expect_error([*base, "--steps", "10", "--inject-fault", "nan-grad@2+", "--max-bad-steps", "2"],
                 "3 consecutive steps", "--max-bad-steps", what="persistent NaN gradients stop the run")
    # weights an update made Inf (lr x weight decay past float): an error at the next
    # non-finite loss, before any redo, naming the update; their checkpoint not committed
    ck = os.path.join(d, "ck_nfw")
    rc, _, err = run(*base, "--steps", "4", "--lr", "1e20", "--weight-decay", "1e20",
                     "--ckpt-dir", ck, "--ckpt-every", "1", "--ckpt-shm-dir", shm)
    ok(rc == 6 and "step 2: non-finite loss" in err and "the weights hold NaN or Inf" in err and
       "after the update of step 1" in err and "redoing" not in err and
       "holds a non-finite weight" in err and "step 1 was NOT committed" in err and
       not [n for n in os.listdir(ck) if n.startswith("step_")],
       "non-finite weights: exit 6 at step 2, named; no checkpoint of them", f"rc {rc}\n{err}")
    w2 = os.path.join(d, "nfw.safetensors")
    rc, _, err = run(*base, "--steps", "1", "--lr", "1e20", "--weight-decay", "1e20",
                     "--save-weights", w2)
    ok(rc == 6 and "after the last step: the weights hold NaN or Inf" in err and
       not os.path.exists(w2), "non-finite weights after the last step: exit 6, not saved",
       f"rc {rc}\n{err}")
    # finite weights too large for the forward: the run ends in skipped steps and says so
    rc, _, err = run(*base, "--steps", "3", "--lr", "1e30", "--save-weights", w2)
    ok(rc == 0 and "the run ended in 2 skipped step(s)" in err and
       "those of the update of step 1" in err, "a run ending in skipped steps says so", err)
    # the run's host-memory snapshot of those weights is not resumed from either
    rc, _, err = run(*base, "--steps", "4", "--lr", "1e20", "--weight-decay", "1e20",
                     "--ckpt-dir", ck, "--ckpt-every", "1", "--ckpt-shm-dir", shm,
                     "--resume", "auto")
    ok(rc == 6 and "(step 1) holds weights that are NaN or Inf; it is not used" in err and
       "starting from scratch" in err, "a snapshot of non-finite weights is not resumed",
       f"rc {rc}\n{err}")
    for beta in ("--beta1", "--beta2"):
        expect_error([*base, beta, "0.99999999"], f"{beta} 0.99999999 is 1 in float",
                     what=f"{beta} that rounds to 1 in float")
    expect_error([*base, "--inject-fault", "nan@x"], "--inject-fault", what="bad fault spec")
    expect_error([*base, "--nonfinite-redo", "-1"], "--nonfinite-redo", what="a negative redo count")


def test_option_ranges(d, base):
    """Each numeric option is checked against its range in the option table,
    non-finite numbers refused: before anything runs (issue 13, defects 8, 9
    and the silently coerced ints of 13); a count past 2^31 - 1, the largest
    the trainer's int steps hold, is named as such, not "expects an
    integer"."""
    mp = os.path.join(d, "range.jsonl")
    for opt, val, needle in [("--lr", "inf", "finite"), ("--lr", "0", "> 0"),
                             ("--lr-floor", "nan", "finite"), ("--beta1", "nan", "finite"),
                             ("--beta2", "1", "in [0,1)"), ("--weight-decay", "nan", "finite"),
                             ("--weight-decay", "-0.1", ">= 0"), ("--eps", "inf", "finite"),
                             ("--eps", "0", "> 0"), ("--grad-clip", "nan", "finite"),
                             ("--threads", "100000", "in [0,1024]"), ("--dp", "0", "[1,65536]"),
                             ("--micro-batch", "-1", "[0,"), ("--val-batches", "0", ">= 1"),
                             ("--comm-timeout", "0", "in (0,1e6]"),
                             ("--comm-timeout", "1e300", "in (0,1e6]"), ("--steps", "0", ">= 1"),
                             ("--steps", "3000000000", "must be at most 2147483647")]:
        if os.path.exists(mp):
            os.remove(mp)
        rc, _, err = run(*base, "--steps", "1", "--metrics", mp, opt, val)
        ok(rc == 2 and f"{opt} " in err and f"'{val}'" in err and needle in err
           and not os.path.exists(mp), f"{opt} {val} is refused at start-up naming the range",
           f"rc={rc}\n{err}")
    cfg = os.path.join(d, "range.cfg")
    open(cfg, "w").write("beta1 = 1.5\n")
    expect_error([*base, "--config", cfg], "range.cfg:1", "--beta1 must be in [0,1)",
                 what="a config file's value is held to the range")
    expect_error([*base, "--steps", "1"], "environment MS_NONFINITE_REDO", "--nonfinite-redo",
                 what="an environment value is held to the range",
                 env=clean_env(MS_NONFINITE_REDO="-2"))
    # a negative count showed every token of the shard
    expect_error(["data", "inspect", "x.bin", "--count", "-5"], "--count must be >= 0",
                 what="data inspect --count -5")
    for cmd in (["sample", "--weights", "w.safetensors"], ["data", "inspect", "x.bin"],
                ["diag"]):
        expect_error([*cmd, "--threads", "100000"], "--threads must be in [0,1024]",
                     what=f"{cmd[0]} --threads 100000 is refused")
    expect_error(["sample", "--weights", "w.safetensors", "--tokens", "2147483647"],
                 "--tokens must be in [0,16777216]", what="sample --tokens near 2^31 is refused")
    expect_error(["sample", "--weights", "w.safetensors", "--temperature", "nan"],
                 "--temperature expects a finite number", what="sample --temperature nan")
    # a --dim past 2^20: named (the model's size in bytes overflowed: "cannot allocate
    # 18989781275446.8 MB")
    expect_error([*base, "--steps", "1", "--dim", "1518500250", "--heads", "1"],
                 "dim must be in 1..1048576 (got 1518500250)", what="--dim 1518500250")
    # --tp x --pp past 2^31 (each in range): was a SIGFPE (int product 0)
    for cmd in ([*base, "--steps", "1"],
                ["eval", "--weights", "w.safetensors", "--val-data", "v.bin"]):
        expect_error([*cmd, "--tp", "65536", "--pp", "65536"],
                     "the job has 1 rank, which --tp 65536 x --pp 65536 = 4294967296 does not "
                     "divide", what=f"{cmd[0]} --tp 65536 --pp 65536 is refused, not a crash")
    _, out, _ = run("train", "--help")
    ok(re.search(r"^  --beta1 X .*\[0\.9\] \(in \[0,1\)\)$", out, re.M)
       and re.search(r"^  --threads N .*\(in \[0,1024\]\)$", out, re.M),
       "--help shows each option's range", out)


def test_ckpt_option_ranges(d):
    """megascale ckpt's numbers against their ranges: `shm --remove -1` (any
    value but 0) removed the snapshots, and `reshard --dp 100000` wrote
    100,005 files for a model of 0.1M parameters, a commit no run can load
    (train's --dp stops at 65536)."""
    out = os.path.join(d, "reshard_huge")
    expect_error(["ckpt", "reshard", d, "--dp", "100000", "--out", out],
                 "--dp must be in [1,65536], got '100000'", what="ckpt reshard --dp 100000")
    ok(not os.path.exists(out), "ckpt reshard --dp 100000 writes nothing", out)
    for val in ("-1", "2"):
        expect_error(["ckpt", "shm", d, "--remove", val], f"--remove must be in [0,1], got '{val}'",
                     what=f"ckpt shm --remove {val}")


def test_output_paths(d, base):
    """Every output path is checked at start-up, before any training: a bad
    --save-weights used to fail only after the whole run, losing its weights
    (issue 13, defect 5)."""
    mp, afile = os.path.join(d, "out.jsonl"), os.path.join(d, "out_file")
    open(afile, "w").write("x")
    nodir = os.path.join(d, "no_such_dir")
    for opt, path, needle in [("--save-weights", os.path.join(nodir, "w.safetensors"),
                               "does not exist"),
                              ("--save-weights", d, "is a directory"),
                              ("--metrics", os.path.join(afile, "m.jsonl"), "is not a directory"),
                              ("--ckpt-dir", afile, "not a directory"),
                              ("--ckpt-dir", os.path.join(afile, "a", "b"), "is not a directory"),
                              ("--trace-dir", os.path.join(afile, "t"), "is not a directory")]:
        if os.path.exists(mp):
            os.remove(mp)
        extra = [] if opt == "--metrics" else ["--metrics", mp]
        rc, _, err = run(*base, "--steps", "3", *extra, opt, path)
        ok(rc == 2 and f"{opt}: {path}" in err and needle in err and "step " not in err
           and not os.path.exists(mp), f"a bad {opt} ({needle}) fails at start-up, before training",
           f"rc={rc}\n{err}")
    # a --ckpt-shm-dir that is not there: named at start-up (it was "DIR/megascale-ckpt-
    # ...-s0: open snapshot: No such file or directory", exit 4, no option named)
    ck = os.path.join(d, "shm_ck")
    if os.path.exists(mp):
        os.remove(mp)
    rc, _, err = run(*base, "--steps", "3", "--metrics", mp, "--ckpt-dir", ck, "--ckpt-shm-dir",
                     nodir)
    ok(rc == 2 and f"--ckpt-shm-dir {nodir} (MS_CKPT_SHM_DIR): No such file or directory" in err
       and "step " not in err and not os.path.exists(os.path.join(ck, "job")),
       "a missing --ckpt-shm-dir fails at start-up naming the option", f"rc={rc}\n{err}")
    deep = os.path.join(d, "new_ck", "a", "b")
    rc, _, err = run(*base, "--steps", "1", "--ckpt-dir", deep, "--trace-dir",
                     os.path.join(d, "new_tr", "x"), "--ckpt-shm-dir", d)
    ok(rc == 0 and os.path.isdir(deep), "--ckpt-dir and --trace-dir are created where missing", err)


def test_resume_changed_data(d):
    """--data-order sequential resumed on a data set that changed since the
    checkpoint: the saved shard index or position is checked against the
    shards, and the run stops naming them, instead of reading out of bounds
    (issue 13, defect 1)."""
    ds = os.path.join(d, "rds")
    os.makedirs(ds)
    write_shard(os.path.join(ds, "s_000.bin"), text_tokens(200))  # steps 1-3 (64 tokens each)
    write_shard(os.path.join(ds, "s_001.bin"), text_tokens(5000))  # steps 4, 5: pos 128
    ck = os.path.join(d, "ck_rds")
    args = ["train", *TINY, "--data-order", "sequential", "--ckpt-dir", ck, "--ckpt-shm-dir", ds]
    rc, _, err = run(*args, "--train-data", os.path.join(ds, "s_*.bin"), "--steps", "5")
    ok(rc == 0, "a sequential run with a checkpoint in its second shard", err)
    one = os.path.join(ds, "s_000.bin")
    rc, _, err = run(*args, "--train-data", one, "--steps", "8", "--resume", "auto")
    ok(rc == 3 and "resume at step 5" in err and "shard index 1, but the data has 1 shard(s)" in err
       and one in err, "resume on fewer shards names the shard index and the count", f"rc={rc}\n{err}")
    write_shard(os.path.join(ds, "s_001.bin"), text_tokens(100))
    rc, _, err = run(*args, "--train-data", os.path.join(ds, "s_*.bin"), "--steps", "8",
                     "--resume", "auto")
    ok(rc == 3 and "token 128 of shard index 1" in err and "only 100 tokens" in err,
       "resume on a shorter shard names the position and the shard's size", f"rc={rc}\n{err}")
    write_shard(os.path.join(ds, "s_001.bin"), text_tokens(5000))
    rc, _, err = run(*args, "--train-data", os.path.join(ds, "s_*.bin"), "--steps", "8",
                     "--resume", "auto")
    ok(rc == 0 and "continuing at step 5" in err, "the same data resumes", err)


def test_spike(d, base):
    """spike=X multiplies the step's lr: the loss jumps after it."""
    m0, m1 = os.path.join(d, "sp0.jsonl"), os.path.join(d, "sp1.jsonl")
    run(*base, "--steps", "5", "--lr", "3e-3", "--metrics", m0)
    rc, _, err = run(*base, "--steps", "5", "--lr", "3e-3", "--metrics", m1,
                     "--inject-fault", "spike=3000@3")
    a, b = step_lines(m0), step_lines(m1)
    ok(rc == 0 and len(a) == len(b) == 5 and [s["loss"] for s in a[:3]] == [s["loss"] for s in b[:3]]
       and b[3]["loss"] > a[3]["loss"] + 1.0 and abs(b[2]["lr"] - 3000 * a[2]["lr"]) < 1e-3 * b[2]["lr"],
       "spike=3000@3: lr x 3000 at step 3, the loss at step 4 well above the run without it",
       err + str([s["loss"] for s in a]) + str([s["loss"] for s in b]))
    ok("injected fault spike" in err, "a warning names the spike", err)
    expect_error([*base, "--inject-fault", "spike=2@3:1"], "spike=2@3:1", "no rank or node target",
                 what="spike with a rank target")
    expect_error([*base, "--inject-fault", "spike=2@3:node=a"], "no rank or node target",
                 what="spike with a node target")
    expect_error([*base, "--inject-fault", "spike@3"], "spike needs =X", what="spike without X")


def test_node_targets(d, base):
    """A :node=NAME fault fires only on the node --node-map names (one
    process: rank 0 is the first name)."""
    rc, _, err = run(*base, "--steps", "3", "--node-map", "a", "--inject-fault", "exit@2:node=b")
    ok(rc == 0, "exit@2:node=b does not fire on node a", err)
    rc, _, err = run(*base, "--steps", "3", "--inject-fault", "exit@2:node=a",
                     env=clean_env(MS_NODE_MAP="a,b"))
    ok(rc == 42 and "step 2: injected fault: rank 0 exits" in err,
       "exit@2:node=a fires on node a (MS_NODE_MAP)", f"rc={rc}\n{err}")
    expect_error([*base, "--node-map", "a,,b"], "--node-map", "node name 2 is empty",
                 what="an empty node name")
    expect_error([*base, "--node-map", "a,b/c"], "node name 2 'b/c'", what="a bad node name")
    expect_error([*base, "--inject-fault", "exit@2:node=x y"], "exit@2:node=x y", "node name",
                 what="a bad node target")
    expect_error([*base, "--inject-fault", "exit@2:0:node=a"], "one target only",
                 what="a rank and a node target")
    # a fault past --steps never fires: said (a checkpoint point past it arms the serial
    # persist for tests, and is not)
    rc, _, err = run(*base, "--steps", "3", "--inject-fault", "exit@9,stage2:start@50")
    ok(rc == 0 and "exit@9 is past --steps 3: it never fires in this run" in err and
       "stage2:start@50" not in err, "exit@9 past --steps 3: said, the run trains", err)


def st_header(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def test_save_dtype(d, base, val):
    """--save-dtype bf16 writes BF16 tensors (each the f32 value rounded to
    nearest even), the file loads again (sample, --init-from), and
    transformers' config.json lands beside the weights: DIR/config.json for
    DIR/model.safetensors, STEM.config.json otherwise."""
    out = os.path.join(d, "hf")
    os.makedirs(out)
    f32, b16 = os.path.join(out, "model.safetensors"), os.path.join(d, "w16.safetensors")
    common = [*base, "--steps", "3", "--seed", "7"]
    rc, _, err = run(*common, "--save-weights", f32)
    rc2, _, err2 = run(*common, "--save-weights", b16, "--save-dtype", "bf16")
    ok(rc == 0 and rc2 == 0, "runs with --save-dtype f32 / bf16", err + err2)
    if rc or rc2:
        return
    h32, d32 = st_header(f32)
    h16, d16 = st_header(b16)
    names = [k for k in h32 if k != "__metadata__"]
    ok(all(h16[k]["dtype"] == "BF16" and h16[k]["shape"] == h32[k]["shape"] for k in names)
       and h16["__metadata__"].get("dtype") == "bf16", "bf16: every tensor is BF16, same shapes")
    ok(len(d16) * 2 <= len(d32) + 64, f"bf16: half the bytes ({len(d16)} vs {len(d32)})")
    e32, e16 = h32["wte.weight"]["data_offsets"], h16["wte.weight"]["data_offsets"]
    a = struct.unpack(f"<{(e32[1] - e32[0]) // 4}f", d32[e32[0]:e32[1]])
    b = struct.unpack(f"<{(e16[1] - e16[0]) // 2}H", d16[e16[0]:e16[1]])

    def to_bf16(x):  # round to nearest even
        (u,) = struct.unpack("<I", struct.pack("<f", x))
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
    ok(len(a) == len(b) and all(to_bf16(x) == y for x, y in zip(a, b)),
       "bf16: each weight is its f32 value rounded to nearest even")
    cfg = json.load(open(os.path.join(out, "config.json")))
    ok(cfg["model_type"] == "gpt2" and cfg["n_layer"] == 2 and cfg["n_embd"] == 32 and
       cfg["n_head"] == 2 and cfg["vocab_size"] == 256 and cfg["n_positions"] == 32 and
       cfg["torch_dtype"] == "float32", "config.json beside model.safetensors", json.dumps(cfg))
    cfg16 = json.load(open(os.path.join(d, "w16.config.json")))
    ok(cfg16["torch_dtype"] == "bfloat16", "STEM.config.json beside w16.safetensors")
    rc, out_s, err = run("sample", "--weights", b16, "--tokenizer", "bytes", "--prompt", "In",
                         "--tokens", "4")
    ok(rc == 0, "sample loads the bf16 weights", err)
    rc, _, err = run(*base, "--steps", "1", "--init-from", b16)
    ok(rc == 0, "--init-from takes the bf16 weights", err)
    expect_error([*base, "--steps", "1", "--save-weights", b16, "--save-dtype", "f16"],
                 "--save-dtype f16", what="an unknown --save-dtype")
    par = os.path.join(d, "par.safetensors")
    # over a serial model's weights: their config.json (a 2-layer GPT-2, which
    # from_pretrained would fill with the parallel block's weights) was kept
    rc0, _, err0 = run(*base, "--steps", "1", "--save-weights", par)
    had = os.path.exists(os.path.join(d, "par.config.json"))
    rc, _, err = run(*base, "--steps", "1", "--block", "parallel", "--save-weights", par)
    ok(rc0 == 0 and had and rc == 0 and not os.path.exists(os.path.join(d, "par.config.json"))
       and "not GPT-2's architecture" in err and "was removed" in err,
       "no config.json for a parallel block (the replaced weights' one removed)", err0 + err)
    # --block against an --init-from file: it was silently ignored (a serial block trained)
    rc, _, err = run(*base, "--steps", "1", "--init-from", par)
    ok(rc == 0 and "parallel block" in err, "--init-from a parallel block's weights", err)
    expect_error([*base, "--steps", "1", "--init-from", par, "--block", "serial"],
                 "--block serial disagrees with", "which holds a parallel block",
                 what="--block contradicting --init-from")
    expect_error([*base, "--steps", "1", "--init-from", b16, "--block", "parallel"],
                 "--block parallel disagrees with", "which holds a serial block",
                 what="--block parallel on a serial model's weights")
    # --model against an --init-from file: it was silently ignored too
    expect_error([*base, "--steps", "1", "--init-from", b16, "--model", "d6"],
                 "--model d6 (6 layers, dim 384, 6 heads) disagrees with", "2 layers, dim 32",
                 what="--model contradicting --init-from")


def test_resume_record(d, train):
    """A commit records the optimizer's hyperparameters and the data paths,
    and a resume that changes them says so (nothing said when they agree)."""
    ck = os.path.join(d, "rec")
    other = os.path.join(d, "train2.bin")
    shutil.copy(train, other)
    common = ["train", *TINY, "--ckpt-dir", ck, "--ckpt-every", "2"]
    rc, _, err = run(*common, "--train-data", train, "--steps", "2")
    step = open(os.path.join(ck, "latest")).read().strip() if rc == 0 else ""
    man = json.load(open(os.path.join(ck, step, "manifest.json"))) if step else {}
    tr = man.get("trainer", {})
    ok(tr.get("optimizer", {}).get("beta2") == 0.95 and tr.get("data", {}).get("train") == train,
       "the commit records the optimizer and the data", json.dumps(tr)[:600] + err)
    rc, _, err = run(*common, "--train-data", train, "--steps", "4", "--resume", "auto")
    ok(rc == 0 and "--beta2" not in err and "--train-data" not in err,
       "a resume with the same options says nothing of them", err)
    rc, _, err = run(*common, "--train-data", other, "--steps", "6", "--resume", "auto",
                     "--beta2", "0.9", "--weight-decay", "0.5")
    ok(rc == 0 and "resume: --beta2 0.9 differs from the checkpoint's 0.95" in err and
       "resume: --weight-decay 0.5 differs" in err and
       f"resume: --train-data '{other}' differs from the checkpoint's '{train}'" in err,
       "a resume with other hyperparameters and data says so", err)


def test_resume_tokens(d, train):
    """The metrics' tokens go on from the commit's count when a resume
    changes --batch and --seq (they were step x the new batch x seq)."""
    ck, m = os.path.join(d, "tok"), os.path.join(d, "tok.jsonl")
    common = ["train", *TINY, "--train-data", train, "--ckpt-dir", ck, "--ckpt-every", "2",
              "--metrics", m]
    rc, _, err = run(*common, "--steps", "2")  # batch 4 x seq 16: 64 a step
    rc2, _, err2 = run(*common, "--steps", "4", "--resume", "auto", "--batch", "8", "--seq", "8")
    rows = {}
    try:
        rows = {o["step"]: o["tokens"] for o in map(json.loads, open(m)) if "tokens" in o}
    except (OSError, ValueError):
        pass
    man = {}
    try:
        man = json.load(open(os.path.join(ck, "step_00000004", "manifest.json")))
    except (OSError, ValueError):
        pass
    ok(rc == 0 and rc2 == 0 and rows.get(2) == 128 and rows.get(3) == 192 and rows.get(4) == 256
       and man.get("trainer", {}).get("tokens") == 256,
       "tokens after a resume with another --batch/--seq: 128 + 64 a step, and in the commit",
       f"{rows} {man.get('trainer')}\n{err}{err2}")


def test_new_run(d, train):
    """A fresh start in a --ckpt-dir holding another run's commits is refused
    (they would mix, and --resume auto would later pick the older run's
    higher step); --new-run moves them to DIR/previous-<date>/ first."""
    ck = os.path.join(d, "twice")
    common = ["train", "--train-data", train, *TINY, "--ckpt-dir", ck, "--ckpt-every", "2"]
    rc, _, err = run(*common, "--steps", "4")
    ok(rc == 0, "a first run with checkpoints", err)
    before = sorted(os.listdir(ck))
    rc, _, err = run(*common, "--steps", "2")
    ok(rc == 2 and "already holds the checkpoints of a run" in err and "--resume auto" in err and
       "--new-run" in err and sorted(os.listdir(ck)) == before,
       "a second fresh run in the same --ckpt-dir is refused, nothing touched", err)
    rc, _, err = run(*common, "--steps", "2", "--new-run", "1")
    aside = [e for e in os.listdir(ck) if e.startswith("previous-")]
    ok(rc == 0 and len(aside) == 1 and
       "step_00000004" in os.listdir(os.path.join(ck, aside[0])) and
       not os.path.exists(os.path.join(ck, "step_00000004")),
       "--new-run moves the earlier run's commits aside", err + str(os.listdir(ck)))
    rc, _, err = run(*common, "--steps", "3", "--resume", "auto")
    ok(rc == 0 and "continuing at step 2" in err,
       "--resume auto then continues the new run, not the older run's step 4", err)


def main():
    d = tempfile.mkdtemp(prefix="ms_cli_")
    train = os.path.join(d, "train.bin")
    val = os.path.join(d, "val.bin")
    write_shard(train, text_tokens(20000))
    write_shard(val, text_tokens(3000))
    base = ["train", "--train-data", train, *TINY]

    # --- --cpu-profile: a table of every op at exit, GEMMs by shape with their rate; the
    # losses are those of a run without it ---
    m0, m1 = os.path.join(d, "prof0.jsonl"), os.path.join(d, "prof1.jsonl")
    rc0, _, err0 = run(*base, "--steps", "3", "--metrics", m0, "--data-order", "sequential")
    rc, _, err = run(*base, "--steps", "3", "--metrics", m1, "--data-order", "sequential",
                     "--cpu-profile", "1")
    rows = re.findall(r"^\[megascale r0 info\]   (gemm [NT]{2} \d+x\d+x\d+[^\n]*?)\s+(\d+)\s+"
                      r"([\d.]+)\s+([\d.]+)%\s+([\d.]+)\s+([\d.]+)$", err, re.M)
    ops = re.findall(r"^\[megascale r0 info\]   (\w+)\s+(\d+)\s+[\d.]+\s+[\d.]+%", err, re.M)
    names = {o for o, _ in ops}
    loss = lambda p: [json.loads(l)["loss"] for l in open(p) if '"loss"' in l]  # noqa: E731
    ok(rc0 == 0 and rc == 0 and "cpu profile (--cpu-profile" in err and len(rows) >= 4
       and all(float(r[5]) > 0 for r in rows)
       and {"adamw_step", "attention_fwd", "attention_bwd", "layernorm_bwd"} <= names
       and loss(m0) == loss(m1) and "cpu profile" not in err0,
       "--cpu-profile prints every op, GEMMs with GFLOP/s, and changes no loss", err[-3000:])
    cfg0 = next((json.loads(l) for l in open(m0) if '"config"' in l), {}) if rc0 == 0 else {}
    ok(re.search(r"device cpu \(\d+ threads; compiled for [^;]+; fp32 GEMMs: (own (AVX-512|AVX2) kernel|"
                 r"OpenBLAS \([^)]*\)); OpenBLAS core \w+", err0) is not None
       and cfg0.get("cpu_blas", "").startswith("OpenBLAS core ")
       and cfg0.get("cpu_gemm") in ("own-avx512", "own-avx2", "openblas"),
       "the start-up line and the metrics' config line name the fp32 GEMMs and the OpenBLAS "
       "kernels", err0[-2000:])

    # --- --peak-cache: the first start probes the peak and writes DIR/peak-HOST.json; the next
    # reads it instead (no 2048^3 GEMM in its --cpu-profile table) and its MFU is against the
    # probe's value; a corrupt cache, or one made for other threads, is ignored with a note and
    # the peak probed again and written ---
    pc = os.path.join(d, "peakcache")
    probe_row = re.compile(r"^\[megascale r0 info\]   gemm NN 2048x2048x2048 ", re.M)

    def pc_run(name, *extra):
        m = os.path.join(d, f"pc_{name}.jsonl")
        rc, _, err = run(*base, "--steps", "3", "--metrics", m, "--peak-cache", pc,
                         "--cpu-profile", "1", *extra)
        lines = [json.loads(l) for l in open(m)] if rc == 0 else []
        cfg = next((l for l in lines if l.get("type") == "config"), {})
        return rc, err, cfg, [l for l in lines if "mfu" in l]

    def pc_file():
        names = [n for n in os.listdir(pc) if n.endswith(".json")] if os.path.isdir(pc) else []
        try:
            return names, json.load(open(os.path.join(pc, names[0])))
        except (IndexError, OSError, ValueError):
            return names, {}

    rc, err, cfg1, _ = pc_run("first")
    names, doc = pc_file()
    ent = (doc.get("entries") or [{}])[0]
    ok(rc == 0 and probe_row.search(err) and "none yet: probing" in err
       and cfg1.get("peak_source", "").startswith("probed") and len(names) == 1
       and names[0].startswith("peak-") and doc.get("format") == "megascale-peak-cache"
       and doc.get("version") == 1 and ent.get("flops") == cfg1.get("peak_flops")
       and ent.get("probes") == 1 and ent.get("key", {}).get("threads") == 2,
       "--peak-cache: the first start probes and writes the peak", err[-2000:] + str(doc))
    rc, err, cfg2, steps2 = pc_run("second")
    want = lambda s: cfg2["flops_per_token"] * s["tok_s"] / cfg1["peak_flops"]  # noqa: E731
    ok(rc == 0 and not probe_row.search(err) and "cpu profile" in err
       and re.search(r"MFU against a peak of [\d.]+ GFLOP/s per rank: cached in \S+peak-", err)
       and cfg2.get("peak_source", "").startswith("cached in ")
       and cfg2.get("peak_flops") == cfg1.get("peak_flops") and len(steps2) == 3
       and all(abs(s["mfu"] - want(s)) <= 1e-5 + want(s) * 0.06 / s["tok_s"] for s in steps2),
       "--peak-cache: a restart reads the peak, runs no probe, and its MFU is against the "
       "probe's value", err[-3000:] + str(cfg2) + str(steps2))
    os.makedirs(pc, exist_ok=True)
    open(os.path.join(pc, names[0] if names else "x.json"), "w").write('{"format": ')
    rc, err, cfg3, _ = pc_run("corrupt")
    _, doc = pc_file()
    ok(rc == 0 and probe_row.search(err) and "not a JSON object (corrupt): ignored, probing" in err
       and cfg3.get("peak_source", "").startswith("probed") and len(doc.get("entries", [])) == 1,
       "--peak-cache: a corrupt cache is ignored with a note, the peak probed and rewritten",
       err[-2000:] + str(doc))
    rc, err, cfg4, _ = pc_run("threads1", "--threads", "1")
    _, doc = pc_file()
    ok(rc == 0 and probe_row.search(err)
       and "no entry for this rank (the newest was made for threads 2, this rank's is 1)" in err
       and cfg4.get("peak_source", "").startswith("probed")
       and [e["key"]["threads"] for e in doc.get("entries", [])] == [1, 2],
       "--peak-cache: a cache made for other threads is ignored with a note; both are kept",
       err[-2000:] + str(doc))
    rc, err, cfg5, _ = pc_run("again")
    ok(rc == 0 and not probe_row.search(err) and cfg5.get("peak_flops") == cfg3.get("peak_flops"),
       "--peak-cache: the first key's entry still serves its runs", err[-2000:])
    # a run of 50 steps on a cached single probe still takes the two warm-up probes (2 products
    # of each kernel each) and writes the best of the three; the next probes nothing
    probes = lambda err: [int(n) for n in re.findall(  # noqa: E731
        r"^\[megascale r0 info\]   gemm NN 2048x2048x2048\s+(\d+)", err, re.M)]
    rc, err, _, _ = pc_run("long", "--steps", "50")
    _, doc = pc_file()
    ent = next((e for e in doc.get("entries", []) if e["key"]["threads"] == 2), {})
    ok(rc == 0 and probes(err) == [8] and ent.get("probes") == 3
       and ent.get("flops", 0) >= cfg3.get("peak_flops", 1),
       "--peak-cache: a long run re-probes a one-probe cache in warm-up and writes the best of 3",
       err[-2000:] + str(doc))
    rc, err, cfg6, _ = pc_run("long2", "--steps", "50")
    ok(rc == 0 and probes(err) == [] and "best of 3 GEMM probes" in cfg6.get("peak_source", "")
       and cfg6.get("peak_flops") == ent.get("flops"),
       "--peak-cache: a cached peak of 3 probes is not probed again in warm-up", err[-2000:])

    # --- a short training run: loss falls, metrics have the fields ---
    metrics = os.path.join(d, "m.jsonl")
    w1 = os.path.join(d, "w1.safetensors")
    rc, out, err = run(*base, "--val-data", val, "--steps", "30", "--lr", "3e-3", "--metrics", metrics,
                       "--save-weights", w1, "--val-every", "10", "--val-batches", "2")
    ok(rc == 0, "tiny training run succeeds", err)
    steps = [json.loads(l) for l in open(metrics)] if rc == 0 else []
    train_steps = [s for s in steps if "loss" in s]
    vals = [s for s in steps if "val_loss" in s]
    ok(len(train_steps) == 30, "one metrics line per step", str(len(train_steps)))
    ok(all(k in train_steps[0] for k in ("step", "loss", "lr", "grad_norm", "ms", "tok_s", "mfu",
                                         "tokens", "wall", "peak_rss_mb"))
       if train_steps else False, "metrics fields", str(train_steps[:1]))
    ok(train_steps and [s["tokens"] for s in train_steps] == [64 * i for i in range(1, 31)],
       "tokens seen", str([s.get("tokens") for s in train_steps][:5]))
    ok(train_steps and all(0 < s["mfu"] <= 1 for s in train_steps), "MFU never above 100%",
       str([s["mfu"] for s in train_steps]))
    cfg = steps[0] if steps else {}
    ok(cfg.get("type") == "config" and cfg["options"]["steps"] == 30 and cfg["layout"]["dp"] == 1
       and "peak_source" in cfg and cfg["peak_flops"] > 0,
       "the metrics open with the run's effective configuration", str(cfg)[:2000])
    ok("MFU against a peak of" in err, "the start-up line says which peak is used", err)
    ok("saves no model" not in err, "no warning when the run saves its weights", err)
    rc, _, err = run(*base, "--steps", "1")
    ok(rc == 0 and "saves no model" in err, "a run that saves nothing says so at start", err)
    tdir = os.path.join(d, "trace")
    ok(os.path.exists(os.path.join(tdir, "events_r00000.jsonl")),
       "tracing is on by default next to the metrics", str(os.listdir(d)))
    ok(train_steps and train_steps[-1]["loss"] < train_steps[0]["loss"] - 1.0, "loss falls",
       str([s["loss"] for s in train_steps]))
    ok(len(vals) >= 3 and vals[-1]["val_loss"] < vals[0]["val_loss"], "validation loss falls", str(vals))
    ok("ETA" in err and "MFU" in err and "tok/s" in err, "progress line", err)

    # --- determinism: same seed, same losses bit for bit ---
    m2 = os.path.join(d, "m2.jsonl")
    rc, _, err = run(*base, "--val-data", val, "--steps", "30", "--lr", "3e-3", "--metrics", m2,
                     "--val-every", "10", "--val-batches", "2")
    l1 = [s.get("loss", s.get("val_loss")) for s in steps]
    l2 = [s.get("loss", s.get("val_loss")) for s in map(json.loads, open(m2))] if rc == 0 else []
    ok(l1 == l2, "same seed gives identical losses", f"{l1[:5]} vs {l2[:5]}")

    # --- weights round trip: --init-from the saved file continues from it ---
    m3 = os.path.join(d, "m3.jsonl")
    rc, _, err = run("train", "--train-data", train, "--init-from", w1, "--seq", "16", "--batch", "4",
                     "--steps", "1", "--val-data", val, "--val-batches", "2", "--metrics", m3,
                     "--lr", "1e-9")
    v3 = [json.loads(l) for l in open(m3) if "val_loss" in l] if rc == 0 else []
    ok(rc == 0 and abs(v3[0]["val_loss"] - vals[-1]["val_loss"]) < 1e-5,
       "init-from reproduces the saved model's validation loss", err + str(v3[:1]) + str(vals[-1:]))

    # --- gradient accumulation: 4 micro-batches of 1 = one batch of 4 ---
    def losses(*extra):
        mp = os.path.join(d, "acc.jsonl")
        rc, _, err = run(*base, "--steps", "4", "--data-order", "sequential", "--metrics", mp, *extra)
        return [s["loss"] for s in map(json.loads, open(mp)) if "loss" in s] if rc == 0 else [err]
    whole, accum = losses(), losses("--micro-batch", "1")
    ok(len(whole) == 4 and len(accum) == 4 and
       all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(accum, whole)),
       "gradient accumulation matches the whole batch", f"{accum} vs {whole}")

    # --- recomputation: the same bits, less activation memory ---
    def weights_and_acts(block, rc):
        wp = os.path.join(d, f"rc_{block}_{rc}.safetensors")
        code, _, err = run(*base, "--steps", "3", "--block", block, "--recompute", rc,
                           "--save-weights", wp, "--seq", "32", "--batch", "16", "--layers", "6")
        acts = re.search(r"activations ([0-9.]+) MB", err)
        return (open(wp, "rb").read() if code == 0 else err), float(acts.group(1)) if acts else 0
    for block in ("serial", "parallel"):
        w_none, a_none = weights_and_acts(block, "none")
        for rc in ("gelu", "ln", "gelu,ln"):
            w_rc, a_rc = weights_and_acts(block, rc)
            ok(w_rc == w_none, f"{block} block: --recompute {rc} gives bitwise the same weights")
            ok(0 < a_rc < a_none, f"{block} block: --recompute {rc} keeps fewer activations "
               f"({a_rc} MB vs {a_none} MB)")
    expect_error(base + ["--recompute", "gelu,mlp"], "--recompute gelu,mlp", "unknown activation",
                 what="a bad --recompute names the value")

    # --- other model / optimiser options run and learn ---
    for extra in (["--optimizer", "lamb", "--lr", "5e-2"], ["--block", "parallel", "--attn-window", "8"],
                  ["--lr-schedule", "constant", "--warmup", "5", "--grad-clip", "0"]):
        mp = os.path.join(d, "opt.jsonl")
        rc, _, err = run(*base, "--steps", "20", "--lr", "3e-3", "--metrics", mp, *extra)
        ls = [s["loss"] for s in map(json.loads, open(mp)) if "loss" in s] if rc == 0 else []
        ok(len(ls) == 20 and ls[-1] < ls[0] - 0.5, f"training with {' '.join(extra)} learns",
           err + str(ls))

    # --- Hugging Face names with the "transformer." prefix load too ---
    raw = open(w1, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    hdr = json.loads(raw[8:8 + n])
    hdr = {(k if k == "__metadata__" else "transformer." + k): v for k, v in hdr.items()}
    hb = json.dumps(hdr).encode()
    hb += b" " * ((8 - (8 + len(hb)) % 8) % 8)
    pref = os.path.join(d, "prefixed.safetensors")
    open(pref, "wb").write(struct.pack("<Q", len(hb)) + hb + raw[8 + n:])
    rc, out, err = run("sample", "--weights", pref, "--prompt", "In the", "--tokens", "20", "--seed", "3")
    rc2, out2, _ = run("sample", "--weights", w1, "--prompt", "In the", "--tokens", "20", "--seed", "3")
    ok(rc == 0 and out == out2, "a transformer.-prefixed file loads the same weights", err)

    # --- sampling ---
    rc, out, err = run("sample", "--weights", w1, "--prompt", "In the", "--tokens", "40")
    ok(rc == 0 and out.startswith("In the") and len(out) >= 40, "sample prints text", out + err)
    # issue 13: --tokenizer ids takes ids in, gives ids out; --tokens is bounded
    rc, out, err = run("sample", "--weights", w1, "--tokenizer", "ids", "--prompt", "73 110,32",
                       "--tokens", "5")
    ok(rc == 0 and re.fullmatch(r"73 110,32( \d+){5}\n", out), "sample --tokenizer ids runs",
       out + err)
    expect_error(["sample", "--weights", w1, "--tokenizer", "ids", "--prompt", "In the"],
                 "'In the' is not a token id", what="sample: ids prompt that is text")
    expect_error(["sample", "--weights", w1, "--tokenizer", "ids", "--prompt", "999"],
                 "[0, 256)", what="sample: an id out of the vocabulary")
    expect_error(["sample", "--weights", w1, "--tokens", "2147483647"], "--tokens must be in",
                 what="sample: --tokens too large (was a signed overflow)")
    # --heads against a file that says: an error, as eval's (it was silently ignored)
    expect_error(["sample", "--weights", w1, "--heads", "3", "--tokens", "1"],
                 "--heads 3 disagrees with", "which holds 2", what="sample: --heads contradicts")
    expect_error(["sample", "--weights", w1, "--heads", "-1"], "--heads must be >= 0",
                 what="sample: --heads -1")
    # --top-k k keeps exactly k ids, ties at the k-th value to the lowest ids: weights
    # of zeros tie every logit, and --top-k 1 sampled among all 256 ids, not 1
    raw1 = open(w1, "rb").read()
    (n1,) = struct.unpack("<Q", raw1[:8])
    zero = os.path.join(d, "zero.safetensors")
    open(zero, "wb").write(raw1[:8 + n1] + bytes(len(raw1) - 8 - n1))
    outs = [run("sample", "--weights", zero, "--tokenizer", "ids", "--prompt", "1", "--tokens",
                "12", "--top-k", k, "--temperature", "1", "--seed", "5")[1] for k in ("1", "3")]
    ok(outs[0].split() == ["1"] + ["0"] * 12 and len(outs[1].split()) == 13
       and set(outs[1].split()[1:]) <= {"0", "1", "2"},
       "sample --top-k with tied logits keeps exactly k ids (the lowest)", str(outs))
    # a model with more ids than bytes: an id >= 256 is shown as itself, not as id % 256
    w512 = os.path.join(d, "w512.safetensors")
    tiny512 = [x if x != "256" else "512" for x in base]
    rc, _, err = run(*tiny512, "--steps", "1", "--save-weights", w512)
    rc2, out, err2 = run("sample", "--weights", w512, "--tokenizer", "bytes", "--prompt", "In",
                         "--tokens", "60", "--seed", "3")
    rc3, ids, _ = run("sample", "--weights", w512, "--tokenizer", "ids", "--prompt", "73 110",
                      "--tokens", "60", "--seed", "3")
    big = [int(t) for t in ids.split()[2:] if int(t) >= 256]
    ok(rc == 0 and rc2 == 0 and rc3 == 0 and big and f"<|id {big[0]}|>" in out,
       "sample --tokenizer bytes shows ids beyond the bytes as <|id N|>", err + err2 + out + ids)

    # --- interruption: SIGINT stops at a step boundary and saves weights ---
    w4 = os.path.join(d, "w4.safetensors")
    p = subprocess.Popen([BIN, *base, "--steps", "100000", "--save-weights", w4, "--log-every", "1"],
                         stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    line = ""
    while time.time() < deadline:  # wait for the first step
        line = p.stderr.readline()
        if "step" in line and "loss" in line:
            break
    p.send_signal(signal.SIGINT)
    err = p.communicate(timeout=60)[1]
    ok(p.returncode == 0 and os.path.exists(w4) and "interrupted" in err,
       "SIGINT stops cleanly and saves the weights", f"rc={p.returncode}\n{err}")

    test_nonfinite(d, base)
    test_env_switches(d, base)
    test_spike(d, base)
    test_option_ranges(d, base)
    test_ckpt_option_ranges(d)
    test_output_paths(d, base)
    test_resume_changed_data(d)
    test_node_targets(d, base)

    # --- a resumed run continues the metrics file (no duplicated steps) ---
    m6, ck = os.path.join(d, "m6.jsonl"), os.path.join(d, "ck6")
    run(*base, "--steps", "8", "--metrics", m6, "--ckpt-dir", ck, "--ckpt-every", "3",
        "--inject-fault", "exit@6")
    rc, _, err = run(*base, "--steps", "8", "--metrics", m6, "--ckpt-dir", ck, "--resume", "auto")
    lines6 = [json.loads(l) for l in open(m6)] if rc == 0 else []
    steps6 = [o["step"] for o in lines6 if "step" in o and o.get("type") != "ckpt"]
    ok(steps6 == list(range(1, 9)), "resume keeps the metrics of saved steps, then appends",
       err + str(steps6))
    # the commit of 3 has a line if the first run noticed it before its exit at 6
    ck6 = [o["step"] for o in lines6 if o.get("type") == "ckpt"]
    ok(ck6 in ([8], [3, 8]), "resume keeps the commit lines up to its step, then appends",
       str(ck6))
    cfg6 = [o for o in lines6 if o.get("type") == "config"]
    ok([c["resume_step"] for c in cfg6] == [0, 3] and cfg6[0]["options"]["steps"] == 8,
       "each run of a resumed metrics file starts with its config line", str(cfg6)[:2000])

    # --- bad input, each named ---
    expect_error(["train", "--bogus-flag", "1"], "--bogus-flag", what="unknown flag")
    expect_error(["train", "--steps", "ten"], "--steps", "integer", what="non-integer value")
    expect_error(["train", "--train-data", os.path.join(d, "missing_*.bin"), *TINY[0:2]],
                 "missing_", what="missing shard")
    write_shard(os.path.join(d, "trunc.bin"), text_tokens(5000), truncate=100)
    expect_error(["train", "--train-data", os.path.join(d, "trunc.bin"), *TINY], "trunc.bin",
                 "truncated", what="truncated shard")
    write_shard(os.path.join(d, "magic.bin"), text_tokens(5000), magic=12345)
    expect_error(["train", "--train-data", os.path.join(d, "magic.bin"), *TINY], "magic.bin",
                 "magic", what="wrong magic")
    write_shard(os.path.join(d, "big.bin"), [300] * 5000)
    expect_error(["train", "--train-data", os.path.join(d, "big.bin"), *TINY, "--steps", "2"],
                 "big.bin", "300", what="token id >= vocab")
    cfg = os.path.join(d, "bad.cfg")
    open(cfg, "w").write("steps = 3\nnot_an_option = 4\n")
    expect_error(["train", "--config", cfg], "bad.cfg:2", "not_an_option", what="bad config file")
    open(cfg, "wb").write(b"steps = 3\nlr = 1e-3\x00\nsteps = x\n")
    expect_error(["train", "--config", cfg], "bad.cfg:2: a NUL byte",
                 what="a NUL byte in a config file is named, not a silent end")
    expect_error(["train", "--train-data", train, *TINY, "--batch", "6", "--micro-batch", "4"],
                 "--batch 6", what="batch not a multiple of the micro-batch")
    expect_error(["train", "--train-data", train, *TINY, "--seq", "64"], "--seq 64", what="seq > seq-max")
    expect_error(["train", "--train-data", train, "--model", "d99"], "d99", what="unknown preset")
    expect_error(["train", "--train-data", train, "--init-from", w1, "--layers", "3"],
                 "--layers 3", "w1.safetensors", what="flag contradicting the weights file")

    # safetensors with a wrong shape / a wrong name (edit the header of w1)
    raw = open(w1, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])

    def rewrite(name, mutate):
        h = json.loads(json.dumps(header))
        mutate(h)
        hb = json.dumps(h).encode()
        hb += b" " * ((8 - (8 + len(hb)) % 8) % 8)
        path = os.path.join(d, name)
        open(path, "wb").write(struct.pack("<Q", len(hb)) + hb + raw[8 + n:])
        return path

    def reshape(h):
        e = h["h.0.mlp.c_fc.bias"]
        e["shape"] = [e["shape"][0] // 2, 2]
    bad_shape = rewrite("shape.safetensors", reshape)
    expect_error(["train", "--train-data", train, "--init-from", bad_shape, "--seq", "16", "--batch", "4"],
                 "shape.safetensors", "h.0.mlp.c_fc.bias", what="safetensors with a wrong shape")

    def rename(h):
        h["h.0.mlp.c_fc.biass"] = h.pop("h.0.mlp.c_fc.bias")
    bad_name = rewrite("name.safetensors", rename)
    expect_error(["train", "--train-data", train, "--init-from", bad_name, "--seq", "16", "--batch", "4"],
                 "name.safetensors", "h.0.mlp.c_fc.bias", what="safetensors with a wrong name")
    # two copies of a tensor (with and without the prefix): ambiguous, an error
    body = raw[8 + n:]
    a0, a1 = header["wte.weight"]["data_offsets"]
    h2 = json.loads(json.dumps(header))
    h2["transformer.wte.weight"] = dict(h2["wte.weight"], data_offsets=[len(body),
                                                                        len(body) + a1 - a0])
    hb = json.dumps(h2).encode()
    hb += b" " * ((8 - (8 + len(hb)) % 8) % 8)
    dup = os.path.join(d, "dup.safetensors")
    open(dup, "wb").write(struct.pack("<Q", len(hb)) + hb + body + body[a0:a1])
    expect_error(["sample", "--weights", dup, "--tokens", "1"], "dup.safetensors",
                 "both 'wte.weight' and 'transformer.wte.weight'", what="ambiguous tensor names")
    # lm_head.weight: the tied head (wte's bytes) is fine; one of its own was
    # ignored, so the model loaded had another output head than the file's
    h3 = json.loads(json.dumps(header))
    h3["lm_head.weight"] = dict(h3["wte.weight"], data_offsets=[len(body), len(body) + a1 - a0])
    hb = json.dumps(h3).encode()
    hb += b" " * ((8 - (8 + len(hb)) % 8) % 8)
    own = bytearray(body[a0:a1])
    own[100] ^= 1
    for name, head in (("tied", body[a0:a1]), ("untied", bytes(own))):
        open(os.path.join(d, f"{name}.safetensors"), "wb").write(
            struct.pack("<Q", len(hb)) + hb + body + head)
    rc, _, err = run("sample", "--weights", os.path.join(d, "tied.safetensors"), "--tokens", "1",
                     "--tokenizer", "bytes")
    ok(rc == 0, "a tied lm_head.weight (wte's bytes) loads", err)
    expect_error(["sample", "--weights", os.path.join(d, "untied.safetensors"), "--tokens", "1",
                  "--tokenizer", "bytes"], "untied.safetensors",
                 "'lm_head.weight' differs from 'wte.weight'", what="an untied lm_head.weight")
    # a NaN in the weights is named at load, not trained on
    off = header["h.1.mlp.c_fc.bias"]["data_offsets"][0] + 8 + n + 4 * 3
    nan = raw[:off] + struct.pack("<f", float("nan")) + raw[off + 4:]
    open(os.path.join(d, "nan.safetensors"), "wb").write(nan)
    expect_error(["train", "--train-data", train, "--init-from", os.path.join(d, "nan.safetensors"),
                  "--seq", "16", "--batch", "4", "--steps", "1"], "nan.safetensors",
                 "h.1.mlp.c_fc.bias", "non-finite value", "element 3",
                 what="NaN weights at load")
    # a file without metadata: the head count is guessed, never silently
    nometa = rewrite("nometa.safetensors", lambda h: h.pop("__metadata__"))
    rc, _, err = run("sample", "--weights", nometa, "--tokens", "2", "--tokenizer", "bytes")
    ok(rc == 0 and "no n_head metadata: assuming 1 heads" in err and "--heads" in err,
       "a file without metadata: the guessed head count is said", err)
    rc, _, err = run("sample", "--weights", nometa, "--tokens", "2", "--tokenizer", "bytes",
                     "--heads", "2")
    ok(rc == 0 and "n_head metadata" not in err, "--heads given: no guess, no warning", err)
    # metadata that is not an integer: "2x" was read as 2, "99999999999" as garbage
    for key, val in (("n_head", "2x"), ("n_layer", "99999999999"), ("attn_window", "")):
        bad = rewrite(f"meta_{key}.safetensors",
                      lambda h, k=key, v=val: h["__metadata__"].__setitem__(k, v))
        expect_error(["sample", "--weights", bad, "--tokens", "1", "--tokenizer", "bytes"],
                     f"meta_{key}.safetensors", f"metadata {key} = '{val}' is not an integer",
                     what=f"safetensors metadata {key} '{val}'")
    open(os.path.join(d, "trunc.safetensors"), "wb").write(raw[: len(raw) // 2])
    expect_error(["sample", "--weights", os.path.join(d, "trunc.safetensors")], "trunc.safetensors",
                 "file truncated?", what="truncated safetensors")

    test_env_options(d, base)
    test_data(d)
    test_save_dtype(d, base, val)
    test_resume_record(d, train)
    test_resume_tokens(d, train)
    test_new_run(d, train)
    print(f"{passed} passed, {failed} failed")
    if not failed:
        subprocess.run(["rm", "-rf", d])
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
