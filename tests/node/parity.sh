#!/usr/bin/env bash
# parity.sh TOK_ENCODE - our GPT-2 encoder must give exactly js-tiktoken's
# ids on the embedded corpus (data/kjv.txt.gz) and on unicode.txt (accents,
# CJK, emoji, Arabic, Devanagari digits, whitespace runs, contractions,
# punctuation), with the serial encoder and with the 2-thread one (on the
# corpus, and on the corpus with unicode.txt inserted every 1000 lines).  Installs js-tiktoken into
# tests/node/node_modules if it is missing; exits 77 (skipped) when node, npm
# or the package registry are not available.
set -uo pipefail
enc=${1:?usage: parity.sh TOK_ENCODE}
here=$(cd "$(dirname "$0")" && pwd)
src=${MS_SRC:-$(cd "$here/../.." && pwd)}
skip() { echo "tokenizer_parity: SKIP: $*"; exit 77; }

command -v node >/dev/null || skip "node is not installed (Debian package nodejs)"
if [[ ! -f "$here/node_modules/js-tiktoken/package.json" ]]; then
  command -v npm >/dev/null || skip "js-tiktoken is not installed and npm is missing (Debian package npm)"
  echo "tokenizer_parity: installing js-tiktoken into $here/node_modules"
  (cd "$here" && npm install --no-audit --no-fund --loglevel=error) ||
    skip "npm install of js-tiktoken failed (no access to the npm registry?)"
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
gzip -dc "$src/data/kjv.txt.gz" > "$tmp/kjv.txt" || { echo "cannot gunzip the corpus"; exit 1; }
awk -v u="$here/unicode.txt" '{ print } NR % 1000 == 0 { while ((getline l < u) > 0) print l; close(u) }' \
  "$tmp/kjv.txt" > "$tmp/mixed.txt"

check() { # FILE THREADS
  "$enc" --threads "$2" "$1" "$tmp/ids.bin" || exit 1
  echo -n "threads $2: "
  node "$here/tiktoken.mjs" compare "$1" "$tmp/ids.bin" || exit 1
}
check "$tmp/kjv.txt" 1
check "$tmp/kjv.txt" 2
check "$here/unicode.txt" 1
check "$tmp/mixed.txt" 2
echo "tokenizer_parity: all ids identical to js-tiktoken"
