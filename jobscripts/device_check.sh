#!/usr/bin/env bash
# jobscripts/device_check.sh: the GPU path checked in one run on a machine with an NVIDIA GPU (the
# lent H200), in under 8 minutes, with nothing but the repository:
#   1. build zero3d with the CUDA backend (sm_90) against the machine's MPI and parallel HDF5 or,
#      where it has none, the Debian libraries carried in .device/deps (jobscripts/device_deps.sh);
#   2. test_kernels: every backend op on the CUDA backend against the host references, and bf16
#      attention through cuDNN's fused flash attention against the double reference, its backward
#      run twice for the same bits (cuDNN from the toolkit, else from PyTorch's wheel);
#   3. test_collectives --cuda: every collective, send and receive of every group on GPU memory
#      through NCCL, on 1 rank (and, last, on 2 ranks sharing the one GPU: NCCL refuses two ranks
#      on one device unless they look like two hosts, so each gets its own NCCL_HOSTID and they
#      talk through NCCL's socket transport on lo);
#   4. gpt-tiny for 50 steps on the GPU and on the host, fp32 and bf16 (with fp32, then with bf16
#      activations), losses compared (fp32 within 1e-4 relative, bf16 within 2e-2); llama-tiny (the Llama family's ops) in fp32 too;
#      and gpt-tiny bf16 with the optimizer offloaded to host memory (AdamW on the CPU) against
#      the host run, within 2e-2;
#   5. a GPT-2 350M-shape model (d 1024, 24 layers, 16 heads, seq 1024, micro-batch 8) in bf16 for
#      20 steps on the GPU: tokens/s and MFU against the GPU's dense bf16 peak; then, the peer on
#      the same card, PyTorch training the same model from the same arguments
#      (jobscripts/bench_peer.py: bf16 autocast, scaled_dot_product_attention on cuDNN or flash,
#      fused AdamW), eager and, while time is left, under torch.compile: tokens/s, MFU by zero3d's
#      FLOP count and peak, peak GPU memory (PyTorch's and zero3d's) and zero3d's ratios;
#      and `zero3d bench kernels --backend cuda` at that shape: every kernel's and GEMM's rate
#      against the GPU's bf16 peak or its copy bandwidth;
#   6. gpt-tiny on 2 ranks sharing the GPU with ZeRO-2 (its gradients reduce-scattered by NCCL)
#      against 2 host ranks, fp32 within 1e-4;
# then one table. Logs and metrics go under $OUT (the device tool's folder) or runs/device-check.
#
# usage: jobscripts/device_check.sh                      on the GPU machine, from the repository root
#        jobscripts/device_deps.sh fetch .device/deps    here first, once: the libraries to carry
#        (the device tool's run: carry [".device/deps"], command "bash jobscripts/device_check.sh")
# Without a GPU it builds, runs the host half and marks the GPU rows skipped: how the script
# itself is tried before a device is lent. DEVICE_BACKEND=host goes further there: the host stands
# in for the GPU in every row (its own kernel tests, itself as the "GPU" run, the big model cut to
# 2 layers and seq 256 for 6 steps, PyTorch on the CPU's torch), so every step and parser of the
# script runs. PEER_PYTHON names the python3 with torch (default: the first of python3,
# /usr/bin/python3 that imports it).
set -uo pipefail
cd "$(dirname "$0")/.."
t_start=$SECONDS
deadline=$((t_start + ${DEVICE_CHECK_SECONDS:-465}))  # the table by 8 minutes, the device tool's limit for it
out=${OUT:-runs/device-check}
mkdir -p "$out"
log=$out/device_check.log
: > "$log"
# The table grows in $out/table.md row by row, so a run stopped from outside still leaves its rows.
printf '| %-34s | %-10s | %s |\n|%s|%s|%s|\n' "check" "result" "detail" "------------------------------------" \
  "------------" "----------------------------------------" > "$out/table.md"
failures=0
row() {
  printf '| %-34s | %-10s | %s |\n' "$1" "$2" "$3" >> "$out/table.md"
  [[ $2 == FAIL ]] && failures=$((failures + 1))
  return 0
}
# Seconds a step may take: its own limit, or what is left before the deadline less any seconds
# kept for the rows after it (0: skip it). usage: limit SECONDS [KEEP]
limit() {
  local left=$((deadline - SECONDS - 15 - ${2:-0}))
  ((left < 30)) && echo 0 || echo $((left < $1 ? left : $1))
}
finish() {
  echo
  cat "$out/table.md"
  echo "($((SECONDS - t_start)) s in all; $failures failed; logs in $out)"
  exit $((failures > 0 ? 1 : 0))
}
trap finish EXIT
# The row of test_kernels' CudnnAttention.cuda (its log $1, cuDNN's log $2, test_kernels' exit
# status $3), with the reason in one run: a shape cuDNN refuses runs on the warp kernels and
# passes, so a refusal in the test's lines fails the row with zero3d's reason (cuDNN's own, per
# engine tried); a failed check shows its first message; a run cut short shows the fatal line
# (cudnnBackendExecute failing is fatal), the time limit that killed it, else the log's last line.
cudnn_row() {
  local name="cuDNN attention vs reference" lines result refused fatal
  lines=$(sed -n '/^\[ RUN  *\] CudnnAttention\.cuda$/,/^\[ *[A-Z]* *\] CudnnAttention\.cuda (/p' "$1")
  result=$(grep -o '^\[ *\(OK\|FAILED\|SKIPPED\) *\] CudnnAttention\.cuda (' <<<"$lines")
  refused=$(grep -m1 -o 'cuDNN attention: .*' <<<"$lines")
  refused=${refused%; the backend*}
  fatal=$(grep -m1 -A2 'fatal cuDNN error' <<<"$lines" | sed -n 's/^ *-> //p')
  case $result in
    *OK*) if [[ -n $refused ]]; then row "$name" "FAIL" "refused, the warp kernels ran: ${refused:0:240} (cuDNN's log: $2)"
          else row "$name" "ok" "out, lse, dqkv within bf16; backward twice: same bits"; fi ;;
    *FAILED*) row "$name" "FAIL" "$(grep -m1 -A2 ': Failure$' <<<"$lines" | grep -v ': Failure$\|^Failed$' | head -1 | cut -c1-200)${refused:+; ${refused:0:200}}" ;;
    *SKIPPED*) row "$name" "skipped" "$(grep -m1 -A1 ': Skipped$' <<<"$lines" | tail -1 | cut -c1-160)" ;;
    *) if [[ -z $fatal && $3 == 124 ]]; then fatal="test_kernels killed at its time limit (exit 124)"; fi
       row "$name" "FAIL" "no result: ${fatal:-$(tail -1 "$1")}" ;;
  esac
}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # the device machine runs us as root
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}  # the host runs' threads (16 cores there)

# ---- the machine ----
gpu="" dev=${DEVICE_BACKEND:-cuda} kernels='*cuda*'
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)
fi
if [[ $dev == host ]]; then gpu="none: the host stands in (DEVICE_BACKEND=host)" kernels='*host_sse2*'; fi
if [[ $dev == host ]]; then row "GPU" "stand-in" "$gpu"
elif [[ -n $gpu ]]; then row "GPU" "found" "$gpu"
else row "GPU" "none" "no NVIDIA driver or device: GPU rows are skipped"
fi
nvcc=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[[ -x $nvcc ]] || { row "nvcc" "FAIL" "no CUDA compiler (set CUDACXX)"; exit 1; }

# ---- dependencies: the machine's own, else the carried Debian libraries ----
# (Open MPI only: the runs below use its mpirun options.)
if command -v ompi_info >/dev/null && command -v mpicc >/dev/null && command -v h5pcc >/dev/null; then
  row "MPI, HDF5" "machine's" "$(command -v mpicc), $(command -v h5pcc)"
elif ls .device/deps/*.deb >/dev/null 2>&1; then
  deps=/tmp/z3d-deps
  if ! jobscripts/device_deps.sh unpack .device/deps "$deps" >>"$log" 2>&1; then
    row "carried libraries" "FAIL" "see $log"
    exit 1
  fi
  # shellcheck disable=SC1091
  source "$deps/env.sh"
  row "MPI, HDF5" "carried" "Debian 12 libraries unpacked under $deps"
else
  row "MPI, HDF5" "FAIL" "none here and nothing carried: run jobscripts/device_deps.sh fetch .device/deps first"
  exit 1
fi

# NCCL: the toolkit's, else the one PyTorch's wheels bring (nvidia-nccl-*: nccl.h and
# libnccl.so.2 under site-packages/nvidia/nccl, without the unversioned link CMake looks for).
cuda_home=$(dirname "$(dirname "$nvcc")")
if [[ -z ${NCCL_HOME:-} && ! -e $cuda_home/include/nccl.h ]]; then
  wheel=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)
  if [[ -n $wheel && -e $wheel/include/nccl.h ]]; then
    export NCCL_HOME=/tmp/z3d-nccl
    mkdir -p $NCCL_HOME/lib
    ln -sfn "$wheel/include" $NCCL_HOME/include
    ln -sf "$(ls "$wheel"/lib/libnccl.so* | head -1)" $NCCL_HOME/lib/libnccl.so
    export LD_LIBRARY_PATH=$wheel/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    row "NCCL" "wheel's" "$wheel (the toolkit has none)"
  fi
fi

# cuDNN (bf16 runs' fused flash attention; zero3d loads libcudnn_graph.so.9 at run time): the
# toolkit's, else the one PyTorch's wheels bring (nvidia-cudnn-*: headers and libcudnn*.so.9 under
# site-packages/nvidia/cudnn). Its attention engines compile with NVRTC, the toolkit's.
if [[ -z ${CUDNN_HOME:-} && ! -e $cuda_home/include/cudnn_graph.h ]]; then
  wheel=$(python3 -c 'import nvidia.cudnn as m; print(list(m.__path__)[0])' 2>/dev/null)
  [[ -n $wheel && -e $wheel/include/cudnn_graph.h ]] && export CUDNN_HOME=$wheel
fi
export LD_LIBRARY_PATH=${CUDNN_HOME:+$CUDNN_HOME/lib:}$cuda_home/lib64:$cuda_home/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cudnn=$(for d in ${LD_LIBRARY_PATH//:/ }; do ls "$d"/libcudnn_graph.so.9 2>/dev/null; done | head -1)
if [[ -n $cudnn ]]; then
  row "cuDNN" "found" "$cudnn${CUDNN_HOME:+ (from the wheel: the toolkit has none)}"
  export ZERO3D_EXPECT_CUDNN=1  # test_kernels' CudnnAttention fails when cuDNN is not what ran
else
  row "cuDNN" "none" "no libcudnn_graph.so.9: bf16 attention runs on the backend's own kernels"
fi

# ---- 1. build ----
t=$SECONDS
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
build=build-device
if [[ -n ${DEVICE_PREBUILT:-} ]]; then
  # A build made elsewhere (its bin/ and lib/), for when the build here is what failed.
  mkdir -p "$build" && cp -r "$DEVICE_PREBUILT"/bin "$DEVICE_PREBUILT"/lib "$build"/
  nccl="zero3d: no NCCL"
  readelf -d "$build/lib/libzero3d_cuda.so" 2>/dev/null | grep -q 'libnccl' && nccl="zero3d: NCCL (prebuilt)"
  row "build (CUDA, sm_90)" "prebuilt" "$DEVICE_PREBUILT, ${nccl#zero3d: }"
elif ! { cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DZERO3D_CUDA=ON \
           -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES=90 &&
         cmake --build "$build" -j "$(getconf _NPROCESSORS_ONLN)" --target zero3d test_kernels test_collectives zero3d_cuda; } >>"$log" 2>&1; then
  row "build (CUDA, sm_90)" "FAIL" "see $log"
  exit 1
else
  row "build (CUDA, sm_90)" "ok" "$((SECONDS - t)) s, $(getconf _NPROCESSORS_ONLN) cores"
  nccl=$(grep -o 'zero3d: NCCL .*\|zero3d: no NCCL' "$log" | tail -1)
fi
z3d=$build/bin/zero3d
missing=$(ldd "$z3d" "$build/lib/libzero3d_cuda.so" 2>&1 | awk '/not found/ {print $1}' | sort -u | tr '\n' ' ')
[[ -n $missing ]] && row "libraries zero3d loads" "FAIL" "not found: $missing"
mpirun=(mpirun --oversubscribe -np 1)

# ---- 2. kernels on the CUDA backend against the host references ----
if [[ -n $gpu ]] && seconds=$(limit 150) && ((seconds > 0)); then
  # cuDNN's own log of its errors and warnings (a graph its engines refuse says why only there):
  # written only when something goes wrong, so it costs no time.
  # And cuDNN's description of the GPU (its device-property JSON, from the backend's handle): for
  # tests/data/cudnn (kernels/README.md says how), where test_cudnn_graph builds the attention plans for it without a GPU.
  CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG="$out/cudnn.log" ZERO3D_CUDNN_DEVICE_JSON="$out/cudnn_device.json" \
    timeout "$seconds" "$build/bin/test_kernels" --gtest_filter="$kernels" >"$out/test_kernels.log" 2>&1
  rc=$?
  passed=$(grep -c '^\[       OK \]' "$out/test_kernels.log")
  failed=$(grep -c '^\[  FAILED  \].*(' "$out/test_kernels.log")
  first=$(grep '^\[  FAILED  \].*(' "$out/test_kernels.log" | head -3 | sed 's/.*\] //; s/ (.*//' | tr '\n' ' ')
  row "test_kernels, CUDA backend" "$([[ $rc == 0 && $passed -gt 0 ]] && echo ok || echo FAIL)" \
    "$passed passed, $failed failed (exit $rc)${first:+: $first}"
  # cuDNN's attention (in test_kernels above): against the double reference, and its backward twice.
  [[ $dev == host ]] || cudnn_row "$out/test_kernels.log" "$out/cudnn.log" "$rc"
  [[ -s $out/cudnn_device.json ]] && row "cuDNN device properties" "written" "$out/cudnn_device.json"
else
  row "test_kernels, CUDA backend" "skipped" "$([[ -n $gpu ]] && echo "no time left" || echo "no GPU")"
fi

# ---- 3. NCCL: every collective of every group on GPU memory, against the known answers ----
# (1 rank first: where it fails, the training runs below stage through MPI instead, so they still
# check the kernels.)
collectives() {  # collectives NAME SECONDS MPIRUN-ARGS...: a row from test_collectives --cuda
  local name=$1 seconds
  seconds=$(limit "$2")
  shift 2
  if [[ -z $gpu || $dev == host ]]; then row "$name" "skipped" "no GPU"; return; fi
  if [[ $nccl != "zero3d: NCCL"* ]]; then row "$name" "FAIL" "built without NCCL (${nccl:-?})"; return; fi
  ((seconds > 0)) || { row "$name" "FAIL" "no time left"; return; }
  timeout "$seconds" mpirun --oversubscribe "$@" >"$out/$name.log" 2>&1
  local rc=$? res
  res=$(grep -o 'collectives on .*failed' "$out/$name.log" | tail -1)
  if [[ $rc == 0 && $res == *", 0 failed" ]]; then row "$name" "ok" "$res; ${nccl#zero3d: }"
  else row "$name" "FAIL" "exit $rc: ${res:-$(grep -m1 -i 'nccl warn\|error' "$out/$name.log" | cut -c1-150)}"
  fi
}
bin_coll=$build/bin/test_collectives
before=$failures fallback=()
collectives "NCCL collectives, 1 rank" 60 -np 1 "$bin_coll" --cuda
((failures > before)) && fallback=(--set comm.device_collectives=mpi)

# ---- 4. gpt-tiny, GPU against host ----
tiny=(input/gpt-tiny.json --set data.val= --set train_steps=50 --set steps_per_print=50)
train() {  # train NAME BACKEND SECONDS ARGS...: exit status (124: out of time)
  local name=$1 backend=$2 seconds
  seconds=$(limit "$3")
  shift 3
  rm -rf "$out/$name"
  ((seconds > 0)) || { echo "no time left for $name" >"$out/$name.log"; return 124; }
  timeout "$seconds" "${mpirun[@]}" "$z3d" train --backend "$backend" --run-dir "$out/$name" "$@" \
    >"$out/$name.log" 2>&1
}
compare() {  # compare A B TOLERANCE: "max relative difference of the losses" or FAIL text
  python3 - "$out/$1/metrics.jsonl" "$out/$2/metrics.jsonl" "$3" <<'PY'
import sys
sys.path.insert(0, "postprocess")
from metrics_file import records
def losses(p):
    return {r["step"]: r["loss"] for r in records(p, "train")}
a, b, tol = losses(sys.argv[1]), losses(sys.argv[2]), float(sys.argv[3])
if a.keys() != b.keys() or not a:
    print(f"FAIL steps differ: {len(a)} vs {len(b)}"); sys.exit(1)
if any(v is None for v in (*a.values(), *b.values())):  # non-finite losses are written as null
    print("FAIL a loss is not finite"); sys.exit(1)
worst = max(abs(a[s] - b[s]) / abs(b[s]) for s in a)
last = max(a)
print(f"{'ok' if worst <= tol else 'FAIL'} max rel diff {worst:.2e} (tol {tol:g}) over {len(a)} steps; "
      f"last loss {a[last]:.4f} vs {b[last]:.4f}")
sys.exit(0 if worst <= tol else 1)
PY
}
# bf16 twice, the same activations on both sides: fp32 ones (the GPU's path before bf16
# activations), then bf16 ones (compute.activations: the GPU's default; the host stages them through
# its fp32 loops to the same semantics), so a fault in the bf16-activation kernels shows on its own row
for prec in fp32 bf16 bf16acts; do
  p=(); tol=1e-4
  [[ $prec == bf16 ]] && p=(--set bf16.enabled=true --set 'compute.activations="fp32"') && tol=2e-2
  [[ $prec == bf16acts ]] && p=(--set bf16.enabled=true --set 'compute.activations="bf16"') && tol=2e-2
  if ! train "tiny_host_$prec" host 60 "${tiny[@]}" "${p[@]}"; then
    row "gpt-tiny $prec, GPU vs host" "FAIL" "host run failed: $out/tiny_host_$prec.log"
    continue
  fi
  if [[ -z $gpu ]]; then
    row "gpt-tiny $prec, GPU vs host" "skipped" "no GPU (the host run passed)"
    continue
  fi
  if ! train "tiny_cuda_$prec" "$dev" 90 "${tiny[@]}" "${p[@]}" "${fallback[@]}"; then
    row "gpt-tiny $prec, GPU vs host" "FAIL" "GPU run failed: $(tail -1 "$out/tiny_cuda_$prec.log")"
    continue
  fi
  res=$(compare "tiny_cuda_$prec" "tiny_host_$prec" "$tol" 2>>"$log") || [[ $res == FAIL* ]] ||
    res="FAIL the comparison broke (see $log)"
  row "gpt-tiny $prec, GPU vs host" "${res%% *}" "${res#* }"
done

# ---- 4a. llama-tiny (RMSNorm, RoPE, SwiGLU, grouped-query attention, untied head), GPU against host ----
llama=(input/llama-tiny.json --set data.val= --set train_steps=50 --set steps_per_print=50)
name="llama-tiny fp32, GPU vs host"
if ! train llama_host host 60 "${llama[@]}"; then row "$name" "FAIL" "host run failed: $out/llama_host.log"
elif [[ -z $gpu ]]; then row "$name" "skipped" "no GPU (the host run passed)"
elif ! train llama_cuda "$dev" 90 "${llama[@]}" "${fallback[@]}"; then
  row "$name" "FAIL" "GPU run failed: $(tail -1 "$out/llama_cuda.log")"
else
  res=$(compare llama_cuda llama_host 1e-4 2>>"$log") || [[ $res == FAIL* ]] || res="FAIL the comparison broke (see $log)"
  row "$name" "${res%% *}" "${res#* }"
fi

# ---- 4b. gpt-tiny bf16 with the optimizer offloaded from the GPU (state in host memory, AdamW on the CPU) ----
name="gpt-tiny bf16, offload cpu, GPU vs host"
off=(--set bf16.enabled=true --set zero_optimization.stage=1 --set zero_optimization.offload_optimizer.device=cpu
     --set zero_optimization.sub_group_size=50000)
if [[ -z $gpu ]]; then row "$name" "skipped" "no GPU"
elif [[ ! -f $out/tiny_host_bf16/metrics.jsonl ]]; then row "$name" "FAIL" "no host bf16 run to compare with"
# The stand-in runs it on device-memory walls (the host backend's memory made a device's), so
# the offload path from a device runs there too.
elif ! ZERO3D_DEVICE_WALLS=$([[ $dev == host ]] && echo 1 || echo 0) \
       train tiny_cuda_offload "$dev" 90 "${tiny[@]}" "${off[@]}" "${fallback[@]}"; then
  row "$name" "FAIL" "GPU run failed: $(tail -1 "$out/tiny_cuda_offload.log")"
else
  res=$(compare tiny_cuda_offload tiny_host_bf16 2e-2 2>>"$log") || [[ $res == FAIL* ]] ||
    res="FAIL the comparison broke (see $log)"
  copies=$(python3 - "$out/tiny_cuda_offload/metrics.jsonl" 2>>"$log" <<'PY'
import sys
sys.path.insert(0, "postprocess")
from metrics_file import records
t = records(sys.argv[1], "train")[-1]
print(f"last step: copies {t['offload_copy_s'] * 1e3:.1f} ms, waited {t['offload_copy_wait_s'] * 1e3:.1f} ms, "
      f"{(t['offload_down_bytes'] + t['offload_up_bytes']) / 1e6:.1f} MB")
PY
)
  row "$name" "${res%% *}" "${res#* }; ${copies:-no offload fields in the metrics}"
fi

# ---- 5. GPT-2 350M shape, bf16, on the GPU ----
if [[ -n $gpu ]]; then
  steps=20
  big=(input/gpt2-124m.json --set data.val= --set model.d_model=1024 --set model.n_layer=24 --set model.n_head=16
       --set train_micro_batch_size_per_gpu=8 --set bf16.enabled=true)
  # PyTorch's untimed and timed steps (5b): those zero3d's median leaves out and takes
  peer_steps=(--warmup $((steps / 4)) --steps $((steps - steps / 4)))
  # The stand-in: 6 steps; PyTorch 1 + 2 (the CPU's torch takes 10-20 s a step there)
  [[ $dev == host ]] && steps=6 big+=(--set model.n_layer=2 --set model.seq_len=256) peer_steps=(--warmup 1 --steps 2)
  big+=(--set train_steps=$steps --set steps_per_print=$steps)
  # zero3d's median tokens/s, peak FLOP/s, FLOPs per token and peak GPU memory, for the PyTorch rows below
  z_tps="" z_peak="" z_fpt="" z_mem=""
  if train gpt350m_cuda_bf16 "$dev" 180 "${big[@]}" "${fallback[@]}"; then
    res=$(python3 - "$out/gpt350m_cuda_bf16/metrics.jsonl" "$steps" 2>>"$log" <<'PY'
import statistics, sys
sys.path.insert(0, "postprocess")
from metrics_file import records
run = records(sys.argv[1], "run")[0]
first = int(sys.argv[2]) // 4 + 1  # warm-up left out
train = [r for r in records(sys.argv[1], "train") if r["step"] >= first]
if not train or any(r[k] is None for r in train for k in ("tokens_per_s", "mfu", "loss")):
    sys.exit(1)  # no steps, or a non-finite value (written as null)
tps = statistics.median(r["tokens_per_s"] for r in train)
mfu = statistics.median(r["mfu"] for r in train)
attention = run.get("backend", "").partition("attention: ")[2] or "not named by the backend"
mem = train[-1].get("device_mem_peak_bytes") or 0  # 0: the host stand-in, whose memory is the OS's
print(tps, run.get("peak_flops") or 0, run.get("flops_per_token") or 0, mem)  # first line: for the next rows
print(f"{tps:,.0f} tokens/s, MFU {100 * mfu:.2f}% of {run.get('peak_flops', 0) / 1e12:.3g} TFLOP/s "
      f"({run.get('num_params', 0) / 1e6:.0f}M parameters; median of steps {first}-{train[-1]['step']}; "
      f"loss {train[-1]['loss']:.3f}; {train[-1].get('launches', '?')} launches a step; "
      f"{'peak GPU memory %.2f GiB (its buffers); ' % (mem / 2**30) if mem else ''}attention: {attention}; "
      f"activations {run.get('activations', '?')})")
PY
)
    read -r z_tps z_peak z_fpt z_mem <<<"$res"
    res=${res#*$'\n'}
    refused=$(grep -m1 -o 'cuDNN attention: .*' "$out/gpt350m_cuda_bf16.log" | cut -c1-240)
    res+=${refused:+; $refused}
    if [[ -n $res ]]; then row "GPT-2 350M shape, bf16, $steps steps" "ok" "$res"
    else row "GPT-2 350M shape, bf16, $steps steps" "FAIL" "no steps or a non-finite value in its metrics"
    fi
  else
    row "GPT-2 350M shape, bf16, $steps steps" "FAIL" "$(tail -1 "$out/gpt350m_cuda_bf16.log")"
  fi
else
  row "GPT-2 350M shape, bf16" "skipped" "no GPU"
fi

# ---- 5a. every kernel and GEMM of that micro-batch on the GPU, against its bounds ----
# zero3d bench kernels --backend: each call timed on the device, FLOPs against the GPU's bf16 peak
# and bytes against its copy bandwidth (the whole table in $out/bench_kernels.log), at the shape of
# the run above (the config it resolved, in its run dir); the row names attention's rates, the
# GEMMs' range and the elementwise kernels' median share.
if [[ -z $gpu ]]; then
  row "bench kernels, 350M shape" "skipped" "no GPU"
elif [[ ! -f $out/gpt350m_cuda_bf16/config.json ]]; then
  row "bench kernels, 350M shape" "FAIL" "no resolved config from the 350M run"
else
  seconds=$(limit 60)
  if ((seconds == 0)); then row "bench kernels, 350M shape" "skipped" "no time left before the deadline"
  elif timeout "$seconds" "$z3d" bench kernels --config "$out/gpt350m_cuda_bf16/config.json" --backend "$dev" --seconds 0.05 \
         >"$out/bench_kernels.log" 2>&1; then
    res=$(python3 - "$out/bench_kernels.log" 2>>"$log" <<'PY'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"^(\S.*?) +([0-9.]+) +([0-9.]+) (TF|GB)/s +([0-9.]+)%$", line.rstrip())
    if m:
        rows[m.group(1)] = (float(m.group(3)), m.group(4), float(m.group(5)))
gemm = [v[2] for k, v in rows.items() if re.search(r" (fwd|dx|dW) \d+x\d+x\d+$", k)]
bytes_bound = [v[2] for k, v in rows.items() if v[1] == "GB" and k not in ("adam_step", "adam_step_bf16")]
att = [rows.get(k) for k in ("attention_forward", "attention_backward")]
if None in att or not gemm or not bytes_bound:
    sys.exit(1)
print(f"attention fwd {att[0][0]:.1f} / bwd {att[1][0]:.1f} TFLOP/s ({att[0][2]:.0f}% / {att[1][2]:.0f}% of peak); "
      f"GEMMs {min(gemm):.0f}-{max(gemm):.0f}% of peak; elementwise median {statistics.median(bytes_bound):.0f}% "
      f"of the copy bandwidth (table: bench_kernels.log)")
PY
)
    if [[ -n $res ]]; then row "bench kernels, 350M shape" "ok" "$res"
    else row "bench kernels, 350M shape" "FAIL" "no table in $out/bench_kernels.log"
    fi
  else
    row "bench kernels, 350M shape" "FAIL" "$(tail -1 "$out/bench_kernels.log" | cut -c1-160)"
  fi
fi

# ---- 5b. the peer on the same card: PyTorch trains the same model on the same batch ----
# jobscripts/bench_peer.py gets the 350M row's arguments (its --set overrides) and as many
# untimed and timed steps as zero3d's median left out and took (on a GPU): eager (attention through
# scaled_dot_product_attention pinned to cuDNN's or flash's backend where this torch has them,
# fused AdamW), then under torch.compile while time is left. Its MFU uses zero3d's FLOP count and
# zero3d's peak; "zero3d x" is zero3d's median tokens/s over PyTorch's. Peak memory is PyTorch's
# (torch.cuda.max_memory_allocated) beside zero3d's (device_mem_peak_bytes: its buffers, the
# same kind of count), as zero3d's over PyTorch's. On the stand-in it runs on the CPU's torch.
peer_py=${PEER_PYTHON:-}
for py in python3 /usr/bin/python3; do
  [[ -z $peer_py ]] && "$py" -c 'import torch' 2>/dev/null && peer_py=$py
done
peer() {  # peer NAME LABEL SECONDS KEEP ARGS...: a row from bench_peer.py's JSON line (KEEP: see limit)
  local name=$1 label=$2 seconds rc res
  seconds=$(limit "$3" "$4")
  shift 4
  if [[ -z $gpu ]]; then row "$label" "skipped" "no GPU"; return; fi
  if [[ -z $peer_py ]]; then row "$label" "FAIL" "no python3 with torch (PEER_PYTHON names one)"; return; fi
  ((seconds > 0)) || { row "$label" "skipped" "no time left before the deadline"; return; }
  local on=(--device cuda)
  [[ $dev == host ]] && on=(--device cpu --threads "$OMP_NUM_THREADS")
  timeout "$seconds" "$peer_py" jobscripts/bench_peer.py "${big[@]}" "${on[@]}" "${peer_steps[@]}" \
    ${z_peak:+--peak-flops "$z_peak"} "$@" >"$out/$name.json" 2>"$out/$name.log"
  rc=$?
  res=$(python3 - "$out/$name.json" "$rc" "$z_tps" "$z_fpt" "$z_mem" 2>>"$log" <<'PY'
import json, sys
lines = [l for l in open(sys.argv[1]) if l.startswith("{")]
p = json.loads(lines[-1]) if lines else {}
rc, z_tps, z_fpt, z_mem = int(sys.argv[2]), float(sys.argv[3] or 0), float(sys.argv[4] or 0), float(sys.argv[5] or 0)
if rc == 3 and "error" in p:  # what this torch lacks (torch.compile)
    print(f"skipped {p['error']}"); sys.exit()
if rc != 0 or "tokens_per_s" not in p:
    sys.exit(1)
tps = p["tokens_per_s"]
mfu = f"MFU {100 * p['mfu']:.2f}%" if p["mfu"] is not None else "MFU ? (no zero3d peak)"
ratio = f"zero3d {z_tps / tps:.2f}x" if z_tps else "zero3d ? (its row failed)"
gib = p["peak_memory_bytes"] / 2**30
memory = (f"peak memory {gib:.2f} GiB (max_memory_allocated)" if p["peak_memory"].startswith("torch.cuda")
          else f"max RSS {gib:.2f} GiB (a CPU process: no GPU memory)")
if z_mem and p["peak_memory"].startswith("torch.cuda"):
    memory += f", zero3d's {z_mem / p['peak_memory_bytes']:.2f}x"

detail = (f"{tps:,.0f} tokens/s, {mfu}, {memory}; {ratio}; {p['attention']}, {p['optimizer']}, "
          f"torch {p['torch']}, median of {len(p['step_s'])} steps")
if z_fpt and abs(p["flops_per_token"] - z_fpt) > 1e-9 * z_fpt:  # the same count, or not the same model
    print(f"FAIL FLOPs per token differ: zero3d {z_fpt:.6g}, PyTorch {p['flops_per_token']:.6g}; {detail}")
else:
    print(f"ok {detail}")
PY
)
  if [[ -z $res ]]; then
    if ((rc == 124)); then res="FAIL out of its $seconds s"
    elif ((rc == 0)); then res="FAIL no result in $out/$name.json (see $log)"
    else res="FAIL exit $rc: $(tail -1 "$out/$name.log" | cut -c1-160)"
    fi
  fi
  row "$label" "${res%% *}" "${res#* }"
}
peer peer_eager "PyTorch eager, same model" 120 0
# compiling takes a minute or more: the two-rank rows below keep 60 s
peer peer_compiled "PyTorch compiled, same model" 240 60 --compile

# ---- 3, last: two ranks, one GPU ----
# Each rank its own NCCL_HOSTID, so NCCL's duplicate-GPU check passes and the ranks talk through
# its socket transport on the loopback interface.
nccl_2=(-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_NET=Socket -x NCCL_SOCKET_IFNAME=lo)
collectives "NCCL collectives, 2 ranks, 1 GPU" 90 -np 1 -x NCCL_HOSTID=zero3d-a "${nccl_2[@]}" "$bin_coll" --cuda \
  : -np 1 -x NCCL_HOSTID=zero3d-b "${nccl_2[@]}" "$bin_coll" --cuda

# ---- 6. gpt-tiny on 2 ranks sharing the GPU (ZeRO-2 over NCCL) against 2 host ranks ----
train2() {  # train2 NAME BACKEND SECONDS ARGS...: 2 ranks; on the GPU each its own NCCL_HOSTID
  local name=$1 backend=$2 seconds
  seconds=$(limit "$3")
  shift 3
  rm -rf "$out/$name"
  ((seconds > 0)) || { echo "no time left for $name" >"$out/$name.log"; return 124; }
  local cmd=("$z3d" train --backend "$backend" --run-dir "$out/$name" "$@")
  if [[ $backend == host ]]; then
    timeout "$seconds" mpirun --oversubscribe -np 2 "${cmd[@]}" >"$out/$name.log" 2>&1
  else
    timeout "$seconds" mpirun --oversubscribe -np 1 -x NCCL_HOSTID=zero3d-a "${nccl_2[@]}" "${cmd[@]}" \
      : -np 1 -x NCCL_HOSTID=zero3d-b "${nccl_2[@]}" "${cmd[@]}" >"$out/$name.log" 2>&1
  fi
}
z2=("${tiny[@]}" --set train_steps=30 --set steps_per_print=30 --set zero_optimization.stage=2)
name="gpt-tiny, 2 ranks ZeRO-2, NCCL vs host"
if [[ -z $gpu || $dev == host ]]; then row "$name" "skipped" "no GPU"
elif [[ $nccl != "zero3d: NCCL"* ]]; then row "$name" "FAIL" "built without NCCL (${nccl:-?})"
elif ! train2 tiny2_host host 60 "${z2[@]}"; then row "$name" "FAIL" "host run failed: $out/tiny2_host.log"
elif ! train2 tiny2_cuda "$dev" 90 "${z2[@]}"; then row "$name" "FAIL" "GPU run failed: $(tail -1 "$out/tiny2_cuda.log")"
else
  res=$(compare tiny2_cuda tiny2_host 1e-4 2>>"$log") || [[ $res == FAIL* ]] || res="FAIL the comparison broke (see $log)"
  row "$name" "${res%% *}" "${res#* }; $(grep -o '"comm_device_buffers": *"[^"]*"' "$out/tiny2_cuda/metrics.jsonl" | head -1)"
fi
