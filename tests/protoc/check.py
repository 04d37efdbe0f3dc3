"""Byte parity with protoc for every Pulsar message the crate writes on the
cursor, pending-ack and delivery paths (`bash .ci/check protoc`).

The fixtures below are built independently of the Rust code, from the
`.proto` transcriptions beside this file (proto2, Pulsar's field names,
numbers, types, labels and defaults), with the Python code protoc generates
(grpcio-tools' bundled protoc). For each fixture:

1. the generated code's bytes equal `protoc --encode --deterministic_output`'s
   bytes for the same message (text format in, protoc's C++ serializer out;
   map entries in ascending key order, where the Python runtime's order may
   differ: then the two must parse to the same message);
2. the bytes the crate's encoders produce (`examples/protoc_fixtures.rs`,
   `encode`) equal them byte for byte, and parse back in Python to the same
   message with every required field present;
3. the crate's decoders (`protoc_fixtures decode`) give back the fixture from
   protoc's bytes, and from the same messages with their repeated int64
   fields packed (`NAME+packed`) or their map entries in the Python
   runtime's order (`NAME+map_order`);
4. the crate's decoders refuse protoc's partial encodings of the fixtures
   with one required field left out (`NAME+missing_FIELD`).

Negative controls (the check must be able to fail): a Rust encoding with one
byte changed must be reported, `decode` must reject a file in which a
fixture carries another fixture's bytes, and `reject` must fail on a complete
message.

usage: check.py RUST_FIXTURES_BINARY
"""

import os
import subprocess
import sys
import tempfile

from google.protobuf import text_format
from grpc_tools import protoc

HERE = os.path.dirname(os.path.abspath(__file__))
PROTOS = [
    "ml_data_formats.proto",
    "pulsar_api.proto",
    "pending_ack.proto",
    "delayed_snapshot.proto",
]
BATCHED_PENDING_ACK_PREFIX = bytes([0x0E, 0x01, 0x00, 0x01])  # magic 0x0e01, version 1


def generate(out_dir):
    """Runs protoc (grpcio-tools) on the transcriptions; imports the result."""
    rc = protoc.main(["protoc", f"-I{HERE}", f"--python_out={out_dir}"] + PROTOS)
    if rc != 0:
        sys.exit(f"protoc: code generation failed (exit {rc})")
    sys.path.insert(0, out_dir)
    import delayed_snapshot_pb2 as dl  # noqa: E402
    import ml_data_formats_pb2 as ml  # noqa: E402
    import pending_ack_pb2 as pa  # noqa: E402
    import pulsar_api_pb2 as api  # noqa: E402

    return ml, api, pa, dl


def bitset_words(entries):
    """java.util.BitSet.toLongArray() of a set of entry ids (signed int64 words)."""
    if not entries:
        return []
    words = [0] * (max(entries) // 64 + 1)
    for e in entries:
        words[e // 64] |= 1 << (e % 64)
    return [w - (1 << 64) if w >= 1 << 63 else w for w in words]


def portable_roaring(values):
    """The portable 32-bit RoaringBitmap serialization of a small set (array
    containers only: at most 4096 values per 65536-value chunk)."""
    chunks = {}
    for v in sorted(set(values)):
        chunks.setdefault(v >> 16, []).append(v & 0xFFFF)
    assert all(len(c) <= 4096 for c in chunks.values())
    out = bytearray((12346).to_bytes(4, "little") + len(chunks).to_bytes(4, "little"))
    for key, lows in chunks.items():
        out += key.to_bytes(2, "little") + (len(lows) - 1).to_bytes(2, "little")
    offset = len(out) + 4 * len(chunks)
    for lows in chunks.values():
        out += offset.to_bytes(4, "little")
        offset += 2 * len(lows)
    for lows in chunks.values():
        for low in lows:
            out += low.to_bytes(2, "little")
    return bytes(out)


def runs(entries):
    """Maximal runs of consecutive ids as (first, last)."""
    out = []
    for e in sorted(entries):
        if out and out[-1][1] == e - 1:
            out[-1][1] = e
        else:
            out.append([e, e])
    return out


U64_MAX = (1 << 64) - 1
I64_MIN = -(1 << 63)


def fixtures(ml, api, pa, dl):
    """name -> (protobuf message, file, full message name, byte prefix)."""
    out = {}

    def pos(msg, ledger, entry):
        msg.ledgerId = ledger
        msg.entryId = entry

    # Mark-delete (3,4); ledger 3 deleted {6,7,8,10}; ledger 5 {0,1,63,64};
    # batch entries (3,5) with words [6,-1] and (3,9) fully acknowledged.
    deleted = {3: [6, 7, 8, 10], 5: [0, 1, 63, 64]}
    batches = [((3, 5), [6, -1]), ((3, 9), [])]
    props = [("a", 0), ("neg", -5)]

    def add_ranges(repeated):
        for ledger, entries in sorted(deleted.items()):
            for first, last in runs(entries):
                r = repeated.add()
                pos(r.lowerEndpoint, ledger, first - 1)  # open lower bound
                pos(r.upperEndpoint, ledger, last)

    def add_common(info, properties, batch_field):
        for name, value in properties:
            p = info.properties.add()
            p.name = name
            p.value = value
        for (ledger, entry), words in batches:
            b = getattr(info, batch_field).add()
            pos(b.position, ledger, entry)
            b.deleteSet.extend(words)

    m = ml.PositionInfo()
    pos(m, 0, 0)
    out["position_info/zero_mark_delete"] = m

    m = ml.PositionInfo()
    pos(m, 3, 4)
    add_ranges(m.individualDeletedMessages)
    add_common(m, props, "batchedEntryDeletionIndexInfo")
    out["position_info/ranges"] = m

    m = ml.PositionInfo()
    pos(m, 3, 4)
    add_common(m, props, "batchedEntryDeletionIndexInfo")
    for ledger, entries in sorted(deleted.items()):
        w = m.individualDeletedMessageRanges.add()
        w.key = ledger
        w.values.extend(bitset_words(entries))
    out["position_info/long_array"] = m

    m = ml.PositionInfo()
    pos(m, 0, -1)
    w = m.individualDeletedMessageRanges.add()
    w.key = 0
    w.values.extend(bitset_words(list(range(128)) + [130]))
    out["position_info/long_array_full_words"] = m

    m = ml.ManagedCursorInfo()
    m.cursorsLedgerId = -1
    m.markDeleteLedgerId = 3
    m.markDeleteEntryId = 4
    add_ranges(m.individualDeletedMessages)
    add_common(m, [("p", 1)], "batchedEntryDeletionIndexInfo")
    m.lastActive = 0
    out["managed_cursor_info/last_active_zero"] = m

    m = ml.ManagedCursorInfo()
    m.cursorsLedgerId = 0
    m.markDeleteLedgerId = 0
    m.markDeleteEntryId = 0
    out["managed_cursor_info/zero_mark_delete"] = m

    # Pending-ack log records (MLPendingAckStore's fields).
    def record(op, ack_type, most, least, metas=()):
        r = pa.PendingAckMetadataEntry()
        r.pending_ack_op = op
        r.ack_type = ack_type
        r.txnid_least_bits = least
        r.txnid_most_bits = most
        for ledger, entry, ack_set, batch_size in metas:
            md = r.pending_ack_metadata.add()
            md.ledgerId = ledger
            md.entryId = entry
            md.ack_set.extend(ack_set)
            if batch_size is not None:
                md.batch_size = batch_size
        return r

    individual = api.CommandAck.Individual
    cumulative = api.CommandAck.Cumulative
    # Batch of 70 at (2,3) with indexes 0 and 65 acknowledged: the set bits
    # are the indexes left unacknowledged.
    left = bitset_words([i for i in range(70) if i not in (0, 65)])
    records = {
        "pending_ack/individual_ack": record(
            pa.ACK, individual, 0, 0, [(1, 0, [], 0), (2, 3, left, 70)]
        ),
        "pending_ack/cumulative_ack": record(pa.ACK, cumulative, U64_MAX, 1, [(5, 6, [], None)]),
        "pending_ack/commit": record(pa.COMMIT, individual, 1, 2),
        "pending_ack/abort": record(pa.ABORT, cumulative, 0, 9),
    }
    out.update(records)
    batched = pa.BatchedPendingAckMetadataEntry()
    for r in records.values():
        batched.pending_ack_logs.add().CopyFrom(r)
    out["pending_ack/batched"] = batched

    # Delivery-path commands in their BaseCommand envelope.
    def message_id(msg, ledger, entry, **optional):
        msg.ledgerId = ledger
        msg.entryId = entry
        for k, v in optional.items():
            if k == "ack_set":
                msg.ack_set.extend(v)
            else:
                setattr(msg, k, v)

    c = api.BaseCommand(type=api.BaseCommand.MESSAGE)
    c.message.consumer_id = 0
    message_id(c.message.message_id, 0, 0)
    out["command/message_minimal"] = c

    c = api.BaseCommand(type=api.BaseCommand.MESSAGE)
    c.message.consumer_id = 7
    message_id(c.message.message_id, 12, 34, partition=-1)
    c.message.redelivery_count = 0
    c.message.ack_set.extend([5, I64_MIN])
    c.message.consumer_epoch = 0
    c.message.message_permits = 3
    out["command/message_batch"] = c

    c = api.BaseCommand(type=api.BaseCommand.MESSAGE)
    c.message.consumer_id = U64_MAX
    message_id(c.message.message_id, 1, 3)
    message_id(
        c.message.message_id.first_chunk_message_id,
        1,
        2,
        partition=0,
        batch_index=0,
        ack_set=[1],
        batch_size=0,
    )
    c.message.redelivery_count = 2
    c.message.message_permits = 1
    out["command/message_chunk"] = c

    for name, consumer, permits in [("flow_zero", 0, 0), ("flow_max", U64_MAX, (1 << 32) - 1)]:
        c = api.BaseCommand(type=api.BaseCommand.FLOW)
        c.flow.consumer_id = consumer
        c.flow.messagePermits = permits
        out[f"command/{name}"] = c

    c = api.BaseCommand(type=api.BaseCommand.ACK)
    c.ack.consumer_id = 1
    c.ack.ack_type = individual
    message_id(c.ack.message_id.add(), 3, 4)
    message_id(c.ack.message_id.add(), 3, 5, batch_index=2, ack_set=[0b1011], batch_size=4)
    c.ack.request_id = 0
    out["command/ack_individual"] = c

    c = api.BaseCommand(type=api.BaseCommand.ACK)
    c.ack.consumer_id = 0
    c.ack.ack_type = cumulative
    message_id(c.ack.message_id.add(), 9, 9)
    c.ack.validation_error = api.CommandAck.ChecksumMismatch
    c.ack.txnid_least_bits = 0
    c.ack.txnid_most_bits = U64_MAX
    out["command/ack_cumulative_txn"] = c

    # MessageMetadata: every field of PulsarApi.proto's (src/proto/metadata.rs),
    # explicit zero and default values on the wire, a negative int64.
    m = api.MessageMetadata(producer_name="p-1", sequence_id=U64_MAX, publish_time=1700000000000)
    m.properties.add(key="k", value="")
    m.properties.add(key="", value="v")
    m.replicated_from = "west"
    m.partition_key = "key-1"
    m.replicate_to.extend(["east", ""])
    m.compression = api.LZ4
    m.uncompressed_size = 0
    m.num_messages_in_batch = 3
    m.event_time = 0
    k = m.encryption_keys.add(key="rsa", value=bytes([0, 255]))
    k.metadata.add(key="alg", value="x")
    m.encryption_algo = ""
    m.encryption_param = bytes([1, 2, 3])
    m.schema_version = b""
    m.partition_key_b64_encoded = False
    m.ordering_key = bytes([0x80, 0])
    m.deliver_at_time = -1
    m.marker_type = 0
    m.txnid_least_bits = U64_MAX
    m.txnid_most_bits = 0
    m.highest_sequence_id = 7
    m.null_value = False
    m.uuid = "p-1-7"
    m.num_chunks_from_msg = 2
    m.total_chunk_msg_size = 2_000_000
    m.chunk_id = 0
    m.null_partition_key = True
    out["metadata/full"] = m
    out["metadata/required_zero"] = api.MessageMetadata(producer_name="", sequence_id=0, publish_time=0)
    # A transaction commit marker as the broker core writes it (proto::txn::txn_marker).
    m = api.MessageMetadata(producer_name="pulsar.txn.marker", sequence_id=5, publish_time=9)
    m.marker_type = 21
    m.txnid_least_bits = 5
    m.txnid_most_bits = 0
    out["metadata/txn_commit_marker"] = m

    # Responses `pulsar-core serve` writes.
    B = api.BaseCommand

    def serve(name, ty, field, **values):
        c = B(type=ty)
        getattr(c, field).SetInParent()
        for k, v in values.items():
            if isinstance(v, dict):
                message_id(getattr(getattr(c, field), k), **v)
            else:
                setattr(getattr(c, field), k, v)
        out[f"serve/{name}"] = c

    serve("connected", B.CONNECTED, "connected", server_version="pulsar-core",
          protocol_version=21, max_message_size=5 << 20)
    serve("partition_metadata_response", B.PARTITIONED_METADATA_RESPONSE,
          "partitionMetadataResponse", partitions=0, request_id=5,
          response=api.CommandPartitionedTopicMetadataResponse.Success)
    serve("lookup_response", B.LOOKUP_RESPONSE, "lookupTopicResponse",
          brokerServiceUrl="pulsar://127.0.0.1:6650",
          response=api.CommandLookupTopicResponse.Connect, request_id=0, authoritative=False)
    serve("producer_success", B.PRODUCER_SUCCESS, "producer_success", request_id=1,
          producer_name="p", last_sequence_id=-1, topic_epoch=3, producer_ready=False)
    serve("send_receipt_duplicate", B.SEND_RECEIPT, "send_receipt", producer_id=0, sequence_id=9,
          message_id={"ledger": 2**64 - 1, "entry": 2**64 - 1}, highest_sequence_id=0)
    serve("send_receipt", B.SEND_RECEIPT, "send_receipt", producer_id=0, sequence_id=0,
          message_id={"ledger": 3, "entry": 4}, highest_sequence_id=0)
    serve("send_error", B.SEND_ERROR, "send_error", producer_id=1, sequence_id=2,
          error=api.PersistenceError, message="persistence")
    serve("error", B.ERROR, "error", request_id=9, error=api.TopicNotFound, message="")
    serve("get_last_message_id_response", B.GET_LAST_MESSAGE_ID_RESPONSE,
          "getLastMessageIdResponse",
          last_message_id={"ledger": 1, "entry": 2, "partition": -1, "batch_index": 4},
          request_id=3, consumer_mark_delete_position={"ledger": 1, "entry": 1})
    # The last entry not a batch (batch_index -1, still on the wire) and a
    # mark-delete "before the first entry" (entry_id the unsigned form of -1).
    serve("get_last_message_id_response_no_batch", B.GET_LAST_MESSAGE_ID_RESPONSE,
          "getLastMessageIdResponse",
          last_message_id={"ledger": 1, "entry": 0, "partition": -1, "batch_index": -1},
          request_id=4, consumer_mark_delete_position={"ledger": 1, "entry": 2**64 - 1})
    serve("get_schema_response", B.GET_SCHEMA_RESPONSE, "getSchemaResponse", request_id=4,
          error_code=api.UnknownError, error_message="no schema")
    serve("ack_response", B.ACK_RESPONSE, "ackResponse", consumer_id=2, request_id=7)
    serve("pong", B.PONG, "pong")
    # Transactions: a transactional ack's response carries the txnid; the
    # coordinator's responses (success with explicit zero ids, and errors).
    serve("txn_ack_response", B.ACK_RESPONSE, "ackResponse", consumer_id=2,
          txnid_least_bits=0, txnid_most_bits=0, error=api.TransactionConflict,
          message="conflict", request_id=7)
    serve("tc_client_connect_response", B.TC_CLIENT_CONNECT_RESPONSE,
          "tcClientConnectResponse", request_id=0)
    serve("tc_client_connect_response_error", B.TC_CLIENT_CONNECT_RESPONSE,
          "tcClientConnectResponse", request_id=3,
          error=api.TransactionCoordinatorNotFound, message="")
    serve("new_txn_response", B.NEW_TXN_RESPONSE, "newTxnResponse", request_id=2,
          txnid_least_bits=1, txnid_most_bits=0)
    serve("add_partition_to_txn_response", B.ADD_PARTITION_TO_TXN_RESPONSE,
          "addPartitionToTxnResponse", request_id=3, txnid_least_bits=(1 << 64) - 1,
          txnid_most_bits=0, error=api.InvalidTxnStatus, message="not open")
    serve("add_subscription_to_txn_response", B.ADD_SUBSCRIPTION_TO_TXN_RESPONSE,
          "addSubscriptionToTxnResponse", request_id=4, txnid_least_bits=5,
          txnid_most_bits=0)
    serve("end_txn_response", B.END_TXN_RESPONSE, "endTxnResponse", request_id=5,
          txnid_least_bits=5, txnid_most_bits=0, error=api.TransactionNotFound,
          message="gone")

    # Delayed-delivery bucket snapshot: indexes (ts, ledger, entry)
    # (0,0,0) (5,0,3) (5,7,1) in segment 1 (10 ms step), (1000,2,70000) in 2.
    segments = [[(0, 0, 0), (5, 0, 3), (5, 7, 1)], [(1000, 2, 70000)]]
    meta = dl.SnapshotMetadata()
    for seg in segments:
        m = meta.metadata_list.add()
        m.min_schedule_timestamp = seg[0][0]
        m.max_schedule_timestamp = seg[-1][0]
        by_ledger = {}
        for _, ledger, entry in seg:
            by_ledger.setdefault(ledger, []).append(entry)
        for ledger, entries in by_ledger.items():
            m.delayed_index_bit_map[ledger] = portable_roaring(entries)
    out["delayed/metadata"] = meta
    meta = dl.SnapshotMetadata()
    m = meta.metadata_list.add()
    m.min_schedule_timestamp = 0
    m.max_schedule_timestamp = 0
    out["delayed/metadata_zero_timestamps"] = meta
    for i, seg in enumerate(segments, start=1):
        m = dl.SnapshotSegment()
        for ts, ledger, entry in seg:
            m.indexes.add(timestamp=ts, ledger_id=ledger, entry_id=entry)
        out[f"delayed/segment_{i}"] = m
    m = dl.SnapshotSegment()
    m.indexes.add(timestamp=1, ledger_id=2, entry_id=3, delayed_operation_type=dl.DelayedIndex.DELAY)
    out["delayed/segment_explicit_delay"] = m
    return out


def has_map(desc, seen=()):
    """Whether a message type holds a map field (at any depth)."""
    for f in desc.fields:
        t = f.message_type
        if t is None or t in seen:
            continue
        if t.GetOptions().map_entry or has_map(t, seen + (desc,)):
            return True
    return False


def file_of(msg):
    return msg.DESCRIPTOR.file.name


def prefix_of(name):
    return BATCHED_PENDING_ACK_PREFIX if name == "pending_ack/batched" else b""


def protoc_encode(msg):
    """protoc --encode of msg's text format: protoc's own serializer."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{HERE}",
            f"--encode={msg.DESCRIPTOR.full_name}",
            "--deterministic_output",
            file_of(msg),
        ],
        input=text_format.MessageToString(msg).encode(),
        capture_output=True,
        check=False,
    )
    if r.returncode != 0:
        sys.exit(f"protoc --encode={msg.DESCRIPTOR.full_name} failed: {r.stderr.decode()}")
    return r.stdout


def rust(binary, *args):
    r = subprocess.run([binary, *args], capture_output=True, text=True, check=False)
    return r.returncode, r.stdout, r.stderr


def compare(want, got, msgs):
    """Mismatch lines between protoc's bytes (want) and the crate's (got)."""
    bad = []
    if set(want) != set(got):
        bad.append(
            f"fixture sets differ: only protoc {sorted(set(want) - set(got))}, "
            f"only Rust {sorted(set(got) - set(want))}"
        )
    for name in sorted(set(want) & set(got)):
        if want[name] == got[name]:
            continue
        line = f"MISMATCH {name}:\n  protoc {want[name].hex()}\n  rust   {got[name].hex()}"
        try:
            back = type(msgs[name])()
            back.ParseFromString(got[name][len(prefix_of(name)):])
            line += "\n  rust bytes as protoc parses them:\n    " + text_format.MessageToString(
                back, as_one_line=True
            )
        except Exception as e:  # noqa: BLE001 - report any parse failure
            line += f"\n  protoc cannot parse the rust bytes: {e}"
        bad.append(line)
    return bad


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    binary = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        ml, api, pa, dl = generate(tmp)
        msgs = fixtures(ml, api, pa, dl)
        want = {}
        other_order = {}
        for name, msg in msgs.items():
            if not msg.IsInitialized():
                failures.append(f"fixture {name} lacks a required field")
            pc = prefix_of(name) + protoc_encode(msg)
            py = prefix_of(name) + msg.SerializeToString(deterministic=True)
            if py != pc:
                # Map entries are the one place where encoders may order
                # differently (the Python runtime writes keys descending);
                # the message must still be the same.
                same = type(msg).FromString(py[len(prefix_of(name)):]) == msg
                if not (has_map(msg.DESCRIPTOR) and same):
                    failures.append(f"generated code and protoc --encode differ on {name}")
                other_order[f"{name}+map_order"] = py
            want[name] = pc

        rc, out, err = rust(binary, "encode")
        if rc != 0:
            sys.exit(f"protoc check: {binary} encode failed (exit {rc}): {err}")
        got = {}
        for line in out.splitlines():
            name, hexed = line.split(" ", 1)
            got[name] = bytes.fromhex(hexed)
        failures += compare(want, got, msgs)
        # The crate's bytes parse in protoc's code to the fixture itself.
        for name in sorted(set(want) & set(got)):
            back = type(msgs[name])()
            try:
                back.ParseFromString(got[name][len(prefix_of(name)):])
            except Exception as e:  # noqa: BLE001
                failures.append(f"protoc cannot parse the crate's {name}: {e}")
                continue
            if back != msgs[name] or not back.IsInitialized():
                failures.append(f"the crate's {name} parses to a different message")

        # Packed variants of the PositionInfo fixtures (decoders accept both).
        packed = {}
        for name in ["position_info/ranges", "position_info/long_array",
                     "position_info/long_array_full_words"]:
            p = ml.PackedPositionInfo.FromString(want[name]).SerializeToString()
            if p == want[name]:
                failures.append(f"{name}+packed is not packed")
            packed[f"{name}+packed"] = p

        lines = [f"{n} {b.hex()}" for n, b in sorted({**want, **packed, **other_order}.items())]
        decode_file = os.path.join(tmp, "protoc.txt")
        with open(decode_file, "w") as f:
            f.write("\n".join(lines) + "\n")
        rc, out, err = rust(binary, "decode", decode_file)
        sys.stdout.write(out)
        if rc != 0:
            failures.append(f"the crate's decoders disagree with protoc's bytes:\n{err}")

        # Required fields left out (protoc's partial encoding): the crate's
        # decoders must refuse each with a typed error.
        def without(name, path, proto_required=True):
            m = type(msgs[name])()
            m.CopyFrom(msgs[name])
            *outer, field = path.split(".")
            target = m
            for step in outer:
                target = getattr(target, step)
                if not hasattr(target, "ClearField"):  # repeated: its first element
                    target = target[0]
            target.ClearField(field)
            if proto_required and m.IsInitialized():
                failures.append(f"{name} without {path} still has every required field")
            return prefix_of(name) + m.SerializePartialToString()

        partial = {
            f"{name}+missing_{path}": without(name, path, *rest)
            for name, path, *rest in [
                ("position_info/zero_mark_delete", "entryId"),
                ("position_info/ranges", "individualDeletedMessages.upperEndpoint"),
                ("position_info/ranges", "individualDeletedMessages.lowerEndpoint.ledgerId"),
                ("position_info/ranges", "properties.value"),
                ("position_info/ranges", "batchedEntryDeletionIndexInfo.position"),
                ("position_info/long_array", "individualDeletedMessageRanges.key"),
                ("managed_cursor_info/zero_mark_delete", "cursorsLedgerId"),
                ("pending_ack/individual_ack", "pending_ack_metadata.entryId"),
                # Optional in the schema, needed by every record (Pulsar's
                # replay reads it): a typed error too.
                ("pending_ack/commit", "pending_ack_op", False),
                ("pending_ack/batched", "pending_ack_logs.pending_ack_metadata.ledgerId"),
                ("command/flow_zero", "flow.messagePermits"),
                ("command/ack_individual", "ack.ack_type"),
                ("command/message_minimal", "message.message_id.entryId"),
                ("command/message_minimal", "type"),
                ("metadata/full", "publish_time"),
                ("metadata/full", "properties.value"),
                ("metadata/full", "encryption_keys.value"),
                ("metadata/full", "encryption_keys.metadata.key"),
                ("metadata/required_zero", "producer_name"),
                ("delayed/segment_1", "indexes.entry_id"),
                ("delayed/metadata", "metadata_list.min_schedule_timestamp"),
            ]
        }
        reject_file = os.path.join(tmp, "partial.txt")
        with open(reject_file, "w") as f:
            f.write("".join(f"{n} {b.hex()}\n" for n, b in sorted(partial.items())))
        rc, out, err = rust(binary, "reject", reject_file)
        # PROTOC_CHECK_VERBOSE=1: every rejection with the decoder's error.
        verbose = os.environ.get("PROTOC_CHECK_VERBOSE")
        sys.stdout.write(out if verbose else (out.splitlines() or [""])[-1] + "\n")
        if rc != 0:
            failures.append(f"the crate's decoders accepted a message lacking a required field:\n{err}")

        # Negative controls.
        name = "position_info/ranges"
        doctored = dict(got)
        doctored[name] = got[name][:-1] + bytes([got[name][-1] ^ 0x01])
        if not compare(want, doctored, msgs):
            failures.append("negative control: a changed byte was not reported")
        def run_one(mode, fixture, data):
            """Exit status of the crate's `mode` on one `fixture data` line."""
            path = os.path.join(tmp, f"{mode}-one.txt")
            with open(path, "w") as f:
                f.write(f"{fixture} {data.hex()}\n")
            return rust(binary, mode, path)[0]

        if run_one("decode", name, want["position_info/long_array_full_words"]) == 0:
            failures.append("negative control: decode accepted another fixture's bytes")
        if run_one("reject", name, want[name]) == 0:
            failures.append("negative control: reject refused a complete message")

    if failures:
        print("\n".join(failures))
        print(f"protoc check: {len(failures)} failure(s)")
        sys.exit(1)
    print(
        f"protoc check: {len(want)} fixtures byte-identical to protoc --encode "
        f"--deterministic_output (protoc's generated Python code agrees, map order aside); "
        f"{len(packed)} packed and {len(other_order)} map-reordered variants decoded; "
        f"{len(partial)} encodings lacking a required field rejected; "
        "negative controls caught"
    )


if __name__ == "__main__":
    main()
