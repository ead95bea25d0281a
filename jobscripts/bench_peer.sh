#!/usr/bin/env bash
# jobscripts/bench_peer.sh: zero3d's training speed against a PyTorch peer, on this machine.
#
# What it measures: tokens/s of the same GPT-2 (the config's model), the same batch, the same
# optimizer and the same R ranks, trained by
#   zero3d   mpirun -np R build/bin/zero3d train CONFIG (ZeRO stage S), and by
#   pytorch  jobscripts/bench_peer.py: DDP + ZeroRedundancyOptimizer (ZeRO-1), or plain DDP for
#            stage 0, one process and one thread per rank,
# in ALTERNATING rounds (zero3d, pytorch, zero3d, pytorch, ...), so slow drift on a shared machine
# hits both; each round also measures zero3d's fp32 GEMM rate (zero3d bench gemm, 1024^3).
#   zero3d tokens/s  = median over steps 3.. of the "train" records' tokens_per_s (metrics.jsonl)
#   pytorch tokens/s = median over the same steps (2 untimed, STEPS-2 timed) of tokens / step time
#
# How to read the table at the end:
#   median [min-max]    over rounds; when the two spreads overlap, the machine's noise is as large
#                       as the difference
#   zero3d/pytorch      > 1: zero3d is faster. "per-round" is the median of each round's ratio
#                       (each pair ran back to back), "of medians" the ratio of the two medians
#   of GEMM             model FLOP/s (tokens/s x flops_per_token of zero3d's "run" record) over
#                       R x rank 0's `bench gemm` rate: the fraction of this machine's sgemm
#                       throughput that one training step reaches (MFU against the GEMM, not a datasheet)
#   of FMA peak         the same over R x rank 0's FMA peak (bench gemm's hand-written FMA loop at the
#                       level zero3d runs): MFU against what the core can do at all
#
# usage: jobscripts/bench_peer.sh [--config input/bench-cpu.json] [--ranks 2] [--rounds 3] [--steps 10]
#                                 [--zero-stage 1] [--torch-mode zero1|ddp] [--out FILE.json]
# Builds nothing. zero3d runs as a user runs it: this script sets no thread or BLAS variable for it
# (the ones it inherits are printed). Every command is echoed with a leading "+".
# Env: MPIRUN (default "mpirun --oversubscribe"), PYTHON (default /usr/bin/python3), ZERO3D_ISA (zero3d
# at that level, and the peer too: OPENBLAS_CORETYPE and ATEN_CPU_CAPABILITY of the level).
set -euo pipefail
source "$(dirname "$0")/bench_lib.sh"

config=input/bench-cpu.json ranks=2 rounds=3 steps=10 stage=1 tmode="" out=""
while (($#)); do
  if [[ $1 != -h && $1 != --help ]] && (($# < 2)); then echo "bench_peer.sh: $1 needs a value" >&2; exit 2; fi
  case $1 in
    --config) config=$2 ;;
    --ranks) ranks=$2 ;;
    --rounds) rounds=$2 ;;
    --steps) steps=$2 ;;
    --zero-stage) stage=$2 ;;
    --torch-mode) tmode=$2 ;;
    --out) out=$2 ;;
    -h | --help) sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
    *) echo "bench_peer.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift 2
done
bench_init  # after the options: --help needs no build
for v in ranks rounds steps stage; do
  [[ ${!v} =~ ^[0-9]+$ ]] || { echo "bench_peer.sh: --${v/stage/zero-stage} must be a number" >&2; exit 2; }
done
((steps >= 3)) || { echo "bench_peer.sh: --steps must be >= 3 (steps 1-2 are warm-up)" >&2; exit 2; }
((ranks >= 1 && rounds >= 1)) || { echo "bench_peer.sh: --ranks and --rounds must be >= 1" >&2; exit 2; }
[[ -z $tmode ]] && { ((stage >= 1)) && tmode=zero1 || tmode=ddp; }
[[ $tmode == zero1 || $tmode == ddp ]] || { echo "bench_peer.sh: --torch-mode is zero1 or ddp" >&2; exit 2; }
[[ -f $config ]] || { echo "bench_peer.sh: no config $config" >&2; exit 2; }
"$PY" -c 'import torch' 2> /dev/null ||
  { echo "bench_peer.sh: the PyTorch peer needs torch for $PY: apt-get install python3-torch (Debian's CPU build)" >&2; exit 2; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench_peer.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM       # so the EXIT trap cleans up on Ctrl-C too

# The peer's environment. Debian's torch (BLAS_INFO=generic in torch.__config__.show()) runs fp32
# nn.Linear and matmul through sgemm_ of libblas.so.3, which Debian's alternatives point at OpenBLAS;
# its oneDNN (MKL-DNN) serves convolutions and bf16, not fp32 Linear. OpenBLAS picks its kernels at
# load from cpuid; OPENBLAS_CORETYPE forces the choice (an unknown CPU, or an inherited value, can
# land on slower kernels: HASWELL's run at about half SKYLAKEX's 1024^3 rate on an AVX-512 CPU).
# OMP_NUM_THREADS=1 sizes both torch's OpenMP pool and OpenBLAS's threads (OpenBLAS reads it when
# OPENBLAS_NUM_THREADS and GOTO_NUM_THREADS are unset, hence the -u: one thread per rank).
# With ZERO3D_ISA set (zero3d forced to a lower level) the peer runs at that level too: OpenBLAS's
# kernels of the level and ATen's vector kernels capped there (ATEN_CPU_CAPABILITY).
if [[ ${ZERO3D_ISA:-} == avx2 ]]; then core=HASWELL aten=avx2
elif [[ ${ZERO3D_ISA:-} == sse2 ]]; then core=PRESCOTT aten=default
elif grep -qw avx512f /proc/cpuinfo; then core=SKYLAKEX aten=""
elif grep -qw avx2 /proc/cpuinfo; then core=HASWELL aten=""
else core="" aten=""; fi
peer_env=(env -u OPENBLAS_NUM_THREADS -u GOTO_NUM_THREADS OMP_NUM_THREADS=1 ${core:+OPENBLAS_CORETYPE=$core}
          ${aten:+ATEN_CPU_CAPABILITY=$aten})

echo "# config $config, $ranks ranks, $rounds rounds of $steps steps, zero3d stage $stage vs pytorch $tmode"
echo "# zero3d inherits: $(env | grep -E '^(OMP|OPENBLAS|GOTO|MKL|ZERO3D)_[A-Z_]*=' | sort | tr '\n' ' ' || true)"
echo "# the peer runs with: ${peer_env[*]:1}"
echo "# (the peer's variables do not reach zero3d: it picks its GEMM libraries and their kernels itself, as 'zero3d bench gemm' names them)"
for round in $(seq "$rounds"); do
  d=$tmp/round$round
  mkdir -p "$d"
  # zero3d, as a user runs it; no validation pass
  bench_run "$d/zero3d.log" "${mpirun[@]}" -np "$ranks" "$z3d" train "$config" --run-dir "$d/run" \
    --set train_steps="$steps" --set zero_optimization.stage="$stage" --set 'data.val=""'
  # the peer: 2 untimed steps, then the ones zero3d's median covers
  bench_run "$d/peer.log" "${peer_env[@]}" "$PY" jobscripts/bench_peer.py "$config" --ranks "$ranks" \
    --mode "$tmode" --warmup 2 --steps $((steps - 2)) --threads 1
  # GEMM rate: every rank runs it at once, rank 0 prints "n ms/call GFLOP/s [more...]" lines
  bench_run "$d/gemm.log" "${mpirun[@]}" -np "$ranks" "$z3d" bench gemm --sizes 1024 --seconds 2
  gflops=$(awk '$1 == "1024" { print $3; exit }' "$d/gemm.log")
  [[ -n $gflops ]] || { echo "bench_peer.sh: no '1024' line in bench gemm's output:" >&2; cat "$d/gemm.log" >&2; exit 1; }
  peak=$(sed -n 's/^# FMA peak (.*): \([0-9.]*\) GFLOP\/s.*/\1/p' "$d/gemm.log")
  [[ -n $peak ]] || { echo "bench_peer.sh: no '# FMA peak' line in bench gemm's output:" >&2; cat "$d/gemm.log" >&2; exit 1; }
  # one JSON line per round into the results
  "$PY" - "$d/run/metrics.jsonl" "$d/peer.log" "$gflops" "$round" "$peak" >> "$tmp/rounds.jsonl" <<'PY'
import json, sys
sys.path.insert(0, "postprocess")
from bench_stats import med, records
metrics, peer_log, gflops, rnd, peak = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
run_dir = metrics.rsplit("/", 1)[0]
run = records(run_dir, "run")[0]
train = records(run_dir, "train")
peer = json.loads([l for l in open(peer_log) if l.startswith("{")][-1])   # its last JSON line
print(json.dumps({"round": rnd,
                  "zero3d": med(r["tokens_per_s"] for r in train if r["step"] >= 3),
                  "pytorch": peer["tokens_per_s"],
                  "gemm_gflops_rank0": gflops, "fma_peak_gflops_rank0": peak, "flops_per_token": run["flops_per_token"],
                  "zero3d_params": run["num_params"], "pytorch_params": peer["num_params"],
                  "zero3d_gemm": run.get("gemm", ""), "zero3d_threads": run.get("threads", 0),
                  "zero3d_loss": [train[0]["loss"], train[-1]["loss"]],
                  "pytorch_loss": [peer["losses"][0], peer["loss"]]}))
PY
  tail -n 1 "$tmp/rounds.jsonl" | "$PY" -c 'import json, sys; r = json.load(sys.stdin)
print("round %d: zero3d %.0f tokens/s (loss %.3f -> %.3f), pytorch %.0f tokens/s (loss %.3f -> %.3f), "
      "bench gemm rank 0 %.1f GFLOP/s" % (r["round"], r["zero3d"], *r["zero3d_loss"], r["pytorch"], *r["pytorch_loss"],
                                          r["gemm_gflops_rank0"]))
if r["round"] == 1:
    print("  zero3d ran GEMM %s with %d thread(s) per rank" % (r["zero3d_gemm"], r["zero3d_threads"]))'
done

"$PY" - "$tmp/rounds.jsonl" "$ranks" "$config" "$stage" "$tmode" "$steps" "$out" <<'PY'
import json, sys
sys.path.insert(0, "postprocess")
from bench_stats import med
path, R, config, stage, tmode, steps, out = sys.argv[1], int(sys.argv[2]), *sys.argv[3:]
rows = [json.loads(l) for l in open(path)]
fpt = rows[0]["flops_per_token"]
# fraction of the R-rank GEMM rate (R x rank 0's number: all ranks ran the GEMM at once)
frac = lambda r, k: r[k] * r["flops_per_token"] / (R * r["gemm_gflops_rank0"] * 1e9)
peak = lambda r, k: r[k] * r["flops_per_token"] / (R * r["fma_peak_gflops_rank0"] * 1e9)
res = {"config": config, "ranks": R, "rounds": len(rows), "steps": int(steps),
       "zero3d_stage": int(stage), "pytorch_mode": tmode, "flops_per_token": fpt,
       "gemm_note": "R-rank GEMM rate = ranks x rank 0's bench gemm GFLOP/s (all ranks measure at once)"}
for k in ("zero3d", "pytorch"):
    xs = [r[k] for r in rows]
    res[k] = {"tokens_per_s_median": med(xs), "tokens_per_s_min": min(xs), "tokens_per_s_max": max(xs)}
fs = [frac(r, "zero3d") for r in rows]
res["zero3d"].update(of_gemm_median=med(fs), of_gemm_min=min(fs), of_gemm_max=max(fs))
ps = [peak(r, "zero3d") for r in rows]
res["zero3d"].update(of_fma_peak_median=med(ps), of_fma_peak_min=min(ps), of_fma_peak_max=max(ps))
res["ratio_per_round_median"] = med(r["zero3d"] / r["pytorch"] for r in rows)
res["ratio_of_medians"] = res["zero3d"]["tokens_per_s_median"] / res["pytorch"]["tokens_per_s_median"]
res["gemm_gflops_rank0_median"] = med(r["gemm_gflops_rank0"] for r in rows)
res["per_round"] = rows

print(f"\n{config}, {R} ranks, {len(rows)} rounds, {fpt / 1e6:.1f} MFLOP/token; "
      f"GEMM rate = {R} x rank 0's bench gemm (median {res['gemm_gflops_rank0_median']:.1f} GFLOP/s)")
print(f"{'':18} {'tokens/s median [min-max]':>28} {'model FLOP/s of GEMM':>24} {'of FMA peak':>24}")
for k, name in (("zero3d", f"zero3d (stage {stage})"), ("pytorch", f"pytorch ({tmode})")):
    s = res[k]
    # the GEMM ran in zero3d's environment, so only zero3d's fraction is like for like
    g = f"{s['of_gemm_median']:.3f} [{s['of_gemm_min']:.3f}-{s['of_gemm_max']:.3f}]" if k == "zero3d" else "-"
    f = f"{s['of_fma_peak_median']:.3f} [{s['of_fma_peak_min']:.3f}-{s['of_fma_peak_max']:.3f}]" if k == "zero3d" else "-"
    print(f"{name:18} {s['tokens_per_s_median']:>10.0f} [{s['tokens_per_s_min']:.0f}-{s['tokens_per_s_max']:.0f}]"
          f"{'':>4} {g:>24} {f:>24}")
print(f"zero3d/pytorch: {res['ratio_per_round_median']:.2f} (median of per-round ratios), "
      f"{res['ratio_of_medians']:.2f} (ratio of medians)")
if any(r["zero3d_params"] != r["pytorch_params"] for r in rows):
    print(f"WARNING: parameter counts differ: zero3d {rows[0]['zero3d_params']}, pytorch {rows[0]['pytorch_params']}")
if out:
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"wrote {out}")
PY
