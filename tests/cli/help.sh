#!/usr/bin/env bash
# Help as a newcomer asks for it: `upipe help [COMMAND...]` prints what `upipe [COMMAND...] --help`
# does, exit 0; `upipe demo --help` shows the demo's own defaults (not train's) and the switches
# a stopped demo is continued with.
# Usage: help.sh UPIPE
set -u
upipe=$1
fail() { echo "FAIL: $*"; exit 1; }
for words in "" "train" "bench kernel" "demo attention"; do
  # shellcheck disable=SC2086  # the words are separate arguments
  a=$("$upipe" help $words 2>&1) || fail "upipe help $words exited $?"
  # shellcheck disable=SC2086
  b=$("$upipe" $words --help 2>&1) || fail "upipe $words --help exited $?"
  [ "$a" = "$b" ] || fail "upipe help $words differs from upipe $words --help"
  [ -n "$a" ] && echo "upipe help $words: $(printf '%s\n' "$a" | head -1)"
done
demo=$("$upipe" demo --help) || fail "demo --help"
for want in '--steps .*(default 1000)' '--seq-len .*(default 128)' '--lr .*(default 3e-3)' '^ *--resume' '^ *--overwrite'; do
  printf '%s\n' "$demo" | grep -q -e "$want" || fail "demo --help lacks '$want'"
done
train=$("$upipe" train --help) || fail "train --help"
printf '%s\n' "$train" | grep -q -e '--steps .*(default 100)' || fail "train --help lost its own default of --steps"
echo PASS
