#!/usr/bin/env python3
"""Disk-bounded soak: the official Pulsar Python client produces and
acknowledges for SECS seconds against `pulsar-core serve` with small ledgers
and trimming every second; `serve.redb` must stop growing (consumed ledgers
are deleted and redb reuses their pages).

    soak.py --binary B --workdir W [--secs S] [--payload BYTES]
    soak.py --check CSV        judge a recorded curve only
    soak.py --self-test CSV    the judge must reject a doctored, growing copy

Writes W/soak.csv: elapsed_s, produced, acked, produced_bytes, store_bytes
(one row a second). The curve is bounded when the largest file size in the
last half of the run is at most 2 x the largest in the first half (redb
grows its file by doubling a region: one doubling is allowed) and at least
2 x that largest size was produced (without deletion the file holds every
byte produced). The producer stays at most 5,000 messages ahead of the
acks (a steady produce/ack load). Every confirmed message must be acknowledged by the
end. Sizes come from the environment in CI (INTEROP_SOAK_SECS).
"""
import argparse
import csv
import os
import sys
import threading
import time

# redb grows its file by doubling a region and truncates free space at the
# end now and then: one doubling over the run is allowed.
GROWTH = 2.0
BACKLOG = 5000
TURNOVER = 2.0


def judge(rows):
    """rows: list of dicts with float values; returns a list of failures."""
    if len(rows) < 6:
        return [f"only {len(rows)} samples: run longer"]
    t_end = rows[-1]["elapsed_s"]
    first = [r["store_bytes"] for r in rows if r["elapsed_s"] < t_end / 2]
    last = [r["store_bytes"] for r in rows if r["elapsed_s"] >= t_end / 2]
    if not first or not last:
        return ["no samples in the first or last half"]
    fails = []
    if max(last) > GROWTH * max(first):
        fails.append(f"serve.redb still grows: {max(first):.0f} bytes at most in the first half, "
                     f"{max(last):.0f} in the last half (bound {GROWTH}x)")
    produced = rows[-1]["produced_bytes"]
    if produced < TURNOVER * max(last):
        fails.append(f"produced {produced:.0f} bytes, the file reached {max(last):.0f} in the "
                     f"last half: under {TURNOVER}x, consumed data was not deleted")
    return fails


def read_csv(path):
    with open(path) as f:
        return [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f)]


def self_test(path):
    """A doctored copy whose file grows with the data produced must fail."""
    rows = read_csv(path)
    if judge(rows):
        print("soak self-test: the recorded run itself fails the judge")
        return 1
    grown = [dict(r, store_bytes=r["store_bytes"] + r["produced_bytes"] / 2) for r in rows]
    if not judge(grown):
        print("soak self-test: FAIL: a growing file passed the judge")
        return 1
    print("soak self-test: a growing copy is rejected")
    return 0


def run(a):
    import pulsar
    from node import Serve

    os.makedirs(a.workdir, exist_ok=True)
    serve = Serve(a.binary, a.workdir, [
        "--ledger-max-entries", str(a.ledger_entries),
        "--retention-check-interval-secs", "1",
    ])
    serve.start()
    topic = f"persistent://public/default/soak-{int(time.time())}"
    client = pulsar.Client(serve.url, operation_timeout_seconds=30,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    consumer = client.subscribe(topic, "soak", consumer_type=pulsar.ConsumerType.Shared,
                                receiver_queue_size=500)
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=20,
                                      batching_max_publish_delay_ms=5,
                                      send_timeout_millis=30000)
    stats = {"produced": 0, "acked": 0, "bytes": 0, "failed": 0}
    lock = threading.Lock()
    stop = threading.Event()
    # Below the client's max_pending_messages (1000): a full queue fails
    # the send at once instead of waiting.
    in_flight = threading.Semaphore(500)
    payload = os.urandom(a.payload)

    def on_sent(res, _mid):
        with lock:
            if res == pulsar.Result.Ok:
                stats["produced"] += 1
                stats["bytes"] += len(payload)
            else:
                stats["failed"] += 1
        in_flight.release()

    def produce():
        # Steady produce/ack: at most BACKLOG messages ahead of the acks.
        while not stop.is_set():
            with lock:
                ahead = stats["produced"] - stats["acked"]
            if ahead > BACKLOG:
                time.sleep(0.005)
                continue
            if in_flight.acquire(timeout=1):
                producer.send_async(payload, on_sent)

    def consume():
        while True:
            try:
                m = consumer.receive(500)
            except pulsar.Timeout:
                if stop.is_set():
                    with lock:
                        if stats["acked"] >= stats["produced"]:
                            return
                continue
            consumer.acknowledge(m)
            with lock:
                stats["acked"] += 1

    threads = [threading.Thread(target=produce, daemon=True),
               threading.Thread(target=consume, daemon=True)]
    for t in threads:
        t.start()
    out = open(os.path.join(a.workdir, "soak.csv"), "w", newline="")
    w = csv.writer(out)
    w.writerow(["elapsed_s", "produced", "acked", "produced_bytes", "store_bytes"])
    t0 = time.time()
    while time.time() - t0 < a.secs:
        time.sleep(1)
        with lock:
            row = [round(time.time() - t0, 1), stats["produced"], stats["acked"], stats["bytes"],
                   os.path.getsize(serve.store)]
        w.writerow(row)
        out.flush()
    stop.set()
    threads[0].join(10)
    producer.flush()
    threads[1].join(60)
    with lock:
        done = dict(stats)
    consumer.close()
    producer.close()
    client.close()
    rc = serve.stop()
    out.close()
    fails = judge(read_csv(os.path.join(a.workdir, "soak.csv")))
    if done["acked"] < done["produced"]:
        fails.append(f"{done['produced']} messages confirmed, only {done['acked']} acknowledged")
    if done["failed"]:
        fails.append(f"{done['failed']} sends failed")
    if rc != 0:
        fails.append(f"serve exited {rc} on SIGTERM")
    if "consumed ledgers deleted" not in serve.logs():
        fails.append("serve never logged a consumed-ledger deletion")
    size = os.path.getsize(serve.store)
    print(f"soak: {a.secs}s, {done['produced']} messages ({done['bytes']} bytes) produced and "
          f"{done['acked']} acknowledged; serve.redb {size} bytes at the end")
    for f in fails:
        print(f"soak: FAIL: {f}")
    return 1 if fails else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary")
    ap.add_argument("--workdir")
    ap.add_argument("--secs", type=int, default=int(os.environ.get("INTEROP_SOAK_SECS", "30")))
    ap.add_argument("--payload", type=int, default=2048)
    ap.add_argument("--ledger-entries", type=int, default=50)
    ap.add_argument("--check")
    ap.add_argument("--self-test")
    a = ap.parse_args()
    if a.check:
        fails = judge(read_csv(a.check))
        for f in fails:
            print(f"soak: FAIL: {f}")
        sys.exit(1 if fails else 0)
    if a.self_test:
        sys.exit(self_test(a.self_test))
    if not a.binary or not a.workdir:
        ap.error("--binary and --workdir are required to run")
    sys.exit(run(a))


if __name__ == "__main__":
    main()
