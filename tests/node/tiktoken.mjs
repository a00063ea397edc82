#!/usr/bin/env node
// tiktoken.mjs - the js-tiktoken side of the tokenizer parity test and of
// bench/tokenize.  Uses js-tiktoken's GPT-2 ranks with encode(text, [], []):
// ordinary encoding, special-token text encoded as text (our data_tok_encode).
// GPT-2's pattern is used with \s read as \p{White_Space}, as tiktoken's Rust
// regex and our encoder read it: JavaScript's \s also takes U+FEFF and lacks
// U+0085 (on text with neither, the ids are js-tiktoken's own).
//
//   node tiktoken.mjs compare IN IDS   IDS: our ids of IN (uint32 LE, from
//                                      tok_encode); exit 1 on the first
//                                      mismatch, printing both sides
//   node tiktoken.mjs encode IN OUT    write js-tiktoken's ids of IN
//   node tiktoken.mjs bench IN [REPS]  print "js_mbps X" (best of REPS) and
//                                      "tokens N"
//   node tiktoken.mjs classes IN SKIP  IN: `tok_encode --classes`; compare
//                                      them with node's \p{L}, \p{N} and
//                                      \p{White_Space}.  Exit 1 on any
//                                      difference when node's Unicode version
//                                      is the tables' one, else only on one
//                                      that a version change cannot explain;
//                                      SKIP gets the code points that differ
//                                      (hex, one a line) for stress.mjs
import { readFileSync, writeFileSync } from "node:fs";
import { Tiktoken } from "js-tiktoken/lite";
import gpt2 from "js-tiktoken/ranks/gpt2";

const [mode, inPath, arg] = process.argv.slice(2);
if (!mode || !inPath) {
  console.error(
    "usage: tiktoken.mjs compare IN IDS | encode IN OUT | bench IN [REPS] | classes IN SKIP");
  process.exit(2);
}
if (mode === "classes") process.exit(classes(inPath, arg));
const raw = readFileSync(inPath);
const text = raw.toString("utf8");
if (!Buffer.from(text, "utf8").equals(raw)) {
  console.error(`tiktoken.mjs: ${inPath}: not valid UTF-8 (js-tiktoken works on strings)`);
  process.exit(2);
}
const pat = gpt2.pat_str.replaceAll("\\s", "\\p{White_Space}").replaceAll("\\S", "\\P{White_Space}");
if (pat === gpt2.pat_str) {
  console.error("tiktoken.mjs: js-tiktoken's GPT-2 pattern has no \\s to read as White_Space");
  process.exit(2);
}
const enc = new Tiktoken({ ...gpt2, pat_str: pat });

if (mode === "bench") {
  const reps = Number(arg ?? 3);
  let best = Infinity, n = 0;
  for (let r = 0; r < reps; r++) {
    const t0 = process.hrtime.bigint();
    n = enc.encode(text, [], []).length;
    const dt = Number(process.hrtime.bigint() - t0) / 1e9;
    if (dt < best) best = dt;
  }
  console.log(`js_mbps ${(raw.length / best / 1e6).toFixed(2)}\ntokens ${n}`);
} else if (mode === "encode") {
  writeFileSync(arg, Buffer.from(Uint32Array.from(enc.encode(text, [], [])).buffer));
} else if (mode === "compare") {
  const ref = enc.encode(text, [], []);
  const b = readFileSync(arg);
  const ours = new Uint32Array(b.buffer, b.byteOffset, b.length / 4);
  // A token's bytes (js-tiktoken's textMap), shown as text when they are
  // UTF-8 on their own, else as hex.
  const bytes = (id) => Buffer.from(enc.textMap?.get(id) ?? enc.decode([id]));
  const show = (ids) => Array.from(ids, (id) => {
    const b = bytes(id), s = b.toString("utf8");
    return `${id}:${Buffer.from(s, "utf8").equals(b) ? JSON.stringify(s) : `<${b.toString("hex")}>`}`;
  }).join(" ");
  let i = 0;
  while (i < ref.length && i < ours.length && ref[i] === ours[i]) i++;
  if (i === ref.length && i === ours.length) {
    console.log(`${inPath}: ${ref.length} tokens, identical to js-tiktoken`);
  } else {
    let at = 0;
    for (let j = 0; j < i; j++) at += bytes(ref[j]).length;
    const cps = [...raw.subarray(at, at + 32).toString("utf8")].slice(0, 10);
    console.error(`${inPath}: first difference at token ${i}, byte ${at} (js-tiktoken ${ref.length} tokens, ours ${ours.length})`);
    console.error(`  text there: ${cps.map((c) => "U+" + c.codePointAt(0).toString(16).toUpperCase().padStart(4, "0")).join(" ")}`);
    console.error(`  js-tiktoken: ${show(ref.slice(Math.max(0, i - 3), i + 6))}`);
    console.error(`  ours:        ${show(ours.slice(Math.max(0, i - 3), i + 6))}`);
    process.exit(1);
  }
} else {
  console.error(`tiktoken.mjs: unknown mode '${mode}'`);
  process.exit(2);
}

// Our classes (tok_encode --classes in inPath) against node's; see the usage.
function classes(inPath, skipPath) {
  const lines = readFileSync(inPath, "utf8").trim().split("\n");
  const ours = lines.shift().split(" ")[1];
  const cls = new Array(0x110000).fill(".");
  for (const l of lines) {
    const [a, b, k] = l.split(" ");
    for (let c = parseInt(a, 16); c <= parseInt(b, 16); c++) cls[c] = k;
  }
  const L = /^\p{L}$/u, N = /^\p{N}$/u, S = /^\p{White_Space}$/u, Cn = /^\p{Cn}$/u;
  const node = process.versions.unicode;
  const [om, on] = ours.split(".").map(Number), [nm, nn] = node.split(".").map(Number);
  const order = nm - om || nn - on; // < 0: node's Unicode is older than the tables'
  const skip = [], bad = [];
  for (let c = 0; c < 0x110000; c++) {
    if (c >= 0xd800 && c <= 0xdfff) continue;
    const s = String.fromCodePoint(c);
    const k = L.test(s) ? "L" : N.test(s) ? "N" : S.test(s) ? "S" : ".";
    if (k === cls[c]) continue;
    skip.push(c.toString(16));
    // Another version only assigns code points: unassigned in the older one,
    // "other" to us.  Anything else is a wrong table.
    const explained = order < 0 ? Cn.test(s) && cls[c] !== "S" : order > 0 && cls[c] === ".";
    if (!explained) bad.push(`U+${c.toString(16).toUpperCase()} ours ${cls[c]} node ${k}`);
  }
  writeFileSync(skipPath, skip.map((x) => x + "\n").join(""));
  if (bad.length) {
    console.error(`classes: our Unicode ${ours} tables and node's Unicode ${node} differ in ` +
      `${bad.length} code points that a version change does not explain: ${bad.slice(0, 8).join(", ")}`);
    return 1;
  }
  console.log(`classes: ours (Unicode ${ours}) and node's (Unicode ${node}) ` +
    (skip.length ? `differ in ${skip.length} code points, new in the newer version: left out of the stress text`
                 : "are identical"));
  return 0;
}
