#!/usr/bin/env bash
# jobscripts/chain.sh N [SBATCH_ARGS...] -- CONFIG [TRAIN_ARGS...]: one training run spread over N
# Slurm jobs that run one after another (--dependency=afterany:<previous>), for runs longer than a
# job may be, on sites that do not allow requeueing or cap it. Every job is train.sbatch with the
# same arguments and the same run directory: it resumes the previous job's latest checkpoint and
# stops with a checkpoint before its own time limit (the limit's USR1, or the program's budget from
# the job's end time or run.max_minutes), with exit code 6 and without requeueing itself
# (ZERO3D_REQUEUE=0), and the next job continues. A job that finds the run finished does nothing.
# Prints the job ids, one per line (the first N lines of stdout); a summary goes to stderr.
#
#   RUN_DIR=runs/long jobscripts/chain.sh 5 -N 4 --ntasks-per-node=8 --time=24:00:00 -- \
#     input/gpt2-124m.json --set checkpoint.save_interval=500
#   scancel $(squeue -h -n zero3d -o %i)      # give up on the rest of a chain
#
# RUN_DIR (environment): the run directory all jobs share (default runs/chain-<date-time>); the
# other train.sbatch variables (ZERO3D_BIN, ZERO3D_ROOT, ...) pass through from this shell.
# Submit from the repository root, as for train.sbatch.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
usage() { echo "usage: chain.sh N [SBATCH_ARGS...] -- CONFIG [TRAIN_ARGS...]" >&2; exit 2; }
[[ ${1:-} =~ ^[1-9][0-9]*$ ]] || usage
n=$1
shift
sbatch_args=()
while (($#)) && [[ $1 != -- ]]; do sbatch_args+=("$1"); shift; done
[[ ${1:-} == -- ]] || usage
shift
(($#)) || usage
run_dir=${RUN_DIR:-runs/chain-$(date +%Y%m%d-%H%M%S)}

ids=()
prev=""
for ((i = 1; i <= n; i++)); do
  dep=()
  [[ -n $prev ]] && dep=(--dependency=afterany:"$prev")
  # ZERO3D_REQUEUE=0 reaches the job through sbatch's default --export=ALL.
  out=$(ZERO3D_REQUEUE=0 sbatch --parsable "${dep[@]}" "${sbatch_args[@]}" "$here/train.sbatch" "$@" \
        --run-dir "$run_dir") || { echo "chain.sh: sbatch failed for job $i of $n (submitted: ${ids[*]:-none})" >&2; exit 1; }
  prev=${out%%;*}  # --parsable prints "id" or "id;cluster"
  ids+=("$prev")
  echo "$prev"
done
echo "chain.sh: $n jobs, each after the previous one ends, continuing $run_dir: ${ids[*]}" >&2
echo "chain.sh: watch with: squeue -j $(IFS=,; echo "${ids[*]}")" >&2
