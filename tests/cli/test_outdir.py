"""--out-dir DIR and --log-file (issue 13): every output of a run under one
directory, created at start-up: metrics.jsonl, model.safetensors (with
config.json), ckpt/, trace/, train.log (each line after its UTC time, the
final error line too) and train.cfg, the effective options as a config file
that `train --config` runs again (here: continuing with --resume auto).  A
second run there without --resume auto or --new-run is refused and leaves
the first run's train.cfg and commits as they were; an option naming an
output itself wins; an --out-dir that is a file, or under one, is an error
naming it before anything runs.
Environment: MS_BIN (the binary)."""
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_cli import TINY, expect_error, ok, run, text_tokens, write_shard  # noqa: E402
import test_cli  # noqa: E402


def digest(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest() if os.path.exists(path) else None


def main():
    d = tempfile.mkdtemp(prefix="ms_outdir_")
    train = os.path.join(d, "train.bin")
    write_shard(train, text_tokens(20000))
    base = ["train", "--train-data", train, *TINY]
    out = os.path.join(d, "runs", "a")  # its parent does not exist yet
    rc, _, err = run(*base, "--steps", "4", "--ckpt-every", "2", "--out-dir", out)
    ok(rc == 0, "a run with --out-dir", err)
    for f in ("metrics.jsonl", "model.safetensors", "config.json", "train.log", "train.cfg",
              "ckpt/latest", "ckpt/step_00000004/manifest.json", "trace/events_r00000.jsonl"):
        ok(os.path.exists(os.path.join(out, f)), f"--out-dir holds {f}")
    steps = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"loss"' in l]
    ok([s["step"] for s in steps] == [1, 2, 3, 4], "the metrics are the run's", str(steps))
    log = open(os.path.join(out, "train.log")).read().splitlines()
    stamped = [l for l in log if re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z \[megascale r0 ", l)]
    ok(len(stamped) == len(log) and any("weights: saved" in l for l in log),
       "train.log: every line after its UTC time, the run's lines", "\n".join(log[:5]))
    cfg = os.path.join(out, "train.cfg")
    text = open(cfg).read()
    ok(f'out-dir = "{out}"' in text and "steps = 4" in text and "heartbeat-token" not in text,
       "train.cfg: the effective options (no launch secrets)", text)

    # --- the config runs again: continuing the run ---
    rc, _, err = run("train", "--config", cfg, "--steps", "6", "--resume", "auto")
    ok(rc == 0 and "continuing at step 4" in err, "train --config DIR/train.cfg --resume auto",
       err)
    steps = [json.loads(l)["step"] for l in open(os.path.join(out, "metrics.jsonl"))
             if '"loss"' in l]
    ok(steps[-2:] == [5, 6], "... trains steps 5 and 6", str(steps))
    ok("steps = 6" in open(cfg).read(), "train.cfg now holds the resumed run's options")

    # --- a second run there: refused, nothing of the first changed ---
    before = (digest(cfg), sorted(os.listdir(os.path.join(out, "ckpt"))))
    rc, _, err = run(*base, "--steps", "2", "--lr", "1e-3", "--out-dir", out)
    ok(rc != 0 and "--resume auto" in err and "--new-run" in err,
       "another run into the same --out-dir is refused", err)
    ok((digest(cfg), sorted(os.listdir(os.path.join(out, "ckpt")))) == before,
       "... and train.cfg and the commits are as they were")
    log = open(os.path.join(out, "train.log")).read()
    ok("megascale train: error: " in log and "--new-run" in log,
       "the error line is in train.log too", log[-2000:])

    # --- paths with a '#' (and a '"'): train.cfg holds them quoted, and runs again ---
    # (before, each was left out as a comment: the rerun had no --train-data)
    for name in ("run#2", 'run"#3'):
        sub = os.path.join(d, name)
        os.makedirs(sub)
        data = os.path.join(sub, "train.bin")
        write_shard(data, text_tokens(20000))
        o = os.path.join(sub, "out")
        rc, _, err = run("train", "--train-data", data, *TINY, "--steps", "2", "--out-dir", o)
        ok(rc == 0, f"a run in {name}", err)
        c = os.path.join(o, "train.cfg")
        text = open(c).read() if os.path.exists(c) else ""
        ok("a value holds" not in text and data in text, f"{name}: train.cfg holds the paths", text)
        rc, _, err = run("train", "--config", c, "--steps", "3", "--resume", "auto")
        ok(rc == 0 and "continuing at step 2" in err,
           f"{name}: train --config DIR/train.cfg --resume auto", err)

    # --- explicit outputs win; bad directories ---
    other = os.path.join(d, "elsewhere.jsonl")
    out2 = os.path.join(d, "b")
    rc, _, err = run(*base, "--steps", "2", "--out-dir", out2, "--metrics", other)
    ok(rc == 0 and os.path.exists(other) and not os.path.exists(os.path.join(out2, "metrics.jsonl"))
       and os.path.exists(os.path.join(out2, "model.safetensors")),
       "--metrics given: it wins over --out-dir's", err)
    rc, _, err = run(*base, "--steps", "2", "--out-dir", os.path.join(d, "c"), "--trace-dir", "none")
    ok(rc == 0 and not os.path.exists(os.path.join(d, "c", "trace")), "--trace-dir none wins", err)
    expect_error([*base, "--steps", "2", "--out-dir", train], "--out-dir", train,
                 "exists and is not a directory", what="--out-dir naming a file")
    expect_error([*base, "--steps", "2", "--out-dir", os.path.join(train, "x")], "--out-dir",
                 what="--out-dir under a file")
    lf = os.path.join(d, "only.log")
    rc, _, err = run(*base, "--steps", "2", "--log-file", lf)
    ok(rc == 0 and "step     2/2" in open(lf).read() if os.path.exists(lf) else False,
       "--log-file alone", err)
    print(f"{test_cli.passed} passed, {test_cli.failed} failed")
    if not test_cli.failed:  # kept after a failure, to look at
        shutil.rmtree(d, ignore_errors=True)
    sys.exit(1 if test_cli.failed else 0)


if __name__ == "__main__":
    main()
