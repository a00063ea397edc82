"""A run never loses its work to a shell habit (issue 13): the reader of
its log going away (`| tee` killed by the same Ctrl-C, a closed ssh session)
and SIGHUP are stop requests, like SIGINT: the run finishes its step,
commits a final checkpoint, saves its weights and exits 0.  Before, the
next log line killed it with SIGPIPE (rc 141 in a shell) and SIGHUP killed
it (rc 129), with nothing saved.

Environment: MS_BIN (the binary)."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_cli import TINY, ok, text_tokens, write_shard  # noqa: E402

BIN = os.environ.get("MS_BIN") or sys.argv[1]


def start(d, name, train):
    ck = os.path.join(d, name + "_ck")
    w = os.path.join(d, name + ".safetensors")
    args = [BIN, "train", "--train-data", train, *TINY, "--steps", "100000", "--log-every", "1",
            "--ckpt-dir", ck, "--ckpt-every", "1000", "--save-weights", w, "--trace-dir", "none"]
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    t_end = time.time() + 60
    while time.time() < t_end:  # until it trains
        line = p.stderr.readline().decode(errors="replace")
        if not line or ("step" in line and "loss" in line):
            break
    return p, ck, w


def finish(p):
    try:
        return p.wait(timeout=120)
    except subprocess.TimeoutExpired:
        p.kill()
        return p.wait()


def committed(ck):
    return os.path.exists(os.path.join(ck, "latest"))


def main():
    d = tempfile.mkdtemp(prefix="ms_sig_")
    train = os.path.join(d, "train.bin")
    write_shard(train, text_tokens(20000))

    # the log's reader goes away: EPIPE is a stop request
    p, ck, w = start(d, "pipe", train)
    p.stderr.close()
    rc = finish(p)
    ok(rc == 0, "the log's reader gone: the run stops cleanly (no SIGPIPE)", f"rc {rc}")
    ok(committed(ck) and os.path.exists(w), "...with a final checkpoint and its weights",
       str(os.listdir(d)))

    # SIGHUP (a closed terminal or ssh session) is a stop request too
    p, ck, w = start(d, "hup", train)
    p.send_signal(signal.SIGHUP)
    err = p.stderr.read().decode(errors="replace")
    rc = finish(p)
    ok(rc == 0 and "interrupted" in err, "SIGHUP: the run stops cleanly", f"rc {rc}\n{err[-2000:]}")
    ok(committed(ck) and os.path.exists(w), "SIGHUP: a final checkpoint and the weights",
       str(os.listdir(d)))

    # a pipeline in a shell, as a person types it, interrupted by Ctrl-C
    # (SIGINT to the whole process group: tee dies too)
    ck, w = os.path.join(d, "tee_ck"), os.path.join(d, "tee.safetensors")
    log = os.path.join(d, "tee.log")
    cmd = (f"'{BIN}' train --train-data '{train}' {' '.join(TINY)} --steps 100000 --log-every 1 "
           f"--ckpt-dir '{ck}' --ckpt-every 1000 --save-weights '{w}' --trace-dir none 2>&1 "
           f"| tee '{log}' > /dev/null; echo \"rc=${{PIPESTATUS[0]}}\" > '{log}.rc'")
    sh = subprocess.Popen(["bash", "-c", cmd], start_new_session=True)
    t_end = time.time() + 60
    while time.time() < t_end and not (os.path.exists(log) and "loss" in open(log).read()):
        time.sleep(0.05)
    os.killpg(sh.pid, signal.SIGINT)
    finish(sh)
    rc_line = open(log + ".rc").read().strip() if os.path.exists(log + ".rc") else "?"
    ok(rc_line == "rc=0", "Ctrl-C on `train ... | tee log`: the trainer exits 0", rc_line)
    ok(committed(ck) and os.path.exists(w), "`| tee` + Ctrl-C: a final checkpoint and the weights",
       str(os.listdir(d)))

    subprocess.run([BIN, "ckpt", "shm", os.path.join(d, "pipe_ck"), "--remove", "1", "--force",
                    "1"], capture_output=True)
    shutil.rmtree(d, ignore_errors=True)
    from test_cli import passed, failed  # noqa: E402  (the counters ok() kept)
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
