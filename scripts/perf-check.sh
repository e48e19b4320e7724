#!/usr/bin/env bash
# The fast path's check (docs/fast-path.md): one `zerotx bench` over both default topologies
# (TCP loopback, UDP black hole) with every zerotx engine, the raw loops and liburing's example,
# then every ratio the project holds itself to, each as median [min-max] over the repetitions
# and marked against its threshold:
#   - zerotx against the minimal senders (the core issue's acceptance, as scripts/compare-raw.sh):
#     copy / raw-copy >= 0.97 at every size of both topologies, msg-zc / raw-msg-zc >= 0.90 at
#     1472 B and >= 0.97 at 65000 B (UDP), uring-zc-fixed / liburing-zc-fixed >= 1.00 at 16384 B
#     and 65000 B (UDP); the other pairs are printed without a threshold;
#   - auto / the best single engine >= 0.95 at every size of both topologies. Every cell below
#     it, or unclear, is listed again at the end, split into auto / the engine that makes the same
#     system calls as what auto chose (auto's own overhead) and that engine / the best (the choice
#     of mechanism, plus the pick of the best of five noisy columns).
# Run it before and after a change to the engines, in one session, and quote both. The auto rows
# pick the best of five columns from the same noisy runs: with REPEAT=5 a perfect auto misses
# 0.95 in some cell unless one run's noise is well under 5%; REPEAT=20 is the shortest run that
# says much about them (benches/HISTORY.md, "auto against the best single engine, cell by cell"). Needs root
# (the black hole is a private network namespace). About 4 minutes with the defaults:
#
#   DURATION=0.4 REPEAT=5 ./scripts/perf-check.sh [extra zerotx bench flags]
#
# A ratio is taken per repetition from runs made in the same round (an engine and the one it is
# compared with run back to back in each repetition's shuffled order), so a slow phase of the host
# moves both; `min-max` is the spread of those per-repetition ratios. `auto / best` divides by the
# single engine with the highest median in that cell, in every repetition. A median below its
# threshold is `MISSED`; a spread that straddles it is `unclear` (this machine cannot tell); use
# scripts/compare-raw.sh (40 repetitions, 95% intervals) to settle one core-issue row.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION="${DURATION:-0.4}"
REPEAT="${REPEAT:-5}"
OUT="${OUT:-target/perf-check}"
ZEROTX="${ZEROTX:-target/release/zerotx}"
export PATH="$PATH:/usr/sbin:/sbin"

mkdir -p "$OUT" target/liburing
liburing=()
if [ -e /usr/include/liburing.h ]; then
  if [ ! -x target/liburing/send-zerocopy ] ||
     [ benches/liburing/send-zerocopy.c -nt target/liburing/send-zerocopy ]; then
    cc -O2 -D_GNU_SOURCE -o target/liburing/send-zerocopy benches/liburing/send-zerocopy.c \
      -luring -lpthread
  fi
  liburing=(--liburing target/liburing/send-zerocopy)
else
  echo "== liburing-dev is not installed: the liburing rows stay n/a" \
       "(scripts/compare-raw.sh installs it)" >&2
fi
if [ -z "${NO_BUILD:-}" ]; then
  echo "== building zerotx (release)" >&2
  cargo build --release -q -p zerotx-cli
fi

# The acceptance is for a quiet machine: other work on the CPUs widens every spread far past the
# thresholds. Say how busy it was, before and after the run.
read -r load_before _ </proc/loadavg
echo "== zerotx bench: both topologies, ${DURATION} s x ${REPEAT} per cell" >&2
"$ZEROTX" bench --baselines "${liburing[@]}" --duration "$DURATION" --repeat "$REPEAT" "$@" \
  --export-json "$OUT/bench.json" >"$OUT/bench.txt"

read -r load_after _ </proc/loadavg
python3 - "$OUT/bench.json" "$load_before" "$load_after" <<'PY'
import json, statistics, sys

report = json.load(open(sys.argv[1]))
loads = [float(x) for x in sys.argv[2:4]]
SINGLE = ["copy", "msg-zc", "uring", "uring-zc", "uring-zc-fixed"]
print(f"zerotx {report['version']}, kernel {report['kernel']}, {report['cpus']} CPUs, "
      f"{report['run_seconds']} s x {report['repeat']} per cell, seed {report['seed']}")
print(f"load average (1 min) {loads[0]:.1f} before the run, {loads[1]:.1f} after", end="")
if max(loads) > report["cpus"] / 2:
    print(": NOT a quiet machine, the spreads say more about the other work than about zerotx")
else:
    print()

def rates(cell):
    return [r["bytes"] / r["seconds"] if r["seconds"] > 0 else 0.0 for r in cell["runs"]]

def verdict(ratios, want):
    if want is None:
        return ""
    med = statistics.median(ratios)
    if min(ratios) >= want:
        return f">= {want:.2f} met"
    if med < want:
        return f">= {want:.2f} MISSED"
    return f">= {want:.2f} unclear"

def row(label, size, ratios, want, note=""):
    if not ratios:
        print(f"  {label:42} {size:>8}      n/a  {note}")
        return
    med = statistics.median(ratios)
    spread = f"[{min(ratios):.3f}-{max(ratios):.3f}]"
    print(f"  {label:42} {size:>8} {med:7.3f} {spread:>15}  {verdict(ratios, want)} {note}")

def paired(a, b):
    return [x / y for x, y in zip(rates(a), rates(b)) if y > 0]

def mirror(chosen, topo, huge):
    """The single engine whose system calls auto makes when it settled on `chosen`."""
    stream = topo.startswith("tcp") or topo == "vsock"
    if chosen == "uring (small)" and stream:
        return "copy"  # small copies on a stream go as copy's gathered sendmsg (write_now)
    if chosen.startswith("uring ("):
        return "uring"
    if chosen == "uring-zc":
        return "uring-zc" if huge else "uring-zc-fixed"  # the bench registers auto's ring
    if chosen.startswith("copy"):
        return "copy"
    return chosen  # msg-zc

flagged = []

CORE = {
    ("copy", "raw-copy"): lambda topo, s: 0.97,
    ("msg-zc", "raw-msg-zc"): lambda topo, s: (
        {1472: 0.90, 65000: 0.97}.get(s) if topo == "udp-blackhole" else None),
    ("uring-zc-fixed", "raw-uring-zc-fixed"): lambda topo, s: None,
    ("uring-zc-fixed", "liburing-zc-fixed"): lambda topo, s: (
        1.00 if topo == "udp-blackhole" and s >= 16384 else None),
}

for t in report["topologies"]:
    print(f"\n== {t['name']}")
    if t["skipped"]:
        print(f"  skipped: {t['skipped']}")
        continue
    cells = {(c["engine"], c["size"]): c for c in t["cells"] if not c.get("error")}
    print(f"  {'zerotx / baseline':42} {'size':>8} {'median':>7} {'[min-max]':>15}  threshold")
    for (a, b), want in CORE.items():
        for s in t["sizes"]:
            ca, cb = cells.get((a, s)), cells.get((b, s))
            if not ca or not cb:
                if want(t["name"], s) is not None:
                    row(f"{a} / {b}", s, [], None, "(not run)")
                continue
            ratios = [x / y for x, y in zip(rates(ca), rates(cb)) if y > 0]
            row(f"{a} / {b}", s, ratios, want(t["name"], s))
    print(f"  {'auto / best single engine':42} {'size':>8} {'median':>7} {'[min-max]':>15}  threshold")
    for s in t["sizes"]:
        auto = cells.get(("auto", s))
        singles = [cells[(e, s)] for e in SINGLE if (e, s) in cells]
        if not auto or not singles:
            row("auto / best", s, [], None, "(not run)")
            continue
        best = max(singles, key=lambda c: c["mb_s"]["median"])
        ratios = paired(auto, best)
        chosen = auto.get("chosen") or "?"
        row(f"auto / {best['engine']}", s, ratios, 0.95,
            f"(auto: {chosen}; {auto['mb_s']['median']:.0f} vs {best['mb_s']['median']:.0f} MB/s)")
        if not ratios or verdict(ratios, 0.95).endswith("met"):
            continue
        # Which part of the gap is auto's own: the engine that makes the same system calls as
        # what auto chose ran in the same rounds; auto / that engine is auto's overhead, that
        # engine / best is the choice of mechanism plus picking the best of five noisy columns.
        twin = cells.get((mirror(chosen, t["name"], report["huge_pages"]), s))
        if twin and twin is not best:
            own, choice = paired(auto, twin), paired(twin, best)
            flagged.append((t["name"], s, ratios, twin["engine"], own, best["engine"], choice))
        else:
            flagged.append((t["name"], s, ratios, best["engine"], ratios, best["engine"], []))

def spread(ratios):
    if not ratios:
        return "n/a"
    return f"{statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]"

print("\n== auto cells below 0.95 or unclear (median [min-max] of per-repetition ratios)")
if not flagged:
    print("  none: auto / best >= 0.95 in every repetition of every cell")
for topo, s, ratios, twin, own, best, choice in flagged:
    print(f"  {topo} {s}: auto / {best} {spread(ratios)} {verdict(ratios, 0.95)}")
    if twin != best:
        print(f"      = auto / {twin} (same system calls) {spread(own)}"
              f"  x  {twin} / {best} {spread(choice)}")
    else:
        print(f"      auto makes {best}'s system calls here: the gap is auto's own work or noise")
PY
echo >&2
echo "== the whole table: $OUT/bench.txt; every run: $OUT/bench.json" >&2
