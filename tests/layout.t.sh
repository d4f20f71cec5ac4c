#!/usr/bin/env bash
# The layout is the pipeline (issue: one room per concern): lang/, ir/,
# fusion/ and codegen/ never include runtime/; no source file under the
# stage folders, tests/ or bench/ is over 800 lines; every C source of the
# project lives in a stage folder (or tests/, bench/); each folder of
# runtime/ has one header that is its public surface, which the other
# folders include, and its private ones stay inside it; runtime/'s folders
# include one another in one direction only (cli -> train -> data, cuda).
set -u
fail=0
bad() { echo "FAIL: $*"; fail=1; }
stages="lang ir fusion codegen runtime"

# 1. no stage below runtime/ reaches up into it
for d in lang ir fusion codegen; do
  grep -rn '#include "runtime/' "$d" --include='*.c' --include='*.h' && bad "$d/ includes runtime/"
done

# 2. files under 800 lines (the generated parser and lexer live in build/);
#    a test program past it splits along its sections, its shared helpers
#    in a tests/*.h (tests/data_check.h)
for f in $(find $stages tests bench \( -name '*.c' -o -name '*.h' -o -name '*.y' -o -name '*.l' -o -name '*.def' \)); do
  n=$(wc -l <"$f")
  [ "$n" -le 800 ] || bad "$f has $n lines (over 800)"
done

# 3. every C source is in a stage folder, tests/ or bench/
for f in $(git ls-files '*.c' '*.h' '*.cpp' '*.hpp' 2>/dev/null); do
  case "$f" in lang/*|ir/*|fusion/*|codegen/*|runtime/*|tests/*|bench/*) ;;
    *) bad "$f is not under a stage folder";; esac
done
for f in runtime/*.c runtime/*.h; do
  [ -e "$f" ] && bad "$f lies loose in runtime/ (put it in the folder of its concern)"
done

# 4. runtime/'s folders: one public header each, named after the folder;
#    a header ending in _impl.h is private to its folder
for d in runtime/*/; do
  d=${d%/}
  name=$(basename "$d")
  [ -f "$d/$name.h" ] || bad "$d has no public header $d/$name.h"
  for h in "$d"/*.h; do
    [ "$h" = "$d/$name.h" ] && continue
    case "$h" in *_impl.h) ;; *) bad "$h: a second public header in $d (merge it into $name.h, or name it *_impl.h)";; esac
    hb=$(basename "$h")
    users=$(grep -rln "#include \"$d/$hb\"" $stages tests bench 2>/dev/null | grep -v "^$d/" | grep -v '^tests/')
    [ -z "$users" ] || bad "$h is private to $d but included by: $users"
  done
done

# 5. runtime/'s folders in one direction: cli -> train -> data, cuda (no
#    loop of calls between concerns)
below() { # FOLDER: the folders it must not include
  case "$1" in
    data|cuda) echo "cli train";;
    train) echo "cli";;
  esac
}
for d in data cuda train; do
  for up in $(below $d); do
    grep -rn "#include \"runtime/$up/" runtime/$d && bad "runtime/$d includes runtime/$up/"
  done
done
[ -z "$(grep -rln '#include "runtime/\(train\|cli\)/' runtime/data runtime/cuda)" ] ||
  bad "runtime/data or runtime/cuda reaches up"

[ $fail = 0 ] && echo "layout.t.sh: ok"
exit $fail
