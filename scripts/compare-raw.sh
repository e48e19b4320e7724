#!/usr/bin/env bash
# zerotx against minimal senders, in the same run and topology (issue 8's acceptance):
#   UDP into the black hole (1472, 4096, 16384, 65000 B): zerotx copy, msg-zc and uring-zc-fixed
#     beside raw-copy, raw-msg-zc, raw-uring-zc-fixed (bench/raw/) and liburing's own
#     examples/send-zerocopy with fixed buffers (benches/liburing/);
#   TCP over loopback: zerotx copy and msg-zc beside raw-copy and raw-msg-zc.
# Prints each run's table (its "zerotx / baseline" block is the ratio table), then the ratios
# against the acceptance thresholds. Needs root (the black hole is a private network namespace).
#
#   DURATION=0.2 REPEAT=40 ./scripts/compare-raw.sh [extra zerotx bench flags]
#
# Many short repetitions rather than a few long ones: one run on these VMs varies by ~10% with
# the host, in phases of a second or so, and a longer run does not average that out. Repetition r
# of every column runs back to back, so each repetition gives one ratio per pair; the verdict rests
# on the median of those ratios and its 95% interval (about 12 minutes for both topologies).
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION="${DURATION:-0.2}"
REPEAT="${REPEAT:-40}"
OUT="${OUT:-target/compare-raw}"
export PATH="$PATH:/usr/sbin:/sbin"

if [ ! -e /usr/include/liburing.h ]; then
  echo "== installing liburing-dev" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq liburing-dev >/dev/null
fi
mkdir -p target/liburing "$OUT"
echo "== building liburing's send-zerocopy example" >&2
cc -O2 -D_GNU_SOURCE -o target/liburing/send-zerocopy benches/liburing/send-zerocopy.c \
  -luring -lpthread
echo "== building zerotx" >&2
cargo build --release -q -p zerotx-cli
ZEROTX=target/release/zerotx
common=(--duration "$DURATION" --repeat "$REPEAT" "$@")

echo "== UDP black hole: ${DURATION} s x ${REPEAT} per cell" >&2
$ZEROTX bench --topology udp-blackhole --engines copy,msg-zc,uring-zc-fixed --baselines \
  --liburing target/liburing/send-zerocopy "${common[@]}" \
  --export-json "$OUT/udp.json" --export-markdown "$OUT/udp.md" | tee "$OUT/udp.txt"

echo "== TCP loopback: ${DURATION} s x ${REPEAT} per cell" >&2
$ZEROTX bench --topology tcp-loopback --engines copy,msg-zc,raw-copy,raw-msg-zc "${common[@]}" \
  --export-json "$OUT/tcp.json" --export-markdown "$OUT/tcp.md" | tee "$OUT/tcp.txt"

echo
echo "== zerotx / baseline against issue 8's acceptance"
echo "   (median of the repetitions' side-by-side ratios, 95% interval from order statistics:"
echo "    met = the whole interval clears the threshold, missed = it lies below, unclear = it straddles)"
python3 - "$OUT/udp.json" "$OUT/tcp.json" <<'PY'
import json, math, sys

def runs(path):
    r = json.load(open(path))
    out = {}
    for t in r["topologies"]:
        if t["skipped"]:
            print(f"  {t['name']}: skipped: {t['skipped']}")
            continue
        for c in t["cells"]:
            if c["error"] is None and c["runs"]:
                out[(t["name"], c["engine"], c["size"])] = [
                    x["bytes"] / x["seconds"] for x in c["runs"] if x["seconds"] > 0]
    return out

def k95(n):
    # Largest k with P(Binomial(n, 1/2) < k) <= 2.5% (as bench/result.rs order_statistic_95).
    below, lnc, lnh = 0.0, 0.0, n * math.log(0.5)
    for i in range(n // 2):
        below += math.exp(lnc + lnh)
        if below > 0.025:
            return i
        lnc += math.log((n - i) / (i + 1))
    return n // 2

def paired(x, y):
    r = sorted(a / b for a, b in zip(x, y) if b > 0)
    n = len(r)
    if n == 0:
        return None
    med = r[n // 2] if n % 2 else (r[n // 2 - 1] + r[n // 2]) / 2
    k = k95(n)
    return med, (r[k - 1], r[n - k]) if k else None

m = {**runs(sys.argv[1]), **runs(sys.argv[2])}
checks = []
for topo, sizes in (("udp-blackhole", [1472, 4096, 16384, 65000]),
                    ("tcp-loopback", [1400, 4096, 16384, 65536, 262144, 1048576])):
    for s in sizes:
        checks.append((topo, "copy", "raw-copy", s, 0.97))
for s, want in ((1472, 0.9), (4096, None), (16384, None), (65000, 0.97)):
    checks.append(("udp-blackhole", "msg-zc", "raw-msg-zc", s, want))
for s in (1472, 4096, 16384, 65000):
    checks.append(("udp-blackhole", "uring-zc-fixed", "raw-uring-zc-fixed", s, None))
    checks.append(("udp-blackhole", "uring-zc-fixed", "liburing-zc-fixed", s,
                   1.0 if s >= 16384 else None))
print(f"  {'topology':14} {'zerotx / baseline':40} {'size':>8} {'ratio':>7} {'95% interval':>16}  want")
for topo, a, b, s, want in checks:
    x, y = m.get((topo, a, s)), m.get((topo, b, s))
    p = paired(x, y) if x and y else None
    if p is None:
        print(f"  {topo:14} {a + ' / ' + b:40} {s:>8}     n/a")
        continue
    med, iv = p
    ivs = f"[{iv[0]:.3f}, {iv[1]:.3f}]" if iv else "(too few runs)"
    verdict = ""
    if want is not None:
        lo, hi = iv if iv else (med, med)
        verdict = f">= {want:.2f} " + ("met" if lo >= want else "missed" if hi < want else "unclear")
    print(f"  {topo:14} {a + ' / ' + b:40} {s:>8} {med:7.3f} {ivs:>16}  {verdict}")
PY
