#!/usr/bin/env python3
"""Failover active-consumer switch: the official Pulsar Python client (C++
client inside) against `pulsar-core serve`.

Pulsar's order on a switch: the dispatcher rewinds to the mark-delete and
the consumers get ACTIVE_CONSUMER_CHANGE, so the new active consumer
receives the old one's unacknowledged messages first, in publish order,
before anything newer.

- Failover consumer "b" alone on a subscription; N messages published; it
  acknowledges the first ACKED and receives HELD more without
  acknowledging them.
- Consumer "a" subscribes: it sorts first at the same priority, so it
  becomes the active consumer while "b" stays connected.
- "a" must receive every message from ACKED on, exactly in publish order
  (m{ACKED}, m{ACKED+1}, ...), none of the acknowledged ones.

Every wait is bounded (RECEIVE_MS per message). Exits non-zero with the
reason on the first failure; prints one summary line.
"""
import argparse
import sys
import time

import pulsar

from scenario import Server, free_port

N = 300
ACKED = 100
HELD = 50
RECEIVE_MS = 5000


def fail(msg):
    sys.exit(f"failover: FAIL: {msg}")


def switch(url):
    client = pulsar.Client(url, operation_timeout_seconds=30)
    topic = "persistent://public/default/failover-switch"
    subscribe = lambda name: client.subscribe(  # noqa: E731
        topic, "fo", consumer_type=pulsar.ConsumerType.Failover,
        consumer_name=name, receiver_queue_size=20)
    b = subscribe("b")
    p = client.create_producer(topic, batching_enabled=False)
    for i in range(N):
        p.send(f"m{i}".encode())
    p.close()
    got = []
    while len(got) < ACKED + HELD:
        try:
            got.append(b.receive(timeout_millis=RECEIVE_MS))
        except pulsar.Timeout:
            fail(f"the active consumer stopped after {len(got)} messages")
    names = [x.data().decode() for x in got]
    if names != [f"m{i}" for i in range(ACKED + HELD)]:
        fail(f"the active consumer received out of order: {names[:10]}...")
    for x in got[:ACKED]:
        b.acknowledge(x)
    # The client groups acks (100 ms by default): let them reach the broker.
    time.sleep(1)
    # "a" sorts before "b" at the same priority: it becomes the active
    # consumer while "b" stays connected with its unacknowledged messages.
    a = subscribe("a")
    seen = []
    while len(seen) < N - ACKED:
        try:
            x = a.receive(timeout_millis=RECEIVE_MS)
        except pulsar.Timeout:
            fail(f"the new active consumer stopped after {len(seen)} of {N - ACKED}: {seen[:5]}...")
        seen.append(x.data().decode())
        a.acknowledge(x)
    want = [f"m{i}" for i in range(ACKED, N)]
    if seen != want:
        first = next(i for i, (s, w) in enumerate(zip(seen, want)) if s != w)
        fail(f"after the switch message {first} was {seen[first]}, not {want[first]} "
             f"(Pulsar rewinds to the mark-delete first): {seen[max(0, first - 3):first + 3]}")
    a.close()
    b.close()
    client.close()
    print(f"failover: switch after {ACKED} acked and {HELD} held by the old active consumer: "
          f"the new one received m{ACKED}..m{N - 1} in publish order: OK")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    port = free_port()
    server = Server(args.binary, args.workdir, port)
    server.start()
    try:
        switch(f"pulsar://127.0.0.1:{port}")
    finally:
        rc = server.stop()
    if rc != 0:
        fail(f"serve exited {rc} on SIGTERM")


if __name__ == "__main__":
    main()
