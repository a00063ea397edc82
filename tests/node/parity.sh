#!/usr/bin/env bash
# parity.sh TOK_ENCODE [SEED] - our GPT-2 encoder must give exactly
# js-tiktoken's ids (with \s read as White_Space, see tiktoken.mjs) on the
# embedded corpus (data/kjv.txt.gz), on unicode.txt (accents, CJK, emoji,
# Arabic, Devanagari digits, whitespace runs, contractions, punctuation) and
# on 128 KB of stress text from stress.mjs with SEED (default 1: unusual
# Unicode of all kinds), with the serial encoder and with the 2-thread one
# (on the corpus, and on the corpus with unicode.txt and a part of the stress
# text inserted every 1000 lines).  First our Unicode tables must be node's
# (tiktoken.mjs classes); code points that a Unicode version between node's
# and the tables' assigned are left out of the stress text.  Installs
# js-tiktoken into tests/node/node_modules if it is missing; exits 77
# (skipped) when node, npm or the package registry are not available.
set -uo pipefail
enc=${1:?usage: parity.sh TOK_ENCODE [SEED]}
seed=${2:-1}
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
"$enc" --classes > "$tmp/classes.txt" || exit 1
node "$here/tiktoken.mjs" classes "$tmp/classes.txt" "$tmp/skip.txt" || exit 1
node "$here/stress.mjs" "$seed" 131072 "$tmp/stress.txt" "$tmp/skip.txt" || exit 1
per=$(( $(wc -l < "$tmp/stress.txt") / 31 + 1 )) # the corpus has 31 thousand lines
LC_ALL=C awk -v u="$here/unicode.txt" -v x="$tmp/stress.txt" -v k="$per" '{ print }
  NR % 1000 == 0 { while ((getline l < u) > 0) print l; close(u)
                   for (i = 0; i < k && (getline l < x) > 0; i++) print l }' \
  "$tmp/kjv.txt" > "$tmp/mixed.txt"

check() { # FILE THREADS
  "$enc" --threads "$2" "$1" "$tmp/ids.bin" || exit 1
  echo -n "threads $2: "
  node "$here/tiktoken.mjs" compare "$1" "$tmp/ids.bin" || exit 1
}
check "$tmp/kjv.txt" 1
check "$tmp/kjv.txt" 2
check "$here/unicode.txt" 1
echo "stress text: seed $seed, $(wc -c < "$tmp/stress.txt") bytes"
check "$tmp/stress.txt" 1
check "$tmp/mixed.txt" 2
echo "tokenizer_parity: all ids identical to js-tiktoken"
