#!/usr/bin/env python3
"""Servers and probes for scripts/oracle/run.sh: real packets between pods.

  netprobe.py serve ID PORT...        in a pod's netns: TCP and UDP servers on each port, and an
                                      SCTP responder; each answer names ID, protocol and port.
  netprobe.py probe PLAN.json         in a pod's netns: every probe of the plan at once; prints
                                      one JSON result per probe.

SCTP: this kernel has no SCTP stack (CONFIG_IP_SCTP is not set: socket(AF_INET, SOCK_STREAM,
IPPROTO_SCTP) fails with EPROTONOSUPPORT), so SCTP is spoken over raw IP sockets (protocol 132):
the prober sends an INIT chunk (RFC 9260 3.3.2) from its source port, the responder answers an
INIT to one of its ports with an INIT-ACK carrying the initiate tag as verification tag. The
datapath sees real SCTP packets (common header, ports, CRC32c) both ways; the association goes
no further than the handshake's first two packets.

A probe's result: ok (the expected server answered: its reply names it), timeout (no answer),
refused (a reset or ICMP error) or error (a local failure). Probes bind the source port the plan
gives them, so the driver can match a drop event to the probe and reuse a closed connection's
5-tuple on purpose.
"""
import asyncio
import json
import os
import random
import socket
import struct
import sys

IPPROTO_SCTP = 132
INIT, INIT_ACK = 1, 2


def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


CRC32C = _crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = CRC32C[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def sctp_packet(sport, dport, vtag, chunk_type, tag, params=b""):
    """An SCTP packet with one INIT or INIT-ACK chunk; the checksum as Linux writes it."""
    body = struct.pack("!IIHHI", tag, 65535, 1, 1, tag ^ 0x5A5A5A5A) + params
    chunk = struct.pack("!BBH", chunk_type, 0, 4 + len(body)) + body
    chunk += b"\0" * (-len(chunk) % 4)
    pkt = struct.pack("!HHII", sport, dport, vtag, 0) + chunk
    return pkt[:8] + struct.pack("<I", crc32c(pkt)) + pkt[12:]


def parse_sctp(ip_packet):
    """(src_ip, sport, dport, vtag, chunk_type, initiate_tag, params) of an IPv4 SCTP packet."""
    ihl = (ip_packet[0] & 0x0F) * 4
    src = socket.inet_ntoa(ip_packet[12:16])
    pkt = ip_packet[ihl:]
    if len(pkt) < 16 + 4:
        return None
    sport, dport, vtag, _ = struct.unpack("!HHII", pkt[:12])
    ctype, _, clen = struct.unpack("!BBH", pkt[12:16])
    if len(pkt) < 12 + clen or clen < 20:
        return None
    (itag,) = struct.unpack("!I", pkt[16:20])
    return src, sport, dport, vtag, ctype, itag, pkt[32 : 12 + clen]


# ---------------------------------------------------------------- servers


class UdpEcho(asyncio.DatagramProtocol):
    def __init__(self, ident, port):
        self.ident, self.port = ident, port

    def connection_made(self, transport):
        self.transport = transport

    def datagram_received(self, data, addr):
        self.transport.sendto(f"{self.ident} UDP {self.port} ".encode() + data[:64], addr)


async def serve(ident, ports):
    loop = asyncio.get_running_loop()

    def tcp_handler(port):
        async def handle(reader, writer):
            writer.write(f"{ident} TCP {port}\n".encode())
            try:
                await writer.drain()
            finally:
                writer.close()

        return handle

    for port in ports:
        await asyncio.start_server(tcp_handler(port), "0.0.0.0", port, reuse_address=True, backlog=512)
        await loop.create_datagram_endpoint(lambda p=port: UdpEcho(ident, p), local_addr=("0.0.0.0", port))
    raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, IPPROTO_SCTP)
    raw.setblocking(False)

    def on_sctp():
        try:
            data, _ = raw.recvfrom(65535)
        except BlockingIOError:
            return
        p = parse_sctp(data)
        if not p:
            return
        src, sport, dport, _vtag, ctype, itag, _ = p
        if ctype != INIT or dport not in ports:
            return
        cookie = f"{ident} SCTP {dport}".encode()
        param = struct.pack("!HH", 7, 4 + len(cookie)) + cookie  # State Cookie
        reply = sctp_packet(dport, sport, itag, INIT_ACK, random.getrandbits(31) | 1, param)
        raw.sendto(reply, (src, 0))

    loop.add_reader(raw.fileno(), on_sctp)
    print("ready", flush=True)
    await asyncio.Event().wait()


# ---------------------------------------------------------------- probes


async def probe_tcp(p, timeout):
    loop = asyncio.get_running_loop()
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setblocking(False)
    try:
        s.bind(("0.0.0.0", p["sport"]))
        await asyncio.wait_for(loop.sock_connect(s, (p["dst_ip"], p["port"])), timeout)
        data = b""
        while not data.endswith(b"\n"):
            chunk = await asyncio.wait_for(loop.sock_recv(s, 256), timeout)
            if not chunk:
                break
            data += chunk
        return "ok", data.decode(errors="replace").strip()
    except asyncio.TimeoutError:
        return "timeout", ""
    except (ConnectionRefusedError, ConnectionResetError) as e:
        return "refused", str(e)
    except OSError as e:
        return "error", str(e)
    finally:
        s.close()


async def probe_udp(p, timeout):
    loop = asyncio.get_running_loop()
    got = loop.create_future()

    class Client(asyncio.DatagramProtocol):
        def datagram_received(self, data, addr):
            if not got.done():
                got.set_result(("ok", data.decode(errors="replace")))

        def error_received(self, exc):
            if not got.done():
                got.set_result(("refused", str(exc)))

    try:
        transport, _ = await loop.create_datagram_endpoint(
            Client, local_addr=("0.0.0.0", p["sport"]), remote_addr=(p["dst_ip"], p["port"])
        )
    except OSError as e:
        return "error", str(e)
    try:
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            transport.sendto(f"probe {p['key']}".encode())
            done, _ = await asyncio.wait([got], timeout=min(0.4, max(0.0, deadline - loop.time())))
            if done:
                return got.result()
        return "timeout", ""
    finally:
        transport.close()


class SctpProber:
    """One raw socket for every SCTP probe of this process; INIT-ACKs matched by tag."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, IPPROTO_SCTP)
        self.sock.setblocking(False)
        self.waiting = {}
        asyncio.get_running_loop().add_reader(self.sock.fileno(), self.on_packet)

    def on_packet(self):
        try:
            data, _ = self.sock.recvfrom(65535)
        except BlockingIOError:
            return
        p = parse_sctp(data)
        if not p:
            return
        _src, _sport, _dport, vtag, ctype, _itag, params = p
        fut = self.waiting.get(vtag)
        if ctype == INIT_ACK and fut and not fut.done():
            cookie = params[4:].split(b"\0")[0].decode(errors="replace") if len(params) > 4 else ""
            fut.set_result(("ok", cookie))

    async def probe(self, p, timeout):
        loop = asyncio.get_running_loop()
        tag = random.getrandbits(31) | 1
        while tag in self.waiting:
            tag = random.getrandbits(31) | 1
        fut = self.waiting[tag] = loop.create_future()
        try:
            deadline = loop.time() + timeout
            init = sctp_packet(p["sport"], p["port"], 0, INIT, tag)
            while loop.time() < deadline:
                self.sock.sendto(init, (p["dst_ip"], 0))
                done, _ = await asyncio.wait([fut], timeout=min(0.4, max(0.0, deadline - loop.time())))
                if done:
                    return fut.result()
            return "timeout", ""
        except OSError as e:
            return "error", str(e)
        finally:
            del self.waiting[tag]


async def run_plan(plan):
    timeout = plan.get("timeout", 2.5)
    sctp = SctpProber()

    async def one(p):
        if p["protocol"] == "TCP":
            status, reply = await probe_tcp(p, timeout)
        elif p["protocol"] == "UDP":
            status, reply = await probe_udp(p, timeout)
        else:
            status, reply = await sctp.probe(p, timeout)
        expected = f"{p['expect']} {p['protocol']} {p['port']}"
        if status == "ok" and not reply.startswith(expected):
            status, reply = "error", f"answered by {reply!r}, expected {expected!r}"
        return {"key": p["key"], "status": status, "reply": reply}

    return await asyncio.gather(*(one(p) for p in plan["probes"]))


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "serve":
        asyncio.run(serve(sys.argv[2], [int(x) for x in sys.argv[3:]]))
    elif len(sys.argv) == 3 and sys.argv[1] == "probe":
        with open(sys.argv[2]) as f:
            plan = json.load(f)
        json.dump(asyncio.run(run_plan(plan)), sys.stdout)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
