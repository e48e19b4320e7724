#!/usr/bin/env bash
# Kernel paths this host cannot show: boots Debian's 6.12 cloud kernel under QEMU (TCG) with the
# vsock_loopback and dummy modules, and runs crates/zerotx/examples/vm_guest.rs inside it
# (AF_VSOCK zero-copy over the loopback transport, UDP zero-copy into a dummy device).
# Needs root for apt-get; downloads the kernel package (never installs it on the host).
set -euo pipefail
cd "$(dirname "$0")/.."
work="${ZEROTX_VM_DIR:-$PWD/target/vm}"
mkdir -p "$work"

if ! command -v qemu-system-x86_64 >/dev/null || [ ! -x /bin/busybox ] || ! command -v cpio >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-system-x86 busybox-static cpio xz-utils >/dev/null
fi

if ! ls "$work"/kernel/boot/vmlinuz-* >/dev/null 2>&1; then
  # 6.12.117 (bookworm-security): never double-faulted under TCG (KERNEL.md); the meta package
  # names the versioned one.
  meta=linux-image-6.12-cloud-amd64
  [ -n "$(apt-cache policy "$meta" | awk '/Candidate:/{print $2}' | grep -v none)" ] || apt-get update -qq
  pkg=$(apt-cache depends "$meta" | awk '/Depends: linux-image-6/{print $2; exit}')
  (cd "$work" && rm -f ./*.deb && apt-get download "$pkg" >/dev/null)
  dpkg -x "$work"/"$pkg"_*.deb "$work/kernel"
fi
vmlinuz=$(ls "$work"/kernel/boot/vmlinuz-* | head -n 1)
kver=${vmlinuz##*/vmlinuz-}
mods="$work/kernel/lib/modules/$kver/kernel"

echo "== building the guest program (static)"
RUSTFLAGS="-C target-feature=+crt-static" \
  cargo build -q --release -p zerotx --example vm_guest --target x86_64-unknown-linux-gnu
guest=target/x86_64-unknown-linux-gnu/release/examples/vm_guest

root="$work/initramfs"
rm -rf "$root" && mkdir -p "$root"/{bin,proc,sys,dev,mods}
cp /bin/busybox "$root/bin/busybox"
for m in net/vmw_vsock/vsock net/vmw_vsock/vmw_vsock_virtio_transport_common \
         net/vmw_vsock/vsock_loopback drivers/net/dummy; do
  if [ -f "$mods/$m.ko.xz" ]; then xz -dc "$mods/$m.ko.xz" > "$root/mods/${m##*/}.ko"
  else cp "$mods/$m.ko" "$root/mods/${m##*/}.ko"; fi
done
cp "$guest" "$root/vm_guest"
cat > "$root/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in vsock vmw_vsock_virtio_transport_common vsock_loopback dummy; do
  insmod /mods/$m.ko || echo "VMTEST: FAIL insmod $m"
done
ip link set lo up
ip link add dummyzc type dummy && ip addr add 192.0.2.1/24 dev dummyzc \
  && ip link set dummyzc mtu 65535 up || echo "VMTEST: FAIL dummy device"
/vm_guest
poweroff -f
INIT
chmod +x "$root/init"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) > "$work/initrd.cpio.gz"

echo "== booting $kver under QEMU (TCG)"
timeout 300 qemu-system-x86_64 -accel tcg -cpu max -m 1024 -nographic -no-reboot \
  -kernel "$vmlinuz" -initrd "$work/initrd.cpio.gz" \
  -append "console=ttyS0 panic=-1 quiet" > "$work/console.log" 2>&1 || true
grep "VMTEST" "$work/console.log" | tr -d '\r' || true
passed=$(grep -c "VMTEST: pass" "$work/console.log" || true)
failed=$(grep -c "VMTEST: FAIL" "$work/console.log" || true)
if ! grep -q "VMTEST: ok" "$work/console.log"; then
  [ "$failed" -gt 0 ] || failed=1
  echo "vm: $passed passed, $failed failed"
  echo "console log: $work/console.log" >&2
  exit 1
fi
echo "vm: $passed passed, $failed failed"
