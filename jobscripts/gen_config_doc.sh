#!/usr/bin/env bash
# jobscripts/gen_config_doc.sh [ZERO3D_BINARY [DOC]]: regenerates the key reference in DOC
# (default input/README.md) from `ZERO3D_BINARY train --help-config` (default build/bin/zero3d).
# The block between the lines `<!-- help-config begin -->` and `<!-- help-config end -->` is
# replaced, in place, by the output inside a ```text fence; the rest of DOC is kept as it is.
# tests/cli/test_docs.sh runs this on a copy and fails when the copy differs from DOC.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$root/build/bin/zero3d}
doc=${2:-$root/input/README.md}
begin='<!-- help-config begin -->'
end='<!-- help-config end -->'

[[ -x $bin ]] || { echo "gen_config_doc.sh: '$bin' is not an executable zero3d binary" >&2; exit 2; }
[[ -f $doc ]] || { echo "gen_config_doc.sh: no file '$doc'" >&2; exit 2; }
# Exactly one of each marker, begin first: anything else would lose text.
nb=$(grep -cxF -- "$begin" "$doc" || true)
ne=$(grep -cxF -- "$end" "$doc" || true)
if [[ $nb -ne 1 || $ne -ne 1 ]] ||
   (( $(grep -nxF -- "$begin" "$doc" | cut -d: -f1) > $(grep -nxF -- "$end" "$doc" | cut -d: -f1) )); then
  echo "gen_config_doc.sh: '$doc' needs one line '$begin' followed by one line '$end'" >&2
  exit 2
fi

keys=$(mktemp)
out=$(mktemp "$doc.XXXXXX")
trap 'rm -f "$keys" "$out"' EXIT
"$bin" train --help-config > "$keys"

# Copy DOC, dropping what lies between the markers and putting the fenced output there.
awk -v begin="$begin" -v end="$end" -v keys="$keys" '
  $0 == begin { print; print "```text"; while ((getline line < keys) > 0) print line; print "```"; skip = 1; next }
  $0 == end   { skip = 0 }
  !skip       { print }
' "$doc" > "$out"
chmod --reference="$doc" "$out"
mv "$out" "$doc"
