"""The ranks and the layout (issue 13): ranks started with different options
fail at start-up, fast (seconds, not the communicator's timeout), naming the
option, its values and the ranks, with the usage exit code (2) - a different
--dim (which used to corrupt the heap inside Open MPI), a different --steps
(which used to hang until the timeout), an option set by the environment on
one rank; an option that may differ per rank (--threads, --log-every) does
not stop the job.  --dp left out is world / (tp x pp): mpirun -np 2 without
--dp trains as dp 2, bitwise the run with --dp 2, and a world that tp x pp
does not divide is named.  A pipeline with fewer micro-batches per step than
stages gets one warning (rank 0) with the bubble it implies.  Runs under
mpirun --oversubscribe.  Environment: MS_BIN."""
import os
import subprocess
import time

from mpi_common import BIN, finish, losses, mpi, mpmd, ok, start


def fails_fast(label, apps, *needles, env=None):
    """Run the MPMD job `apps`; check that it fails within 30 s with exit
    code 2 and that stderr holds every needle."""
    t0 = time.time()
    try:
        r = mpmd(apps, timeout=90, env=env)
        rc, err = r.returncode, r.stderr
    except subprocess.TimeoutExpired as e:
        rc, err = None, (e.stderr or b"").decode(errors="replace") + "\n(timed out after 90 s)"
    el = time.time() - t0
    ok(rc == 2 and el < 30 and all(n in err for n in needles),
       f"{label}: fails in {el:.1f} s (< 30) with exit 2, naming {needles}", f"rc={rc}\n{err}")
    return err


def main():
    d, shard = start("ms_ranks_")
    base = ["train", "--train-data", shard, "--vocab", "256", "--layers", "2", "--dim", "64",
            "--heads", "4", "--seq-max", "32", "--seq", "32", "--batch", "8", "--steps", "3",
            "--lr", "3e-3", "--log-every", "100", "--peak-flops", "1e11", "--threads", "1"]

    # --- the ranks' options must agree ---
    err = fails_fast("--dim 64 on ranks 0-1, 128 on rank 2",
                     [(2, [*base, "--dp", "3", "--batch", "6"]),
                      (1, [*base, "--dp", "3", "--batch", "6", "--dim", "128"])],
                     "the ranks' options differ", "--dim is 64 on ranks 0-1 but 128 on rank 2")
    ok(err.count("megascale train: error (all 3 ranks): ") == 1 and
       err.count("megascale train: error") == 1 and "Segmentation" not in err,
       "the mismatch is one error line of the trainer (rank 0's, for all), not a crash", err)
    fails_fast("--steps 3 on rank 0, 20 on rank 1",
               [(1, [*base, "--dp", "2"]), (1, [*base, "--dp", "2", "--steps", "20"])],
               "--steps is 3 on rank 0 but 20 on rank 1")
    fails_fast("two options differ, both named",
               [(1, [*base, "--seed", "7", "--lr", "1e-3"]), (1, [*base, "--seed", "8"])],
               "--lr is 0.001 on rank 0 but 0.003 on rank 1", "--seed is 7 on rank 0 but 8 on rank 1")
    # an option of the environment, set on rank 1 only (env VAR=... as the program)
    fails_fast("MS_NONFINITE_REDO=2 on rank 1 only",
               [(1, base), (1, ["env", "MS_NONFINITE_REDO=2", BIN, *base])],
               "--nonfinite-redo is 1 on rank 0 but 2 on rank 1")
    # --dp 2 on one rank, inferred (2) on the other: the same effective layout
    r = mpmd([(1, [*base, "--dp", "2"]), (1, base)])
    ok(r.returncode == 0, "--dp 2 on rank 0 and --dp left out (2) on rank 1 agree", r.stderr)
    # options that may differ between ranks
    r = mpmd([(1, base), (1, [*base, "--threads", "2", "--log-every", "1",
                              "--comm-timeout", "200"])])
    ok(r.returncode == 0, "--threads / --log-every / --comm-timeout may differ per rank",
       r.stderr)

    # --- --dp inferred from the world size ---
    m_inf, m_dp2 = os.path.join(d, "inf.jsonl"), os.path.join(d, "dp2.jsonl")
    r1 = mpi(2, *base, "--metrics", m_inf)
    r2 = mpi(2, *base, "--dp", "2", "--metrics", m_dp2)
    ok(r1.returncode == 0 and "layout: 2 ranks = tp 1 x pp 1 x dp 2" in r1.stderr,
       "mpirun -np 2 without --dp trains as dp 2", r1.stderr)
    a = losses(m_inf) if r1.returncode == 0 else []
    b = losses(m_dp2) if r2.returncode == 0 else []
    ok(a and a == b, "its losses equal those of --dp 2, bitwise", f"{a}\n{b}\n{r2.stderr}")
    r = mpi(3, *base, "--tp", "2")
    ok(r.returncode == 2 and "3 ranks" in r.stderr and "--tp 2" in r.stderr
       and "--pp 1" in r.stderr, "a world that --tp x --pp does not divide is named", r.stderr)

    # --- a pipeline with fewer micro-batches than stages: one warning ---
    r = mpi(2, *base, "--pp", "2", "--steps", "2")
    warn = [l for l in r.stderr.splitlines() if "fewer micro-batches" in l]
    ok(r.returncode == 0 and len(warn) == 1 and "1 micro-batch per step for 2 stages" in warn[0]
       and "50%" in warn[0] and "--micro-batch 4" in warn[0],
       "--pp 2 with 1 micro-batch per step: one warning with the bubble and the fix", r.stderr)
    r = mpi(2, *base, "--pp", "2", "--steps", "2", "--micro-batch", "4")
    ok(r.returncode == 0 and "fewer micro-batches" not in r.stderr,
       "--pp 2 with 2 micro-batches per step: no warning", r.stderr)

    finish(d)


if __name__ == "__main__":
    main()
