#!/usr/bin/env bash
# zero3d ckpt on checkpoints of two short gpt-tiny runs (fp32 tp 2 x dp 2 ZeRO-3; bf16 pp 2 x dp 2
# ZeRO-2): h5dump shows the self-describing layout; inspect prints the step, the layout and a row per
# tensor; verify passes good files, names a dataset whose bytes were flipped (exit 4, on every rank)
# and rejects truncated, non-HDF5 and foreign HDF5 files (exit 2); export writes safetensors whose
# tensors equal the checkpoint's bit for bit (parsed by hand); a checksum recomputed in numpy
# equals the stored one.
# usage: test_ckpt_tools.sh ZERO3D_BINARY SOURCE_DIR
set -eu
source "$(dirname "$0")/common.sh" "$@"
train() {  # train NAME [--set ...]: 4 steps on 4 ranks, checkpoints at steps 2 and 4
  local name=$1
  shift
  timeout 120 $MPIRUN -np 4 "$z3d" train input/gpt-tiny.json --run-dir "$tmp/$name" --peak-flops 1e11 \
    --set data.val= --set train_steps=4 --set checkpoint.save_interval=2 "$@" > "$tmp/$name.log" 2>&1 \
    || { cat "$tmp/$name.log"; fail "training $name"; }
}
train fp32 --set tensor_parallel.tp_size=2 --set zero_optimization.stage=3
train bf16 --set bf16.enabled=true --set pipeline_parallel.pp_size=2 --set zero_optimization.stage=2
A=$tmp/fp32/checkpoints
B=$tmp/bf16/checkpoints
PY=/usr/bin/python3

# 1. self-describing: h5dump alone shows groups, shapes, layout, checksums
h5dump -H "$A/step_00000004.h5" > "$tmp/h5dump.txt"
for want in 'GROUP "model"' 'GROUP "optimizer"' 'GROUP "exp_avg_sq"' 'ATTRIBUTE "format_version"' 'ATTRIBUTE "step"' \
            'ATTRIBUTE "tp"' 'ATTRIBUTE "precision"' 'ATTRIBUTE "checksum"'; do
  grep -qF "$want" "$tmp/h5dump.txt" || fail "h5dump -H lacks $want"
done
h5dump -H -d /model/wte "$A/step_00000004.h5" | grep -qF 'DATASPACE  SIMPLE { ( 256, 128 ) / ( 256, 128 ) }' \
  || fail "h5dump: /model/wte is not 256 x 128"
h5dump -a /step "$A/step_00000004.h5" | grep -qF '(0): 4' || fail "h5dump: attribute step is not 4"
echo "ok h5dump"

# 2. inspect: a directory means its latest; a file as is
expect_exit 0 inspect-dir '^  total: 156 datasets, ' "$z3d" ckpt inspect "$A"
for want in '  step            4' '  layout at save  world 4 = tp 2 x pp 1 x dp 2, ZeRO-3, fp32' \
            '  model           n_layer 4, n_head 4, d_model 128, vocab_size 256, seq_len 64' '"applied_steps":4'; do
  grep -qF -- "$want" "$tmp/inspect-dir.log" || { cat "$tmp/inspect-dir.log"; fail "inspect: no '$want'"; }
done
grep -qE '^  /model/wte +float32 +256 x 128 +131072$' "$tmp/inspect-dir.log" || fail "inspect: no row for /model/wte"
grep -qE '^  /optimizer/exp_avg_sq/h.3.mlp.c_fc.bias +float32 +512 +2048$' "$tmp/inspect-dir.log" \
  || fail "inspect: no row for /optimizer/exp_avg_sq/h.3.mlp.c_fc.bias"
expect_exit 0 inspect-file '^  step            2$' "$z3d" ckpt inspect "$A/step_00000002.h5"
expect_exit 0 inspect-bf16 'world 4 = tp 1 x pp 2 x dp 2, ZeRO-2, bf16' "$z3d" ckpt inspect "$B/step_00000004.h5"
grep -qE '^  /model/wte +uint16 \(bfloat16\) +256 x 128 +65536$' "$tmp/inspect-bf16.log" \
  || fail "inspect: bf16 /model/wte row"
grep -qE '^  total: 208 datasets, ' "$tmp/inspect-bf16.log" || fail "inspect: bf16 file has 4 x 52 datasets"

# 3. verify: good files pass; flipped bytes inside one dataset are named (exit 4 on every rank)
expect_exit 0 verify-fp32 'all 156 datasets match their checksums' "$z3d" ckpt verify "$A"
expect_exit 0 verify-bf16 'all 208 datasets match their checksums' $MPIRUN -np 2 "$z3d" ckpt verify "$B/step_00000004.h5"
flip() {  # flip SRC DST DATASET: DST = SRC with 4 bytes in the middle of DATASET's data inverted
  $PY - "$@" <<'PY'
import shutil, sys
from z3dcheck import dataset_extent, xor_bytes
src, dst, name = sys.argv[1:]
shutil.copyfile(src, dst)
offset, size = dataset_extent(src, name)
xor_bytes(dst, offset + size // 2, 4, 0xFF)
PY
}
flip "$A/step_00000004.h5" "$tmp/bad32.h5" /optimizer/exp_avg/h.1.attn.c_proj.weight
expect_exit 4 verify-flip32 "dataset '/optimizer/exp_avg/h.1.attn.c_proj.weight' fails its checksum" \
  $MPIRUN -np 2 "$z3d" ckpt verify "$tmp/bad32.h5"
grep -q "1 problem in 156 datasets" "$tmp/verify-flip32.log" || fail "verify: more than the flipped dataset reported"
flip "$B/step_00000004.h5" "$tmp/bad16.h5" /model/h.2.mlp.c_fc.weight
expect_exit 4 verify-flip16 "$tmp/bad16.h5': dataset '/model/h.2.mlp.c_fc.weight' fails its checksum" \
  "$z3d" ckpt verify "$tmp/bad16.h5"
head -c $(( $(stat -c %s "$A/step_00000004.h5") / 2 )) "$A/step_00000004.h5" > "$tmp/half.h5"
# A file that is there but no HDF5 file (truncated, empty, text) is a corrupt checkpoint: exit 4 (#33).
expect_exit 4 verify-truncated "zero3d: error: checkpoint '$tmp/half.h5' cannot be opened" "$z3d" ckpt verify "$tmp/half.h5"
: > "$tmp/empty.h5"
expect_exit 4 verify-empty "zero3d: error: checkpoint '$tmp/empty.h5' cannot be opened" "$z3d" ckpt verify "$tmp/empty.h5"
echo "not a checkpoint" > "$tmp/text.h5"
expect_exit 4 verify-text "checkpoint '$tmp/text.h5' cannot be opened: not an HDF5 file" \
  $MPIRUN -np 2 "$z3d" ckpt verify "$tmp/text.h5"
# A `latest` that holds garbage, or names a directory: said as such, not "does not exist" (#33).
mkdir -p "$tmp/junk/step_00000007.h5"
printf '\001\002garbage\n' > "$tmp/junk/latest"
expect_exit 2 verify-latest-garbage "checkpoint directory '$tmp/junk': its 'latest' holds '..garbage', not a checkpoint's name" \
  "$z3d" ckpt verify "$tmp/junk"
echo step_00000007.h5 > "$tmp/junk/latest"
expect_exit 2 verify-latest-dir "checkpoint '$tmp/junk/step_00000007.h5' is not a file" "$z3d" ckpt verify "$tmp/junk"
$PY -c "import h5py, sys; h5py.File(sys.argv[1], 'w')['x'] = [1.0]" "$tmp/foreign.h5"
expect_exit 2 verify-foreign "'$tmp/foreign.h5' is an HDF5 file but not a zero3d checkpoint" \
  "$z3d" ckpt verify "$tmp/foreign.h5"
expect_exit 2 verify-missing "checkpoint '$tmp/none' does not exist" "$z3d" ckpt verify "$tmp/none"
expect_exit 2 bad-option "unknown option '--out' for zero3d ckpt verify" "$z3d" ckpt verify "$A" --out x
expect_exit 2 bad-weights "--weights must be master or model, got 'half'" \
  "$z3d" ckpt export "$A" --out "$tmp/x" --weights half
expect_exit 2 export-corrupt "dataset '/model/h.2.mlp.c_fc.weight' has no checksum or fails it" \
  "$z3d" ckpt export "$tmp/bad16.h5" --out "$tmp/bad.safetensors" --weights model
[[ ! -e "$tmp/bad.safetensors" && ! -e "$tmp/bad.safetensors.tmp" ]] || fail "failed export left a file behind"

# 4. export: safetensors equal to the checkpoint bit for bit
expect_exit 0 export-fp32 "exported 52 tensors \(master weights from /model, F32" \
  "$z3d" ckpt export "$A" --out "$tmp/fp32.safetensors"
expect_exit 0 export-bf16-model "exported 52 tensors \(model weights from /model, BF16" \
  $MPIRUN -np 2 "$z3d" ckpt export "$B" --out "$tmp/bf16.safetensors" --weights model
expect_exit 0 export-bf16-master "exported 52 tensors \(master weights from /optimizer/master, F32" \
  "$z3d" ckpt export "$B" --out "$tmp/master.safetensors"
$PY - "$tmp" "$A/step_00000004.h5" "$B/step_00000004.h5" <<'PY'
import h5py, sys
import numpy as np
from z3dcheck import read_safetensors
tmp, fp32, bf16 = sys.argv[1:]

def read_checked(path):
    st = read_safetensors(path)
    assert st.header_len % 8 == 0, f"{path}: header length {st.header_len} is not a multiple of 8"
    end = 0
    for name, t in st.tensors.items():  # in file order, contiguous, covering the data exactly
        assert t["data_offsets"][0] == end, (path, name, t["data_offsets"], end)
        end = t["data_offsets"][1]
    assert end == len(st.data), (path, end, len(st.data))
    return st.tensors, st.data, st.metadata

def check(path, ckpt, group, want_dtype):
    header, data, meta = read_checked(path)
    np_dtype = {"F32": np.uint32, "BF16": np.uint16, "F16": np.uint16}[want_dtype]
    with h5py.File(ckpt, "r") as f:
        names = list(header)
        assert names[:3] == ["wte", "wpe", "h.0.ln_1.weight"] and names[-1] == "ln_f.bias", names
        assert sorted(names) == sorted(f["/model"].keys()), "exported names differ from /model's datasets"
        assert meta == {"format": "pt", "source": ckpt, "step": str(f.attrs["step"])}, meta
        for name, t in header.items():
            ds = f[f"{group}/{name}"]
            assert t["dtype"] == want_dtype, (path, name, t["dtype"])
            assert t["shape"] == list(ds.shape), (path, name, t["shape"], ds.shape)
            got = np.frombuffer(data[t["data_offsets"][0]:t["data_offsets"][1]], dtype="<" + np.dtype(np_dtype).str[1:])
            want = ds[()].reshape(-1).view(np_dtype) if ds.dtype == np.float32 else ds[()].reshape(-1)
            assert got.dtype == want.dtype and np.array_equal(got, want), f"{path}: {name} differs from {group}/{name}"
    print(f"ok {path.split('/')[-1]}: {len(header)} {want_dtype} tensors equal {group} bit for bit")

check(f"{tmp}/fp32.safetensors", fp32, "/model", "F32")
check(f"{tmp}/bf16.safetensors", bf16, "/model", "BF16")
check(f"{tmp}/master.safetensors", bf16, "/optimizer/master", "F32")
with h5py.File(bf16, "r") as f:  # the master export is not the bf16 weights widened
    assert f["/model/wte"].attrs["dtype"] in (b"bfloat16", "bfloat16")
    widened = (f["/model/wte"][()].astype(np.uint32) << 16).view(np.float32)
    assert not np.array_equal(widened, f["/optimizer/master/wte"][()]), "master equals bf16 weights"

# The checksum (ckpt/checkpoint.h): sum over elements of splitmix64((i << 32) | bits) mod 2^64.
def splitmix64(x):
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))

def checksum(ds):
    v = ds[()].reshape(-1)
    bits = (v.view(np.uint32) if v.dtype == np.float32 else v).astype(np.uint64)
    i = np.arange(v.size, dtype=np.uint64)
    return int(np.sum(splitmix64((i << np.uint64(32)) | bits), dtype=np.uint64))

for ckpt, name in [(fp32, "/model/h.0.attn.c_attn.weight"), (fp32, "/optimizer/exp_avg_sq/ln_f.bias"),
                   (bf16, "/model/wte")]:
    with h5py.File(ckpt, "r") as f:
        got, stored = checksum(f[name]), int(f[name].attrs["checksum"])
        assert got == stored, f"{name}: numpy checksum {got:016x}, stored {stored:016x}"
        print(f"ok checksum {name} = {stored:016x} recomputed in numpy")

# A diverged state: nan and inf in one tensor, its checksum made to match (a run saved it so).
import shutil
shutil.copyfile(fp32, tmp + "/nonfinite.h5")
with h5py.File(tmp + "/nonfinite.h5", "r+") as f:
    ds = f["/model/h.1.mlp.c_fc.bias"]
    v = ds[()]
    v[3], v[10] = np.nan, np.inf
    ds[...] = v
    ds.attrs["checksum"] = np.uint64(checksum(ds))
PY
expect_exit 4 verify-nonfinite "dataset '/model/h.1.mlp.c_fc.bias' holds 2 non-finite values \(inf or nan; the first is element 3\)" \
  "$z3d" ckpt verify "$tmp/nonfinite.h5"

# 6. a checkpoint another tool rewrote (chunked, compressed: h5repack) still loads, through
#    HDF5 (each rank its own selection) instead of the offset reads, to the same state: resuming it trains the same step.
h5repack -f GZIP=1 -l CHUNK=16x16 "$A/step_00000004.h5" "$tmp/repacked.h5"
h5dump -pH -d /model/wte "$tmp/repacked.h5" | grep -q CHUNKED || fail "h5repack: /model/wte is not chunked"
for f in "$A/step_00000004.h5" "$tmp/repacked.h5"; do
  name=resume_$(basename "$f" .h5)
  timeout 120 $MPIRUN -np 2 "$z3d" train input/gpt-tiny.json --run-dir "$tmp/$name" --peak-flops 1e11 --set data.val= \
    --set train_steps=5 --set zero_optimization.stage=1 --set checkpoint.load=\""$f"\" > "$tmp/$name.log" 2>&1 \
    || { cat "$tmp/$name.log"; fail "$name"; }
done
loss() { $PY -c 'import sys; from z3dcheck import train; print([r["loss"] for r in train(sys.argv[1])])' "$1"; }
[[ "$(loss "$tmp/resume_step_00000004/metrics.jsonl")" == "$(loss "$tmp/resume_repacked/metrics.jsonl")" ]] \
  || fail "the repacked checkpoint resumed to another loss: $(loss "$tmp/resume_step_00000004/metrics.jsonl") vs $(loss "$tmp/resume_repacked/metrics.jsonl")"
echo "ok a chunked, compressed (h5repack) checkpoint loads through HDF5 to the same state"
echo "ckpt tools: all passed"
