"""Checkpoint directories against a user's mistakes (label cli; issue 13),
on one process:
 - pruning (--ckpt-keep) never follows a step_* symbolic link: the link
   survives and the directory it points into is untouched.
Environment: MS_BIN."""
import os
import sys

from ckpt_common import Workspace, ok, run, step_dir, summary, tree, verify


def test_prune_symlink(ws):
    other = ws.path("other_run")
    r = run(ws, ws.train_args("--steps", "2", "--ckpt-dir", other))
    ok(r.returncode == 0 and verify(step_dir(other, 2)), "the other run commits step 2", r.stderr)
    before = tree(other)
    mine = ws.path("prune_run")
    os.makedirs(mine)
    os.symlink(step_dir(other, 2), step_dir(mine, 1))
    r = run(ws, ws.train_args("--steps", "6", "--ckpt-dir", mine, "--ckpt-every", "2",
                              "--ckpt-keep", "1"))
    ok(r.returncode == 0 and verify(step_dir(mine, 6)), "the pruning run commits step 6", r.stderr)
    ok(not os.path.exists(step_dir(mine, 2)) and not os.path.exists(step_dir(mine, 4)),
       "--ckpt-keep 1 still prunes the run's own older commits", str(sorted(os.listdir(mine))))
    ok(os.path.islink(step_dir(mine, 1)), "the step_* symbolic link survives pruning",
       str(sorted(os.listdir(mine))) + "\n" + r.stderr)
    ok(tree(other) == before, "the linked directory's files are untouched",
       f"{before}\n{tree(other)}")
    ok(verify(step_dir(other, 2)), "the other run's commit still verifies")


def main():
    ws = Workspace("ms_ckpt_guard_")
    try:
        test_prune_symlink(ws)
    finally:
        ws.close()
    sys.exit(summary())


if __name__ == "__main__":
    main()
