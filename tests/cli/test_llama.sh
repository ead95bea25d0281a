#!/usr/bin/env bash
# The Llama family (input/llama-tiny.json: RMSNorm, RoPE, SwiGLU, 4 query heads on 2 key/value
# heads, no biases, untied LM head) on every kind of layout: tensor parallelism (splitting query and
# key/value heads and SwiGLU's [gate | up]), pipelines (the untied head on the last stage), ZeRO
# stages 0-3 with data parallelism, activation checkpointing, bf16. 20 steps with the same global
# batch: per-step losses within 1e-4 relative of the single-rank run (bf16: 2e-2); a checkpoint
# saved on one layout resumes on another and continues the single-rank run; a vocabulary padded
# for tensor parallelism gives the same losses; a tp that does not divide the key/value heads, and
# the other shapes the family cannot take, are refused before anything runs.
# usage: test_llama.sh ZERO3D_BINARY SOURCE_DIR
set -eu
source "$(dirname "$0")/common.sh" "$@"
run() { train_layout input/llama-tiny.json "$@"; }  # run NAME TP PP DP GAS [--set ...]
run ref 1 1 1 1 --set checkpoint.save_interval=10
run bf16_ref 1 1 1 1 --set bf16.enabled=true
run t2p1d1_s0 2 1 1 1
run t1p2d1_s0 1 2 1 2
run t1p4d1_s0 1 4 1 4
run t2p2d2_s1 2 2 2 2 --set zero_optimization.stage=1
run t1p1d4_s2 1 1 4 1 --set zero_optimization.stage=2
run t2p1d2_s3 2 1 2 1 --set zero_optimization.stage=3 --set zero_optimization.stage3_param_persistence_threshold=0
run t1p2d2_s3 1 2 2 2 --set zero_optimization.stage=3 --set zero_optimization.stage3_param_persistence_threshold=0
run t2p1d1_ckpt 2 1 1 1 --set activation_checkpointing.enabled=true
run t1p1d2_bf16 1 1 2 1 --set bf16.enabled=true --set zero_optimization.stage=2
# The vocabulary padded from 256 to 288 rows: the padding makes no logit, so the same losses.
run t2p1d1_pad 2 1 1 1 --set model.make_vocab_size_divisible_by=96
# Resume the single-rank run's step-10 checkpoint on tp 2 x pp 2 (resharded on load).
run resume_t2p2 2 2 1 2 --set checkpoint.load=\""$tmp/ref/checkpoints/step_00000010.h5"\" --set zero_optimization.stage=0
/usr/bin/python3 - "$tmp" <<'PY'
import sys, glob, os
from z3dcheck import Checks, max_rel, train as run_train
tmp = sys.argv[1]
def train(name): return run_train(f"{tmp}/{name}")
ref, bf = train("ref"), train("bf16_ref")
check = Checks("llama")
for d in sorted(glob.glob(f"{tmp}/t*/")):
    name = os.path.basename(d.rstrip("/"))
    tr = train(name)
    base, tol = (bf, 2e-2) if "bf16" in name else (ref, 1e-4)
    err = max_rel(tr, base)
    check(len(tr) == 20 and err <= tol, f"{name}: loss {err:.2e} relative to 1 rank (tolerance {tol:g})")
    print(f"{name}: max relative loss difference {err:.2e}")
res = train("resume_t2p2")
err = max_rel(res, ref[10:])
check([r["step"] for r in res] == list(range(11, 21)) and err <= 1e-4, f"resume on tp 2 x pp 2: {err:.2e}")
print(f"resume_t2p2: steps {res[0]['step']}-{res[-1]['step']}, max relative loss difference {err:.2e}")
check(ref[-1]["loss"] < ref[0]["loss"] - 0.5, f"the loss falls: {ref[0]['loss']:.3f} -> {ref[-1]['loss']:.3f}")
check.exit()
PY
# A tp that does not divide num_key_value_heads: refused with the keys named, nothing run.
expect_exit 2 tp-kv-heads "model.num_key_value_heads 2 must be divisible by tensor_parallel.tp_size 4" \
  $MPIRUN -np 4 "$z3d" train input/llama-tiny.json --run-dir "$tmp/refused" --set tensor_parallel.tp_size=4
[[ ! -e $tmp/refused/metrics.jsonl ]] || fail "the refused run wrote metrics"
# The other shapes the family cannot take, refused by the dry run with the keys and the reason.
refuse() { expect_exit 2 "$1" "$2" "$z3d" train input/llama-tiny.json --dry-run --ranks 4 --run-dir "$tmp/bad" "${@:3}"; }
refuse kv-heads "model.n_head 4 must be divisible by model.num_key_value_heads 3" --set model.num_key_value_heads=3
refuse mlp-width "model.intermediate_size 385 must be divisible by tensor_parallel.tp_size 2" \
  --set model.intermediate_size=385 --set tensor_parallel.tp_size=2
refuse odd-rope "rotary embeddings need an even head width; d_model / n_head is 33" \
  --set model.d_model=132 --set model.num_key_value_heads=4
refuse theta-alone "'model.rope_theta' does not apply to model.position \"learned\"" \
  --set model.position=learned --set model.rope_theta=10000
refuse pad-odd "the embedding's 259 rows .* must be divisible by tensor_parallel.tp_size 2" \
  --set tensor_parallel.tp_size=2 --set model.make_vocab_size_divisible_by=7
refuse pad-rank "128 of padding, a whole tensor-parallel rank's share \(96 rows\) or more" \
  --set tensor_parallel.tp_size=4 --set model.num_key_value_heads=4 --set model.make_vocab_size_divisible_by=384
