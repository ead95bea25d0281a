#!/usr/bin/env bash
# Every command as careful as train (issue #52): the defects a hostile run found outside train, each
# reproduced here (each case failed on main e7e3933, before its fix):
# - outputs never destroy: --out onto a FIFO or a symlink to a device node is refused by name and the
#   node is untouched; a failed --format hf export leaves the export that was there (or nothing), and
#   an export never replaces a directory holding files it did not write;
# - numbers on the command line are range-checked, never wrapped; one prompt option at a time;
# - inputs never crash and errors speak zero3d's words: JSON nested 100000 deep is refused at once, a
#   5 MB unknown key quickly and in a short line; a machine file that is a directory, has a rate as a
#   string or lacks the collectives a plan needs; init_from weights that are NaN, cut short or whose
#   offsets run past the data, and a cut config.json;
# - data prepare reads a FIFO (each input opened once); SIGINT/SIGTERM stop data prepare and eval at
#   once with exit 130 and nothing half-written (the shell starts these background runs with SIGINT
#   ignored, as the hostile run's were: zero3d takes it anyway);
# - absurd sizes end with one line and exit 2, not an internal assertion; a token file the storage
#   cannot read is exit 10; a `latest` naming a missing file is said once, not blamed on pruning;
# - random short writes still commit every checkpoint; a divergence stop leaves `latest` on a state
#   that resumes; a load-only run never saves into a checkpoint dir another run holds.
# And what it runs on (issue #54): --version and -V name the commit, the compiler and every library
# loaded, as the run record does; train.sbatch takes srun's PMI flag from ZERO3D_SRUN_MPI.
# usage: test_commands.sh ZERO3D_BINARY SOURCE_DIR
set -eu
source "$(dirname "$0")/common.sh" "$@"
ckpt() {  # ckpt NAME CONFIG [ARGS...]: a 2-step run of CONFIG on one rank, its checkpoint in $tmp/NAME/checkpoints
  local name=$1 config=$2
  shift 2
  timeout 120 "$z3d" train "$config" --run-dir "$tmp/$name" --peak-flops 1e11 --set data.val= --set train_steps=2 \
    --set checkpoint.save_interval=2 "$@" > "$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log"; fail "training $name"; }
}
ckpt gpt input/gpt-tiny.json
ckpt llama input/llama-tiny.json --set model.d_model=512 --set model.n_layer=2 --set model.intermediate_size=1024
G=$tmp/gpt/checkpoints
L=$tmp/llama/checkpoints
printf 'some text\n' > "$tmp/a.txt"

# 1. --out onto what is not a regular file: refused by name, the node untouched.
mkfifo "$tmp/fifo"
ln -s /dev/null "$tmp/null"
expect_exit 2 out-fifo "token file '$tmp/fifo' exists and is a FIFO" "$z3d" data prepare "$tmp/a.txt" --out "$tmp/fifo"
[[ -p $tmp/fifo ]] || fail "data prepare replaced the FIFO"
expect_exit 2 out-device "'$tmp/null' exists and is a character device" "$z3d" data prepare "$tmp/a.txt" --out "$tmp/null"
expect_exit 2 export-device "'$tmp/null' exists and is a character device" "$z3d" ckpt export "$G" --out "$tmp/null"
[[ -L $tmp/null && -c /dev/null ]] || fail "the link to /dev/null or /dev/null itself was replaced"
expect_exit 2 export-dir "'$tmp' exists and is a directory" "$z3d" ckpt export "$G" --out "$tmp"
ln -s tokens.bin "$tmp/link"  # a link to a file: the file it names is written, the link kept
expect_exit 0 out-link "wrote 10 tokens" "$z3d" data prepare "$tmp/a.txt" --out "$tmp/link"
[[ -L $tmp/link && -f $tmp/tokens.bin ]] || fail "data prepare through a symlink: the link was replaced"

# 2. an hf export appears whole or not at all: a failed one (a file size limit of half the Llama
# export's weights: its writes past it fail with EFBIG) leaves the GPT-2 export that was there, or
# nothing in an empty directory; a directory with files an export does not write is refused.
expect_exit 0 hf-gpt "exported" "$z3d" ckpt export "$G" --format hf --out "$tmp/m"
cp -r "$tmp/m" "$tmp/m.before"
mkdir "$tmp/empty"
expect_exit 0 hf-llama-size "exported" "$z3d" ckpt export "$L" --format hf --out "$tmp/llama_hf"
half_kib=$(( $(stat -c %s "$tmp/llama_hf/model.safetensors") / 2048 ))
small_disk=(bash -c "trap '' XFSZ; ulimit -f $half_kib; exec \"\$@\"" small_disk)
expect_exit 2 hf-fails "File too large" "${small_disk[@]}" "$z3d" ckpt export "$L" --format hf --out "$tmp/m"
diff -r "$tmp/m" "$tmp/m.before" > /dev/null || fail "a failed export changed the export that was there"
expect_exit 2 hf-fails-empty "File too large" "${small_disk[@]}" "$z3d" ckpt export "$L" --format hf --out "$tmp/empty"
[[ -z $(ls -A "$tmp/empty") ]] || fail "a failed export into an empty directory left: $(ls -A "$tmp/empty")"
[[ ! -e $tmp/m.tmp && ! -e $tmp/empty.tmp ]] || fail "a failed export left its .tmp directory"
expect_exit 0 hf-llama "exported" "$z3d" ckpt export "$L" --format hf --out "$tmp/m"
grep -q LlamaForCausalLM "$tmp/m/config.json" || fail "the llama export did not replace the GPT-2 one"
touch "$tmp/m/README.md"
expect_exit 2 hf-foreign "holds 'README.md', which zero3d does not write there" "$z3d" ckpt export "$G" --format hf --out "$tmp/m"
[[ -f $tmp/m/README.md ]] || fail "the refused export removed README.md"

# 13, 18. numbers are range-checked, never wrapped; one prompt option.
for bad in "--max-tokens 1e30" "--max-tokens 4294967297" "--top-k 1000000000000" "--max-tokens -1"; do
  expect_exit 2 "gen${bad// /}" "${bad%% *} must be a whole number from 0 to 2147483647" \
    "$z3d" generate "$G" --prompt a $bad
done
expect_exit 2 eval-micro "--micro-batch must be a whole number from 1 to 1048576, got '4294967297'" \
  "$z3d" eval "$G" --tokens "$tmp/tokens.bin" --micro-batch 4294967297
expect_exit 2 plan-mem "--mem-per-rank must be a number of bytes from 1 to 1024T" \
  "$z3d" plan input/gpt-tiny.json --ranks 8 --mem-per-rank 99999999999T
expect_exit 0 plan-ranks "layouts" "$z3d" plan input/gpt-tiny.json --ranks 1000000 --top 1
expect_exit 2 plan-ranks-max "--ranks must be a whole number from 1 to 16777216" \
  "$z3d" plan input/gpt-tiny.json --ranks 99999999999
expect_exit 2 gen-ids "each of --prompt-ids must be a whole number from 0 to 255, got '256'" \
  "$z3d" generate "$G" --prompt-ids 1,256
expect_exit 2 gen-two-prompts "takes one prompt: --prompt or --prompt-ids, not both" \
  "$z3d" generate "$G" --prompt a --prompt-ids 1
# 3, 16. JSON: nesting and a huge unknown key (each in a few seconds; the crash took 28 s, the key 59 s).
/usr/bin/python3 - "$tmp" <<'PY'
import sys
t = sys.argv[1]
open(f"{t}/deep_obj.json", "w").write('{"a":' * 100000 + "1" + "}" * 100000)
open(f"{t}/deep_arr.json", "w").write('{"train_micro_batch_size_per_gpu": ' + "[" * 200000 + "]" * 200000 + "}")
open(f"{t}/long_key.json", "w").write('{"' + "x" * 5000000 + '": 1}')
PY
deep="nested deeper than 64 levels"
expect_exit 2 deep-obj "deep_obj.json: invalid JSON: objects and arrays $deep" \
  "$z3d" train input/gpt-tiny.json --dry-run --deepspeed "$tmp/deep_obj.json"
expect_exit 2 deep-arr "deep_arr.json: invalid JSON: objects and arrays $deep" \
  "$z3d" plan input/gpt-tiny.json --ranks 2 --deepspeed "$tmp/deep_arr.json"
expect_exit 2 deep-set "$deep" "$z3d" train input/gpt-tiny.json --dry-run --set "model=$(printf '[%.0s' {1..30000})"
# Found by tests/fuzz (fuzz_config): a --set value that is not UTF-8 reached the JSON writer, which threw.
expect_exit 2 set-utf8 "not UTF-8 text" "$z3d" train input/gpt-tiny.json --dry-run --set $'bf16.enabled=t\xc1ue'
SECONDS=0
expect_exit 2 long-key "unknown config key 'x{60}\.\.\. \(5000000 characters\)'" \
  "$z3d" train input/gpt-tiny.json --dry-run --deepspeed "$tmp/long_key.json"
(( SECONDS < 10 )) || fail "the 5 MB key took $SECONDS s to refuse"
(( $(wc -c < "$tmp/long-key.log") < 4000 )) || fail "the 5 MB key's error is $(wc -c < "$tmp/long-key.log") bytes long"

# 14, 15. machine files: a directory, a rate as a string, no collectives for a plan that communicates.
/usr/bin/python3 - "$tmp" <<'PY'
import json, sys
t = sys.argv[1]
m = json.load(open("input/machines/h100-sxm.json"))
json.dump(dict(m, gemm_flops_per_s="fast"), open(f"{t}/m_string.json", "w"))
del m["collectives"]
json.dump(m, open(f"{t}/m_node.json", "w"))
del m["inter_node"]
json.dump(dict(m, ranks_per_node=1), open(f"{t}/m_one.json", "w"))
PY
mkdir "$tmp/m_dir"
plan2=("$z3d" plan input/gpt-tiny.json --ranks 2 --machine)
expect_exit 2 machine-dir "cannot read machine file '$tmp/m_dir': Is a directory" "${plan2[@]}" "$tmp/m_dir"
expect_exit 2 machine-string 'gemm_flops_per_s is "fast": it must be a number' "${plan2[@]}" "$tmp/m_string.json"
expect_exit 2 machine-node "missing collectives.all_reduce \(a node of 8 ranks communicates\)" "${plan2[@]}" "$tmp/m_node.json"
expect_exit 2 machine-one "the machine file has no collective rates" "${plan2[@]}" "$tmp/m_one.json"
expect_exit 0 machine-one-rank "layouts" "$z3d" plan input/gpt-tiny.json --ranks 1 --machine "$tmp/m_one.json"
! grep -qE "json\.exception|basic_filebuf" "$tmp"/machine-*.log || fail "a library's words in a machine file's error"

# 9, 10, 14. checkpoint.init_from: NaN weights, a cut file, offsets past the data, a cut config.json.
cp -r "$tmp/m.before" "$tmp/hf_ok"
/usr/bin/python3 - "$tmp" <<'PY'
import json, math, os, shutil, struct, sys
t = sys.argv[1]
src = f"{t}/hf_ok/model.safetensors"
blob = open(src, "rb").read()
n = struct.unpack("<Q", blob[:8])[0]
header = json.loads(blob[8:8 + n])
def variant(name, data, config=None):
    os.makedirs(f"{t}/{name}")
    open(f"{t}/{name}/model.safetensors", "wb").write(data)
    cfg = open(f"{t}/hf_ok/config.json").read()
    open(f"{t}/{name}/config.json", "w").write(cfg if config is None else config)
begin = 8 + n + header["transformer.h.1.attn.c_attn.weight"]["data_offsets"][0]
nan = bytearray(blob)
nan[begin + 4 * 7:begin + 4 * 8] = struct.pack("<f", math.nan)
variant("hf_nan", bytes(nan))
variant("hf_cut", blob[:len(blob) // 2])
moved = dict(header)
moved["transformer.wte.weight"] = dict(header["transformer.wte.weight"], data_offsets=[len(blob), len(blob) + 4 * 256 * 128])
text = json.dumps(moved).encode()
variant("hf_past", struct.pack("<Q", len(text)) + text + blob[8 + n:])
variant("hf_cutcfg", blob, config=open(f"{t}/hf_ok/config.json").read()[:40])
PY
init() { init=("$z3d" train input/gpt-tiny.json --run-dir "$tmp/run_$1" --set train_steps=1 --set data.val=
              --set checkpoint.init_from="\"$tmp/$1\""); }
init hf_nan
expect_exit 2 init-nan "tensor 'transformer.h.1.attn.c_attn.weight' holds nan at element 7: initial weights must be finite" "${init[@]}"
init hf_cut
expect_exit 2 init-cut "lies at bytes \[[0-9]+, [0-9]+\) of the data, which holds [0-9]+: the file is truncated" "${init[@]}"
init hf_past
expect_exit 2 init-past "tensor 'transformer.wte.weight' lies at bytes .* the file is truncated or corrupt" "${init[@]}"
init hf_cutcfg
expect_exit 2 init-cutcfg "config.json: invalid JSON at line [0-9]+, column [0-9]+" "${init[@]}"
! grep -q "json\.exception" "$tmp"/init-*.log || fail "a library's words in an init_from error"

# 5. a FIFO is read, not hung on.
mkfifo "$tmp/text_fifo"
(sleep 1; printf 'through a fifo' > "$tmp/text_fifo") &
expect_exit 0 fifo-in "wrote 14 tokens" "$z3d" data prepare "$tmp/text_fifo" --out "$tmp/fifo.bin"

# 6. SIGINT and SIGTERM stop a long command at once: exit 130, nothing half-written.
# interrupt NAME SIGNAL FILE CMD...: CMD gets SIGNAL once it has FILE open (it is past its start, where
# it begins to catch the signal) and must end within 10 s
interrupt() {
  local name=$1 sig=$2 file=$3 rc=0
  shift 3
  "$@" > "$tmp/$name.log" 2>&1 &
  local pid=$!
  wait_opened $pid "$file" "$tmp/$name.log"
  kill -"$sig" $pid
  SECONDS=0
  wait $pid || rc=$?
  [[ $rc == 130 && $SECONDS -lt 10 ]] && grep -q "stopped by SIG$sig" "$tmp/$name.log" ||
    fail "$name: exit $rc after $SECONDS s, want 130 at once: $(cat "$tmp/$name.log")"
  echo "ok $name"
}
# A paced FIFO, not /dev/zero: a fast core tokenizes /dev/zero to the format's 2^31-token limit in
# a few seconds. The writer ends when the reader closes (head's SIGPIPE).
mkfifo "$tmp/zero_fifo"
(while head -c 65536 /dev/zero 2>/dev/null; do sleep 0.05; done > "$tmp/zero_fifo") &
interrupt prepare-term TERM "$tmp/zero.bin.tmp" "$z3d" data prepare "$tmp/zero_fifo" --out "$tmp/zero.bin"
[[ ! -e $tmp/zero.bin && ! -e $tmp/zero.bin.tmp ]] || fail "an interrupted data prepare left $(ls "$tmp"/zero.bin*)"
interrupt eval-int INT input/data/train.bin "$z3d" eval "$G" --tokens input/data/train.bin

# 4. absurd sizes: one line and exit 2 (a micro-batch past 2^31 tokens, or the memory it needs).
for set in train_micro_batch_size_per_gpu=1000000000 model.seq_len=1000000000; do
  expect_exit 2 "absurd-${set%%=*}" "is [0-9]+ tokens, more than the 2147483647 a rank can index" \
    "$z3d" train input/gpt-tiny.json --run-dir "$tmp/absurd" --set "$set"
done
expect_exit 2 absurd-d_model "this layout needs [0-9.]+ GB on this node" \
  "$z3d" train input/gpt-tiny.json --run-dir "$tmp/absurd" --set model.d_model=524288

# 12. a token file the storage cannot read is exit 10 (the README's table), on one rank and on two.
fiu_lib=/usr/lib/fiu
eio=(env FIU_ENABLE='enable name=posix/io/rw/pread,failinfo=5'
     LD_PRELOAD="${ZERO3D_FIU_SHIM:?the CLI tests set it}:$fiu_lib/fiu_run_preload.so:$fiu_lib/fiu_posix_preload.so")
expect_exit 10 token-eio "cannot read the header of token file 'input/data/train.bin': Input/output error" \
  "${eio[@]}" "$z3d" train input/gpt-tiny.json --run-dir "$tmp/eio1" --set checkpoint.load=auto
expect_exit 10 token-eio-np2 "cannot read the header of token file 'input/data/train.bin': Input/output error" \
  $MPIRUN -np 2 "${eio[@]}" "$z3d" train input/gpt-tiny.json --run-dir "$tmp/eio2" --set checkpoint.load=auto

# 11. random short writes (one pwrite in ten cut short, several a save, O_DIRECT's included) still
# commit every checkpoint, and each verifies.
short=(env FIU_ENABLE='enable_random name=posix/io/rw/pwrite/reduce,probability=0.1'
       LD_PRELOAD="$ZERO3D_FIU_SHIM:$fiu_lib/fiu_run_preload.so:$fiu_lib/fiu_posix_preload.so")
for i in 1; do
  expect_exit 0 "short-writes-$i" "step +15 \| checkpoint" $MPIRUN -np 2 "${short[@]}" "$z3d" train input/gpt-tiny.json \
    --run-dir "$tmp/short$i" --set data.val= --set checkpoint.save_interval=5 --set train_steps=15
  expect_exit 0 "short-writes-verify-$i" "all 156 datasets match their checksums" "$z3d" ckpt verify "$tmp/short$i/checkpoints"
done

# 17. a `latest` naming a file that is not there: one warning, no "another run prunes".
echo step_00000099.h5 > "$G/latest"
expect_exit 0 latest-missing "is not there \(its name is in 'latest'\); trying an older one" \
  "$z3d" train input/gpt-tiny.json --run-dir "$tmp/gpt" --set train_steps=3 --set data.val= --set checkpoint.load=auto
! grep -q "another run prunes" "$tmp/latest-missing.log" || fail "a missing step_99 was blamed on another run"

# 8. a divergence stop leaves `latest` on the last state whose next loss was finite: resuming it
# with a sane learning rate trains on.
Z2=($MPIRUN -np 2 "$z3d" train input/gpt-tiny.json --set data.val= --set checkpoint.save_interval=1)
expect_exit 9 diverged "renamed \*.h5.diverged .*'latest' holds step [0-9]+" \
  "${Z2[@]}" --run-dir "$tmp/div" --set optimizer.params.lr=1e6 --set gradient_clipping=0 --set train_steps=20
kept=$(sed -nE "s/.*the run diverged.*'latest' holds step ([0-9]+).*/\1/p" "$tmp/diverged.log")
[[ -n $kept ]] || fail "the divergence line names no checkpoint: $(grep "run diverged" "$tmp/diverged.log")"
expect_exit 0 diverged-resume "resumed from .*step_0*$kept.h5" \
  "${Z2[@]}" --run-dir "$tmp/div" --set train_steps=$((kept + 3)) --set checkpoint.load=auto

# 7. a run that only loads from a checkpoint.dir another run holds saves its stop elsewhere, and says so.
D=$tmp/shared
timeout 120 "${Z2[@]}" --run-dir "$tmp/writer" --set checkpoint.dir="\"$D\"" --set checkpoint.save_interval=5 \
  --set checkpoint.keep_last=2 --set train_steps=100000 > "$tmp/writer.log" 2>&1 &
writer=$!
for _ in $(seq 100); do [[ -f $D/latest ]] && break; sleep 0.2; done
[[ -f $D/latest ]] || fail "the writer committed no checkpoint: $(tail -5 "$tmp/writer.log")"
"$z3d" train input/gpt-tiny.json --run-dir "$tmp/reader" --set data.val= --set checkpoint.dir="\"$D\"" \
  --set checkpoint.load=auto --set seed=99 --set train_steps=100000 > "$tmp/reader.log" 2>&1 &
reader=$!
for _ in $(seq 100); do grep -q "^step" "$tmp/reader.log" && break; sleep 0.2; done
kill -USR1 $reader
rc=0
wait $reader || rc=$?
pkill -9 -P $writer || true
wait $writer 2>/dev/null || true
[[ $rc == 6 ]] && grep -q "is held by another run, which saves and prunes there" "$tmp/reader.log" &&
  grep -qE "checkpoint is committed in '$tmp/reader/checkpoints' \('latest' holds step [0-9]+\)" "$tmp/reader.log" ||
  fail "the reader: exit $rc: $(cat "$tmp/reader.log")"
[[ -f $tmp/reader/checkpoints/latest ]] || fail "the reader's stop checkpoint is not in its run dir"
echo "ok reader-stop"

# Found by tests/fuzz (fuzz_ckpt_header): a checkpoint whose attributes claim 2^31-1 layers made
# `ckpt inspect` build the tensor table of that model (killed for memory), and an architecture
# record with make_vocab_size_divisible_by 0 divided by it (SIGFPE). Inspect shows what is there.
cp "$G/step_00000002.h5" "$tmp/layers.h5"
cp "$G/step_00000002.h5" "$tmp/div0.h5"
/usr/bin/python3 - "$tmp/layers.h5" "$tmp/div0.h5" <<'PY'
import json, sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:
    f.attrs.modify("n_layer", np.int64(2**31 - 1))
with h5py.File(sys.argv[2], "r+") as f:
    a = json.loads(f.attrs["architecture"].decode() if isinstance(f.attrs["architecture"], bytes) else f.attrs["architecture"])
    a["make_vocab_size_divisible_by"] = 0
    del f.attrs["architecture"]
    f.attrs.create("architecture", np.bytes_(json.dumps(a).encode()))
PY
expect_exit 0 inspect-layers "total: [0-9]+ datasets" "$z3d" ckpt inspect "$tmp/layers.h5"
expect_exit 0 inspect-div0 "total: [0-9]+ datasets" "$z3d" ckpt inspect "$tmp/div0.h5"
expect_exit 2 load-div0 "make_vocab_size_divisible_by = 0" \
  "$z3d" train input/gpt-tiny.json --run-dir "$tmp/div0_run" --set data.val= --set train_steps=3 \
  --set checkpoint.load="\"$tmp/div0.h5\""

# What it runs on (issue #54). --version and -V print the same lines: the version with the commit
# (HEAD's, in a git checkout: asked at build time), the compiler and build type; the backends; and
# each library as built with and as loaded, with the file it came from. The run record of the run
# above ($tmp/gpt) carries the same entries: rendered as --version renders them, it is the same text.
expect_exit 0 version "^zero3d [0-9.]+ \(commit ([0-9a-f]{7,}(-dirty)?|unknown)( of [0-9-]{10})?; [A-Za-z]+ [0-9.]+, [A-Za-z]+\)$" \
  "$z3d" --version
expect_exit 0 version-V "^backends: host" "$z3d" -V
cmp -s "$tmp/version.log" "$tmp/version-V.log" || fail "-V and --version print different lines"
if top=$(git rev-parse --show-toplevel 2>/dev/null) && [[ $(cd "$top" && pwd -P) == "$(pwd -P)" ]]; then
  head=$(git rev-parse --short=12 HEAD)
  grep -q "^zero3d [0-9.]* (commit $head" "$tmp/version.log" ||
    fail "--version names another commit than HEAD $head: $(head -1 "$tmp/version.log") (built before the last commit?)"
fi
# Sources that are not a git checkout of their own (here: unpacked inside another repository) are
# built as ZERO3D_COMMIT says, else as commit "unknown": the build-time script on such a tree.
facts=$(dirname "$z3d")/../generated/build_facts.cmake
mkdir -p "$tmp/unpacked/zero3d" && git -C "$tmp/unpacked" init -q
for fallback in "" 0123456789ab; do
  cmake -DSRC="$tmp/unpacked/zero3d" -DOUT="$tmp/facts.cpp" -DFALLBACK=$fallback -P "$facts" &&
    grep -q "commit = \"${fallback:-unknown}\";" "$tmp/facts.cpp" ||
    fail "the build facts of sources outside git (ZERO3D_COMMIT '$fallback'): $(grep "commit =" "$tmp/facts.cpp")"
done
echo "ok version-outside-git"
for lib in MPI HDF5 oneDNN CBLAS PCRE2; do
  grep -qE "^$lib: built .+, loaded .+ from /" "$tmp/version.log" || fail "--version has no '$lib: built ..., loaded ... from FILE'"
done
/usr/bin/python3 - "$tmp/gpt" "$tmp/version.log" <<'PY'
import sys
from z3dcheck import run_record
v = run_record(sys.argv[1])["versions"]
lines = [f"zero3d {v['zero3d']} (commit {v['commit']}" + (f" of {v['commit_date']}" if v["commit_date"] else "")
         + f"; {v['compiler']}, {v['build_type']})", f"backends: {v['backends']}"]
for name, e in v["libraries"].items():
    s = f"{name}:" + (f" built {e['built']}," if "built" in e else "")
    s += (f" loaded {e['loaded']}" + (f" from {e['from']}" if "from" in e else "")) if "loaded" in e else f" not loaded: {e['not_loaded']}"
    lines.append(s)
printed = open(sys.argv[2]).read().splitlines()
if lines != printed:
    sys.exit("the run record's versions differ from --version:\n  " + "\n  ".join(
        f"{a!r} | {b!r}" for a, b in zip(lines + [""] * len(printed), printed + [""] * len(lines)) if a != b))
PY
echo "ok version-record"
# The CUDA module, where built: a machine without a driver says why it is not loaded and names none
# of its libraries (it maps none); with a driver, or with the toolkit's stub libcuda on the library
# path (no driver behind it), the module loads and names each library it runs on.
cuda_libs="CUDA runtime|CUDA driver|cuBLAS|cuBLASLt|cuDNN|NCCL"
if grep -qE "^backends: host, (kokkos, )?cuda \(module built with CUDA [0-9.]*; not loaded: no NVIDIA driver" "$tmp/version.log"; then
  ! grep -qE "^($cuda_libs):" "$tmp/version.log" || fail "--version names a CUDA library without a driver"
  cudart=$(ldd "$(dirname "$z3d")/../lib/libzero3d_cuda.so" 2>/dev/null | awk '/libcudart/ {print $3}')
  if [[ -n $cudart && -f $(dirname "$cudart")/stubs/libcuda.so ]]; then
    mkdir "$tmp/stub" && ln -s "$(dirname "$cudart")/stubs/libcuda.so" "$tmp/stub/libcuda.so.1"
    LD_LIBRARY_PATH=$tmp/stub${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} expect_exit 0 version-stub \
      "^backends: host, (kokkos, )?cuda \(module loaded from /" "$z3d" --version
    for lib in "CUDA runtime" cuBLAS cuBLASLt; do
      grep -qE "^$lib: built [0-9.]+, loaded [0-9.]+ from /" "$tmp/version-stub.log" || fail "--version (stub driver): no '$lib' line"
    done
    grep -q "^CUDA driver: not loaded: cudaDriverGetVersion finds no working driver in $tmp/stub/libcuda.so.1" \
      "$tmp/version-stub.log" || fail "--version (stub driver): the driver line does not name the stub"
    grep -qE "^cuDNN: (built|not loaded)" "$tmp/version-stub.log" && grep -qE "^NCCL: (built|not loaded)" "$tmp/version-stub.log" ||
      fail "--version (stub driver): no cuDNN or NCCL line"
  else
    echo "skip version-stub: no CUDA toolkit stub libcuda beside the module's libcudart"
  fi
elif grep -qE "^backends: host, (kokkos, )?cuda \(module loaded from" "$tmp/version.log"; then
  for lib in "CUDA runtime" "CUDA driver" cuBLAS cuBLASLt cuDNN NCCL; do
    grep -q "^$lib: " "$tmp/version.log" || fail "--version (a driver here): no '$lib' line"
  done
fi

# train.sbatch takes srun's PMI flag from the site (ZERO3D_SRUN_MPI: default pmix, none for no flag),
# seen in the srun command it runs (srun and zero3d stand-ins: no Slurm here).
mkdir "$tmp/slurm_bin"
printf '#!/bin/sh\necho "srun $*"\n' > "$tmp/slurm_bin/srun"
printf '#!/bin/sh\nexit 0\n' > "$tmp/slurm_bin/zero3d"
chmod +x "$tmp/slurm_bin/srun" "$tmp/slurm_bin/zero3d"
for mpi in default none pmi2; do
  want="srun --mpi=pmix --cpus"
  [[ $mpi == none ]] && want="srun --cpus"
  [[ $mpi == pmi2 ]] && want="srun --mpi=pmi2 --cpus"
  if [[ $mpi == default ]]; then set_mpi=(env -u ZERO3D_SRUN_MPI); else set_mpi=(env ZERO3D_SRUN_MPI=$mpi); fi
  "${set_mpi[@]}" PATH="$tmp/slurm_bin:$PATH" SLURM_JOB_ID=1 SLURM_NTASKS=1 SLURM_SUBMIT_DIR="$PWD" \
    ZERO3D_BIN="$tmp/slurm_bin/zero3d" RUN_DIR="$tmp/sbatch" timeout 20 bash jobscripts/train.sbatch input/gpt-tiny.json \
    > "$tmp/sbatch_$mpi.log" 2>&1 || { cat "$tmp/sbatch_$mpi.log"; fail "train.sbatch (ZERO3D_SRUN_MPI $mpi) failed"; }
  grep -q "^$want" "$tmp/sbatch_$mpi.log" || { cat "$tmp/sbatch_$mpi.log"; fail "train.sbatch (ZERO3D_SRUN_MPI $mpi) did not run '$want...'"; }
  echo "ok sbatch-srun-mpi-$mpi"
done

echo "all command checks passed"
