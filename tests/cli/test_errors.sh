#!/usr/bin/env bash
# Every bad input to the CLI: one clear line naming the problem, exit code 2, no run dir left.
# usage: test_errors.sh ZERO3D_BINARY SOURCE_DIR
set -u
source "$(dirname "$0")/common.sh" "$@"
fails=0; passes=0

# expect NAME SUBSTRING COMMAND...: exit code 2, stderr contains SUBSTRING, and the run dir
# $tmp/run was not created.
expect() {
  local name=$1 want=$2; shift 2
  rm -rf "$tmp/run"
  "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
  if [[ $rc -ne 2 ]]; then echo "FAIL $name: exit code $rc, expected 2"; cat "$tmp/err"; fails=$((fails+1)); return; fi
  if ! grep -qF -- "$want" "$tmp/err"; then echo "FAIL $name: stderr lacks '$want':"; cat "$tmp/err"; fails=$((fails+1)); return; fi
  if [[ -e "$tmp/run" ]]; then echo "FAIL $name: run dir was created"; fails=$((fails+1)); return; fi
  if [[ $(grep -c "zero3d: error" "$tmp/err") -ne 1 ]]; then echo "FAIL $name: not exactly one error line"; cat "$tmp/err"; fails=$((fails+1)); return; fi
  passes=$((passes+1))
}

tiny=input/gpt-tiny.json
train() { "$z3d" train "$@" --run-dir "$tmp/run" --peak-flops 1e11; }

printf '{"train_steps": 5,\n  "model": {"vocab_size": 256,, }\n}\n' > "$tmp/bad.json"
head -c 3000 input/data/train.bin > "$tmp/truncated.bin"
head -c 4000 /bin/sh > "$tmp/foreign.bin"

expect missing-config     "cannot read config file '$tmp/nope.json'" train "$tmp/nope.json"
expect bad-json           "line 2, column"                         train "$tmp/bad.json"
expect unknown-key        "did you mean 'optimizer.params.betas'"  train $tiny --set optimizer.params.betaz=[0.9,0.95]
expect unknown-top-key    "did you mean 'train_steps'"             train $tiny --set train_step=3
expect bad-value          "model.n_head"                           train $tiny --set model.n_head=-4
expect bad-type           "train_steps"                            train $tiny --set train_steps=many
expect heads-divide       "n_head"                                 train $tiny --set model.n_head=3
expect malformed-set      "KEY=VALUE"                              train $tiny --set model.n_head
expect not-honoured       "contiguous_gradients"                   train $tiny --set zero_optimization.contiguous_gradients=false
expect two-precisions     "choose one precision"                   train $tiny --set fp16.enabled=true --set bf16.enabled=true
expect zero-stage         "zero_optimization.stage"                train $tiny --set zero_optimization.stage=4
expect batch-mismatch     "train_batch_size"                       train $tiny --set train_batch_size=12
expect missing-deepspeed  "$tmp/ds.json"                           train $tiny --deepspeed "$tmp/ds.json"
expect missing-data       "$tmp/none.bin"                          train $tiny --set data.train=\"$tmp/none.bin\"
expect truncated-data     "is truncated"                           train $tiny --set data.train=\"$tmp/truncated.bin\"
expect foreign-data       "is not an llm.c token file"             train $tiny --set data.train=\"$tmp/foreign.bin\"
expect vocab-too-small    "model.vocab_size"                       train $tiny --set model.vocab_size=100
expect unknown-option     "unknown option '--frobnicate'"          train $tiny --frobnicate
expect no-config          "needs a CONFIG"                         "$z3d" train
expect unknown-command    "unknown command 'trian'"                "$z3d" trian
expect bad-peak           "--peak-flops must be a positive number" "$z3d" train $tiny --peak-flops abc
expect missing-text       "$tmp/missing.txt"                       "$z3d" data prepare "$tmp/missing.txt" --out "$tmp/x.bin"
expect layout-batch       "data-parallel size 3"                   $MPIRUN -np 3 "$z3d" train $tiny --run-dir "$tmp/run" --set train_batch_size=8
expect layout-rank-file   "$tmp/none.bin"                          $MPIRUN -np 2 "$z3d" train $tiny --run-dir "$tmp/run" --set data.train=\"$tmp/none.bin\"
expect layout-tp          "not a multiple of tensor_parallel.tp_size 2" train $tiny --set tensor_parallel.tp_size=2
expect tp-heads           "model.n_head 4 must be divisible by tensor_parallel.tp_size 3" $MPIRUN -np 3 "$z3d" train $tiny --run-dir "$tmp/run" --set tensor_parallel.tp_size=3
expect layout-pp          "not a multiple of tensor_parallel.tp_size 1 * pipeline_parallel.pp_size 2" train $tiny --set pipeline_parallel.pp_size=2
expect pp-layers          "pipeline_parallel.pp_size 8 is larger than model.n_layer 4" $MPIRUN -np 8 "$z3d" train $tiny --run-dir "$tmp/run" --set pipeline_parallel.pp_size=8

# --help and --version succeed
for cmd in "--help" "--version" "train --help" "data --help" "bench --help"; do
  if ! "$z3d" $cmd >/dev/null 2>&1; then echo "FAIL '$cmd' did not exit 0"; fails=$((fails+1)); else passes=$((passes+1)); fi
done
# data prepare: bytes of the texts in order, llm.c header, nothing else left behind
printf 'hello ' > "$tmp/a.txt"; printf 'world\n' > "$tmp/b.txt"
if "$z3d" data prepare "$tmp/a.txt" "$tmp/b.txt" --out "$tmp/hw.bin" >/dev/null &&
   /usr/bin/python3 -c "
import struct, sys
b = open(sys.argv[1], 'rb').read()
h = struct.unpack('<256i', b[:1024])
assert h[:3] == (20240520, 1, 12), h[:3]
assert bytes(struct.unpack('<12H', b[1024:])) == b'hello world\\n'
" "$tmp/hw.bin" && [[ ! -e "$tmp/hw.bin.tmp" ]]; then passes=$((passes+1)); else echo "FAIL data prepare output"; fails=$((fails+1)); fi
# found by a hostile probe (issue #33): an output that is one of the inputs, a checkpoint.dir that is a file
expect prepare-into-input "--out '$tmp/a.txt' is also an input text" "$z3d" data prepare "$tmp/b.txt" "$tmp/a.txt" --out "$tmp/a.txt"
[[ $(cat "$tmp/a.txt") == "hello " ]] && passes=$((passes+1)) || { echo "FAIL data prepare overwrote its input"; fails=$((fails+1)); }
echo "a file" > "$tmp/afile"
expect ckpt-dir-is-file   "cannot create checkpoint directory (checkpoint.dir) '$tmp/afile': Not a directory" \
                                                                     train $tiny --set checkpoint.dir=\"$tmp/afile\" --set checkpoint.save_interval=5

# bench io: writes, syncs and removes its file, and reports a rate
if out=$($MPIRUN -np 2 "$z3d" bench io --dir "$tmp" --bytes 4e6 2>&1) && grep -qE "^4000000 bytes in [0-9.]+ s: [0-9.]+ MB/s" <<< "$out" &&
   [[ ! -e "$tmp/zero3d-bench-io.tmp" ]]; then passes=$((passes+1)); else echo "FAIL bench io: $out"; fails=$((fails+1)); fi
expect bench-io-option    "unknown option '--size'"               "$z3d" bench io --size 3
# bench gemm, at every ISA level this CPU runs (ZERO3D_ISA; oneDNN is capped there too, so an
# AVX-512 CPU runs an AVX2 CPU's path, where oneDNN has no bf16 GEMM): names the CPU, the libraries
# and their ISA, the FMA peak, and rates for a square size, each GEMM of a gpt-tiny micro-batch with
# the library that runs it, and the fused attention (every rate a positive number, bf16 may be '-')
levels="sse2"; grep -qw avx2 /proc/cpuinfo && levels="avx2 $levels"; grep -qw avx512f /proc/cpuinfo && levels="avx512 $levels"
rate='([0-9.]+|-)'
# OpenBLAS (Debian's has kernels for every level) runs the level's own kernels, as a CPU of that
# level picks them, unless OPENBLAS_CORETYPE says otherwise.
declare -A blas_core=([avx512]="SkylakeX|Cooperlake|SapphireRapids" [avx2]="Zen|Haswell" [sse2]="Prescott")
for level in $levels; do
  if out=$(env -u OPENBLAS_CORETYPE ZERO3D_ISA=$level timeout 120 "$z3d" bench gemm --sizes 64 --seconds 0.02 --config $tiny 2>&1) &&
     grep -qE "^# CPU: .*host loops: $level;" <<< "$out" &&
     grep -qE "^# GEMM libraries: oneDNN [0-9.]+ \([a-z0-9_]+\); CBLAS: OpenBLAS [0-9.]+ (${blas_core[$level]})$" <<< "$out" &&
     grep -qE "^# zero3d's plan \(compute.gemm=auto\): .*; why: auto: " <<< "$out" &&
     grep -qE "^# FMA peak \($level, .*: [0-9.]+ GFLOP/s" <<< "$out" &&
     grep -qE "^ +64 +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +$rate +[0-9.]+%" <<< "$out" &&
     [[ $(grep -cE "^(qkv|attn proj|mlp fc|mlp proj|lm head) (fwd|dx|dW) +[0-9]+ +[0-9]+ +[0-9]+( +[0-9.]+){3} +$rate  (onednn|cblas)$" <<< "$out") == 15 ]] &&
     grep -qE "^attention fwd +[0-9.]+ " <<< "$out" && grep -qE "^attention bwd +[0-9.]+ " <<< "$out"; then
    passes=$((passes+1)); else echo "FAIL bench gemm at $level:"; echo "$out"; fails=$((fails+1)); fi
done
if out=$(OPENBLAS_CORETYPE=Prescott ZERO3D_ISA=avx2 timeout 120 "$z3d" bench gemm --sizes 64 --seconds 0.02 --config $tiny 2>&1) &&
   grep -qE "CBLAS: OpenBLAS [0-9.]+ Prescott$" <<< "$out" && grep -q "not level avx2's" <<< "$out" &&
   grep -q "^# note: OpenBLAS .*OPENBLAS_CORETYPE=Prescott is set; unset it" <<< "$out" || ! grep -qw avx2 /proc/cpuinfo; then
  passes=$((passes+1)); else echo "FAIL bench gemm keeps OPENBLAS_CORETYPE:"; echo "$out"; fails=$((fails+1)); fi
# a Llama model's own GEMM shapes (512 tokens a micro-batch): grouped key/value heads narrow qkv
# (4 + 2 x 2 heads of 32), SwiGLU's fc is the gate and the up projection (2 x 384)
if out=$(timeout 120 "$z3d" bench gemm --sizes 64 --seconds 0.02 --config input/llama-tiny.json 2>&1) &&
   grep -qE "^qkv fwd +512 +256 +128 " <<< "$out" && grep -qE "^attn proj fwd +512 +128 +128 " <<< "$out" &&
   grep -qE "^mlp fc fwd +512 +768 +128 " <<< "$out" && grep -qE "^mlp proj fwd +512 +128 +384 " <<< "$out" &&
   grep -qE "^attention bwd +[0-9.]+ " <<< "$out"; then
  passes=$((passes+1)); else echo "FAIL bench gemm, Llama shapes:"; echo "$out"; fails=$((fails+1)); fi
# bench kernels: a column per level, a row per kernel, each cell a rate and its share of the bound
if out=$(timeout 120 "$z3d" bench kernels --config $tiny --seconds 0.01 2>&1) &&
   grep -qE "^kernel +${levels// / +}$" <<< "$out" &&
   grep -qE "^# bounds: copy bandwidth [0-9.]+ GB/s .*FMA peak \(GFLOP/s\) .*exp rate \(G/s, in L2\) " <<< "$out" &&
   [[ $(grep -cE "^[a-z_0-9]+( \(\+bias\))?( +[0-9.]+ G[FB]/s +[0-9]+%[* ])+$" <<< "$out") == 25 ]] &&
   grep -qE "^attention_forward( +[0-9.]+ GF/s +[0-9]+% ){$(wc -w <<< "$levels")}$" <<< "$out"; then
  passes=$((passes+1)); else echo "FAIL bench kernels:"; echo "$out"; fails=$((fails+1)); fi
expect bench-kernels-level "this CPU does not run level 'neon'"   "$z3d" bench kernels --config $tiny --levels neon
# bench kernels --backend: one backend's kernels (the same 25 rows) and every GEMM of the micro-batch
# (15 for GPT-2), each timed there against the device's bounds (how a GPU is read; the host here)
if out=$(timeout 120 "$z3d" bench kernels --config $tiny --seconds 0.01 --backend host 2>&1) &&
   grep -qE "^# bounds: copy bandwidth [0-9.]+ GB/s \(64 MiB copies through the backend\); peak [0-9.]+ TFLOP/s" <<< "$out" &&
   [[ $(grep -cE "^[a-z_0-9]+( \(\+bias\))? +[0-9.]+ +[0-9.]+ (TF|GB)/s +[0-9.]+%$" <<< "$out") == 25 ]] &&
   grep -qE "^attention_backward +[0-9.]+ +[0-9.]+ TF/s +[0-9.]+%$" <<< "$out" &&
   [[ $(grep -cE "^[a-z ]+ (fwd|dx|dW) [0-9]+x[0-9]+x[0-9]+ +[0-9.]+ +[0-9.]+ TF/s +[0-9.]+%$" <<< "$out") == 15 ]]; then
  passes=$((passes+1)); else echo "FAIL bench kernels --backend host:"; echo "$out"; fails=$((fails+1)); fi
expect bench-kernels-both "give one of them"   "$z3d" bench kernels --config $tiny --levels avx2 --backend host
# compute.isa / ZERO3D_ISA: a level this build has not, or (on a CPU without AVX-512) one above the
# CPU, is refused in one line that names the levels there are
expect isa-not-built      "compute.isa=generic: no such level in this build; the levels built in: avx512, avx2, sse2" \
                                                                     train $tiny --set 'compute.isa="generic"'
expect isa-env            "ZERO3D_ISA=avx9: no such level in this build" env ZERO3D_ISA=avx9 "$z3d" train $tiny --run-dir "$tmp/run"
expect isa-choice         "compute.isa"                            train $tiny --set 'compute.isa="avx9"'
if ! grep -qw avx512f /proc/cpuinfo; then
  expect isa-above-cpu    "compute.isa=avx512: this CPU"           train $tiny --set 'compute.isa="avx512"'
fi
expect compute-gemm       'compute.gemm'                          train $tiny --set 'compute.gemm="mkl"'
# found by a hostile probe (issue #11)
printf '{"train_steps": 3, "gradient_clipping": 1e400}' > "$tmp/huge.json"
printf '{"train_steps": 3, "train_steps": 4}' > "$tmp/dup.json"
expect set-overflow       "--set train_steps=1e400: number overflow" train $tiny --set train_steps=1e400
expect file-overflow      "huge.json: invalid JSON: number overflow" train "$tmp/huge.json"
expect duplicate-key      "key 'train_steps' appears twice"        train "$tmp/dup.json"
expect set-swallows       "option --set needs a value"             train $tiny --set --deepspeed "$tmp/dup.json"
expect old-cpu-offload    "offload_optimizer.device ('zero_optimization.cpu_offload') = \"cpu\" needs zero_optimization.stage 1, 2 or 3" \
                                                                     train $tiny --set zero_optimization.cpu_offload=true
# --help-config: the schema alone; after CONFIG every resolved value with its source. It writes
# nothing: run from an empty working directory (where the default runs/ would appear), it stays
# empty. The repository's own runs/ (a user's quickstart) is no business of this test.
mkdir "$tmp/cwd"; src=$PWD
if out=$(cd "$tmp/cwd" && "$z3d" train --help-config 2>&1) && grep -q "^zero_optimization.contiguous_gradients .*\[only the value zero3d implements\]" <<< "$out" &&
   grep -q "^data.val_interval .*0 = only at step 0 and at the last step" <<< "$out" &&
   grep -q "^activation_checkpointing.number_checkpoints .*no default" <<< "$out" &&
   out=$(cd "$tmp/cwd" && "$z3d" train "$src/$tiny" --set optimizer.params.lr=1e-3 --help-config 2>&1) &&
   grep -qE "^optimizer.params.lr +=  ?0.001 +\(--set optimizer.params.lr=1e-3\)" <<< "$out" &&
   grep -qE "^comm_timeout_s +.*\(default\)" <<< "$out" && [[ -z $(ls -A "$tmp/cwd") ]]; then passes=$((passes+1)); else echo "FAIL --help-config:"; echo "$out" | head; ls -A "$tmp/cwd"; fails=$((fails+1)); fi

echo "cli errors: $passes passed, $fails failed"
[[ $fails -eq 0 ]]
