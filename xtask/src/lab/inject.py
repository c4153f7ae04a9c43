#!/usr/bin/python3
"""Hostile sender of `cargo xtask netns`: injects malformed and foreign RoCEv2 datagrams into a
ringcast job's multicast group, built from a legitimate datagram captured on the wire.

Prints one line per kind: `SENT kind=<k> count=<n>`. Run inside the hostile namespace.
"""
import argparse
import struct
import sys
import time

from scapy.all import IP, UDP, Ether, Raw, get_if_hwaddr, rdpcap, sendp
from scapy.contrib.roce import BTH


def mac_of(group):
    o = [int(x) for x in group.split(".")]
    return "01:00:5e:%02x:%02x:%02x" % (o[1] & 0x7F, o[2], o[3])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--template", required=True, help="pcap holding a legitimate datagram")
    ap.add_argument("--port", type=int, default=4791)
    ap.add_argument("--iface", default="eth0")
    ap.add_argument("--tag", type=int, required=True, help="op tag of the operation held open")
    ap.add_argument("--src-qp", type=int, required=True, help="rank whose block is held open")
    ap.add_argument("--chunk-bits", type=int, default=20)
    ap.add_argument("--count", type=int, default=10)
    ap.add_argument("--other-group", default="239.255.77.77")
    a = ap.parse_args()

    tmpl = None
    for p in rdpcap(a.template):
        if UDP in p and p[UDP].dport == a.port and len(bytes(p[UDP].payload)) > 28:
            tmpl = p
            break
    if tmpl is None:
        sys.exit("no datagram to port %d in %s" % (a.port, a.template))
    group = tmpl[IP].dst
    d = bytes(tmpl[UDP].payload)
    hdr, icrc = bytearray(d[:24]), d[-4:]
    pad = (d[1] >> 4) & 3
    payload = d[24 : len(d) - 4 - pad]
    op_bits = 32 - a.chunk_bits
    mask_tag = (1 << op_bits) - 1

    def with_(h=None, opcode=None, pkey=None, qkey=None, src_qp=None, imm=None):
        h = bytearray(h or hdr)
        if opcode is not None:
            h[0] = opcode
        if pkey is not None:
            h[2:4] = struct.pack("!H", pkey)
        if qkey is not None:
            h[12:16] = struct.pack("!I", qkey)
        if src_qp is not None:
            h[17:20] = struct.pack("!I", src_qp)[1:]
        if imm is not None:
            h[20:24] = struct.pack("!I", imm)
        return bytes(h)

    qkey = struct.unpack("!I", bytes(hdr[12:16]))[0]
    stale_tag = (a.tag - 7) & mask_tag
    oor_imm = (a.tag << a.chunk_bits) | ((1 << a.chunk_bits) - 1)
    big = bytes(6000)
    kinds = [
        # (name, group, UDP payload, udp checksum override)
        ("qkey", group, with_(qkey=qkey ^ 0x0101) + payload + icrc, None),
        ("pkey", group, with_(pkey=0x8001) + payload + icrc, None),
        ("opcode", group, with_(opcode=0x64) + payload + icrc, None),
        ("stale", group, with_(src_qp=a.src_qp, imm=stale_tag << a.chunk_bits) + payload + icrc, None),
        ("out_of_range", group, with_(src_qp=a.src_qp, imm=oor_imm) + payload + icrc, None),
        ("truncated", group, d[:10], None),
        ("oversize", group, with_(h=bytes(hdr[:1]) + bytes([hdr[1] & 0xCF]) + bytes(hdr[2:])) + big + icrc, None),
        # On-the-wire corruption: ICRC and UDP checksum both wrong; the kernel drops it.
        ("bad_icrc", group, d[:-4] + bytes(b ^ 0xFF for b in icrc), 0x1234),
        # Another job's traffic: its own group (never joined here) and, should groups collide,
        # its own Q_Key on ours.
        ("other_group", a.other_group, with_(qkey=(qkey ^ 0x5A5A5A5A) & 0x7FFFFFFF) + payload + icrc, None),
        ("other_job", group, with_(qkey=(qkey ^ 0x5A5A5A5A) & 0x7FFFFFFF) + payload + icrc, None),
    ]
    src = get_if_hwaddr(a.iface)
    for name, dst, body, csum in kinds:
        u = UDP(sport=40000 + len(name), dport=a.port)
        if csum is not None:
            u.chksum = csum
        pkt = Ether(src=src, dst=mac_of(dst)) / IP(dst=dst, ttl=1, id=0, flags="DF") / u / Raw(body)
        if name not in ("truncated", "bad_icrc"):
            # A correct ICRC for this sender and these headers, so that the one fault each kind
            # carries is the only reason to drop it (receivers check the ICRC too).
            icrc_ok = Ether(bytes(pkt))[BTH].compute_icrc(None)
            body = body[:-4] + icrc_ok
            pkt = Ether(src=src, dst=mac_of(dst)) / IP(dst=dst, ttl=1, id=0, flags="DF") / u / Raw(body)
        pkt = Ether(bytes(pkt))  # freeze the checksums
        sendp(pkt, iface=a.iface, count=a.count, inter=0.002, verbose=False)
        print("SENT kind=%s count=%d bytes=%d group=%s" % (name, a.count, len(body), dst), flush=True)
        time.sleep(0.01)


if __name__ == "__main__":
    main()
