#!/usr/bin/env bash
# postprocess/ on a small real study of 6-step gpt-tiny runs: strong scaling at global batch 8 on
# 1, 2 and 4 ranks, a weak-scaling run (4 ranks, micro 8), tp 2 (bf16, ZeRO-2) and ZeRO-3 (fp16,
# dp 3: padded shards), plus a run resumed on another layout. scaling.py: the CSV's rows and
# columns, every number recomputed from metrics.jsonl by the definitions, the baselines exactly 1,
# series inferred and from study.json, --skip; memory.py: the ZeRO formula recomputed, measured >=
# formula; loss.py: a resumed run is one curve; every PNG an image with content and points on every
# axis; a malformed line and a missing directory exit 2 naming them; --help of all three.
# usage: test_postprocess.sh ZERO3D_BINARY SOURCE_DIR
set -eu
source "$(dirname "$0")/common.sh" "$@"
py=/usr/bin/python3
train() {  # train DIR NP [--set ...]: gpt-tiny into $tmp/DIR on NP ranks
  local dir=$1 np=$2
  shift 2
  timeout 120 $MPIRUN -np "$np" "$z3d" train input/gpt-tiny.json --run-dir "$tmp/$dir" --peak-flops 1e11 "$@" \
    > "$tmp/train.log" 2>&1 || { cat "$tmp/train.log"; fail "training $dir"; }
}
study() { local name=$1; shift; train "study/$name" "$@" --set data.val= --set train_steps=6; }
batch() { echo --set train_batch_size=$1 --set gradient_accumulation_steps=1 --set train_micro_batch_size_per_gpu=$2; }
for np in 1 2 4; do study "strong-$np" $np $(batch 8 $((8 / np))) --set zero_optimization.stage=1; done
study weak-4 4 $(batch 32 8)
study tp2 4 $(batch 16 8) --set tensor_parallel.tp_size=2 --set zero_optimization.stage=2 --set bf16.enabled=true
study zero3 3 $(batch 6 2) --set zero_optimization.stage=3 --set fp16.enabled=true \
  --set zero_optimization.stage3_param_persistence_threshold=0
val=(--set data.val_interval=2 --set data.val_batches=1)
train resumed 1 --set train_steps=4 --set checkpoint.save_interval=2 "${val[@]}"
train resumed 2 --set train_steps=8 --set checkpoint.load=auto --set zero_optimization.stage=2 "${val[@]}"
runs=(strong-1 strong-2 strong-4 weak-4 tp2 zero3)

expect_exit 0 scaling_inferred "points per axis" $py postprocess/scaling.py "$tmp/study" --out "$tmp/inferred"
expect_exit 0 scaling_skip10 "wrote" $py postprocess/scaling.py "$tmp/study" --out "$tmp/skip10" --skip 10
cat > "$tmp/study/study.json" <<'EOF'
{"runs": [{"run": "strong-1", "mode": "strong", "nodes": 1}, {"run": "strong-2", "mode": "strong", "nodes": 1},
          {"run": "strong-4", "mode": "strong", "nodes": 2},
          {"run": "strong-1", "mode": "weak", "nodes": 1, "series": "weak, 8 per replica"},
          {"run": "weak-4", "mode": "weak", "nodes": 2, "series": "weak, 8 per replica"}]}
EOF
expect_exit 0 scaling_study_json "runs 6, series 2 \(study.json\)" $py postprocess/scaling.py "$tmp/study"
expect_exit 0 memory "6 runs, 18 bars" $py postprocess/memory.py "${runs[@]/#/$tmp/study/}" --out "$tmp/memory"
expect_exit 0 loss "3 runs, 20 train points, 5 val points" \
  $py postprocess/loss.py "$tmp/resumed" "$tmp/study/strong-1" "$tmp/study/tp2" --val --out "$tmp/loss/loss.png"

/usr/bin/python3 - "$tmp" <<'PY'
import math, re, sys
import matplotlib.image
import pandas as pd
import z3dcheck
sys.path.insert(0, "postprocess")
from metrics import load_run
tmp = sys.argv[1]
def close(a, b): return math.isclose(a, b, rel_tol=1e-12)
def train(run): return z3dcheck.train(f"{tmp}/study/{run}")
def layout(run): return z3dcheck.run_record(f"{tmp}/study/{run}")

# scaling.csv, series inferred: strong at global batch 8, weak at 8 per replica, fp32; tp2 (bf16)
# and zero3 (fp16) in none.
def check_scaling(csv, skip, nodes):
    t = pd.read_csv(csv, keep_default_na=False, na_values=[""])
    assert list(t.columns) == ["series", "mode", "run", "nodes", "ranks", "tp", "pp", "dp", "zero_stage", "precision",
                               "micro_batch", "global_batch", "per_replica_batch", "steps", "tokens_per_s",
                               "tokens_per_s_per_rank", "mfu", "baseline", "speedup", "efficiency"], list(t.columns)
    rows = sorted(zip(t["mode"].fillna(""), t.run))
    assert rows == sorted([("strong", "strong-1"), ("strong", "strong-2"), ("strong", "strong-4"),
                           ("weak", "strong-1"), ("weak", "weak-4"), ("", "tp2"), ("", "zero3")]), rows
    for r in t.itertuples():
        steps = train(r.run)
        steps = steps[skip:] if len(steps) > skip else steps[1:]
        run = layout(r.run)
        assert (r.ranks, r.tp, r.dp, r.zero_stage, r.precision, r.global_batch, r.nodes) == \
            (run["world_size"], run["tp"], run["dp"], run["zero_stage"], run["precision"], run["train_batch_size"],
             nodes.get(r.run, 1)), r
        assert r.steps == len(steps) and close(r.tokens_per_s, sum(s["tokens_per_s"] for s in steps) / len(steps)), r
        assert close(r.mfu, sum(s["mfu"] for s in steps) / len(steps)), r
        assert close(r.tokens_per_s_per_rank, r.tokens_per_s / r.ranks), r
        if r.mode not in ("strong", "weak"):
            assert math.isnan(r.speedup) and math.isnan(r.efficiency), r
            continue
        base = t[(t.series == r.series) & (t.run == r.baseline)].iloc[0]
        assert base.ranks == t[t.series == r.series].ranks.min() and r.baseline == "strong-1", r
        assert close(r.speedup, r.tokens_per_s / base.tokens_per_s), r
        if r.mode == "strong":
            eff = r.speedup / (r.ranks / base.ranks)
        else:
            eff = r.tokens_per_s_per_rank / base.tokens_per_s_per_rank
        assert close(r.efficiency, eff), r
        if r.run == r.baseline:
            assert r.speedup == 1.0 and r.efficiency == 1.0, r
    return t
t = check_scaling(f"{tmp}/inferred/scaling.csv", 2, {})
assert (t.steps == 4).all()
assert set(t.series.dropna()) == {"strong: global batch 8, fp32", "weak: per-replica batch 8, fp32"}, set(t.series)
check_scaling(f"{tmp}/skip10/scaling.csv", 10, {})  # 6 steps <= --skip: all but the first
t = check_scaling(f"{tmp}/study/scaling.csv", 2, {"strong-4": 2, "weak-4": 2})
assert set(t.series.dropna()) == {"strong", "weak, 8 per replica"}, set(t.series)
# Points on every axis: series rows (5) on all four, the 2 runs in no series on throughput and MFU.
log = open(f"{tmp}/scaling_inferred.log").read()
points = dict((k, int(v)) for k, v in re.findall(r"(\w+) (\d+)", log.split("points per axis:")[1]))
assert points == {"tokens_per_s_per_rank": 7, "speedup": 5, "efficiency": 5, "mfu": 7}, points
md = open(f"{tmp}/inferred/scaling.md").read()
assert "| strong-4 | 1 | 4 | 1 | 1 | 4 | 1 | 2 | 8 |" in md and "strong: speedup / (ranks / baseline ranks)" in md, md

# memory.csv: the formula recomputed, the measured values those of the run record, measured >= formula,
# and above it for dp 3 (padded shards).
m = pd.read_csv(f"{tmp}/memory/memory.csv").set_index("run")
per_param = {"fp32": (4, 4, 8), "fp16": (2, 2, 12), "bf16": (2, 2, 12)}
for name, r in m.iterrows():
    run = layout(name)
    psi, n, stage = run["num_params"], run["dp"], run["zero_stage"]
    p, g, o = (b * psi for b in per_param[run["precision"]])
    want = {"params": p / n if stage == 3 else p, "grads": g / n if stage >= 2 else g,
            "optimizer": o / n if stage >= 1 else o}
    for k, v in want.items():
        assert close(r[f"formula_{k}"], v), (name, k, r[f"formula_{k}"], v)
        assert r[f"measured_{k}"] == run[f"mem_{k}_bytes"], (name, k)
    assert close(r.formula_states, sum(want.values())) and r.measured_states >= r.formula_states, (name, r)
    assert r.max_rank_total == max(s["mem_model_states_bytes"] for s in train(name)), name
assert m.loc["zero3", "measured_states"] > m.loc["zero3", "formula_states"], m.loc["zero3"]
assert m.loc["tp2", "psi"] < m.loc["strong-1", "psi"]  # tp 2: rank 0's slice
print("memory: measured / formula", dict(m.ratio.round(6)))

# The resumed run (1 rank, steps 1-4, then 2 ranks, ZeRO-2, steps 5-8): one curve of every step.
r = load_run(f"{tmp}/resumed")
assert list(r.train.step) == list(range(1, 9)) and list(r.val.step) == [0, 2, 4, 6, 8], (r.train.step, r.val.step)
assert len(r.runs) == 2 and r.run["world_size"] == 2 and list(r.last_segment.step) == [5, 6, 7, 8]
assert list(r.checkpoint.action) == ["save", "save", "load"], r.checkpoint

for png in ["inferred/scaling.png", "study/scaling.png", "memory/memory.png", "loss/loss.png"]:
    img = matplotlib.image.imread(f"{tmp}/{png}")
    assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 200 and img[..., :3].std() > 0.05, (png, img.shape)
print("postprocess: scaling, memory, loss checked")
PY

# User errors: one line naming the file and line (or directory), exit code 2.
mkdir -p "$tmp/bad"
cp -r "$tmp/study/strong-2" "$tmp/bad/"
echo garbage >> "$tmp/bad/strong-2/metrics.jsonl"
line=$(wc -l < "$tmp/bad/strong-2/metrics.jsonl")
bad="bad/strong-2/metrics.jsonl:$line: not a JSON object: garbage"
expect_exit 2 bad_scaling "^scaling.py: error: .*$bad$" $py postprocess/scaling.py "$tmp/bad"
expect_exit 2 bad_loss "$bad" $py postprocess/loss.py "$tmp/study/strong-1" "$tmp/bad/strong-2"
expect_exit 2 bad_memory "$bad" $py postprocess/memory.py "$tmp/bad/strong-2" --out "$tmp/bad"
expect_exit 2 missing_study "$tmp/nothing: no such directory" $py postprocess/scaling.py "$tmp/nothing"
expect_exit 2 missing_run "$tmp/nothing/metrics.jsonl: no such file" $py postprocess/memory.py "$tmp/nothing"
echo '{"runs": [{"run": "strong-8", "mode": "strong"}]}' > "$tmp/study/study.json"
expect_exit 2 bad_study_json 'study.json: run "strong-8" has no metrics.jsonl with train records' \
  $py postprocess/scaling.py "$tmp/study"
# A run that stopped before its first step is left out of the study, with a warning.
mkdir -p "$tmp/part/started"
cp -r "$tmp/study/strong-1" "$tmp/part/"
head -1 "$tmp/study/strong-2/metrics.jsonl" > "$tmp/part/started/metrics.jsonl"
expect_exit 0 no_steps "warning: .*started/metrics.jsonl: no train records; left out" \
  $py postprocess/scaling.py "$tmp/part"
grep -q "runs 1, series 0" "$tmp/no_steps.log" || fail "no_steps: the run without steps was not left out"
[[ $(wc -l < "$tmp/bad_scaling.log") -eq 1 ]] || fail "the error is more than one line"

expect_exit 0 help_scaling "efficiency +strong: speedup / \(ranks / baseline ranks\)" $py postprocess/scaling.py --help
expect_exit 0 help_memory "fp16 / bf16: params 2 Psi, grads 2 Psi, optimizer 12 Psi" $py postprocess/memory.py --help
expect_exit 0 help_loss "--val" $py postprocess/loss.py --help
echo "postprocess: passed"
