#!/usr/bin/env python3
"""zerotx send/recv against iperf3 on TCP loopback, side by side in one run.

Each round runs, one after another (never two at once, 2 cores):
  iperf3 (default mode)         vs  zerotx send -> zerotx recv (generated data, default engine)
  iperf3 -Z (sendfile)          vs  zerotx send --file F -> zerotx recv, F sent again and again
                                    for the same time: with --file-via sendfile from a file of
                                    128 KiB (what iperf3 -Z sends from: its one buffer, a file
                                    whose pages stay in the CPU's cache), with --file-via sendfile
                                    from a large file (--file-mib: every page new to the receiver's
                                    copy), and with --file-via mmap (the default: the engine)
The rounds interleave the tools so drift on a shared machine hits both alike. Reported: the
receiver's bytes per second (what arrived), as median [min-max] over the rounds, the paired ratio
(zerotx over iperf3 within each round, median [min-max]), and the sender's and receiver's CPU
seconds per GB (iperf3: its own cpu_utilization_percent times the duration; zerotx: getrusage of
each process), with the load average before and after the runs.

Only the 128 KiB row is like for like: iperf3 -Z always calls sendfile(2) on its one 128 KiB
buffer file (with -F too: it reads the file into that buffer first), whose pages stay in the CPU's
cache, so the receiver's copy reads cached memory. The large-file rows send every page of a file
once per pass, as a file transfer does: their receivers copy from memory, not the cache, which is
why a large file moves less per second than iperf3 -Z (0.78x in one run, 1.0x in another), with
the same one sendfile(2) per --size bytes (strace -c: no other system call per send).

  scripts/vs-iperf3.py [--time 10] [--rounds 3] [--zerotx target/release/zerotx] [--json FILE]

Needs iperf3 (Debian's package) and a release build of zerotx (cargo build --release -p zerotx-cli).
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def loadavg():
    """The 1, 5 and 15 minute load averages, as /proc/loadavg gives them."""
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port, proc, timeout=10.0):
    """Until something accepts on the port. Checked through /proc/net/tcp{,6}, not by connecting:
    a connection would be taken as the transfer."""
    deadline = time.time() + timeout
    hexport = f"{port:04X}"
    while time.time() < deadline:
        for f in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                for line in open(f).read().splitlines()[1:]:
                    parts = line.split()
                    if parts[1].endswith(":" + hexport) and parts[3] == "0A":
                        return
            except OSError:
                pass
        if proc.poll() is not None:
            raise SystemExit(f"the receiver exited early: {proc.stderr.read()}")
        time.sleep(0.02)
    raise SystemExit(f"nothing listens on {port} after {timeout} s")


def run_pair(server_cmd, client_cmd, port, timeout):
    srv = subprocess.Popen(server_cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_listening(port, srv)
        cli = subprocess.run(client_cmd, capture_output=True, text=True, timeout=timeout)
        if cli.returncode != 0:
            raise SystemExit(f"{' '.join(client_cmd)} failed: {cli.stderr}{cli.stdout[-2000:]}")
        out, err = srv.communicate(timeout=timeout)
        if srv.returncode != 0:
            raise SystemExit(f"{' '.join(server_cmd)} failed: {err}")
        return json.loads(cli.stdout), out
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()


def iperf3(secs, zerocopy):
    port = free_port()
    extra = ["-Z"] if zerocopy else []
    doc, _ = run_pair(
        ["iperf3", "-s", "-1", "-p", str(port)],
        ["iperf3", "-c", "127.0.0.1", "-p", str(port), "-t", str(secs), "--json"] + extra,
        port,
        secs + 30,
    )
    end = doc["end"]
    rx = end["sum_received"]
    sent = end["sum_sent"]["bytes"]
    cpu = end["cpu_utilization_percent"]["host_total"] / 100.0 * end["sum_sent"]["seconds"]
    return {
        "rx_bps": rx["bits_per_second"],
        "cpu_per_gb": cpu / (sent / 1e9),
        "rx_cpu_per_gb": end["cpu_utilization_percent"]["remote_total"]
        / 100.0
        * rx["seconds"]
        / (rx["bytes"] / 1e9),
    }


def zerotx(bin_, secs, file, via=None):
    port = free_port()
    extra = ["--file", file, "--file-via", via] if file else []
    doc, recv_out = run_pair(
        [bin_, "recv", "--listen", f"127.0.0.1:{port}", "--once", "--json"],
        [bin_, "send", f"127.0.0.1:{port}", "--time", str(secs), "--json"] + extra,
        port,
        secs + 30,
    )
    end = doc["end"]
    z = end["zerotx"]
    rdoc = json.loads(recv_out)
    rx = rdoc["end"]["sum_received"]
    return {
        "rx_bps": rx["bits_per_second"],
        "cpu_per_gb": z["cpu_seconds_per_gb"],
        "rx_cpu_per_gb": rdoc["end"]["zerotx"]["cpu_seconds_per_gb"],
        "via": (doc["start"]["zerotx"].get("file_via") or z.get("path")),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--time", type=float, default=10.0, help="seconds per run (iperf3's default: 10)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--zerotx", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "zerotx"))
    ap.add_argument("--file-mib", type=int, default=256,
                    help="size of the file for the --file runs, in the page cache [default: 256; "
                         "iperf3 -Z sends its one 128 KiB buffer from a file, again and again]")
    ap.add_argument("--json", help="also write every run's figures to this file")
    a = ap.parse_args()
    for tool in ("iperf3", a.zerotx):
        if subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True).returncode:
            raise SystemExit(f"{tool} not found (apt install iperf3; cargo build --release -p zerotx-cli)")
    secs = a.time if a.time != int(a.time) else int(a.time)
    load_before = loadavg()
    with tempfile.NamedTemporaryFile(prefix="zerotx-vs-iperf3-", delete=False) as f:
        block = os.urandom(1 << 20)
        for _ in range(a.file_mib):
            f.write(block)
        path = f.name
    # iperf3 -Z's own source: one 128 KiB buffer in a file, sent again and again.
    with tempfile.NamedTemporaryFile(prefix="zerotx-vs-iperf3-128k-", delete=False) as f:
        f.write(os.urandom(128 << 10))
        small = f.name
    runs = {k: [] for k in ("iperf3", "zerotx", "iperf3 -Z", "zerotx --file 128K sendfile",
                            "zerotx --file sendfile", "zerotx --file mmap")}
    try:
        for r in range(a.rounds):
            order = [("iperf3", lambda: iperf3(secs, False)), ("zerotx", lambda: zerotx(a.zerotx, secs, None)),
                     ("iperf3 -Z", lambda: iperf3(secs, True)),
                     ("zerotx --file 128K sendfile", lambda: zerotx(a.zerotx, secs, small, "sendfile")),
                     ("zerotx --file sendfile", lambda: zerotx(a.zerotx, secs, path, "sendfile")),
                     ("zerotx --file mmap", lambda: zerotx(a.zerotx, secs, path, "mmap"))]
            if r % 2:
                order = [order[1], order[0], order[3], order[4], order[5], order[2]]
            for name, fn in order:
                res = fn()
                runs[name].append(res)
                print(f"round {r + 1} {name:28} {res['rx_bps'] / 1e9:6.2f} Gbit/s  sender CPU "
                      f"{res['cpu_per_gb']:.3f} s/GB  receiver CPU {res['rx_cpu_per_gb']:.3f} s/GB",
                      file=sys.stderr)
    finally:
        os.unlink(path)
        os.unlink(small)
    load_after = loadavg()
    med = lambda name, k: statistics.median(x[k] for x in runs[name])

    def spread(values, fmt):
        values = sorted(values)
        return f"{fmt(statistics.median(values))} [{fmt(values[0])}-{fmt(values[-1])}]"

    gbit = lambda name: spread([x["rx_bps"] / 1e9 for x in runs[name]], lambda v: f"{v:.2f}")
    # Paired: round r's zerotx over round r's iperf3 (the rounds interleave the tools).
    ratio = lambda z, i: spread([zx["rx_bps"] / ix["rx_bps"] for zx, ix in zip(runs[z], runs[i])],
                                lambda v: f"{v:.2f}x")
    print(f"\nTCP loopback, {secs} s per run, {a.rounds} rounds (interleaved); Gbit/s and ratios as "
          f"median [min-max]; load average (1, 5, 15 min) {load_before} before, {load_after} after:\n")
    print("| mode | iperf3 Gbit/s | zerotx Gbit/s | zerotx/iperf3, paired | iperf3 sender CPU s/GB | zerotx sender CPU s/GB | iperf3 receiver CPU s/GB | zerotx receiver CPU s/GB |")
    print("|---|---|---|---|---|---|---|---|")
    big = f"{a.file_mib} MiB file"
    for label, i, z in (("default: generated data, both", "iperf3", "zerotx"),
                        ("iperf3 -Z / --file-via sendfile from a 128 KiB file: like for like (one "
                         "cached 128 KiB region, sendfile(2) each)", "iperf3 -Z", "zerotx --file 128K sendfile"),
                        (f"iperf3 -Z (128 KiB, cached) / --file-via sendfile from a {big} (every page "
                         "once per pass): not like for like", "iperf3 -Z", "zerotx --file sendfile"),
                        (f"iperf3 -Z (128 KiB, cached) / --file, the mapped {big} through the engine "
                         "(the default): not like for like", "iperf3 -Z", "zerotx --file mmap")):
        print(f"| {label} | {gbit(i)} | {gbit(z)} | {ratio(z, i)} | {med(i, 'cpu_per_gb'):.3f} | "
              f"{med(z, 'cpu_per_gb'):.3f} | {med(i, 'rx_cpu_per_gb'):.3f} | {med(z, 'rx_cpu_per_gb'):.3f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(runs, f, indent=2)


if __name__ == "__main__":
    main()
