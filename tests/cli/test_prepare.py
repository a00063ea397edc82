"""`megascale data prepare` (issue 13): the validation split cuts the token
stream, never the text (before, a cut inside "\\n\\n" re-tokenised both
sides); JSONL inputs (--jsonl-field, bad lines named FILE:LINE,
--jsonl-skip-bad); several inputs, read in order or blended by tokens with
:WEIGHT, deterministically.  Needs only the Python standard library and the
shipped GPT-2 tokenizer.  Environment: MS_BIN (the binary)."""
import gzip
import json
import os
import shutil
import struct
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_cli import expect_error, ok, run  # noqa: E402

EOT = 50256


def tokens(path):
    raw = open(path, "rb").read()
    return list(struct.unpack(f"<{(len(raw) - 1024) // 2}H", raw[1024:]))


def prepare(out, *inputs, extra=()):
    """Run prepare into out (replaced); (rc, stderr, val tokens, train tokens)."""
    shutil.rmtree(out, ignore_errors=True)
    args = ["data", "prepare", "--tokenizer", "gpt2", "--out", out, "--threads", "2", *extra]
    for i in inputs:
        args += ["--input", i]
    rc, _, err = run(*args)
    names = sorted(os.listdir(out)) if rc == 0 else []
    val = [t for n in names if "_val_" in n for t in tokens(os.path.join(out, n))]
    train = [t for n in names if "_train_" in n for t in tokens(os.path.join(out, n))]
    return rc, err, val, train


def split_docs(toks):
    """Token lists of the documents (each ends with EOT, dropped here)."""
    docs, cur = [], []
    for t in toks:
        if t == EOT:
            docs.append(cur)
            cur = []
        else:
            cur.append(t)
    return docs, cur


def test_val_cut(d):
    """A single document cut at the val mark: val + train is exactly the
    document's own tokens, wherever the mark falls (inside "\\n\\n" followed
    by an indent, inside a word, on a space)."""
    text = "".join(f"   Section {i}. Permission is hereby granted, free of charge, to any person."
                   f"\n\n" for i in range(80))
    path = os.path.join(d, "license.txt")
    open(path, "w").write(text)
    rc, err, val0, ref = prepare(os.path.join(d, "ref"), path, extra=["--val-fraction", "0"])
    ok(rc == 0 and not val0 and ref and ref[-1] == EOT, "val-fraction 0: every token in train", err)
    nn = text.index("\n\n", 2000)
    word = text.index("Permission", 3000) + 4
    space = text.index(" free", 1000)
    for what, mark in (("on the first \\n of \\n\\n", nn), ("on the second \\n", nn + 1),
                       ("inside a word", word), ("on a space", space)):
        frac = (mark + 0.5) / len(text)
        rc, err, val, train = prepare(os.path.join(d, "cut"), path,
                                      extra=["--val-fraction", repr(frac)])
        ok(rc == 0 and val and val + train == ref,
           f"val cut {what} (byte {mark}): val + train are the text's own tokens",
           f"{err}\nval[-5:]={val[-5:]} train[:5]={train[:5]} ref around the cut="
           f"{ref[len(val) - 5:len(val) + 5]}")
        ok(EOT not in val and "cut between two of its tokens" in err,
           f"val cut {what}: the document's end-of-text goes to train; the summary says so", err)


def test_val_documents(d):
    """Several documents: val takes the first ones whole, about the asked
    share of the bytes."""
    docs = os.path.join(d, "docs")
    os.makedirs(docs)
    texts = [f"Doc {i}. " + "The quick brown fox jumps over the lazy dog.\n\n " * (3 + i % 11)
             for i in range(40)]
    for i, t in enumerate(texts):
        open(os.path.join(docs, f"d{i:03d}.txt"), "w").write(t)
    rc, err, _, ref = prepare(os.path.join(d, "ref"), docs, extra=["--val-fraction", "0"])
    ref_docs, rest = split_docs(ref)
    ok(rc == 0 and len(ref_docs) == 40 and not rest, "40 documents, one end-of-text each", err)
    for frac in (0.05, 0.2, 0.5):
        rc, err, val, train = prepare(os.path.join(d, "vd"), docs,
                                      extra=["--val-fraction", str(frac)])
        vdocs, vrest = split_docs(val)
        k = len(vdocs)
        mark = frac * sum(map(len, texts))
        got = sum(map(len, texts[:k]))
        ok(rc == 0 and val + train == ref and not vrest and vdocs == ref_docs[:k]
           and mark / 2 <= got <= 1.5 * mark and f"val: {k} whole document(s)" in err,
           f"--val-fraction {frac}: val is the first {k} documents, whole "
           f"({got} bytes for a mark at {mark:.0f})", err)


def write_jsonl(path, rows, raw_lines=()):
    with open(path, "w", newline="") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
        for r in raw_lines:
            f.write(r)


def test_jsonl(d):
    texts = ["Hello, world.\n", "naïve café 東京 \"quoted\"\n\ttab\\slash", "x" * 5000,
             "One more line.\n\n  indented", "last"]
    plain = os.path.join(d, "plain")
    os.makedirs(plain)
    for i, t in enumerate(texts):
        open(os.path.join(plain, f"p{i}.txt"), "w", encoding="utf-8").write(t)
    rc, err, _, ref = prepare(os.path.join(d, "pref"), plain, extra=["--val-fraction", "0"])
    ok(rc == 0, "the texts as plain files", err)
    jl = os.path.join(d, "docs.jsonl")
    with open(jl, "w", encoding="utf-8", newline="") as f:
        f.write(json.dumps({"id": 0, "text": texts[0]}) + "\n\n")  # a blank line is skipped
        f.write(json.dumps({"text": texts[1], "meta": {"text": "not this"}},
                           ensure_ascii=False) + "\r\n")
        f.write(json.dumps({"text": ""}) + "\n")  # an empty document: skipped
        f.write("  " + json.dumps({"text": texts[2]}) + "  \n")
        for t in texts[3:]:
            f.write(json.dumps({"text": t}) + "\n")
    rc, err, _, got = prepare(os.path.join(d, "jref"), jl, extra=["--val-fraction", "0"])
    ok(rc == 0 and got == ref and "prepared 5 document(s)" in err,
       "JSONL: each line's \"text\" is one document, like a file of that text", err)
    other = os.path.join(d, "content.jsonl")
    write_jsonl(other, [{"content": t, "text": 1} for t in texts])
    rc, err, _, got = prepare(os.path.join(d, "jc"), other,
                              extra=["--val-fraction", "0", "--jsonl-field", "content"])
    ok(rc == 0 and got == ref, "--jsonl-field content reads that member", err)

    good = json.dumps({"text": "fine"})
    bad = {"obj": ("[1, 2]", "an array, not a JSON object"),
           "json": ('{"text": "unterminated', "not valid JSON"),
           "trailing": ('{"text": "a"} x', "not valid JSON"),
           "missing": ('{"body": "x"}', 'no member "text"'),
           "number": ('{"text": 5}', 'member "text" is a number, not a string'),
           # a NUL ended the text there, the rest silently dropped
           "nul": ('{"text": "abc\\u0000def"}', 'member "text" holds \\u0000'),
           # a raw NUL byte: cJSON kept it, and the text ended there (no error)
           "rawnul": ('{"text": "abc\0def"}', "a NUL byte (at byte 14 of the line"),
           "string": ('"hello"', ":2: a string, not a JSON object"),
           # valid JSON past the parser's depth: said so (it read "not valid JSON"); a
           # bracket inside a string does not count
           "deep": ('{"text": "[[[", "m": ' + "[" * 1001 + "]" * 1001 + "}",
                    "arrays and objects nested more than 1000 deep (at byte 1021 of the line")}
    for name, (line, needle) in bad.items():
        p = os.path.join(d, f"bad_{name}.jsonl")
        write_jsonl(p, [good, line, good])
        out = os.path.join(d, f"o_{name}")
        expect_error(["data", "prepare", "--input", p, "--out", out], f"bad_{name}.jsonl:2:",
                     needle, what=f"JSONL {name}")
        ok(not os.path.exists(out) or not os.listdir(out), f"JSONL {name}: no shard is left")
    nul_ok = os.path.join(d, "nul_ok.jsonl")  # a NUL elsewhere, an escaped backslash: fine
    write_jsonl(nul_ok, ['{"text": "x\\\\u0000y", "meta": "\\u0000"}'])
    rc, err, _, got = prepare(os.path.join(d, "o_nul_ok"), nul_ok, extra=["--val-fraction", "0"])
    nul_txt = os.path.join(d, "nul_ok.txt")
    open(nul_txt, "w").write("x\\u0000y")  # the text itself: a backslash, u0000
    rc2, err2, _, ref2 = prepare(os.path.join(d, "o_nul_txt"), nul_txt,
                                 extra=["--val-fraction", "0"])
    ok(rc == 0 and rc2 == 0 and got == ref2,
       "JSONL: \\u0000 outside the text, or an escaped backslash before u0000, is fine",
       err + err2)
    # lone UTF-16 surrogate escapes are U+FFFD (as tiktoken encodes them; it was "not valid
    # JSON"), a pair is its character, and a member given twice is the last one's (Python's)
    lone = os.path.join(d, "lone.jsonl")
    write_jsonl(lone, ['{"text": "x\\ud800y"}', '{"text": "a\\udc00b\\ud83d\\ude00c"}',
                       '{"text": "first", "text": "second"}'])
    rc, err, _, got = prepare(os.path.join(d, "o_lone"), lone, extra=["--val-fraction", "0"])
    lone_txt = os.path.join(d, "lone_txt")
    os.makedirs(lone_txt)
    for i, t in enumerate(["x\ufffdy", "a\ufffdb\U0001F600c", "second"]):
        open(os.path.join(lone_txt, f"{i}.txt"), "w", encoding="utf-8").write(t)
    rc2, err2, _, ref3 = prepare(os.path.join(d, "o_lone_txt"),
                                 *[os.path.join(lone_txt, f"{i}.txt") for i in range(3)],
                                 extra=["--val-fraction", "0"])
    ok(rc == 0 and rc2 == 0 and got == ref3 and "lone.jsonl:1: a lone UTF-16 surrogate escape "
       "(\\ud800 at byte 12 of the line" in err and "2 JSONL lines in all held lone" in err,
       "JSONL: lone surrogates as U+FFFD, said; a key twice is the last one's", err + err2)
    # a line repaired and then skipped for another reason is no document read with U+FFFD
    lone_bad = os.path.join(d, "lone_bad.jsonl")
    write_jsonl(lone_bad, ['{"body": "x\\ud800y"}', good])
    rc, err, _, _ = prepare(os.path.join(d, "o_lone_bad"), lone_bad,
                            extra=["--val-fraction", "0", "--jsonl-skip-bad", "1"])
    ok(rc == 0 and "surrogate" not in err and 'no member "text"' in err,
       "JSONL: a repaired line skipped for another reason is not counted as read", err)
    huge = os.path.join(d, "huge.jsonl")
    with open(huge, "w") as f:
        f.write(good + "\n")
        f.write('{"text": "' + "a" * (64 << 20) + '"}\n')
        f.write(good + "\n")
    expect_error(["data", "prepare", "--input", huge, "--out", os.path.join(d, "o_huge")],
                 "huge.jsonl:2:", "more than 64 MiB", what="JSONL: a line over 64 MiB")
    mixed = os.path.join(d, "mixed.jsonl")
    write_jsonl(mixed, [good, "[1]", good, '{"body": 1}', '{"text": null}', good])
    rc, err, _, got = prepare(os.path.join(d, "skip"), mixed,
                              extra=["--val-fraction", "0", "--jsonl-skip-bad", "1"])
    ok(rc == 0 and len(split_docs(got)[0]) == 3 and "skipped 3 bad line(s)" in err
       and "mixed.jsonl:2: an array, not a JSON object" in err,
       "--jsonl-skip-bad 1: bad lines are counted and skipped, the first is named", err)
    rc, err, _, got = prepare(os.path.join(d, "skiphuge"), huge,
                              extra=["--val-fraction", "0", "--jsonl-skip-bad", "1"])
    ok(rc == 0 and len(split_docs(got)[0]) == 2 and "skipped 1 bad line(s)" in err,
       "--jsonl-skip-bad 1 skips a line over 64 MiB too", err)
    os.remove(huge)
    bom = os.path.join(d, "bom.jsonl")  # a byte-order mark alone on line 1 (a Windows editor)
    with open(bom, "wb") as f:
        f.write(b"\xef\xbb\xbf\r\n" + json.dumps({"text": texts[0]}).encode() + b"\r\n")
    rc, err, _, got = prepare(os.path.join(d, "o_bom"), bom, extra=["--val-fraction", "0"])
    ok(rc == 0 and "prepared 1 document(s)" in err, "JSONL: a byte-order mark alone on line 1",
       err)
    empty = os.path.join(d, "blank.jsonl")
    open(empty, "w").write("\n  \n")
    expect_error(["data", "prepare", "--input", empty, "--out", os.path.join(d, "o_blank")],
                 "blank.jsonl", "no documents", what="JSONL of blank lines only")
    gz = os.path.join(d, "docs.jsonl.gz")
    open(gz, "wb").write(gzip.compress(open(jl, "rb").read()))
    expect_error(["data", "prepare", "--input", gz, "--out", os.path.join(d, "o_gz")],
                 "docs.jsonl.gz", "gzip-compressed", "decompress it first",
                 what="a compressed input is refused, not tokenised as text")
    tok = os.path.join(d, "j.tok")
    rc, _, err = run("data", "tokenizer-train", "--input", jl, "--vocab-size", "280", "--out", tok)
    ok(rc == 0 and os.path.exists(tok), "tokenizer-train reads JSONL documents", err)


def test_batches(d):
    """Small documents are encoded in batches on all threads, a large one (over
    1 MiB) alone in blocks: the ids are each document's serial encoding
    (tok_encode), in order, whatever the batch."""
    enc = os.path.join(os.environ.get("MS_BUILD", ""), "tests", "tok_encode")
    if not os.path.exists(enc):
        print(f"skipped test_batches: no {enc} (MS_BUILD)")
        return
    distinct = [f"Text {k}: " + "lorem ipsum dolor sit amet, consectetur " * (1 + 7 * k % 23)
                + "\n\n  end." * (k % 3) for k in range(20)]
    distinct.append("Big. " + "The quick brown fox jumps over the lazy dog.\n" * 40000)  # 1.8 MB
    order = [k % 20 for k in range(150)] + [20] + [(7 * k) % 20 for k in range(150)] + [20, 3]
    ids = []
    for k, t in enumerate(distinct):
        src, dst = os.path.join(d, f"t{k}.txt"), os.path.join(d, f"t{k}.ids")
        open(src, "w").write(t)
        rc, _, err = run_enc(enc, src, dst)
        raw = open(dst, "rb").read() if rc == 0 else b""
        ids.append(list(struct.unpack(f"<{len(raw) // 4}I", raw)))
    want = [t for k in order for t in ids[k] + [EOT]]
    jl = os.path.join(d, "batch.jsonl")
    write_jsonl(jl, [{"text": distinct[k]} for k in order])
    for threads in ("1", "2", "0"):
        rc, err, _, got = prepare(os.path.join(d, "b"), jl,
                                  extra=["--val-fraction", "0", "--threads", threads])
        ok(rc == 0 and got == want, f"--threads {threads}: batched ids are each document's own, "
           "in order", err)
    rc, err, val, train = prepare(os.path.join(d, "bv"), jl, extra=["--val-fraction", "0.01"])
    ok(rc == 0 and val + train == want and val and not split_docs(val)[1],
       "batched: val takes whole small documents, val + train unchanged", err)
    rc, err, val, train = prepare(os.path.join(d, "bv"), jl, extra=["--val-fraction", "0.3"])
    ok(rc == 0 and val + train == want and len(split_docs(val)[0]) == 150
       and split_docs(val)[1] and "cut between two of its tokens" in err,
       "batched: the large document crossing the mark is cut in its tokens", err)


def run_enc(enc, src, dst):
    import subprocess
    p = subprocess.run([enc, src, dst], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def sources(d):
    """Three inputs of distinct documents: short ones, long ones, files."""
    a, b, c = (os.path.join(d, n) for n in ("a.jsonl", "b.jsonl", "c"))
    write_jsonl(a, [{"text": f"alpha {i} " + "ant " * (2 + i % 9)} for i in range(300)])
    write_jsonl(b, [{"text": f"beta {i} " + "bear and bison " * (4 + i % 7)} for i in range(300)])
    os.makedirs(c)
    for i in range(80):
        open(os.path.join(c, f"c{i:03d}.txt"), "w").write(f"gamma {i} " + "cat " * (5 + i % 13))
    return a, b, c


def test_blend(d):
    a, b, c = sources(d)
    refs = []
    for s in (a, b, c):
        rc, err, _, t = prepare(os.path.join(d, "r"), s, extra=["--val-fraction", "0"])
        refs.append(split_docs(t)[0])
        ok(rc == 0, f"{os.path.basename(s)} alone", err)
    # no weights: the inputs follow one another
    rc, err, _, t = prepare(os.path.join(d, "cat"), a, c, extra=["--val-fraction", "0"])
    ok(rc == 0 and split_docs(t)[0] == refs[0] + refs[2],
       "several --input without weights: their documents in order, one input after the other",
       err)
    # weights 2:1:1, by tokens
    weights = [2, 1, 1]
    ins = [f"{a}:2", f"{b}:1", f"{c}:1"]
    out1 = os.path.join(d, "blend1")
    extra = ["--val-fraction", "0.05", "--shard-tokens", "3000"]
    rc, err, val, train = prepare(out1, *ins, extra=extra)
    docs, rest = split_docs(val + train)
    where = [0, 0, 0]
    order = []  # the input of each output document, checked against each input's order
    for doc in docs:
        k = next((i for i in range(3) if where[i] < len(refs[i]) and refs[i][where[i]] == doc),
                 None)
        if k is None:
            break
        order.append(k)
        where[k] += 1
    ok(rc == 0 and not rest and len(order) == len(docs) and where == [len(r) for r in refs],
       "blend: every document of every input once, each input's documents in order", err)
    ok(not split_docs(val)[1], "blend: val holds whole documents", str(val[-5:]))
    # shares while every input lasted (up to the first one's last document)
    first_out = min(range(3), key=lambda i: max(j for j, k in enumerate(order) if k == i))
    end = max(j for j, k in enumerate(order) if k == first_out) + 1
    got = [0, 0, 0]
    for doc, k in zip(docs[:end], order[:end]):
        got[k] += len(doc) + 1
    share = [g / sum(got) for g in got]
    want = [w / sum(weights) for w in weights]
    ok(all(abs(s - w) < 0.015 for s, w in zip(share, want)),
       f"blend by tokens: shares {[round(s, 4) for s in share]} within 1.5% of {want} "
       f"over the first {end} documents", err)
    ndocs = [order[:end].count(i) for i in range(3)]
    ok(ndocs[0] > 2 * ndocs[1], "the weights count tokens, not documents "
       f"(short alpha documents outnumber the long beta ones: {ndocs})")
    ok("weight 2 asks 50.0%, got " in err and "weight 1 asks 25.0%, got 2" in err
       and "ran out and the others went on without it" in err,
       "the summary gives each input's share asked and achieved", err)
    # determinism: byte-equal shards
    out2 = os.path.join(d, "blend2")
    shutil.copytree(out1, os.path.join(d, "blend1_keep"))
    rc, err, _, _ = prepare(out2, *ins, extra=extra)
    k1 = os.path.join(d, "blend1_keep")
    n1, n2 = sorted(os.listdir(k1)), sorted(os.listdir(out2)) if rc == 0 else []
    ok(rc == 0 and n1 == n2 and len(n1) > 2 and all(
        open(os.path.join(k1, n), "rb").read() == open(os.path.join(out2, n), "rb").read()
        for n in n1), "blend: the same inputs give byte-identical shards", err + str(n1 + n2))
    # a config file gives the same list; the command line replaces it
    cfg = os.path.join(d, "blend.cfg")
    open(cfg, "w").write("".join(f"input = {i}\n" for i in ins))
    rc, err, v3, t3 = prepare(os.path.join(d, "bcfg"), extra=["--config", cfg, *extra])
    ok(rc == 0 and v3 + t3 == val + train, "input = ... lines in --config: the same blend", err)
    rc, err, _, t4 = prepare(os.path.join(d, "bcfg2"), a,
                             extra=["--config", cfg, "--val-fraction", "0"])
    ok(rc == 0 and split_docs(t4)[0] == refs[0],
       "--input on the command line replaces the config file's list", err)
    # bad weights
    expect_error(["data", "prepare", "--input", f"{a}:3", "--input", b, "--out",
                  os.path.join(d, "bw")], "every --input", ":WEIGHT",
                 what="weights on some inputs only")
    # an empty input in a blend: its share is of nothing (it was taken, and the blend's
    # statistics said every input lasted for one document)
    empty_txt = os.path.join(d, "empty_input.txt")
    open(empty_txt, "w").close()
    expect_error(["data", "prepare", "--input", f"{a}:1", "--input", f"{empty_txt}:1", "--out",
                  os.path.join(d, "bw")], "empty_input.txt:1: no document to blend",
                 what="an empty input in a blend")
    ok(not os.path.exists(os.path.join(d, "bw")), "... and no --out left behind")
    for w in ("0", "-1", "inf", "1e-320"):  # a denormal was taken (as 9.99989e-321)
        expect_error(["data", "prepare", "--input", f"{a}:{w}", "--out", os.path.join(d, "bw")],
                     f"{a}:{w}", "weight", what=f"weight {w}")
    expect_error(["data", "tokenizer-train", "--input", f"{a}:2", "--out",
                  os.path.join(d, "t.tok")], "without weights", what="tokenizer-train weights")
    # a shard of no tokens: said so (it said "largest token id 0")
    empty = os.path.join(d, "empty_shard.bin")
    with open(empty, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, 0, *([0] * 253)))
    rc, out, err = run("data", "inspect", empty)
    ok(rc == 0 and "0 tokens" in out and "no tokens" in out and "largest token id" not in out,
       "data inspect of a shard of no tokens", out + err)


def test_failed_run(d):
    """A run that fails after some of its shards were done changes nothing
    in --out: with --force the old data set stays whole (before, its first
    shards were replaced by the new run's and the rest kept: a glob read a
    mix of two data sets), without it no partial data set is left."""
    old_txt, new_txt, bad = (os.path.join(d, n) for n in ("old.txt", "new.txt", "bad.jsonl"))
    open(old_txt, "w").write("old text. " * 3000)
    open(new_txt, "w").write("new text! " * 1000)
    open(bad, "w").write("{not json\n")
    out = os.path.join(d, "out")
    args = ["data", "prepare", "--tokenizer", "bytes", "--out", out, "--shard-tokens", "5000",
            "--val-fraction", "0.1"]
    rc, _, err = run(*args, "--input", old_txt)
    snap = lambda: {n: open(os.path.join(out, n), "rb").read()  # noqa: E731
                    for n in sorted(os.listdir(out))}
    before = snap() if rc == 0 else {}
    ok(rc == 0 and len(before) == 7, "the old data set: 6 train shards and val", err)
    # new.txt's shards are done before bad.jsonl (read second) fails
    rc, _, err = run(*args, "--input", new_txt, "--input", bad, "--force", "1")
    ok(rc != 0 and "bad.jsonl:1" in err and snap() == before,
       "a failed prepare --force leaves the old shards as they were, nothing else", err +
       str(sorted(snap())))
    fresh = os.path.join(d, "fresh")
    rc, _, err = run(*args[:5], fresh, *args[6:], "--input", new_txt, "--input", bad)
    left = os.listdir(fresh) if os.path.isdir(fresh) else []
    ok(rc != 0 and "bad.jsonl:1" in err and left == [],
       "a failed prepare into a new --out leaves no shard", err + str(left))
    ok(not os.path.exists(fresh), "... and no directory: --out is as it was (absent)")
    # an earlier run's shards in the input directory: refused, not read as text
    corp = os.path.join(d, "corp")
    os.makedirs(corp)
    open(os.path.join(corp, "a.txt"), "w").write("hello hello world. " * 50)
    rc, _, err = run("data", "prepare", "--tokenizer", "bytes", "--input", corp, "--out", corp,
                     "--val-fraction", "0")
    ok(rc == 0, "shards written into the input directory", err)
    expect_error(["data", "prepare", "--tokenizer", "bytes", "--input", corp, "--out", corp,
                  "--name", "v2", "--val-fraction", "0"], "data_train_000000.bin",
                 "a token shard (magic 20240520), not text",
                 what="prepare: a token shard among the inputs")
    ok(not [n for n in os.listdir(corp) if n.startswith("v2_")], "... and no v2 shard written")
    # whole documents to val: a few large ones can leave no training tokens
    two = os.path.join(d, "two")
    os.makedirs(two)
    open(os.path.join(two, "a.txt"), "w").write("x" * 900)
    open(os.path.join(two, "b.txt"), "w").write("y" * 100)
    out_two = os.path.join(d, "out_two")
    expect_error(["data", "prepare", "--tokenizer", "bytes", "--input", two, "--out", out_two,
                  "--val-fraction", "0.95"], "no training tokens", "--val-fraction 0.95",
                 what="prepare: every document in the validation split")
    ok(not os.path.exists(out_two), "... and no --out made")
    rc, _, err = run(*args, "--input", new_txt, "--force", "1")
    now = snap() if rc == 0 else {}
    ok(rc == 0 and sorted(now) == ["data_train_000000.bin", "data_train_000001.bin",
                                   "data_val_000000.bin"]
       and all(b"o\0l\0d" not in v for v in now.values()),
       "then a good --force run replaces the data set", err + str(sorted(now)))
    # a shard's header counts its tokens in an int32: more per shard was
    # accepted, and failed only once a shard had 2^31 tokens (hours later)
    big = os.path.join(d, "big")
    expect_error(["data", "prepare", "--tokenizer", "bytes", "--input", new_txt, "--out", big,
                  "--shard-tokens", "2147483648"],
                 "--shard-tokens must be in [1,2147483647], got '2147483648'",
                 what="prepare: --shard-tokens beyond a shard's int32 count")
    ok(not os.path.exists(big), "... refused before --out is made")


def test_out_dir(d):
    """What a prepare leaves in --out: the staged files a killed run left
    are removed by the next (the docs said so; they stayed for ever); one run
    at a time writes a NAME's shards in a directory (a second is refused
    while the first holds DIR/.NAME.prepare.lock); a failed run removes
    every directory it made for --out, not only the last; a glob --input
    leaves out the directories it matches, as --input DIR does."""
    import fcntl
    txt = os.path.join(d, "a.txt")
    open(txt, "w").write("some text. " * 400)
    out = os.path.join(d, "out")
    os.makedirs(out)
    left = [".data_train_000001.bin.staged", ".data_train_000002.bin.staged",
            ".data_val_000000.bin.staged", ".data_train_000003.bin.staged.tmp.12345"]
    keep = [".other_train_000001.bin.staged", ".data_train_x.bin.staged", "notes.txt"]
    for n in left + keep:
        open(os.path.join(out, n), "w").write("x")
    args = ["data", "prepare", "--tokenizer", "bytes", "--val-fraction", "0.1"]
    rc, _, err = run(*args, "--input", txt, "--out", out)
    names = sorted(os.listdir(out))
    ok(rc == 0 and names == sorted(keep + ["data_train_000000.bin", "data_val_000000.bin"])
       and "removed 4 staged file(s) of data that a killed run left" in err,
       "prepare removes the staged files of NAME a killed run left, nothing else", err + str(names))
    # a run that holds the lock: the second is refused, --out untouched
    busy = os.path.join(d, "busy")
    os.makedirs(busy)
    fd = os.open(os.path.join(busy, ".data.prepare.lock"), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        expect_error([*args, "--input", txt, "--out", busy],
                     "another `megascale data prepare` is writing shards named data_* in",
                     ".data.prepare.lock", what="prepare: a second run into the same --out")
        ok(os.listdir(busy) == [".data.prepare.lock"], "... and writes nothing")
        rc, _, err = run(*args, "--input", txt, "--out", busy, "--name", "other")
        ok(rc == 0 and "other_train_000000.bin" in os.listdir(busy),
           "... while another --name in that directory runs", err)
    finally:
        os.close(fd)
    rc, _, err = run(*args, "--input", txt, "--out", busy)
    ok(rc == 0 and ".data.prepare.lock" not in os.listdir(busy),
       "once it is free, a run takes it and removes the lock file at the end", err)
    # a failed run into a new deep --out: no directory of it is left
    bad = os.path.join(d, "bad.jsonl")
    open(bad, "w").write('{"text": "a"}\n{bad\n')
    deep = os.path.join(d, "new", "sub", "deep")
    expect_error([*args, "--input", txt, "--input", bad, "--out", deep], "bad.jsonl:2",
                 what="prepare: a bad JSONL line")
    ok(not os.path.exists(os.path.join(d, "new")), "... leaves none of the directories it made")
    # a glob's directories are left out; one that matches only directories is named
    corp = os.path.join(d, "corp")
    os.makedirs(os.path.join(corp, "sub"))
    shutil.copy(txt, os.path.join(corp, "a.txt"))
    rc, _, err = run(*args, "--input", os.path.join(corp, "*"), "--out", os.path.join(d, "g"))
    ok(rc == 0, "a glob --input that matches a subdirectory: its files read, the directory not",
       err)
    dirs = os.path.join(d, "dirs")
    os.makedirs(os.path.join(dirs, "x"))
    expect_error([*args, "--input", os.path.join(dirs, "*"), "--out", os.path.join(d, "g2")],
                 f"--input: {dirs}/*: matches only directories", what="prepare: a glob of directories")
    # empty inputs: every one named, with the totals
    e1, e2, blank = (os.path.join(d, n) for n in ("e1.txt", "e2.txt", "blank.jsonl"))
    open(e1, "w").close()
    open(e2, "w").close()
    open(blank, "w").write("\n\n")
    expect_error([*args, "--input", e1, "--input", e2, "--out", os.path.join(d, "g3")],
                 f"all 2 inputs ({e1}, {e2}; 2 files): input is empty (0 bytes)",
                 what="prepare: two empty inputs")
    expect_error([*args, "--input", e1, "--input", blank, "--out", os.path.join(d, "g3")],
                 f"all 2 inputs ({e1}, {blank}; 2 files): no documents in the input (2 bytes)",
                 what="prepare: an empty file and a JSONL of blank lines")
    expect_error([*args, "--input", e1, "--out", os.path.join(d, "g3")],
                 f"{e1}: input is empty (0 bytes)", what="prepare: one empty input")
    ok(not os.path.exists(os.path.join(d, "g3")), "... and no --out made")


def test_val_rotates(d):
    """The validation split is cut into shards of --shard-tokens as the
    training tokens are (it was one shard, whatever its size: past a header's
    int32 count, 2^31 tokens, the run failed hours in); a --force run with
    fewer val shards removes the old ones it did not rewrite."""
    docs = os.path.join(d, "docs")
    os.makedirs(docs)
    for i in range(30):
        open(os.path.join(docs, f"d{i:02d}.txt"), "w").write(f"doc {i}: " + "abcdefghij " * 90)
    out = os.path.join(d, "out")
    base = ["data", "prepare", "--tokenizer", "bytes", "--input", docs, "--out", out,
            "--shard-tokens", "4000"]
    rc, _, err = run(*base, "--val-fraction", "0")
    ref = [t for n in sorted(os.listdir(out)) for t in tokens(os.path.join(out, n))] \
        if rc == 0 else []
    rc, _, err = run(*base, "--val-fraction", "0.5", "--force", "1")
    names = sorted(os.listdir(out)) if rc == 0 else []
    vals = [n for n in names if "_val_" in n]
    sizes = [len(tokens(os.path.join(out, n))) for n in vals]
    val = [t for n in vals for t in tokens(os.path.join(out, n))]
    train = [t for n in names if "_train_" in n for t in tokens(os.path.join(out, n))]
    ok(rc == 0 and vals == [f"data_val_{k:06d}.bin" for k in range(len(vals))]
       and len(vals) >= 3 and all(s == 4000 for s in sizes[:-1]) and 0 < sizes[-1] <= 4000,
       f"--val-fraction 0.5 of ~30k tokens, --shard-tokens 4000: {len(vals)} val shards",
       err + str(list(zip(vals, sizes))))
    ok(val + train == ref, "val shards + train shards are the data set's tokens, in order", err)
    ok(f"in {len(names)} shard(s)" in err, "the summary counts every shard", err)
    ok("note: --tokenizer bytes has no end-of-text id: the 30 documents follow each other"
       in err, "bytes: the missing document boundary is said", err)
    # the validation pass reads them all (file order, shard by shard): 232 windows of 65
    rc, _, err = run("train", "--train-data", os.path.join(out, "data_train_*.bin"),
                     "--val-data", os.path.join(out, "data_val_*.bin"), "--vocab", "256",
                     "--layers", "1", "--dim", "32", "--heads", "2", "--seq-max", "64", "--seq",
                     "64", "--batch", "4", "--steps", "1", "--val-batches", "58",
                     "--trace-dir", "none", "--threads", "2")
    ok(rc == 0 and "val loss" in err, "train --val-data over the rotated val shards", err)
    rc, _, err = run(*base, "--val-fraction", "0.2", "--force", "1")
    now = sorted(n for n in os.listdir(out) if "_val_" in n)
    ok(rc == 0 and 1 <= len(now) < len(vals) and
       now == [f"data_val_{k:06d}.bin" for k in range(len(now))],
       "a --force run with fewer val shards leaves none of the old ones", err + str(now))


def test_file_twice(d):
    """Inputs that name one file twice (a file and its directory, the same file, a glob that
    matches it, a link to it in the same directory) are refused before anything is written:
    its documents were read twice, and with --val-fraction were in both val and train."""
    src = os.path.join(d, "src")
    os.makedirs(src)
    for i in range(3):
        with open(os.path.join(src, f"{i}.txt"), "w") as f:
            f.write(f"document {i} " * 50)
    os.symlink(os.path.join(src, "0.txt"), os.path.join(src, "0-link.txt"))
    a = os.path.join(src, "0.txt")
    for inputs, want in (((a, src), f"--input {a} and --input {src} both read"),
                         ((a, a), f"--input {a} and --input {a} both read"),
                         ((a, os.path.join(src, "*.txt")), "both read"),
                         ((src,), f"--input {src} reads one file twice")):
        out = os.path.join(d, "out")
        rc, err, _, _ = prepare(out, *inputs, extra=("--val-fraction", "0.3"))
        ok(rc == 2 and want in err and "read twice" in err and not os.path.exists(out),
           f"one file named twice {inputs}: refused, nothing written", f"rc={rc}\n{err}")
    os.remove(os.path.join(src, "0-link.txt"))
    rc, err, val, train = prepare(os.path.join(d, "out"), src, extra=("--val-fraction", "0.3"))
    ok(rc == 0 and val and train, "each file once: prepared", err)


def test_interrupted(d):
    """A SIGTERM (Ctrl-C's SIGINT the same) while data prepare writes: its staged shards, its
    lock and the directories it made for --out are removed before it ends (exit 143, the
    signal's).  Before, all three were left under --out."""
    import signal
    import subprocess
    import time
    from test_cli import BIN
    src = os.path.join(os.environ.get("MS_SRC", "."), "data", "kjv.txt.gz")
    text = gzip.decompress(open(src, "rb").read())
    big = os.path.join(d, "big.txt")
    with open(big, "wb") as f:
        for _ in range(8):  # 35 MB: seconds of BPE on any machine
            f.write(text)
    out = os.path.join(d, "made", "out")
    p = subprocess.Popen([BIN, "data", "prepare", "--input", big, "--tokenizer", "gpt2", "--out",
                          out, "--name", "b", "--shard-tokens", "200000"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0, seen = time.time(), False
    while p.poll() is None and time.time() - t0 < 120:
        if os.path.isdir(out) and any(n.endswith(".staged") for n in os.listdir(out)):
            seen = True
            p.send_signal(signal.SIGTERM)
            break
        time.sleep(0.005)
    rc = p.wait(timeout=120)
    if not seen:
        print(f"SKIP: data prepare interrupted: it ended (rc {rc}) before a shard was staged")
        return
    ok(rc == -signal.SIGTERM and not os.path.exists(os.path.join(d, "made")),
       "data prepare ended by SIGTERM: its staged shards, lock and made directories removed",
       f"rc {rc}; left: {os.listdir(d)}")


def main():
    d = tempfile.mkdtemp(prefix="ms_prep_")
    for t in (test_val_cut, test_val_documents, test_jsonl, test_batches, test_blend,
              test_failed_run, test_out_dir, test_val_rotates, test_file_twice,
              test_interrupted):
        sub = os.path.join(d, t.__name__)
        os.makedirs(sub)
        t(sub)
    shutil.rmtree(d, ignore_errors=True)
    from test_cli import passed, failed  # noqa: E402  (the counters ok() kept)
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
