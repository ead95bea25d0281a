#!/usr/bin/env bash
# zero3d plan (issue #31, memory): its sizes come from the engine's and the models' own
# allocations, so for a sample of layouts (tensor, pipeline and data parallel; ZeRO stages 0-3;
# activation checkpointing; bf16; device memory with and without optimizer offload) every rank's
# params, grads, optimizer state, buffers, activations and offloaded host bytes in the plan equal,
# byte for byte, what the run's memory_breakdown reports for that rank; the plan lists every layout of the global batch and says why the config code refuses one;
# --explain prices each single change; --sweep's layouts go through sweep.sh; a run whose node would
# need more memory than it has stops before it allocates, with that explanation; bad options are
# refused in one line.
# usage: test_plan.sh ZERO3D_BINARY SOURCE_DIR
set -eu
source "$(dirname "$0")/common.sh" "$@"
tiny=input/gpt-tiny.json
timeout 60 "$z3d" plan $tiny --ranks 4 --json > "$tmp/plan.jsonl" 2> "$tmp/plan.log" || { cat "$tmp/plan.log"; fail "plan"; }
timeout 60 "$z3d" plan $tiny --ranks 4 --json --set bf16.enabled=true > "$tmp/plan_bf16.jsonl" 2> "$tmp/plan.log" ||
  { cat "$tmp/plan.log"; fail "plan bf16"; }
timeout 60 "$z3d" plan $tiny --ranks 2 --json --device > "$tmp/plan_dev.jsonl" 2> "$tmp/plan.log" ||
  { cat "$tmp/plan.log"; fail "plan --device"; }
# Offload to nvme, sized without a disk (the engine's swap files as sizing ones): the optimizer's
# records in sub-groups of 100352 elements, and stage 3's slices with every unit gathered.
mkdir -p "$tmp/nvme"
nvme=(--set zero_optimization.offload_optimizer.nvme_path="$tmp/nvme" --set zero_optimization.sub_group_size=100000)
nvme_param=("${nvme[@]}" --set zero_optimization.stage=3 --set zero_optimization.offload_param.device=nvme --set zero_optimization.offload_param.nvme_path="$tmp/nvme"
            --set zero_optimization.stage3_param_persistence_threshold=0)
timeout 60 "$z3d" plan $tiny --ranks 2 --json "${nvme[@]}" > "$tmp/plan_nvme.jsonl" 2> "$tmp/plan.log" ||
  { cat "$tmp/plan.log"; fail "plan with nvme"; }
timeout 60 "$z3d" plan $tiny --ranks 2 --json "${nvme_param[@]}" > "$tmp/plan_nvme_param.jsonl" 2> "$tmp/plan.log" ||
  { cat "$tmp/plan.log"; fail "plan with nvme parameters"; }
[[ -z $(ls -A "$tmp/nvme") ]] || fail "the plan made swap files: $(ls -A "$tmp/nvme")"
timeout 60 "$z3d" plan input/llama-tiny.json --ranks 4 > "$tmp/plan_table.log" 2>&1 || { cat "$tmp/plan_table.log"; fail "plan table"; }
grep -qE "^excluded [0-9]+: .*num_key_value_heads 2 must be divisible by tensor_parallel.tp_size 4" "$tmp/plan_table.log" ||
  { cat "$tmp/plan_table.log"; fail "the plan does not say why tp 4 is refused for llama-tiny"; }
echo "ok plan lists and excludes"
# sample NAME DP TP PP STAGE MICRO GAS CKPT [--set ...]: one step of that layout with memory_breakdown.
samples=()
sample() {
  local name=$1 dp=$2 tp=$3 pp=$4 stage=$5 micro=$6 gas=$7 ckpt=$8
  shift 8
  timeout 120 $MPIRUN -np $((dp * tp * pp)) "$z3d" train $tiny --run-dir "$tmp/$name" --set train_steps=1 \
    --set data.val="" --set memory_breakdown=true --set steps_per_print=1 --set tensor_parallel.tp_size=$tp \
    --set pipeline_parallel.pp_size=$pp --set zero_optimization.stage=$stage --set train_micro_batch_size_per_gpu=$micro \
    --set gradient_accumulation_steps=$gas --set activation_checkpointing.enabled=$ckpt --set comm_timeout_s=60 "$@" \
    > "$tmp/$name.log" 2>&1 || { tail -20 "$tmp/$name.log"; fail "run $name"; }
  samples+=("$name $dp $tp $pp $stage $micro $gas $ckpt")
}
sample tp2pp2_s0 1 2 2 0 2 4 false
sample dp4_s3_ckpt 4 1 1 3 1 2 true
sample dp2pp2_s2 2 1 2 2 2 2 false
sample dp2tp2_s1_ckpt 2 2 1 1 4 1 true
sample dp2pp2_s1_bf16 2 1 2 1 1 4 false --set bf16.enabled=true
# Device memory (the host backend behind device walls: MemKind::device, as a GPU's): plan --device,
# with the optimizer offloaded to host memory (its host bytes compared too) and without.
ZERO3D_DEVICE_WALLS=1 sample dp2_s2_dev_offload 2 1 1 2 4 1 false --set zero_optimization.offload_optimizer.device=cpu
ZERO3D_DEVICE_WALLS=1 sample dp2_s1_dev 2 1 1 1 2 2 true
# Offload to nvme: the optimizer's state (stage 2), and stage 3's slices beside it.
sample dp2_s2_nvme 2 1 1 2 4 1 false --set zero_optimization.offload_optimizer.device=nvme "${nvme[@]}"
sample dp2_s3_nvme_param 2 1 1 3 2 2 false --set zero_optimization.offload_optimizer.device=nvme "${nvme_param[@]}"
/usr/bin/python3 - "$tmp" "${samples[@]}" <<'PY'
import sys
from z3dcheck import Checks, read_jsonl, records
tmp, samples = sys.argv[1], sys.argv[2:]
plans = {k: read_jsonl(f"{tmp}/plan{f}.jsonl") for k, f in (("fp32", ""), ("bf16", "_bf16"), ("dev", "_dev"), ("nvme", "_nvme"),
                                                       ("nvme_param", "_nvme_param"))}
check = Checks()
for s in samples:
    name, *v = s.split()
    dp, tp, pp, stage, micro, gas = map(int, v[:6])
    ckpt = v[6] == "true"
    plan = plans[next((k for k in ("bf16", "dev", "nvme_param", "nvme") if k in name), "fp32")]
    offload = "cpu" if "offload" in name else "nvme" if "nvme" in name else "none"
    [p] = [p for p in plan if (p["dp"], p["tp"], p["pp"], p["stage"], p["micro"], p["gas"], p["activation_checkpointing"],
                               p["offload_optimizer"]) == (dp, tp, pp, stage, micro, gas, ckpt, offload)]
    recs = records(f"{tmp}/{name}", "memory")
    assert len(recs) == dp * tp * pp, f"{name}: {len(recs)} memory records"
    before, planned, share = check.failed, 0, 0
    for r in recs:
        st = p["stages"][r["rank"] // (tp * dp)]
        for k in ("params", "grads", "optimizer", "buffers", "activations", "host", "swapped"):
            check(st[k] == r[k + "_bytes"], f"{name} rank {r['rank']}: {k} planned {st[k]}, the run has {r[k + '_bytes']}")
        planned += st["total"] + st["host"]
        share += r["pss_bytes"]
    # What the node holds (the ranks' proportional shares: a page two ranks map counts once) less
    # what was planned: the processes' own part (code, libraries, MPI, the GEMM libraries' scratch),
    # 20-40 MB a rank here. Below the plan, or far above it, is an allocation the plan misses.
    extra = (share - planned) / len(recs)
    check(0 <= extra <= 100e6, f"{name}: the node holds {share / 1e6:.1f} MB, {extra / 1e6:.1f} MB a rank beyond the planned "
                               f"{planned / 1e6:.1f} MB (expected 0-100 MB: the process's own part)")
    if check.failed == before:
        print(f"{name}: every rank's seven accounts as planned; the node holds {share / 1e6:.1f} MB for "
              f"{planned / 1e6:.1f} MB planned (+{extra / 1e6:.1f} MB a rank: the process, MPI, the libraries)")
check.exit()
PY
# The dry run's memory line is the plan's: tp 2 x pp 2, micro-batch 2 x 4.
timeout 60 "$z3d" train $tiny --dry-run=json --ranks 4 --set tensor_parallel.tp_size=2 --set pipeline_parallel.pp_size=2 \
  --set train_micro_batch_size_per_gpu=2 --set gradient_accumulation_steps=4 > "$tmp/dry.json" 2>&1 || { cat "$tmp/dry.json"; fail "dry run"; }
/usr/bin/python3 - "$tmp" <<'PY' || fail "the dry run's memory differs from the plan's"
import json, sys
from z3dcheck import read_jsonl
dry = json.loads(open(f"{sys.argv[1]}/dry.json").read().strip().splitlines()[-1])
[p] = [p for p in read_jsonl(f"{sys.argv[1]}/plan.jsonl") if (p["dp"], p["tp"], p["pp"], p["stage"], p["micro"],
       p["gas"], p["activation_checkpointing"]) == (1, 2, 2, 0, 2, 4, False)]
want = [s["total"] for s in p["stages"]]
print(f"dry run: memory per rank {dry['memory_bytes_per_rank']}, the plan's {want}")
sys.exit(0 if dry["memory_bytes_per_rank"] == want else 1)
PY
# The work the plan counts for a step (the model's and the engine's code on the sizing backend and
# groups) is the run's: every collective of each group, calls and bytes, as the comms logger counts
# a step after the first (the difference of a 3-step and a 1-step run, halved: ZeRO-3's first step
# reuses what the start gathered) of tp 2 x dp 2 ZeRO-3 with every unit gathered (no persistent
# tensors), tp 2 x dp 2 ZeRO-2 and dp 2 ZeRO-1.
for st in 3 2 1; do
  set -- --set tensor_parallel.tp_size=$((st == 1 ? 1 : 2)) --set zero_optimization.stage=$st \
    --set zero_optimization.stage3_param_persistence_threshold=0 --set train_micro_batch_size_per_gpu=4 \
    --set gradient_accumulation_steps=1
  ranks=$((st == 1 ? 2 : 4))
  timeout 60 "$z3d" plan $tiny --ranks $ranks --explain "$@" > "$tmp/work$st.log" 2>&1 || { cat "$tmp/work$st.log"; fail "explain work"; }
  for n in 1 3; do
    timeout 120 $MPIRUN -np $ranks "$z3d" train $tiny --run-dir "$tmp/comms$st-$n" --set train_steps=$n \
      --set comms_logger.enabled=true "$@" > "$tmp/comms$st.log" 2>&1 || { cat "$tmp/comms$st.log"; fail "comms run"; }
  done
  /usr/bin/python3 - "$tmp/work$st.log" "$tmp/comms$st-1/metrics.jsonl" "$tmp/comms$st-3/metrics.jsonl" <<'PY' ||
import re, sys
from z3dcheck import records
[line] = [l for l in open(sys.argv[1]) if l.startswith("work ")]
planned = {}
for g, op, calls, mb in re.findall(r"; (tp|dp) (\w+) (\d+) x ([0-9.]+) MB", line):  # micro-batch, then step end
    c, b = planned.get((g, op), (0, 0.0))
    planned[(g, op)] = (c + int(calls), b + int(calls) * float(mb) * 1e6)
def logged(path):
    return {(r["group"], r["op"]): (r["calls"], r["msg_bytes"]) for r in records(path, "comms")
            if r["group"] in ("tp", "dp")}
one, three = logged(sys.argv[2]), logged(sys.argv[3])
ran = {k: ((c - one.get(k, (0, 0))[0]) // 2, (b - one.get(k, (0, 0))[1]) / 2) for k, (c, b) in three.items()}
print("planned per step:", {k: (c, round(b)) for k, (c, b) in sorted(planned.items())})
print("the run per step:", {k: (c, round(b)) for k, (c, b) in sorted(ran.items())})
ok = planned.keys() == ran.keys() and all(planned[k][0] == ran[k][0] and
                                          abs(planned[k][1] - ran[k][1]) <= 0.01 * ran[k][1] + 5e3 * ran[k][0]
                                          for k in ran)
sys.exit(0 if ok and ran else 1)
PY
    fail "stage $st: the plan's collectives differ from the run's"
done
echo "ok work: the plan's collectives are the run's"
# The swap files' traffic the plan counts is the run's: stage 3 with the optimizer's records and
# every parameter slice swapped, 2 micro-batches a step (the second reads nothing: the pool keeps
# what the first gathered), over steps 2-4 (a transfer counts when its last block lands, so some of
# a step's land in the next).
set -- --set zero_optimization.stage=3 --set zero_optimization.offload_optimizer.device=nvme "${nvme_param[@]}" \
  --set train_micro_batch_size_per_gpu=4 --set gradient_accumulation_steps=2
timeout 60 "$z3d" plan $tiny --ranks 2 --explain "$@" > "$tmp/work-nvme.log" 2>&1 || { cat "$tmp/work-nvme.log"; fail "explain nvme"; }
timeout 120 $MPIRUN -np 2 "$z3d" train $tiny --run-dir "$tmp/swap-io" --set train_steps=4 --set steps_per_print=1 \
  --set data.val="" "$@" > "$tmp/swap-io.log" 2>&1 || { tail -20 "$tmp/swap-io.log"; fail "nvme run"; }
/usr/bin/python3 - "$tmp/work-nvme.log" "$tmp/swap-io/metrics.jsonl" <<'PY' || { cat "$tmp/work-nvme.log"; fail "the plan's swap traffic differs from the run's"; }
import re, sys
from z3dcheck import train
[line] = [l for l in open(sys.argv[1]) if l.startswith("work ")]
first, later, end = [[float(x) * 1e6 for x in re.findall(r"swap files read ([0-9.]+) MB, written ([0-9.]+) MB", part)[0]]
                     if "swap files" in part else [0.0, 0.0] for part in line.split(" | ")]
read, written = first[0] + later[0] + end[0], first[1] + later[1] + end[1]  # gas 2: one later micro-batch
steps = train(sys.argv[2])
reads = sum(r["swap_read_bytes"] / 2 for r in steps[1:])  # the world's sum, 2 ranks
writes = sum(r["swap_written_bytes"] / 2 for r in steps[1:])
print(f"swap traffic a rank a step: planned read {read:.0f} written {written:.0f}; the run's steps 2-4 on average "
      f"read {reads / 3:.0f}, wrote {writes / 3:.0f}")
# What lands after a step's count: at most the reads ahead (2 records of 100352 x 3 fp32), and
# the writes in flight: the last sub-groups' whose buffers no read has taken back yet, buffer_count
# 4 - lookahead 2 = 2 records (a record is 1.15 MiB; a bound of two 1 MiB blocks failed a run that
# ended its steps with 2 records in flight: 2409264 bytes short).
assert abs(reads - 3 * read) <= 2 * 100352 * 12 + 2e3, (reads, read)
assert abs(writes - 3 * written) <= 2 * 100352 * 12 + 2e3, (writes, 3 * written)
PY
echo "ok work: the plan's swap traffic is the run's"
# The step time: bench machine writes a machine file from this machine's rates (2 ranks at once);
# then, on a machine file of round rates, every layout's time is its counted work at those rates
# (the 1-rank layout against --explain's work line), its parts add up, 1F1B's bubble is pp - 1
# micro-batch slots, and the table is ranked by tokens/s.
timeout 120 $MPIRUN -np 2 "$z3d" bench machine --seconds 0.2 --out "$tmp/machine.json" --nvme-path "$tmp/nvme" \
  > "$tmp/machine.log" 2>&1 || { cat "$tmp/machine.log"; fail "bench machine"; }
[[ -z $(ls -A "$tmp/nvme") ]] || fail "bench machine left swap files: $(ls -A "$tmp/nvme")"
# Bad paths end every rank with one line (exit 2), before any measuring.
expect_exit 2 machine-out "bench machine --out '$tmp/none/m.json': cannot write in '$tmp/none'" \
  $MPIRUN -np 2 "$z3d" bench machine --out "$tmp/none/m.json"
expect_exit 2 machine-nvme "bench machine --nvme-path '$tmp/none' is not a directory" \
  $MPIRUN -np 2 "$z3d" bench machine --seconds 0.05 --out "$tmp/m.json" --nvme-path "$tmp/none"
/usr/bin/python3 - "$tmp/machine.json" <<'PY' || { cat "$tmp/machine.json"; fail "bench machine: its file"; }
import json, sys
m = json.load(open(sys.argv[1]))
assert m["ranks_per_node"] == 2 and min(m["gemm_flops_per_s"], m["attention_flops_per_s"], m["copy_bytes_per_s"], m["adam_bytes_per_s"],
                                        m["nvme_read_bytes_per_s"], m["nvme_write_bytes_per_s"]) > 0, m
assert sorted(m["collectives"]) == ["all_gather", "all_reduce", "reduce_scatter"], m
assert all(l["busbw_bytes_per_s"] > 0 and l["latency_s"] >= 0 for l in m["collectives"].values()), m
PY
# On two nodes (one node cut in two, ZERO3D_RANKS_PER_NODE): no collectives within a node of one
# rank, the world's as the inter-node rates, and the plan prices the dp group across them with them.
ZERO3D_RANKS_PER_NODE=1 timeout 120 $MPIRUN -np 2 "$z3d" bench machine --seconds 0.2 --out "$tmp/machine2.json" \
  > "$tmp/machine2.log" 2>&1 || { cat "$tmp/machine2.log"; fail "bench machine on 2 nodes"; }
/usr/bin/python3 - "$tmp/machine2.json" <<'PY' || { cat "$tmp/machine2.json"; fail "bench machine on 2 nodes: its file"; }
import json, sys
m = json.load(open(sys.argv[1]))
assert m["ranks_per_node"] == 1 and m["collectives"] == {} and m["inter_node"]["p2p_bytes_per_s"] > 0, m
assert sorted(m["inter_node"]["collectives"]) == ["all_gather", "all_reduce", "reduce_scatter"], m
PY
timeout 60 "$z3d" plan $tiny --ranks 2 --explain --machine "$tmp/machine2.json" --set zero_optimization.stage=2 \
  > "$tmp/explain2.log" 2>&1 || { cat "$tmp/explain2.log"; fail "plan with the 2-node machine file"; }
grep -qE "^time .* dp [0-9.e+-]+ across nodes" "$tmp/explain2.log" || { cat "$tmp/explain2.log"; fail "2 nodes: dp not across"; }
echo "ok bench machine on 2 nodes"
cat > "$tmp/round.json" <<'JSON'
{"name": "round rates", "ranks_per_node": 2, "gemm_flops_per_s": 1e11, "attention_flops_per_s": 5e10,
 "copy_bytes_per_s": 1e10, "collectives": {"all_reduce": {"latency_s": 1e-5, "busbw_bytes_per_s": 1e9},
 "reduce_scatter": {"latency_s": 1e-5, "busbw_bytes_per_s": 1e9}, "all_gather": {"latency_s": 1e-5, "busbw_bytes_per_s": 1e9}}}
JSON
timeout 60 "$z3d" plan $tiny --ranks 1 --explain > "$tmp/explain1.log" 2>&1 || { cat "$tmp/explain1.log"; fail "explain 1 rank"; }
for r in 1 2; do
  timeout 60 "$z3d" plan $tiny --ranks $r --machine "$tmp/round.json" --json > "$tmp/timed$r.jsonl" 2> "$tmp/timed.log" ||
    { cat "$tmp/timed.log"; fail "plan --machine"; }
done
timeout 60 "$z3d" plan $tiny --ranks 2 --machine "$tmp/round.json" > "$tmp/timed.log" 2>&1 || { cat "$tmp/timed.log"; fail "plan --machine table"; }
/usr/bin/python3 - "$tmp" $tiny <<'PY' || fail "plan --machine: the step times"
import json, re, sys
from z3dcheck import read_jsonl
tmp, cfg = sys.argv[1], json.load(open(sys.argv[2]))
T = cfg["model"]["seq_len"]
gemm, att, other, end = map(float, re.search(r"GEMM ([0-9.]+) GFLOP, attention ([0-9.]+) GFLOP, the other ops ([0-9.]+) GB.*?"
                                              r"then per step: ([0-9.]+) GB", open(f"{tmp}/explain1.log").read()).groups())
[one] = [p for p in read_jsonl(f"{tmp}/timed1.jsonl") if "time" in p and p["micro"] == cfg["train_micro_batch_size_per_gpu"]
         and p["gas"] == cfg["gradient_accumulation_steps"] and p["stage"] == 0 and not p["activation_checkpointing"]]
want = (gemm * 1e9 / 1e11 + att * 1e9 / 5e10 + other * 1e9 / 1e10) * one["gas"]
assert abs(one["time"]["compute_s"] - want) <= 0.02 * want, (one["time"], want)
assert abs(one["time"]["step_end_s"] - end * 1e9 / 1e10) <= 0.02 * end * 1e9 / 1e10 + 1e-6, (one["time"], end)
timed = [p for p in read_jsonl(f"{tmp}/timed2.jsonl") if "time" in p]
assert len(timed) >= 20, len(timed)
for p in timed:
    t = p["time"]
    assert abs(t["step_s"] - (t["compute_s"] + t["comm_s"] + t["param_io_s"] + t["bubble_s"] + t["step_end_s"])) < 1e-9, p
    assert abs(t["bubble_s"] - (p["pp"] - 1) * (t["compute_s"] + t["comm_s"] + t["param_io_s"]) / p["gas"]) < 1e-9, p
    assert abs(t["tokens_per_s"] - p["micro"] * p["gas"] * p["dp"] * T / t["step_s"]) < 1e-6 * t["tokens_per_s"], p
    assert (t["comm_s"] > 0) == (p["tp"] > 1 or p["pp"] > 1 or p["stage"] >= 2 and p["dp"] > 1), p
rows = [l.split() for l in open(f"{tmp}/timed.log") if re.match(r"^ +\d+ +\d+ +\d+ ", l)]
rates = [float(r[-1]) for r in rows]
assert rates == sorted(rates, reverse=True) and abs(rates[0] - max(p["time"]["tokens_per_s"] for p in timed)) <= 0.5, rates
print(f"ok plan --machine: {len(timed)} layouts priced, compute {one['time']['compute_s']:.4f} s for {want:.4f} s of counted work")
PY
expect_exit 2 plan-machine "machine file '.*/bad.json': .*gemm_flops_per_s" \
  bash -c "echo '{\"name\": \"x\"}' > $tmp/bad.json && \"$z3d\" plan $tiny --ranks 2 --machine $tmp/bad.json"
expect_exit 2 plan-machine-key "machine file '.*/typo.json': unknown key 'inter_nodes' \\(did you mean 'inter_node'\\?\\)" \
  bash -c "sed 's/\"collectives\"/\"inter_nodes\": {}, \"collectives\"/' $tmp/round.json > $tmp/typo.json && \"$z3d\" plan $tiny --ranks 2 --machine $tmp/typo.json"
# Nodes, bf16 and a device: the same round rates with a slow network between nodes of 2 ranks
# (a group that spans them is priced on it, its bandwidth shared by its ranks a node; a tp group
# within a node is not), a bf16 GEMM rate (a bf16 run's GEMMs at it: --explain's time line is its
# counted work at those rates), and a device (with overlap_comm, ZeRO-3's data-parallel collectives
# hide behind a micro-batch's compute). The GPU presets load and price every layout.
/usr/bin/python3 - "$tmp" <<'PY'
import json, sys
m = json.load(open(f"{sys.argv[1]}/round.json"))
links = {op: {"latency_s": 1e-5, "busbw_bytes_per_s": 1e8} for op in m["collectives"]}
json.dump(dict(m, inter_node={"p2p_bytes_per_s": 1e8, "collectives": links}), open(f"{sys.argv[1]}/net.json", "w"))
json.dump(dict(m, gemm_bf16_flops_per_s=2e11), open(f"{sys.argv[1]}/bf16.json", "w"))
json.dump(dict(m, device=True), open(f"{sys.argv[1]}/device.json", "w"))
json.dump(dict(m, device=True, pcie_bytes_per_s=1e9, host_adam_bytes_per_s=1e10), open(f"{sys.argv[1]}/offload.json", "w"))
json.dump(dict(m, nvme_read_bytes_per_s=2e7, nvme_write_bytes_per_s=1e7), open(f"{sys.argv[1]}/nvme.json", "w"))
PY
# Optimizer offload: priced only with a device's link and host rates; gpt-tiny's 834304 parameters on
# one rank in fp32 send 8 bytes each over the 1 GB/s link (6.7 ms), slower than the CPU's AdamW over
# 28 bytes each at 10 GB/s (2.3 ms): the pipelined step end's offload part is the link's.
timeout 60 "$z3d" plan $tiny --ranks 1 --device --explain --machine "$tmp/offload.json" --set zero_optimization.stage=1 \
  --set zero_optimization.offload_optimizer.device=cpu > "$tmp/explain-offload.log" 2>&1 || { cat "$tmp/explain-offload.log"; fail "explain offload"; }
offload_s=$(sed -n 's/^time .*, offload \([0-9.e+-]*\)).*/\1/p' "$tmp/explain-offload.log")
/usr/bin/python3 -c "import sys; t = float(sys.argv[1]); sys.exit(abs(t - 834304 * 8 / 1e9) > 0.02 * t)" "${offload_s:-0}" ||
  { cat "$tmp/explain-offload.log"; fail "explain offload: the link's $((834304 * 8)) bytes at 1 GB/s, got '${offload_s}' s"; }
for f in device offload; do
  timeout 60 "$z3d" plan $tiny --ranks 2 --device --machine "$tmp/$f.json" --json > "$tmp/dev-$f.jsonl" 2> "$tmp/timed.log" ||
    { cat "$tmp/timed.log"; fail "plan --device --machine $f.json"; }
done
/usr/bin/python3 - "$tmp" <<'PY' || fail "plan --device: offload priced only with the link's and the host's rates"
import sys
from z3dcheck import read_jsonl
def priced(name):
    return [("time" in p) for p in read_jsonl(f"{sys.argv[1]}/dev-{name}.jsonl")
            if "excluded" not in p and p["offload_optimizer"] == "cpu"]
assert priced("device") and not any(priced("device")) and all(priced("offload")), (priced("device"), priced("offload"))
PY
echo "ok plan: optimizer offload (the link's $offload_s s)"
# Offload to nvme: priced only with the swap files' rates. On a slow disk (20 MB/s read, 10 MB/s
# written), gpt-tiny on one rank: the step's end waits for the optimizer's records (the update is
# faster): their reads but those ahead for the next step, and their writes; the reads ahead (one
# sub-group, all of them; of 9 sub-groups, the 2 that buffer_count 4 leaves room for) wait where they
# outlast the next step's micro-batches, less the disk's time for the slices these read. Stage 3's
# slices on nvme: a micro-batch waits for what their reads take beyond its compute (the pool keeps
# what the first gathered), and the step's end writes them after the update.
for f in round nvme; do
  timeout 60 "$z3d" plan $tiny --ranks 2 --machine "$tmp/$f.json" --json "${nvme[@]}" > "$tmp/nvme-$f.jsonl" 2> "$tmp/timed.log" ||
    { cat "$tmp/timed.log"; fail "plan --machine $f.json with nvme"; }
done
opt=(--set zero_optimization.offload_optimizer.device=nvme --set zero_optimization.offload_optimizer.nvme_path="$tmp/nvme")
for case in "one 1" "sub 1 --set zero_optimization.sub_group_size=100000" "param 3 ${nvme_param[*]}"; do
  read -r -a a <<< "$case"
  timeout 60 "$z3d" plan $tiny --ranks 1 --explain --machine "$tmp/nvme.json" --set zero_optimization.stage=${a[1]} \
    "${opt[@]}" "${a[@]:2}" > "$tmp/explain-nvme-${a[0]}.log" 2>&1 || { cat "$tmp/explain-nvme-${a[0]}.log"; fail "explain nvme ${a[0]}"; }
done
/usr/bin/python3 - "$tmp" <<'PY' || fail "plan: offload to nvme's price"
import re, sys
from z3dcheck import read_jsonl
tmp = sys.argv[1]
def priced(name):
    return [("time" in p) for p in read_jsonl(f"{tmp}/nvme-{name}.jsonl")
            if "excluded" not in p and p["offload_optimizer"] == "nvme"]
assert priced("round") and not any(priced("round")) and all(priced("nvme")), (priced("round"), priced("nvme"))
R, W, n = 2e7, 1e7, 834304  # the disk's rates; gpt-tiny's parameters
record = lambda fields: -(-100000 // 1024) * 1024 * fields * 4  # a sub-group of 100352 elements
for case, ahead, slices in (("one", None, 0), ("sub", 2 * record(2), 0), ("param", 2 * record(3), n * 4)):
    log = open(f"{tmp}/explain-nvme-{case}.log").read()
    parts = [[float(x) * 1e6 for x in re.findall(r"swap files read ([0-9.]+) MB, written ([0-9.]+) MB", p)[0]]
             if "swap files" in p else [0.0, 0.0] for p in next(l for l in log.splitlines() if l.startswith("work ")).split(" | ")]
    (mb_read, _), (read, written) = parts[0], parts[-1]  # gas 1: the micro-batch, the step's end
    t = dict(zip(("compute", "comm", "waits", "bubble", "offload"), map(float, re.search(
        r"= compute ([0-9.e+-]+) \+ communication ([0-9.e+-]+) .*waits ([0-9.e+-]+) \+ bubble ([0-9.e+-]+) .*, offload ([0-9.e+-]+)\)",
        log).groups())))
    ahead = read if ahead is None else ahead
    assert abs(mb_read - slices) <= 1e3 and abs(t["waits"] - max(0, slices / R - t["compute"])) <= 1e-4, (case, mb_read, t)
    step = t["compute"] + t["comm"] + t["waits"] + t["bubble"]
    want = (read - ahead) / R + written / W + max(0, (ahead + slices) / R - step)
    assert read > 0 and abs(t["offload"] - want) <= 0.01 * want, (case, t, read, written, want)
    print(f"ok plan: offload to nvme ({case}), {read / 1e6} MB read, {written / 1e6} MB written a step: "
          f"{t['offload']:.4g} s for {want:.4g} s")
PY
# The network's share, by the numbers: tp 2 x dp 2 on nodes of 2 ranks puts one rank of each dp
# group on a node, so its reduce-scatters (ZeRO-2's, in the micro-batch) get half of the 1e8 B/s.
timeout 60 "$z3d" plan $tiny --ranks 4 --explain --machine "$tmp/net.json" --set tensor_parallel.tp_size=2 \
  --set zero_optimization.stage=2 > "$tmp/explain-net.log" 2>&1 || { cat "$tmp/explain-net.log"; fail "explain net"; }
/usr/bin/python3 - "$tmp/explain-net.log" <<'PY' || { cat "$tmp/explain-net.log"; fail "explain net: the network's share"; }
import re, sys
log = open(sys.argv[1]).read()
calls, mb = re.search(r"dp reduce_scatter (\d+) x ([0-9.]+) MB", log.split("then per step")[0]).groups()
got = float(re.search(r"dp ([0-9.e+-]+) across nodes", log).group(1))
want = int(calls) * (1e-5 + float(mb) * 1e6 * (1 / 2) / (1e8 / 2))  # latency + bytes x (p-1)/p / (busbw x 1/2)
assert abs(got - want) <= 0.03 * want, (got, want)
print(f"ok plan: a dp group across nodes gets its share of the network ({got:.4g} s for {want:.4g} s)")
PY
for f in net device; do
  timeout 60 "$z3d" plan $tiny --ranks 4 --machine "$tmp/$f.json" --json > "$tmp/timed-$f.jsonl" 2> "$tmp/timed.log" ||
    { cat "$tmp/timed.log"; fail "plan --machine $f.json"; }
done
timeout 60 "$z3d" plan $tiny --ranks 4 --machine "$tmp/round.json" --json > "$tmp/timed4.jsonl" 2> "$tmp/timed.log" ||
  { cat "$tmp/timed.log"; fail "plan --machine round.json, 4 ranks"; }
timeout 60 "$z3d" plan $tiny --ranks 1 --explain --machine "$tmp/bf16.json" --set bf16.enabled=true > "$tmp/explain-bf16.log" 2>&1 ||
  { cat "$tmp/explain-bf16.log"; fail "plan --explain --machine bf16.json"; }
for preset in input/machines/*.json; do
  timeout 120 "$z3d" plan $tiny --ranks 16 --machine "$preset" --device --json > "$tmp/preset.jsonl" 2> "$tmp/preset.log" ||
    { cat "$tmp/preset.log"; fail "plan --machine $preset"; }
  /usr/bin/python3 -c "
import json, sys
from z3dcheck import read_jsonl
m = json.load(open('$preset'))
assert m['device'] and m['ranks_per_node'] == 8 and len(m['sources']) >= 5 and m['inter_node']['collectives'], m
assert sum('time' in p for p in read_jsonl('$tmp/preset.jsonl')) >= 10" || fail "preset $preset"
done
/usr/bin/python3 - "$tmp" <<'PY' || fail "plan --machine: nodes, bf16, device"
import re, sys
from z3dcheck import read_jsonl
tmp = sys.argv[1]
def layouts(name):
    return {(p["dp"], p["tp"], p["pp"], p["stage"], p["micro"], p["activation_checkpointing"]): p["time"]
            for p in read_jsonl(f"{tmp}/{name}.jsonl") if "time" in p}
base, net, dev = layouts("timed4"), layouts("timed-net"), layouts("timed-device")
for k, t in base.items():
    dp, tp, pp, stage = k[:4]
    n = net[k]
    parts = n["comm"]
    assert abs(n["comm_s"] - parts["tp_s"] - parts["dp_s"] - parts["pp_s"]) < 1e-9, (k, n)
    assert (parts["tp_across_nodes"], parts["dp_across_nodes"], parts["pp_across_nodes"]) == \
        (tp > 2, dp > 1 and tp * dp > 2, pp > 1 and tp * dp * pp > 2), (k, n)
    assert not any(v for key, v in t["comm"].items() if key.endswith("nodes")), (k, t)  # no inter_node rates
    if tp * dp * pp <= 2:  # within a node
        assert n == t, (k, t, n)
    if tp == 2 and pp == 1 and stage <= 1:  # tp within a node, the dp group (its step end's) across the two
        assert abs(n["comm_s"] - t["comm_s"]) < 1e-12 and (n["step_end_s"] > t["step_end_s"] or dp == 1), (k, t, n)
    if dp == 4 and stage >= 2:  # its micro-batch's reductions cross nodes
        assert n["comm_s"] > 2 * t["comm_s"], (k, t, n)
    if pp == 2 and tp * dp == 2:  # the pipeline's neighbours on the other node
        assert n["comm_s"] > t["comm_s"], (k, t, n)
    d = dev[k]
    if stage == 3 and tp == 1 and pp == 1 and dp > 1:  # overlap_comm (stage 3's default): hidden
        assert d["comm_s"] < 1e-12 < t["comm_s"], (k, t, d)
    if stage < 3:  # overlap_comm off: as on the host
        assert d == t, (k, t, d)
log = open(f"{tmp}/explain-bf16.log").read()
gemm, att, other = map(float, re.search(r"GEMM ([0-9.]+) GFLOP, attention ([0-9.]+) GFLOP, the other ops ([0-9.]+) GB", log).groups())
compute = float(re.search(r"^time .*= compute ([0-9.e+-]+) ", log, re.M).group(1))
want = gemm * 1e9 / 2e11 + att * 1e9 / 5e10 + other * 1e9 / 1e10
assert abs(compute - want) <= 0.02 * want, (compute, want)
print(f"ok plan --machine: nodes, bf16 (compute {compute:.4g} s for {want:.4g} s), device overlap; presets")
PY
# --explain: the layout part by part and what each change leaves; gpt-tiny on 2 ranks in 20 MiB.
timeout 60 "$z3d" plan $tiny --ranks 2 --explain --mem-per-rank 20M > "$tmp/explain.log" 2>&1 || { cat "$tmp/explain.log"; fail "explain"; }
grep -qE "^memory .* total [0-9.]+ GB, over the 0.021 GB available by" "$tmp/explain.log" &&
  grep -qE "^  --set activation_checkpointing.enabled=true +[0-9.]+ GB" "$tmp/explain.log" &&
  grep -qE "^  --set tensor_parallel.tp_size=2 --set gradient_accumulation_steps=2 +[0-9.]+ GB +fits" "$tmp/explain.log" ||
  { cat "$tmp/explain.log"; fail "explain's lines"; }
echo "ok explain"
# A run whose node would need more than it has stops before it allocates, with the explanation:
# 120 layers of d_model 2560 (11 billion parameters, about 90 GB per rank at ZeRO-1 on 2 ranks).
expect_exit 2 plan-oom "this layout needs [0-9.]+ GB on this node \\(2 ranks.*more than its [0-9.]+ GB available" \
  $MPIRUN -np 2 "$z3d" train input/gpt-2.5b-nvme.json --run-dir "$tmp/oom" --set model.n_layer=120 \
  --set zero_optimization.stage=1 --set zero_optimization.offload_optimizer.device=none \
  --set zero_optimization.offload_param.device=none
grep -qE "^  --set zero_optimization.stage=3 +[0-9.]+ GB" "$tmp/plan-oom.log" || { cat "$tmp/plan-oom.log"; fail "plan-oom: no advice"; }
[[ ! -e $tmp/oom ]] || fail "plan-oom: the refused run made its run directory"
# --sweep: the layouts that fit as sweep.sh's LAYOUTS; sweep.sh (with sbatch standing in for
# Slurm's, which slurm_jobs tests) turns each into a job whose arguments the config code accepts.
timeout 60 "$z3d" plan $tiny --ranks 4 --sweep 3 --ranks-per-node 2 --mem-per-rank 16M > "$tmp/layouts.txt" 2>&1 ||
  { cat "$tmp/layouts.txt"; fail "plan --sweep"; }
mkdir -p "$tmp/bin"
printf '#!/bin/sh\necho "$*" >> "%s/sbatch.log"\necho 4242\n' "$tmp" > "$tmp/bin/sbatch"
chmod +x "$tmp/bin/sbatch"
PATH="$tmp/bin:$PATH" timeout 60 jobscripts/sweep.sh "$tmp/study" "$tmp/layouts.txt" -- $tiny > "$tmp/sweep.log" 2>&1 ||
  { cat "$tmp/layouts.txt" "$tmp/sweep.log"; fail "sweep.sh on the plan's layouts"; }
[[ $(wc -l < "$tmp/sbatch.log") -eq 3 ]] || { cat "$tmp/sbatch.log"; fail "sweep.sh submitted $(wc -l < "$tmp/sbatch.log") jobs, not 3"; }
while read -r line; do
  [[ $line == *"--nodes=2 --ntasks=4 --ntasks-per-node=2"* ]] || fail "a job's geometry: $line"
  read -r -a args <<< "${line#*train.sbatch }"
  timeout 60 "$z3d" train "${args[@]}" --dry-run --ranks 4 > "$tmp/dry.log" 2>&1 || { cat "$tmp/dry.log"; fail "dry run of: $line"; }
done < "$tmp/sbatch.log"
grep -q "activation_checkpointing.enabled=true" "$tmp/sbatch.log" || fail "no job carries the plan's activation checkpointing"
echo "ok plan --sweep: 3 jobs through sweep.sh, each accepted by the dry run"
expect_exit 2 plan-ranks "--ranks must be a whole number from 1 to 16777216, got '0'" "$z3d" plan $tiny --ranks 0
expect_exit 2 plan-ranks-empty "--ranks must be a whole number from 1 to 16777216, got ''" "$z3d" plan $tiny --ranks ""
expect_exit 2 plan-sweep "--sweep must be a whole number from 1 to 16777216, got 'two'" "$z3d" plan $tiny --ranks 2 --sweep two
expect_exit 2 plan-mem "--mem-per-rank must be a number of bytes from 1 to 1024T" "$z3d" plan $tiny --ranks 2 --mem-per-rank 3X
echo "plan: ok"
