#!/usr/bin/env bash
# Kernel paths this host cannot show: boots Debian 12's cloud kernels under QEMU (TCG) with the
# vsock_loopback and dummy modules, and runs crates/zerotx/examples/vm_guest.rs inside each:
#   6.1  bookworm's default (meta package linux-image-cloud-amd64): vsock without zero-copy,
#        io_uring SEND_ZC without IORING_SEND_ZC_REPORT_USAGE;
#   6.12 bookworm-security (linux-image-6.12-cloud-amd64): vsock zero-copy.
# Both guests run in sequence; the script fails if either fails.
#
# Each guest also has a real NIC driver towards another host's stack: a virtio-net device on a
# tap in a network namespace this script creates (and removes on exit), with the tap's vnet
# header (scatter-gather and checksum offload, as on a real NIC). Only the guest and that
# namespace are on the link (198.18.0.0/24, fd00:7a::/64; no default route on either side).
# vm_host (crates/zerotx/examples/vm_host) receives there and checks every byte (also as a
# reader that stops for seconds), and socat hands streams to sha256sum; nftables drops
# 3% of the data from the guest and 3% of the ACKs to it, so TCP retransmits from lent pages.
# The guest's faults on that path (netem delay, reordering and duplicates through this host's
# tc, link down and up, MTU drop, receiver reset, sender closed with buffers in flight) run
# there too. A second virtio-net (eth1) sits on a second tap
# (198.18.1.0/24) WITHOUT the vnet header, so it offers no scatter-gather or checksum offload
# and the guest's kernel copies every zero-copy send to it: a real device that copies, where
# `auto` must learn to copy. Trains (UDP GSO) go through every fault class of
# crates/zerotx-cli/examples/train_faults.rs on this host and in each guest, and from the guest
# through virtio-net to that example's receiver on the host side, which checks every datagram.
# After each guest a table gives, per engine, the functional counts of that topology: the share
# of buffers that came back zero-copy per protocol, the buffers returned, the TCP retransmits
# the guest saw, and the copying NIC's share. TCG timings are not performance: only counts and
# verdicts are results.
#
# Usage: scripts/vm-test.sh [6.1] [6.12]        (default: both)
#        ZEROTX_VM_SMP=2 scripts/vm-test.sh      (guest vCPUs; default 1: CI machines are small)
#        ZEROTX_VM_APPEND="zerotx_only=integrity_uring-zc+pool_tcp zerotx_repeat=30" \
#          ZEROTX_VM_TIMEOUT=1800 scripts/vm-test.sh 6.12
#                                                (hunting a rare failure: one check, many times)
#        ZEROTX_VM_APPEND=zerotx_only=train scripts/vm-test.sh 6.1
#                                                (only the train checks in the guest: rules, faults,
#                                                 trains through virtio-net)
#
# The newest kernel of each line is found through its meta package, downloaded with
# `apt-get download` (never installed on the host) and extracted to target/vm/<kernel release>/;
# a kernel already there is not downloaded again. Needs root for apt-get.
set -euo pipefail
cd "$(dirname "$0")/.."
work="${ZEROTX_VM_DIR:-$PWD/target/vm}"
mkdir -p "$work"
started=$SECONDS

# line -> meta package naming the newest versioned kernel of that line
declare -A META=([6.1]=linux-image-cloud-amd64 [6.12]=linux-image-6.12-cloud-amd64)
lines=("$@")
[ ${#lines[@]} -gt 0 ] || lines=(6.1 6.12)
for l in "${lines[@]}"; do
  [ -n "${META[$l]:-}" ] || { echo "unknown kernel line $l (expected: ${!META[*]})" >&2; exit 2; }
done

export PATH="$PATH:/usr/sbin:/sbin"   # ip and nft
if ! command -v qemu-system-x86_64 >/dev/null || [ ! -x /bin/busybox ] || ! command -v cpio >/dev/null \
   || ! command -v xz >/dev/null || ! command -v nft >/dev/null || ! command -v socat >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    qemu-system-x86 busybox-static cpio xz-utils nftables socat >/dev/null
fi

# The versioned package a meta package depends on (linux-image-6.1.0-56-cloud-amd64...).
versioned() {
  apt-cache depends "$1" 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}'
}

# Prints the cached kernel directory of line $1, downloading and extracting it if needed.
kernel_dir() {
  local meta=${META[$1]} pkg release dir
  pkg=$(versioned "$meta")
  if [ -z "$pkg" ]; then
    apt-get update -qq >&2 || true
    pkg=$(versioned "$meta")
  fi
  if [ -z "$pkg" ]; then
    # No package lists (offline?): the newest kernel of this line already cached will do.
    dir=$(ls -d "$work"/"$1".[0-9]*-cloud-amd64 2>/dev/null | sort -V | tail -n 1 || true)
    [ -n "$dir" ] || { echo "cannot resolve $meta and nothing cached for $1" >&2; return 1; }
    echo "$dir"; return
  fi
  release=${pkg#linux-image-}
  dir="$work/$release"
  if [ ! -f "$dir/boot/vmlinuz-$release" ]; then
    echo "== downloading $pkg" >&2
    local tmp="$work/download.$1"
    rm -rf "$tmp" "$dir" && mkdir -p "$tmp"
    # As root into a directory the _apt user cannot enter: say so instead of warning about it.
    (cd "$tmp" && apt-get download -q -o APT::Sandbox::User=root "$pkg" >/dev/null)
    dpkg -x "$tmp"/"$pkg"_*.deb "$tmp/x"
    dpkg-deb -f "$tmp"/"$pkg"_*.deb Version > "$tmp/x/package-version"
    mv "$tmp/x" "$dir"   # only a complete extraction counts as cached
    rm -rf "$tmp"
  fi
  echo "$dir"
}

echo "== building the guest program and the host's receiver (static)"
RUSTFLAGS="-C target-feature=+crt-static" \
  cargo build -q --release -p zerotx --example vm_guest --example vm_host --target x86_64-unknown-linux-gnu
guest=target/x86_64-unknown-linux-gnu/release/examples/vm_guest
host_rx=$PWD/target/x86_64-unknown-linux-gnu/release/examples/vm_host
echo "== building the zerotx command (static) for its send/recv checks in the guest"
RUSTFLAGS="-C target-feature=+crt-static" \
  cargo build -q --release -p zerotx-cli --bins --example train_rules --example train_faults \
  --target x86_64-unknown-linux-gnu
cli=target/x86_64-unknown-linux-gnu/release/zerotx
train_rules=target/x86_64-unknown-linux-gnu/release/examples/train_rules
train_faults=$PWD/target/x86_64-unknown-linux-gnu/release/examples/train_faults

# The kernel's UDP GSO train rules (docs/kernel.md, "UDP GSO trains: the kernel's limits,
# measured"), as crates/zerotx-cli/examples/train_rules.rs checks them, per kernel release: the
# segments one call may carry, and the errno of a segment above the MTU. Measured the same on
# 6.1.192, 6.12.117 and 6.18 (6.1's UDP_MAX_SEGMENTS was 64 when it came out: a kernel line
# added here gets its own case if it differs).
train_expect() {
  case "$1" in
    *) echo "--expect-segments 128 --expect-above-mtu EMSGSIZE" ;;
  esac
}
command -v ethtool >/dev/null || {
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ethtool >/dev/null
}
echo "== UDP GSO train rules on this host ($(uname -r))"
t0=$SECONDS
# shellcheck disable=SC2046 # the expectations are separate words
"$train_rules" $(train_expect "$(uname -r)") | tee "$work/train_rules.host" | sed 's/^/  /'
grep -q "VMTEST: FAIL" "$work/train_rules.host" && { echo "train rules on the host: FAIL" >&2; exit 1; }
echo "== train rules on the host: ok ($((SECONDS - t0)) s)"

# Every UDP fault class for trains (crates/zerotx-cli/examples/train_faults.rs: a veth receiver
# checking each datagram, nftables and qdisc drops, refusals, UDP-Lite's EIO, a local
# destination) through every engine; the guests run it too.
echo "== train faults on this host ($(uname -r))"
t0=$SECONDS
"$train_faults" > "$work/train_faults.host" 2> "$work/train_faults.host.err" || true
sed 's/^/  /' "$work/train_faults.host"
if grep -q "VMTEST: FAIL" "$work/train_faults.host" || ! grep -q "VMTEST: pass" "$work/train_faults.host"; then
  echo "train faults on the host: FAIL (stderr: $work/train_faults.host.err)" >&2; exit 1
fi
echo "== train faults on the host: $(grep -c "VMTEST: pass" "$work/train_faults.host") passed ($((SECONDS - t0)) s)"

# The guest's link: a tap in a namespace of our own, the host's receiver in it, drops on both
# directions. Removed on exit, however the script ends.
ns=zxvm$$
tap=zxtap0
tap_copying=zxtap1
host_pid=
socat_pid=
trains_rx_pid=
net_down() {
  local p
  for p in $host_pid $socat_pid $trains_rx_pid; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  ip netns del "$ns" 2>/dev/null || true
}
trap net_down EXIT
net_up() {
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  ip -n "$ns" tuntap add "$tap" mode tap
  ip -n "$ns" link set "$tap" mtu 9000 up
  ip -n "$ns" addr add 198.18.0.1/24 dev "$tap"
  ip -n "$ns" -6 addr add fd00:7a::1/64 dev "$tap" nodad
  ip -n "$ns" tuntap add "$tap_copying" mode tap
  ip -n "$ns" link set "$tap_copying" mtu 9000 up
  ip -n "$ns" addr add 198.18.1.1/24 dev "$tap_copying"
  # The receive buffers the stalled-reader check was written against, pinned in this namespace
  # (tcp_rmem and tcp_wmem are per namespace, but a new one copies the host's): a host with
  # raised values would let the stalled reader's buffer take the whole transfer, so its window
  # would never close. The kernel's defaults. net.core.rmem_max is left alone: the reader's
  # 64 KiB SO_RCVBUF is below its default, and a raised cap does not change it.
  ip netns exec "$ns" sysctl -q -w net.ipv4.tcp_rmem="4096 131072 6291456" \
    net.ipv4.tcp_wmem="4096 16384 4194304" >/dev/null
  # Drops on the host's side of the tap: data from the guest (TCP segments, whole GSO trains as
  # the tap delivers them, and UDP datagrams) and ACKs to it.
  ip netns exec "$ns" nft -f - <<NFT
table inet zxloss {
  chain data {
    type filter hook input priority 0; policy accept;
    iifname "$tap" meta l4proto { tcp, udp } counter
    iifname "$tap" meta l4proto { tcp, udp } numgen random mod 100 < 3 counter drop
  }
  chain acks {
    type filter hook output priority 0; policy accept;
    oifname "$tap" tcp sport { 7000, 7001 } counter
    oifname "$tap" tcp sport { 7000, 7001 } numgen random mod 100 < 3 counter drop
  }
}
NFT
  ip netns exec "$ns" "$host_rx" > "$work/vm_host.log" 2>&1 &
  host_pid=$!
  # A receiver nobody here wrote: each connection's bytes into sha256sum, the hash sent back
  # (after the guest's EOF; -t: time for sha256sum to answer).
  ip netns exec "$ns" socat -t 10 TCP6-LISTEN:7001,ipv6only=0,reuseaddr,fork EXEC:sha256sum \
    > "$work/socat.log" 2>&1 &
  socat_pid=$!
  for _ in $(seq 50); do grep -q listening "$work/vm_host.log" && return; sleep 0.1; done
  echo "vm_host did not start:" >&2; cat "$work/vm_host.log" >&2; return 1
}
# Packets the host's rules counted since the last call: "DATA DATA-DROPPED ACKS ACKS-DROPPED".
drops() {
  ip netns exec "$ns" nft list table inet zxloss | awk '/counter/{for(i=1;i<=NF;i++) if($i=="packets") printf "%s ", $(i+1)}'
  ip netns exec "$ns" nft reset counters table inet zxloss >/dev/null
}

# The guest's functional counts over the tap (virtio-net with offloads, 3% drops each way), per
# engine, from the console log $1: each protocol's zero-copy share (buffers that came back
# zero-copy of those that came back), buffers returned, TCP retransmits; and the copying NIC's
# share where the engine ran there. Counts, not speeds: the guest runs under TCG.
net_table() {
  tr -d '\r' < "$1" | awk '
    function cell(x) { return (x == "" ? "-" : x) }
    function num(s, re,   m) {  # the number before the words matched by re, or ""
      if (!match(s, "[0-9]+ " re)) return ""
      m = substr(s, RSTART, RLENGTH); split(m, w, " "); return w[1]
    }
    /VMTEST: (pass|FAIL) net [^ ]+ (tcp4|tcp6|udp4|udp6)(: | through the copying nic: )/ {
      rest = $0; sub(/.*VMTEST: (pass|FAIL) net /, "", rest)
      split(rest, w, /[ :]/); e = w[1]; p = w[2]
      if (!(e in seen)) { seen[e] = 1; order[++n] = e }
      zc = num(rest, "of [0-9]+ buffers zero-copy"); all = ""
      if (match(rest, "of [0-9]+ buffers zero-copy")) { all = substr(rest, RSTART + 3, RLENGTH - 3); sub(/ .*/, "", all) }
      c = (zc == "" ? "?" : zc "/" all) (rest ~ /does not report copies/ ? "*" : "") \
        ($0 ~ /VMTEST: FAIL/ ? " FAIL" : "")
      if (rest ~ /does not report copies/) blind = 1
      if (rest ~ /through the copying nic/) { copying[e] = c; next }
      share[e, p] = c
      back[e] += num(rest, "buffers back"); retr[e] += num(rest, "retransmits")
    }
    END {
      if (n == 0) { print "  (no network check ran)"; exit }
      printf "  %-14s %-10s %-10s %-10s %-10s %-9s %-11s %s\n", "engine", "tcp4 zc", "tcp6 zc", \
        "udp4 zc", "udp6 zc", "returned", "retransmits", "copying NIC zc"
      for (i = 1; i <= n; i++) {
        e = order[i]
        printf "  %-14s %-10s %-10s %-10s %-10s %-9s %-11s %s\n", e, cell(share[e, "tcp4"]), \
          cell(share[e, "tcp6"]), cell(share[e, "udp4"]), cell(share[e, "udp6"]), back[e], \
          retr[e], (e in copying ? copying[e] : "-")
      }
      if (blind) print "  * this kernel'"'"'s io_uring does not say when it copied: its share is what it claimed"
    }'
}

# Builds the initramfs for the kernel in $1 and boots it; prints the VMTEST lines; fails if the
# guest did not end with `VMTEST: ok`.
run_guest() {
  local dir=$1 vmlinuz kver mods root m f log
  vmlinuz=$(ls "$dir"/boot/vmlinuz-* | head -n 1)
  kver=${vmlinuz##*/vmlinuz-}
  mods="$dir/lib/modules/$kver/kernel"
  root="$dir/initramfs"
  rm -rf "$root" && mkdir -p "$root"/{bin,proc,sys,dev,mods,tmp}
  cp /bin/busybox "$root/bin/busybox"
  # No modules.dep in the .deb: insmod in dependency order. 6.1 ships .ko, 6.12 .ko.xz.
  for m in net/vmw_vsock/vsock net/vmw_vsock/vmw_vsock_virtio_transport_common \
           net/vmw_vsock/vsock_loopback drivers/net/dummy net/sched/sch_netem net/sched/sch_tbf \
           drivers/net/veth lib/libcrc32c net/netfilter/nfnetlink net/netfilter/nf_tables \
           net/netfilter/nft_numgen; do
    f="$root/mods/${m##*/}.ko"
    if [ -f "$mods/$m.ko" ]; then cp "$mods/$m.ko" "$f"
    elif [ -f "$mods/$m.ko.xz" ]; then xz -dc "$mods/$m.ko.xz" > "$f"
    elif [ -f "$mods/$m.ko.zst" ] && command -v zstd >/dev/null; then zstd -qdc "$mods/$m.ko.zst" > "$f"
    else echo "module $m missing from $kver ($mods)" >&2; return 1
    fi
  done
  # The NIC's driver and what it needs, in dependency order (6.12 has virtio and virtio_pci built
  # in: only the modules a kernel ships are copied and listed).
  : > "$root/mods/net"
  for m in drivers/virtio/virtio_ring drivers/virtio/virtio drivers/virtio/virtio_pci_legacy_dev \
           drivers/virtio/virtio_pci_modern_dev drivers/virtio/virtio_pci net/core/failover \
           drivers/net/net_failover drivers/net/virtio_net; do
    f="$root/mods/${m##*/}.ko"
    if [ -f "$mods/$m.ko" ]; then cp "$mods/$m.ko" "$f"
    elif [ -f "$mods/$m.ko.xz" ]; then xz -dc "$mods/$m.ko.xz" > "$f"
    elif [ -f "$mods/$m.ko.zst" ] && command -v zstd >/dev/null; then zstd -qdc "$mods/$m.ko.zst" > "$f"
    elif [ "${m#drivers/virtio/}" != "$m" ]; then continue   # built into this kernel
    else echo "module $m missing from $kver ($mods)" >&2; return 1
    fi
    echo "${m##*/}" >> "$root/mods/net"
  done
  cp "$guest" "$root/vm_guest"
  # This host's tools (Debian 12's) with the libraries they load, at the same paths, in
  # /usr/sbin: tc for netem and tbf (busybox's own tc has neither), nft for the train faults'
  # drops, ip (iproute2: veth pairs moved between namespaces) for the train faults, ethtool
  # (software segmentation) for the train rules.
  local t lib path
  mkdir -p "$root/usr/sbin"
  for t in tc nft ip ethtool; do
    path=$(command -v "$t") || { echo "$t missing on the host" >&2; return 1; }
    cp "$path" "$root/usr/sbin/$t"
    for lib in $(ldd "$path" | grep -o '/[^ ]*'); do
      mkdir -p "$root$(dirname "$lib")" && cp -L "$lib" "$root$lib"
    done
  done
  strip -o "$root/zerotx" "$cli" 2>/dev/null || cp "$cli" "$root/zerotx"
  # The train rules' probe and what it expects of this kernel; the train faults.
  strip -o "$root/train_rules" "$train_rules" 2>/dev/null || cp "$train_rules" "$root/train_rules"
  train_expect "$kver" > "$root/train_expect"
  strip -o "$root/train_faults" "$train_faults" 2>/dev/null || cp "$train_faults" "$root/train_faults"
  cat > "$root/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in vsock vmw_vsock_virtio_transport_common vsock_loopback dummy sch_netem sch_tbf veth \
         libcrc32c nfnetlink nf_tables nft_numgen; do
  insmod /mods/$m.ko || echo "VMTEST: FAIL insmod $m"
done
ip link set lo up
# The NIC on the host's tap (see net_up): no default route, only the link's own subnets.
for m in $(cat /mods/net); do insmod /mods/$m.ko || echo "VMTEST: FAIL insmod $m"; done
echo 0 > /proc/sys/net/ipv6/conf/eth0/accept_dad   # the address is usable at once
ip link set eth0 mtu 9000 up && ip addr add 198.18.0.2/24 dev eth0 \
  && ip -6 addr add fd00:7a::2/64 dev eth0 || echo "VMTEST: FAIL guest NIC eth0"
# The second NIC, on a tap without vnet header: a device that copies (see the script's head).
ip link set eth1 mtu 9000 up && ip addr add 198.18.1.2/24 dev eth1 || echo "VMTEST: FAIL guest NIC eth1"
ip link add dummyzc type dummy && ip addr add 192.0.2.1/24 dev dummyzc \
  && ip link set dummyzc mtu 65535 up || echo "VMTEST: FAIL dummy device"
# zerotx send/recv over vsock_loopback (CID 1) and into the dummy device: the CLI end to end on
# kernels the host does not run. Each check prints its own pass or FAIL line.
cli() {  # name, receiver command or -, sender command
  name=$1; shift; rx=$1; shift
  # Each side has its own deadline: a hang is a failed check, not a stuck guest.
  if [ "$rx" != - ]; then timeout -s KILL 90 sh -c "$rx" > /tmp/rx.out 2>&1 & rpid=$!; fi
  ok=0
  for i in 1 2 3 4 5 6 7 8 9 10; do
    if timeout -s KILL 60 sh -c "$*" > /tmp/tx.out 2>&1; then ok=1; break; fi
    grep -q "nothing listens" /tmp/tx.out || break   # only a receiver not yet listening is retried
    sleep 1
  done
  if [ "$rx" != - ]; then wait $rpid || ok=0; fi
  if [ $ok = 1 ]; then echo "VMTEST: pass cli $name"
  else echo "VMTEST: FAIL cli $name"; tail -n 5 /tmp/tx.out /tmp/rx.out 2>/dev/null; fi
}
# The kernel's UDP GSO train rules, into dummy devices of the probe's own (see train_expect).
t0=$(date +%s)
{ /train_rules $(cat /train_expect) 2>&1 || echo "VMTEST: FAIL train rules probe exited $?"; } \
  | sed 's/^train-rules:/VMTEST: measure train-rules:/'
echo "VMTEST: measure train-rules: $(( $(date +%s) - t0 )) s under TCG"
# Every UDP fault class for trains through every engine (iproute2's ip first in PATH: busybox's
# cannot move a veth between namespaces), then trains through virtio-net to the host's receiver
# (see run_guest), each engine's zero-copy share. zerotx_only=train runs only the train checks.
case "${zerotx_only:-train}" in *train*)
  t0=$(date +%s)
  PATH=/usr/sbin:$PATH /train_faults 2>/tmp/tf.err || { echo "VMTEST: FAIL train-faults exited $?"; tail -n 5 /tmp/tf.err; }
  echo "VMTEST: measure train-faults: $(( $(date +%s) - t0 )) s under TCG"
  /train_faults --to 198.18.0.1:7300 2>/tmp/tf.err || { echo "VMTEST: FAIL train-faults net exited $?"; tail -n 5 /tmp/tf.err; }
esac
if [ -z "${zerotx_only:-}" ]; then  # zerotx_only: see vm_guest's main.rs
cli "vsock generated --verify" "/zerotx recv -l vsock:5401 --once --verify -i 0" \
  "/zerotx send vsock:1:5401 --bytes 16M -i 0"
head -c 5000003 /dev/urandom > /tmp/f
for via in mmap sendfile; do
  rm -f /tmp/g
  cli "vsock --file --file-via $via" "/zerotx recv -l vsock:5402 --once -o /tmp/g -i 0" \
    "/zerotx send vsock:1:5402 --file /tmp/f --file-via $via -i 0"
  cmp /tmp/f /tmp/g && echo "VMTEST: pass cli vsock file intact ($via)" \
    || echo "VMTEST: FAIL cli vsock file intact ($via)"
  grep -E "^(sendfile|file):" /tmp/tx.out | sed "s/^/VMTEST: measure vsock --file-via $via: /"
done
cli "udp into dummy, zero-copy" - \
  "/zerotx send --udp 192.0.2.2:9 --bytes 16M --size 60000 --json | grep -q '\"zerocopy_engaged\": true'"
fi
/vm_guest
poweroff -f
INIT
  chmod +x "$root/init"
  (cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) > "$dir/initrd.cpio.gz"
  rm -rf "$root"

  log="$dir/console.log"
  echo "== booting $kver ($(cat "$dir/package-version" 2>/dev/null || echo '?')) under QEMU (TCG)"
  local t0=$SECONDS
  # The receiver of the guest's trains through virtio-net (train_faults --to): it checks every
  # datagram that arrives (the drops above take some) and ends when the guest says it is done.
  ip netns exec "$ns" "$train_faults" --receive 198.18.0.1:7300 > "$work/train_faults_rx.log" 2>&1 &
  trains_rx_pid=$!
  # The guest's own watchdogs end every check; this only catches a guest that never powers off.
  # Its only NIC is the virtio-net on the namespace's tap (QEMU runs in the namespace to open it);
  # romfile= : no boot ROM (the kernel boots directly, and Debian's QEMU lacks it without
  # recommends); vnet_hdr=on fails loudly where the tap cannot offer offloads.
  ip netns exec "$ns" timeout "${ZEROTX_VM_TIMEOUT:-360}" qemu-system-x86_64 -accel tcg -cpu max \
    -smp "${ZEROTX_VM_SMP:-1}" -m 1024 -nographic -no-reboot \
    -device virtio-net-pci,netdev=n0,mac=52:54:00:7a:00:02,romfile= \
    -netdev tap,id=n0,ifname="$tap",script=no,downscript=no,vnet_hdr=on \
    -device virtio-net-pci,netdev=n1,mac=52:54:00:7a:01:02,romfile= \
    -netdev tap,id=n1,ifname="$tap_copying",script=no,downscript=no,vnet_hdr=off \
    -kernel "$vmlinuz" -initrd "$dir/initrd.cpio.gz" \
    -append "console=ttyS0 panic=-1 quiet ${ZEROTX_VM_APPEND:-}" > "$log" 2>&1 || true
  # The receiver's verdicts join the guest's (it ends by itself once trains came; else it is not
  # waited for).
  local waited=0
  if grep -q "train-faults net" "$log"; then
    while kill -0 "$trains_rx_pid" 2>/dev/null && [ $waited -lt 30 ]; do sleep 1; waited=$((waited + 1)); done
  fi
  kill "$trains_rx_pid" 2>/dev/null || true
  wait "$trains_rx_pid" 2>/dev/null || true
  trains_rx_pid=
  grep "VMTEST: " "$work/train_faults_rx.log" | sed 's/VMTEST: \([a-zA-Z]*\) /VMTEST: \1 host: /' >> "$log" || true
  grep -ao "VMTEST: .*" "$log" | tr -d '\r' || true   # without the firmware's escape codes
  local d
  read -r -a d <<< "$(drops)"
  echo "== host side of the tap: ${d[1]:-?} of ${d[0]:-?} packets from the guest dropped," \
    "${d[3]:-?} of ${d[2]:-?} ACKs to it dropped (GSO trains count once)"
  echo "== $kver: the guest topology's functional counts per engine (zero-copy buffers of those"
  echo "   returned, through virtio-net on the tap; TCG timings are not performance, counts are):"
  net_table "$log"
  local passed failed
  passed=$(grep -c "VMTEST: pass" "$log" || true)
  failed=$(grep -c "VMTEST: FAIL" "$log" || true)
  if ! grep -q "VMTEST: ok" "$log" || [ "$failed" -gt 0 ]; then
    [ "$failed" -gt 0 ] || failed=1
    echo "vm $kver: $passed passed, $failed failed ($((SECONDS - t0)) s; console log: $log)"
    tail -n 20 "$work/vm_host.log" | sed 's/^/host: /'
    return 1
  fi
  echo "vm $kver: $passed passed, $failed failed ($((SECONDS - t0)) s)"
}

net_up
status=0
summary=()
for l in "${lines[@]}"; do
  if ! dir=$(kernel_dir "$l"); then
    summary+=("$l: FAIL (no kernel)"); status=1; continue
  fi
  if run_guest "$dir"; then summary+=("${dir##*/}: ok")
  else summary+=("${dir##*/}: FAIL"); status=1
  fi
done
echo "== vm-test: ${summary[*]} ($((SECONDS - started)) s under TCG: functional results, not performance)"
exit $status
