#!/usr/bin/env bash
# The project's test command: formatting, lints, a short fuzz run of the cmsg decoder, then every
# test (unit, property, real-kernel, CLI end to end, and the tokio feature's tests; the object
# server's test needs curl). Run as root so the network-namespace and
# limit tests run; ZEROTX_STRICT=1 turns any skip into a failure.
set -euo pipefail
cd "$(dirname "$0")/.."

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
  RUSTC_BOOTSTRAP=1 cargo fuzz run cmsg_decode -- -max_total_time="$ZEROTX_FUZZ_SECONDS" 2>&1 | tail -n 3
elif [ "${ZEROTX_STRICT:-0}" = 1 ]; then
  echo "ZEROTX_STRICT=1 and cargo-fuzz is missing (cargo install cargo-fuzz --locked)" >&2
  exit 1
else
  echo "SKIPPED: cargo-fuzz not installed (cargo install cargo-fuzz --locked)"
fi

echo "== cargo test"
cargo test --workspace

# The async sender and the object server (feature tokio): only their own tests, so the rest of
# zerotx's suite is not built and run a second time with the feature on (~20 s).
echo "== cargo test --features tokio (async sender, object server with curl and a load test)"
cargo test -p zerotx --features tokio --test tokio_sender --test tokio_server --test tokio_broken --test tokio_shutdown --test tokio_ring
cargo test -p zerotx --features tokio --doc tokio
