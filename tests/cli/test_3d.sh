#!/usr/bin/env bash
# The 3-D grid: tensor x pipeline x data parallelism with every ZeRO stage. Twelve (tp, pp, dp)
# layouts with tp*pp*dp in {2, 4, 8} (gpt-tiny has 4 layers and 4 heads) crossed with ZeRO stages
# 0-3 (with dp 1 there is nothing to shard: stages 0 and 3, the gathering path, only), fp32, 20
# steps with the same global batch of 8 sequences: per-step losses within 1e-4
# relative of the single-rank run; per-rank parameter/gradient/optimizer bytes match the ZeRO
# formula with Psi = this rank's share (tp slice of its pipeline stage); the pipeline reports its
# idle time (stage 0 of each pipelined layout).
# usage: test_3d.sh ZERO3D_BINARY SOURCE_DIR
set -eu
source "$(dirname "$0")/common.sh" "$@"
run() { train_layout input/gpt-tiny.json "$@"; }  # run NAME TP PP DP GAS [--set ...]
run ref 1 1 1 1
layouts="2,2,2,2 1,2,4,2 2,1,4,2 1,4,2,4 4,1,2,2 4,2,1,4 2,4,1,4 1,1,8,1 1,2,1,4 1,4,1,8 2,2,1,4 1,2,2,2"
for l in $layouts; do
  IFS=, read tp pp dp gas <<< "$l"
  stages="0 1 2 3"
  [ $dp = 1 ] && stages="0 3"
  for stage in $stages; do
    # The idle time is in the breakdown, whose bandwidth and FMA measurements take each rank 0.3 s
    # (2.4 s of 8 ranks on 2 cores): one stage of each pipelined layout reports it.
    breakdown=false
    [ $pp -gt 1 ] && [ $stage = 0 ] && breakdown=true
    run "t${tp}p${pp}d${dp}_s${stage}" $tp $pp $dp $gas --set zero_optimization.stage=$stage \
      --set zero_optimization.stage3_param_persistence_threshold=0 --set wall_clock_breakdown=$breakdown
  done
done
/usr/bin/python3 - "$tmp" <<'PY'
import sys, glob, os
from z3dcheck import Checks, max_rel, run_and_train, train
tmp = sys.argv[1]
ref = train(f"{tmp}/ref")
check = Checks("3d")
worst = 0.0
for name in sorted(os.path.basename(d) for d in glob.glob(f"{tmp}/t*") if os.path.isdir(d)):
    run, tr = run_and_train(f"{tmp}/{name}")
    err = max_rel(tr, ref)
    worst = max(worst, err)
    check(len(tr) == 20 and err <= 1e-4, f"{name}: loss {err:.2e} relative to 1 rank")
    n, stage, psi = run["dp"], run["zero_stage"], run["num_params_padded"]
    want = {"mem_params_bytes": 4 * psi / (n if stage == 3 else 1), "mem_grads_bytes": 4 * psi / (n if stage >= 2 else 1),
            "mem_optimizer_bytes": 8 * psi / (n if stage >= 1 else 1)}
    for k, v in want.items():
        check(run[k] == v, f"{name}: {k} {run[k]} vs {v:.0f}")
    if run["pp"] > 1 and run["zero_stage"] == 0:
        idle = [r["pipeline_idle_fraction"] for r in tr]
        check(all(0 <= x < 1 for x in idle), f"{name}: pipeline idle fraction {idle[-1]}")
print(f"worst relative loss difference to 1 rank over {len(glob.glob(tmp + '/t*/'))} runs: {worst:.2e}")
check.exit()
PY
