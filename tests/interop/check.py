#!/usr/bin/env python3
"""Checks an interop run (scenario.py WORKDIR): no confirmed message lost,
per-key order within each consumer incarnation, delayed messages not before
their time, only allowed redeliveries, the broker's permit ledger balanced
per consumer incarnation, and from the recorded frames: every MESSAGE carries
message_permits (field 6), its sum and the Flow sum match the ledger, and the
real client accepted every message (no ack with a validation_error, no
connection closed with an error).

Exit 0 when every check holds; prints one FAIL line per violation (capped)
and a counts table (markdown), also written to WORKDIR/table.md.
"""
import json
import os
import re
import sys
from collections import defaultdict

MAX_BATCH = 8  # scenario.py: batching_max_messages


def varint(b, i):
    v = s = 0
    while True:
        if i >= len(b):
            raise ValueError("truncated varint")
        x = b[i]
        i += 1
        v |= (x & 0x7F) << s
        s += 7
        if not x & 0x80:
            return v, i


def fields(b):
    """protobuf fields -> {tag: [values]} (varint ints, bytes for length-delimited)."""
    out = defaultdict(list)
    i = 0
    while i < len(b):
        key, i = varint(b, i)
        tag, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(b, i)
        elif wt == 2:
            n, i = varint(b, i)
            v = b[i:i + n]
            i += n
        elif wt == 1:
            v = b[i:i + 8]
            i += 8
        elif wt == 5:
            v = b[i:i + 4]
            i += 4
        else:
            raise ValueError(f"wire type {wt}")
        out[tag].append(v)
    return out


def parse_mid3(s):
    m = re.match(r"\((\d+),(\d+),(-?\d+),(-?\d+)\)", s)
    return (int(m.group(1)), int(m.group(2)), int(m.group(4))) if m else None


def parse_mid(s):
    m = re.match(r"\((\d+),(\d+),(-?\d+),(-?\d+)\)", s)
    return (int(m.group(1)), int(m.group(2))) if m else None


def main(workdir):
    fails = []

    def fail(msg):
        fails.append(msg)

    events = [json.loads(l) for l in open(os.path.join(workdir, "events.jsonl"))]
    kills = [e["t"] for e in events if e["kind"] == "kill"]
    restarts = [e["t"] for e in events if e["kind"] == "restart"]
    sent = {(e["p"], e["seq"]): e for e in events if e["kind"] == "sent"}
    confirmed = {k for k, e in sent.items() if e["ok"]}
    unconfirmed = {k for k, e in sent.items() if not e["ok"]}
    subs = sorted({e["sub"] for e in events if e["kind"] == "recv"})
    if not confirmed:
        fail("no message was confirmed by the server")

    def segment(t):
        return sum(1 for k in kills if k < t)

    # --- per subscription: loss, order, delay, redelivery ---
    table = {}
    for sub in subs:
        recvs = [e for e in events if e.get("sub") == sub and e["kind"] == "recv"]
        acks = [e for e in events if e.get("sub") == sub and e["kind"] == "ack"]
        nacks = {(e["c"], e["mid"]) for e in events if e.get("sub") == sub and e["kind"] == "nack"}
        taint_t = defaultdict(list)  # entry -> times a message of it was nacked / abandoned
        for e in events:
            if e.get("sub") == sub and e["kind"] == "nack":
                taint_t[parse_mid(e["mid"])].append(e["t"])
            if e.get("sub") == sub and e["kind"] in ("close_unacked", "abandon"):
                for m in e["mids"]:
                    taint_t[parse_mid(m)].append(e["t"])
        closed_unacked = set()
        resub_t = defaultdict(list)
        abandon_t = defaultdict(list)
        for e in events:
            if e.get("sub") == sub and e["kind"] == "abandon":
                abandon_t[e["c"]].append(e["t"])
            if e.get("sub") == sub and e["kind"] in ("close_unacked", "abandon"):
                for m in e["mids"]:
                    closed_unacked.add((e["c"], m))
                # a new incarnation (close + subscribe) or a new consumer
                # epoch (redeliver everything) starts a new order segment
                resub_t[e["c"]].append(e["t"])
        # Without batch-index acks a redelivered entry brings back every
        # message of its batch, also the acknowledged ones (Pulsar's
        # behaviour): an entry with a nacked or abandoned message is tainted.
        tainted = {parse_mid(m) for (_, m) in nacks | closed_unacked}
        ack_t = {}
        for e in acks:
            ack_t.setdefault((e["c"], e["mid"]), e["t"])
        # A cumulative ack acknowledges every message up to its id.
        # Without batch-index acks, a cumulative ack on a message inside a
        # batch reaches the broker as an ack of the entry before (the batch
        # stays unacknowledged until its last message is covered).
        batch_len = defaultdict(int)
        for r in recvs:
            l, e, b = parse_mid3(r["mid"])
            batch_len[(l, e)] = max(batch_len[(l, e)], b + 1)
        cums = []
        for e in events:
            if e.get("sub") == sub and e["kind"] == "ack_cum":
                l, en, b = parse_mid3(e["mid"])
                if 0 <= b < batch_len[(l, en)] - 1:
                    l, en, b = l, en - 1, 1 << 30
                cums.append((e["t"], (l, en, b)))
        for r in recvs:
            pos = parse_mid3(r["mid"])
            ts = [t for t, c in cums if c >= pos and t >= r["t"]]
            if ts:
                ack_t.setdefault((r["c"], r["mid"]), min(ts))
        delay_applies = any(e["kind"] == "sub" and e["sub"] == sub and
                            e["type"] in ("ConsumerType.Shared", "ConsumerType.KeyShared")
                            for e in events)
        got = defaultdict(list)
        for r in recvs:
            got[(r["p"], r["seq"])].append(r)
        lost = sorted(confirmed - set(got))
        for k in lost[:10]:
            fail(f"{sub}: confirmed message p{k[0]} seq {k[1]} never delivered")
        unknown = [k for k in got if k not in sent]
        for k in unknown[:10]:
            fail(f"{sub}: delivered a message that was never sent: {k}")
        acked_msgs = {(r["p"], r["seq"]) for r in recvs if (r["c"], r["mid"]) in ack_t}
        not_acked = sorted(confirmed - acked_msgs)
        for k in not_acked[:10]:
            fail(f"{sub}: confirmed message p{k[0]} seq {k[1]} delivered but never acknowledged by the end")
        # delayed
        early = 0
        delayed = 0
        for r in recvs:
            s = sent.get((r["p"], r["seq"]))
            if s and s["deliver_at"] and delay_applies:
                delayed += 1
                if r["t"] < s["deliver_at"]:
                    early += 1
                    fail(f"{sub}: delayed p{r['p']} seq {r['seq']} received at {r['t']} before its time {s['deliver_at']}")
        # redeliveries
        redelivered = allowed = 0
        for k, rs in got.items():
            for prev, cur in zip(rs, rs[1:]):
                redelivered += 1
                pk = (prev["c"], prev["mid"])
                at = ack_t.get(pk)
                bia = prev.get("bia", False)
                ok = (pk in nacks or pk in closed_unacked or at is None or at > cur["t"]
                      # batch-index acks: an ack the client made 300 ms or more
                      # before the nack (grouped acks flush every 100 ms, the
                      # nack's redelivery request goes out 200 ms after it)
                      # reached the broker first and must be honoured.
                      or (not bia and parse_mid(prev["mid"]) in tainted)
                      or (bia and any(at > tn - 300 and tn < cur["t"]
                                      for tn in taint_t[parse_mid(prev["mid"])]))
                      # acks in flight at a kill -9, or made while the server
                      # was down (until the client reconnected: restart + 3 s),
                      # are lost with the connection
                      or any(kt - 1000 <= at <= rt + 3000 and kt < cur["t"]
                             for kt, rt in zip(kills, restarts))
                      # a redeliver-everything (abandon) by the same consumer
                      # before the redelivery, the first copy received before
                      # it or in flight when it went out (up to 1 s after: the
                      # C++ client 3.13 sends no consumer_epoch, so in-flight
                      # copies are not told apart, as with Pulsar), and the ack
                      # made after it or inside the client's 100 ms ack group
                      # before it: the broker redelivers what it had not seen
                      # acknowledged
                      or any(prev["t"] <= ab + 1000 and ab <= cur["t"] and at >= ab - 300
                             for ab in abandon_t[prev["c"]]))
                if ok:
                    allowed += 1
                else:
                    fail(f"{sub}: p{k[0]} seq {k[1]} redelivered to {cur['c']} at {cur['t']} after {prev['c']} acked it at {at} (no kill in between)")
        # order: first deliveries, not delayed, per consumer incarnation and key
        last = {}
        disorder = 0
        first_seen = set()
        for r in sorted(recvs, key=lambda r: r["t"]):
            k = (r["p"], r["seq"])
            first = k not in first_seen
            first_seen.add(k)
            if not first or (r["delay"] and delay_applies) or r["redelivery"]:
                continue
            inc = (r["c"], segment(r["t"]), sum(1 for t in resub_t[r["c"]] if t < r["t"]))
            lk = (inc, r["p"], r["key"])
            if lk in last and last[lk] > r["seq"]:
                disorder += 1
                fail(f"{sub}: key {r['key']} out of order at {r['c']}: seq {r['seq']} after {last[lk]}")
            last[lk] = max(last.get(lk, -1), r["seq"])
        # Key_Shared: a key is held by one consumer at a time. A consumer
        # holds a message from its receipt until it acks, nacks or abandons
        # it; another consumer must not receive that key meanwhile (a kill
        # resets the broker's view, so holdings do not span one).
        key_overlap = 0
        if any(e["kind"] == "sub" and e["sub"] == sub and e["type"] == "ConsumerType.KeyShared"
               for e in events):
            ends = {}
            for e in events:
                if e.get("sub") == sub and e["kind"] in ("ack", "nack"):
                    ends.setdefault((e["c"], e["mid"]), []).append(e["t"])
                if e.get("sub") == sub and e["kind"] in ("close_unacked", "abandon"):
                    for m in e["mids"]:
                        ends.setdefault((e["c"], m), []).append(e["t"])
            holds = defaultdict(list)  # (p, key) -> [(consumer, start, end)]
            for r in recvs:
                later = [t for t in ends.get((r["c"], r["mid"]), []) if t >= r["t"]]
                end = min(later) if later else float("inf")
                nxt = [k for k in kills if k > r["t"]]
                if nxt:
                    end = min(end, nxt[0])
                holds[(r["p"], r["key"])].append((r["c"], r["t"], end))
            for k, hs in holds.items():
                for c, t, _ in hs:
                    other = [(c2, t2, e2) for c2, t2, e2 in hs if c2 != c and t2 < t < e2]
                    if other:
                        key_overlap += 1
                        if key_overlap <= 5:
                            fail(f"{sub}: key {k[1]} received by {c} at {t} while {other[0][0]} still held it (since {other[0][1]})")
        table[sub] = dict(confirmed=len(confirmed), delivered=len(recvs), distinct=len(got),
                          lost=len(lost), redelivered=redelivered, allowed=allowed,
                          delayed=delayed, early=early, disorder=disorder, acks=len(acks) + len(cums),
                          nacks=len(nacks), key_overlap=key_overlap)

    # --- frames ---
    frames_path = os.path.join(workdir, "frames.txt")
    msg_frames = msg_with_p = 0
    p_sum = defaultdict(int)
    p_cmds = defaultdict(int)
    flow_sum = defaultdict(int)
    sub_of = {}
    sub_req = {}  # (boot, conn, request_id) of a SUBSCRIBE -> its consumer key
    refused = set()  # SUBSCRIBEs answered with ERROR (no incarnation)
    sent_ids = defaultdict(set)
    validation_errors = 0
    undecodable_in = 0
    for line in open(frames_path):
        d, boot, conn, plen, hx = line.split()
        try:
            f = fields(bytes.fromhex(hx))
        except ValueError as e:
            # The garbage-protobuf probe's command does not decode (the
            # server closes that connection); every server frame must.
            if d == "out":
                fail(f"a server frame does not decode ({e}): {line.strip()}")
            else:
                undecodable_in += 1
            continue
        ty = f[1][0]
        key = (int(boot), int(conn))
        if d == "out" and ty == 9:
            msg_frames += 1
            m = fields(f[9][0])
            cid = m[1][0]
            mid = fields(m[2][0])
            if 6 in m:
                msg_with_p += 1
                if m[6][0] < 1:
                    fail(f"MESSAGE with message_permits {m[6][0]}")
                p_sum[key + (cid,)] += m[6][0]
            else:
                fail(f"MESSAGE to {key} consumer {cid} lacks message_permits (field 6)")
            p_cmds[key + (cid,)] += 1
            s = sub_of.get(key + (cid,))
            if s:
                sent_ids[s].add((mid[1][0], mid[2][0]))
        elif d == "in" and ty == 11:
            m = fields(f[11][0])
            flow_sum[key + (m[1][0],)] += m[2][0]
        elif d == "in" and ty == 4:
            m = fields(f[4][0])
            sub_of[key + (m[4][0],)] = m[2][0].decode()
            sub_req[key + (m[5][0],)] = key + (m[4][0],)
        elif d == "out" and ty == 14:
            m = fields(f[14][0])
            refused_key = sub_req.pop(key + (m[1][0],), None)
            if refused_key:
                refused.add(refused_key)
        elif d == "in" and ty == 10:
            m = fields(f[10][0])
            if 4 in m:
                validation_errors += 1
                fail(f"client acked with validation_error {m[4][0]} on {key}: it rejected a MESSAGE")
    if msg_frames == 0:
        fail("no MESSAGE frame recorded")
    for sub in subs:
        for e in events:
            if e.get("sub") == sub and e["kind"] == "recv":
                mid = parse_mid(e["mid"])
                if mid and mid not in sent_ids[sub]:
                    fail(f"{sub}: client received {e['mid']} that no recorded MESSAGE frame carried")
                    break

    # --- permit ledger ---
    final, snap = {}, {}
    for line in open(os.path.join(workdir, "permit-ledger.jsonl")):
        e = json.loads(line)
        k = (e["boot"], e["connection_id"], e["consumer_id"])
        (snap if e["end"] in ("snapshot", "subscribed") else final)[k] = e
    ledger = dict(snap)
    ledger.update(final)
    balanced = 0
    frame_checked = 0
    for k, e in ledger.items():
        g, d, a = e["granted"], e["debited"], e["available"]
        if g != d + a:
            fail(f"incarnation {k}: granted {g} != debited {d} + available {a}")
        elif a > g:
            fail(f"incarnation {k}: available {a} above granted {g}")
        elif e["min_available"] < -(MAX_BATCH - 1):
            fail(f"incarnation {k}: balance went to {e['min_available']}, below 1 - max batch")
        else:
            balanced += 1
        if k in final:
            frame_checked += 1
            if flow_sum.get(k, 0) != g:
                fail(f"incarnation {k}: Flow frames grant {flow_sum.get(k, 0)}, ledger says {g}")
            if p_sum.get(k, 0) != d:
                fail(f"incarnation {k}: MESSAGE frames carry P sum {p_sum.get(k, 0)}, ledger debited {d}")
            if p_cmds.get(k, 0) != e["commands"]:
                fail(f"incarnation {k}: {p_cmds.get(k, 0)} MESSAGE frames, ledger counts {e['commands']}")
    subscribed = set(sub_of) - refused
    missing = subscribed - set(ledger)
    for k in sorted(missing)[:10]:
        fail(f"incarnation {k} subscribed but has no permit-ledger line")

    # --- probes, and server logs: only the probes' connections were closed
    # for a bad frame, each with its reason; no panic ---
    busy = [e for e in events if e["kind"] == "exclusive_busy"]
    if not busy or not all(e["ok"] for e in busy):
        fail(f"a second Exclusive consumer was not refused with ConsumerBusy: {busy}")
    probes = [e for e in events if e["kind"] == "probe"]
    if not probes:
        fail("no malformed-frame probe ran")
    for e in probes:
        if not e["ok"]:
            fail(f"probe {e['name']}: the server did not answer/close as expected")
    expected = [e["reason"] for e in probes if e["reason"]]
    closed = []
    for name in sorted(os.listdir(workdir)):
        if name.startswith("serve-") and name.endswith(".log"):
            for line in open(os.path.join(workdir, name), errors="replace"):
                if "connection closed" in line and "reason=" in line and "i/o" not in line:
                    closed.append(line.strip())
                if "panicked" in line:
                    fail(f"{name}: {line.strip()}")
    for reason in expected:
        hit = [l for l in closed if reason in l]
        if not hit:
            fail(f"server log lacks a connection closed for {reason!r}")
        else:
            closed.remove(hit[0])
    for l in closed:
        fail(f"connection closed by the server outside the probes: {l}")

    rows = ["| subscription | confirmed | delivered | distinct | lost | redelivered (allowed) | delayed (early) | order violations | acks | nacks |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for sub, t in table.items():
        rows.append(f"| {sub} | {t['confirmed']} | {t['delivered']} | {t['distinct']} | {t['lost']} | "
                    f"{t['redelivered']} ({t['allowed']}) | {t['delayed']} ({t['early']}) | {t['disorder']} | {t['acks']} | {t['nacks']} |")
    tot_g = sum(e["granted"] for e in ledger.values())
    tot_d = sum(e["debited"] for e in ledger.values())
    tot_a = sum(e["available"] for e in ledger.values())
    rows.append("")
    rows.append(f"probes: {sum(e['ok'] for e in probes)}/{len(probes)} (PING -> PONG; unsupported command -> CommandError with its request_id; oversized frame, inconsistent sizes, missing required field, unknown command type, undecodable BaseCommand -> that connection closed with the logged reason; hostile peers against a serve of their own: a consumer that never reads stalls only itself, ack ids above i64::MAX and an over-long topic name answered with errors, a duplicate producer id keeps its producer, no CONNECT / idle after PING / a stream ending inside a frame / a command flood without reading closed with their logged reasons, the permit ledger balanced at 2 x u32::MAX, a real client served after it all, SIGTERM exit 0, no panic)")
    rows.append("")
    rows.append("| consumer incarnations | balanced | checked against frames | Σ Flow permits | Σ message_permits | Σ available | MESSAGE frames | with field 6 | kills | unconfirmed sends | ack validation errors |")
    rows.append("|---|---|---|---|---|---|---|---|---|---|---|")
    rows.append(f"| {len(ledger)} | {balanced} | {frame_checked} | {tot_g} | {tot_d} | {tot_a} | {msg_frames} | {msg_with_p} | {len(kills)} | {len(unconfirmed)} | {validation_errors} |")
    text = "\n".join(rows)
    print(text)
    with open(os.path.join(workdir, "table.md"), "w") as f:
        f.write(text + "\n")
    for m in fails[:40]:
        print("FAIL", m)
    if len(fails) > 40:
        print(f"FAIL ... and {len(fails) - 40} more")
    if not restarts and kills:
        print("FAIL killed but never restarted")
        return 1
    print("interop check:", "OK" if not fails else f"{len(fails)} violation(s)")
    return 0 if not fails else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
