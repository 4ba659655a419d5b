#!/usr/bin/env bash
# The checkout carries what its build, tests, benchmarks and README need (issue 34): nothing in them
# reads a folder beside the checkout (a sibling `shared/` exists on developers' machines and not in a
# user's clone), and the traces the project carries are the published files, byte for byte.
set -euo pipefail
cd "$(dirname "$0")/.."
bad=0
# Every tracked file but the traces' data and this script: code, scripts, build files, the README
# and the docs. A path upwards into a sibling `shared/`, or a file of that folder named as a source
# (its reference/ and traces/, ARCHITECTURE.md, CONVENTIONS.md), is something a clone lacks.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files -co --exclude-standard | grep -vE '^(traces/openb/|tests/self_contained\.sh$)')
else
  mapfile -t files < <(find src tests bench scripts docs web/src web/test .ci CMakeLists.txt README.md \
    -type f -not -path '*/node_modules/*' -not -name self_contained.sh)
fi
if hits=$(grep -nE '\.\./shared/|(^|[^a-z_])shared/(reference|traces|ARCHITECTURE|CONVENTIONS)' \
    "${files[@]}" 2>/dev/null); then
  echo "self-contained: these read a folder outside the checkout:"
  echo "$hits"
  bad=1
fi
# The traces: present and unchanged.
if ! (cd traces/openb && sha256sum --quiet -c SHA256SUMS); then
  echo "self-contained: traces/openb differs from traces/openb/SHA256SUMS"
  bad=1
fi
for f in traces/openb/openb_node_list_gpu_node.csv traces/openb/openb_pod_list_default.csv; do
  [[ -s "$f" ]] || { echo "self-contained: $f missing"; bad=1; }
done
[[ $bad -eq 0 ]] && echo "self-contained: no path outside the checkout; traces/openb matches SHA256SUMS"
exit $bad
