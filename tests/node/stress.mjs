#!/usr/bin/env node
// stress.mjs - seeded generator of unusual Unicode text for the tokenizer
// parity test (parity.sh): the same SEED and BYTES give the same text on any
// machine.  Random mixtures of letters of many scripts (astral ones and those
// of Unicode 14-17 too), combining marks (neither \p{L} nor \p{N}), decimal
// digits of other scripts, Nl/No numbers, every whitespace character and the
// ones that look like it (U+180E, U+200B, U+FEFF, U+0085, U+001C-001F),
// apostrophe contractions next to all of these, whitespace runs before
// letters, newlines and the end of a line, emoji with ZWJ, skin tones,
// variation selectors, tags and keycaps, private-use, unassigned and
// noncharacter code points, random code points of all 17 planes, and long
// runs of one kind.  Only Unicode scalar values (no surrogates): the text is
// valid UTF-8.
//
//   node stress.mjs SEED BYTES OUT [SKIP]
//     writes about BYTES bytes (UTF-8) to OUT.  SKIP: a file of code points
//     (hex, one a line) never to write - those whose class node's Unicode
//     version gives differently from our tables' (tiktoken.mjs classes);
//     each is replaced by 'x'.
import { readFileSync, writeFileSync } from "node:fs";

const [seedArg, bytesArg, outPath, skipPath] = process.argv.slice(2);
if (!seedArg || !bytesArg || !outPath) {
  console.error("usage: stress.mjs SEED BYTES OUT [SKIP]");
  process.exit(2);
}

// splitmix32: a seeded generator whose output does not depend on node.
let state = Number(seedArg) >>> 0;
const u32 = () => {
  state = (state + 0x9e3779b9) >>> 0;
  let z = state;
  z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
  z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
  return (z ^ (z >>> 16)) >>> 0;
};
const below = (n) => u32() % n;
const pick = (a) => a[below(a.length)];
const fromRanges = (ranges) => { // ranges: [[lo, hi], ...], each equally likely
  const [lo, hi] = pick(ranges);
  return lo + below(hi - lo + 1);
};
const cp = (c) => String.fromCodePoint(c);

// Letters: scripts old and new (the last lines: Unicode 14, 15, 15.1, 16, 17).
const LETTERS = [
  [0x41, 0x5a], [0x61, 0x7a], [0xc0, 0xff], [0x100, 0x24f], [0x250, 0x2af], [0x391, 0x3c9],
  [0x410, 0x44f], [0x531, 0x556], [0x5d0, 0x5ea], [0x620, 0x64a], [0x904, 0x939],
  [0x985, 0x9b9], [0xb85, 0xbb9], [0xe01, 0xe30], [0xf40, 0xf6c], [0x10d0, 0x10fa],
  [0x1200, 0x1248], [0x13a0, 0x13f5], [0x1401, 0x166c], [0x1820, 0x1878], [0x2d30, 0x2d67],
  [0x3041, 0x3096], [0x30a1, 0x30fa], [0x4e00, 0x9fff], [0xac00, 0xd7a3], [0xa000, 0xa48c],
  [0x10000, 0x1004d], [0x10330, 0x10340], [0x10400, 0x1044f], [0x12000, 0x12399],
  [0x1d400, 0x1d7cb], [0x20000, 0x2a6df], [0x2a700, 0x2b739], [0x30000, 0x3134a],
  [0x10570, 0x105bc], [0x1e290, 0x1e2ad], [0x16a70, 0x16abe], [0x10f70, 0x10f81], // 14
  [0x11f04, 0x11f10], [0x1e4d0, 0x1e4eb], [0x31350, 0x323af], [0x1e030, 0x1e06d], // 15
  [0x2ebf0, 0x2ee5d], // 15.1
  [0x10d4a, 0x10d65], [0x16100, 0x1611d], [0x16d43, 0x16d6a], [0x1e5d0, 0x1e5ed],
  [0x105c0, 0x105f3], [0x11380, 0x11389], [0x11bc0, 0x11be0], // 16
  [0x10940, 0x10959], [0x11db0, 0x11dd8], [0x16ea0, 0x16eb8], [0x1e6c0, 0x1e6de],
  [0x323b0, 0x3347f], // 17
];
// Combining marks: Mn, Mc and Me (GPT-2's pattern has them in the "other" class).
const MARKS = [
  [0x300, 0x36f], [0x483, 0x489], [0x591, 0x5bd], [0x64b, 0x65f], [0x900, 0x903],
  [0x93a, 0x94f], [0x981, 0x983], [0xe31, 0xe3a], [0x1ab0, 0x1ace], [0x1dc0, 0x1dff],
  [0x20d0, 0x20f0], [0xfe20, 0xfe2f], [0x302a, 0x302f], [0x1d165, 0x1d169],
  [0x11f00, 0x11f03], [0x1e4ec, 0x1e4ef], [0xe0100, 0xe01ef],
];
// Decimal digits (Nd) of many scripts, and Nl/No numbers.
const DIGITS = [
  [0x30, 0x39], [0x660, 0x669], [0x6f0, 0x6f9], [0x966, 0x96f], [0x9e6, 0x9ef],
  [0xe50, 0xe59], [0xf20, 0xf29], [0x1040, 0x1049], [0xff10, 0xff19], [0x104a0, 0x104a9],
  [0x1d7ce, 0x1d7ff], [0x11f50, 0x11f59], [0x1e4f0, 0x1e4f9], [0x16d70, 0x16d79],
  [0x1e5f1, 0x1e5fa], [0x116d0, 0x116e3], [0x1ccf0, 0x1ccf9],
];
const NUMBERS = [
  [0xb2, 0xb3], [0xb9, 0xb9], [0xbc, 0xbe], [0x2070, 0x2079], [0x2080, 0x2089],
  [0x2150, 0x218b], [0x2460, 0x24ff], [0x2776, 0x2793], [0x3007, 0x3007], [0x3021, 0x3029],
  [0x3192, 0x3195], [0x3220, 0x3229], [0x3248, 0x324f], [0x3280, 0x3289], [0x10107, 0x10133],
  [0x10140, 0x10178], [0x12400, 0x1246e], [0x1d2c0, 0x1d2d3], [0x1f100, 0x1f10c],
];
// Every White_Space character, JavaScript's \s (adds U+FEFF, lacks U+0085),
// and look-alikes that are neither (U+180E, U+200B-200D, U+2060, U+001C-001F).
const SPACES = [
  0x9, 0xa, 0xb, 0xc, 0xd, 0x20, 0x85, 0xa0, 0x1680, 0x2000, 0x2001, 0x2002, 0x2003, 0x2004,
  0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200a, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000,
  0xfeff, 0x180e, 0x200b, 0x200c, 0x200d, 0x2060, 0x1c, 0x1d, 0x1e, 0x1f,
];
const PUNCT = [
  [0x21, 0x2f], [0x3a, 0x40], [0x5b, 0x60], [0x7b, 0x7e], [0xa1, 0xbf], [0x2010, 0x2027],
  [0x2030, 0x205e], [0x2190, 0x21ff], [0x2200, 0x22ff], [0x3001, 0x3003], [0xff01, 0xff0f],
];
const EMOJI = [[0x1f300, 0x1f5ff], [0x1f600, 0x1f64f], [0x1f680, 0x1f6ff], [0x1f900, 0x1f9ff],
  [0x1fa70, 0x1faff], [0x2600, 0x26ff], [0x2700, 0x27bf]];
const PRIVATE = [[0xe000, 0xf8ff], [0xf0000, 0xffffd], [0x100000, 0x10fffd]];
const UNASSIGNED = [[0x378, 0x379], [0x2fe0, 0x2fef], [0x1fb0, 0x1fb0], [0xe0080, 0xe00ff],
  [0x40000, 0x4ffff], [0x2fa20, 0x2ffff], [0x18d09, 0x18d7f]];
const NONCHARS = [0xfdd0, 0xfdef, 0xfffe, 0xffff, 0x1fffe, 0x1ffff, 0x2fffe, 0x10fffe, 0x10ffff];
const CONTRACTIONS = ["s", "t", "re", "ve", "m", "ll", "d", "S", "T", "RE", "VE", "M", "LL",
  "D", "Re", "rE", "Ll", "lL", "Ve", "x", ""];
const QUOTES = ["'", "'", "'", "\u2019", "''", "`"];

const anyScalar = () => {
  for (;;) {
    const c = below(0x110000);
    if (c < 0xd800 || c > 0xdfff) return c;
  }
};
const word = (ranges, max) => {
  let s = "";
  for (let n = 1 + below(max); n > 0; n--) s += cp(fromRanges(ranges));
  return s;
};
const spaces = (max) => {
  let s = "";
  for (let n = 1 + below(max); n > 0; n--) s += cp(below(3) ? pick(SPACES) : 0x20);
  return s;
};
const emoji = () => {
  let s = cp(fromRanges(EMOJI));
  if (!below(3)) s += cp(0x1f3fb + below(5)); // skin tone
  if (!below(3)) s += "\ufe0f";
  if (!below(2)) s += "\u200d" + cp(fromRanges(EMOJI)) + (below(2) ? "\ufe0e" : "");
  if (!below(8)) s = cp(0x1f1e6 + below(26)) + cp(0x1f1e6 + below(26)); // a flag
  if (!below(8)) s = pick("#*0123456789") + "\ufe0f\u20e3"; // a keycap
  if (!below(10)) s = "\u{1f3f4}\u{e0067}\u{e0062}\u{e0073}\u{e0063}\u{e0074}\u{e007f}"; // tags
  return s;
};
const contraction = () =>
  pick(QUOTES) + pick(CONTRACTIONS) + (below(2) ? "" : piece(below(PIECES.length)));

// One piece of text of kind k.
const PIECES = [
  () => word([[0x61, 0x7a]], 10), // ASCII words
  () => word(LETTERS, 12),
  () => word(LETTERS, 4) + word(MARKS, 3) + word(LETTERS, 4), // letters with marks
  () => word(MARKS, 6),
  () => word(DIGITS, 8),
  () => word(NUMBERS, 5),
  () => word(DIGITS, 3) + word(NUMBERS, 2) + word(LETTERS, 2),
  () => spaces(6),
  () => spaces(4) + word(LETTERS, 5), // whitespace runs before letters
  () => spaces(4) + pick(["\n", "\r\n", "\n\n", "\u2028", "\x85"]), // ... before newlines
  () => contraction(),
  () => word(LETTERS, 3) + contraction(),
  () => pick(SPACES.map(cp)) + contraction(),
  () => word(PUNCT, 6),
  () => emoji(),
  () => word(PRIVATE, 4),
  () => word(UNASSIGNED, 4),
  () => cp(pick(NONCHARS)),
  () => cp(anyScalar()),
  () => pick(["\n", "\r\n", "\t", " ", "  "]),
  () => { // a long run of one kind
    const r = pick([LETTERS, [[0x61, 0x7a]], DIGITS, MARKS, PUNCT, [[0x20, 0x20]], [[0xa, 0xa]],
      [[0x3000, 0x3000]], [[0x2f, 0x2f]], [[0x4e00, 0x4eff]], [[0x20000, 0x200ff]]]);
    const n = 64 + below(400);
    return below(2) ? cp(fromRanges(r)).repeat(n) : word(r, n);
  },
];
const WEIGHTS = [6, 8, 3, 2, 3, 2, 2, 5, 4, 3, 4, 3, 3, 3, 3, 1, 1, 1, 2, 4, 0.3];
const TOTAL = WEIGHTS.reduce((a, b) => a + b, 0);
function piece(k) {
  return PIECES[k]();
}
const randomPiece = () => {
  let x = (u32() / 4294967296) * TOTAL;
  for (let k = 0; k < WEIGHTS.length; k++) if ((x -= WEIGHTS[k]) < 0) return piece(k);
  return piece(0);
};

const skip = new Set();
if (skipPath)
  for (const line of readFileSync(skipPath, "utf8").split("\n"))
    if (line.trim()) skip.add(parseInt(line, 16));
const want = Number(bytesArg);
const parts = [];
let bytes = 0;
while (bytes < want) {
  let s = randomPiece();
  if (below(3) === 0) s = " " + s; // " ?" before a piece
  if (skip.size) s = Array.from(s, (ch) => (skip.has(ch.codePointAt(0)) ? "x" : ch)).join("");
  parts.push(s);
  bytes += Buffer.byteLength(s, "utf8");
}
writeFileSync(outPath, parts.join(""));
