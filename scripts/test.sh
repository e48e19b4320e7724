#!/usr/bin/env bash
# The project's test command: formatting, lints, a short fuzz run of the cmsg decoder, then every
# test (unit, property, real-kernel, CLI end to end, and the tokio feature's tests; the object
# server's test needs curl). Run as root so the network-namespace and
# limit tests run; ZEROTX_STRICT=1 turns any skip into a failure.
#
# Strict by default when it runs as root with every tool the tests use: then nothing has a reason
# to skip, and a skip is a failure. Otherwise (or with ZEROTX_STRICT=0) tests skip, and the run
# ends with the list of skipped tests and why (cargo prints a skipped test as `ok`).
set -euo pipefail
cd "$(dirname "$0")/.."
# ip, tc and nft live in /usr/sbin, which a user's PATH may lack.
export PATH="$PATH:/usr/sbin:/sbin"

missing=()
[ "$(id -u)" = 0 ] || missing+=("root (network namespaces, sysctls, limits)")
for tool in ip tc nft ethtool socat nc curl iperf3 cc cargo-fuzz; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
[ -e /usr/include/liburing.h ] || missing+=("liburing-dev (/usr/include/liburing.h)")
if [ -z "${ZEROTX_STRICT:-}" ]; then
  if [ ${#missing[@]} -eq 0 ]; then ZEROTX_STRICT=1; else ZEROTX_STRICT=0; fi
fi
export ZEROTX_STRICT
if [ "$ZEROTX_STRICT" = 1 ]; then
  echo "== strict: a test that cannot run fails (ZEROTX_STRICT=0 lets it skip)"
else
  echo "== not strict: tests that cannot run skip; missing: ${missing[*]:-nothing}"
fi

# Each skip appends a line here (zerotx_testbed::skip); printed when the run ends, even on failure.
ZEROTX_SKIP_LOG="$(mktemp -t zerotx-skips.XXXXXX)"
export ZEROTX_SKIP_LOG
skip_summary() {
  if [ -s "$ZEROTX_SKIP_LOG" ]; then
    echo
    echo "== SKIPPED: $(sort -u "$ZEROTX_SKIP_LOG" | wc -l) tests did not run (shown as ok above):"
    sort -u "$ZEROTX_SKIP_LOG" | sed 's/^/  /'
    echo "  (install what they name, run as root, or see README.md's test section)"
  else
    echo "== no test skipped"
  fi
  rm -f "$ZEROTX_SKIP_LOG"
}
trap skip_summary EXIT

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy -D warnings (every feature, so the tokio module is linted too)"
cargo clippy --workspace --all-targets --all-features -- -D warnings

echo "== cargo doc (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features -q
# The command's own docs: its bin has `doc = false`, since its pages would replace the library's
# in target/doc/zerotx (the same crate name, cargo#6313). Checked in a target directory of their
# own (a check build of the dependencies there: about a minute on a fresh machine, seconds after).
RUSTDOCFLAGS="-D warnings" cargo rustdoc -q -p zerotx-cli --bin zerotx --target-dir target/doc-cli

echo "== fuzz: cmsg decoder (${ZEROTX_FUZZ_SECONDS:=20} s)"
if command -v cargo-fuzz >/dev/null 2>&1; then
  # cargo-fuzz wants nightly flags; RUSTC_BOOTSTRAP lets the stable toolchain accept them.
  # Its last lines on success; on failure (a crash, or a fuzz build that does not compile: the
  # fuzz crate has a lock file of its own) enough of the output to say which.
  fuzz_log="$(mktemp -t zerotx-fuzz.XXXXXX)"
  if RUSTC_BOOTSTRAP=1 cargo fuzz run cmsg_decode -- -max_total_time="$ZEROTX_FUZZ_SECONDS" >"$fuzz_log" 2>&1; then
    tail -n 3 "$fuzz_log"
  else
    grep -m 20 -E '^error|panicked|SUMMARY|crash' "$fuzz_log" || true
    tail -n 20 "$fuzz_log"
    echo "fuzz: cmsg_decode failed (whole output: $fuzz_log)" >&2
    exit 1
  fi
elif [ "${ZEROTX_STRICT:-0}" = 1 ]; then
  echo "ZEROTX_STRICT=1 and cargo-fuzz is missing (cargo install cargo-fuzz --locked)" >&2
  exit 1
else
  echo "SKIPPED: cargo-fuzz not installed (cargo install cargo-fuzz --locked)"
  echo "test.sh: fuzz: cmsg_decode: cargo-fuzz not installed (cargo install cargo-fuzz --locked)" >>"$ZEROTX_SKIP_LOG"
fi

echo "== cargo test"
cargo test --workspace

# The async sender and the object server (feature tokio): only their own tests, so the rest of
# zerotx's suite is not built and run a second time with the feature on (~20 s).
echo "== cargo test --features tokio (async sender, object server with curl and a load test)"
# The object server's tests run its example binary; `--test` targets alone do not build examples.
cargo build -p zerotx --features tokio --example object_server
cargo test -p zerotx --features tokio --test tokio_sender --test tokio_server --test tokio_broken --test tokio_shutdown --test tokio_ring
cargo test -p zerotx --features tokio --doc tokio
# Logs (feature `tracing`: a capturing subscriber sees each decision once) and metrics (feature
# `metrics`: the object server's /metrics, parsed, against the senders' Stats).
echo "== cargo test --features tracing,metrics (log events, /metrics)"
cargo test -p zerotx --features tracing --test observe_logs
cargo test -p zerotx --features tokio,metrics --test observe_metrics
