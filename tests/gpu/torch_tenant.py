#!/usr/bin/env python3
"""A PyTorch tenant for tessera-gpu-check --torch: a training-like loop that queues BATCH matrix
products (N x N, bf16) between synchronizes, as asynchronous PyTorch code does, and times each
product's completion on the GPU with an event after it. Arguments are KEY=VALUE as for the check's
own tenants (batch, n, run_ms, from_ms, to_ms, start_ms: CLOCK_MONOTONIC ms); prints
"window_us=... total_us=... units=..." where the "us" are products (all of one size, so the
parent compares counts). With mode=memory it asks for 2 GiB, then 256 MiB, under the limit the
parent set (1 GiB): "over=oom|ok under=oom|ok"."""
import sys
import time

args = dict(a.split("=", 1) for a in sys.argv[1:])
batch = int(float(args.get("batch", 200)))
n = int(float(args.get("n", 8192)))
run_ms = float(args.get("run_ms", 2600))
lo, hi = float(args.get("from_ms", 500)), float(args.get("to_ms", 2500))

try:
    import torch

    if args.get("mode") == "memory":
        def alloc(mib):
            try:
                torch.empty(mib << 20, dtype=torch.uint8, device="cuda")
                return "ok"
            except torch.cuda.OutOfMemoryError:
                return "oom"
        print(f"over={alloc(2048)} under={alloc(256)}", flush=True)
        sys.exit(0)

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = a @ b
    torch.cuda.synchronize()
except Exception as e:  # noqa: BLE001 - reported to the parent, which fails the check
    print("error=" + str(e).replace("\n", " "), flush=True)
    sys.exit(1)

now_ms = lambda: time.clock_gettime(time.CLOCK_MONOTONIC) * 1e3  # noqa: E731
start = float(args.get("start_ms", now_ms()))
ref = torch.cuda.Event(enable_timing=True)
ref.record()
ref.synchronize()
ref_ms = now_ms()
while now_ms() < start:
    time.sleep(0.001)
events = [torch.cuda.Event(enable_timing=True) for _ in range(batch)]
window = total = 0
while now_ms() - start < run_ms:
    for e in events:
        torch.matmul(a, b, out=c)
        e.record()
    torch.cuda.synchronize()
    for e in events:
        done = ref_ms + ref.elapsed_time(e) - start
        total += 1
        window += lo <= done < hi
print(f"window_us={window} total_us={total} units={total}", flush=True)
