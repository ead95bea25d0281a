#!/usr/bin/env bash
# tests/fuzz/run.sh: runs zero3d's libFuzzer harnesses (tests/README.md, "Fuzzing").
# usage: run.sh BUILD_DIR SECONDS [HARNESS ...]    (default: every harness, one after another)
# BUILD_DIR holds the fuzz_* binaries (the top-level build's fuzz/bin, or a build of tests/fuzz).
# Each harness starts from seeds (zero3d's own files and writers' output) plus its corpus: $CORPUS/NAME
# when CORPUS is set (kept between runs: the long run's), else a scratch directory. A finding leaves
# its input in ${ARTIFACTS:-the current directory}/NAME-crash-... and fails the run; every harness
# reports its executions and coverage in one line.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 BUILD_DIR SECONDS [HARNESS ...]" >&2; exit 2; }
bin=$(cd "$1" && pwd)
seconds=$2
shift 2
root=$(cd "$(dirname "$0")/../.." && pwd)
harnesses=("$@")
[ ${#harnesses[@]} -gt 0 ] || harnesses=(config machine_file hf token_file ckpt_header)
artifacts=$(mkdir -p "${ARTIFACTS:-.}" && cd "${ARTIFACTS:-.}" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Seeds from the repository's own files, by harness.
repo_seeds() {
  local name=$1 dir=$2 f
  mkdir -p "$dir"
  case $name in
    config)
      for f in "$root"/input/*.json; do cp "$f" "$dir/"; done
      for f in "$root"/tests/ds_configs/*.json; do
        { cat "$root/input/gpt-tiny.json"; printf '\n--- deepspeed\n'; cat "$f"; printf '\n--- ranks\n4\n'; } \
          > "$dir/ds_$(basename "$f")"
      done
      { cat "$root/input/llama-tiny.json"; printf '\n--- set\nzero_optimization.stage=3\nbf16.enabled=true\n'
        printf 'tensor_parallel.tp_size=2\npipeline_parallel.pp_size=2\n--- ranks\n8\n'; } > "$dir/llama_sets"
      ;;
    machine_file)
      for f in "$root"/input/machines/*.json; do cp "$f" "$dir/"; done
      ;;
  esac
}

failed=()
for name in "${harnesses[@]}"; do
  exe=$bin/fuzz_$name
  [ -x "$exe" ] || { echo "fuzz: no harness $exe" >&2; exit 2; }
  seeds=$work/seeds_$name
  repo_seeds "$name" "$seeds"
  case $name in hf|token_file|ckpt_header) ZERO3D_FUZZ_SEEDS=$seeds "$exe" > /dev/null 2>&1 ;; esac  # zero3d's writers
  corpus=${CORPUS:+$CORPUS/$name}
  corpus=${corpus:-$work/corpus_$name}
  mkdir -p "$corpus"
  opts=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
        -artifact_prefix="$artifacts/$name-" -close_fd_mask=3)
  if [ "$name" = config ]; then
    ZERO3D_FUZZ_DICT=$work/config.dict "$exe" > /dev/null 2>&1
    opts+=(-dict="$work/config.dict")
  fi
  log=$work/$name.log
  if "$exe" "${opts[@]}" "$corpus" "$seeds" > "$log" 2>&1; then
    done_line=$(grep -E '^#[0-9]+\s+DONE' "$log" | tail -1)
    echo "fuzz $name: ok, ${seconds} s: ${done_line:-$(tail -1 "$log")}"
  else
    echo "fuzz $name: FAILED (input in $artifacts/$name-*):"
    grep -E 'ERROR|SUMMARY|==[0-9]+==|#[0-9]+ +in |terminate|what\(\)' "$log" | head -30
    failed+=("$name")
  fi
done
[ ${#failed[@]} -eq 0 ] || { echo "fuzz: findings in ${failed[*]}"; exit 1; }
