#!/usr/bin/env bash
# make_corpus.sh: builds the small shipped corpus input/data/{train,val}.bin from English text
# that every Debian 12 system has: the GNU info manuals of Essential packages and the licence
# texts of base-files. Byte-level tokens (vocabulary 256), so no tokenizer download is needed.
#
# Arithmetic: train ~2.04 M tokens (4.1 MB at 2 bytes/token), val ~0.19 M tokens (~9% of train,
# different manuals, so no overlap). At seq_len 256 that is ~7,970 train sequences; a global batch
# of 32 sequences is ~8 K tokens, so one epoch is ~250 steps. Takes a second.
#
# Reproducible: the file list below is fixed and ordered; licence texts are taken in C-locale
# sorted order, symlinks skipped, byte-identical duplicates dropped. The output depends only on
# the package versions, which SOURCES.txt records with a checksum of every source text.
#
# Usage: jobscripts/make_corpus.sh            (from anywhere; writes into the repo's input/data)
# Environment:
#   ZERO3D   the zero3d binary that runs `data prepare TEXT... --out FILE` (default build/bin/zero3d)
#   OUT_DIR  where train.bin, val.bin and SOURCES.txt go (default input/data)
set -euo pipefail
export LC_ALL=C  # byte-order sorting, locale-independent tool output

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ZERO3D=${ZERO3D:-$ROOT/build/bin/zero3d}
OUT_DIR=${OUT_DIR:-$ROOT/input/data}

if [[ ! -x $ZERO3D ]]; then
  echo "make_corpus.sh: no zero3d binary at '$ZERO3D': build it first or set ZERO3D" >&2
  exit 2
fi
mkdir -p "$OUT_DIR"

# "package path" pairs, in corpus order. All packages are Essential in Debian 12.
TRAIN_INFO=(
  "coreutils /usr/share/info/coreutils.info.gz"
  "diffutils /usr/share/info/diffutils.info.gz"
  "findutils /usr/share/info/find.info.gz"
  "findutils /usr/share/info/find.info-1.gz"
  "findutils /usr/share/info/find.info-2.gz"
  "findutils /usr/share/info/find-maint.info.gz"
  "sed /usr/share/info/sed.info.gz"
)
VAL_INFO=(
  "grep /usr/share/info/grep.info.gz"
  "gzip /usr/share/info/gzip.info.gz"
)

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

need() {  # need PACKAGE PATH
  if [[ ! -f $2 ]]; then
    echo "make_corpus.sh: missing '$2' (Debian package $1). Install it with" \
         "\`apt-get install --reinstall $1\`; minimal container images exclude /usr/share/info and" \
         "/usr/share/common-licenses in /etc/dpkg/dpkg.cfg.d/, remove that exclusion first." >&2
    exit 2
  fi
}

# stage SPLIT PACKAGE PATH: decompress (if .gz) into $WORK/SPLIT/NNN, skipping duplicates; records
# "split package version sha256 bytes path" in $WORK/sources.
declare -A SEEN
stage() {
  local split=$1 pkg=$2 src=$3
  need "$pkg" "$src"
  mkdir -p "$WORK/$split"
  local n dst
  n=$(find "$WORK/$split" -type f | wc -l)
  dst=$(printf '%s/%s/%03d' "$WORK" "$split" "$n")
  if [[ $src == *.gz ]]; then gzip -dc "$src" > "$dst"; else cat "$src" > "$dst"; fi
  local sum bytes version
  sum=$(sha256sum "$dst" | cut -d' ' -f1)
  if [[ -n ${SEEN[$sum]:-} ]]; then rm "$dst"; return; fi
  SEEN[$sum]=1
  bytes=$(stat -c %s "$dst")
  version=$(dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null || echo unknown)
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$split" "$pkg" "$version" "$sum" "$bytes" "$src" >> "$WORK/sources"
}

need base-files /usr/share/common-licenses/GPL-3
while IFS= read -r f; do
  stage train base-files "$f"
done < <(find /usr/share/common-licenses -maxdepth 1 -type f | sort)
for entry in "${TRAIN_INFO[@]}"; do read -r pkg src <<< "$entry"; stage train "$pkg" "$src"; done
for entry in "${VAL_INFO[@]}"; do read -r pkg src <<< "$entry"; stage val "$pkg" "$src"; done

for split in train val; do
  mapfile -t files < <(find "$WORK/$split" -type f | sort)
  "$ZERO3D" data prepare "${files[@]}" --out "$OUT_DIR/$split.bin"
done

{
  echo "# Sources of input/data/{train,val}.bin, made by jobscripts/make_corpus.sh (byte-level tokens,"
  echo "# vocabulary 256, llm.c token format). Texts are concatenated in this order; sha256 and bytes"
  echo "# are of the decompressed text."
  printf '# split\tpackage\tversion\tsha256\tbytes\tpath\n'
  cat "$WORK/sources"
  echo "# outputs:"
  for split in train val; do
    printf '# %s.bin\t%s tokens\tsha256 %s\n' "$split" \
      "$(awk -F'\t' -v s="$split" '$1 == s { n += $5 } END { print n }' "$WORK/sources")" \
      "$(sha256sum "$OUT_DIR/$split.bin" | cut -d' ' -f1)"
  done
} > "$OUT_DIR/SOURCES.txt"
cat "$OUT_DIR/SOURCES.txt"
