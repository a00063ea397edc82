"""The command line of every subcommand, fast: the bare-able flags (--json,
--search, --force, --remove, --new-run: bare, `--json 0`, `--json 1`, `--json=0`, before another option,
before a positional argument), and bad input (a wrong flag, a missing
value, an out-of-range number, a missing / unreadable / empty / truncated
input file, a directory where a file is expected and the reverse): each
exits non-zero with a message naming the option or the file, never with a
crash, and never overwrites an output it should not.
(trace's --json: tests/trace/test_trace_tools.py.)
Environment: MS_BIN (the binary)."""
import json
import os
import shutil
import stat
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_cli import BIN, TINY, ok, run, text_tokens, write_shard  # noqa: E402

DIAG = ["diag", "--gemm-n", "16", "--gemm-speed-n", "64", "--mem-mb", "1", "--threads", "2"]
PLAN = ["plan", "--cluster", "h100-node", "--model", "d12", "--gpus", "8", "--batch", "64"]
# A whole diag run starts MPI (its comm check), whose allocations kept to exit
# LeakSanitizer cannot attribute (tests/comm/lsan.supp): under `make asan` it
# runs with the leak check off, as the mpi-labelled tests do.
MPI_ENV = dict(os.environ, ASAN_OPTIONS=":".join(
    o for o in (os.environ.get("ASAN_OPTIONS"), "detect_leaks=0") if o))


def is_json(text):
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


def run_capped(args, timeout=120, cwd=None):
    """run(), but a command that does not end (a server started on bad input)
    is a failure, not a hung test: rc None.  cwd: where a relative output of a
    command that should fail would land (the test's directory)."""
    try:
        p = subprocess.run([BIN, *args], capture_output=True, text=True, errors="replace",
                           timeout=timeout, cwd=cwd)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        return None, "", f"still running after {timeout} s"


def flag_forms(flag, other):
    """(args, the flag's value) of each way to give a bare-able flag; other:
    an option with its value to follow the bare flag."""
    return (([flag], 1), ([flag, "1"], 1), ([flag, "0"], 0), ([flag + "=0"], 0),
            ([flag + "=1"], 1), ([flag, *other], 1), ([flag, "0", *other], 0))


def test_json_flags(d, fixture):
    """diag, eval and plan: --json in every form (trace's: test_trace_tools)."""
    w, val = fixture
    EVAL = ["eval", "--weights", w, "--val-data", val, "--val-batches", "2", "--batch", "4",
            "--seq", "16", "--threads", "2"]
    for base, other in ((DIAG, ["--slow-factor", "0.5"]), (EVAL, ["--val-batches", "1"]),
                        (PLAN, ["--top", "3"])):
        name = base[0]
        env = MPI_ENV if name == "diag" else None
        for args, want in flag_forms("--json", other):
            rc, out, err = run(*base, *args, env=env)
            ok(rc == 0 and is_json(out) == bool(want),
               f"{name} {' '.join(args)}: JSON {bool(want)}", f"rc={rc}\n{out}\n{err}")
        rc, out, err = run(*base, "--json", "2")
        ok(rc == 2 and "--json must be in [0,1], got '2'" in err, f"{name} --json 2: out of range",
           err)
        # a positional after a bare --json: not taken as its value (none of
        # these takes one, so it is named as unexpected)
        rc, out, err = run(*base, "--json", "extra")
        ok(rc == 2 and "unexpected argument 'extra'" in err,
           f"{name} --json extra: the positional is not --json's value", err)
        # a yes/no word after it is meant as its value: said so (`--force yes` got the
        # unquoted-glob hint of data's positional arguments)
        rc, out, err = run(*base, "--json", "yes")
        ok(rc == 2 and "option --json takes 0 or 1 (or nothing" in err and "not 'yes'" in err,
           f"{name} --json yes: named as a flag's value", err)
        rc, out, err = run(*base, "--help")
        ok(rc == 0 and "--json [N]" in out, f"{name} --help: --json [N]", out)
    # plan's --search, alone and with --json, in each order
    for args, want in flag_forms("--search", ["--json"]):
        rc, out, err = run(*PLAN, *args)
        searched = "layouts tried" in out or '"tried"' in out
        ok(rc == 0 and searched == bool(want), f"plan {' '.join(args)}: search {bool(want)}",
           out + err)
    rc, out, err = run(*PLAN, "--json", "--search", "0")
    ok(rc == 0 and is_json(out) and '"tried"' not in out, "plan --json --search 0", out + err)


def test_checkpoint_as_weights(d, w, val, train, ck):
    """A checkpoint where a weights file is expected: sample and eval take
    it (a commit or a checkpoint directory: its newest valid commit) and
    draw / score what its weights do; train --init-from says to --resume
    or export it; a directory that is no checkpoint is named as such."""
    step = os.path.join(ck, sorted(n for n in os.listdir(ck) if n.startswith("step_"))[-1])
    SAMPLE = ["sample", "--tokens", "12", "--seed", "3", "--tokenizer", "ids", "--prompt", "1 2"]
    outs = {}
    for src in (w, ck, step):
        rc, out, err = run(*SAMPLE, "--weights", src)
        outs[src] = out if rc == 0 else None
        ok(rc == 0 and len(out.split()) == 14, f"sample --weights {src}", out + err)
    ok(outs[ck] == outs[w] and outs[step] == outs[w],
       "sample: the checkpoint's draws are the saved weights'", str(outs))
    EVAL = ["eval", "--val-data", val, "--val-batches", "2", "--batch", "4", "--seq", "16", "--json"]
    scores = {}
    for args in (["--weights", w], ["--weights", ck], ["--weights", step], ["--ckpt", ck]):
        rc, out, err = run(*EVAL, *args)
        scores[" ".join(args)] = json.loads(out)["val_loss"] if rc == 0 and is_json(out) else None
    ok(len(set(scores.values())) == 1 and None not in scores.values(),
       "eval: --weights CKPT scores as --ckpt CKPT and as the weights file", str(scores))
    rc, out, err = run(*EVAL, "--weights", ck, "--ckpt", ck)
    ok(rc == 2 and "not both" in err, "eval --weights CKPT --ckpt CKPT: not both", err)
    for src in (ck, step):
        rc, out, err = run("train", "--train-data", train, *TINY, "--steps", "1", "--init-from", src)
        ok(rc == 2 and f"--init-from {src} is a checkpoint, not a weights file: --resume {src}" in err
           and f"megascale ckpt export {src} --out FILE" in err,
           f"train --init-from {src}: says to --resume or export it", err)
    empty = os.path.join(d, "empty_dir")
    os.makedirs(empty)
    for args in (["sample", "--weights", empty], EVAL + ["--weights", empty],
                 ["train", "--train-data", train, *TINY, "--steps", "1", "--init-from", empty]):
        rc, out, err = run(*args)
        ok(rc == 2 and f"{empty} is a directory, not a weights file" in err,
           f"{args[0]}: a plain directory as weights is named", err)


def rewrite_safetensors(src, dst, edit):
    """dst: src's safetensors with its header (a dict) changed by edit(header, data) in place;
    the data kept (the bytes edit returns appended: an added tensor's)."""
    raw = open(src, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    data += edit(head, data) or b""
    text = json.dumps(head).encode()
    open(dst, "wb").write(struct.pack("<Q", len(text)) + text + data)


def test_bad_input(d, w, val, train, ck):
    """Every subcommand: a wrong flag, a missing value, an out-of-range
    number, a missing / empty / truncated input, a directory where a file
    is expected and a file where a directory is: exit 2, 3 or 4 (not 0, not
    a signal) with the option or the file named; no output overwritten."""
    empty, trunc, text, adir = (os.path.join(d, n) for n in ("empty", "trunc.bin", "t.txt", "adir"))
    open(empty, "wb").close()
    open(trunc, "wb").write(open(val, "rb").read()[:600])
    open(text, "w").write("some text to tokenize " * 50)
    os.makedirs(adir, exist_ok=True)
    os.makedirs(os.path.join(d, "cj.config.json"), exist_ok=True)  # where an export's goes
    trunc_w = os.path.join(d, "trunc.safetensors")
    raw = open(w, "rb").read()
    open(trunc_w, "wb").write(raw[:len(raw) // 2])
    # weights whose metadata promise 1024 layers (the model was built, 495 MB, before the
    # tensors were found missing), " +1" as a number, and a mask buffer of a layer the model
    # has not (any name with ".attn.bias" was skipped)
    many_w, plus_w, mask_w = (os.path.join(d, n) for n in ("many.safetensors",
                                                           "plus.safetensors",
                                                           "mask.safetensors"))
    rewrite_safetensors(w, many_w, lambda h, _: h["__metadata__"].update(n_layer="1024"))
    rewrite_safetensors(w, plus_w, lambda h, _: h["__metadata__"].update(n_head=" +2"))
    # sizes in the metadata that the shapes contradict (they were taken without a word)
    pos_w, voc_w = os.path.join(d, "pos.safetensors"), os.path.join(d, "voc.safetensors")
    rewrite_safetensors(w, pos_w, lambda h, _: h["__metadata__"].update(n_positions="7"))
    rewrite_safetensors(w, voc_w, lambda h, _: h["__metadata__"].update(vocab_size="100"))

    def add_mask(h, _):
        end = max(t["data_offsets"][1] for k, t in h.items() if k != "__metadata__")
        h["h.7.attn.bias"] = {"dtype": "F32", "shape": [1], "data_offsets": [end, end + 4]}
        return b"\0" * 4
    rewrite_safetensors(w, mask_w, add_mask)

    def add_head(h, data, rounded):  # a bf16 lm_head: wte rounded (tied), or another one
        t = h["wte.weight"]
        assert t["dtype"] == "F32"
        a, b = t["data_offsets"]
        vals = struct.unpack(f"<{(b - a) // 4}f", data[a:b])
        if not rounded:
            vals = [v * 0.5 + 0.01 for v in vals]
        out = bytearray()
        for v in vals:  # round to nearest even, as the writer does
            u = struct.unpack("<I", struct.pack("<f", v))[0]
            out += struct.pack("<H", ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF)
        end = len(data)
        h["lm_head.weight"] = {"dtype": "BF16", "shape": t["shape"],
                               "data_offsets": [end, end + len(out)]}
        return bytes(out)
    tied_w, untied_w = os.path.join(d, "tied.safetensors"), os.path.join(d, "untied.safetensors")
    rewrite_safetensors(w, tied_w, lambda h, data: add_head(h, data, True))
    rewrite_safetensors(w, untied_w, lambda h, data: add_head(h, data, False))
    rc, _, err = run("sample", "--tokens", "2", "--weights", tied_w)
    ok(rc == 0, "a bf16 lm_head that is wte rounded (tied) loads", err)
    nope = os.path.join(d, "nonexistent")
    ev = os.path.join(d, "tr", "events_r00000.jsonl")
    bad_ck = os.path.join(d, "ck_damaged")  # its one commit's manifest is not JSON
    shutil.copytree(ck, bad_ck)
    bad_step = os.path.join(bad_ck, sorted(n for n in os.listdir(bad_ck) if n.startswith("step_"))[-1])
    open(os.path.join(bad_step, "manifest.json"), "w").write("{ damaged")
    base_c = os.path.join(d, "base_cluster.json")  # a cluster file, as plan measure writes
    src_dir = os.environ.get("MS_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
    shutil.copy(os.path.join(src_dir, "data", "clusters", "h100-node.json"), base_c)
    ck_step = os.path.join(ck, sorted(n for n in os.listdir(ck) if n.startswith("step_"))[-1])
    ck_manifest, ck_latest = os.path.join(ck_step, "manifest.json"), os.path.join(ck, "latest")
    mybin, hosts = os.path.join(d, "megascale"), os.path.join(d, "hosts")
    shutil.copy(BIN, mybin)
    open(hosts, "w").write("localhost slots=4\n")
    os.makedirs(os.path.join(d, "o"), exist_ok=True)  # an --out-dir that exists
    lcfg = os.path.join(d, "launch.cfg")  # launch's own --config file
    qcfg = os.path.join(d, "quoted.cfg")  # a quoted value, then more text
    open(qcfg, "w").write('name = "ok" # a comment after the value is fine\nout = "o20" junk\n')
    open(lcfg, "w").write("max-restarts = 0\n")
    TR = ["train", "--train-data", train, *TINY, "--steps", "1", "--trace-dir", "none"]
    proc_why = "a kernel pseudo file system" if os.geteuid() == 0 else "not writable"
    EV = ["eval", "--val-data", val, "--seq", "16", "--batch", "4"]
    SA = ["sample", "--tokens", "2"]
    fifo = os.path.join(d, "weights.fifo")  # a FIFO as weights: the open blocked for ever
    os.mkfifo(fifo)
    state = os.path.join(d, "gpt2_124M_debug_state.bin")  # llm.c's other files as weights
    open(state, "wb").write(struct.pack("<256i", 20240327, 1, *([0] * 254)))
    cases = [  # (args, needles in stderr)
        *[(a, [fifo, "not a regular file (a FIFO)"]) for a in (
            [*SA, "--weights", fifo], [*EV, "--weights", fifo], [*TR, "--init-from", fifo])],
        # a FIFO as --config with no writer read as an empty config: its options lost, exit 0
        ([*TR, "--config", fifo], [fifo, "a FIFO that gave nothing to read"]),
        # an injected fault this run can never meet (it trained and exited 0)
        ([*TR, "--inject-fault", "exit@3:5"],
         ["exit@3:5: rank 5 is not one of this run's 1 process(es); it would never fire"]),
        ([*TR, "--inject-fault", "kill@0"], ["kill@0: step 0: steps count from 1"]),
        # --heartbeat without its token: the token's format was blamed
        ([*TR, "--heartbeat", "127.0.0.1:1"],
         ["--heartbeat 127.0.0.1:1 needs --heartbeat-token (env MS_HEARTBEAT_TOKEN)"]),
        ([*SA, "--weights", state], [state, "an llm.c training state (magic 20240327"]),
        # no command, an unknown one: the commands on stderr (they were on stdout)
        ([], ["usage: megascale <command>", "train    train a GPT model"]),
        (["bogus"], ["unknown command 'bogus'", "usage: megascale <command>"]),
        # a wrong flag, a missing value: the parser's, for every command
        *[([c, "--bogus"], ["unknown option '--bogus'"]) for c in
          ("train", "sample", "eval", "data", "ckpt", "trace", "launch", "diag", "dashboard",
           "plan")],
        (["sample", "--weights"], ["--weights needs a value"]),
        (["plan", "--cluster"], ["--cluster needs a value"]),
        (["trace", "hang", d, "--window"], ["--window needs a value"]),
        # ... before another option: not taken as the value (`data prepare --out --force`
        # made a directory named --force); --opt=--x still gives such a value
        ([*EV, "--weights", "--json"], ["option --weights needs a value: the next argument, "
                                        "--json, is an option", "--weights=--json"]),
        ([*SA, "--weights", w, "--prompt", "--tokens", "3"], ["option --prompt needs a value"]),
        (["data", "prepare", "--input", text, "--out", "--force", "--tokenizer", "bytes"],
         ["option --out needs a value: the next argument, --force, is an option"]),
        # out of range
        ([*TR, "--lr", "0"], ["--lr must be > 0"]),
        # 0 or infinite in float, the optimiser's precision (--eps 1e-46 became 0: NaN weights)
        ([*TR, "--eps", "1e-46"], ["--eps 1e-46 is too small (0 or subnormal) in float"]),
        ([*TR, "--lr", "1e39"], ["--lr 1e+39 is infinite in float"]),
        ([*TR, "--grad-clip", "1e-46"], ["--grad-clip 1e-46 is too small", "or 0: none"]),
        ([*SA, "--weights", w, "--top-k", "-1"], ["--top-k must be >= 0"]),
        ([*EV, "--weights", w, "--val-batches", "-1"], ["--val-batches must be >= 0"]),
        (["diag", "--mem-mb", "0"], ["--mem-mb must be in [1,65536], got '0'"]),
        (["trace", "stragglers", d, "--window", "0"], ["--window must be in [1,100000], got '0'"]),
        (["data", "prepare", "--input", text, "--out", adir, "--val-fraction", "2"],
         ["--val-fraction must be in [0,1), got '2'"]),
        (["data", "tokenizer-train", "--input", text, "--out", os.path.join(d, "v.tok"),
          "--vocab-size", "100"], ["--vocab-size must be in [257,16777216], got '100'"]),
        (["ckpt", "reshard", ck, "--dp", "0", "--out", adir], ["--dp must be in [1,65536]"]),
        # an option of another ckpt command: refused (it was ignored, exit 0)
        (["ckpt", "list", ck, "--remove", "1"],
         ["ckpt list takes no --remove (an option of ckpt shm shm-orphans)"]),
        (["ckpt", "export", ck, "--dp", "2", "--out", os.path.join(d, "dp.st")],
         ["ckpt export takes no --dp (an option of ckpt reshard)"]),
        (["ckpt", "reshard", ck, "--force", "--out", os.path.join(d, "rs")],
         ["ckpt reshard takes no --force (an option of ckpt export shm)"]),
        (["ckpt", "verify", ck, "--save-dtype", "bf16"], ["ckpt verify takes no --save-dtype"]),
        (["plan", "--cluster", "h100-node", "--model", "d12", "--gpus", "-1", "--batch", "8"],
         ["--gpus must be"]),
        (["dashboard", d, "--port", "70000"], ["--port must be in [0,65535]"]),
        # past what the type holds: the option's own range is named (it was the type's:
        # "--count must be at least -2147483648", "--threads ... at most 2147483647")
        (["data", "inspect", train, "--count", "-99999999999"],
         ["--count must be >= 0, got '-99999999999'"]),
        (["data", "prepare", "--input", text, "--out", adir, "--threads", "5000000000"],
         ["--threads must be in [0,1024], got '5000000000'"]),
        (["data", "prepare", "--input", text, "--out", adir, "--shard-tokens", "9" * 23],
         ["--shard-tokens must be in [1,2147483647], got '" + "9" * 23 + "'"]),
        (["data", "prepare", "--input", text, "--out", adir, "--val-fraction", "1e999"],
         ["--val-fraction must be in [0,1), got '1e999'"]),
        (["train", "--seed", "1" * 30], ["--seed", "beyond the largest integer"]),
        (["train", "--lr", "1e999"], ["--lr", "'1e999' is beyond the largest number"]),
        (["train", "--lr", "-1e999"], ["--lr must be > 0, got '-1e999'"]),
        # a single dash: an unknown option, not an argument ("unexpected argument 'o31'")
        (["data", "prepare", "--input", text, "-out", adir], ["unknown option '-out' "
                                                             "(options start with --: --out)"]),
        (["data", "inspect", "-count", "3", train], ["unknown option '-count'"]),
        # a quoted value in a --config file with text after it (it became the value '"o" junk')
        (["data", "prepare", "--config", qcfg, "--input", text],
         [f"{qcfg}:2: text after the value's closing \": 'junk' (quote the whole value)"]),
        # missing, empty, truncated inputs
        ([*SA, "--weights", nope], [f"--weights: {nope}"]),
        ([*SA, "--weights", empty], [f"--weights: {empty}", "0 bytes"]),
        ([*SA, "--weights", trunc_w], [f"--weights: {trunc_w}", "truncated"]),
        ([*EV, "--weights", nope], [f"--weights: {nope}"]),
        ([*EV, "--weights", trunc_w], [f"--weights: {trunc_w}", "truncated"]),
        # a token shard as weights: named as one (it was "header length N exceeds ...")
        *[([*c, "--weights", train], [f"--weights: {train}: not a safetensors file: it is a token "
                                      "shard (magic 20240520)"]) for c in (SA, EV)],
        ([*SA, "--weights", many_w], [f"{many_w}: metadata n_layer = 1024, but the file holds"]),
        ([*SA, "--weights", plus_w], [f"{plus_w}: metadata n_head = ' +2' is not an integer"]),
        ([*SA, "--weights", pos_w], [f"{pos_w}: metadata n_positions = 7, but wpe.weight's rows"]),
        ([*EV, "--weights", voc_w], [f"{voc_w}: metadata vocab_size = 100, but wte.weight's rows"]),
        ([*SA, "--weights", mask_w], [f"{mask_w}: tensor 'h.7.attn.bias' is not part of this model"]),
        ([*SA, "--weights", untied_w], [f"{untied_w}: 'lm_head.weight' differs from 'wte.weight'"]),
        # train's --init-from file: its errors name the option, as sample's and eval's --weights
        ([*TR, "--init-from", nope], [f"--init-from: {nope}"]),
        ([*TR, "--init-from", trunc_w], [f"--init-from: {trunc_w}", "truncated"]),
        ([*TR, "--init-from", text], [f"--init-from: {text}"]),
        ([*TR[:2], empty, *TR[3:]], ["--train-data: " + empty, "not a token shard"]),
        ([*TR[:2], os.path.join(d, "nope*.bin"), *TR[3:]],
         [f"--train-data: {d}/nope*.bin: no files match"]),
        ([*EV[:2], trunc, *EV[3:], "--weights", w], ["--val-data: " + trunc, "truncated"]),
        ([*EV[:2], os.path.join(d, "nope*.bin"), *EV[3:], "--weights", w],
         [f"--val-data: {d}/nope*.bin: no files match"]),
        (["data", "inspect", empty], [empty, "not a token shard"]),
        (["data", "prepare", "--input", os.path.join(d, "nope*.txt"), "--out",
          os.path.join(d, "o0")], [f"--input: {d}/nope*.txt: no files match"]),
        (["data", "prepare", "--input", empty, "--out", os.path.join(d, "o1")],
         [empty, "input is empty"]),
        (["data", "prepare", "--input", nope, "--out", os.path.join(d, "o2")],
         [f"--input: {nope}: no files match"]),
        ([*SA, "--weights", w, "--tokenizer", empty], [f"--tokenizer: {empty}: truncated: 0 bytes"]),
        (["plan", "--cluster", empty, "--model", "d12", "--gpus", "8", "--batch", "8"],
         [empty, "not valid JSON"]),
        (["plan", "measure", "--out", os.path.join(d, "m.json"), "--base", empty],
         [f"--base: {empty}:1:1: not valid JSON"]),
        # eval's checkpoint errors name the option that gave it (--weights CKPT too)
        ([*EV, "--ckpt", nope], ["--ckpt", nope, "does not exist"]),
        ([*EV, "--ckpt", adir], [f"--ckpt: {adir}: no valid checkpoint"]),
        ([*EV, "--ckpt", bad_step], [f"--ckpt: {bad_step}/manifest.json: not valid JSON"]),
        ([*EV, "--weights", bad_ck], [f"--weights: {bad_ck}: no valid checkpoint"]),
        (["ckpt", "inspect", adir], [adir, "no valid checkpoint"]),
        *[(["ckpt", c, nope], [f"ckpt {c}: {nope} does not exist (a checkpoint is a commit"])
          for c in ("list", "inspect", "verify", "shm", "export")],
        # a directory where a file is expected
        ([*TR, "--init-from", adir], [adir, "is a directory, not a weights file"]),
        ([*EV[:2], adir, *EV[3:], "--weights", w], [adir, "is a directory, not a token shard"]),
        ([*TR[:2], adir, *TR[3:]], [adir, "is a directory, not a token shard", f"'{adir}/*.bin'"]),
        (["data", "inspect", adir], [adir, "is a directory, not a token shard"]),
        ([*TR, "--save-weights", adir], ["--save-weights", adir, "is a directory"]),
        # ... and where ckpt export writes its config.json: said before the weights are written
        (["ckpt", "export", ck, "--out", os.path.join(d, "cj.safetensors")],
         [os.path.join(d, "cj.config.json") + " is a directory, where the export writes"]),
        ([*TR, "--config", adir], ["--config", adir, "is a directory, not a file"]),
        ([*SA, "--weights", w, "--tokenizer", adir], ["--tokenizer", adir, "is a directory"]),
        (["data", "prepare", "--input", text, "--out", os.path.join(d, "o3"), "--tokenizer", adir],
         ["--tokenizer", adir, "is a directory"]),
        # a mistyped name: the names there are (before: "gpt3: open: No such file")
        (["data", "prepare", "--input", text, "--out", os.path.join(d, "o3"), "--tokenizer",
          "gpt3"], ["--tokenizer gpt3: no such tokenizer", "(gpt2, bytes)"]),
        ([*SA, "--weights", w, "--tokenizer", "gpt3"],
         ["--tokenizer gpt3: no such tokenizer", "(auto, gpt2, bytes, ids)"]),
        (["plan", "measure", "--out", os.path.join(d, "m.json"), "--base", adir],
         ["--base", adir, "is a directory, not a file"]),
        (["diag", "--history", adir], ["--history", adir, "is a directory"]),
        (["diag", "--history", train], ["--history", train, "not a diag history"]),
        (["ckpt", "export", ck, "--out", adir], [adir, "is a directory, not a file"]),
        (["plan", "measure", "--out", adir], [adir, "is a directory, not a file"]),
        # (under mpirun the N-rank cluster replaced the one-process measurement)
        (["plan", "measure", "--out", base_c, "--base", base_c],
         ["--out", base_c, "is the --base file", "never replaces"]),
        (["plan", "--cluster", adir, "--model", "d12", "--gpus", "8", "--batch", "8"],
         ["--cluster", adir, "is a directory, not a cluster file"]),
        (["data", "tokenizer-train", "--input", text, "--out", adir],
         [f"--out: {adir}: is a directory, not a file"]),
        # an output that cannot be written: named before the work, with its option
        *[(["launch", "--np", "1", "--run-dir", os.path.join(d, "lr"), *a, "--", *TR[1:]], n)
          for a, n in ((["--bin", adir], ["--bin", adir, "is a directory, not an executable"]),
                       (["--bin", nope], ["--bin", nope, "does not exist"]),
                       (["--bin", text], ["--bin", text, "is not an executable file"]),
                       (["--events", adir], ["--events", adir, "is a directory, not a file"]),
                       (["--events", os.path.join(nope, "x")], ["--events", "does not exist"]),
                       # an input as --events: appended to, it would not run or parse again
                       (["--bin", mybin, "--events", mybin],
                        ["--events", mybin, "is the megascale binary", "never replaces"]),
                       (["--hostfile", hosts, "--events", hosts],
                        ["--events", hosts, "is the --hostfile"]),
                       (["--config", lcfg, "--events", lcfg],
                        ["--events", lcfg, "is the --config file", "nothing was written"]),
                       (["--events", train], ["launch --events", train, "is an input",
                                              "--train-data"]))],
        (["launch", "--np", "1", "--run-dir", os.path.join(d, "lr"), "--", *TR[1:],
          "--save-weights", train], ["the train options: --save-weights", train, "is an input"]),
        # a train option before the '--' (it was forgotten): said where it goes (before, only
        # "unknown option '--layers'")
        (["launch", "--np", "1", "--run-dir", os.path.join(d, "lr"), "--layers=1", "--", *TR[1:]],
         ["--layers is a train option: put the train options after '--'"]),
        # an output of the run as --events, even one not written yet: the weights renamed
        # over the events lost them all (exit 0), the next launch appended JSON to them
        (["launch", "--np", "1", "--run-dir", os.path.join(d, "lr"), "--events",
          os.path.join(d, "w2.safetensors"), "--", *TR[1:], "--save-weights",
          os.path.join(d, ".", "w2.safetensors")],
         ["launch --events", "is --save-weights", "which the run writes", "nothing was written"]),
        (["launch", "--np", "1", "--run-dir", os.path.join(d, "lr"), "--events",
          os.path.join(d, "o", "metrics.jsonl"), "--", *TR[1:], "--out-dir", os.path.join(d, "o")],
         ["launch --events", "is --metrics", "which the run writes"]),
        (["launch", "--np", "1", "--run-dir", os.path.join(d, "lr"), "--events",
          os.path.join(adir, "hang_r3.json"), "--", *TR[1:-1], adir],
         ["launch --events", "is named as the hang_r*.json files the run writes in --trace-dir"]),
        # ... or a file of the driver's own in the run directory
        (["launch", "--np", "1", "--run-dir", adir, "--events", os.path.join(adir, "driver.json"),
          "--", *TR[1:]], ["--events", "is named as driver.json, a file the job writes in --run-dir"]),
        (["launch", "--np", "1", "--run-dir", adir, "--events",
          os.path.join(adir, "metrics.jsonl"), "--", *TR[1:]],
         ["--events", "is named as metrics.jsonl, a file the job writes"]),
        (["launch", "--np", "1", "--run-dir", empty, "--", *TR[1:]],
         ["--run-dir", empty, "exists and is not a directory"]),
        (["trace", "merge", os.path.join(d, "tr"), "--out", os.path.join(nope, "x")],
         ["--out", f"{nope}/x: directory '{nope}' does not exist"]),
        (["trace", "stragglers", os.path.join(d, "tr"), "--png", os.path.join(empty, "x")],
         ["--png", f"'{empty}' is not a directory"]),
        # ... one no one can make, not even root (whom access(2) lets write
        # anywhere): refused before the work, not after it (exit 4)
        *[(a, [o, p, f"directory '{os.path.dirname(p)}'", proc_why]) for a, o, p in (
            (["trace", "stragglers", os.path.join(d, "tr"), "--png", "/proc/x.png"], "--png",
             "/proc/x.png"),
            ([*TR, "--save-weights", "/proc/x"], "--save-weights", "/proc/x"),
            (["trace", "merge", os.path.join(d, "tr"), "--out", "/sys/x.json"], "--out",
             "/sys/x.json"))],
        (["diag", "--history", os.path.join(nope, "h.jsonl")],
         ["--history", f"directory '{nope}' does not exist"]),
        (["ckpt", "export", ck, "--out", os.path.join(nope, "x")],
         ["ckpt export: --out", f"directory '{nope}' does not exist"]),
        (["ckpt", "reshard", ck, "--dp", "2", "--out", empty],
         ["ckpt reshard: --out", empty, "exists and is not a directory"]),
        (["plan", "measure", "--out", os.path.join(nope, "x")],
         ["--out", f"directory '{nope}' does not exist"]),
        (["plan", "measure", "--out", os.path.join(d, "m.json"), "--storage-dir", empty],
         ["--storage-dir", empty, "is a file, not a directory"]),
        (["plan", "measure", "--out", os.path.join(d, "m.json"), "--storage-dir", nope],
         ["--storage-dir", nope, "does not exist"]),
        # an output that is an input: refused before anything is written (the
        # shard was rewritten as weights, the log appended to the weights read)
        *[([*TR, *a], [o, "is an input", i]) for a, o, i in (
            (["--save-weights", train], f"--save-weights {train}", f"(--train-data {train})"),
            (["--val-data", val, "--log-file", val], f"--log-file {val}", "--val-data"),
            (["--init-from", w, "--metrics", w], f"--metrics {w}", "--init-from"),
            (["--init-from", w, "--save-weights", w], "--save-weights", "--init-from"))],
        # ... or a checkpoint's file: a commit's, its directory's latest / lock
        ([*TR, "--save-weights", ck_manifest], ["--save-weights", ck_manifest,
                                                 "is a file of the commit", "nothing was written"]),
        ([*TR, "--log-file", ck_latest], ["--log-file", ck_latest, "the 'latest' file of the "
                                          "checkpoint directory"]),
        *[(["trace", c, os.path.join(d, "tr"), o, ev], [o, ev, "a file of the run", "never replaces"])
          for c, o in (("merge", "--out"), ("stragglers", "--png"))],
        # a file where a directory is expected
        ([*TR, "--ckpt-dir", empty], ["--ckpt-dir", empty, "not a directory"]),
        ([*EV, "--ckpt", w], ["--ckpt", w, "is a file, not a checkpoint"]),
        # --resume takes a commit or a checkpoint directory (was "opendir: Not a directory")
        *[([*TR, "--resume", f], ["--resume", f, "is a file, not a checkpoint",
                                  "a commit DIR/step_N or a checkpoint directory"]) for f in (w, empty)],
        *[(["ckpt", c, w], [f"ckpt {c}: {w} is a file, not a checkpoint"]) for c in
          ("list", "inspect", "verify", "shm")],
        (["ckpt", "export", w, "--out", os.path.join(d, "x.safetensors")],
         [w, "is a file, not a checkpoint"]),
        # --data-dir given: a directory, whether or not this run reads from it
        *[([*c, "--data-dir", p], ["--data-dir", p, n]) for c in (
            [*SA, "--weights", w], ["data", "prepare", "--input", text, "--out", os.path.join(d, "o4")],
            ["plan", "--cluster", "h100-node", "--model", "d12", "--gpus", "8", "--batch", "8"])
          for p, n in ((empty, "is a file, not a directory"), (nope, "does not exist"))],
        (["trace", "hang", empty], [empty, "not a directory"]),
        (["dashboard", empty], ["RUN_DIR", empty, "is a file, not a directory"]),
        (["dashboard", nope], ["RUN_DIR", nope, "does not exist"]),
        # (a directory as --events: served as if empty, until Ctrl-C)
        (["dashboard", d, "--port", "0", "--events", adir],
         ["--events", adir, "is a directory, not a file"]),
        (["diag", "--history-dir", empty], [f"--history-dir: {empty}: exists and is not a directory"]),
        (["diag", "--history-dir", os.path.join(empty, "h")],
         ["--history-dir", f"'{empty}' is not a directory"]),
        (["diag", "--storage-dir", empty], ["--storage-dir", empty, "is a file, not a directory"]),
        (["data", "prepare", "--input", text, "--out", empty],
         [f"--out: {empty}: exists and is not a directory"]),
        *[(["ckpt", *c, "--ckpt-shm-dir", p], ["--ckpt-shm-dir", p, "need an existing directory"])
          for c in (["shm", ck], ["shm-orphans"], ["list", ck]) for p in (empty, nope)],
    ]
    # plan --cluster NAME: a file of that name in the working directory is
    # that file (it was "no such file, and no shipped cluster NAME")
    src = os.environ.get("MS_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
    mine = os.path.join(d, "mycluster")
    open(mine, "w").write(open(os.path.join(src, "data", "clusters", "h100-node.json")).read())
    open(os.path.join(d, "badcluster"), "w").write("{")
    for name, want_rc, needle in (("mycluster", 0, ""), ("badcluster", 3, "badcluster:1:")):
        p = subprocess.run([BIN, "plan", "--cluster", name, "--model", "d12", "--gpus", "8",
                            "--batch", "8"], cwd=d, capture_output=True, text=True)
        ok(p.returncode == want_rc and needle in p.stderr,
           f"plan --cluster {name}: the file in the working directory", p.stderr)
    before = {p: open(p, "rb").read() for p in (w, val, train, empty, ev, mybin, hosts, lcfg, base_c,
                                                ck_manifest, ck_latest)}
    for args, needles in cases:
        rc, out, err = run_capped(args, cwd=d)
        ok(rc in (2, 3, 4) and all(n in err for n in needles) and "Sanitizer" not in err,
           f"{' '.join(args[:2])} ... {' '.join(args[-2:])}: exit 2-4 naming {needles}",
           f"rc={rc}\n{err}")
    # launch --ctl DIR: no such directory, or a file, is a usage error (it was
    # exit 1, as a driver gone); a run directory without a driver keeps exit 1
    for p, want, needles in ((nope, 2, ["--ctl", nope, "does not exist"]),
                             (empty, 2, ["--ctl", empty, "is a file, not a directory"]),
                             (adir, 1, [f"{adir}/control.json", "is a driver running"])):
        for cmd in (["status"], ["evict", "node0"]):
            rc, out, err = run_capped(["launch", "--ctl", p, *cmd], cwd=d)
            ok(rc == want and all(n in err for n in needles),
               f"launch --ctl {p} {cmd[0]}: exit {want} naming {needles}", f"rc={rc}\n{err}")
    ok(all(open(p, "rb").read() == b for p, b in before.items()),
       "no input or weights file was changed by the bad commands")
    ok(os.listdir(adir) == [], "the directory given as an output file holds nothing new",
       str(os.listdir(adir)))


def test_special_outputs(d, w, train, ck):
    """An output written whole and renamed into place (weights, an export, a tokenizer, a
    merged trace, a cluster file, a diag history) is refused, before any work, when the path
    is a FIFO or a character device: the rename replaced it (as root, `ckpt export --out
    /dev/null` replaced /dev/null by a file).  Appended outputs (--log-file, --metrics) still
    take /dev/null."""
    fifo = os.path.join(d, "fifo")
    os.mkfifo(fifo)
    specials = [(fifo, "a FIFO")]
    dev = os.path.join(d, "nulldev")
    try:  # a copy of /dev/null (root may make one; others skip this part)
        os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        specials.append((dev, "a character device"))
    except (PermissionError, OSError):
        pass
    tr_dir = os.path.join(d, "tr")
    for path, kind in specials:
        for args in (["ckpt", "export", ck, "--out", path],
                     ["data", "tokenizer-train", "--input", train, "--out", path, "--force", "1",
                      "--vocab-size", "300"],
                     ["train", "--train-data", train, *TINY, "--steps", "1", "--trace-dir",
                      "none", "--save-weights", path],
                     ["trace", "merge", tr_dir, "-o", path],
                     ["diag", "--history", path, "--gemm-n", "16"]):
            rc, out, err = run_capped(args, cwd=d)
            ok(rc == 2 and f"{path} is {kind}, not a regular file" in err,
               f"{args[0]} {args[1]}: an output that is {kind} is refused", f"rc={rc}\n{err}")
        st = os.stat(path, follow_symlinks=False)
        ok((stat.S_ISFIFO if kind == "a FIFO" else stat.S_ISCHR)(st.st_mode),
           f"{kind} left as it was", oct(st.st_mode))
    rc, out, err = run_capped(["train", "--train-data", train, *TINY, "--steps", "1",
                               "--trace-dir", "none", "--metrics", "/dev/null", "--log-file",
                               "/dev/null"], cwd=d)
    ok(rc == 0, "--metrics and --log-file /dev/null (appended) still work", err[-800:])


def test_stdout_full(w, val, train):
    """A command whose stdout cannot be written (a full disk: /dev/full) exits 4 naming it
    (before, `eval --json > result.json` exited 0 with an empty file); into a pipe whose reader
    went away (`| head`) it is no error."""
    if not os.path.exists("/dev/full"):
        print("SKIP: stdout on a full disk (no /dev/full)")
        return
    for args in (["eval", "--weights", w, "--val-data", val, "--batch", "2", "--seq", "8",
                  "--val-batches", "1", "--json"],
                 ["sample", "--weights", w, "--tokens", "3", "--tokenizer", "ids", "--prompt", "1"],
                 ["data", "inspect", train]):
        with open("/dev/full", "w") as full:
            p = subprocess.run([BIN, *args], stdout=full, stderr=subprocess.PIPE, text=True,
                               timeout=120)
        ok(p.returncode == 4 and f"megascale {args[0]}: error: stdout: " in p.stderr and
           "its output is incomplete" in p.stderr,
           f"{args[0]} with stdout on a full disk: exit 4, named", f"rc={p.returncode}\n{p.stderr}")
    # (more than a pipe holds, so that the writes after head has gone fail with EPIPE; the
    # status is the command's, not head's)
    p = subprocess.run(f"'{BIN}' sample --weights '{w}' --tokens 40000 --tokenizer ids "
                       f"--prompt 1 | head -c 1; exit ${{PIPESTATUS[0]}}", shell=True,
                       capture_output=True, text=True, timeout=120, executable="/bin/bash")
    ok(p.returncode in (0, 141) and "error" not in p.stderr,
       "sample | head: no error (SIGPIPE ends it, as any Unix tool)",
       f"rc={p.returncode}\n{p.stderr[-500:]}")


def test_config_as_output(d, train, ck):
    """An output of a command that is its own --config file (or a file the
    command writes into an output directory): exit 2 naming the option, the
    path and the config file, before anything is written (the log was
    appended to the config, the metrics and the launch's events written
    over it, a restart read that back); every subcommand with an output."""
    cd = os.path.join(d, "cfgs")
    TR = ["train", "--train-data", train, *TINY, "--steps", "1", "--trace-dir", "none"]
    tr2 = os.path.join(cd, "tr2")  # a copy of the run's trace, to hold a config as trace.json
    shutil.copytree(os.path.join(d, "tr"), tr2)
    LA = ["launch", "--np", "1", "--run-dir"]
    C, T, W = "{C}", "steps = 1\n", "window = 5\n"  # C: the config file's path, in args
    rows = [  # (the config file under cfgs/, its text, args, the option named, its path: None is C)
        ("log.cfg", T, [*TR, "--config", C, "--log-file", C], "--log-file", None),
        ("metrics.cfg", T, [*TR, "--config", C, "--metrics", C], "--metrics", None),
        ("weights.cfg", T, [*TR, "--config", C, "--save-weights", C], "--save-weights", None),
        # the config.json --save-weights writes beside the weights
        ("sw/config.json", T, [*TR, "--config", C, "--save-weights", f"{cd}/sw/model.safetensors"],
         "--save-weights' config.json", None),
        # --out-dir's outputs (its train.cfg is the options, rewritten: test_outdir)
        ("od/train.log", T, [*TR, "--config", C, "--out-dir", f"{cd}/od"], "--log-file", None),
        # a directory output: the files the run writes there
        ("td/events_r00000.jsonl", T, [*TR, "--config", C, "--trace-dir", f"{cd}/td"],
         "--trace-dir", f"{cd}/td"),
        ("tm/trace/hang_r00000.json", T,
         [*TR, "--config", C, "--trace-dir=", "--metrics", f"{cd}/tm/m.jsonl"], "--trace-dir",
         f"{cd}/tm/trace"),
        ("pc/peak-myhost.json", T, [*TR, "--config", C, "--peak-cache", f"{cd}/pc"],
         "--peak-cache", f"{cd}/pc"),
        # launch: the ranks' --config (after --) as its --events, or as the
        # default RUN_DIR/events.jsonl; launch's own --config as that default
        ("ranks.cfg", T, [*LA, f"{cd}/lr1", "--events", C, "--", *TR[1:], "--config", C],
         "launch --events", None),
        ("lr2/events.jsonl", T, [*LA, f"{cd}/lr2", "--", *TR[1:], "--config", C],
         "launch --run-dir's events file", None),
        ("lr3/events.jsonl", "max-restarts = 0\n", [*LA, f"{cd}/lr3", "--config", C, "--", *TR[1:]],
         "launch --run-dir's events file", None),
        ("measure.cfg", "threads = 1\n", ["plan", "measure", "--config", C, "--out", C], "--out",
         None),
        ("merge.cfg", W, ["trace", "merge", tr2, "--config", C, "--out", C], "--out", None),
        ("tr2/trace.json", W, ["trace", "merge", tr2, "--config", C], "merge's default --out",
         None),
        ("strag.cfg", W, ["trace", "stragglers", tr2, "--config", C, "--png", C], "--png", None),
        ("diag.cfg", "gemm-n = 16\n", ["diag", "--config", C, "--history", C], "--history", None),
        ("hd/n1.jsonl", "gemm-n = 16\n",
         ["diag", "--config", C, "--history-dir", f"{cd}/hd", "--node-map", "n1"], "--history-dir",
         f"{cd}/hd"),
        ("tok.cfg", "vocab-size = 300\n",
         ["data", "tokenizer-train", "--input", train, "--config", C, "--out", C, "--force"],
         "--out", None),
        ("export.cfg", "save-dtype = f32\n", ["ckpt", "export", ck, "--config", C, "--out", C],
         "--out", None),
        ("ex/w.config.json", "save-dtype = f32\n",
         ["ckpt", "export", ck, "--config", C, "--out", f"{cd}/ex/w.safetensors"],
         "--out's config.json", None),
    ]
    made = {}
    for rel, text, args, opt, path in rows:
        c = os.path.join(cd, rel)
        os.makedirs(os.path.dirname(c), exist_ok=True)
        open(c, "w").write(text)
        made[c] = text.encode()
        args = [c if a == C else a for a in args]
        rc, out, err = run_capped(args, cwd=d)
        ok(rc == 2 and f"{opt} {path or c}" in err and f"the --config file {c}" in err
           and "nothing was written" in err,
           f"{' '.join(args[:2])} ... {opt} {path or c}: exit 2 naming the --config file {c}",
           f"rc={rc}\n{err}")
    changed = [p for p, b in made.items() if not os.path.isfile(p) or open(p, "rb").read() != b]
    ok(not changed, "no --config file was changed or moved by the refused commands", str(changed))
    ok(not any(os.path.exists(os.path.join(cd, n)) for n in ("lr1", "sw/model.safetensors",
                                                              "ex/w.safetensors")),
       "the refused commands wrote nothing")


def test_other_flags(d, train, ck):
    """The other 0/1 switches that may be given bare: data --force, ckpt
    --remove, train --new-run (before another option or a positional)."""
    text, tok = os.path.join(d, "flags.txt"), os.path.join(d, "flags.tok")
    open(text, "w").write("a few words to train a tokenizer on, and a few more " * 40)
    open(tok, "w").write("not a tokenizer")
    rc, out, err = run("data", "tokenizer-train", "--input", text, "--out", tok, "--force",
                       "--vocab-size", "300")
    ok(rc == 0 and open(tok, "rb").read(4) != b"not ", "data tokenizer-train --force --vocab-size",
       err)
    shm = os.path.join(d, "flags_shm")
    os.makedirs(shm)
    for args in (["shm", "--remove", ck], ["shm", ck, "--remove"], ["shm-orphans", "--remove"],
                 ["shm", "--remove", "0", ck]):
        rc, out, err = run("ckpt", *args, "--ckpt-shm-dir", shm)
        ok(rc == 0, f"ckpt {' '.join(args)}", err)
    # a fault plan of 10 KB (the driver hands up to 40 KB) whose last entry fires
    # at step 1: the trainer cut its copy at 8 KiB, which lost it (exit 0), or
    # failed to parse a cut entry, or moved a fault's step ("exit@12345" as @12)
    plan = ",".join([f"stage2:after-manifest@1000{i:02d}:node=n-0123456789abcdef"
                     for i in range(200)] + ["exit@1"])
    rc, out, err = run("train", "--train-data", train, *TINY, "--steps", "2", "--trace-dir",
                       "none", "--inject-fault", plan)
    ok(len(plan) > 10000 and rc == 42 and "step 1: injected fault: rank 0 exits" in err,
       "train --inject-fault: a plan of 10 KB is read whole (its last entry fires)",
       f"rc {rc}\n{err[-1500:]}")
    mine = os.path.join(d, "flags_ck")
    shutil.copytree(ck, mine)
    rc, out, err = run("train", "--train-data", train, *TINY, "--steps", "1", "--ckpt-dir", mine,
                       "--new-run", "--trace-dir", "none")
    ok(rc == 0 and "previous-" in err, "train --new-run --trace-dir: a new run, the old one aside",
       err)
    # --resume auto continues the run there, --new-run starts another: both is no run at all
    # (--new-run was ignored); nothing in the directory moves
    before = sorted(os.listdir(mine))
    rc, out, err = run("train", "--train-data", train, *TINY, "--steps", "2", "--ckpt-dir", mine,
                       "--resume", "auto", "--new-run", "--trace-dir", "none")
    ok(rc == 2 and "pass one of them" in err and sorted(os.listdir(mine)) == before,
       "train --resume auto --new-run: refused, nothing moved", err)
    # --restart-job (launch's): a job id of 16 hex digits, and a --ckpt-dir to hold it
    for v, extra, needle in (("xyz", ["--ckpt-dir", mine], "not a job id (16 hex digits"),
                             ("0" * 16, ["--ckpt-dir", mine], "not a job id"),
                             ("0123456789abcdef0", ["--ckpt-dir", mine], "not a job id"),
                             ("0123456789abcdef", [], "--restart-job needs --ckpt-dir")):
        rc, out, err = run("train", "--train-data", train, *TINY, "--steps", "1",
                           "--trace-dir", "none", "--restart-job", v, *extra)
        ok(rc == 2 and needle in err and sorted(os.listdir(mine)) == before,
           f"train --restart-job {v!r}: refused, nothing moved", err)
    # ckpt shm-orphans PATH, an unknown command with a PATH: the command is what is wrong
    for args, needle in ((["shm-orphans", "/no/such/dir"], "takes no PATH"),
                         (["bogus", "/no/such/dir"], "unknown ckpt command 'bogus'")):
        rc, out, err = run("ckpt", *args)
        ok(rc == 2 and needle in err and "/no/such/dir" not in err, f"ckpt {args[0]} PATH", err)
    # a number with a blank before it is as wrong as one with a blank after it
    for v in (" 5", "5 ", " 5 "):
        for opt, what in (("--ckpt-every-min", "a number"), ("--steps", "an integer"),
                          ("--seed", "a non-negative integer")):
            rc, out, err = run("train", "--train-data", train, opt, v)
            ok(rc == 2 and f"expects {what}, got '{v}'" in err, f"train {opt} '{v}'", err)
    # an output that exists in a directory named like a commit, without its
    # manifest, is no checkpoint's file (test_bad_input: a commit's files)
    runs = os.path.join(d, "runs", "step_1")
    os.makedirs(runs)
    open(os.path.join(runs, "m.jsonl"), "w").write("{}\n")
    rc, out, err = run("train", "--train-data", train, *TINY, "--steps", "1", "--trace-dir", "none",
                       "--metrics", os.path.join(runs, "m.jsonl"))
    ok(rc == 0, "train --metrics DIR/step_1/FILE (no manifest there): not a commit's file", err)
    # an unquoted glob, expanded by the shell: the option takes the first
    # file, and the error says why the second is left over
    rc, out, err = run("train", "--train-data", train, train, *TINY, "--steps", "1")
    ok(rc == 2 and f"unexpected argument '{train}' after --train-data {train}" in err
       and "the shell expanded it" in err and "--train-data 'DIR/NAME_*'" in err,
       "train --train-data A B: the unquoted glob named", err)
    rc, out, err = run("data", "prepare", "--input", text, text, "--out", os.path.join(d, "g"))
    ok(rc == 2 and f"unexpected argument '{text}'" in err and "the shell expanded it" in err,
       "data prepare --input A B: the unquoted glob named", err)
    # a stray argument after a number is only unexpected
    rc, out, err = run("train", "--train-data", train, "--steps", "1", "stray", *TINY)
    ok(rc == 2 and "unexpected argument 'stray'" in err and "shell" not in err,
       "train --steps 1 stray: unexpected, no glob hint", err)


def test_input_handling(d, train):
    """The model's size checked before it is allocated (--seq-max's range,
    the host's memory), a bad choice from the environment named with its
    variable, a --config file with a UTF-8 BOM, data's --out checked up front,
    the ranges and texts of --help, and the notes of data prepare and
    tokenizer-train."""
    tr = ["train", "--train-data", train, "--trace-dir", "none", "--steps", "1"]
    # validation shards of another tokenizer than the training data's (uint32 ids against
    # uint16): refused naming both (its val_loss meant nothing, with no word)
    val32 = os.path.join(d, "val32_000000.bin")
    write_shard(val32, text_tokens(4000), version=2)
    rc, _, err = run(*tr, "--layers", "1", "--dim", "32", "--heads", "1", "--seq-max", "16",
                     "--seq", "16", "--batch", "2", "--val-data", val32, "--val-batches", "1")
    ok(rc == 3 and f"--val-data {val32} is a GPT-2 uint32 shard, but --train-data" in err and
       "the ids of two tokenizers" in err,
       "train --val-data of another tokenizer's shards: refused, exit 3", f"rc={rc}\n{err}")
    # a fresh run over an earlier run's metrics that fails at its first batch (a token past
    # the vocabulary): the earlier file is left as it was (it was cut to the new config line);
    # one that trains replaces it, leaving no copy
    metrics = os.path.join(d, "keep_m.jsonl")
    earlier = '{"type":"config"}\n{"step":1,"loss":5.0}\n{"step":2,"loss":4.0}\n'
    open(metrics, "w").write(earlier)
    badtok = os.path.join(d, "badtok_000000.bin")
    write_shard(badtok, [1, 2, 3, 65535] + text_tokens(4000))
    small = ["--layers", "1", "--dim", "32", "--heads", "1", "--seq-max", "16", "--seq", "16",
             "--batch", "2", "--vocab", "256", "--data-order", "sequential"]
    rc, _, err = run("train", "--train-data", badtok, "--trace-dir", "none", "--steps", "1",
                     *small, "--metrics", metrics)
    ok(rc == 3 and "is >= vocab size" in err and open(metrics).read() == earlier and
       not os.path.exists(metrics + ".prev") and "made no step" in err,
       "a fresh run that fails at its first batch: the earlier metrics kept",
       f"rc={rc}\n{err[-800:]}")
    # a start killed before its first step left FILE.prev (the earlier lines) and FILE (its
    # config line): the next fresh start keeps FILE.prev (it moved FILE over it: lost)
    open(metrics + ".prev", "w").write(earlier)
    open(metrics, "w").write('{"type":"config"}\n')
    rc, _, err = run("train", "--train-data", badtok, "--trace-dir", "none", "--steps", "1",
                     *small, "--metrics", metrics)
    ok(rc == 3 and open(metrics).read() == earlier and not os.path.exists(metrics + ".prev"),
       "after a start killed before its first step: the earlier lines kept",
       f"rc={rc}\n{err[-800:]}")
    rc, _, err = run(*tr, *small[:-2], "--metrics", metrics)
    ok(rc == 0 and '"loss":5.0' not in open(metrics).read() and
       not os.path.exists(metrics + ".prev"), "... and one that trains replaces it",
       f"rc={rc}\n{err[-800:]}")
    # a link as --metrics is written through (renamed aside, it became a file of its own
    # name, and the link's target never got the run's lines: /dev/stdout's case)
    target, link = os.path.join(d, "m_target.jsonl"), os.path.join(d, "m_link.jsonl")
    open(target, "w").write(earlier)
    os.symlink(target, link)
    rc, _, err = run(*tr, *small[:-2], "--metrics", link)
    ok(rc == 0 and os.path.islink(link) and '"loss":5.0' not in open(target).read() and
       '"step":1' in open(target).read() and not os.path.exists(link + ".prev"),
       "--metrics LINK: the link kept, its target written", f"rc={rc}\n{err[-800:]}")
    # ... and on a resume, whose trim rewrites the file: the link still kept, the target
    # trimmed (the rename replaced the link by a file of its own); a link to a file descriptor
    # (/dev/stdout redirected to a file) is appended to (its rename was refused: exit 2)
    ck = os.path.join(d, "m_link_ck")
    rc, _, err = run(*tr, *small[:-2], "--metrics", link, "--ckpt-dir", ck)
    rc2, _, err2 = run(*tr, *small[:-2], "--steps", "3", "--metrics", link, "--ckpt-dir", ck,
                       "--resume", "auto")
    ok(rc == 0 and rc2 == 0 and os.path.islink(link) and '"step":3' in open(target).read(),
       "--metrics LINK on a resume: the link kept, its target trimmed and written",
       f"rc={rc} {rc2}\n{err[-800:]}{err2[-800:]}")
    out = os.path.join(d, "m_stdout.txt")
    fd_link = os.path.join(d, "m_fd_link")
    with open(out, "w") as f:
        os.symlink(f"/proc/self/fd/{f.fileno()}", fd_link)
        p = subprocess.run([BIN, *tr, *small[:-2], "--steps", "4", "--metrics", fd_link,
                            "--ckpt-dir", ck, "--resume", "auto"], stdout=f,
                           stderr=subprocess.PIPE, text=True, pass_fds=(f.fileno(),))
    ok(p.returncode == 0 and os.path.islink(fd_link) and '"step":4' in open(out).read(),
       "--metrics naming a file descriptor on a resume: appended to, not refused",
       p.stderr[-800:])
    # --seq-max beyond its range: the parser's error, exit 2 (it was allocated: exit 137)
    rc, _, err = run(*tr, "--layers", "1", "--dim", "32", "--heads", "1", "--seq-max",
                     "100000000", "--seq", "16", "--batch", "2")
    ok(rc == 2 and "--seq-max must be in [0,10000000], got '100000000'" in err,
       "train --seq-max 100000000: out of range, exit 2", f"rc={rc}\n{err}")
    # a model no host holds (dim 2^20: 53 TB of parameters): refused before it is
    # allocated, exit 8; the address space capped all the same (no sanitizer)
    cap = None
    if os.environ.get("MS_SANITIZER", "none") == "none":
        import resource
        cap = lambda: resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # noqa: E731
    p = subprocess.run([BIN, *tr, "--layers", "1", "--dim", "1048576", "--heads", "1", "--vocab",
                        "256", "--seq-max", "32", "--seq", "16", "--batch", "2", "--threads", "2"],
                       capture_output=True, text=True, errors="replace", preexec_fn=cap,
                       timeout=120)
    ok(p.returncode == 8 and "model: needs" in p.stderr and "on backend cpu; this host has"
       in p.stderr and "nothing was allocated" in p.stderr,
       "train --dim 1048576: more than the host's memory, refused with exit 8",
       f"rc={p.returncode}\n{p.stderr}")
    # a bad --cpu-dtype from the environment names the variable, for train and eval
    env = dict(os.environ, MS_CPU_DTYPE="fp16")
    for cmd in (tr, ["eval", "--val-data", train, "--weights", train]):
        rc, _, err = run(*cmd, env=env)
        ok(rc == 2 and 'environment MS_CPU_DTYPE: --cpu-dtype: "fp16" is not fp32 or bf16' in err,
           f"MS_CPU_DTYPE=fp16 megascale {cmd[0]}: the variable named", f"rc={rc}\n{err}")
        rc, _, err = run(*cmd, "--cpu-dtype", "fp16")
        ok(rc == 2 and 'command line: --cpu-dtype: "fp16" is not fp32 or bf16' in err,
           f"{cmd[0]} --cpu-dtype fp16: refused by the parser", f"rc={rc}\n{err}")
    # an option of the other backend is said to do nothing there, not ignored in silence
    rc, _, err = run("train", "--train-data", train, *TINY, "--trace-dir", "none", "--steps",
                     "1", "--cuda-profile", "1", "--cuda-fuse-gelu", "0")
    ok(rc == 0 and "--cuda-profile 1 (the option, a --config file or MS_CUDA_PROFILE) is for "
       "--device cuda: the cpu backend ignores it" in err and "--cuda-fuse-gelu 0" in err,
       "train --device cpu --cuda-profile 1 --cuda-fuse-gelu 0: both said to be ignored",
       f"rc={rc}\n{err}")
    rc, _, err = run("train", "--train-data", train, *TINY, "--trace-dir", "none", "--steps",
                     "1", "--device", "cuda", "--cpu-profile", "1")
    ok("--cpu-profile 1 (the option, a --config file or MS_CPU_PROFILE) is for --device cpu: "
       "the cuda backend ignores it" in err,
       "train --device cuda --cpu-profile 1: said to be ignored", f"rc={rc}\n{err}")
    rc, _, err = run("train", "--train-data", train, *TINY, "--trace-dir", "none", "--steps",
                     "1", "--cpu-profile", "1")
    ok(rc == 0 and "ignores it" not in err and "--comm" not in err,
       "train --cpu-profile 1 on the cpu: no such warning", f"rc={rc}\n{err}")
    rc, _, err = run("train", "--train-data", train, *TINY, "--trace-dir", "none", "--steps",
                     "1", "--comm", "nccl")
    ok(rc == 0 and "--comm nccl is for device buffers (--device cuda): the cpu backend's host "
       "buffers go through MPI whatever it says" in err,
       "train --device cpu --comm nccl: said to do nothing", f"rc={rc}\n{err}")
    # a --config file that starts with a UTF-8 byte-order mark
    cfg = os.path.join(d, "bom.cfg")
    open(cfg, "wb").write("\ufeffcount = 3\n".encode("utf-8"))
    rc, out, err = run("data", "inspect", train, "--config", cfg)
    ok(rc == 0 and "first 3 tokens" in out, "--config FILE with a UTF-8 BOM", f"rc={rc}\n{err}")
    # data's --out: a file, or under one, is named before the input is read
    text, afile, adir = (os.path.join(d, n) for n in ("io.txt", "io_file", "io_dir"))
    open(text, "w").write("a few words to prepare and train a tokenizer on " * 20)
    open(afile, "w").write("keep")
    os.makedirs(adir)
    for out_path, needle in ((afile, f"--out: {afile}: exists and is not a directory"),
                             (os.path.join(afile, "x"), f"--out: {afile}/x: '{afile}' is not a "
                                                        "directory")):
        rc, _, err = run("data", "prepare", "--input", text, "--out", out_path, "--tokenizer",
                         "bytes")
        ok(rc == 2 and needle in err and open(afile).read() == "keep",
           f"data prepare --out {out_path}: exit 2 naming --out", f"rc={rc}\n{err}")
    # tokenizer-train --out DIR: the directory, not --force, is what is wrong
    rc, _, err = run("data", "tokenizer-train", "--input", text, "--out", adir)
    ok(rc == 2 and f"--out: {adir}: is a directory, not a file" in err and "--force" not in err,
       "tokenizer-train --out DIR: the directory named, no --force suggested", f"rc={rc}\n{err}")
    # --help: every numeric option with its range, the weights' formats, --out's command
    for args, needles in (
            (["train"], ["--seed N", "[1337] (>= 0)", "(in [0,10000000])", "llm.c model file",
                         "(fp32 or bf16) (env MS_CPU_DTYPE)"]),
            (["eval"], ["llm.c model file"]),
            (["data"], ["(in [1,2147483647])", "tokenizer file (tokenizer-train)"]),
            (["diag"], ["(in [1,4096])", "(in [0,32768])", "(in [0,1])", "(in [1,65536])",
                        "(in (0,1e6])", "(in [1,1048576])"]),
            (["trace"], ["(in (0,1])", "(in [1,100000])"])):
        rc, out, err = run(*args, "--help")
        ok(rc == 0 and all(n in out for n in needles), f"{args[0]} --help: {needles}", out)
    rc, _, err = run("diag", "--min-mem-gbps", "-1")
    ok(rc == 2 and "--min-mem-gbps must be >= 0, got '-1'" in err, "diag --min-mem-gbps -1", err)
    rc, _, err = run("data", "prepare", "--input", text, "--out", os.path.join(d, "st"),
                     "--shard-tokens", "0")
    ok(rc == 2 and "--shard-tokens must be in [1,2147483647], got '0'" in err,
       "data prepare --shard-tokens 0", err)
    # the notes: a validation share under one byte, a vocabulary the text cannot fill
    small = os.path.join(d, "small.txt")
    open(small, "w").write("tiny text\n")
    rc, _, err = run("data", "prepare", "--input", small, "--out", os.path.join(d, "sm"),
                     "--tokenizer", "bytes")
    ok(rc == 0 and "note: no validation shard was written: --val-fraction 0.01 of 10 byte(s)"
       in err, "data prepare: a validation share under one byte is said", err)
    rc, _, err = run("data", "tokenizer-train", "--input", small, "--out",
                     os.path.join(d, "small.tok"), "--vocab-size", "100000")
    ok(rc == 0 and "note: --vocab-size 100000 asked for 99743 merges" in err,
       "tokenizer-train: fewer merges than asked is said", err)


def test_warmup_past_steps(d, train):
    """--warmup not shorter than --steps: legal, but the lr never reaches --lr nor decays; said
    at start (it was silent), and not said for a warmup inside the run."""
    base = ["train", "--train-data", train, *TINY, "--trace-dir", "none", "--steps", "3"]
    rc, _, err = run(*base, "--warmup", "10")
    ok(rc == 0 and "--warmup 10 is not shorter than --steps 3" in err and "ends at" in err,
       "train --warmup past --steps: a warning with the lr it ends at", err)
    rc, _, err = run(*base, "--warmup", "2")
    ok(rc == 0 and "is not shorter than --steps" not in err, "train --warmup 2 of 3: no warning",
       err)


def test_nonfinite_weights(d, w, val):
    """Finite weights too large for fp32 (ln_f at 3e38): the logits overflow.
    eval printed val_loss nan and exited 0, sample emitted id 0 forever; an
    ids prompt with no id conditioned on id 0 without a word."""
    raw = open(w, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    name = next(k for k in head if k.endswith("ln_f.weight"))
    a, b = head[name]["data_offsets"]
    body = bytearray(raw[8 + n:])
    body[a:b] = struct.pack("<f", 3e38) * ((b - a) // 4)
    huge = os.path.join(d, "huge.safetensors")
    open(huge, "wb").write(raw[:8 + n] + bytes(body))
    rc, out, err = run("eval", "--weights", huge, "--val-data", val, "--seq", "16", "--batch", "4")
    ok(rc == 6 and "val_loss" in out and f"the loss of {huge}" in err and "is not finite" in err,
       "eval: a non-finite loss is printed and is an error (exit 6)", f"rc={rc}\n{out}\n{err}")
    rc, out, err = run("eval", "--weights", huge, "--val-data", val, "--seq", "16", "--batch", "4",
                       "--json")
    ok(rc == 6 and is_json(out) and json.loads(out)["val_loss"] is None,
       "eval --json: val_loss null, exit 6", f"rc={rc}\n{out}\n{err}")
    rc, out, err = run("sample", "--weights", huge, "--tokenizer", "ids", "--prompt", "1 2",
                       "--tokens", "3")
    ok(rc == 6 and "the logits after 2 token(s) are not finite" in err,
       "sample: non-finite logits are an error (exit 6)", f"rc={rc}\n{out}\n{err}")
    # activations past 1e19 (the embeddings x 1e21): the LayerNorm's variance overflows, and
    # 1/sqrt(inf) = 0 collapsed each row to its bias: finite garbage, exit 0; now NaN
    name = next(k for k in head if k.endswith("wte.weight"))
    a, b = head[name]["data_offsets"]
    body = bytearray(raw[8 + n:])
    vals = struct.unpack(f"<{(b - a) // 4}f", body[a:b])
    body[a:b] = struct.pack(f"<{len(vals)}f", *(v * 1e21 for v in vals))
    open(huge, "wb").write(raw[:8 + n] + bytes(body))
    rc, out, err = run("eval", "--weights", huge, "--val-data", val, "--seq", "16", "--batch", "4")
    ok(rc == 6 and "is not finite" in err,
       "eval: a LayerNorm variance past fp32 is not finite (exit 6)", f"rc={rc}\n{out}\n{err}")
    rc, out, err = run("sample", "--weights", huge, "--tokenizer", "ids", "--prompt", "1 2",
                       "--tokens", "3")
    ok(rc == 6 and "are not finite" in err,
       "sample: a LayerNorm variance past fp32 is not finite (exit 6)", f"rc={rc}\n{out}\n{err}")
    rc, out, err = run("sample", "--weights", w, "--tokenizer", "ids", "--tokens", "3")
    ok(rc == 2 and "the --prompt (none given: the default, a newline,) holds no token id" in err,
       "sample --tokenizer ids without a prompt: a usage error naming the default",
       f"rc={rc}\n{err}")
    rc, out, err = run("sample", "--weights", w, "--tokenizer", "ids", "--prompt", " ",
                       "--tokens", "3")
    ok(rc == 2 and "the --prompt holds no token id" in err,
       "sample --tokenizer ids without ids in the prompt: a usage error", f"rc={rc}\n{err}")
    rc, out, err = run("sample", "--weights", w, "--tokenizer", "ids", "--prompt", "5", "--tokens",
                       "3")
    ok(rc == 0 and out.startswith("5"), "sample --tokenizer ids --prompt 5", f"rc={rc}\n{err}")
    # an empty prompt is a new document (end-of-text), never the default newline in disguise
    rc, out, err = run("sample", "--weights", w, "--tokenizer", "ids", "--prompt", "", "--tokens",
                       "3")
    ok(rc == 2 and "the --prompt holds no token id" in err and "none given" not in err,
       "sample --prompt '' with ids: no token id, and it was given", f"rc={rc}\n{err}")
    rc, out, err = run("sample", "--weights", w, "--tokenizer", "bytes", "--prompt", "",
                       "--tokens", "3")
    ok(rc == 2 and "--prompt is empty, and the bytes tokenizer has no end-of-text token" in err,
       "sample --prompt '' with bytes: no end-of-text to start from", f"rc={rc}\n{err}")


def make_fixture(d):
    """A tiny model's weights, its checkpoint directory and a validation shard
    (and its trace, D/tr, for the trace tools' bad outputs)."""
    train, val = os.path.join(d, "train.bin"), os.path.join(d, "val.bin")
    write_shard(train, text_tokens(4000))
    write_shard(val, text_tokens(2000))
    w, ck = os.path.join(d, "w.safetensors"), os.path.join(d, "ck")
    rc, _, err = run("train", "--train-data", train, *TINY, "--trace-dir", os.path.join(d, "tr"),
                     "--steps", "2",
                     "--save-weights", w, "--ckpt-dir", ck, "--ckpt-every", "2")
    if rc != 0:
        print(f"FAIL: the fixture's training run\n{err}\n0 passed, 1 failed")
        sys.exit(1)
    return w, val, train, ck


def main():
    with tempfile.TemporaryDirectory(prefix="ms_args_") as d:
        w, val, train, ck = make_fixture(d)
        test_json_flags(d, (w, val))
        test_checkpoint_as_weights(d, w, val, train, ck)
        test_bad_input(d, w, val, train, ck)
        test_special_outputs(d, w, train, ck)
        test_config_as_output(d, train, ck)
        test_other_flags(d, train, ck)
        test_input_handling(d, train)
        test_nonfinite_weights(d, w, val)
        test_warmup_past_steps(d, train)
        test_stdout_full(w, val, train)
    from test_cli import passed, failed  # noqa: E402 (the counters ok() kept)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
