#!/usr/bin/env bash
# Real-world ds_config.json files (tests/ds_configs/, each cited in SOURCES.md there) overlaid on
# gpt-tiny with --deepspeed and trained for 3 steps on 2 ranks: each one runs, or stops with exit 2
# and the documented one-line message for the DeepSpeed feature zero3d refuses. A run that is
# accepted must also have written config.json with where each value came from.
# usage: test_ds_configs.sh ZERO3D_BINARY SOURCE_DIR
set -u
source "$(dirname "$0")/common.sh" "$@"
fails=0 passes=0

# file -> "run", or "refuse:<substring of the error line>"
declare -A expect=(
  [bing_bert_squad_bsz24.json]="refuse:'optimizer.params.max_grad_norm' is a DeepSpeed key zero3d does not implement"
  [cifar_ds_config.json]="refuse:'fp16.fp16_master_weights_and_grads' = true is a DeepSpeed setting zero3d does not implement"
  [ds_docs_config_json.json]="run"
  [ds_tutorial_zero1.json]="run"
  [ds_tutorial_zero2.json]="run"
  [ds_tutorial_zero3_infinity.json]="run"
  [hf_autotuning_fp16_z2_auto.json]="run"
  [hf_autotuning_z1_auto.json]="run"
  [hf_ds_config_zero2.json]="run"
  [hf_ds_config_zero3.json]="run"
  [megatron_ds_rebase_zero1.json]="run"
  [megatron_ds_sp_zero3.json]="run"
  [megatron_ds_zero2_bf16.json]="run"
  [megatron_lm_ds_zero2.json]="run"
  [megatron_lm_ds_zero2_cpu_offload.json]="run"
  [megatron_v115_zero3.json]="refuse:unknown config key 'zero_optimization.stage3_param_persitence_threshold' (did you mean 'zero_optimization.stage3_param_persistence_threshold'?)"
  [seed_zero1_warmuplr.json]="run"
  [seed_zero2_cpu_offload_false.json]="run"
  [seed_zero3_cpu_offload_false.json]="run"
  [megatron_v115_zero_infinity.json]="refuse:unknown config key 'zero_optimization.stage3_param_persitance_threshold' (did you mean 'zero_optimization.stage3_param_persistence_threshold'?)"
)
n=0
for f in tests/ds_configs/*.json; do
  name=$(basename "$f")
  want=${expect[$name]:-}
  [[ -n $want ]] || { echo "FAIL $name: no expectation in this script"; fails=$((fails + 1)); continue; }
  n=$((n + 1))
  rc=0
  timeout 300 $MPIRUN -np 2 "$z3d" train input/gpt-tiny.json --deepspeed "$f" --run-dir "$tmp/$name" \
    --peak-flops 1e11 --set train_steps=3 --set 'data.val=""' > "$tmp/$name.log" 2>&1 || rc=$?
  if [[ $want == run ]]; then
    if [[ $rc -ne 0 ]] || ! grep -q "step      3/3" "$tmp/$name.log" || [[ ! -s $tmp/$name/config.json ]]; then
      echo "FAIL $name: expected a 3-step run, exit $rc:"; tail -5 "$tmp/$name.log"; fails=$((fails + 1)); continue
    fi
    grep -q '"provenance"' "$tmp/$name/config.json" || { echo "FAIL $name: no provenance"; fails=$((fails + 1)); continue; }
    echo "ok $name: runs ($(grep -m1 -o 'ZeRO stage [0-3], [a-z0-9]*' "$tmp/$name.log"))"
  else
    msg=${want#refuse:}
    if [[ $rc -ne 2 ]] || ! grep -qF -- "$msg" "$tmp/$name.log" || [[ $(grep -c "zero3d: error" "$tmp/$name.log") -lt 1 ]]; then
      echo "FAIL $name: expected exit 2 naming '$msg', got exit $rc:"; tail -5 "$tmp/$name.log"; fails=$((fails + 1))
      continue
    fi
    echo "ok $name: refused: $(grep -m1 'zero3d: error' "$tmp/$name.log" | cut -c1-160)"
  fi
  passes=$((passes + 1))
done
# keys that cannot change the result here are named once, in one notice at start
notice="zero3d: notice: accepted without effect here (see --help-config): "
if grep -F "$notice" "$tmp/megatron_ds_zero2_bf16.json.log" | grep -q "activation_checkpointing.partition_activations"; then
  passes=$((passes + 1))
else
  echo "FAIL megatron_ds_zero2_bf16.json: no notice naming activation_checkpointing.partition_activations"
  fails=$((fails + 1))
fi
((n >= 12)) || { echo "FAIL: only $n configs in tests/ds_configs"; fails=$((fails + 1)); }
echo "$passes passed, $fails failed"
((fails == 0))
