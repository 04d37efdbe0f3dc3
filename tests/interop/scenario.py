#!/usr/bin/env python3
"""Seed-004-shaped interop scenario: the official Apache Pulsar Python client
(C++ client inside, no PIP-491 support) against `pulsar-core serve`.

Starts `serve` on a loopback port, runs several keyed producers (one with
`deliver_after` messages), a Key_Shared, a Shared and a Failover subscription
with several consumers each, acks (individual, some held back and acked out
of order, some negatively acked, some left unacked until the consumer
closes), and one `kill -9` of `serve` plus a restart on the same data dir in
the middle, with the clients reconnecting on their own.

Writes WORKDIR/events.jsonl (what the clients sent and received) and leaves
WORKDIR/permit-ledger.jsonl, WORKDIR/frames.txt and WORKDIR/serve-*.log from
the server; `check.py WORKDIR` judges them.
"""
import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time

import pulsar

import hostile
from wire import connect_frame, field, frame



def now_ms():
    return int(time.time() * 1000)


class Events:
    def __init__(self, path):
        self.f = open(path, "w")
        self.lock = threading.Lock()

    def write(self, **kv):
        kv["t"] = now_ms()
        with self.lock:
            self.f.write(json.dumps(kv) + "\n")
            self.f.flush()


class Server:
    def __init__(self, binary, workdir, port):
        self.binary, self.workdir, self.port = binary, workdir, port
        self.proc = None
        self.boots = 0

    def start(self):
        self.boots += 1
        log = open(os.path.join(self.workdir, f"serve-{self.boots}.log"), "w")
        env = dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "info"))
        self.proc = subprocess.Popen(
            [self.binary, "serve", "--data-dir", os.path.join(self.workdir, "data"),
             "--listen", f"127.0.0.1:{self.port}",
             "--permit-ledger", os.path.join(self.workdir, "permit-ledger.jsonl"),
             "--record-frames", os.path.join(self.workdir, "frames.txt")],
            stdout=log, stderr=log, env=env)
        with open(os.path.join(self.workdir, "serve.pid"), "w") as f:
            f.write(str(self.proc.pid))
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    sys.exit(f"serve exited with {self.proc.returncode} at start")
                time.sleep(0.05)
        sys.exit("serve did not start listening within 20 s")

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            sys.exit("serve did not stop within 10 s of SIGTERM")
        return rc


def producer_loop(client, topic, pid, n, ev, delayed, stop_at_half, halfway, resume):
    if delayed:
        prod = client.create_producer(topic, producer_name=f"p{pid}", batching_enabled=False,
                                      send_timeout_millis=30000)
    else:
        prod = client.create_producer(topic, producer_name=f"p{pid}", batching_enabled=True,
                                      batching_type=pulsar.BatchingType.KeyBased,
                                      batching_max_messages=8,
                                      batching_max_publish_delay_ms=5,
                                      send_timeout_millis=30000)
    rnd = random.Random(pid)
    pending = []
    for seq in range(n):
        if seq == n // 2:
            for f in pending:
                f.wait()
            pending = []
            stop_at_half.wait_one()
            halfway.set()
            resume.wait()
        key = f"k{pid}-{rnd.randrange(4)}" if not delayed else f"d{pid}"
        delay_ms = rnd.choice([300, 800, 1500]) if delayed and seq % 3 == 0 else 0
        body = json.dumps({"p": pid, "seq": seq, "key": key, "delay": delay_ms}).encode()
        sent = now_ms()
        kwargs = {"partition_key": key}
        if delay_ms:
            kwargs["deliver_after"] = __import__("datetime").timedelta(milliseconds=delay_ms)
        done = Waiter()

        def cb(res, mid, seq=seq, key=key, sent=sent, delay_ms=delay_ms, done=done):
            ev.write(kind="sent", p=pid, seq=seq, key=key, ok=(res == pulsar.Result.Ok),
                     result=str(res), sent=sent, deliver_at=(sent + delay_ms if delay_ms else 0),
                     mid=str(mid) if res == pulsar.Result.Ok else None)
            done.set()

        prod.send_async(body, cb, **kwargs)
        pending.append(done)
        if len(pending) > 32:
            pending.pop(0).wait()
    for f in pending:
        f.wait()
    prod.flush()
    prod.close()


class Waiter:
    def __init__(self):
        self.e = threading.Event()

    def set(self):
        self.e.set()

    def wait(self):
        if not self.e.wait(90):
            raise RuntimeError("send callback not called within 90 s")


class Barrier:
    def __init__(self, n):
        self.b = threading.Barrier(n)

    def wait_one(self):
        self.b.wait(120)


def consumer_loop(client, topic, sub, sub_type, name, ev, stop, behaviour):
    kwargs = dict(consumer_type=sub_type, consumer_name=name,
                  initial_position=pulsar.InitialPosition.Earliest,
                  receiver_queue_size=50,
                  negative_ack_redelivery_delay_ms=200,
                  batch_index_ack_enabled=behaviour.get("batch_index_ack", False))
    cons = client.subscribe(topic, sub, **kwargs)
    ev.write(kind="sub", sub=sub, c=name, type=str(sub_type))
    rnd = random.Random(hash(name) & 0xffff)
    held = []
    received = 0
    close_after = behaviour.get("close_after")
    while not stop.is_set():
        try:
            m = cons.receive(200)
        except pulsar.Timeout:
            if held and behaviour.get("cumulative"):
                cons.acknowledge_cumulative(held[-1])
                ev.write(kind="ack_cum", sub=sub, c=name, mid=str(m.message_id()))
                held = []
            elif held:
                for h in reversed(held):
                    cons.acknowledge(h)
                    ev.write(kind="ack", sub=sub, c=name, mid=str(h.message_id()))
                held = []
            continue
        body = json.loads(m.data())
        received += 1
        ev.write(kind="recv", sub=sub, bia=behaviour.get("batch_index_ack", False), c=name, mid=str(m.message_id()), p=body["p"], seq=body["seq"],
                 key=body["key"], delay=body["delay"], redelivery=m.redelivery_count(),
                 publish=m.publish_timestamp())
        r = rnd.random()
        if behaviour.get("cumulative"):
            held.append(m)
            if received % 25 == 0 and not behaviour.get("redelivered"):
                # Exclusive/Failover redelivery of everything unacknowledged
                # (no ids; the consumer epoch goes up).
                behaviour["redelivered"] = True
                ev.write(kind="abandon", sub=sub, c=name, mids=[str(h.message_id()) for h in held])
                cons.redeliver_unacknowledged_messages()
                held = []
            elif len(held) >= behaviour["cumulative"]:
                cons.acknowledge_cumulative(m)
                ev.write(kind="ack_cum", sub=sub, c=name, mid=str(m.message_id()))
                held = []
            continue
        if close_after and received == close_after:
            # Leave this one and the held ones unacknowledged; closing the
            # consumer hands them to the others.
            ev.write(kind="close_unacked", sub=sub, c=name, mids=[str(m.message_id())] + [str(h.message_id()) for h in held])
            cons.close()
            cons = client.subscribe(topic, sub, **kwargs)
            held = []
            ev.write(kind="resubscribed", sub=sub, c=name)
            continue
        if r < behaviour.get("nack", 0):
            cons.negative_acknowledge(m)
            ev.write(kind="nack", sub=sub, c=name, mid=str(m.message_id()))
        elif r < behaviour.get("nack", 0) + behaviour.get("hold", 0):
            held.append(m)
            if len(held) >= 4:
                for h in reversed(held):
                    cons.acknowledge(h)
                    ev.write(kind="ack", sub=sub, c=name, mid=str(h.message_id()))
                held = []
        else:
            cons.acknowledge(m)
            ev.write(kind="ack", sub=sub, c=name, mid=str(m.message_id()))
    if held and behaviour.get("cumulative"):
        cons.acknowledge_cumulative(held[-1])
        ev.write(kind="ack_cum", sub=sub, c=name, mid=str(held[-1].message_id()))
        held = []
    for h in held:
        cons.acknowledge(h)
        ev.write(kind="ack", sub=sub, c=name, mid=str(h.message_id()))
    time.sleep(0.3)  # let the grouped acks go out
    cons.close()


# --- raw-socket probes: malformed frames close only their connection ---

def _read_frame(sock):
    def exact(n):
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return buf
    head = exact(4)
    if head is None:
        return None
    body = exact(int.from_bytes(head, "big"))
    if body is None:
        return None
    n = int.from_bytes(body[:4], "big")
    return body[4:4 + n]


def probes(port, ev):
    """Each probe: (name, frames after CONNECT, expected reply type or None
    for "the server closes the connection", reason the server must log)."""
    cases = [
        ("ping-pong", [frame(field(1, 18) + field(18, b""))], 19, None),
        ("seek-unknown-consumer", [frame(field(1, 28) + field(28, field(1, 1) + field(2, 77)))], 14, None),
        ("frame-too-large", [(0x7FFFFFF0).to_bytes(4, "big")], None, "exceeds the limit"),
        ("command-size-exceeds-frame", [(8).to_bytes(4, "big") + (100).to_bytes(4, "big") + b"\0\0\0\0"], None, "exceeds total_size"),
        ("ack-missing-required-ack_type", [frame(field(1, 10) + field(10, field(1, 1)))], None, "lacks required field 2"),
        ("unknown-command-type", [frame(field(1, 999))], None, "not a BaseCommand.Type value"),
        ("garbage-protobuf", [frame(b"\xff\xff\xff\xff\xff")], None, "BaseCommand:"),
    ]
    for name, frames, expect, reason in cases:
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(connect_frame())
        connected = _read_frame(sock)
        ok = connected is not None and connected[:2] == bytes([0x08, 3])
        for f in frames:
            sock.sendall(f)
        try:
            reply = _read_frame(sock)
        except (ConnectionResetError, socket.timeout):
            reply = None
        if expect is None:
            ok = ok and reply is None
        else:
            # ERROR(14) whose request_id is 77
            ok = ok and reply is not None and reply[:2] == bytes([0x08, expect])
            if expect == 14:
                ok = ok and field(1, 77) in reply
        sock.close()
        ev.write(kind="probe", name=name, ok=ok, reason=reason)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--messages", type=int, default=300, help="per producer")
    ap.add_argument("--producers", type=int, default=3)
    ap.add_argument("--no-kill", action="store_true")
    ap.add_argument("--deadline", type=int, default=150, help="seconds for delivery to finish")
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    for f in ("events.jsonl", "permit-ledger.jsonl", "frames.txt"):
        try:
            os.remove(os.path.join(a.workdir, f))
        except FileNotFoundError:
            pass
    port = a.port or free_port()
    ev = Events(os.path.join(a.workdir, "events.jsonl"))
    server = Server(a.binary, a.workdir, port)
    server.start()
    probes(port, ev)
    hostile.run(a.binary, a.workdir, free_port(), ev)
    topic = f"persistent://public/default/interop-{int(time.time())}"
    client = pulsar.Client(f"pulsar://127.0.0.1:{port}", operation_timeout_seconds=30,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    stop = threading.Event()
    subs = [
        ("ks", pulsar.ConsumerType.KeyShared, 3, {"nack": 0.03, "hold": 0.2, "batch_index_ack": True}),
        ("sh", pulsar.ConsumerType.Shared, 3, {"nack": 0.05, "hold": 0.2, "close_after": 60}),
        ("fo", pulsar.ConsumerType.Failover, 2, {"hold": 0.1}),
        ("ex", pulsar.ConsumerType.Exclusive, 1, {"cumulative": 10}),
    ]
    threads = []
    for sub, st, n, beh in subs:
        for i in range(n):
            b = dict(beh)
            if i != 0:
                b.pop("close_after", None)
            t = threading.Thread(target=consumer_loop, daemon=True,
                                 args=(client, topic, sub, st, f"{sub}-{i}", ev, stop, b))
            t.start()
            threads.append(t)
    time.sleep(1.0)  # subscriptions exist before the first message
    # A second consumer on the Exclusive subscription is refused (ConsumerBusy).
    try:
        extra = client.subscribe(topic, "ex", consumer_type=pulsar.ConsumerType.Exclusive,
                                 consumer_name="ex-intruder")
        extra.close()
        ev.write(kind="exclusive_busy", ok=False, error="subscribed")
    except Exception as e:  # the client raises pulsar.ConsumerBusy
        ev.write(kind="exclusive_busy", ok="ConsumerBusy" in type(e).__name__ + str(e), error=repr(e))
    nprod = a.producers + 1  # the last one sends the delayed messages
    at_half = Barrier(nprod)
    halfway, resume = threading.Event(), threading.Event()
    prods = []
    for pid in range(nprod):
        t = threading.Thread(target=producer_loop, daemon=True,
                             args=(client, topic, pid, a.messages, ev, pid == nprod - 1,
                                   at_half, halfway, resume))
        t.start()
        prods.append(t)
    if not halfway.wait(120):
        sys.exit("producers did not reach the halfway point within 120 s")
    time.sleep(0.5)  # deliveries and acks in flight
    if not a.no_kill:
        ev.write(kind="kill")
        server.kill9()
        time.sleep(0.5)
        server.start()
        ev.write(kind="restart")
    resume.set()
    for t in prods:
        t.join(180)
        if t.is_alive():
            sys.exit("a producer did not finish within 180 s")
    ev.write(kind="produced")
    # Wait until every subscription has acked everything confirmed, or the deadline.
    deadline = time.time() + a.deadline
    while time.time() < deadline:
        if delivery_complete(os.path.join(a.workdir, "events.jsonl"), [s[0] for s in subs]):
            break
        time.sleep(0.5)
    ev.write(kind="stopping")
    stop.set()
    for t in threads:
        t.join(30)
    client.close()
    rc = server.stop()
    ev.write(kind="stopped", rc=rc)
    print(f"scenario finished; serve exited {rc}")
    if rc != 0:
        sys.exit(f"serve exited {rc} on SIGTERM (a clean shutdown exits 0)")


def delivery_complete(path, subs):
    confirmed, acked = set(), {s: set() for s in subs}
    mids = {}
    cum = {}
    with open(path) as f:
        for line in f:
            e = json.loads(line)
            if e["kind"] == "sent" and e["ok"]:
                confirmed.add((e["p"], e["seq"]))
            elif e["kind"] == "recv":
                mids[(e["sub"], e["mid"])] = (e["p"], e["seq"])
            elif e["kind"] == "ack":
                k = mids.get((e["sub"], e["mid"]))
                if k:
                    acked[e["sub"]].add(k)
            elif e["kind"] == "ack_cum":
                cum[e["sub"]] = max(cum.get(e["sub"], (0, 0, 0)), _pos(e["mid"]))
    for (sub, mid), k in mids.items():
        if sub in cum and _pos(mid) <= cum[sub]:
            acked[sub].add(k)
    return confirmed and all(confirmed <= acked[s] for s in subs)


def _pos(mid):
    l, e, _, b = mid.strip("()").split(",")
    return (int(l), int(e), int(b))


if __name__ == "__main__":
    main()
