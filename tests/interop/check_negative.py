#!/usr/bin/env python3
"""Negative controls for check.py: each one doctors a copy of a passing run
in one way a broken server (or client) would, and check.py must fail naming
that violation. Exit 0 when every control is caught."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from wire import read_varint, varint  # noqa: E402


def strip_field(b, path):
    """Removes field path[-1] inside the nested messages path[:-1]."""
    out = bytearray()
    i = 0
    while i < len(b):
        start = i
        key, i = read_varint(b, i)
        tag, wt = key >> 3, key & 7
        if wt == 0:
            _, i = read_varint(b, i)
            if len(path) == 1 and tag == path[0]:
                continue
            out += b[start:i]
        elif wt == 2:
            n, j = read_varint(b, i)
            body = b[j:j + n]
            i = j + n
            if len(path) == 1 and tag == path[0]:
                continue
            if len(path) > 1 and tag == path[0]:
                body = strip_field(body, path[1:])
            out += varint(key) + varint(len(body)) + body
        else:
            raise ValueError("unexpected wire type")
    return bytes(out)


def events(work):
    return [json.loads(l) for l in open(os.path.join(work, "events.jsonl"))]


def write_events(work, evs):
    with open(os.path.join(work, "events.jsonl"), "w") as f:
        for e in evs:
            f.write(json.dumps(e) + "\n")


def drop_delivery(work):
    evs = events(work)
    victim = next(e for e in evs if e["kind"] == "recv")
    k = (victim["sub"], victim["p"], victim["seq"])
    write_events(work, [e for e in evs if not (e["kind"] == "recv" and (e["sub"], e["p"], e["seq"]) == k)])


def strip_message_permits(work):
    path = os.path.join(work, "frames.txt")
    lines = open(path).read().splitlines()
    for n, line in enumerate(lines):
        d, boot, conn, plen, hx = line.split()
        if d == "out" and bytes.fromhex(hx)[:2] == bytes([0x08, 9]):
            lines[n] = " ".join([d, boot, conn, plen, strip_field(bytes.fromhex(hx), [9, 6]).hex()])
            break
    open(path, "w").write("\n".join(lines) + "\n")


def unbalance_ledger(work):
    path = os.path.join(work, "permit-ledger.jsonl")
    lines = open(path).read().splitlines()
    e = json.loads(lines[-1])
    e["debited"] += 1
    lines[-1] = json.dumps(e)
    open(path, "w").write("\n".join(lines) + "\n")


def reorder_key(work):
    evs = events(work)
    seen = {}
    for i, e in enumerate(evs):
        if e["kind"] == "recv" and not e["delay"] and not e["redelivery"]:
            k = (e["sub"], e["c"], e["p"], e["key"])
            if k in seen:
                j = seen[k]
                evs[i]["seq"], evs[j]["seq"] = evs[j]["seq"], evs[i]["seq"]
                break
            seen[k] = i
    write_events(work, evs)


def deliver_early(work):
    evs = events(work)
    sent = {(e["p"], e["seq"]): e for e in evs if e["kind"] == "sent"}
    shared = {e["sub"] for e in evs if e["kind"] == "sub" and e["type"] == "ConsumerType.Shared"}
    for e in evs:
        s = sent.get((e.get("p"), e.get("seq")))
        if e["kind"] == "recv" and e["sub"] in shared and s and s["deliver_at"]:
            e["t"] = s["deliver_at"] - 50
            break
    write_events(work, evs)


def redeliver_acked(work):
    evs = events(work)
    # a subscription without nacks or abandoned messages (nothing excuses a
    # redelivery there)
    noisy = {e["sub"] for e in evs if e["kind"] in ("nack", "close_unacked", "abandon")}
    first_kill = min([e["t"] for e in evs if e["kind"] == "kill"] or [float("inf")])
    last_restart = max([e["t"] for e in evs if e["kind"] == "restart"] or [float("-inf")])
    # an ack outside every kill window (kill - 1 s .. restart + 3 s), which
    # nothing excuses
    acked = {(e["sub"], e["c"], e["mid"]) for e in evs
             if e["kind"] == "ack" and e["sub"] not in noisy
             and (e["t"] < first_kill - 1000 or e["t"] > last_restart + 3000)}
    last_t = max(e["t"] for e in evs)
    for e in evs:
        if e["kind"] == "recv" and (e["sub"], e["c"], e["mid"]) in acked:
            dup = dict(e, t=last_t + 1, redelivery=0)
            evs.append(dup)
            break
    else:
        # every ack of a quiet subscription fell inside the kill window (a
        # fast run): after the run, a consumer of that subscription receives
        # a message, acknowledges it, and the message is delivered again
        nacked = {e["mid"] for e in evs if e["kind"] == "nack"}
        recv = next(e for e in evs if e["kind"] == "recv" and e["sub"] not in noisy
                    and e["mid"] not in nacked)
        c = recv["c"] + "-after-run"
        t = max(last_t, last_restart) + 10_000
        evs.append(dict(recv, c=c, t=t, redelivery=0))
        evs.append({"kind": "ack", "sub": recv["sub"], "c": c, "mid": recv["mid"], "t": t + 1})
        evs.append(dict(recv, t=t + 2, redelivery=1))
    write_events(work, evs)


def share_key(work):
    """A Key_Shared message of a held key handed to a second consumer."""
    evs = events(work)
    ks = {e["sub"] for e in evs if e["kind"] == "sub" and e["type"] == "ConsumerType.KeyShared"}
    names = sorted({e["c"] for e in evs if e["kind"] == "sub" and e["sub"] in ks})
    acked_at = {}
    for e in evs:
        if e["kind"] == "ack":
            acked_at.setdefault((e["sub"], e["c"], e["mid"]), e["t"])
    recvs = [e for e in evs if e["kind"] == "recv" and e["sub"] in ks]
    for i, a in enumerate(recvs):
        held_until = acked_at.get((a["sub"], a["c"], a["mid"]), float("inf"))
        for b in recvs[i + 1:]:
            if (b["c"] == a["c"] and (b["p"], b["key"]) == (a["p"], a["key"])
                    and a["t"] < b["t"] < held_until):
                b["c"] = next(n for n in names if n != a["c"])
                write_events(work, evs)
                return


CONTROLS = [
    ("a Key_Shared key held by two consumers", share_key, "still held it"),
    ("a confirmed message never delivered", drop_delivery, "never delivered"),
    ("a MESSAGE without message_permits", strip_message_permits, "lacks message_permits"),
    ("a permit ledger that does not balance", unbalance_ledger, "!= debited"),
    ("per-key order broken", reorder_key, "out of order"),
    ("a delayed message delivered early", deliver_early, "before its time"),
    ("an acknowledged message redelivered", redeliver_acked, "after"),
]


def main(work):
    missed = 0
    for name, doctor, expect in CONTROLS:
        tmp = tempfile.mkdtemp()
        try:
            for f in os.listdir(work):
                if os.path.isfile(os.path.join(work, f)):
                    shutil.copy(os.path.join(work, f), tmp)
            doctor(tmp)
            r = subprocess.run([sys.executable, os.path.join(HERE, "check.py"), tmp],
                               capture_output=True, text=True)
            caught = r.returncode == 1 and any(
                l.startswith("FAIL") and expect in l for l in r.stdout.splitlines())
            print(("caught" if caught else "MISSED"), name)
            missed += not caught
        finally:
            shutil.rmtree(tmp)
    print(f"negative controls: {len(CONTROLS) - missed}/{len(CONTROLS)} caught")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
