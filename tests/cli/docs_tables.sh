#!/usr/bin/env bash
# The tables docs/training.md carries are the ones the commands print: every row of
# `upipe presets --markdown` is a line of the docs, and the docs' preset table has no other row;
# every line of `upipe settings --markdown` is a line of the docs.
# Usage: docs_tables.sh UPIPE DOCS_MD
set -u
upipe=$1 docs=$2
fail() { echo "FAIL: $*"; exit 1; }
rows=$("$upipe" presets --markdown) || fail "upipe presets --markdown failed"
[ "$(echo "$rows" | wc -l)" -ge 4 ] || fail "too few rows: $rows"
while IFS= read -r line; do
  grep -qxF -- "$line" "$docs" || fail "docs lack the row: $line"
done <<< "$rows"
documented=$(grep -c '^| `[a-z0-9.-]*` | \(llama\|qwen3\)' "$docs")
printed=$(echo "$rows" | grep -c '^| `')
[ "$documented" -eq "$printed" ] || fail "the docs have $documented preset rows, upipe prints $printed"
echo "docs/training.md has the $printed presets upipe prints"
# The settings table too (a unit test compares its rows with the table in the source; this, the
# text around them that `upipe settings --markdown` prints, such as the demo's own values).
while IFS= read -r line; do
  [ -z "$line" ] || grep -qxF -- "$line" "$docs" || fail "docs lack the settings line: $line"
done <<< "$("$upipe" settings --markdown)"
echo "docs/training.md has every line of upipe settings --markdown"
