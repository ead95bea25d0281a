#!/usr/bin/env bash
# tests/bitwise_layouts.sh: does a change leave training bitwise unchanged? For refactors.
#
# Trains gpt-tiny for a few steps in 12 cases (layouts, ZeRO stages, precisions, gradient
# accumulation, activation checkpointing, offload to nvme, a resume) and prints, per case, one
# line of digests: the hash of every step's loss, grad norm, lr and loss scale as the metrics
# record printed them (%.17g, so every bit), and the hash of every dataset of the final checkpoint
# (weights and optimizer state, by name).
#
#   tests/bitwise_layouts.sh [ZERO3D] > after.txt      # ZERO3D default build/bin/zero3d
#   git stash; cmake --build build; tests/bitwise_layouts.sh > before.txt; git stash pop
#   diff before.txt after.txt                            # empty: unchanged to the last bit
#
# Or with two binaries: copy the old one aside first (cp build/bin/zero3d /tmp/zero3d.before).
# Not run by tests/run.sh (8 ranks on 2 cores for several minutes): run it around a refactor.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
z3d=$(realpath "${1:-$root/build/bin/zero3d}")
[[ -x $z3d ]] || { echo "bitwise_layouts.sh: no zero3d binary at $z3d" >&2; exit 2; }
cd "$root"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
[[ $(id -u) == 0 ]] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bitwise.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

steps=6
# name | ranks | --set overrides
cases=(
  "single-fp32|1|"
  "dp2-z1|2|zero_optimization.stage=1"
  "dp2-z2-fp16|2|zero_optimization.stage=2 fp16.enabled=true"
  "dp2-z3-bf16|2|zero_optimization.stage=3 bf16.enabled=true"
  "tp2-z0|2|tensor_parallel.tp_size=2"
  "pp2-z1-gas2|2|pipeline_parallel.pp_size=2 zero_optimization.stage=1 gradient_accumulation_steps=2"
  "dp2pp2-z2-gas4|4|pipeline_parallel.pp_size=2 zero_optimization.stage=2 gradient_accumulation_steps=4"
  "tp2dp2-z3-bf16|4|tensor_parallel.tp_size=2 zero_optimization.stage=3 bf16.enabled=true"
  "tp2pp2-z1-bf16-ac|4|tensor_parallel.tp_size=2 pipeline_parallel.pp_size=2 zero_optimization.stage=1 bf16.enabled=true activation_checkpointing.enabled=true gradient_accumulation_steps=2"
  "dp2-z3-nvme|2|zero_optimization.stage=3 zero_optimization.offload_optimizer.device=nvme zero_optimization.offload_optimizer.nvme_path=$tmp zero_optimization.offload_param.device=nvme zero_optimization.offload_param.nvme_path=$tmp"
  "dp2tp2pp2-z1-fp16|8|tensor_parallel.tp_size=2 pipeline_parallel.pp_size=2 zero_optimization.stage=1 fp16.enabled=true gradient_accumulation_steps=2"
  "dp2-z2-resume|2|zero_optimization.stage=2"
)

train() {  # train RUN_DIR RANKS STEPS [--set K=V...]
  local dir=$1 ranks=$2 n=$3; shift 3
  mpirun --oversubscribe -np "$ranks" "$z3d" train input/gpt-tiny.json --run-dir "$dir" \
    --set train_steps="$n" --set steps_per_print=100 --set 'data.val=""' "$@" > "$dir.log" 2>&1 ||
    { echo "bitwise_layouts.sh: $dir failed:" >&2; tail -n 20 "$dir.log" >&2; exit 1; }
}

for c in "${cases[@]}"; do
  IFS='|' read -r name ranks sets <<< "$c"
  args=()
  for kv in $sets; do args+=(--set "$kv"); done
  d=$tmp/$name
  if [[ $name == *resume ]]; then  # half the steps, then a resume to the end: the saved state is exact
    train "$d" "$ranks" $((steps / 2)) "${args[@]}" --set checkpoint.save_interval=$((steps / 2))
    train "$d" "$ranks" "$steps" "${args[@]}" --set checkpoint.save_interval="$steps" --set checkpoint.load=auto
  else
    train "$d" "$ranks" "$steps" "${args[@]}" --set checkpoint.save_interval="$steps"
  fi
  steps_hash=$(/usr/bin/python3 - "$d/metrics.jsonl" <<'PY'
import hashlib, sys
sys.path.insert(0, "postprocess")
from metrics_file import records
rows = [" ".join(repr(r[k]) for k in ("step", "loss", "grad_norm", "lr", "loss_scale", "skipped"))
        for r in records(sys.argv[1], "train")]
print(len(rows), hashlib.sha256("\n".join(rows).encode()).hexdigest()[:16], rows[-1].split()[1])
PY
)
  # every dataset of the final checkpoint (weights, Adam state), by name: its bytes
  state_hash=$(/usr/bin/python3 - "$d/checkpoints" <<'PY'
import hashlib, sys, h5py
d = sys.argv[1]
name = open(d + "/latest").read().strip()
h = hashlib.sha256()
with h5py.File(d + "/" + name, "r") as f:
    items = []
    f.visititems(lambda k, v: items.append(k) if isinstance(v, h5py.Dataset) else None)
    for k in sorted(items):
        h.update(k.encode())
        h.update(f[k][()].tobytes())
print(h.hexdigest()[:16])
PY
)
  printf '%-20s steps %s state %s\n' "$name" "$steps_hash" "$state_hash"
done
