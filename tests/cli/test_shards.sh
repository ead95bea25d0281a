#!/usr/bin/env bash
# Training over sets of llm.c token shards (data.train a glob or a list):
#  - a uint16 set (three shards cut from the shipped corpus, of 5, 9 and 7 sequences, a list with a
#    glob in it) and a uint32 set (vocabulary 70,000: half the ids past 65,535; one of its shards
#    uint16) train; the order is shuffled over the whole set, so every batch mixes shards, and the
#    epochs (21 and 24 sequences, batch 8) end inside steps;
#  - resume: steps after the checkpoint bitwise equal to the uninterrupted run's, and on dp 2 (the
#    checkpoint resharded, each rank its slice of every batch) within 1e-4 relative (test_3d's);
#  - refused with exit 2 and one line: a glob that matches nothing, a shard listed twice, a uint32
#    id past model.vocab_size, and a resume over a set of other sizes (the cursor would point into
#    another order).
# usage: test_shards.sh ZERO3D_BINARY SOURCE_DIR
set -eu
source "$(dirname "$0")/common.sh" "$@"
py=/usr/bin/python3

# The shards: llm.c's header (magic, version, count; 256 int32) and the tokens.
$py - "$tmp" <<'PY'
import struct, sys
from array import array
tmp = sys.argv[1]
raw = open("input/data/train.bin", "rb").read()
count = struct.unpack_from("<3i", raw)[2]
corpus = array("H", raw[1024:1024 + 2 * count])
def write(path, tokens, u32):
    magic, version, code = (20240801, 7, "I") if u32 else (20240520, 1, "H")
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", magic, version, len(tokens), *([0] * 253)))
        f.write(array(code, tokens).tobytes())
T = 32
at = 0
# uint16: 5, 9 and 7 sequences of 32, each with spare tokens past its last target.
for name, seqs, spare in (("u16_a", 5, 1), ("u16_b", 9, 7), ("u16_c", 7, 20)):
    n = seqs * T + 1 + spare
    write(f"{tmp}/{name}.bin", corpus[at:at + n], False)
    at += n
# uint32, vocabulary 70,000: every other id moved past 65,535; 10 and 11 sequences of 16, and 3 in a
# uint16 shard (a set may mix the two formats).
T, at = 16, 100000
for name, seqs, u32 in (("u32_0", 10, True), ("u32_1", 11, True), ("u32_2", 3, False)):
    n = seqs * T + 1 + 5
    ids = [t + 65536 * (i % 2) if u32 else t for i, t in enumerate(corpus[at:at + n])]
    write(f"{tmp}/{name}.bin", ids, u32)
    at += n
# A uint32 shard with an id past the model's vocabulary.
write(f"{tmp}/bad_vocab.bin", [1] * 40 + [70000] + [1] * 40, True)
PY

u16=(--set model.seq_len=32 --set model.d_model=64 --set model.n_layer=2 --set model.n_head=2
     --set data.train=\""$tmp/u16_a.bin, $tmp/u16_[bc].bin"\")
u32=(--set model.vocab_size=70000 --set model.seq_len=16 --set model.d_model=32 --set model.n_layer=1
     --set model.n_head=2 --set data.train=\""$tmp/u32_*.bin"\")
go() {  # go NAME NP ARGS...: gpt-tiny on NP data-parallel ranks, global batch 8, no validation, into $tmp/NAME
  local name=$1 np=$2; shift 2
  train_layout input/gpt-tiny.json "$name" 1 1 "$np" 1 "$@"
}
for set in u16 u32; do
  eval "args=(\"\${$set[@]}\")"
  # Epochs of 21 (24) sequences: the resumed run starts at sample 56, inside the third epoch
  # ([42, 63); [48, 72)), and the u16 set's step 8 runs into the fourth.
  go "$set" 1 "${args[@]}" --set train_steps=12 --set checkpoint.save_interval=7
  ckpt="$tmp/$set/checkpoints/step_00000007.h5"
  go "${set}_resumed" 1 "${args[@]}" --set train_steps=12 --set checkpoint.load=\""$ckpt"\"
  go "${set}_dp2" 2 "${args[@]}" --set train_steps=12 --set checkpoint.load=\""$ckpt"\"
done

$py - "$tmp" <<'PY'
import sys
from z3dcheck import Checks, check_resumes
tmp = sys.argv[1]
check = Checks("shards")
for s in ("u16", "u32"):
    check_resumes(check, s, f"{tmp}/{s}", f"{tmp}/{s}_resumed", f"{tmp}/{s}_dp2", 5)
check.exit()
PY

# ---- refused ----
z=("$z3d" train input/gpt-tiny.json --set train_steps=2 --set data.val=)
expect_exit 2 no-match "data.train: '$tmp/nothing_\*.bin' matches no file" \
  "${z[@]}" --run-dir "$tmp/e1" --set data.train=\""$tmp/u16_a.bin,$tmp/nothing_*.bin"\"
expect_exit 2 twice "data.train names '$tmp/u16_b.bin' twice" \
  "${z[@]}" --run-dir "$tmp/e2" "${u16[@]}" --set data.train=\""$tmp/u16_*.bin,$tmp/u16_b.bin"\"
expect_exit 2 vocab "'$tmp/bad_vocab.bin' holds token id 70000 at position 40, but model.vocab_size is 70000" \
  "${z[@]}" --run-dir "$tmp/e3" "${u32[@]}" --set data.train=\""$tmp/bad_vocab.bin"\" --set data.val=
# The u16 checkpoint (21 sequences in 3 shards) resumed over two of its shards.
expect_exit 2 other-set "checkpoint '$tmp/u16/checkpoints/step_00000007.h5' was saved over data.train of 3 shards of 21 sequences; this run's data.train is 2 shards of 16 sequences" \
  "${z[@]}" --run-dir "$tmp/e4" "${u16[@]}" --set data.train=\""$tmp/u16_[bc].bin"\" --set train_steps=12 \
  --set checkpoint.load=\""$tmp/u16/checkpoints/step_00000007.h5"\"
# The same counts in another order (the shards' sizes differ): refused too.
expect_exit 2 reordered "the same counts, but the shards' sizes differ" \
  "${z[@]}" --run-dir "$tmp/e5" "${u16[@]}" --set data.train=\""$tmp/u16_c.bin,$tmp/u16_a.bin,$tmp/u16_b.bin"\" \
  --set train_steps=12 --set checkpoint.load=\""$tmp/u16/checkpoints/step_00000007.h5"\"
