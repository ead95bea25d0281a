#!/usr/bin/env bash
# bf16 activations (compute.activations=bf16: activations and their gradients stored in bf16, fp32
# math, statistics and logits; kernels/tensor.h) on the host, which stages them through its fp32
# loops exactly as a GPU's bf16 kernels compute them, so every path of the GPU's default runs here:
# - one rank: within 2e-3 relative of fp32 activations over 20 steps (bf16's tolerance against
#   fp32 in test_precision.sh), the run record says bf16, the activations take at most 0.6x the
#   bytes, and bf16 activations without bf16.enabled are refused (exit 2);
# - layouts (GPT-2: dp 2 with ZeRO 1-3, tp 2, pp 2 with 1F1B, tp 2 x pp 2 with activation
#   checkpointing, tp 2 x dp 2 ZeRO-3; Llama: tp 2 x dp 2): within 1e-3 relative of the same
#   model on one rank (bf16 partial sums are rounded where tp and pp cut the model);
# - a resume equals the uninterrupted run bit for bit, and a reshard onto another layout goes on
#   within the layout tolerance;
# - behind device-memory walls (the pipeline's bf16 sends staged as a GPU's are) the losses equal
#   the host's bit for bit.
# usage: test_bf16_activations.sh ZERO3D_BINARY SOURCE_DIR
set -eu
source "$(dirname "$0")/common.sh" "$@"
b16=(--set bf16.enabled=true --set compute.activations='"bf16"')
run() { train_layout input/gpt-tiny.json "$@"; }  # run NAME TP PP DP GAS [--set ...]
run fp32acts 1 1 1 1 --set bf16.enabled=true --set compute.activations='"fp32"'
run ref 1 1 1 1 "${b16[@]}" --set checkpoint.save_interval=10
run dp2_s1 1 1 2 1 "${b16[@]}" --set zero_optimization.stage=1
run dp2_s2 1 1 2 1 "${b16[@]}" --set zero_optimization.stage=2
run dp2_s3 1 1 2 1 "${b16[@]}" --set zero_optimization.stage=3 --set zero_optimization.stage3_param_persistence_threshold=0
run tp2 2 1 1 1 "${b16[@]}"
run pp2_gas2 1 2 1 2 "${b16[@]}" --set zero_optimization.stage=1
run tp2pp2_ac 2 2 1 2 "${b16[@]}" --set activation_checkpointing.enabled=true
run tp2dp2_s3 2 1 2 1 "${b16[@]}" --set zero_optimization.stage=3
train_layout input/llama-tiny.json llama_ref 1 1 1 1 "${b16[@]}"
train_layout input/llama-tiny.json llama_tp2dp2 2 1 2 1 "${b16[@]}" --set zero_optimization.stage=2
# resume: the reference's step-10 checkpoint on the same layout, and on tp 2 x pp 2
run resumed 1 1 1 1 "${b16[@]}" --set checkpoint.load=\""$tmp/ref/checkpoints/step_00000010.h5"\"
run resharded 2 2 1 2 "${b16[@]}" --set checkpoint.load=\""$tmp/ref/checkpoints/step_00000010.h5"\"
ZERO3D_DEVICE_WALLS=1 run walled_pp2 1 2 1 2 "${b16[@]}" --set zero_optimization.stage=1
grep -q "behind device-memory walls" "$tmp/walled_pp2.log" || fail "the walled run did not use the walled backend"

expect_exit 2 refused 'compute.activations="bf16" needs bf16.enabled=true' \
  "$z3d" train input/gpt-tiny.json --run-dir "$tmp/refused" --set compute.activations='"bf16"'

/usr/bin/python3 - "$tmp" <<'PY'
import sys
from z3dcheck import Checks, max_rel, run_and_train, train
tmp = sys.argv[1]
check = Checks("bf16_activations")
run, ref = run_and_train(f"{tmp}/ref")
run32, fp32 = run_and_train(f"{tmp}/fp32acts")
check(run["activations"] == "bf16" and run32["activations"] == "fp32", f"run records: {run['activations']}, {run32['activations']}")
err = max_rel(ref, fp32)
print(f"bf16 activations against fp32: {err:.2e} relative")
check(len(ref) == 20 and err <= 2e-3, f"bf16 activations: loss {err:.2e} relative to fp32 activations")
ratio = run["mem_activations_bytes"] / run32["mem_activations_bytes"]
print(f"activation bytes: {ratio:.3f} of fp32's")
check(ratio <= 0.6, f"activation bytes: {ratio:.3f} of fp32's")
for name, base in [("dp2_s1", "ref"), ("dp2_s2", "ref"), ("dp2_s3", "ref"), ("tp2", "ref"), ("pp2_gas2", "ref"),
                   ("tp2pp2_ac", "ref"), ("tp2dp2_s3", "ref"), ("llama_tp2dp2", "llama_ref")]:
    r, tr = run_and_train(f"{tmp}/{name}")
    err = max_rel(tr, train(f"{tmp}/{base}"))
    print(f"{name}: {err:.2e} relative to 1 rank")
    check(r["activations"] == "bf16" and len(tr) == 20 and err <= 1e-3, f"{name}: loss {err:.2e} relative to 1 rank")
resumed = train(f"{tmp}/resumed")
check([r["loss"] for r in resumed] == [r["loss"] for r in ref[10:]], "resume: losses of steps 11-20 bit for bit")
err = max_rel(train(f"{tmp}/resharded"), ref[10:])
check(err <= 1e-3, f"reshard onto tp 2 x pp 2: loss {err:.2e} relative to the uninterrupted run")
walled, host = train(f"{tmp}/walled_pp2"), train(f"{tmp}/pp2_gas2")
check([r["loss"] for r in walled] == [r["loss"] for r in host], "behind device-memory walls: losses bit for bit")
check.exit()
PY
