#!/usr/bin/env bash
# zero3d train --dry-run: the parameters and model FLOPs per token it plans are those the run record
# of a real run reports: gpt-tiny on 1 rank, and tp 2 x pp 2 planned from one process with --ranks 4
# (and from 2 MPI ranks: the world need not match) against a real 4-rank run. It writes nothing; the
# readable form carries the same numbers; --peak-flops and ZERO3D_FLOPS_PER_RANK set the rates; a
# run dir with a checkpoint is planned as its resume, at the rate the run measured; bad input is
# exit code 2, as for a real run, with no run dir.
# usage: test_dry_run.sh ZERO3D_BINARY SOURCE_DIR
set -eu
source "$(dirname "$0")/common.sh" "$@"

tiny=input/gpt-tiny.json
step1=(--peak-flops 1e11 --set train_steps=1 --set data.val=)
tp2pp2=(--set tensor_parallel.tp_size=2 --set pipeline_parallel.pp_size=2)

"$z3d" train $tiny --dry-run=json --run-dir "$tmp/dry" > "$tmp/dry1.json"
"$z3d" train $tiny --dry-run --run-dir "$tmp/dry" > "$tmp/dry1.txt"
"$z3d" train $tiny --dry-run=json --ranks 4 "${tp2pp2[@]}" > "$tmp/dry4.json"
timeout 60 $MPIRUN -np 2 "$z3d" train $tiny --dry-run=json --ranks 4 "${tp2pp2[@]}" > "$tmp/dry4_np2.json"
"$z3d" train $tiny --dry-run=json --peak-flops 2e12 > "$tmp/peak.json"
ZERO3D_FLOPS_PER_RANK=5e9 "$z3d" train $tiny --dry-run=json --peak-flops 2e12 > "$tmp/env.json"
[[ ! -e "$tmp/dry" ]] || fail "a dry run created its run dir"
cmp -s "$tmp/dry4.json" "$tmp/dry4_np2.json" || fail "--ranks 4 planned differently from 1 and 2 processes"

"$z3d" train $tiny --run-dir "$tmp/real1" "${step1[@]}" --set checkpoint.save_interval=1 > /dev/null
timeout 120 $MPIRUN -np 4 "$z3d" train $tiny --run-dir "$tmp/real4" "${step1[@]}" "${tp2pp2[@]}" > /dev/null
"$z3d" train $tiny --dry-run=json --run-dir "$tmp/real1" --set checkpoint.load=auto > "$tmp/resume.json"
"$z3d" train $tiny --dry-run --run-dir "$tmp/real1" --set checkpoint.load=auto > "$tmp/resume.txt"

/usr/bin/python3 - "$tmp" <<'PY'
import json, sys
from z3dcheck import run_record, train
tmp = sys.argv[1]
def load(name): return json.load(open(f"{tmp}/{name}.json"))
dry1, dry4, real1, real4 = load("dry1"), load("dry4"), run_record(f"{tmp}/real1"), run_record(f"{tmp}/real4")
# the run record's num_params is rank 0's share: the whole model on 1 rank, stage 0's tp rank 0 on 4
assert dry1["num_params_total"] == dry1["num_params_per_rank"][0] == real1["num_params"], (dry1, real1["num_params"])
assert dry4["num_params_per_rank"][0] == real4["num_params"], (dry4["num_params_per_rank"], real4["num_params"])
assert dry4["num_params_total"] == dry1["num_params_total"] and len(dry4["num_params_per_rank"]) == 2, dry4
assert sum(dry4["num_params_per_rank"]) * 2 > dry4["num_params_total"], dry4  # tp replicas and the tied copy
for dry, real in ((dry1, real1), (dry4, real4)):
    assert dry["flops_per_token"] == real["flops_per_token"], (dry["flops_per_token"], real["flops_per_token"])
    for k in ("dp", "tp", "pp", "train_batch_size", "seq_len"): assert dry[k] == real[k], (k, dry[k], real[k])
    assert dry["tokens_per_step"] == dry["train_batch_size"] * dry["seq_len"], dry
    assert dry["flops_per_step"] == dry["flops_per_token"] * dry["tokens_per_step"], dry
assert dry4["ranks"] == real4["world_size"] == 4, (dry4["ranks"], real4["world_size"])
# rates: a CPU's default, 40% of a given peak, the environment's
assert dry1["peak_flops"] is None and dry1["flops_per_rank"] == 1e10, dry1
assert dry1["seconds"] == dry1["flops_per_step"] * dry1["train_steps"] / 1e10, dry1
peak, env = load("peak"), load("env")
assert peak["peak_flops"] == 2e12 and peak["flops_per_rank"] == 0.4 * 2e12, peak
assert env["flops_per_rank"] == 5e9 and env["flops_per_rank_source"] == "ZERO3D_FLOPS_PER_RANK", env
# the readable form: the same numbers
text = open(f"{tmp}/dry1.txt").read()
for want in (f"{dry1['num_params_total']:,} parameters", f"{dry1['flops_per_token'] / 1e6:.5g} MFLOP per token",
             f"= {dry1['tokens_per_step']:,} per step; {dry1['train_steps']} steps = {dry1['tokens']:,} tokens",
             "assumed for a CPU rank"):
    assert want in text, (want, text)
# a resume: the step of the checkpoint it would load, the rest at the rate the run measured
resume = load("resume")
measured = [r["model_flops_per_s"] for r in train(f"{tmp}/real1")]
assert resume["start_step"] == 1 and resume["resume_from"].endswith("/checkpoints/step_00000001.h5"), resume
assert resume["measured_flops_per_s"] == measured[-1], (resume, measured)
assert abs(resume["seconds_left"] - resume["flops_per_step"] * 199 / measured[-1]) <= 1e-9 * resume["seconds_left"]
assert "1 steps done, 199 left at the measured" in open(f"{tmp}/resume.txt").read()
print("dry run = run record: params", dry1["num_params_total"], "and per rank of tp 2 x pp 2",
      dry4["num_params_per_rank"], "; flops/token", dry1["flops_per_token"])
PY

# bad input: what a real run refuses, with exit code 2 and no run dir
expect_exit 2 bad-key "did you mean 'train_steps'" "$z3d" train $tiny --dry-run --run-dir "$tmp/bad" --set train_step=3
expect_exit 2 bad-layout "not a multiple of tensor_parallel.tp_size 2" \
  "$z3d" train $tiny --dry-run --ranks 3 --run-dir "$tmp/bad" "${tp2pp2[@]}"
expect_exit 2 missing-data "$tmp/none.bin" "$z3d" train $tiny --dry-run --run-dir "$tmp/bad" --set data.train=\"$tmp/none.bin\"
expect_exit 2 bad-ranks "--ranks must be" "$z3d" train $tiny --dry-run --ranks 2.5
expect_exit 2 ranks-alone "--ranks goes with --dry-run" "$z3d" train $tiny --ranks 4 --run-dir "$tmp/bad"
expect_exit 2 bad-env "ZERO3D_FLOPS_PER_RANK must be a positive number" \
  env ZERO3D_FLOPS_PER_RANK=fast "$z3d" train $tiny --dry-run --run-dir "$tmp/bad"
[[ ! -e "$tmp/bad" ]] || fail "a refused dry run created its run dir"
echo "PASS"
