#!/bin/sh
# `make sanitize`: runs one sanitizer build of csrc/tests/sanitize_main.cc, its output kept in BINARY.log.
# usage: run_sanitized.sh BINARY [NAME=value ...]   (the sanitizer's options, passed through env)
#
# TSan puts its shadow memory at fixed addresses; where the kernel randomizes mappings more widely than
# it expects (vm.mmap_rnd_bits above 28), a library can land there and the binary dies at start with
# "FATAL: ThreadSanitizer: unexpected memory mapping". It then runs with ASLR off (setarch -R), which
# changes nothing the test checks: at once if it cannot even start (--probe returns from main at once),
# or again if the real run died that way (the layout is random on every start).
set -u
bin=$1
shift
aslr_off="setarch $(uname -m) -R"
prefix=
if ! env "$@" "$bin" --probe >/dev/null 2>&1; then
  prefix=$aslr_off
  echo "($bin cannot start with ASLR on: running it under $prefix)"
fi
while :; do
  { env "$@" $prefix "$bin"; echo $? >"$bin.rc"; } 2>&1 | tee "$bin.log"
  rc=$(cat "$bin.rc")
  if [ "$rc" -ne 0 ] && [ -z "$prefix" ] && grep -q "unexpected memory mapping" "$bin.log"; then
    prefix=$aslr_off
    echo "($bin met a memory mapping its sanitizer cannot live with: again under $prefix)"
    continue
  fi
  exit "$rc"
done
