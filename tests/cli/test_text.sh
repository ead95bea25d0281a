#!/usr/bin/env bash
# Text in and out of a run through its tokenizer (data.tokenizer, ckpt/tokenizer_record.h):
# the record in the checkpoint and the copy beside it; generate encodes the prompt and decodes with
# it; a checkpoint that records none refuses text by name and takes --tokenizer; a resume with another
# tokenizer is refused, one that names none keeps the checkpoint's; eval --text equals
# eval --tokens on the token file data prepare makes of the same text; the recorded file is read
# only with its hash (copy gone: the source; both changed: an error); ckpt export --format hf
# writes the tokenizer's files, read by the npm reference @huggingface/tokenizers where installed.
# usage: test_text.sh ZERO3D_BINARY SOURCE_DIR
set -eu
source "$(dirname "$0")/common.sh" "$@"
train() {  # train NAME [--set ...]: gpt-tiny for 2 steps on 1 rank, a checkpoint at step 2
  local name=$1
  shift
  timeout 120 "$z3d" train input/gpt-tiny.json --run-dir "$tmp/$name" --peak-flops 1e11 --set data.val= \
    --set train_steps=2 --set checkpoint.save_interval=2 "$@" > "$tmp/$name.log" 2>&1 \
    || { cat "$tmp/$name.log"; fail "training $name"; }
}

# 1. byte (the shipped configs say so): recorded, generate reads text, export carries it
train byte
"$z3d" ckpt inspect "$tmp/byte/checkpoints" | grep -qF '{"kind":"byte"}' || fail "inspect shows no byte tokenizer record"
expect_exit 0 gen-byte 'byte tokenizer recorded in the checkpoint' \
  "$z3d" generate "$tmp/byte/checkpoints" --prompt "The " --max-tokens 8 --temperature 0
head -c 4 "$tmp/gen-byte.log" | grep -qF 'The ' || fail "generate does not print the prompt's text first"

# 2. unknown: text refused by name, --tokenizer byte accepted, ids printed as ids
train unknown --set data.tokenizer=
expect_exit 2 gen-unknown 'records no tokenizer .*--tokenizer' \
  "$z3d" generate "$tmp/unknown/checkpoints" --prompt "The " --max-tokens 4
expect_exit 0 gen-given 'byte tokenizer --tokenizer' \
  "$z3d" generate "$tmp/unknown/checkpoints" --prompt "The " --max-tokens 4 --tokenizer byte
expect_exit 0 gen-ids 'ids printed: the checkpoint records no tokenizer' \
  "$z3d" generate "$tmp/unknown/checkpoints" --prompt-ids 84,104 --max-tokens 2 --temperature 0
grep -qE '^84 104 [0-9]+ [0-9]+$' "$tmp/gen-ids.log" || { cat "$tmp/gen-ids.log"; fail "gen-ids: not ids"; }
expect_exit 2 eval-unknown 'records no tokenizer' "$z3d" eval "$tmp/unknown/checkpoints" --text input/data/SOURCES.txt
expect_exit 2 bad-tokenizer "data.tokenizer: .*$tmp/none.json" \
  "$z3d" train input/gpt-tiny.json --run-dir "$tmp/bad" --set data.tokenizer="$tmp/none.json"

# 3. eval --text: the same loss as eval --tokens on the token file of the same text
head -c 20000 input/data/SOURCES.txt > "$tmp/a.txt" 2>/dev/null || true
[[ -s $tmp/a.txt ]] || head -c 20000 README.md > "$tmp/a.txt"
"$z3d" data prepare "$tmp/a.txt" --out "$tmp/a.bin" > /dev/null 2>&1 || fail "data prepare a.txt"
"$z3d" eval "$tmp/byte/checkpoints" --tokens "$tmp/a.bin" --micro-batch 2 2>/dev/null > "$tmp/eval-tokens.json"
"$z3d" eval "$tmp/byte/checkpoints" --text "$tmp/a.txt" --micro-batch 2 2>/dev/null > "$tmp/eval-text.json"
/usr/bin/python3 - "$tmp" <<'PY' || fail "eval --text differs from eval --tokens"
import json, sys
a, b = (json.loads(open(f"{sys.argv[1]}/eval-{k}.json").readline()) for k in ("tokens", "text"))
assert a["loss"] == b["loss"] and a["tokens"] == b["tokens"], (a, b)
PY
echo "ok eval --text == eval --tokens"

# 4. a tokenizer file is read only with its hash: the copy beside, else the source while unchanged
"$z3d" ckpt export "$tmp/byte/checkpoints" --format hf --out "$tmp/hf-byte" > /dev/null 2>&1 || fail "export byte"
cp "$tmp/hf-byte/tokenizer.json" "$tmp/tok.json"
if "$z3d" data prepare "$tmp/a.txt" --tokenizer "$tmp/tok.json" --out "$tmp/b.bin" > /dev/null 2>&1; then
  train file --set data.tokenizer="$tmp/tok.json"
  copy=$(ls "$tmp/file/checkpoints"/tokenizer-*.json) || fail "no tokenizer copy beside the checkpoints"
  cmp -s "$copy" "$tmp/tok.json" || fail "the copy beside the checkpoints differs from the tokenizer"
  expect_exit 0 gen-copy 'bpe tokenizer recorded' "$z3d" generate "$tmp/file/checkpoints" --prompt "The " --max-tokens 4
  # a resume keeps the ids' meaning: another tokenizer is refused, an unset key keeps the checkpoint's
  expect_exit 2 resume-other "was trained with tokenizer bpe '$tmp/tok.json' .*data.tokenizer is byte" \
    "$z3d" train input/gpt-tiny.json --run-dir "$tmp/file" --set data.val= --set train_steps=4 \
    --set checkpoint.save_interval=2 --set checkpoint.load=auto
  expect_exit 0 resume-unset 'resumed from' "$z3d" train input/gpt-tiny.json --run-dir "$tmp/file" --set data.val= \
    --set train_steps=4 --set checkpoint.save_interval=2 --set checkpoint.load=auto --set data.tokenizer=
  "$z3d" ckpt inspect "$tmp/file/checkpoints" | grep -qF '"kind":"bpe"' || fail "the resumed run's checkpoint lost the record"
  rm "$copy"
  expect_exit 0 gen-source 'bpe tokenizer recorded' "$z3d" generate "$tmp/file/checkpoints" --prompt "The " --max-tokens 4
  echo ' ' >> "$tmp/tok.json"
  expect_exit 2 gen-changed "was trained with tokenizer '$tmp/tok.json' .*neither" \
    "$z3d" generate "$tmp/file/checkpoints" --prompt "The " --max-tokens 4
else
  echo "skip 4: this zero3d reads no tokenizer.json yet"
fi

# 5. the export's tokenizer files, read by an independent implementation
for f in tokenizer.json tokenizer_config.json generation_config.json config.json model.safetensors; do
  [[ -s $tmp/hf-byte/$f ]] || fail "the HF export lacks $f"
done
refs=${ZERO3D_NPM_REFS:-build/npm/node_modules}
if command -v node > /dev/null && [[ -d $refs/@huggingface/tokenizers ]]; then
  cat > "$tmp/hf.cjs" <<'JS'
const fs = require("fs");
const [refs, dir, text] = process.argv.slice(2);
const { Tokenizer } = require("module").createRequire(refs + "/")("@huggingface/tokenizers");
const t = new Tokenizer(JSON.parse(fs.readFileSync(dir + "/tokenizer.json", "utf8")),
                        JSON.parse(fs.readFileSync(dir + "/tokenizer_config.json", "utf8")));
const ids = t.encode(fs.readFileSync(text, "utf8"), { add_special_tokens: false }).ids;
const bytes = [...fs.readFileSync(text)];
if (JSON.stringify(ids) !== JSON.stringify(bytes)) { console.log("ids differ from bytes"); process.exit(1); }
if (t.decode(ids) !== fs.readFileSync(text, "utf8")) { console.log("decode differs"); process.exit(1); }
JS
  node "$tmp/hf.cjs" "$(cd "$refs" && pwd)" "$tmp/hf-byte" "$tmp/a.txt" \
    || fail "@huggingface/tokenizers does not read the exported byte tokenizer as bytes"
  echo "ok export read by @huggingface/tokenizers"
else
  echo "skip 5b: no node or no npm references in $refs (tests/run.sh installs them)"
fi
echo "PASS"
