#!/usr/bin/env bash
# tests/slurm/slurm_down.sh [--logs] DIR: stops the test cluster slurm_up.sh DIR started: cancels
# its jobs (and waits for them to end), then stops slurmd, slurmctld and munged by the pids
# recorded in DIR/pids (TERM, then KILL after 10 s). --logs first prints the daemon logs (for a
# failed test). Leaves DIR in place; safe to call twice or on a half-started cluster.
set -uo pipefail
logs=0
[[ ${1:-} == --logs ]] && { logs=1; shift; }
dir=${1:?usage: slurm_down.sh [--logs] DIR}

if ((logs)); then
  for f in "$dir"/log/*; do
    [[ -s $f ]] || continue
    echo "===== $f (last 60 lines) ====="
    tail -n 60 "$f"
  done
  [[ -f $dir/slurm.conf ]] && { echo "===== $dir/slurm.conf ====="; cat "$dir/slurm.conf"; }
fi
[[ -f $dir/pids ]] || exit 0

pid_of() { awk -v d="$1" '$1==d{print $2}' "$dir/pids"; }
# alive PID: the process exists and is not a zombie (a daemon's parent is PID 1, which may reap it
# seconds after it died; `kill -0` succeeds on a zombie).
alive() { local s; [[ -n $1 ]] && s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; s=${s##*) }; [[ ${s%% *} != Z ]]; }

# Jobs first, while slurmctld and slurmd can still end them cleanly.
if [[ -f $dir/slurm.conf ]] && alive "$(pid_of slurmctld)"; then
  export SLURM_CONF=$dir/slurm.conf
  jobs=$(timeout 10 squeue -h -o %i 2>/dev/null)
  if [[ -n $jobs ]]; then
    timeout 10 scancel --full --signal=KILL $jobs 2>/dev/null
    timeout 10 scancel $jobs 2>/dev/null
    for _ in $(seq 40); do [[ -z $(timeout 10 squeue -h -o %i 2>/dev/null) ]] && break; sleep 0.5; done
  fi
fi
for d in slurmd slurmctld munged; do
  p=$(pid_of "$d")
  alive "$p" || continue
  kill -TERM "$p" 2>/dev/null
  for _ in $(seq 100); do alive "$p" || break; sleep 0.1; done
  alive "$p" && kill -KILL "$p" 2>/dev/null
done
sed -i '/./d' "$dir/pids"
exit 0
