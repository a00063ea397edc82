"""`megascale plan` end to end: the JSON object and its parts, the text
breakdown, --search, `plan measure` (with --mpi: under mpirun), every shipped cluster file, and bad
input (each error names the option or the file and key, with the exit code
of its class: 2 usage, 3 bad input).  Environment: MS_BIN."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

BIN = os.environ["MS_BIN"]
counts = {"passed": 0, "failed": 0}
M175 = ["--model", "megascale-175b", "--tp", "8", "--pp", "8", "--vpp", "6"]


def ok(cond, what, detail=""):
    counts["passed" if cond else "failed"] += 1
    if not cond:
        print(f"FAIL: {what}\n{detail[-3000:]}")


def plan(*args):
    return subprocess.run([BIN, "plan", *args], capture_output=True, text=True, timeout=120)


def plan_within(seconds, *args):
    """plan(*args) and whether it ended within `seconds` (None when it ran past 60 s)."""
    t0 = time.monotonic()
    try:
        r = subprocess.run([BIN, "plan", *args], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return None, False
    return r, time.monotonic() - t0 <= seconds


def test_mpi():
    """`plan measure --base` under mpirun (its own test, labelled mpi: Open MPI keeps
    allocations LeakSanitizer reports)."""
    mpirun = shutil.which("mpirun")
    if not mpirun:
        print("SKIP: plan measure under mpirun (no mpirun)")
        return 77
    d = tempfile.mkdtemp(prefix="ms_plan_mpi_")
    one = os.path.join(d, "one.json")
    r = subprocess.run([BIN, "plan", "measure", "--out", one, "--storage-dir", d],
                       capture_output=True, text=True, timeout=120)
    ok(r.returncode == 0, "plan measure in one process", r.stderr)
    # the links of 2 ranks, and how much of a transfer compute hides
    two = os.path.join(d, "two.json")
    r = subprocess.run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", BIN,
                        "plan", "measure", "--base", one, "--out", two],
                       capture_output=True, text=True, timeout=300)
    c2 = json.load(open(two)) if r.returncode == 0 and os.path.exists(two) else {}
    ok(c2.get("gpus_per_node") == 2 and 0 <= c2.get("overlap_exposed", -1) <= 1
       and c2["links"]["intra"]["lat_us"] > 0 and c2.get("cores", 0) > 0,
       "plan measure under mpirun: 2 ranks, links, shared cores, overlap_exposed in [0, 1]",
       r.stderr + json.dumps(c2))
    r = plan("--cluster", two, "--gpus", "2", "--tp", "2", "--batch", "8", "--model", "d6",
             "--seq", "64", "--features", "ours", "--json")
    ok(r.returncode == 0 and json.loads(r.stdout)["parts"]["tp"] > 0 and
       "not measured" not in r.stderr, "a cluster file measured under mpirun plans tp2",
       r.stderr)
    # the one-process file's links are placeholders: a plan of 2 ranks says so, of 1 does not
    r = plan("--cluster", one, "--gpus", "2", "--batch", "8", "--model", "d6", "--seq", "64",
             "--json")
    ok(r.returncode == 0 and "its links were not measured" in r.stderr and
       f"plan measure --base {one}" in r.stderr,
       "a plan of 2 ranks on a cluster file whose links were not measured: a warning", r.stderr)
    r = plan("--cluster", one, "--gpus", "1", "--batch", "8", "--model", "d6", "--seq", "64",
             "--json")
    ok(r.returncode == 0 and "not measured" not in r.stderr,
       "... and none for one rank (no link used)", r.stderr)
    shutil.rmtree(d, ignore_errors=True)
    print(f"{counts['passed']} passed, {counts['failed']} failed")
    return 1 if counts["failed"] else 0


def main():
    r = plan("--help")
    ok(r.returncode == 0 and "--cluster" in r.stdout and "--search" in r.stdout, "--help", r.stdout)

    r = plan("--cluster", "a100-megascale", "--gpus", "256", "--batch", "768", *M175, "--json")
    ok(r.returncode == 0, "json run", r.stderr)
    d = json.loads(r.stdout)
    for k in ("mfu", "iter_s", "tokens_per_s", "memory_gb_per_gpu", "parts", "scale"):
        ok(k in d, f"json has {k}", r.stdout)
    parts = d["parts"]
    for k in ("compute", "tp", "pp", "dp", "bubble", "optimizer", "data"):
        ok(k in parts and parts[k] >= 0, f"parts has {k}", r.stdout)
    ok(0 < d["mfu"] < 1, "mfu is a fraction", r.stdout)
    ok(abs(sum(parts.values()) - d["iter_s"]) < 1e-6 * d["iter_s"], "the parts add up to iter_s",
       r.stdout)
    ok(abs(d["tokens_per_s"] - 768 * 2048 / d["iter_s"]) < 1e-6 * d["tokens_per_s"],
       "tokens_per_s = batch x seq / iter_s", r.stdout)
    ok(abs(d["mfu"] - 0.653) < 0.05, "MegaScale 175B on 256 GPUs: MFU near the paper's 65.3%",
       r.stdout)
    ok(0 < d["mfu_window"] < d["mfu"], "with a window, the window's MFU is the smaller", r.stdout)
    r = plan("--cluster", "a100-megascale", "--gpus", "256", "--batch", "64", *M175, "--seq",
             "131072")
    m = re.search(r"MFU ([\d.]+)%.*\n.*causal, the window's only\): ([\d.]+)%", r.stdout)
    ok(r.returncode == 0 and m and float(m.group(2)) <= 100 < float(m.group(1))
       and "passes 100%" in r.stdout,
       "a window much shorter than seq: the formula's MFU passes 100% and says so; the "
       "window's does not", r.stdout)
    # full attention, no window, a long sequence on a narrow model: the attention term is most
    # of the formula, and causal attention computes half of it (before, 110% with no word)
    r = plan("--cluster", "dev-cpu", "--layers", "2", "--dim", "512", "--heads", "2", "--vocab",
             "256", "--seq", "16384", "--gpus", "1", "--batch", "1", "--features", "ours",
             "--probe", "0")
    m = re.search(r"MFU ([\d.]+)%.*\n.*causal, half of it\): ([\d.]+)%", r.stdout)
    ok(r.returncode == 0 and m and float(m.group(2)) <= 100 and
       float(m.group(2)) < 0.75 * float(m.group(1)),
       "a long sequence without a window: the computed attention's MFU is said, within 100%",
       r.stdout + r.stderr)
    sc = d["scale"]
    ok([x["ranks"] for x in sc["init"]] == [1024, 2048, 4096, 8192, 16384], "init at 1k..16k",
       r.stdout)
    ok(all(x["barrier_s"] > 10 * x["ours_s"] for x in sc["init"]), "ours beats a barrier per "
       "group", r.stdout)
    ok(sc["ckpt_every"] >= 1 and 0 < sc["ettr"] <= 1, "a --ckpt-every and its ETTR", r.stdout)

    meg = plan("--cluster", "a100-megascale", "--gpus", "256", "--batch", "768", *M175, "--json",
               "--features", "megatron")
    ok(meg.returncode == 0 and json.loads(meg.stdout)["mfu"] < d["mfu"],
       "megatron's features are slower than megascale's", meg.stderr)

    r = plan("--cluster", "a100-megascale", "--gpus", "256", "--batch", "768", *M175)
    for s in ("MFU", "pipeline bubble", "data-parallel comm", "group initialisation",
              "Young/Daly", "choose --ckpt-every"):
        ok(s in r.stdout, f"text output has '{s}'", r.stdout)

    r = plan("--cluster", "a100-megascale", "--gpus", "256", "--batch", "768", "--model",
             "megascale-175b", "--search", "--json", "--top", "5")
    ok(r.returncode == 0, "search runs", r.stderr)
    s = json.loads(r.stdout)
    its = [x["iter_s"] for x in s["layouts"]]
    ok(0 < len(its) <= 5 and its == sorted(its), "search: ranked by iteration time", r.stdout)
    ok(all(x["fits"] for x in s["layouts"]), "search: only layouts that fit", r.stdout)
    ok(s["tried"] > len(its), "search: tried more than it shows", r.stdout)
    # the count of layouts that fit is all of them, not the --top cut (it said "2 fit" of 76)
    few = plan("--cluster", "h100-node", "--model", "d12", "--gpus", "8", "--batch", "64",
               "--search", "--top", "2")
    every = plan("--cluster", "h100-node", "--model", "d12", "--gpus", "8", "--batch", "64",
                 "--search", "--top", "1000", "--json")
    ej = json.loads(every.stdout) if every.returncode == 0 else {}
    m2 = re.search(r"; (\d+) fit in 80 GB, the best 2:", few.stdout)
    ok(m2 and ej and int(m2.group(1)) == ej["fit"] == len(ej["layouts"]) > 2,
       "search: 'N fit' counts every layout that fits (text and --json), not --top",
       few.stdout[:300] + every.stdout[:200])
    # --recompute full keeps each block's input once: never more memory than none (one layer:
    # the rebuilt block's input was counted twice, 9.15 GB against none's 8.88)
    one = ["--cluster", "h100-node", "--layers", "1", "--dim", "4096", "--heads", "32", "--vocab",
           "256", "--seq", "4096", "--gpus", "1", "--batch", "8", "--micro-batch", "8", "--json"]
    rn, rf = plan(*one, "--recompute", "none"), plan(*one, "--recompute", "full")
    an = json.loads(rn.stdout)["memory"]["activations_gb"] if rn.returncode == 0 else 0
    af = json.loads(rf.stdout)["memory"]["activations_gb"] if rf.returncode == 0 else 1e9
    ok(0 < af <= an, f"--recompute full of one layer: no more activations than none ({af} vs "
       f"{an} GB)", rn.stderr + rf.stderr)
    # the trainer's ZeRO all-gathers its fp32 master weights (parallel/zero.c): with `ours` the
    # step counts 4 bytes a weight gathered, Megatron-LM's 16-bit gathers 2 (act_bytes), and
    # both outputs show it (it was counted at 2 bytes for ours)
    d24 = ["--cluster", "h100-node", "--model", "d24", "--gpus", "16", "--batch", "256",
           "--micro-batch", "4"]
    ro = plan(*d24, "--features", "ours", "--json")
    r16 = plan(*d24, "--features", "tp-overlap,pp-overlap,dp-overlap,fused,data", "--json")
    jo = json.loads(ro.stdout) if ro.returncode == 0 else {}
    j16 = json.loads(r16.stdout) if r16.returncode == 0 else {}
    go, g16 = jo.get("dp_allgather", {}), j16.get("dp_allgather", {})
    ok(go.get("elem_bytes") == 4 and g16.get("elem_bytes") == 2
       and abs(go["gb"] - 2 * g16["gb"]) < 1e-9 and go["comm_s"] > g16["comm_s"]
       and 0 < go["exposed_s"] <= go["comm_s"] and go["convert_s"] > 0 == g16["convert_s"]
       and jo["parts"]["dp"] >= go["exposed_s"] + go["convert_s"]
       and jo["iter_s"] > j16["iter_s"]
       and abs(sum(jo["parts"].values()) - jo["iter_s"]) < 1e-6 * jo["iter_s"],
       "ours: the fp32 ZeRO all-gather, twice the 16-bit bytes, in parts.dp and the step",
       ro.stdout + r16.stdout + ro.stderr)
    t = plan(*d24, "--features", "ours")
    ok(re.search(r"weights' gather, fp32 +[\d.]+ s .*exposed of [\d.]+ s, [\d.]+ GB", t.stdout)
       and "their 16-bit copy" in t.stdout, "ours: the text shows the fp32 gather", t.stdout)
    # every --recompute mode of the trainer (--recompute none, gelu, ln, gelu,ln): less
    # activation memory, more compute; ln refused with tp > 1, as the trainer refuses it
    one_gpu = ["--cluster", "h100-node", "--model", "d12", "--gpus", "1", "--batch", "8",
               "--micro-batch", "8", "--features", "ours", "--json"]
    got = {}
    for mode in ("none", "gelu", "ln", "gelu,ln", "ln,gelu"):
        r = plan(*one_gpu, "--recompute", mode)
        ok(r.returncode == 0, f"--recompute {mode} is accepted", r.stderr)
        got[mode] = json.loads(r.stdout) if r.returncode == 0 else None
    if all(got.values()):
        act = {k: v["memory"]["activations_gb"] for k, v in got.items()}
        comp = {k: v["parts"]["compute"] for k, v in got.items()}
        ok(act["gelu,ln"] < act["gelu"] < act["none"] and act["gelu,ln"] < act["ln"] < act["none"]
           and comp["gelu,ln"] > comp["gelu"] > comp["none"] and comp["ln"] > comp["none"]
           and act["ln,gelu"] == act["gelu,ln"],
           "--recompute gelu / ln / gelu,ln: less activation memory, more compute",
           json.dumps({"act": act, "compute": comp}))
    r = plan("--cluster", "h100-node", "--model", "d12", "--gpus", "2", "--batch", "8", "--tp", "2",
             "--recompute", "ln")
    ok(r.returncode == 2 and "--recompute ln is not supported with tensor parallelism" in r.stderr,
       "--recompute ln with --tp 2: refused, as the trainer does", r.stderr)
    r = plan("--cluster", "h100-node", "--model", "d12", "--gpus", "8", "--batch", "64",
             "--recompute", "ln", "--search", "--json", "--top", "1000")
    lays = json.loads(r.stdout)["layouts"] if r.returncode == 0 else []
    ok(lays and all(x["layout"]["tp"] == 1 for x in lays), "search --recompute ln: tp 1 only",
       r.stdout[-300:] + r.stderr)
    # MS_DATA_DIR as the other commands' (plan read only --data-dir)
    r = subprocess.run([BIN, "plan", "--cluster", "h100-node", "--model", "d12", "--gpus", "8",
                        "--batch", "8"], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, MS_DATA_DIR="/nonexistent_ms_dir"))
    ok(r.returncode == 2 and "--data-dir (env MS_DATA_DIR) /nonexistent_ms_dir does not exist"
       in r.stderr, "plan: MS_DATA_DIR is read", r.stderr)
    # --features ours: this trainer's pipeline gives each message of a step an MPI tag, at
    # most 32767 (1 + 2 x pp x vpp x micro-batches); the planner refuses what it refuses
    tags = ["--cluster", "h200-node", "--model", "d12", "--gpus", "8", "--pp", "4", "--seq", "64"]
    r = plan(*tags, "--vpp", "3", "--batch", "4096", "--micro-batch", "1", "--features", "ours")
    ok(r.returncode == 2 and "needs 1 + 2 x 12 x 2048 message tags, more than the 32767" in r.stderr,
       "--features ours: a pipeline past MPI's tags is refused, as the trainer does", r.stderr)
    r = plan(*tags, "--vpp", "3", "--batch", "4096", "--micro-batch", "1", "--features", "megatron")
    ok(r.returncode == 0, "--features megatron: the same layout is planned (no such limit)",
       r.stderr)
    r = plan(*tags, "--batch", "8192", "--features", "ours", "--search", "--json", "--top", "1000")
    lays = json.loads(r.stdout)["layouts"] if r.returncode == 0 else []
    n_tags = [1 + 2 * 4 * x["layout"]["vpp"] * 8192 // (x["layout"]["dp"] * x["layout"]["micro_batch"])
              for x in lays]
    ok(lays and max(n_tags) <= 32767 and
       any(x["layout"]["vpp"] == 3 and x["layout"]["micro_batch"] == 4 for x in lays),
       "search --features ours: only layouts within MPI's tags", r.stdout[-300:] + r.stderr)
    # --search with --features ours, a fixed tp and a pp > 1, the micro-batch left to the search
    # or tp x pp past --gpus: the tags are counted on whole layouts only (both died of SIGFPE)
    r = plan("--cluster", "dev-cpu", "--model", "d6", "--gpus", "4", "--batch", "8", "--search",
             "--tp", "1", "--pp", "2", "--features", "ours")
    ok(r.returncode == 0, "search --tp 1 --pp 2 --features ours, no --micro-batch: planned",
       f"rc={r.returncode} {r.stderr[-500:]}")
    r = plan("--cluster", "h100-node", "--model", "d12", "--gpus", "2", "--batch", "8", "--search",
             "--tp", "2", "--pp", "2", "--micro-batch", "1", "--features", "ours")
    ok(r.returncode == 2 and "--gpus 2 is not a multiple of tp 2 x pp 2" in r.stderr,
       "search --tp 2 --pp 2 on 2 GPUs --features ours: refused as such", f"rc={r.returncode} "
       + r.stderr[-500:])
    # a layout dimension given with --search is fixed, the others searched (it was ignored)
    r = plan("--cluster", "a100-megascale", "--gpus", "256", "--batch", "768", "--model",
             "megascale-175b", "--search", "--json", "--top", "50", "--tp", "8", "--micro-batch", "2")
    fx = json.loads(r.stdout)["layouts"] if r.returncode == 0 else []
    ok(fx and all(x["layout"]["tp"] == 8 and x["layout"]["micro_batch"] == 2 for x in fx)
       and len({x["layout"]["pp"] for x in fx}) > 1, "search --tp 8 --micro-batch 2: those fixed, pp searched",
       r.stdout + r.stderr)
    r = plan("--cluster", "a100-megascale", "--gpus", "256", "--batch", "768", "--model",
             "megascale-175b", "--search", "--tp", "5")
    ok(r.returncode == 2 and "--search --tp 5: tp must divide --heads 128" in r.stderr,
       "search --tp 5 (no divisor of the heads): the fixed --tp's own reason", r.stderr)
    # a preset in a list, an empty entry, a vocabulary of 1: each said as what it is (before:
    # "unknown feature 'ours' (megatron, megascale, ours, ...)", accepted, "needs --vocab")
    for args, want in ((["--features", "ours,fused"], "'ours' is a preset, given alone"),
                       (["--features", "fused,,lamb"], "--features fused,,lamb: an empty entry"),
                       (["--layers", "2", "--dim", "64", "--heads", "4", "--vocab", "1", "--seq",
                         "32"], "--vocab 1: a vocabulary needs at least 2 tokens")):
        r = plan("--cluster", "dev-cpu", "--gpus", "1", "--batch", "1",
                 *(["--model", "d6"] if "--layers" not in args else []), *args)
        ok(r.returncode == 2 and want in r.stderr, f"plan {' '.join(args)}: {want}", r.stderr)
    r = plan("--cluster", "a100-megascale", "--gpus", "256", "--batch", "768", "--model",
             "megascale-175b", "--search", "--pp", "1", "--vpp", "2")
    ok(r.returncode == 2 and "--vpp 2 needs --pp >= 2" in r.stderr,
       "search --pp 1 --vpp 2: its own reason (it blamed --batch)", r.stderr)
    r = plan("--cluster", "a100-megascale", "--gpus", "256", "--batch", "768", "--model",
             "megascale-175b", "--search", "--micro-batch", "7")
    ok(r.returncode == 2 and "fixed by the command line: --micro-batch 7" in r.stderr,
       "search --micro-batch 7 (no valid layout): the fixed value named", r.stderr)
    # the search picks the layout: tp 1 x pp 1 (dp 12288 > batch 6144) is not checked
    r = plan("--cluster", "a100-megascale", "--gpus", "12288", "--batch", "6144", "--model",
             "megascale-175b", "--search", "--top", "3")
    ok(r.returncode == 0 and "fit in 80 GB" in r.stdout, "search without a valid base layout",
       r.stdout + r.stderr)

    # a checkpoint interval of more steps than an int holds: clamped, never negative (and the
    # five rows clamped to the same count are one row: it printed 2147483647 five times)
    r = plan("--cluster", "h100-node", "--gpus", "1", "--batch", "1", "--model", "d12",
             "--mtbf-hours", "1e15")
    rows = [int(x) for x in re.findall(r"^\s+(-?\d+)\s+[\d.]+%", r.stdout, re.M)]
    ok(r.returncode == 0 and rows == [2**31 - 1],
       "ETTR table: huge intervals clamped, not wrapped, one row", r.stdout)
    # the ETTR table's rows and columns each once: a step longer than the interval to choose
    # rounded all five rows to 1 step, each marked Young/Daly's, and --mtbf-hours 1 printed
    # the columns 0h, 0h, 1h, 2h
    for mtbf in ("1", "100", "20000", "0.3"):
        r = plan("--cluster", "a100-megascale", "--gpus", "12288", "--batch", "6144", *M175,
                 "--mtbf-hours", mtbf)
        table = r.stdout[r.stdout.find("ETTR by"):r.stdout.find("choose --ckpt-every")]
        rows = [int(x) for x in re.findall(r"^\s+(\d+)\s+[\d.]+%", table, re.M)]
        head = re.search(r"^\s+every((?:\s+\S+h){4})\s*$", table, re.M)
        cols = head.group(1).split() if head else []
        ok(r.returncode == 0 and rows and rows == sorted(set(rows)) and table.count("<-") == 1
           and len(set(cols)) == 4 and all(float(c[:-1]) > 0 for c in cols),
           f"ETTR table at --mtbf-hours {mtbf}: distinct rows, one mark, distinct columns", table)

    # group initialisation for any tp x pp the trainer accepts: a job of whole replicas near
    # 1k-16k ranks (tp 3, or tp 2 x pp 3, printed an empty table: no power of two divides)
    # (--seq 768: the rows of a micro-batch divide among 3 tp ranks, as the trainer needs)
    for lay, q in ((["--tp", "3"], 3), (["--tp", "2", "--pp", "3"], 6), (["--tp", "4"], 4)):
        lay = [*lay, "--seq", "768"]
        r = plan("--cluster", "h100-node", "--model", "d12", "--gpus", "24", "--batch", "24",
                 *lay, "--json")
        init = json.loads(r.stdout)["scale"]["init"] if r.returncode == 0 else []
        ranks = [x["ranks"] for x in init]
        ok(len(ranks) == 5 and all(n % q == 0 and abs(n - 1024 * 2**i) <= q / 2
                                   for i, n in enumerate(ranks))
           and all(x["groups"] > 0 and x["barrier_s"] > x["ours_s"] > 0 for x in init),
           f"group initialisation with {' '.join(lay)}: 5 job sizes, multiples of {q}", r.stdout)
        t = plan("--cluster", "h100-node", "--model", "d12", "--gpus", "24", "--batch", "24", *lay)
        rows = re.findall(r"^\s+(\d+) ranks\s+\d+ groups", t.stdout, re.M)
        ok(ranks and [int(x) for x in rows] == ranks,
           f"the text table with {' '.join(lay)} has the rows", t.stdout)

    # nothing fits: the error says the smallest need and its parts; JSON carries that layout
    r = plan("--cluster", "h100-node", "--gpus", "8", "--batch", "8", "--model", "gpt3-175b",
             "--search")
    m = re.search(r"smallest need is ([\d.]+) GB \(tp (\d+), pp (\d+).*weights", r.stderr)
    ok(r.returncode == 2 and m and float(m.group(1)) > 80 and "layouts tried" not in r.stdout,
       "search, nothing fits: names the smallest need, no empty table", r.stdout + r.stderr)
    rj = plan("--cluster", "h100-node", "--gpus", "8", "--batch", "8", "--model", "gpt3-175b",
              "--search", "--json")
    sj = json.loads(rj.stdout) if rj.stdout else {}
    ok(rj.returncode == 2 and sj.get("layouts") == [] and m
       and abs(sj["smallest"]["memory_gb_per_gpu"] - float(m.group(1))) < 0.1
       and not sj["smallest"]["fits"], "search --json, nothing fits: the smallest layout",
       rj.stdout + rj.stderr)
    # long sequences: the activations are what does not fit, and the hint says so
    long_seq = ["--cluster", "h100-node", "--gpus", "1", "--batch", "8", "--layers", "24", "--dim",
                "2048", "--heads", "16", "--vocab", "50257", "--seq", "32768", "--features",
                "none", "--search"]
    r = plan(*long_seq)
    ok(r.returncode == 2 and "--recompute full" in r.stderr, "search: the recompute hint",
       r.stderr)
    r = plan(*long_seq, "--recompute", "full")
    ok(r.returncode == 0 and "fit in 80 GB" in r.stdout, "search: with full recompute it fits",
       r.stdout + r.stderr)
    # no layout is valid at all (batch 1 on 4096 GPUs): says why, not "0 tried"
    r = plan("--cluster", "h100-node", "--gpus", "4096", "--batch", "1", "--model", "gpt3-175b",
             "--search")
    ok(r.returncode == 2 and "no layout is valid" in r.stderr and "--batch 1" in r.stderr,
       "search: no valid layout names --batch", r.stdout + r.stderr)

    # a batch given in tokens: millions of micro-batches a step.  The pipeline's simulation is
    # capped (it built every stage's full schedule: 100 s and 5.8 GB for the first of these,
    # minutes and 16 GB for the second); refused at once, naming --batch, dp, --micro-batch,
    # the count and the limit, with the usage exit code
    for args, needles in [
        (["--cluster", "a100-megascale", "--model", "gpt3-175b", "--gpus", "64", "--tp", "8",
          "--pp", "8", "--batch", "3200000"],
         ["3200000 micro-batches", "--batch 3200000", "dp 1", "--micro-batch 1", "at most 65536"]),
        (["--cluster", "h100-node", "--layers", "12", "--heads", "16", "--dim", "2048", "--vocab",
          "50257", "--seq", "8", "--gpus", "1024", "--batch", "1073741824", "--tp", "8", "--pp",
          "2", "--vpp", "2"],
         ["16777216 micro-batches", "--batch 1073741824", "dp 64", "at most 131072"]),
    ]:
        r, fast = plan_within(10, *args)
        ok(r is not None and fast and r.returncode == 2 and all(n in r.stderr for n in needles),
           f"--batch {args[args.index('--batch') + 1]}: refused within 10 s, naming the batch",
           r.stderr if r else "ran past 60 s")
    # --search skips the layouts over the cap (pp 1 needs no simulation) instead of failing,
    # and says how many it left out of the ranking (it said nothing)
    r, fast = plan_within(10, "--cluster", "h100-node", "--model", "d12", "--gpus", "8",
                          "--batch", "16777216", "--search", "--json")
    s = json.loads(r.stdout) if r and r.returncode == 0 else {}
    ok(fast and s.get("layouts") and all(x["layout"]["pp"] == 1 for x in s["layouts"])
       and s.get("over_cap", 0) > 0,
       "search with a huge batch: the pipelines over the cap skipped and counted, within 10 s",
       (r.stdout[-500:] + r.stderr) if r else "ran past 60 s")
    r = plan("--cluster", "h100-node", "--model", "d12", "--gpus", "8", "--batch", "16777216",
             "--search")
    ok(r.returncode == 0 and f"{s.get('over_cap')} more valid layouts were not planned" in r.stdout
       and "524288" in r.stdout, "search text: the layouts over the cap named", r.stdout)
    # only pipelines, all over the cap: that reason, not "--batch is never a multiple"
    r = plan("--cluster", "h100-node", "--model", "d12", "--gpus", "8", "--batch", "16777216",
             "--search", "--pp", "2")
    ok(r.returncode == 2 and "no layout was planned" in r.stderr and "pairs" in r.stderr
       and "never a multiple" not in r.stderr, "search --pp 2, a huge batch: the cap's reason",
       r.stderr)
    # --search --micro-batch 2^30: one micro-batch size tried (2^30 x 2 wrapped past int to 0,
    # and the search doubled 0 for ever)
    r, fast = plan_within(10, "--cluster", "h100-node", "--layers", "2", "--dim", "64", "--heads",
                          "1", "--vocab", "100", "--seq", "8", "--gpus", "1", "--batch",
                          "1073741824", "--search", "--micro-batch", "1073741824")
    ok(r is not None and fast and r.returncode in (0, 2),
       "search --micro-batch 1073741824 ends within 10 s", r.stderr[-500:] if r else "ran past 60 s")
    # a --tp that does not divide the node (the trainer lets a tp group span two nodes) is
    # planned with --search as without (it was refused with it)
    r1 = plan("--cluster", "h100-node", "--model", "gpt3-175b", "--gpus", "768", "--batch",
              "768", "--tp", "3", "--pp", "8", "--seq", "2046", "--json")
    r2 = plan("--cluster", "h100-node", "--model", "gpt3-175b", "--gpus", "768", "--batch",
              "768", "--tp", "3", "--pp", "8", "--seq", "2046", "--search", "--json")
    j2 = json.loads(r2.stdout) if r2.stdout else {}
    # the layouts that fit, or (none fits in 80 GB) the smallest: each with tp 3 (an empty
    # list of layouts alone passed every check)
    tps = [x["layout"]["tp"] for x in j2.get("layouts", [])]
    tps += [j2["smallest"]["layout"]["tp"]] if j2.get("smallest") else []
    ok(r1.returncode == 0 and r2.returncode in (0, 2) and "--tp 3" not in r2.stderr
       and j2.get("tried", 0) > 0 and tps and all(t == 3 for t in tps),
       "--tp 3 on nodes of 8: planned, with --search as without", r1.stderr + r2.stderr)
    # --search keeps to the trainer's sequence-parallel rule (micro-batch x seq divisible by tp)
    r = plan("--cluster", "h100-node", "--model", "d12", "--seq", "1001", "--gpus", "8", "--batch",
             "8", "--search", "--top", "50", "--json")
    lays = [x["layout"] for x in json.loads(r.stdout).get("layouts", [])] if r.returncode == 0 else []
    ok(lays and all(x["micro_batch"] * 1001 % x["tp"] == 0 for x in lays),
       "search with --seq 1001: every layout's micro-batch x seq divides by its tp",
       r.stdout[-800:] + r.stderr)
    # the largest pipeline under the cap is still planned, in seconds
    r, fast = plan_within(20, "--cluster", "a100-megascale", "--model", "gpt3-175b", "--gpus",
                          "64", "--tp", "8", "--pp", "8", "--batch", "65536", "--json")
    ok(r is not None and fast and r.returncode == 0
       and json.loads(r.stdout)["layout"]["micro_batches"] == 65536,
       "65536 micro-batches on 8 stages (the cap): planned", r.stderr if r else "ran past 60 s")

    src = os.environ.get("MS_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
    for f in sorted(os.listdir(os.path.join(src, "data", "clusters"))):
        name = f[:-5]
        r = plan("--cluster", name, "--gpus", "16", "--batch", "16", "--model", "d12", "--tp",
                 "2", "--pp", "2", "--json")
        ok(r.returncode == 0 and json.loads(r.stdout)["iter_s"] > 0, f"shipped cluster {name}",
           r.stderr)

    d = tempfile.mkdtemp(prefix="ms_plan_cli_")
    one = os.path.join(d, "one.json")
    r = subprocess.run([BIN, "plan", "measure", "--out", one, "--storage-dir", d],
                       capture_output=True, text=True, timeout=120)
    c1 = json.load(open(one)) if r.returncode == 0 else {}
    ok(c1.get("format") == "megascale-cluster" and c1.get("ln_bwd_passes", 0) > 0
       and c1.get("launch_us", 0) > 0, "plan measure writes a cluster file (LayerNorm backward "
       "passes, an operator's fixed cost)", r.stderr)
    r = plan("--cluster", one, "--gpus", "1", "--batch", "8", "--model", "d6", "--seq", "64",
             "--features", "ours", "--json")
    ok(r.returncode == 0, "a measured cluster file plans", r.stderr)
    # an attention shape whose state (B x heads x T x T) outgrows the other figures' buffers
    # (it crashed before), timed in seconds, not minutes
    big = os.path.join(d, "big.json")
    r = subprocess.run([BIN, "plan", "measure", "--out", big, "--storage-dir", d, "--threads", "1",
                        "--attn-batch", "1", "--attn-seq", "2048", "--attn-dim", "64",
                        "--attn-heads", "2"], capture_output=True, text=True, timeout=120)
    ok(r.returncode == 0 and 0 < json.load(open(big))["attn_eff"] <= 1,
       "plan measure: a long attention shape", r.stderr)
    r = subprocess.run([BIN, "plan", "measure", "--out", big, "--attn-dim", "65", "--attn-heads",
                        "4"], capture_output=True, text=True, timeout=60)
    ok(r.returncode == 2 and "--attn-dim 65" in r.stderr and "--attn-heads 4" in r.stderr,
       "plan measure: --attn-dim not divisible by --attn-heads is refused", r.stderr)
    r = subprocess.run([BIN, "plan", "measure", "--base", one, "--out", one + "2"],
                       capture_output=True, text=True, timeout=120)
    ok(r.returncode == 2 and "mpirun" in r.stderr, "measure --base alone: needs mpirun",
       r.stderr)

    # bad input, each error naming what is wrong
    base = ["--gpus", "256", "--batch", "768", *M175]
    cases = [
        (["--cluster", "nonesuch", *base], 3, "nonesuch"),
        (["--gpus", "256", "--batch", "768", *M175], 2, "--cluster"),
        (["--cluster", "a100-megascale", *base, "--tp", "3"], 2, "--tp 3"),
        (["--cluster", "a100-megascale", *base, "--gpus", "100"], 2, "--gpus 100"),
        (["--cluster", "a100-megascale", *base, "--batch", "770"], 2, "--batch 770"),
        (["--cluster", "a100-megascale", *base, "--features", "warp-drive"], 2, "warp-drive"),
        (["--cluster", "a100-megascale", *base, "--model", "gpt9"], 2, "gpt9"),
        (["--cluster", "a100-megascale", *base, "--recompute", "some"], 2, "--recompute some"),
        (["--cluster", "a100-megascale", "--model", "d12", "--batch", "8"], 2, "--gpus"),
        (["--cluster", "a100-megascale", *base, "--tpp", "2"], 2, "tpp"),
        # the trainer places a tensor-parallel group on one host
        (["--cluster", "h100-node", "--model", "megascale-175b", "--gpus", "32", "--batch", "32",
          "--tp", "16", "--pp", "2"], 2, "--tp 16 is more than the 8 GPUs a node of h100-node"),
        # sequence parallelism: a micro-batch's rows divide among the tp ranks, as the trainer
        (["--cluster", "h100-node", "--model", "d12", "--seq", "1001", "--gpus", "8", "--batch",
          "8", "--tp", "4"], 2, "--tp 4: a micro-batch of 1 x --seq 1001"),
        # the whole list (a copy of 255 characters dropped what came after)
        (["--cluster", "a100-megascale", *base, "--features", "none," * 60 + "warp-drive"], 2,
         "warp-drive"),
        (["--cluster", "a100-megascale", *base, "--features", ""], 2, "--features is empty"),
        (["--cluster", "a100-megascale", *base, "--recompute", "gelu," * 20 + "bogus"], 2,
         "--recompute"),
        # 1e306 hours made the optimum interval inf, written into the JSON as `inf`
        (["--cluster", "a100-megascale", *base, "--mtbf-hours", "1e306", "--json"], 2,
         "--mtbf-hours"),
        # pp x vpp past int: 0, a division by zero (SIGFPE) before
        (["--cluster", "h100-node", "--layers", "65536", "--dim", "64", "--heads", "1", "--vocab",
          "100", "--seq", "8", "--gpus", "65536", "--batch", "65536", "--search", "--pp", "65536",
          "--vpp", "65536"], 2, "--vpp 65536"),
        # a trainer preset's position table has 1024 rows, as the trainer refuses a longer --seq
        (["--cluster", "a100-megascale", "--gpus", "8", "--batch", "8", "--model", "d12", "--seq",
          "2048"], 2, "--seq 2048 must be in 1..1024"),
        (["--cluster", "a100-megascale", "--gpus", "8", "--batch", "8", "--model", "d12", "--seq",
          "2048", "--seq-max", "1000"], 2, "--seq 2048 must be in 1..1000"),
    ]
    # --seq-max alone shortens a preset's sequence to it, rather than refusing a --seq
    # nobody gave
    r = plan("--cluster", "a100-megascale", "--gpus", "8", "--batch", "8", "--model", "d12",
             "--seq-max", "512", "--json")
    got = json.loads(r.stdout) if r.returncode == 0 else {}
    ok(got and round(got["tokens_per_s"] * got["iter_s"]) == 8 * 512,
       "--seq-max 512 without --seq plans sequences of 512", r.stdout[-500:] + r.stderr)
    bad = os.path.join(d, "bad.json")
    cfg = json.load(open(one))
    del cfg["hbm_gbps"]
    json.dump(cfg, open(bad, "w"))
    cases.append((["--cluster", bad, *base], 3, "hbm_gbps"))
    for key, value, needle in [("reserved_gb", cfg["mem_gb"], '"reserved_gb" is'),
                               ("act_bytes", 3, '"act_bytes" is 3, must be 2 (bf16) or 4'),
                               ("grad_bytes", 3, '"grad_bytes" is 3, must be 2 (bf16) or 4'),
                               ("peak_tflops", 1e-30, '"peak_tflops"')]:
        path = os.path.join(d, f"bad_{key}.json")
        json.dump({**json.load(open(one)), key: value}, open(path, "w"))
        cases.append((["--cluster", path, *base], 3, f"{path}: {needle}"))
    open(bad + "x", "w").write("{\n  not json")
    cases.append((["--cluster", bad + "x", *base], 3, "bad.jsonx:2:"))
    # text after the object, and a key given twice, are refused (cJSON took the first key and
    # ignored the rest: a line added at the end to change a figure changed nothing)
    text = open(one).read()
    open(bad + "t", "w").write(text.rstrip() + '\n{"mem_gb": 8}\n')
    cases.append((["--cluster", bad + "t", *base], 3, "text after the JSON object"))
    open(bad + "d", "w").write(text.rstrip()[:-1].rstrip() + ',\n  "mem_gb": 8\n}\n')
    cases.append((["--cluster", bad + "d", *base], 3, '"mem_gb" is given twice'))
    for args, code, needle in cases:
        r = plan(*args)
        ok(r.returncode == code and needle in r.stderr,
           f"bad input {' '.join(args[-2:])}: exit {code}, names '{needle}'",
           f"exit {r.returncode}: {r.stderr}")
    print(f"{counts['passed']} passed, {counts['failed']} failed")
    if not counts["failed"]:  # kept after a failure, to look at
        shutil.rmtree(d, ignore_errors=True)
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(test_mpi() if "--mpi" in sys.argv else main())
