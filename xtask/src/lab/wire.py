#!/usr/bin/python3
"""Wire check of `cargo xtask netns`: every RoCEv2 datagram of a sender-side capture is a
single wire segment (GSO split), carries the expected BTH / DETH / ImmDt fields, and its ICRC
recomputed by scapy matches. Optionally saves a few UDP payloads as fuzz seeds.

Prints `WIRE packets=N icrc_ok=N ...` and exits 1 on the first inconsistency class found.
"""
import argparse
import os
import struct
import sys

from scapy.all import IP, UDP, PcapReader, bind_layers
from scapy.contrib.roce import BTH


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pcap")
    ap.add_argument("--port", type=int, default=4791)
    ap.add_argument("--ranks", type=int, required=True)
    ap.add_argument("--mtu", type=int, default=9000)
    ap.add_argument("--save-seeds", default=None, help="directory for 3 captured payloads")
    a = ap.parse_args()
    # scapy decodes RoCEv2 on 4791 only; a local job's data port is any free one.
    bind_layers(UDP, BTH, dport=a.port)

    n = ok = 0
    bad = {}
    qkeys, srcqps, groups, ids = set(), set(), set(), set()
    seeds = []

    def fail(why, detail):
        bad.setdefault(why, detail)

    for p in PcapReader(a.pcap):
        if IP not in p or UDP not in p or p[UDP].dport != a.port:
            continue
        n += 1
        d = bytes(p[UDP].payload)
        if p[IP].len > a.mtu:
            fail("super_packet", "IP length %d > MTU %d (not GSO-segmented)" % (p[IP].len, a.mtu))
            continue
        if len(d) < 28:
            fail("short", "UDP payload of %d bytes" % len(d))
            continue
        opcode, flags, pkey, _r, dqpn = d[0], d[1], struct.unpack("!H", d[2:4])[0], d[4], d[5:8]
        qkey = struct.unpack("!I", d[12:16])[0]
        srcqp = int.from_bytes(d[17:20], "big")
        if opcode != 0x65:
            fail("opcode", hex(opcode))
        if pkey != 0xFFFF:
            fail("pkey", hex(pkey))
        if dqpn != b"\xff\xff\xff":
            fail("destqp", dqpn.hex())
        if srcqp >= a.ranks:
            fail("srcqp", srcqp)
        qkeys.add(qkey)
        srcqps.add(srcqp)
        groups.add(p[IP].dst)
        ids.add(p[IP].id)
        b = p[BTH]
        want = b.compute_icrc(None)
        if d[-4:] == want:
            ok += 1
        else:
            fail("icrc", "packet %d: carried %s, recomputed %s" % (n, d[-4:].hex(), want.hex()))
        if a.save_seeds and len(seeds) < 3 and (not seeds or len(d) != len(seeds[-1])):
            seeds.append(d)
    if len(qkeys) > 1:
        fail("qkey", "several Q_Keys in one job: %s" % sorted(qkeys))
    if a.save_seeds:
        os.makedirs(a.save_seeds, exist_ok=True)
        for i, s in enumerate(seeds):
            with open(os.path.join(a.save_seeds, "captured-netns-%d" % i), "wb") as f:
                f.write(s)
    print(
        "WIRE packets=%d icrc_ok=%d qkeys=%s srcqps=%s groups=%s distinct_ip_ids=%d bad=%s"
        % (n, ok, ",".join("%#x" % q for q in sorted(qkeys)), ",".join(map(str, sorted(srcqps))),
           ",".join(sorted(groups)), len(ids), ";".join("%s:%s" % kv for kv in bad.items()) or "none"),
        flush=True,
    )
    sys.exit(1 if bad or n == 0 else 0)


if __name__ == "__main__":
    main()
