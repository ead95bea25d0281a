#!/usr/bin/env bash
# jobscripts/sweep.sh STUDY_DIR LAYOUTS [SBATCH_ARGS...] -- CONFIG [TRAIN_ARGS...]: a scaling study
# as one Slurm job per layout (train.sbatch), each training into STUDY_DIR/<name>/; writes
# STUDY_DIR/study.json for postprocess/scaling.py and prints how to run it.
#
# LAYOUTS is a text file (or - for stdin), one run per line, '#' starts a comment:
#   NAME   MODE          NODES TP PP DP STAGE MICRO [GAS [EXTRA zero3d train ARGS...]]
#   dp1    strong,weak   1     1  1  1  1     8
#   dp2    strong        1     1  1  2  1     4
#   dp4    strong        1     1  1  4  1     2
#   w-dp4  weak          1     1  1  4  1     8
#   tp2    strong        1     2  1  2  1     4
#   pp2    strong        1     1  2  2  2     2     2
#   n4-tp8 strong        4     8  1  4  3     4     1   --set bf16.enabled=true
# MODE: strong (same global batch, more ranks), weak (same batch per replica), or strong,weak (both
# series, e.g. the single-rank base). Ranks = TP x PP x DP, spread evenly over NODES. STAGE is the
# ZeRO stage, MICRO the micro-batch per rank, GAS the gradient-accumulation steps (default 1; give
# pipeline runs GAS >= PP), so the global batch is MICRO x GAS x DP. EXTRA is split at spaces.
#
# SBATCH_ARGS go to every job (after the layout's own, so they win): --time, --partition, -O to run
# more ranks than cores, --gpus-per-node, ... TRAIN_ARGS go to every run: the config first, then e.g.
# --set train_steps=50. Each job gets --exclusive (whole nodes, so the timings are the layout's
# alone; SWEEP_EXCLUSIVE=0 drops it) and its output in STUDY_DIR/<name>.out.
#
#   jobscripts/sweep.sh runs/scaling layouts.txt --time=00:30:00 -- input/gpt2-124m.json --set train_steps=50
#   /usr/bin/python3 postprocess/scaling.py runs/scaling          # when the jobs are done
#
# Prints "<name> <job id>" per run. Submit from the repository root, as for train.sbatch.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
usage() { echo "usage: sweep.sh STUDY_DIR LAYOUTS [SBATCH_ARGS...] -- CONFIG [TRAIN_ARGS...]" >&2; exit 2; }
(($# >= 2)) || usage
study=$1 layouts=$2
shift 2
sbatch_args=()
while (($#)) && [[ $1 != -- ]]; do sbatch_args+=("$1"); shift; done
[[ ${1:-} == -- ]] || usage
shift
(($#)) || usage
err() { echo "sweep.sh: $layouts:$lineno: $*" >&2; exit 2; }
[[ $layouts == - || -r $layouts ]] || { echo "sweep.sh: cannot read layouts file '$layouts'" >&2; exit 2; }
int='^[1-9][0-9]*$'

# ---- read and check every line before submitting anything ----
names=() lines=()
lineno=0
while IFS= read -r line || [[ -n $line ]]; do
  lineno=$((lineno + 1))
  line=${line%%#*}
  read -r -a f <<< "$line"
  ((${#f[@]} == 0)) && continue
  ((${#f[@]} >= 8)) || err "expected NAME MODE NODES TP PP DP STAGE MICRO [GAS [ARGS...]], got '${f[*]}'"
  name=${f[0]} mode=${f[1]}
  [[ $name =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || err "name '$name': use letters, digits, '.', '_' and '-'"
  [[ $mode =~ ^(strong|weak)(,(strong|weak))?$ ]] || err "mode '$mode': strong, weak or strong,weak"
  for v in "${f[@]:2:4}" "${f[7]}" "${f[8]:-1}"; do [[ $v =~ $int ]] || err "'$v' is not a positive integer"; done
  [[ ${f[6]} =~ ^[0-3]$ ]] || err "ZeRO stage '${f[6]}' is not 0-3"
  ranks=$((f[3] * f[4] * f[5]))
  ((ranks % f[2] == 0)) || err "$ranks ranks (tp x pp x dp) do not spread evenly over ${f[2]} nodes"
  for n in "${names[@]}"; do [[ $n != "$name" ]] || err "run '$name' appears twice"; done
  [[ ! -e $study/$name ]] || err "$study/$name exists (its checkpoints would be resumed); use a new STUDY_DIR"
  names+=("$name")
  lines+=("${f[*]}")
done < <(if [[ $layouts == - ]]; then cat; else cat -- "$layouts"; fi)
((${#names[@]})) || { echo "sweep.sh: $layouts lists no runs" >&2; exit 2; }

mkdir -p "$study"
exclusive=()
[[ ${SWEEP_EXCLUSIVE:-1} == 1 ]] && exclusive=(--exclusive)
ids=() entries=()
for line in "${lines[@]}"; do
  read -r name mode nodes tp pp dp stage micro gas extra <<< "$line"
  gas=${gas:-1}
  ranks=$((tp * pp * dp))
  geometry=(--nodes="$nodes" --ntasks="$ranks")
  # Only across nodes: on one node -n is enough, and Slurm refuses --ntasks-per-node above the
  # node's cores even with --overcommit.
  ((nodes > 1)) && geometry+=(--ntasks-per-node=$((ranks / nodes)))
  # shellcheck disable=SC2086  # EXTRA is split at spaces on purpose
  out=$(sbatch --parsable --job-name="sweep-$name" "${geometry[@]}" "${exclusive[@]}" --output="$study/$name.out" \
          "${sbatch_args[@]}" "$here/train.sbatch" "$@" \
          --set tensor_parallel.tp_size="$tp" --set pipeline_parallel.pp_size="$pp" --set zero_optimization.stage="$stage" \
          --set train_micro_batch_size_per_gpu="$micro" --set gradient_accumulation_steps="$gas" \
          --set train_batch_size=$((micro * gas * dp)) ${extra:-} --run-dir "$study/$name") ||
    { echo "sweep.sh: sbatch failed for '$name' (already submitted: ${ids[*]:-none})" >&2; exit 1; }
  id=${out%%;*}
  ids+=("$id")
  echo "$name $id"
  for m in ${mode//,/ }; do entries+=("{\"run\": \"$name\", \"mode\": \"$m\", \"nodes\": $nodes}"); done
done
{
  echo '{"runs": ['
  for ((i = 0; i < ${#entries[@]}; i++)); do
    sep=,
    ((i == ${#entries[@]} - 1)) && sep=""
    echo "  ${entries[i]}$sep"
  done
  echo ']}'
} > "$study/study.json"
echo "sweep.sh: ${#ids[@]} jobs; study in $study (study.json written); watch with: squeue -j $(IFS=,; echo "${ids[*]}")" >&2
echo "sweep.sh: when they are done: /usr/bin/python3 $(cd "$here/.." && pwd)/postprocess/scaling.py $study" >&2
