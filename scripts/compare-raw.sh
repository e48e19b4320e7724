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
# of every column runs back to back (in a shuffled order, so no column always follows the same
# one), an engine and its baselines in one stretch (uring-zc-fixed's two at most one run apart),
# so each repetition gives one ratio
# per pair from runs made one after the other; the verdict rests
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
import json, sys

def ratios(path):
    # The bench's own figures (export/json.rs `baseline_ratios`), not computed again here.
    r = json.load(open(path))
    out = {}
    for t in r["topologies"]:
        if t["skipped"]:
            print(f"  {t['name']}: skipped: {t['skipped']}")
            continue
        for b in t["baseline_ratios"]:
            out[(t["name"], b["engine"], b["baseline"], b["size"])] = b["ratio"]
    return out

m = {**ratios(sys.argv[1]), **ratios(sys.argv[2])}
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
    p = m.get((topo, a, b, s))
    if p is None:
        print(f"  {topo:14} {a + ' / ' + b:40} {s:>8}     n/a")
        continue
    med, iv = p["median"], p["interval"]
    ivs = f"[{iv[0]:.3f}, {iv[1]:.3f}]" if iv else "(too few runs)"
    verdict = ""
    if want is not None:
        lo, hi = iv if iv else (med, med)
        verdict = f">= {want:.2f} " + ("met" if lo >= want else "missed" if hi < want else "unclear")
    print(f"  {topo:14} {a + ' / ' + b:40} {s:>8} {med:7.3f} {ivs:>16}  {verdict}")
PY
