"""The fixed validation set and `megascale eval` in one process (issue 13).
One model's validation loss is the same for --micro-batch 1, 2 and 4
(before, each micro-batch size scored a set of its own, --val-batches x
micro-batch sequences: 3.8679, 3.8390 and 3.8410); `megascale eval` on the weights a run saved, and on
its checkpoint (a commit, or the checkpoint directory: its newest valid
commit, a damaged one skipped with a warning), equals that run's val_loss
at that step, also with the run's --val-data and --val-batches taken from
the checkpoint (a resume with another count warns); --json; and bad input, each named: missing weights, both or
neither source, no --val-data, too few tokens for the set (also at a
training run's start), a token outside the model's vocabulary, no valid
checkpoint, --seq past the model's, a batch the micro-batch does not
divide.  The multi-rank layouts: tests/mpi/test_val.py.
Environment: MS_BIN (the binary)."""
import glob
import json
import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_cli import TINY, expect_error, ok, run, text_tokens, write_shard  # noqa: E402

SET = ["--val-batches", "5"]  # 5 x --batch 4 sequences of 16+1 tokens: 320 targets


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def vals_of(path):
    """{step: val_loss} of a --metrics file."""
    return {j["step"]: j["val_loss"] for j in map(json.loads, open(path)) if "val_loss" in j}


def eval_json(*args):
    """`megascale eval ARGS --json`: (the object or None, stderr)."""
    rc, out, err = run("eval", *args, "--json")
    try:
        return (json.loads(out) if rc == 0 else None), err
    except ValueError:
        return None, err + out


def main():
    d = tempfile.mkdtemp(prefix="ms_eval_")
    train, val = os.path.join(d, "train.bin"), os.path.join(d, "val.bin")
    write_shard(train, text_tokens(20000))
    write_shard(val, text_tokens(3000))
    base = ["train", "--train-data", train, *TINY, "--trace-dir", "none"]
    m, w, ck = os.path.join(d, "m.jsonl"), os.path.join(d, "w.safetensors"), os.path.join(d, "ck")
    rc, _, err = run(*base, "--val-data", val, *SET, "--steps", "20", "--lr", "3e-3", "--val-every",
                     "10", "--metrics", m, "--save-weights", w, "--ckpt-dir", ck, "--ckpt-every",
                     "10")
    vals = vals_of(m) if rc == 0 else {}
    ok(rc == 0 and sorted(vals) == [0, 10, 20], "a run validates at steps 0, 10, 20", err)
    if rc != 0:
        print("0 passed, 1 failed")
        sys.exit(1)
    ok("validation: the first 20 sequences of 16+1 tokens" in err,
       "the run says what its validation set is", err)

    # --- the same model, three micro-batch sizes: the same loss ---
    by_mb = {}
    for mb in (1, 2, 4):
        mp = os.path.join(d, f"mb{mb}.jsonl")
        rc, _, err = run(*base, "--init-from", w, "--steps", "1", "--lr", "1e-9", "--val-data", val,
                         *SET, "--micro-batch", str(mb), "--metrics", mp)
        by_mb[mb] = vals_of(mp).get(0) if rc == 0 else None
        ok(by_mb[mb] is not None, f"--micro-batch {mb}: the run validates", err)
    got = [v for v in by_mb.values() if v is not None]
    worst = max(rel(v, vals[20]) for v in got) if len(got) == 3 else 1
    ok(worst <= 1e-6, f"val_loss for --micro-batch 1/2/4 = the run's (rel {worst:.1e})",
       f"{by_mb} vs {vals[20]}")
    print(f"val_loss by micro-batch: {by_mb}; the run's at step 20: {vals[20]}")

    # --- eval on the saved weights: the run's last val_loss ---
    rc, out, err = run("eval", "--weights", w, "--val-data", val, *SET, "--batch", "4", "--seq",
                       "16")
    mt = re.match(r"^val_loss (\S+) over (\d+) tokens \(ppl (\S+)\)$", out.strip())
    ok(rc == 0 and mt and int(mt.group(2)) == 320 and abs(float(mt.group(1)) - vals[20]) <= 1e-6,
       "eval --weights prints 'val_loss X over N tokens (ppl Y)' with the run's loss",
       out + err)
    j, err = eval_json("--weights", w, "--val-data", val, *SET, "--batch", "4", "--seq", "16")
    ok(j is not None and rel(j["val_loss"], vals[20]) <= 1e-6 and j["tokens"] == 320 and
       j["sequences"] == 20 and abs(j["ppl"] - 2.718281828459045 ** j["val_loss"]) < 1e-6 * j["ppl"]
       and j["layout"] == {"world": 1, "dp": 1, "tp": 1, "pp": 1} and "step" not in j,
       "eval --weights --json: the run's last val_loss and the set", json.dumps(j) + err)
    print(f"eval --weights: {j and j['val_loss']} (run: {vals[20]})")
    j, err = eval_json("--weights", w, "--val-data", val, *SET, "--batch", "4", "--seq", "16",
                       "--micro-batch", "1")
    ok(j is not None and rel(j["val_loss"], vals[20]) <= 1e-6 and j["micro_batch"] == 1,
       "eval --micro-batch 1: the same loss", json.dumps(j) + err)

    # --- eval on the checkpoint: its --batch and --seq, the newest commit ---
    j, err = eval_json("--ckpt", ck, "--val-data", val, *SET)
    ok(j is not None and j["step"] == 20 and j["source"].endswith("step_00000020") and
       j["batch"] == 4 and j["seq"] == 16 and rel(j["val_loss"], vals[20]) <= 1e-6,
       "eval --ckpt DIR: the newest commit, the checkpoint's --batch/--seq, the run's loss",
       json.dumps(j) + err)
    j, err = eval_json("--ckpt", os.path.join(ck, "step_00000010"), "--val-data", val, *SET)
    ok(j is not None and j["step"] == 10 and rel(j["val_loss"], vals[10]) <= 1e-6,
       "eval --ckpt DIR/step_00000010: the run's val_loss at step 10", json.dumps(j) + err)
    # --- the run's validation set from the checkpoint: its --val-data and --val-batches ---
    mf = json.load(open(os.path.join(ck, "step_00000020", "manifest.json")))
    ok(mf["trainer"]["data"].get("val_batches") == 5,
       "the manifest records the run's --val-batches", json.dumps(mf["trainer"].get("data")))
    j, err = eval_json("--ckpt", ck)
    ok(j is not None and j["val_data"] == val and j["val_batches"] == 5 and j["tokens"] == 320 and
       rel(j["val_loss"], vals[20]) <= 1e-6 and "the run's" in err,
       "eval --ckpt DIR alone: the run's --val-data and --val-batches, the run's loss",
       json.dumps(j) + err)
    j, err = eval_json("--ckpt", ck, "--val-data", val, "--val-batches", "2")
    ok(j is not None and j["val_batches"] == 2 and j["tokens"] == 128,
       "eval --ckpt --val-batches 2: the option over the checkpoint's", json.dumps(j) + err)
    ck3 = os.path.join(d, "ck3")  # a run without --val-data: eval needs the option
    rc, _, err = run(*base, "--steps", "2", "--ckpt-dir", ck3, "--ckpt-every", "2")
    ok(rc == 0, "a run without --val-data saves", err)
    expect_error(["eval", "--ckpt", ck3], "--val-data GLOB is required",
                 "does not name its run's", what="eval --ckpt: no --val-data anywhere")
    ck4 = os.path.join(d, "ck4")  # a resume with another --val-batches says so
    shutil.copytree(ck, ck4)
    rc, _, err = run(*base, "--val-data", val, "--val-batches", "4", "--steps", "21",
                     "--ckpt-dir", ck4, "--ckpt-every", "10", "--resume", "auto")
    ok(rc == 0 and "--val-batches 4 differs from the checkpoint's 5" in err,
       "resume: another --val-batches is named (validation losses not comparable)", err)
    for c in (ck3, ck4):
        run("ckpt", "shm", c, "--remove", "1", "--force", "1")
    ck2 = os.path.join(d, "ck2")  # the newest commit damaged: the one before it
    shutil.copytree(ck, ck2)
    shard = sorted(glob.glob(os.path.join(ck2, "step_00000020", "*.safetensors")))[0]
    raw = bytearray(open(shard, "rb").read())
    raw[-5] ^= 0x10
    open(shard, "wb").write(raw)
    j, err = eval_json("--ckpt", ck2, "--val-data", val, *SET)
    ok(j is not None and j["step"] == 10 and rel(j["val_loss"], vals[10]) <= 1e-6 and
       "skipping" in err and "step_00000020" in err,
       "eval --ckpt DIR: a damaged newest commit is skipped with a warning", json.dumps(j) + err)

    # --- bad input, each named ---
    expect_error(["eval", "--weights", os.path.join(d, "nope.safetensors"), "--val-data", val],
                 "nope.safetensors", what="eval: missing weights")
    expect_error(["eval", "--val-data", val], "--weights FILE or --ckpt PATH",
                 what="eval: neither --weights nor --ckpt")
    expect_error(["eval", "--weights", w, "--ckpt", ck, "--val-data", val], "not both",
                 what="eval: both --weights and --ckpt")
    expect_error(["eval", "--weights", w], "--val-data", what="eval: no --val-data")
    small = os.path.join(d, "small.bin")
    write_shard(small, text_tokens(100))
    expect_error(["eval", "--weights", w, "--val-data", small, "--seq", "16", "--batch", "4"],
                 "small.bin", "6 sequences", "--val-batches 10 x --batch 4 = 40",
                 what="eval: too few tokens for the set")
    rc, _, _ = run("eval", "--weights", w, "--val-data", small, "--seq", "16", "--batch", "4")
    ok(rc == 3, "eval: too few tokens is bad input (exit 3)", str(rc))
    bad = os.path.join(d, "bad.bin")
    toks = text_tokens(2000)
    toks[150] = 300
    write_shard(bad, toks)
    expect_error(["eval", "--weights", w, "--val-data", bad, "--seq", "16", "--batch", "4"],
                 "bad.bin", "token 300", "vocab size 256", what="eval: a token outside the vocab")
    empty = os.path.join(d, "empty_ck")
    os.makedirs(empty)
    expect_error(["eval", "--ckpt", empty, "--val-data", val], "empty_ck", "no valid checkpoint",
                 what="eval: no valid checkpoint")
    expect_error(["eval", "--weights", w, "--val-data", val, "--seq", "64"], "--seq 64",
                 "seq-max 32", what="eval: --seq past the model's")
    expect_error(["eval", "--weights", w, "--val-data", val, "--seq", "16", "--batch", "6",
                  "--micro-batch", "4"], "--batch 6", "--micro-batch 4",
                 what="eval: a partial micro-batch is refused")
    # --heads with a checkpoint is checked as with a weights file (it was ignored)
    expect_error(["eval", "--ckpt", ck, "--val-data", val, *SET, "--heads", "4"],
                 "--heads 4 disagrees with", "which holds 2", what="eval --ckpt: a wrong --heads")
    # the default --seq (256) is at most the model's seq-max (32): no error about an option
    # never given
    j, err = eval_json("--weights", w, "--val-data", val, "--val-batches", "1", "--batch", "4")
    ok(j is not None and j["seq"] == 32, "eval --weights: the default --seq is the model's 32",
       json.dumps(j) + err)
    # a set larger than the data is bad input (exit 3) before the model's memory is asked for
    rc, _, err = run("eval", "--weights", w, "--val-data", small, "--seq", "16", "--batch",
                     "16777216", "--val-batches", "1")
    ok(rc == 3 and "small.bin" in err, "eval: the data is checked before the model's memory",
       f"rc={rc} {err}")
    # a damaged commit's error names the option first
    rc, _, err = run("eval", "--ckpt", os.path.join(ck2, "step_00000020"), "--val-data", val, *SET)
    ok(rc == 3 and "error: --ckpt: " in err, "eval --ckpt COMMIT: a damaged shard, named by --ckpt",
       f"rc={rc} {err}")
    rc, _, err = run("sample", "--weights", os.path.join(ck2, "step_00000020"), "--tokens", "2",
                     "--tokenizer", "ids", "--prompt", "1")
    ok(rc == 3 and "error: --weights: " in err,
       "sample --weights COMMIT: a damaged shard, named by --weights", f"rc={rc} {err}")
    rc, _, err = run(*base, "--steps", "5", "--val-data", small, *SET)
    ok(rc == 3 and "small.bin" in err and "fewer than the validation set" in err and
       "step     1" not in err, "train: a validation set that does not fit stops at start", err)

    rc, out, _ = run("eval", "--help")
    ok(rc == 0 and all(o in out for o in ("--weights", "--ckpt", "--val-data", "--val-batches",
                                          "--json")), "eval --help lists its options", out)
    rc, out, _ = run("--help")
    ok(rc == 0 and re.search(r"^  eval ", out, re.M), "megascale --help lists eval", out)

    run("ckpt", "shm", ck, "--remove", "1", "--force", "1")
    from test_cli import passed, failed  # noqa: E402  (the counters ok() kept)
    print(f"{passed} passed, {failed} failed")
    if not failed:
        shutil.rmtree(d, ignore_errors=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
