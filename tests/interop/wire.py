"""Pulsar frames by hand for the raw-socket probes: protobuf fields,
`[total_size][command_size][BaseCommand][payload]` frames, a generic
decoder (tag -> list of values) and an entry payload without checksum."""
import socket
import time


def varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def field(tag, value):
    """A varint field for an int (taken mod 2^64), a length-delimited one for bytes."""
    if isinstance(value, int):
        return varint(tag << 3) + varint(value & ((1 << 64) - 1))
    return varint(tag << 3 | 2) + varint(len(value)) + value


def frame(cmd, payload=b""):
    return ((len(cmd) + 4 + len(payload)).to_bytes(4, "big") + len(cmd).to_bytes(4, "big")
            + cmd + payload)


def base(ty, inner):
    """BaseCommand of type `ty` carrying `inner` in field `ty`."""
    return field(1, ty) + field(ty, inner)


def connect_frame():
    return frame(base(2, field(1, b"interop-probe") + field(4, 19)))


def read_varint(buf, at):
    """(value, index after it) of the varint at `buf[at]`."""
    v, shift = 0, 0
    while True:
        b = buf[at]
        at += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, at


def parse(buf):
    """Protobuf bytes -> {tag: [values]} (varints as ints, the rest as bytes)."""
    out = {}
    at = 0
    while at < len(buf):
        key, at = read_varint(buf, at)
        tag, wt = key >> 3, key & 7
        if wt == 0:
            v, at = read_varint(buf, at)
        elif wt == 2:
            n, at = read_varint(buf, at)
            v, at = buf[at:at + n], at + n
        elif wt == 1:
            v, at = buf[at:at + 8], at + 8
        elif wt == 5:
            v, at = buf[at:at + 4], at + 4
        else:
            raise ValueError(f"wire type {wt}")
        out.setdefault(tag, []).append(v)
    return out


def read_frame(sock):
    """(type, fields of the inner command, payload), or None at end of stream."""
    def exact(n):
        buf = b""
        while len(buf) < n:
            try:
                chunk = sock.recv(n - len(buf))
            except ConnectionResetError:
                return None
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
    cmd = parse(body[4:4 + n])
    ty = cmd[1][0]
    return ty, (parse(cmd[ty][0]) if ty in cmd else {}), body[4 + n:]


def entry_payload(data, seq):
    """`[metadata size][MessageMetadata][payload]` (no checksum)."""
    md = field(1, b"probe") + field(2, seq) + field(3, int(time.time() * 1000))
    return len(md).to_bytes(4, "big") + md + data
