#!/usr/bin/env python3
"""The first packet whose verdict changed (bench-policy's one-rule change).

  verdict_probe.py recv PORT TIMEOUT_S   in the server's netns: binds UDP PORT, prints `ready`,
      then the send time (CLOCK_REALTIME, µs) carried by the first datagram that arrives, and
      exits; exit 3 and `timeout` when none arrives in TIMEOUT_S.
  verdict_probe.py send IP PORT INTERVAL_US   in the client's netns: sends a datagram carrying
      its own send time (µs) every INTERVAL_US until killed; prints `sending` after the first.

While the policy denies the flow every datagram is dropped; the first one the receiver gets was
sent at or after the moment the new verdict was in force, so its send time minus the start of
the user's command is the change's wall time, to within one interval. The clock is the one
bash's EPOCHREALTIME reads.
"""

import socket
import sys
import time


def recv(port, timeout):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", port))
    s.settimeout(timeout)
    print("ready", flush=True)
    try:
        data, _ = s.recvfrom(64)
    except socket.timeout:
        print("timeout", flush=True)
        return 3
    print(data.decode().strip(), flush=True)
    return 0


def send(ip, port, interval_us):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect((ip, port))
    pause = interval_us / 1e6
    first = True
    while True:
        try:
            s.send(str(time.time_ns() // 1000).encode())
        except OSError:
            pass  # an ICMP error from an earlier datagram; the flow goes on
        if first:
            print("sending", flush=True)
            first = False
        time.sleep(pause)


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "recv":
        return recv(int(sys.argv[2]), float(sys.argv[3]))
    if len(sys.argv) == 5 and sys.argv[1] == "send":
        return send(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
