#!/usr/bin/env bash
# Hugging Face export, checked against an independent implementation: for gpt-tiny (GPT2LMHeadModel)
# and llama-tiny (LlamaForCausalLM), one step at learning rate 0 (WarmupCosineLR's first) with
# Adam's beta1 = 0 and no clipping, so the step-1 checkpoint holds the initial weights and, in
# /optimizer/exp_avg, that step's gradient; on one rank and on tensor- and pipeline-parallel layouts.
# `zero3d ckpt export --format hf` of the single-rank checkpoint goes to tests/cli/peer_check.py,
# which loads it into jobscripts/bench_peer.py's PyTorch model and compares the export (names,
# shapes, bitwise round trip), the loss (1e-5 relative) and every layout's gradients (1e-5);
# `zero3d eval` gives the step-1 loss again, and `zero3d generate` (greedy, KV cache) the tokens
# PyTorch's greedy decoding picks; checkpoint.init_from starts another seed on tp 2 x pp 2 from the
# export, to the bit (export -> import -> export), and refuses a directory of another model.
# Skipped (exit 77) without python3-torch and python3-h5py.
# usage: test_hf.sh ZERO3D_BINARY SOURCE_DIR
set -eu
source "$(dirname "$0")/common.sh" "$@"
/usr/bin/python3 -c "import torch, h5py" 2>/dev/null || { echo "skipped: no python3-torch or python3-h5py"; exit 77; }
# One sequence of 65 tokens: every sample (every rank's) is it.
/usr/bin/python3 - "$tmp/one.bin" <<'PY'
import sys, numpy as np
rng = np.random.default_rng(7)
header = np.zeros(256, np.int32); header[:3] = [20240520, 1, 65]
with open(sys.argv[1], "wb") as f:
    f.write(header.tobytes()); f.write(rng.integers(0, 256, 65).astype(np.uint16).tobytes())
PY
step1() {  # step1 CONFIG NAME TP PP [--set ...]: one step, its checkpoint
  local config=$1 name=$2 tp=$3 pp=$4; shift 4
  timeout 120 $MPIRUN -np $((tp * pp)) "$z3d" train "$config" --run-dir "$tmp/$name" --set data.train="$tmp/one.bin" \
    --set data.val="" --set train_steps=1 --set checkpoint.save_interval=1 --set gradient_clipping=0 \
    --set optimizer.params.betas=[0.0,0.95] --set train_batch_size=1 --set train_micro_batch_size_per_gpu=1 \
    --set tensor_parallel.tp_size=$tp --set pipeline_parallel.pp_size=$pp --set comm_timeout_s=60 "$@" \
    > "$tmp/$name.log" 2>&1 || { echo "run $name failed:"; tail -20 "$tmp/$name.log"; exit 1; }
}
for model in gpt llama; do
  config=input/$model-tiny.json
  step1 $config $model-1 1 1
  step1 $config $model-tp2 2 1
  step1 $config $model-pp2 1 2
  step1 $config $model-tp2pp2 2 2 --set zero_optimization.stage=0
  # 256 rows padded to 288: tp rank 1 holds 112 of the vocabulary and 32 rows that make no logit.
  step1 $config $model-tp2pad 2 1 --set model.make_vocab_size_divisible_by=96
  timeout 60 "$z3d" ckpt export "$tmp/$model-1/checkpoints" --format hf --out "$tmp/$model-hf" > "$tmp/$model-export.log" 2>&1 ||
    { cat "$tmp/$model-export.log"; fail "export of $model"; }
  ckpts=()
  for l in 1 tp2 pp2 tp2pp2 tp2pad; do ckpts+=("$tmp/$model-$l/checkpoints/step_00000001.h5"); done
  # zero3d eval runs the training forward: the step-1 loss again.
  timeout 60 "$z3d" eval "$tmp/$model-1/checkpoints" --tokens "$tmp/one.bin" --micro-batch 1 > "$tmp/$model-eval.log" 2>&1 ||
    { cat "$tmp/$model-eval.log"; fail "eval of $model"; }
  /usr/bin/python3 - "$tmp/$model-eval.log" "$tmp/$model-1/metrics.jsonl" <<'PY' || fail "eval of $model"
import json, sys
from z3dcheck import rel, train
ev = next(json.loads(l) for l in open(sys.argv[1]) if l.startswith("{"))
step1 = train(sys.argv[2])[0]["loss"]
err = rel(ev["loss"], step1)
print(f"eval: loss {ev['loss']:.9g} vs the step-1 loss {step1:.9g} ({err:.1e}), perplexity {ev['perplexity']:.4g}")
sys.exit(0 if err <= 1e-6 and ev["tokens"] == 64 else 1)
PY
  # zero3d generate, greedy, with its KV cache: PyTorch (whole prefix each time) picks the same tokens.
  prompt=$(/usr/bin/python3 -c "import numpy as np; print(','.join(map(str, np.fromfile('$tmp/one.bin', np.uint16, offset=1024)[:12])))")
  generated=$(timeout 60 "$z3d" generate "$tmp/$model-1/checkpoints" --prompt-ids "$prompt" --max-tokens 30 \
    --temperature 0 --ids 2> "$tmp/$model-generate.log") || { cat "$tmp/$model-generate.log"; fail "generate of $model"; }
  PEER_GENERATED="$generated" PEER_PROMPT=12 /usr/bin/python3 tests/cli/peer_check.py "$tmp/$model-hf" "$tmp/one.bin" \
    "$tmp/$model-1/metrics.jsonl" "${ckpts[@]}"
  # checkpoint.init_from: another seed on tp 2 x pp 2 starts from the export: the first loss again, and
  # exporting that run's step-1 weights gives the same tensors to the bit (export -> import -> export).
  step1 $config $model-from 2 2 --set seed=99 --set zero_optimization.stage=0 --set checkpoint.init_from="$tmp/$model-hf" \
    --set model.make_vocab_size_divisible_by=96
  timeout 60 "$z3d" ckpt export "$tmp/$model-from/checkpoints" --format hf --out "$tmp/$model-hf2" > "$tmp/$model-export2.log" 2>&1 ||
    { cat "$tmp/$model-export2.log"; fail "second export of $model"; }
  /usr/bin/python3 - "$tmp/$model-hf" "$tmp/$model-hf2" "$tmp/$model-1/metrics.jsonl" "$tmp/$model-from/metrics.jsonl" <<'PY' ||
import sys
from peer_check import f32_tensors
from z3dcheck import rel, train
a, b = (f32_tensors(d + "/model.safetensors") for d in sys.argv[1:3])
same = a.keys() == b.keys() and all(a[k].shape == b[k].shape and a[k].tobytes() == b[k].tobytes() for k in a)
loss = [train(p)[0]["loss"] for p in sys.argv[3:5]]
err = rel(loss[1], loss[0])
print(f"init_from: {len(b)} tensors {'bitwise equal' if same else 'DIFFER'} after export -> import -> export; "
      f"first loss {loss[1]:.9g} vs {loss[0]:.9g} ({err:.1e})")
sys.exit(0 if same and err <= 1e-6 else 1)
PY
    fail "init_from round trip of $model"
done
# A directory that is not there: the system's words, before anything runs.
expect_exit 2 init_from_missing "cannot read checkpoint.init_from's config '.*/nowhere/config.json': No such file or directory" \
  $MPIRUN -np 1 "$z3d" train input/llama-tiny.json --run-dir "$tmp/missing" --set checkpoint.init_from="$tmp/nowhere"
# init_from checks the directory against the run's model before anything runs.
expect_exit 2 init_from_mismatch "init_from: .*num_key_value_heads = 2, but this run's model needs 4" \
  $MPIRUN -np 1 "$z3d" train input/llama-tiny.json --run-dir "$tmp/mismatch" --set model.num_key_value_heads=4 \
  --set checkpoint.init_from="$tmp/llama-hf"
# A model transformers has no class for is refused, with the way out named.
step1 input/gpt-tiny.json mixed 1 1 --set model.position=rope
expect_exit 2 export_mixed "no class for it.*--format safetensors" \
  "$z3d" ckpt export "$tmp/mixed/checkpoints" --format hf --out "$tmp/mixed-hf"
