#!/usr/bin/env python3
"""The delayed tracker seals, merges and trims its buckets through `serve`:
small bucket limits (`--delayed-min-index-count-per-bucket`,
`--delayed-bucket-max-indexes`, `--delayed-max-num-buckets`) and small
ledgers (`--ledger-max-entries`, a bucket seals at a ledger switch), the
official Python client producing `deliver_after` messages on a Shared
subscription, and a `kill -9` of `serve` in the middle with a restart on the
same data dir (the tracker recovers its bucket snapshots).

    delayed_buckets.py --binary B --workdir W [--messages N]

Checks: every confirmed message is delivered, never before its delivery
time; a message is delivered more than once only if its first delivery came
before the restart (its ack may have died with the process); serve's logs
show buckets sealed and merged; at the end (everything acknowledged) the
store holds no bucket snapshot (the tracker trimmed and deleted them all)
and consumed ledgers were deleted. Writes W/events.jsonl.
"""
import argparse
import datetime
import json
import os
import random
import subprocess
import sys
import threading
import time

import pulsar

from node import Serve, now_ms

# Clock slack between the client's `deliver_at` and the broker's clock
# (same host; ms rounding only).
SLACK_MS = 5


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--messages", type=int,
                    default=int(os.environ.get("INTEROP_DELAYED_MESSAGES", "600")))
    ap.add_argument("--deadline", type=int, default=90)
    ap.add_argument("--serve-defaults", action="store_true",
                    help="negative control: serve's default bucket limits and ledgers "
                         "(no bucket seals: the run must fail)")
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    limits = [
        "--ledger-max-entries", "40",
        "--delayed-min-index-count-per-bucket", "20",
        "--delayed-bucket-max-indexes", "8",
        "--delayed-max-num-buckets", "3",
        "--retention-check-interval-secs", "1",
    ]
    serve = Serve(a.binary, a.workdir, [] if a.serve_defaults else limits,
                  rust_log="info,pulsar_core::delayed=debug")
    serve.start()
    events = open(os.path.join(a.workdir, "events.jsonl"), "w")
    lock = threading.Lock()

    def ev(**kv):
        kv["t"] = now_ms()
        with lock:
            events.write(json.dumps(kv) + "\n")
            events.flush()

    topic = f"persistent://public/default/delayed-buckets-{int(time.time())}"
    client = pulsar.Client(serve.url, operation_timeout_seconds=30,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    consumer = client.subscribe(topic, "d", consumer_type=pulsar.ConsumerType.Shared,
                                receiver_queue_size=100)
    # Pulsar's producer sends a delayed message alone (no batching).
    producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=30000)
    stop = threading.Event()
    restarted_at = [None]

    def consume():
        while not stop.is_set():
            try:
                m = consumer.receive(200)
            except pulsar.Timeout:
                continue
            body = json.loads(m.data())
            ev(kind="recv", seq=body["seq"], deliver_at=body["deliver_at"],
               redelivery=m.redelivery_count())
            consumer.acknowledge(m)
            ev(kind="ack", seq=body["seq"])

    ct = threading.Thread(target=consume, daemon=True)
    ct.start()
    rnd = random.Random(7)
    sent = {}
    for seq in range(a.messages):
        if seq == a.messages // 2:
            # Sealed buckets exist by now (a ledger every 40 entries, a
            # bucket of >= 20 indexes sealed at each switch).
            time.sleep(0.5)
            ev(kind="kill")
            serve.kill9()
            serve.start()
            restarted_at[0] = now_ms()
            ev(kind="restart")
        delay = rnd.randrange(2000, 9000)
        deliver_at = now_ms() + delay
        body = json.dumps({"seq": seq, "deliver_at": deliver_at}).encode()
        try:
            producer.send(body, deliver_after=datetime.timedelta(milliseconds=delay))
        except Exception as e:  # a send the kill failed: not confirmed
            ev(kind="send_failed", seq=seq, error=repr(e))
            continue
        sent[seq] = deliver_at
        ev(kind="sent", seq=seq, deliver_at=deliver_at)
        time.sleep(0.005)
    deadline = time.time() + a.deadline
    while time.time() < deadline:
        acked = set()
        with open(os.path.join(a.workdir, "events.jsonl")) as f:
            for line in f:
                e = json.loads(line)
                if e["kind"] == "ack":
                    acked.add(e["seq"])
        if set(sent) <= acked:
            break
        time.sleep(0.5)
    time.sleep(1.5)  # the last acks reach serve; a trim pass runs
    stop.set()
    ct.join(10)
    consumer.close()
    producer.close()
    client.close()
    rc = serve.stop()
    fails = []
    if rc != 0:
        fails.append(f"serve exited {rc} on SIGTERM")
    recvs = {}
    with open(os.path.join(a.workdir, "events.jsonl")) as f:
        for line in f:
            e = json.loads(line)
            if e["kind"] == "recv":
                recvs.setdefault(e["seq"], []).append(e["t"])
    missing = sorted(set(sent) - set(recvs))
    if missing:
        fails.append(f"{len(missing)} confirmed messages never delivered, e.g. {missing[:5]}")
    early = [(s, min(recvs[s]) - d) for s, d in sent.items()
             if s in recvs and min(recvs[s]) < d - SLACK_MS]
    if early:
        fails.append(f"{len(early)} delivered before their time, e.g. {early[:5]} (ms early)")
    dups = [s for s, ts in recvs.items()
            if len(ts) > 1 and not (restarted_at[0] and min(ts) < restarted_at[0])]
    if dups:
        fails.append(f"{len(dups)} delivered twice without a restart in between, e.g. {dups[:5]}")
    logs = serve.logs()
    seals, merges = logs.count("sealed bucket"), logs.count("merged buckets")
    if seals == 0:
        fails.append("no bucket sealed (serve logs)")
    if merges == 0:
        fails.append("no buckets merged (serve logs)")
    if "consumed ledgers deleted" not in logs:
        fails.append("no consumed ledger deleted (serve logs)")
    inspect = subprocess.run([a.binary, "inspect", "store", "--json", serve.data],
                             capture_output=True, text=True)
    if inspect.returncode != 0:
        fails.append(f"inspect store failed: {inspect.stderr.strip()[:200]}")
    else:
        store = json.loads(inspect.stdout)
        buckets = store["delayed_buckets"] + store["orphan_snapshots"]
        if buckets:
            fails.append(f"{len(buckets)} bucket snapshots left after everything was "
                         "acknowledged (not trimmed)")
    print(f"delayed-buckets: {len(sent)} confirmed, {len(recvs)} delivered, "
          f"{sum(len(v) - 1 for v in recvs.values())} redeliveries, {seals} seals, "
          f"{merges} merges, restart at {restarted_at[0]}")
    for f in fails:
        print(f"delayed-buckets: FAIL: {f}")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
