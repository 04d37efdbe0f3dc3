#!/usr/bin/env python3
"""Producer-side interop scenarios: the official Pulsar Python client (C++
client inside) against `pulsar-core serve`.

- Access modes: a second `Exclusive` producer is refused at once
  (`ProducerFenced`), a `Shared` one beside it too (`ProducerBusy`); a
  `WaitForExclusive` producer completes when the exclusive one closes.
- Names: a second producer with a name in use is refused (`ProducerBusy`).
- Deduplication across `kill -9`: one named producer sends while `serve` is
  killed and restarted several times; its pending sends are resent after
  each reconnect; every message must be stored exactly once.
- Chunking: a 6 MiB message with chunking on round-trips, byte for byte.

Each refusal must come within REFUSAL_BOUND_S (a client retrying an error
until its operation timeout takes 30 s). Exits non-zero with the reason on
the first failure; prints one summary line per scenario.
"""
import argparse
import os
import sys
import threading
import time

import pulsar

from scenario import Server, free_port

REFUSAL_BOUND_S = 10
DEDUP_MESSAGES = 1500
DEDUP_KILLS = 3


def fail(msg):
    sys.exit(f"producers: FAIL: {msg}")


def refused(create, expect):
    """Runs `create`, which must raise an error whose class name contains
    `expect` within REFUSAL_BOUND_S; returns the seconds it took."""
    t0 = time.time()
    try:
        p = create()
    except Exception as e:  # the client raises one class per Result
        took = time.time() - t0
        if expect not in type(e).__name__ and expect not in str(e):
            fail(f"expected {expect}, got {type(e).__name__}: {e}")
        if took > REFUSAL_BOUND_S:
            fail(f"{expect} took {took:.1f} s (a retry loop?)")
        return took
    p.close()
    fail(f"expected {expect}, the producer was created")


def access_modes(client):
    t = "persistent://public/default/access-modes"
    first = client.create_producer(t, producer_name="x1",
                                   access_mode=pulsar.ProducerAccessMode.Exclusive)
    a = refused(lambda: client.create_producer(
        t, producer_name="x2", access_mode=pulsar.ProducerAccessMode.Exclusive), "Fenced")
    b = refused(lambda: client.create_producer(t, producer_name="s1"), "Busy")
    # WaitForExclusive: queued while x1 holds the topic, ready once it closes.
    got = {}

    def wait():
        got["p"] = client.create_producer(
            t, producer_name="w1", access_mode=pulsar.ProducerAccessMode.WaitForExclusive)

    th = threading.Thread(target=wait)
    th.start()
    time.sleep(0.5)
    if "p" in got:
        fail("WaitForExclusive completed while an exclusive producer held the topic")
    first.send(b"from x1")
    first.close()
    th.join(REFUSAL_BOUND_S)
    if "p" not in got:
        fail("WaitForExclusive did not complete after the exclusive producer closed")
    got["p"].send(b"from w1")
    got["p"].close()
    print(f"producers: access modes: second Exclusive refused in {a:.2f} s (ProducerFenced), "
          f"Shared beside it in {b:.2f} s (ProducerBusy), WaitForExclusive completed on release")


def names(client):
    t = "persistent://public/default/names"
    p = client.create_producer(t, producer_name="same")
    took = refused(lambda: client.create_producer(t, producer_name="same"), "Busy")
    p.close()
    # Free again once closed.
    client.create_producer(t, producer_name="same").close()
    print(f"producers: names: a second 'same' refused in {took:.2f} s (ProducerBusy), "
          "accepted after the first closed")


def duplicates(bodies):
    """(copies beyond the first, missing) of bodies b'0'..b'N-1'."""
    seen = {}
    for b in bodies:
        seen[b] = seen.get(b, 0) + 1
    extra = sum(n - 1 for n in seen.values())
    missing = sum(1 for i in range(DEDUP_MESSAGES) if str(i).encode() not in seen)
    return extra, missing


def dedup(server, url, workdir):
    # The check must be able to fail: a doctored list with one copy too many.
    if duplicates([str(i).encode() for i in range(DEDUP_MESSAGES)] + [b"7"]) != (1, 0):
        fail("the duplicate count misses a doctored duplicate")
    t = "persistent://public/default/dedup-kill"
    client = pulsar.Client(url, operation_timeout_seconds=30)
    prod = client.create_producer(t, producer_name="dedup-p", batching_enabled=False,
                                  send_timeout_millis=60000, max_pending_messages=200,
                                  block_if_queue_full=True)
    done = threading.Semaphore(0)
    errors = []
    acked = [0]

    def cb(res, _mid):
        if res != pulsar.Result.Ok:
            errors.append(str(res))
        acked[0] += 1
        done.release()

    kills = []

    def killer():
        for k in range(DEDUP_KILLS):
            target = (k + 1) * DEDUP_MESSAGES // (DEDUP_KILLS + 1)
            while acked[0] < target:
                time.sleep(0.005)
            server.kill9()
            kills.append(acked[0])
            server.start()

    kt = threading.Thread(target=killer)
    kt.start()
    for i in range(DEDUP_MESSAGES):
        prod.send_async(str(i).encode(), cb)
    for _ in range(DEDUP_MESSAGES):
        if not done.acquire(timeout=90):
            fail(f"dedup: sends did not complete ({acked[0]} of {DEDUP_MESSAGES})")
    kt.join(60)
    if errors:
        fail(f"dedup: {len(errors)} sends failed: {errors[:3]}")
    prod.close()
    cons = client.subscribe(t, "dedup-check", initial_position=pulsar.InitialPosition.Earliest)
    bodies = []
    while True:
        try:
            m = cons.receive(2000)
        except Exception:
            break
        bodies.append(m.data())
        cons.acknowledge(m)
    client.close()
    extra, missing = duplicates(bodies)
    answered = 0
    for name in os.listdir(workdir):
        if name.startswith("serve-") and name.endswith(".log"):
            with open(os.path.join(workdir, name), errors="replace") as f:
                answered += sum(1 for line in f if "duplicate SEND answered" in line)
    if extra or missing:
        fail(f"dedup: {extra} messages stored more than once, {missing} missing "
             f"(kills after {kills} receipts; {answered} duplicates answered)")
    print(f"producers: dedup: {DEDUP_MESSAGES} sends, kill -9 after {kills} receipts, "
          f"{len(bodies)} stored (no copy, none missing), {answered} resent sends answered as duplicates")


def chunking(client):
    t = "persistent://public/default/chunked"
    cons = client.subscribe(t, "chunks", consumer_type=pulsar.ConsumerType.Exclusive)
    prod = client.create_producer(t, chunking_enabled=True, batching_enabled=False,
                                  send_timeout_millis=20000)
    body = os.urandom(6 << 20)
    t0 = time.time()
    prod.send(body)
    m = cons.receive(20000)
    if m.data() != body:
        fail(f"chunking: received {len(m.data())} bytes, not the 6 MiB sent")
    cons.acknowledge(m)
    prod.close()
    cons.close()
    print(f"producers: chunking: 6 MiB message round-tripped in {time.time() - t0:.2f} s")


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
        client = pulsar.Client(url, operation_timeout_seconds=30)
        access_modes(client)
        names(client)
        chunking(client)
        client.close()
        dedup(server, url, args.workdir)
    finally:
        rc = server.stop()
    if rc != 0:
        fail(f"serve exited {rc} on SIGTERM")


if __name__ == "__main__":
    main()
