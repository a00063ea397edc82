#!/usr/bin/env node
// tiktoken.mjs - the js-tiktoken side of the tokenizer parity test and of
// bench/tokenize.  Uses js-tiktoken's GPT-2 ranks with encode(text, [], []):
// ordinary encoding, special-token text encoded as text (our data_tok_encode).
//
//   node tiktoken.mjs compare IN IDS   IDS: our ids of IN (uint32 LE, from
//                                      tok_encode); exit 1 on the first
//                                      mismatch, printing both sides
//   node tiktoken.mjs encode IN OUT    write js-tiktoken's ids of IN
//   node tiktoken.mjs bench IN [REPS]  print "js_mbps X" (best of REPS) and
//                                      "tokens N"
import { readFileSync, writeFileSync } from "node:fs";
import { Tiktoken } from "js-tiktoken/lite";
import gpt2 from "js-tiktoken/ranks/gpt2";

const [mode, inPath, arg] = process.argv.slice(2);
if (!mode || !inPath) {
  console.error("usage: tiktoken.mjs compare IN IDS | encode IN OUT | bench IN [REPS]");
  process.exit(2);
}
const raw = readFileSync(inPath);
const text = raw.toString("utf8");
if (!Buffer.from(text, "utf8").equals(raw)) {
  console.error(`tiktoken.mjs: ${inPath}: not valid UTF-8 (js-tiktoken works on strings)`);
  process.exit(2);
}
const enc = new Tiktoken(gpt2);

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
  const show = (ids) =>
    Array.from(ids, (id) => `${id}:${JSON.stringify(enc.decode([id]))}`).join(" ");
  let i = 0;
  while (i < ref.length && i < ours.length && ref[i] === ours[i]) i++;
  if (i === ref.length && i === ours.length) {
    console.log(`${inPath}: ${ref.length} tokens, identical to js-tiktoken`);
  } else {
    console.error(`${inPath}: first difference at token ${i} (js-tiktoken ${ref.length} tokens, ours ${ours.length})`);
    console.error(`  js-tiktoken: ${show(ref.slice(Math.max(0, i - 3), i + 6))}`);
    console.error(`  ours:        ${show(ours.slice(Math.max(0, i - 3), i + 6))}`);
    process.exit(1);
  }
} else {
  console.error(`tiktoken.mjs: unknown mode '${mode}'`);
  process.exit(2);
}
