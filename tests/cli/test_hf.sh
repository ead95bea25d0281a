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
# Directories as the hub ships them (tests/cli/hub_dir.py re-lays the exports: prefixes, Conv1D,
# buffers, shards with their index, BF16 and F16, a longer context, a tied Llama, the config's
# defaults left out) load to the first loss of the same weights from zero3d's own export, to the bit;
# a Llama with rope_scaling "llama3" matches the peer (transformers' formula); what init_from
# refuses is named (a shape, a missing shard, pytorch_model.bin, an unknown tensor, ...).
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
  local launch=($MPIRUN -np $((tp * pp)))
  ((tp * pp > 1)) || launch=()  # one rank: no launcher to start and tear down
  timeout 120 "${launch[@]}" "$z3d" train "$config" --run-dir "$tmp/$name" --set data.train="$tmp/one.bin" \
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
from z3dcheck import f32_tensors, rel, train
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
# ---- checkpoint.init_from of directories as the hub ships them (tests/cli/hub_dir.py re-lays each export) ----
# Each loads on one rank, and its first loss EQUALS, to the bit, the loss of the same weights loaded
# from zero3d's own export (16-bit tensors: the export's values rounded alike, kept in F32).
same_first_loss() {  # same_first_loss RUN REFERENCE_RUN
  /usr/bin/python3 - "$tmp/$1/metrics.jsonl" "$tmp/$2/metrics.jsonl" "$1" "$2" <<'PY' || fail "init_from $1"
import sys
from z3dcheck import train
a, b = (train(p)[0]["loss"] for p in sys.argv[1:3])
print(f"{sys.argv[3]}: first loss {a!r}, from zero3d's export ({sys.argv[4]}) {b!r}: {'equal' if a == b else 'DIFFERENT'}")
sys.exit(0 if a == b else 1)
PY
}
/usr/bin/python3 - "$tmp" <<'PY'
import sys
from hub_dir import hub_dir, rounded
t = sys.argv[1]
# GPT-2 as openai-community/gpt2 ships it: no `transformer.` prefix, Conv1D (in, out), the attn.bias
# and attn.masked_bias buffers, lm_head.weight equal to the tied wte, a context of 128 positions for a
# run of 64; here in two shards with their index.
hub_dir(f"{t}/gpt-hf", f"{t}/gpt-hub", prefix=False, shards=2, positions=128, buffers=True, head="equal")
# Llama: `model.` names, grouped-query heads, rotary_emb.inv_freq buffers, three BF16 shards; the
# config without the keys at LlamaConfig's defaults (rope_theta, max_position_embeddings 2048, ...).
hub_dir(f"{t}/llama-hf", f"{t}/llama-hub", shards=3, dtype="BF16", buffers=True)
rounded(f"{t}/llama-hf", f"{t}/llama-bf16", "BF16")
# Llama tied, under LlamaModel's names (no prefix), with lm_head.weight equal to the embedding, F16.
hub_dir(f"{t}/llama-hf", f"{t}/llama-tied-hub", prefix=False, tie=True, head="equal", dtype="F16")
rounded(f"{t}/llama-hf", f"{t}/llama-tied-f16", "F16", tie=True)
PY
step1 input/gpt-tiny.json run-gpt-ref 1 1 --set checkpoint.init_from="$tmp/gpt-hf"
step1 input/gpt-tiny.json run-gpt-hub 1 1 --set checkpoint.init_from="$tmp/gpt-hub"
same_first_loss run-gpt-hub run-gpt-ref
step1 input/llama-tiny.json run-llama-ref 1 1 --set checkpoint.init_from="$tmp/llama-bf16"
step1 input/llama-tiny.json run-llama-hub 1 1 --set checkpoint.init_from="$tmp/llama-hub"
same_first_loss run-llama-hub run-llama-ref
step1 input/llama-tiny.json run-tied-ref 1 1 --set checkpoint.init_from="$tmp/llama-tied-f16" --set model.tie_word_embeddings=true
step1 input/llama-tiny.json run-tied-hub 1 1 --set checkpoint.init_from="$tmp/llama-tied-hub" --set model.tie_word_embeddings=true
same_first_loss run-tied-hub run-tied-ref

# rope_scaling "llama3" (Llama 3.1's frequencies): with original_max_position_embeddings 32 the
# head's 16 frequencies fall in all three of its bands (kept, blended, divided by factor). The peer
# computes them with transformers' _compute_llama3_parameters (jobscripts/bench_peer.py) from the
# export's config.json: the same loss, gradients and greedy tokens; the scaling changes the gradient.
llama3=(--set model.rope_scaling.rope_type=llama3 --set model.rope_scaling.factor=4
        --set model.rope_scaling.original_max_position_embeddings=32)
step1 input/llama-tiny.json llama3-1 1 1 "${llama3[@]}"
timeout 60 "$z3d" ckpt export "$tmp/llama3-1/checkpoints" --format hf --out "$tmp/llama3-hf" > "$tmp/llama3-export.log" 2>&1 ||
  { cat "$tmp/llama3-export.log"; fail "export of llama3"; }
generated=$(timeout 60 "$z3d" generate "$tmp/llama3-1/checkpoints" --prompt-ids "$prompt" --max-tokens 30 \
  --temperature 0 --ids 2> "$tmp/llama3-generate.log") || { cat "$tmp/llama3-generate.log"; fail "generate of llama3"; }
PEER_GENERATED="$generated" PEER_PROMPT=12 /usr/bin/python3 tests/cli/peer_check.py "$tmp/llama3-hf" "$tmp/one.bin" \
  "$tmp/llama3-1/metrics.jsonl" "$tmp/llama3-1/checkpoints/step_00000001.h5"
/usr/bin/python3 - "$tmp" <<'PY' || fail "llama3 rope_scaling"
import json, sys
import h5py, numpy as np
t = sys.argv[1]
rs = json.load(open(f"{t}/llama3-hf/config.json")).get("rope_scaling")
want = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32}
print(f"export's rope_scaling: {rs}")
name = "optimizer/exp_avg/h.0.attn.c_attn.weight"
g3, g = (h5py.File(f"{t}/{r}/checkpoints/step_00000001.h5")[name][...] for r in ("llama3-1", "llama-1"))
d = np.linalg.norm(g3 - g) / np.linalg.norm(g)
print(f"the scaling changes layer 0's q/k/v gradient by {d:.2e} (relative)")
sys.exit(0 if rs == want and d > 1e-3 else 1)
PY
step1 input/llama-tiny.json llama3-from 1 1 "${llama3[@]}" --set checkpoint.init_from="$tmp/llama3-hf"
same_first_loss llama3-from llama3-1
# transformers 5 writes rope_theta and the scaling as one rope_parameters object.
/usr/bin/python3 -c "from hub_dir import hub_dir; hub_dir('$tmp/llama3-hf', '$tmp/llama3-v5', config={'rope_scaling': None,
  'rope_parameters': {'rope_type': 'llama3', 'rope_theta': 10000.0, 'factor': 4.0, 'low_freq_factor': 1.0,
                      'high_freq_factor': 4.0, 'original_max_position_embeddings': 32}})"
step1 input/llama-tiny.json llama3-v5 1 1 "${llama3[@]}" --set checkpoint.init_from="$tmp/llama3-v5"
same_first_loss llama3-v5 llama3-1

# What init_from refuses, each named before anything runs (one process without mpirun, whose
# teardown after a failed rank costs seconds).
refuse() {  # refuse NAME CONFIG DIR PATTERN [ARGS...]
  local name=$1 config=$2 dir=$3 pattern=$4; shift 4
  expect_exit 2 "$name" "$pattern" "$z3d" train "$config" --run-dir "$tmp/run-$name" --set checkpoint.init_from="$dir" "$@"
}
/usr/bin/python3 - "$tmp" <<'PY'
import os, shutil, sys
from hub_dir import hub_dir
t = sys.argv[1]
hub_dir(f"{t}/gpt-hf", f"{t}/bad-shape", reshape=("transformer.h.1.mlp.c_fc.weight", [128, 500]))
hub_dir(f"{t}/gpt-hf", f"{t}/bad-shard", shards=2)
os.remove(f"{t}/bad-shard/model-00002-of-00002.safetensors")
os.makedirs(f"{t}/bad-pickle")
shutil.copy(f"{t}/gpt-hub/config.json", f"{t}/bad-pickle/config.json")
open(f"{t}/bad-pickle/pytorch_model.bin", "wb").close()
hub_dir(f"{t}/gpt-hf", f"{t}/bad-unknown", extra="transformer.h.0.attn.rotary")
hub_dir(f"{t}/gpt-hf", f"{t}/bad-head", head="other")
hub_dir(f"{t}/gpt-hf", f"{t}/bad-context", config={"n_positions": 32})
hub_dir(f"{t}/llama-hf", f"{t}/bad-nohead", drop="lm_head.weight")
hub_dir(f"{t}/llama-hf", f"{t}/bad-eps", config={"rms_norm_eps": None})
hub_dir(f"{t}/llama-hf", f"{t}/bad-mistral", config={"model_type": "mistral", "architectures": ["MistralForCausalLM"]})
hub_dir(f"{t}/llama-hf", f"{t}/bad-yarn", config={"rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
PY
refuse shape input/gpt-tiny.json "$tmp/bad-shape" \
  "bad-shape/model.safetensors': tensor 'transformer.h.1.mlp.c_fc.weight' has shape \[128,500\], but this run's model needs \[128,512\]"
refuse shard input/gpt-tiny.json "$tmp/bad-shard" \
  "model.safetensors.index.json' names shard '.*/bad-shard/model-00002-of-00002.safetensors', which is not there"
refuse pickle input/gpt-tiny.json "$tmp/bad-pickle" "holds pytorch_model.bin, PyTorch's pickle format.*safetensors"
refuse unknown input/gpt-tiny.json "$tmp/bad-unknown" "holds tensor 'transformer.h.0.attn.rotary', which GPT2LMHeadModel"
refuse head input/gpt-tiny.json "$tmp/bad-head" "holds lm_head.weight, which differs from the token embedding \(row 3, column 5"
refuse context input/gpt-tiny.json "$tmp/bad-context" "has n_positions = 32, fewer positions than this run's model.seq_len 64"
refuse nohead input/llama-tiny.json "$tmp/bad-nohead" "holds no tensor 'lm_head.weight': the model's LM head, untied"
refuse eps input/llama-tiny.json "$tmp/bad-eps" \
  "has rms_norm_eps = 1e-06 \(transformers' default: the file does not set it\), but this run's model.rms_norm_eps is 1e-05"
refuse mistral input/llama-tiny.json "$tmp/bad-mistral" "model_type \"mistral\".*zero3d reads GPT2LMHeadModel"
refuse yarn input/llama-tiny.json "$tmp/bad-yarn" "rope_scaling of type \"yarn\", which zero3d does not implement"
refuse unscaled input/llama-tiny.json "$tmp/llama3-hf" \
  "rope_scaling of type \"llama3\", but this run's model.rope_scaling.rope_type is \"default\""
refuse set-yarn input/llama-tiny.json "$tmp/llama-hf" "yarn" --set model.rope_scaling.rope_type=yarn

# A directory that is not there: the system's words, before anything runs.
expect_exit 2 init_from_missing "cannot read checkpoint.init_from's config '.*/nowhere/config.json': No such file or directory" \
  "$z3d" train input/llama-tiny.json --run-dir "$tmp/missing" --set checkpoint.init_from="$tmp/nowhere"
# init_from checks the directory against the run's model before anything runs.
expect_exit 2 init_from_mismatch "init_from: .*has num_key_value_heads = 2, but this run's model.num_key_value_heads is 4" \
  "$z3d" train input/llama-tiny.json --run-dir "$tmp/mismatch" --set model.num_key_value_heads=4 \
  --set checkpoint.init_from="$tmp/llama-hf"
# A model transformers has no class for is refused, with the way out named.
step1 input/gpt-tiny.json mixed 1 1 --set model.position=rope
expect_exit 2 export_mixed "no class for it.*--format safetensors" \
  "$z3d" ckpt export "$tmp/mixed/checkpoints" --format hf --out "$tmp/mixed-hf"
