"""Hostile-peer probes against a `pulsar-core serve` of their own (own data
dir, log and permit ledger, a 1 s keep-alive), run by scenario.py before the
real clients start. Each probe records kind="probe" with ok and no reason
(its expected log line is checked here, in this server's log, not in the
scenario's serve-*.log files that check.py reads).

What they protect:
- a consumer that never reads its socket (with u32::MAX permits) stalls
  nothing but its own connection: the producer of its topic gets every
  SEND_RECEIPT at once, and the permit ledger of that incarnation balances
  (granted = debited + available, no overflow at 2 x u32::MAX);
- ack ids above i64::MAX get an ACK_RESPONSE with an error; a topic name
  above the server's bound gets CommandError InvalidTopicName; a producer id
  already open keeps its producer;
- a peer that never sends CONNECT, a peer idle after CONNECT (it gets the
  server's PING and never answers), a peer that ends inside a frame and a
  peer that floods commands without reading the replies, a connection above
  --max-connections: each is closed with its logged reason;
- after all of it the node still serves the real client, and SIGTERM exits 0.
"""
import json
import os
import signal
import socket
import struct
import subprocess
import threading
import time

import pulsar

from wire import (base, connect_frame, field, frame, read_frame, parse,
                  entry_payload)


def _conn(port, timeout=5):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(connect_frame())
    r = read_frame(s)
    if not r or r[0] != 3:
        raise RuntimeError(f"no CONNECTED: {r}")
    return s


def _closed_within(sock, limit):
    """Seconds until the server closes `sock` (reading whatever it sends), or None."""
    t0 = time.time()
    sock.settimeout(limit)
    try:
        while sock.recv(65536):
            pass
    except (ConnectionResetError, BrokenPipeError):
        pass
    except socket.timeout:
        return None
    return time.time() - t0


def _start(binary, workdir, port):
    log = open(os.path.join(workdir, "hostile-serve.log"), "w")
    proc = subprocess.Popen(
        [binary, "serve", "--data-dir", os.path.join(workdir, "hostile-data"),
         "--listen", f"127.0.0.1:{port}", "--keep-alive-secs", "1", "--max-connections", "16",
         "--permit-ledger", os.path.join(workdir, "hostile-ledger.jsonl")],
        stdout=log, stderr=log, env=dict(os.environ, RUST_LOG="info"))
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"hostile-probe serve exited with {proc.returncode}")
            time.sleep(0.05)
    raise RuntimeError("hostile-probe serve did not listen within 20 s")


def _stalled_consumer(port, topic):
    try:
        return _stalled_consumer_run(port, topic)
    except (socket.timeout, OSError) as e:
        return False, f"the node stopped answering others while a consumer did not read: {e!r}"


def _stalled_consumer_run(port, topic):
    stall = _conn(port)
    stall.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stall.sendall(frame(base(4, field(1, topic) + field(2, b"stall") + field(3, 1)
                              + field(4, 1) + field(5, 1) + field(13, 1))))
    if read_frame(stall)[0] != 13:
        return False, "subscribe refused"
    for _ in range(2):  # 2 x u32::MAX permits: the ledger must not overflow
        stall.sendall(frame(base(11, field(1, 1) + field(2, 0xFFFFFFFF))))
    prod = _conn(port, timeout=15)
    prod.sendall(frame(base(5, field(1, topic) + field(2, 1) + field(3, 2))))
    if read_frame(prod)[0] != 17:
        return False, "producer refused"
    t0 = time.time()
    try:
        for i in range(40):
            prod.sendall(frame(base(6, field(1, 1) + field(2, i)),
                               entry_payload(b"z" * (256 * 1024), i)))
    except socket.timeout:
        prod.close()
        stall.close()
        return False, f"the server stopped reading the producer's sends for 15 s (at send {i})"
    receipts = 0
    try:
        while receipts < 40:
            r = read_frame(prod)
            if r is None:
                break
            receipts += r[0] == 7
    except socket.timeout:
        pass
    took = time.time() - t0
    prod.close()
    stall.close()
    return receipts == 40 and took < 10, f"{receipts}/40 receipts in {took:.2f} s"


def _expect(sock, want_ty, check=None):
    r = read_frame(sock)
    return r is not None and r[0] == want_ty and (check is None or check(r[1]))


def run(binary, workdir, port, ev):
    """Runs the probes; returns the number that failed. A probe that raises
    (a socket timeout: the server stopped answering) is recorded as the
    failed probe "hostile-probes" with the error, and the server is killed."""
    proc = None
    try:
        proc = _start(binary, workdir, port)
        return _run(proc, workdir, port, ev)
    except Exception as e:  # every failure is a named probe failure
        ev.write(kind="probe", name="hostile-probes", ok=False, reason=None,
                 detail=repr(e), server="hostile")
        return 1
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()


def _run(proc, workdir, port, ev):
    failed = 0
    reasons = []  # substrings hostile-serve.log must hold, one close each

    def record(name, ok, detail="", reason=None):
        nonlocal failed
        failed += not ok
        if reason:
            reasons.append((name, reason))
        ev.write(kind="probe", name=name, ok=bool(ok), reason=None, detail=detail,
                 server="hostile")

    topic = b"persistent://public/default/hostile-stall"
    ok, detail = _stalled_consumer(port, topic)
    record("stalled-consumer-stalls-only-itself", ok, detail)

    s = _conn(port)
    s.sendall(frame(base(4, field(1, b"persistent://public/default/acks") + field(2, b"a")
                         + field(3, 1) + field(4, 1) + field(5, 1))))
    read_frame(s)
    big = (1 << 64) - 1
    ok = True
    for ack_type, request_id in ((0, 9), (1, 10)):  # individual, cumulative
        s.sendall(frame(base(10, field(1, 1) + field(2, ack_type)
                             + field(3, field(1, big) + field(2, big)) + field(8, request_id))))
        ok = ok and _expect(s, 38, lambda c: 4 in c and c.get(6) == [request_id])
    record("ack-ids-above-i64-max-individual-and-cumulative", ok)
    s.sendall(frame(base(4, field(1, b"x" * 2000) + field(2, b"s") + field(3, 1)
                         + field(4, 2) + field(5, 3))))
    record("topic-name-above-bound", _expect(s, 14, lambda c: c.get(2) == [17]))
    s.sendall(frame(base(5, field(1, b"pa") + field(2, 4) + field(3, 4) + field(4, b"first"))))
    first = read_frame(s)
    s.sendall(frame(base(5, field(1, b"pb") + field(2, 4) + field(3, 5) + field(4, b"second"))))
    record("duplicate-producer-id-keeps-the-open-producer",
           first is not None and first[0] == 17
           and _expect(s, 17, lambda c: c.get(2) == [b"first"] and c.get(1) == [5]))
    s.close()

    # Keep-alive (1 s): no CONNECT; CONNECT then silence (gets a PING first).
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    t = _closed_within(raw, 5)
    record("no-connect-closed-by-keep-alive", t is not None and t < 4, f"{t}",
           "no CONNECT within")
    idle = _conn(port)
    idle.settimeout(5)
    got_ping = _expect(idle, 18)
    t = _closed_within(idle, 5)
    record("idle-peer-pinged-then-closed", got_ping and t is not None, f"{t}",
           "of the server's PING")
    # A stream that ends inside a frame.
    s = _conn(port)
    s.sendall((1000).to_bytes(4, "big") + b"\0" * 10)
    s.close()
    time.sleep(0.1)
    record("stream-ends-inside-a-frame", True, "", "ended inside a frame")
    # Commands flooded without reading a reply: LOOKUP answers ~4x its size.
    # The flood is built before connecting, and the socket keeps its default
    # receive buffer: with a tiny one the kernel drops the server's segments
    # (the ACKs of the flood with them) while this thread sends, the flood
    # stalls for seconds, and keep-alive (1 s here) closes the connection
    # with another reason than the one this probe names.
    lookups = b"".join(frame(base(23, field(1, b"t") + field(2, i))) for i in range(20000))
    s = _conn(port)
    t0 = time.time()
    closed = False
    s.settimeout(5)
    try:
        while time.time() - t0 < 15:
            s.sendall(lookups)
    except (ConnectionResetError, BrokenPipeError, socket.timeout):
        closed = True
    s.close()
    record("flood-without-reading-closed", closed, f"{time.time() - t0:.1f} s",
           "does not read its socket")
    # Many connections reset in the middle of a frame.
    for i in range(100):
        x = socket.create_connection(("127.0.0.1", port), timeout=5)
        x.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        x.sendall(connect_frame() + (1 << 20).to_bytes(4, "big") + b"\1" * 100)
        x.close()

    # Connections above --max-connections (16) are closed at accept.
    time.sleep(0.2)
    held, refused_at = [], None
    for i in range(40):
        x = socket.create_connection(("127.0.0.1", port), timeout=2)
        x.sendall(connect_frame())
        if read_frame(x) is None:
            refused_at = i
            x.close()
            break
        held.append(x)
    for x in held:
        x.close()
    record("connections-above-max-closed-at-accept", refused_at is not None and refused_at <= 16,
           f"refused after {refused_at} open")
    if refused_at is not None:
        reasons.append(("connections-above-max-closed-at-accept", "--max-connections reached"))
    time.sleep(0.3)

    # The node still serves a real client.
    healthy = False
    try:
        c = pulsar.Client(f"pulsar://127.0.0.1:{port}", operation_timeout_seconds=10,
                          logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        p = c.create_producer("hostile-health")
        cons = c.subscribe("hostile-health", "h",
                           initial_position=pulsar.InitialPosition.Earliest)
        p.send(b"still serving")
        m = cons.receive(5000)
        cons.acknowledge(m)
        healthy = m.data() == b"still serving"
        c.close()
    except Exception as e:  # any client error fails the probe
        ev.write(kind="hostile_health_error", error=repr(e))
    record("real-client-served-after-the-abuse", healthy and proc.poll() is None)

    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = "timeout"
    record("sigterm-after-the-abuse-exits-0", rc == 0, f"rc={rc}")

    log = open(os.path.join(workdir, "hostile-serve.log"), errors="replace").read()
    record("no-panic", "panicked" not in log)
    closes = [l for l in log.splitlines()
              if "connection closed" in l and ("reason=" in l or "max-connections" in l)]
    for name, reason in reasons:
        hit = [l for l in closes if reason in l]
        record(f"{name}-reason-logged", bool(hit), reason)
        if hit:
            closes.remove(hit[0])
    balanced = True
    for line in open(os.path.join(workdir, "hostile-ledger.jsonl")):
        e = json.loads(line)
        if e["granted"] != e["debited"] + e["available"] or e["available"] > e["granted"]:
            balanced = False
    record("permit-ledger-balances-at-2x-u32-max", balanced)
    return failed
