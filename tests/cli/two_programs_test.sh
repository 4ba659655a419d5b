#!/bin/bash
# `tessera` is two programs (src/tessera/cli/client_main.cc): the small one users run loads only
# what the client verbs need and runs them itself; every other command is tessera-full's, exec'd in
# its place. This checks that split from the outside: what the small one loads, that it runs the
# client verbs without tessera-full, that everything else reaches tessera-full with its arguments
# (help, a misspelt command, an option before the command), and a clear error when tessera-full is
# missing.
set -euo pipefail
build="$1"
small="$build/tessera"
fail() { echo "FAIL: $*" >&2; exit 1; }
# Named as tests/test_main.cc names its folders: one left by a killed run (a timeout) is swept by
# the next test binary that starts.
work=$(mktemp -d "${TMPDIR:-/tmp}/tessera-tests-$$-XXXXXX")
trap 'rm -rf "$work"' EXIT

# What it loads: the C and C++ runtimes, fmt and spdlog; abseil, OpenSSL and yaml-cpp are linked
# in; none of gRPC, protobuf, SQLite, curl.
libs=$(ldd "$small" | awk '{print $1}')
for heavy in grpc protobuf sqlite curl absl ssl crypto yaml; do
  if grep -q "$heavy" <<<"$libs"; then fail "tessera loads $heavy: $(tr '\n' ' ' <<<"$libs")"; fi
done
[[ $(wc -l <<<"$libs") -le 10 ]] || fail "tessera loads $(wc -l <<<"$libs") libraries: $libs"

# Alone in a folder (no tessera-full beside it or in ../lib/tessera): the client verbs still run.
mkdir -p "$work/bin"
cp "$small" "$work/bin/tessera"
out=$("$work/bin/tessera" ls --help) || fail "ls --help alone: $out"
[[ "$out" == *"--ended"* ]] || fail "ls --help: $out"
set +e
out=$(TESSERA_SOCKET="$work/none.sock" "$work/bin/tessera" ls 2>&1)
code=$?
set -e
[[ $code -ne 127 && "$out" == *"none.sock"* ]] || fail "ls to no server ($code): $out"
# ... and any other command says what is missing, exit 127.
set +e
out=$("$work/bin/tessera" server 2>&1)
code=$?
set -e
[[ $code -eq 127 && "$out" == *"cannot run $work/lib/tessera/tessera-full"* ]] ||
  fail "server without tessera-full ($code): $out"
# Installed beside it as cmake --install lays it out (../lib/tessera), it is found; also by a PATH
# lookup when /proc/self/exe cannot be read (as in a chroot without /proc, covered by the install
# test).
mkdir -p "$work/lib/tessera"
cp "$build/tessera-full" "$work/lib/tessera/tessera-full"
out=$("$work/bin/tessera" version) || fail "version through ../lib/tessera: $out"
[[ "$out" == "tessera "* ]] || fail "version: $out"

# Every command, listed by the help (tessera-full's), the client's among them.
out=$("$small" --help)
for c in server agent sim admin submit run ls show logs cancel acct top; do
  grep -qE "^  $c( |$)" <<<"$out" || fail "--help lists no $c: $out"
done
# Mistakes said by whichever program takes them, with the same hints.
set +e
out=$("$small" lss 2>&1); code=$?
set -e
[[ $code -eq 2 && "$out" == *"unknown command 'lss'; did you mean 'ls'?"* ]] || fail "lss ($code): $out"
set +e
out=$("$small" ls --bogus 2>&1); code=$?
set -e
[[ $code -eq 2 && "$out" == *"--bogus"* ]] || fail "ls --bogus ($code): $out"
set +e
out=$("$small" --log-level debug ls --socket "$work/none.sock" 2>&1); code=$?
set -e
[[ $code -ne 2 ]] || fail "--log-level before a client verb ($code): $out"
echo "ok"
