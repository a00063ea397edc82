#!/usr/bin/env node
// gpt2-ranks.mjs - convert js-tiktoken's GPT-2 ranks into a megascale
// tokenizer file (the format of src/data/tokenizer.h, version 1).
//
//   node scripts/gpt2-ranks.mjs [--ranks PATH/gpt2.js] [--name gpt2] OUT.tok
//
// PATH defaults to tests/node/node_modules/js-tiktoken/dist/ranks/gpt2.js
// (`cd tests/node && npm install` puts it there).  The ranks module holds the
// pre-tokenisation pattern, the special tokens and the base64 byte strings of
// every ordinary token with its rank; in our format a token's id is its rank,
// so the ranks must be exactly 0..N-1 (checked).  Run once; the result is
// shipped as data/gpt2.tok so that builds never need npm.
import { writeFileSync, renameSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
let ranksPath = resolve(here, "../tests/node/node_modules/js-tiktoken/dist/ranks/gpt2.js");
let name = "gpt2";
let out = null;
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
  if (argv[i] === "--ranks") ranksPath = resolve(argv[++i]);
  else if (argv[i] === "--name") name = argv[++i];
  else if (out === null) out = argv[i];
  else die(`unexpected argument '${argv[i]}'`);
}
if (out === null) die("usage: gpt2-ranks.mjs [--ranks PATH/gpt2.js] [--name NAME] OUT.tok");

function die(msg) {
  console.error(`gpt2-ranks: ${msg}`);
  process.exit(1);
}

// CRC32C (Castagnoli, reflected polynomial 0x82F63B78), as src/base/crc32c.c.
const CRC_TABLE = (() => {
  const t = new Uint32Array(256);
  for (let i = 0; i < 256; i++) {
    let c = i;
    for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ 0x82f63b78 : c >>> 1;
    t[i] = c >>> 0;
  }
  return t;
})();
function crc32c(buf) {
  let c = 0xffffffff;
  for (let i = 0; i < buf.length; i++) c = CRC_TABLE[(c ^ buf[i]) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

let mod;
try {
  mod = (await import(pathToFileURL(ranksPath).href)).default;
} catch (e) {
  die(`${ranksPath}: cannot load the ranks module (${e.message}); run 'npm install' in tests/node`);
}
for (const k of ["pat_str", "special_tokens", "bpe_ranks"])
  if (!(k in mod)) die(`${ranksPath}: no '${k}' in the ranks module`);

// bpe_ranks: lines "<tag> <first rank> <base64> <base64> ...", ranks consecutive.
const tokens = [];
for (const line of mod.bpe_ranks.split("\n").filter(Boolean)) {
  const [, offsetStr, ...b64] = line.split(" ");
  const offset = Number.parseInt(offsetStr, 10);
  b64.forEach((s, i) => {
    const r = offset + i;
    if (tokens[r] !== undefined) die(`${ranksPath}: rank ${r} appears twice`);
    tokens[r] = Buffer.from(s, "base64");
  });
}
for (let r = 0; r < tokens.length; r++)
  if (tokens[r] === undefined) die(`${ranksPath}: ranks are not contiguous (no rank ${r})`);
const seen = new Set(tokens.map((t) => t.toString("latin1")));
if (seen.size !== tokens.length) die(`${ranksPath}: duplicate token byte strings`);
for (let b = 0; b < 256; b++)
  if (!seen.has(String.fromCharCode(b))) die(`${ranksPath}: byte ${b} has no token`);

const specials = Object.entries(mod.special_tokens).map(([text, id]) => [Buffer.from(text, "utf8"), id]);
specials.sort((x, y) => x[1] - y[1]);
specials.forEach(([, id], i) => {
  if (id !== tokens.length + i) die(`${ranksPath}: special token id ${id} is not ${tokens.length + i}`);
});
const nVocab = tokens.length + specials.length;
if (mod.explicit_n_vocab !== undefined && mod.explicit_n_vocab !== nVocab)
  die(`${ranksPath}: explicit_n_vocab ${mod.explicit_n_vocab} != ${nVocab}`);

// Layout (little-endian), see src/data/tokenizer.h.
const nameB = Buffer.from(name, "utf8");
const patB = Buffer.from(mod.pat_str, "utf8");
const lens = Buffer.alloc(2 * tokens.length);
tokens.forEach((t, i) => {
  if (t.length < 1 || t.length > 65535) die(`${ranksPath}: token ${i} has length ${t.length}`);
  lens.writeUInt16LE(t.length, 2 * i);
});
const tokB = Buffer.concat(tokens);
const spec = Buffer.alloc(8 * specials.length);
specials.forEach(([t, id], i) => {
  spec.writeUInt32LE(id, 8 * i);
  spec.writeUInt32LE(t.length, 8 * i + 4);
});
const specB = Buffer.concat(specials.map(([t]) => t));
const body = Buffer.concat([nameB, patB, lens, tokB, spec, specB]);
const head = Buffer.alloc(64);
head.write("MSTOKBPE", 0, "latin1");
head.writeUInt32LE(1, 8); // version
head.writeUInt32LE(64, 12); // header size
head.writeUInt32LE(tokens.length, 16);
head.writeUInt32LE(specials.length, 20);
head.writeUInt32LE(nameB.length, 24);
head.writeUInt32LE(patB.length, 28);
head.writeBigUInt64LE(BigInt(tokB.length), 32);
head.writeBigUInt64LE(BigInt(specB.length), 40);
head.writeBigUInt64LE(BigInt(64 + body.length), 48);
head.writeUInt32LE(crc32c(body), 56);
head.writeUInt32LE(crc32c(head.subarray(0, 60)), 60);

const tmp = `${out}.tmp.${process.pid}`;
writeFileSync(tmp, Buffer.concat([head, body]));
renameSync(tmp, out);
console.error(
  `gpt2-ranks: wrote ${out}: '${name}', ${tokens.length} tokens + ${specials.length} special ` +
    `(vocab ${nVocab}), ${64 + body.length} bytes`,
);
