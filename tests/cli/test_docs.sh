#!/usr/bin/env bash
# The documentation stays true to the code and to itself:
# - the key reference in input/README.md is what `zero3d train --help-config` prints now
#   (jobscripts/gen_config_doc.sh, run on a copy, must change nothing);
# - every relative link in README.md and the reference pages (the README.md of every folder)
#   names a file that exists, and a #fragment names a heading of that page (GitHub's slugs);
# - every reference page is linked from README.md's index.
# usage: test_docs.sh ZERO3D_BINARY SOURCE_DIR
set -u
source "$(dirname "$0")/common.sh" "$@"
fails=0

# 1. The generated key reference.
cp input/README.md "$tmp/config.md"
if ! bash jobscripts/gen_config_doc.sh "$z3d" "$tmp/config.md" > "$tmp/gen.log" 2>&1; then
  cat "$tmp/gen.log"; fail "jobscripts/gen_config_doc.sh failed on input/README.md"
fi
if ! cmp -s input/README.md "$tmp/config.md"; then
  diff input/README.md "$tmp/config.md" | head -20
  echo "FAIL: input/README.md's key reference is out of date: run jobscripts/gen_config_doc.sh $z3d"
  fails=$((fails+1))
fi

# The pages: README.md and the README.md of every folder (build trees and dotfiles left out).
pages=(README.md)
while IFS= read -r p; do pages+=("$p"); done < <(
  find src kernels input jobscripts tests postprocess -name README.md 2>/dev/null | sort)

# prose FILE: the file without its fenced code blocks and inline code spans, where a
# bracket followed by a parenthesis is not a link.
prose() { awk '/^[ ]*```/ { fence = !fence; next } !fence' "$1" | sed 's/`[^`]*`//g'; }
# anchors FILE: the fragment of each heading, as GitHub makes it (lower case, punctuation
# dropped, each space a hyphen).
anchors() {
  awk '/^[ ]*```/ { fence = !fence; next } !fence && /^#+ / { sub(/^#+ +/, ""); print }' "$1" |
    tr 'A-Z' 'a-z' | sed -e 's/[^a-z0-9 _-]//g' -e 's/ /-/g'
}

# 2. Every relative link resolves.
for page in "${pages[@]}"; do
  dir=$(dirname "$page")
  while IFS= read -r link; do
    case $link in http://*|https://*|mailto:*) continue ;; esac
    file=${link%%#*}
    frag=; [[ $link == *#* ]] && frag=${link#*#}
    if [[ -z $file ]]; then target=$page; else target=$dir/$file; fi
    if [[ ! -e $target ]]; then
      echo "FAIL: $page links to '$link': no file $target"; fails=$((fails+1)); continue
    fi
    if [[ -n $frag && $target == *.md ]] && ! anchors "$target" | grep -qxF -- "$frag"; then
      echo "FAIL: $page links to '$link': $target has no heading for #$frag"; fails=$((fails+1))
    fi
  done < <(prose "$page" | grep -o '\]([^)]*)' | sed -e 's/^](//' -e 's/)$//')
done

# 3. The index in README.md names every page.
for page in "${pages[@]:1}"; do
  prose README.md | grep -qF "]($page)" ||
    { echo "FAIL: README.md does not link to the reference page $page"; fails=$((fails+1)); }
done

echo "test_docs: ${#pages[@]} pages, $fails failures"
[[ $fails -eq 0 ]]
