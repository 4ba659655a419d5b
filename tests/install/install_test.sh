#!/usr/bin/env bash
# The lab install (issue 52), as a lab admin and a student meet it, in a root the test makes:
# `cmake --install` of this build into DIR/usr/local (what scripts/install runs), the example
# config put at DIR/etc/tessera/server.yaml as scripts/install does, and, so that nothing of the
# build or source tree is reachable, only the shared libraries the installed files need copied in
# beside them. Then:
# - the unit passes `systemd-analyze verify` (with the host's targets; any warning fails);
# - the man page renders without groff warnings; the completion completes subcommands and options;
# - the installed server, run in that root by chroot (its own mount and pid namespaces, /proc and
#   /dev), starts on the installed config, finds its intercept library in /usr/local/lib/tessera;
# - a student (nobody) with no TESSERA_SOCKET reaches it at /run/tessera/tessera.sock, submits a
#   share job, and the job preloads the server's copy of the installed library.
# Usage: install_test.sh BUILD_DIR (the build to install). Needs root (chroot, namespaces).
set -euo pipefail
build=$(cd "$1" && pwd)
[[ $EUID -eq 0 ]] || { echo "needs root (chroot)"; exit 77; }
# Named as tests/test_main.cc names its folders: one left by a killed run (a timeout) is swept by
# the next test binary that starts.
work=$(mktemp -d "${TMPDIR:-/tmp}/tessera-tests-$$-XXXXXX")
root="$work/root"
server=""
cleanup() {
  # The server is its pid namespace's init (SIGTERM from outside does not reach an init without a
  # handler) and unshare ignores SIGTERM while it waits: the namespace ends with its init, killed.
  if [[ -n "$server" ]]; then
    pkill -KILL -P "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

DESTDIR="$root" cmake --install "$build" --prefix /usr/local >"$work/install.log"
for f in usr/local/bin/tessera usr/local/lib/tessera/tessera-full usr/local/lib/tessera/libtessera-cuda.so \
  usr/local/lib/systemd/system/tessera.service usr/local/share/man/man1/tessera.1 \
  usr/local/share/bash-completion/completions/tessera usr/local/share/tessera/server.yaml \
  usr/local/share/tessera/grafana/tessera-server.json usr/local/share/tessera/grafana/tessera-slurm.json \
  usr/local/share/tessera/grafana/tessera.json usr/local/share/tessera/prometheus/tessera-rules.yaml; do
  [[ -e "$root/$f" ]] || fail "cmake --install left out /$f"
done
grep -q '^ExecStart=/usr/local/bin/tessera server --config /etc/tessera/server.yaml$' \
  "$root/usr/local/lib/systemd/system/tessera.service" || fail "ExecStart names the prefix's binary"
install -d -m 0755 "$root/etc/tessera"
install -m 0600 "$root/usr/local/share/tessera/server.yaml" "$root/etc/tessera/server.yaml"

# The unit, as systemd reads it: the host's targets beside it, not the host's /usr/local.
mkdir -p "$root/usr/lib/systemd/system"
cp -a /usr/lib/systemd/system/*.target "$root/usr/lib/systemd/system/"
# (--man=no: the host's man cannot see the root's page; it is checked below.)
if ! out=$(systemd-analyze verify --man=no --root="$root" tessera.service 2>&1) || [[ -n "$out" ]]; then
  fail "systemd-analyze verify: $out"
fi
# The Slurm plugin's MPS daemon unit (where the plugin is built), with the programs it runs: the
# fake control daemon standing for NVIDIA's, the host's install and sh.
if [[ -e "$root/usr/local/lib/systemd/system/tessera-slurm-mps@.service" ]]; then
  mkdir -p "$root/usr/bin" "$root/bin"
  cp "$build/tests/fakes/mps/nvidia-cuda-mps-control" /usr/bin/install "$root/usr/bin/"
  cp /bin/sh "$root/bin/"
  if ! out=$(systemd-analyze verify --man=no --root="$root" tessera-slurm-mps@0.service 2>&1) ||
    [[ -n "$out" ]]; then
    fail "systemd-analyze verify tessera-slurm-mps@0.service: $out"
  fi
  rm -rf "$root/usr/bin" "$root/bin"
elif [[ -e "$build/tessera-spank.so" ]]; then
  fail "cmake --install left out the Slurm plugin's tessera-slurm-mps@.service"
fi
rm -rf "$root/usr/lib/systemd"

# The man page, rendered with every groff warning on; the completion, in bash.
warnings=$(groff -man -Tutf8 -ww -z "$root/usr/local/share/man/man1/tessera.1" 2>&1)
[[ -z "$warnings" ]] || fail "man page: $warnings"
man -l "$root/usr/local/share/man/man1/tessera.1" 2>/dev/null | grep -q "tessera submit" ||
  fail "the man page has no 'tessera submit' section"
complete_words() {
  bash -c 'source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _tessera; echo "${COMPREPLY[*]}"' \
    _ "$root/usr/local/share/bash-completion/completions/tessera" "$@"
}
[[ " $(complete_words tessera su) " == *" submit "* ]] || fail "completion: tessera su<TAB>"
[[ " $(complete_words tessera submit --gr) " == *" --gres "* ]] || fail "completion: submit --gr<TAB>"
[[ " $(complete_words tessera admin b) " == *" backup "* ]] || fail "completion: admin b<TAB>"
[[ " $(complete_words tessera ls -o j) " == *" json "* ]] || fail "completion: ls -o j<TAB>"

# What the installed files need to run, and a shell for jobs: copied in with their paths.
for f in "$root/usr/local/bin/tessera" "$root/usr/local/lib/tessera/tessera-full" \
  "$root/usr/local/lib/tessera/libtessera-cuda.so" /bin/sh; do
  ldd "$f" | grep -o '/[^ ]*' | while read -r lib; do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
done
mkdir -p "$root/bin" "$root/proc" "$root/dev" "$root/tmp" "$root/run" "$root/var/lib"
chmod 1777 "$root/tmp"
cp /bin/sh "$root/bin/sh"
cp /etc/passwd /etc/group "$root/etc/"
# The server: the unit's command line, in the root (its own mounts: nothing leaks to the host).
unshare --mount --pid --fork sh -c "mount --make-rprivate / && mount -t proc proc '$root/proc' &&
  mount --bind /dev '$root/dev' && exec chroot '$root' /usr/local/bin/tessera server \
  --config /etc/tessera/server.yaml" >"$work/server.log" 2>&1 &
server=$!
for _ in $(seq 200); do [[ -S "$root/run/tessera/tessera.sock" ]] && break; sleep 0.05; done
[[ -S "$root/run/tessera/tessera.sock" ]] || fail "no socket at /run/tessera/tessera.sock: $(cat "$work/server.log")"
grep -q "intercept library /usr/local/lib/tessera/libtessera-cuda.so installed as /var/lib/tessera/lib/libtessera-cuda.so" \
  "$work/server.log" || fail "the server did not find the installed intercept library: $(cat "$work/server.log")"
# A student: no variable, the system socket found; a share job with the server's library.
chroot=$(command -v chroot)
student() {
  env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/tmp "$chroot" --userspec=nobody:nogroup "$root" \
    sh -c 'cd /tmp && exec /usr/local/bin/tessera "$@"' _ "$@"
}
out=$(student submit --gpu-share 30% --gpu-mem 1GiB -- /bin/sh -c 'echo "preload $LD_PRELOAD"') ||
  fail "a student's submit: $out"
id=$(echo "$out" | grep -o 'submitted job [0-9]*' | grep -o '[0-9]*$')
for _ in $(seq 200); do
  state=$(student show "$id" -o json | python3 -c 'import json, sys; print(json.load(sys.stdin)["state"])')
  [[ "$state" == succeeded || "$state" == failed ]] && break
  sleep 0.05
done
[[ "$state" == succeeded ]] || fail "the student's job: $state: $(student show "$id")"
[[ "$(student logs "$id")" == "preload /var/lib/tessera/lib/libtessera-cuda.so" ]] ||
  fail "the job's preload: $(student logs "$id")"
[[ "$(student ls --ended -o json | grep -c '"owner": *"nobody"')" -ge 1 ]] || fail "ls as the student"
# The admin's backup, online, beside the running server; a student cannot take one.
out=$("$chroot" "$root" /usr/local/bin/tessera admin backup /var/lib/tessera-backup.db) ||
  fail "admin backup: $out"
[[ "$out" == *"1 jobs, schema version"* ]] || fail "admin backup said: $out"
[[ "$(stat -c %a "$root/var/lib/tessera-backup.db")" == 600 ]] || fail "the backup is not 0600"
if out=$(student admin backup /tmp/mine.db 2>&1); then fail "a student took a backup: $out"; fi
echo "ok: installed, verified, served to a student from /run/tessera/tessera.sock"
