#!/usr/bin/env python3
"""Seek, readers and unsubscribe: the official Pulsar Python client (C++
client inside) against `pulsar-core serve`.

- Seek backward by message id: every message from the seek position is
  sent again, also ones already acknowledged, an individually acknowledged
  range past the position included (the broker's MESSAGE frames
  start AT the seek id, as Pulsar's reset does; the C++ client itself then
  drops the seek message unless `start_message_id_inclusive`, its
  `ConsumerImpl::isPriorEntryIndex`); the reset is durable (after a
  kill -9 and a restart a new client reads from the seek id).
- Seek forward by message id: the messages before it are skipped and
  count as acknowledged (not delivered again after a reconnect).
- Seek by publish time: reception starts at the first message published
  at or after the time.
- A reader from earliest reads everything; a reader from a message id
  reads from that message (inclusive) or after it (exclusive), and
  `has_message_available` turns false at the end (GET_LAST_MESSAGE_ID).
- Unsubscribe: refused while another consumer is attached, then the
  subscription is gone (a new one at Latest gets none of the old backlog).

Every wait is bounded (RECEIVE_MS per message). Exits non-zero with the
reason on the first failure; prints one summary line per scenario.
"""
import argparse
import sys
import time

import pulsar

from scenario import Server, free_port

N = 20
RECEIVE_MS = 5000


def fail(msg):
    sys.exit(f"seek: FAIL: {msg}")


def produce(client, topic, n, pause_ms=0):
    """n messages "m0".."m{n-1}", not batched; their ids and publish times."""
    p = client.create_producer(topic, batching_enabled=False)
    out = []
    for i in range(n):
        mid = p.send(f"m{i}".encode())
        out.append(mid)
        if pause_ms:
            time.sleep(pause_ms / 1000)
    p.close()
    return out


def receive_all(consumer, expect_n, ack=True):
    """Receives until `expect_n` messages or a quiet RECEIVE_MS; payloads."""
    got = []
    while len(got) < expect_n:
        try:
            m = consumer.receive(timeout_millis=RECEIVE_MS)
        except pulsar.Timeout:
            break
        got.append(m.data().decode())
        if ack:
            consumer.acknowledge(m)
    return got


def quiet(consumer, ms=1500):
    try:
        m = consumer.receive(timeout_millis=ms)
    except pulsar.Timeout:
        return None
    return m.data().decode()


def _varint(b, i):
    r = s = 0
    while True:
        x = b[i]
        i += 1
        r |= (x & 0x7F) << s
        s += 7
        if x < 0x80:
            return r, i


def _fields(b):
    """Top-level (tag, value) pairs of a protobuf message (varint and
    length-delimited fields only, which is all these commands use)."""
    i, out = 0, []
    while i < len(b):
        key, i = _varint(b, i)
        tag, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(b, i)
        elif wt == 2:
            n, i = _varint(b, i)
            v, i = b[i:i + n], i + n
        else:
            raise ValueError(f"wire type {wt}")
        out.append((tag, v))
    return out


def messages_after_seek(workdir, k):
    """(ledger_id, entry_id) of the MESSAGE frames serve sent after the
    k-th SEEK it received (its --record-frames file)."""
    seeks, out = 0, []
    with open(f"{workdir}/frames.txt") as f:
        for line in f:
            p = line.split()
            if len(p) < 5:
                continue
            cmd = dict(_fields(bytes.fromhex(p[4])))
            if p[0] == "in" and cmd.get(1) == 28:
                seeks += 1
            elif seeks == k and p[0] == "out" and cmd.get(1) == 9:
                mid = dict(_fields(dict(_fields(cmd[9]))[2]))
                out.append((mid[1], mid[2]))
            elif seeks > k:
                break
    return out


def names(lo, hi):
    return [f"m{i}" for i in range(lo, hi)]


def seek_by_id(server, url):
    topic = "persistent://public/default/seek-id"
    client = pulsar.Client(url, operation_timeout_seconds=30)
    ids = produce(client, topic, N)
    c = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared,
                         initial_position=pulsar.InitialPosition.Earliest)
    # Everything but m3 acknowledged: m4..m19 are an individually deleted
    # range past the mark-delete, which a backward seek must clear.
    got = []
    while len(got) < N:
        try:
            m = c.receive(timeout_millis=RECEIVE_MS)
        except pulsar.Timeout:
            break
        got.append(m.data().decode())
        if got[-1] != "m3":
            c.acknowledge(m)
    if got != names(0, N):
        fail(f"first pass: {got}")
    time.sleep(0.5)  # the client's grouped acks reach the broker
    # Backward: to m1, everything from there again although acknowledged
    # (the client drops m1 itself, see the module docs).
    c.seek(ids[1])
    got = receive_all(c, N - 2)
    if got != names(2, N):
        fail(f"after a backward seek to m1 past the acknowledged range m4..m19: {got}")
    sent = messages_after_seek(server.workdir, 1)
    if sent[:1] != [(ids[1].ledger_id(), ids[1].entry_id())]:
        fail(f"the broker's first MESSAGE after the seek to m1 is {sent[:1]}, not m1")
    # Forward: to m15, m5..m14 are skipped.
    c.seek(ids[5])
    c.seek(ids[15])
    got = receive_all(c, N - 16, ack=False)
    if got != names(16, N):
        fail(f"after a forward seek to m15: {got}")
    # Backward again, not acknowledged, then kill -9: the reset is durable.
    c.seek(ids[10])
    time.sleep(0.5)
    client.close()
    server.kill9()
    server.start()
    client = pulsar.Client(url, operation_timeout_seconds=30)
    c = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    got = receive_all(c, N - 10)
    if got != names(10, N):
        fail(f"after a backward seek to m10 and kill -9: {got}")
    extra = quiet(c)
    if extra is not None:
        fail(f"unexpected {extra} after the seek position's backlog")
    client.close()
    print("seek: by message id: backward (m1, past an acknowledged range; the broker resends from m1), forward (m15), backward (m10) across kill -9: OK")


def seek_by_time(url):
    topic = "persistent://public/default/seek-time"
    client = pulsar.Client(url, operation_timeout_seconds=30)
    produce(client, topic, 5)
    time.sleep(0.3)
    t = int(time.time() * 1000)
    time.sleep(0.3)
    produce(client, topic, 5)
    c = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    got = receive_all(c, 10)
    if got != names(0, 5) + names(0, 5):
        fail(f"by time, first pass: {got}")
    c.seek(t)
    got = receive_all(c, 5)
    if got != names(0, 5) or quiet(c) is not None:
        fail(f"after a seek to the time between the two halves: {got}")
    c.seek(0)
    got = receive_all(c, 10)
    if len(got) != 10:
        fail(f"after a seek to time 0: {got}")
    client.close()
    print("seek: by publish time (between two halves; time 0): OK")


def readers(url):
    topic = "persistent://public/default/readers"
    client = pulsar.Client(url, operation_timeout_seconds=30)
    ids = produce(client, topic, N)
    r = client.create_reader(topic, pulsar.MessageId.earliest)
    got = []
    deadline = time.time() + 30
    while r.has_message_available() and time.time() < deadline:
        got.append(r.read_next(timeout_millis=RECEIVE_MS).data().decode())
    if got != names(0, N):
        fail(f"reader from earliest: {got}")
    r.close()
    r = client.create_reader(topic, ids[7])
    got = receive_all_reader(r, N - 8)
    if got != names(8, N):
        fail(f"reader from m7 (exclusive): {got}")
    r.close()
    r = client.create_reader(topic, ids[7], start_message_id_inclusive=True)
    got = receive_all_reader(r, N - 7)
    if got != names(7, N):
        fail(f"reader from m7 (inclusive): {got}")
    r.close()
    client.close()
    print("seek: readers from earliest (has_message_available), from a message id (exclusive, inclusive): OK")


def receive_all_reader(r, n):
    got = []
    while len(got) < n:
        try:
            got.append(r.read_next(timeout_millis=RECEIVE_MS).data().decode())
        except pulsar.Timeout:
            break
    return got


def unsubscribe(url):
    topic = "persistent://public/default/unsubscribe"
    client = pulsar.Client(url, operation_timeout_seconds=30)
    produce(client, topic, 5)
    a = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared,
                         initial_position=pulsar.InitialPosition.Earliest)
    b = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared,
                         initial_position=pulsar.InitialPosition.Earliest)
    t0 = time.time()
    try:
        a.unsubscribe()
        fail("unsubscribe with a second consumer attached succeeded")
    except pulsar.PulsarException as e:
        refused = f"{type(e).__name__}"
    if time.time() - t0 > 10:
        fail("the refused unsubscribe took more than 10 s")
    b.close()
    a.unsubscribe()
    c = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    extra = quiet(c)
    if extra is not None:
        fail(f"the new subscription got {extra} of the unsubscribed one's backlog")
    client.close()
    print(f"seek: unsubscribe refused with a second consumer ({refused}), then the subscription is gone: OK")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    port = free_port()
    server = Server(args.binary, args.workdir, port)
    server.start()
    url = f"pulsar://127.0.0.1:{port}"
    try:
        seek_by_id(server, url)
        seek_by_time(url)
        readers(url)
        unsubscribe(url)
    finally:
        rc = server.stop()
    if rc != 0:
        fail(f"serve exited {rc} on SIGTERM")


if __name__ == "__main__":
    main()
