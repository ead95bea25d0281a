#!/usr/bin/env bash
# An installed zero3d (issue #54). `cmake --install` of the build tree into a scratch prefix, whose
# binary loads the installed CUDA module where the build made one;
# - from another directory, with only the prefix (and /usr/bin, /bin) on PATH and a bare
#   environment, it trains the gpt-tiny preset by name on 2 ranks, reading the installed tree's
#   data, and saves a checkpoint that `ckpt verify` passes; `plan` prices on a machine preset by
#   name; an unknown name is refused with the presets listed; a user's own copy of the preset keeps
#   its relative paths the working directory's (and so does --set); the build tree's binary reads
#   the same names from the source tree; the installed train.sbatch runs it (srun a stand-in);
# - its modulefiles name the prefix, and load through Lmod (the Tcl one too) where Lmod is here;
# - the .deb that cpack makes declares the Debian package of every library the binary links, and
#   its binary, unpacked with dpkg -x, prints what the build tree's prints for --version and finds
#   its presets under the unpacked /usr.
# usage: test_install.sh ZERO3D_BINARY SOURCE_DIR
set -eu
source "$(dirname "$0")/common.sh" "$@"
src=$PWD
build=$(cd "$(dirname "$z3d")/.." && pwd)
p=$tmp/prefix share=$tmp/prefix/share/zero3d
timeout 60 cmake --install "$build" --prefix "$p" > "$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; fail "cmake --install"; }
for f in bin/zero3d share/zero3d/input/gpt-tiny.json share/zero3d/input/machines/h100-sxm.json \
         share/zero3d/input/data/train.bin share/zero3d/jobscripts/train.sbatch share/zero3d/jobscripts/cluster_env.sh \
         share/zero3d/postprocess/loss.py; do
  [[ -f $p/$f ]] || fail "cmake --install did not install $f"
done
# The CUDA module, where the build made one: in <libdir>/zero3d (lib, or lib/x86_64-linux-gnu), and
# the installed binary loads that one. A stand-in libcuda.so.1 (no symbols: no device) lets it try
# without a driver, on any machine; the loader's LD_DEBUG=files names the file it opened.
if [[ -f $build/lib/libzero3d_cuda.so ]]; then
  module=$(find "$p" -path "*/zero3d/libzero3d_cuda.so")
  [[ -n $module ]] || fail "the CUDA module is not installed"
  mkdir "$tmp/nodriver"
  echo 'int zero3d_no_driver;' > "$tmp/nodriver/cuda.c"
  cc -shared -fPIC -o "$tmp/nodriver/libcuda.so.1" "$tmp/nodriver/cuda.c"
  LD_DEBUG=files LD_LIBRARY_PATH="$tmp/nodriver" timeout 60 "$p/bin/zero3d" train "$PWD/input/gpt-tiny.json" --dry-run \
    --backend cuda > "$tmp/module.log" 2>&1 || true
  grep -qE "file=$module \[0\]; +dynamically loaded by $p/bin/zero3d" "$tmp/module.log" ||
    { grep -E "zero3d|cuda" "$tmp/module.log" | tail -5; fail "the installed zero3d did not load $module"; }
fi
echo "ok install"

# ---- the installed tree, from elsewhere ----
mkdir "$tmp/elsewhere"
cd "$tmp/elsewhere"
clean=(env -i HOME="$tmp" PATH="$p/bin:/usr/bin:/bin" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
       OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1)
[[ $("${clean[@]}" bash -c 'command -v zero3d') == "$p/bin/zero3d" ]] || fail "zero3d on PATH is not the installed one"
timeout 120 "${clean[@]}" "${MPIEXEC:-mpirun}" --oversubscribe -np 2 zero3d train gpt-tiny --run-dir run \
  --set train_steps=4 --set steps_per_print=2 --set checkpoint.save_interval=4 --set data.val_interval=4 \
  --set data.val_batches=1 --set zero_optimization.stage=1 --peak-flops 1e11 > "$tmp/train.log" 2>&1 ||
  { tail -20 "$tmp/train.log"; fail "the installed zero3d did not train gpt-tiny"; }
grep -q "step      4/4 | loss" "$tmp/train.log" || { cat "$tmp/train.log"; fail "no step 4 in the log"; }
grep -q "\"train\": \"$share/input/data/train.bin\"" run/config.json ||
  fail "data.train is not the installed tree's: $(grep '"train"' run/config.json)"
expect_exit 0 ckpt_verify "match their checksums" "${clean[@]}" zero3d ckpt verify run/checkpoints
expect_exit 0 plan_machine "H100" "${clean[@]}" zero3d plan gpt-tiny --ranks 8 --machine h100-sxm --top 1
expect_exit 2 unknown_preset "config file 'gpt-tinny': no such file, and no preset of that name .*$share/input: .*gpt-tiny" \
  "${clean[@]}" zero3d train gpt-tinny
expect_exit 2 unknown_machine "machine file 'h300': no such file, and no preset .*h100-sxm, h200-sxm" \
  "${clean[@]}" zero3d plan gpt-tiny --ranks 2 --machine h300
cp "$share/input/gpt-tiny.json" mine.json
expect_exit 2 own_config "cannot open token file 'input/data/train.bin'" "${clean[@]}" zero3d train mine.json --dry-run
expect_exit 2 preset_set "cannot open token file 'input/data/val.bin'" \
  "${clean[@]}" zero3d train gpt-tiny --set data.val=input/data/val.bin --dry-run
# The build tree's binary: the same names, from the source tree.
expect_exit 0 build_tree_preset "dry run +$src/input/gpt-tiny.json" "$z3d" train gpt-tiny --dry-run

# ---- the installed train.sbatch, as a job with the module's ZERO3D_ROOT and no ZERO3D_BIN: the
# binary from PATH, cluster_env.sh from the installed tree; srun is a stand-in that runs its command ----
mkdir "$tmp/fakebin"
printf '#!/bin/bash\nwhile [[ $1 == -* ]]; do shift; done  # srun stand-in: its options dropped\nexec "$@"\n' > "$tmp/fakebin/srun"
chmod +x "$tmp/fakebin/srun"
timeout 60 env -i HOME="$tmp" PATH="$tmp/fakebin:$p/bin:/usr/bin:/bin" ZERO3D_ROOT="$share" SLURM_JOB_ID=7 \
  SLURM_SUBMIT_DIR="$PWD" SLURM_NTASKS=1 SLURM_JOB_END_TIME=$(($(date +%s) + 3600)) OMPI_ALLOW_RUN_AS_ROOT=1 \
  OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 bash "$share/jobscripts/train.sbatch" gpt-tiny --run-dir job --set train_steps=2 \
  --set data.val= --peak-flops 1e11 > "$tmp/sbatch.log" 2>&1 || { cat "$tmp/sbatch.log"; fail "the installed train.sbatch"; }
for want in "environment: .*OMP_NUM_THREADS=1" "running: srun .* $p/bin/zero3d train gpt-tiny" "zero3d exited with code 0"; do
  grep -qE -- "$want" "$tmp/sbatch.log" || { cat "$tmp/sbatch.log"; fail "the installed train.sbatch's log lacks /$want/"; }
done
echo "ok train.sbatch installed"

# ---- the modulefiles: Lmod's (.lua) and Environment Modules' (Tcl) ----
lua=$(find "$share/modulefiles/zero3d" -name "*.lua")
tcl=${lua%.lua}
grep -q "local prefix = \"$p\"" "$lua" || fail "$lua does not name the prefix $p"
grep -q "^set prefix \"$p\"" "$tcl" || fail "$tcl does not name the prefix $p"
"$z3d" --version > "$tmp/version.build"
lmod=/usr/share/lmod/lmod/init/bash
if [[ -f $lmod ]]; then
  mkdir -p "$tmp/tcl/zero3d"
  cp "$tcl" "$tmp/tcl/zero3d/"
  for dir in "$share/modulefiles" "$tmp/tcl"; do
    timeout 60 env -i HOME="$tmp" PATH=/usr/bin:/bin bash -c "source $lmod && module use $dir && module load zero3d &&
      [[ \$ZERO3D_BIN == $p/bin/zero3d && \$ZERO3D_ROOT == $share ]] && zero3d --version" > "$tmp/version.module" 2>&1 ||
      { cat "$tmp/version.module"; fail "module load zero3d ($dir) and zero3d --version"; }
    cmp -s "$tmp/version.build" "$tmp/version.module" || { cat "$tmp/version.module"; fail "zero3d --version through the module ($dir)"; }
  done
  echo "ok modulefiles (through Lmod, .lua and Tcl)"
else
  echo "ok modulefiles name the prefix (not loaded: no Lmod here; jobscripts/deps.sh installs it for the tests)"
fi

# ---- the .deb ----
timeout 120 cpack --config "$build/CPackConfig.cmake" -B "$tmp/pkg" > "$tmp/cpack.log" 2>&1 || { cat "$tmp/cpack.log"; fail "cpack"; }
deb=$(echo "$tmp"/pkg/zero3d_*.deb)
[[ -f $deb ]] || { cat "$tmp/cpack.log"; fail "cpack made no zero3d_*.deb"; }
# Depends: every package of a library the binary names (NEEDED), found by dpkg -S on the file the
# loader picks (as ldd resolves it, or the file it links to: a usrmerged /lib path, alternatives).
depends=" $(dpkg-deb -f "$deb" Depends | sed 's/([^)]*)//g; s/[,|]/ /g') "
paths=()
for lib in $(readelf -d "$z3d" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
  path=$(ldd "$z3d" | awk -v l="$lib" '$1 == l {print $3}')
  [[ -n $path ]] || fail "ldd does not resolve $lib"
  real=$(readlink -f "$path")
  paths+=("$path" "$real" "${real#/usr}")
done
for i in $(seq 0 3 $((${#paths[@]} - 1))); do
  pkg=$(dpkg -S "${paths[@]:i:3}" 2>/dev/null | head -1 | cut -d: -f1 || true)
  [[ -n $pkg ]] || fail "no Debian package owns ${paths[i]}"
  [[ $depends == *" $pkg "* ]] || fail "the .deb's Depends does not name $pkg (${paths[i]}): $depends"
done
if [[ -f $build/lib/libzero3d_cuda.so ]]; then
  dpkg-deb -c "$deb" > "$tmp/deb.list"
  grep -q "/zero3d/libzero3d_cuda.so" "$tmp/deb.list" || fail "the CUDA module is not in the .deb"
fi
dpkg -x "$deb" "$tmp/root"
"$tmp/root/usr/bin/zero3d" --version > "$tmp/version.deb"
cmp -s "$tmp/version.build" "$tmp/version.deb" || { diff "$tmp/version.build" "$tmp/version.deb"; fail "the .deb's zero3d --version"; }
expect_exit 0 deb_preset "dry run +$tmp/root/usr/share/zero3d/input/gpt-tiny.json" \
  env -i PATH=/usr/bin:/bin OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$tmp/root/usr/bin/zero3d" train gpt-tiny --dry-run
grep -q 'local prefix = "/usr"' "$tmp"/root/usr/share/zero3d/modulefiles/zero3d/*.lua || fail "the .deb's modulefile does not name /usr"
echo "ok deb ($(du -k "$deb" | cut -f1) KiB; Depends names the package of each of the binary's $((${#paths[@]} / 3)) libraries)"
