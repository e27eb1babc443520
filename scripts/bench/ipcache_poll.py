#!/usr/bin/env python3
"""Propagation poller for scripts/bench-multinode (a benchmark helper, not a test).

Opens pinned ipcache maps (ebpf/include/weft_maps.h) with the bpf syscall directly (one bpftool
process per lookup costs ~25 ms on the shared VM) and, in a background thread, walks every map
in a loop (BPF_MAP_GET_NEXT_KEY), noting the wall-clock time (CLOCK_REALTIME, like bash's
EPOCHREALTIME) each key is first seen. An entry can reach another node before the CNI ADD that
created it has returned, so the time of appearance is recorded independently of when the
benchmark asks. Protocol: one IPv4 address per line on stdin; for each, once the address is in
every map (or after 10 s), one line: the microsecond wall-clock time it first appeared in each
map (-1 = not seen), then the mean microseconds of one walk over all maps (the resolution).
Usage: ipcache_poll.py PINNED_MAP...
"""
import ctypes
import os
import socket
import struct
import sys
import threading
import time

SYS_BPF = 321  # x86_64
BPF_OBJ_GET = 7
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def bpf(cmd, attr):
    buf = ctypes.create_string_buffer(attr, 128)
    r = libc.syscall(SYS_BPF, cmd, buf, 128)
    if r < 0:
        e = ctypes.get_errno()
        return -e
    return r


def obj_get(path):
    p = ctypes.create_string_buffer(path.encode())
    fd = bpf(BPF_OBJ_GET, struct.pack("=QII", ctypes.addressof(p), 0, 0))
    if fd < 0:
        sys.exit(f"ipcache_poll: cannot open pinned map {path}: {os.strerror(-fd)}")
    return fd


BPF_MAP_GET_NEXT_KEY = 4
KEY_SIZE = 24


def walk(fd, first_seen, now_us):
    """One pass over a map: every key not seen before gets the time now_us."""
    cur = ctypes.create_string_buffer(KEY_SIZE)
    nxt = ctypes.create_string_buffer(KEY_SIZE)
    prev = 0
    while True:
        attr = struct.pack("=IIQQ", fd, 0, prev, ctypes.addressof(nxt))
        if bpf(BPF_MAP_GET_NEXT_KEY, attr) != 0:
            return
        k = nxt.raw
        if k not in first_seen:
            first_seen[k] = now_us
        ctypes.memmove(cur, nxt, KEY_SIZE)
        prev = ctypes.addressof(cur)


def main():
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        sys.exit("ipcache_poll: x86_64 Linux only (bpf syscall number)")
    fds = [obj_get(p) for p in sys.argv[1:]]
    seen = [dict() for _ in fds]
    stats = {"rounds": 0, "us": 0}

    def poll():
        while True:
            t = time.time_ns() // 1000
            for fd, d in zip(fds, seen):
                walk(fd, d, t)
            stats["rounds"] += 1
            stats["us"] += time.time_ns() // 1000 - t
            time.sleep(0.0001)

    threading.Thread(target=poll, daemon=True).start()
    for line in sys.stdin:
        t0 = time.monotonic_ns()
        # prefixlen = 32 fixed (family + pad) + 32, family 4, pad, addr[16]
        key = struct.pack("=IB3x", 64, 4) + socket.inet_aton(line.strip()) + bytes(12)
        while any(key not in d for d in seen) and time.monotonic_ns() - t0 < 10_000_000_000:
            time.sleep(0.0002)
        got = [str(d.get(key, -1)) for d in seen]
        print(" ".join(got), stats["us"] // max(stats["rounds"], 1), flush=True)


main()
