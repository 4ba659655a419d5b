#!/usr/bin/env bash
# What-if for MPS (issue 57), by the simulator's model, not a measurement: a cluster serving many
# small models of eight teams beside some training, replayed with its GPUs time-sliced and shared by
# MPS at several capacities (docs/simulator.md, `--mps`). MPS capacity 1 isolates the cost of its
# one-owner-per-GPU rule; above 1, what overlapping small kernels would have to buy back.
# Usage: bench/mps_what_if.sh [TESSERA_BINARY] (default build/test/tessera). The workload is drawn
# with a fixed seed, so runs compare.
set -euo pipefail
bin=${1:-build/test/tessera}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$work" <<'PY'
import random, sys
out = sys.argv[1]
rng = random.Random(57)
with open(out + "/nodes.csv", "w") as f:
    f.write("name,cpu_milli,memory_mib,gpus,gpu_model,gpu_memory_mib,count\n")
    f.write("h100,224000,2097152,8,H100,81920,8\n")
with open(out + "/jobs.csv", "w") as f:
    f.write("name,cpu_milli,memory_mib,gpus,gpu_milli,priority,submit_time,duration,user,utilization\n")
    t = 0.0
    for i in range(4000):
        t += rng.expovariate(1 / 12.0)
        team = "team%d" % rng.randrange(8)
        if rng.random() < 0.85:  # a small model's server: a quarter or an eighth of a GPU
            milli = rng.choice([125, 250])
            util = rng.randint(15, 45)
            f.write("s%d,2000,8192,,%d,0,%.0f,%d,%s,%d\n" % (i, milli, t, rng.randint(600, 3600), team, util))
        else:  # training: one or two whole GPUs
            f.write("t%d,8000,65536,%d,,0,%.0f,%d,%s,\n" % (i, rng.choice([1, 2]), t, rng.randint(1800, 7200), team))
PY
run() {
  "$bin" sim replay --nodes "$work/nodes.csv" --pods "$work/jobs.csv" --policies tessera \
    --interference --no-progress "$@" -o json
}
printf '%-24s %10s %10s %10s %14s\n' "sharing" "WAIT MEAN" "WAIT P95" "JCT MEAN" "SHARE SLOWDOWN"
for mode in "time slices" "mps 1.0" "mps 1.5" "mps 2.0"; do
  case $mode in
    "time slices") args=() ;;
    *) args=(--mps --mps-capacity "${mode#mps }") ;;
  esac
  run "${args[@]}" | python3 -c '
import json, sys
r = json.load(sys.stdin)
r = r[0] if isinstance(r, list) else r
w, j = r["waitSeconds"], r["jctSeconds"]
print("%-24s %9.0fs %9.0fs %9.0fs %13.3fx" % (sys.argv[1], w["mean"], w["p95"], j["mean"], r["shareSlowdownMean"]))
' "$mode"
done
