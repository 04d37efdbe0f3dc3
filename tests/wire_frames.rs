//! Golden frames built byte by byte from Pulsar's binary-protocol rules, and
//! a decoder fuzz test (random and mutated bytes) over every public decoder
//! of the wire path.
//!
//! Case count: `PULSAR_CORE_FUZZ_CASES` (default 10 000 in a debug build,
//! 100 000 in release: `cargo test --release --test wire_frames`).
#![cfg(not(any(loom, feature = "shuttle")))]

use std::collections::BTreeMap;
use std::sync::Arc;

use prost::Message;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use pulsar_core::delayed::snapshot::{
    decode_bitmap, decode_metadata, decode_segment, SnapshotMetadata, SnapshotSegmentMetadata,
};
use pulsar_core::permits::client::{
    ClientConnection, ClientConsumer, ClientPermitError, CommandOutcomeKind, PermitProtocolError,
};
use pulsar_core::proto::frame::{
    self, decode_frame, decode_frame_prefix, encode_entry_payload, encode_simple_frame,
    parse_entry_payload, split_batch, FrameError, PayloadError, DEFAULT_MAX_FRAME_SIZE,
};
use pulsar_core::proto::metadata::{self, MessageMetadata, SingleMessageMetadata};
use pulsar_core::proto::presence::check_required;
use pulsar_core::proto::wire::{
    self, Command, CommandFlow, CommandMessage, MessageIdData, BASE_COMMAND,
};

/// Bitwise CRC32C (Castagnoli, reflected polynomial 0x82F63B78): the
/// reference the golden frames are checked against.
fn reference_crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn crc32c_matches_the_castagnoli_check_value() {
    // RFC 3720 B.4 / the CRC catalogue's check value of "123456789"
    assert_eq!(reference_crc32c(b"123456789"), 0xE306_9283);
    assert_eq!(frame::crc32c(b"123456789"), 0xE306_9283);
    let data: Vec<u8> = (0..=255u8).cycle().take(3000).collect();
    assert_eq!(frame::crc32c(&data), reference_crc32c(&data));
}

/// BaseCommand{type MESSAGE, message{consumer_id 1, message_id{ledgerId 3,
/// entryId 4}, ack_set [0b1011], message_permits 3}}.
const MESSAGE_COMMAND: [u8; 16] = [
    0x08, 0x09, // type = 9 (MESSAGE)
    0x4a, 0x0c, // field 9 (message), 12 bytes
    0x08, 0x01, //   consumer_id = 1
    0x12, 0x04, 0x08, 0x03, 0x10, 0x04, //   message_id {ledgerId 3, entryId 4}
    0x20, 0x0b, //   ack_set = [0b1011] (unpacked int64): indexes 0, 1, 3
    0x30, 0x03, //   message_permits = 3
];

/// MessageMetadata{producer_name "p", sequence_id 7, publish_time 1000,
/// num_messages_in_batch 4}.
const METADATA: [u8; 10] = [
    0x0a, 0x01, b'p', // producer_name
    0x10, 0x07, // sequence_id
    0x18, 0xe8, 0x07, // publish_time = 1000
    0x58, 0x04, // num_messages_in_batch = 4 (field 11)
];

/// `[metadata_size][MessageMetadata][4 × ([size 2][SingleMessageMetadata{payload_size 1}][byte])]`.
fn checksummed_body() -> Vec<u8> {
    let mut body = vec![0, 0, 0, METADATA.len() as u8];
    body.extend_from_slice(&METADATA);
    for i in 0..4u8 {
        body.extend_from_slice(&[0, 0, 0, 2, 0x18, 0x01, b'a' + i]);
    }
    assert_eq!(body.len(), 42);
    body
}

/// `[0x0e01][crc32c][body]`, optionally behind a broker-entry metadata
/// prefix `[0x0e02][size 4][BrokerEntryMetadata{broker_timestamp 5, index 9}]`.
fn headers_and_payload(broker_entry: bool) -> Vec<u8> {
    let body = checksummed_body();
    let mut out = Vec::new();
    if broker_entry {
        out.extend_from_slice(&[0x0e, 0x02, 0, 0, 0, 4, 0x08, 0x05, 0x10, 0x09]);
    }
    out.extend_from_slice(&[0x0e, 0x01]);
    out.extend_from_slice(&reference_crc32c(&body).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// `[total_size][command_size 16][MESSAGE_COMMAND][headers_and_payload]`.
fn golden_message_frame(broker_entry: bool) -> Vec<u8> {
    let hp = headers_and_payload(broker_entry);
    let total = 4 + MESSAGE_COMMAND.len() + hp.len();
    let mut out = (total as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&(MESSAGE_COMMAND.len() as u32).to_be_bytes());
    out.extend_from_slice(&MESSAGE_COMMAND);
    out.extend_from_slice(&hp);
    out
}

fn subscribed_consumer() -> (Arc<ClientConnection>, ClientConsumer) {
    let conn = Arc::new(ClientConnection::new(1));
    let mut c = ClientConsumer::subscribe(Arc::clone(&conn), 1, 100).unwrap();
    let inc = c.state().incarnation();
    c.subscribe_succeeded(inc).unwrap();
    conn.take_outbox();
    (conn, c)
}

#[test]
fn golden_message_frame_with_batch_payload_settles_exactly_p() {
    for broker_entry in [false, true] {
        let bytes = golden_message_frame(broker_entry);
        // [total_size 4][command_size 4][command 16][0x0e01 2][crc 4][body 42] (+ 10 prefix)
        assert_eq!(bytes.len(), if broker_entry { 82 } else { 72 });
        assert_eq!(
            &bytes[..4],
            if broker_entry {
                [0, 0, 0, 78]
            } else {
                [0, 0, 0, 68]
            }
        );

        // the codec reads it as the protocol lays it out
        let f = decode_frame(&bytes, DEFAULT_MAX_FRAME_SIZE).unwrap();
        let Command::Message(cmd) = &f.command else {
            panic!("{:?}", f.command)
        };
        assert_eq!(cmd.consumer_id, 1);
        assert_eq!((cmd.message_id.ledger_id, cmd.message_id.entry_id), (3, 4));
        assert_eq!(cmd.ack_set, vec![0b1011]);
        assert_eq!(cmd.message_permits, Some(3));
        let entry = parse_entry_payload(f.headers_and_payload.unwrap()).unwrap();
        // The broker-entry metadata is handed over as its own bytes:
        // BrokerEntryMetadata{broker_timestamp 5, index 9}.
        let bem: Option<&[u8]> = if broker_entry {
            Some(&[0x08, 0x05, 0x10, 0x09])
        } else {
            None
        };
        assert_eq!(entry.broker_entry_metadata, bem);
        assert_eq!(entry.checksum, Some(reference_crc32c(&checksummed_body())));
        assert_eq!(entry.metadata.num_messages_in_batch, Some(4));
        let msgs = split_batch(entry.payload, 4).unwrap();
        assert_eq!(
            msgs.iter().map(|m| m.payload[0]).collect::<Vec<_>>(),
            b"abcd"
        );

        // the encoder writes the same bytes
        if !broker_entry {
            let md = MessageMetadata::decode(&METADATA[..]).unwrap();
            let messages: Vec<_> = (0..4u8)
                .map(|i| {
                    (
                        SingleMessageMetadata {
                            payload_size: 1,
                            ..Default::default()
                        },
                        vec![b'a' + i],
                    )
                })
                .collect();
            let hp = encode_entry_payload(&md, &messages);
            assert_eq!(hp, headers_and_payload(false));
            assert_eq!(
                frame::encode_payload_frame(&Command::Message(cmd.clone()).into_base(), &hp),
                bytes
            );
        }

        // the client path: indexes 0, 1, 3 delivered, P = 3 settled exactly
        let (_conn, mut c) = subscribed_consumer();
        let out = c.handle_frame(&bytes, DEFAULT_MAX_FRAME_SIZE).unwrap();
        assert_eq!(
            out.kind,
            CommandOutcomeKind::Delivered {
                skipped: 0,
                failed_mid_batch: false
            }
        );
        assert_eq!((out.permits, out.delivered, out.returned), (3, 3, 0));
        let mut got = Vec::new();
        while let Some(m) = c.receive() {
            got.push((m.message_id.batch_index, m.payload.clone()));
            m.release_permit().unwrap();
        }
        assert_eq!(
            got,
            vec![
                (Some(0), b"a".to_vec()),
                (Some(1), b"b".to_vec()),
                (Some(3), b"d".to_vec())
            ]
        );
        assert_eq!(
            c.state().accumulated(),
            3,
            "exactly P returned to the incarnation"
        );
    }
}

#[test]
fn golden_frame_without_checksum_is_accepted() {
    // [metadata_size][metadata][payload] with no 0x0e01: Pulsar skips verification
    let hp = checksummed_body();
    let bytes =
        frame::encode_payload_frame(&wire::decode_base_command(&MESSAGE_COMMAND).unwrap().0, &hp);
    let (_conn, mut c) = subscribed_consumer();
    let out = c.handle_frame(&bytes, DEFAULT_MAX_FRAME_SIZE).unwrap();
    assert_eq!((out.permits, out.delivered, out.returned), (3, 3, 0));
}

#[test]
fn golden_flow_frame() {
    // BaseCommand{type FLOW (11), flow (field 11 = 0x5a){consumer_id 1, messagePermits 100}}
    let expected = [
        0, 0, 0, 12, 0, 0, 0, 8, 0x08, 0x0b, 0x5a, 0x04, 0x08, 0x01, 0x10, 0x64,
    ];
    let flow = Command::Flow(CommandFlow {
        consumer_id: 1,
        message_permits: 100,
    });
    assert_eq!(encode_simple_frame(&flow.clone().into_base()), expected);
    let f = decode_frame(&expected, DEFAULT_MAX_FRAME_SIZE).unwrap();
    assert_eq!(f.command, flow);
    assert_eq!(f.headers_and_payload, None);
}

#[test]
fn malformed_frames_are_typed_errors() {
    let good = golden_message_frame(false);
    let max = DEFAULT_MAX_FRAME_SIZE;
    // truncated anywhere
    for cut in 0..good.len() {
        assert!(
            matches!(
                decode_frame(&good[..cut], max),
                Err(FrameError::Truncated { .. })
            ),
            "cut at {cut}"
        );
    }
    // trailing bytes: total_size disagrees with the buffer
    let mut long = good.clone();
    long.push(0);
    assert_eq!(
        decode_frame(&long, max).err(),
        Some(FrameError::TotalSizeMismatch {
            total_size: good.len() as u32 - 4,
            actual: good.len() + 1 - 4,
        })
    );
    // but a stream decoder takes the first frame and reports its length
    let (_, used) = decode_frame_prefix(&long, max).unwrap();
    assert_eq!(used, good.len());
    // huge total_size: rejected before reading (no allocation from it)
    let huge = [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0];
    assert_eq!(
        decode_frame(&huge, max),
        Err(FrameError::FrameTooLarge {
            total_size: u32::MAX,
            max
        })
    );
    // command_size larger than the frame
    let mut cs = good.clone();
    cs[4..8].copy_from_slice(&1000u32.to_be_bytes());
    assert!(matches!(
        decode_frame(&cs, max),
        Err(FrameError::CommandSizeExceedsFrame {
            command_size: 1000,
            ..
        })
    ));
    // a MESSAGE without payload, a FLOW with one
    let mut no_payload = MESSAGE_COMMAND.to_vec();
    no_payload.splice(0..0, [0, 0, 0, 20, 0, 0, 0, 16]);
    assert!(matches!(
        decode_frame(&no_payload, max),
        Err(FrameError::UnexpectedPayload { .. })
    ));
    // bad checksum: one payload byte flipped
    let mut bad = good.clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    let f = decode_frame(&bad, max).unwrap();
    assert!(matches!(
        parse_entry_payload(f.headers_and_payload.unwrap()),
        Err(PayloadError::Checksum(FrameError::ChecksumMismatch { .. }))
    ));
    // wrong magic
    let mut magic = headers_and_payload(false);
    magic[1] = 0x03;
    assert_eq!(
        parse_entry_payload(&magic),
        Err(PayloadError::Checksum(FrameError::BadMagic(0x0e03)))
    );
    // metadata size past the end
    let mut ms = checksummed_body();
    ms[3] = 200;
    assert!(matches!(
        parse_entry_payload(&ms),
        Err(PayloadError::Metadata(FrameError::Truncated { .. }))
    ));
    // metadata without a required field (producer_name removed)
    let mut req = vec![0, 0, 0, 7];
    req.extend_from_slice(&METADATA[3..]);
    assert!(matches!(
        parse_entry_payload(&req),
        Err(PayloadError::Metadata(FrameError::Proto { .. }))
    ));
    // the client closes the connection on a malformed frame and settles nothing
    let (conn, mut c) = subscribed_consumer();
    let out = c.handle_frame(&cs, max).unwrap();
    assert_eq!((out.permits, out.delivered, out.returned), (0, 0, 0));
    assert!(matches!(
        out.kind,
        CommandOutcomeKind::ProtocolError(PermitProtocolError::MalformedFrame(_))
    ));
    assert!(conn.is_closed());
    // a well-formed non-MESSAGE frame is routed back, nothing settled
    let (_conn, mut c) = subscribed_consumer();
    let flow = encode_simple_frame(
        &Command::Flow(CommandFlow {
            consumer_id: 1,
            message_permits: 1,
        })
        .into_base(),
    );
    assert_eq!(
        c.handle_frame(&flow, max).unwrap_err(),
        ClientPermitError::UnexpectedCommand("FLOW")
    );
}

/// A whole frame whose `total_size` (0..=3) cannot hold its own
/// `command_size` field is malformed: a stream decoder must not be told
/// "truncated, read more", which would wait forever on bytes that already
/// arrived (Pulsar closes the connection on such a frame).
#[test]
fn frame_too_small_for_its_command_size_is_malformed_not_truncated() {
    let flow = encode_simple_frame(
        &Command::Flow(CommandFlow {
            consumer_id: 1,
            message_permits: 1,
        })
        .into_base(),
    );
    for total_size in 0u32..4 {
        let mut stream = total_size.to_be_bytes().to_vec();
        stream.extend(std::iter::repeat_n(0u8, total_size as usize));
        stream.extend_from_slice(&flow);
        let err = decode_frame_prefix(&stream, DEFAULT_MAX_FRAME_SIZE).unwrap_err();
        assert_eq!(
            err,
            FrameError::FrameTooSmall { total_size },
            "total_size {total_size}"
        );
        assert_eq!(
            decode_frame(&stream[..4 + total_size as usize], DEFAULT_MAX_FRAME_SIZE),
            Err(FrameError::FrameTooSmall { total_size })
        );
    }
    // a frame cut inside its size field is still truncated
    assert!(matches!(
        decode_frame_prefix(&[0, 0, 0], DEFAULT_MAX_FRAME_SIZE),
        Err(FrameError::Truncated { .. })
    ));
}

// ---------------------------------------------------------------------------
// fuzz
// ---------------------------------------------------------------------------

fn fuzz_cases() -> u64 {
    std::env::var("PULSAR_CORE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if cfg!(debug_assertions) {
            3_000
        } else {
            100_000
        })
}

fn seeds() -> Vec<Vec<u8>> {
    let meta = SnapshotMetadata {
        metadata_list: vec![SnapshotSegmentMetadata {
            delayed_index_bit_map: BTreeMap::from([(0, vec![0x3a, 0x30, 0, 0, 0, 0, 0, 0])]),
            max_schedule_timestamp: 9,
            min_schedule_timestamp: 3,
        }],
    };
    let cmd = CommandMessage {
        consumer_id: 1,
        message_id: MessageIdData {
            ledger_id: 3,
            entry_id: 4,
            ..Default::default()
        },
        ..Default::default()
    };
    vec![
        golden_message_frame(false),
        golden_message_frame(true),
        headers_and_payload(true),
        checksummed_body(),
        MESSAGE_COMMAND.to_vec(),
        cmd.encode_to_vec(),
        meta.encode_to_vec(),
        vec![0x0a, 0x06, 0x08, 1, 0x10, 2, 0x18, 3],
        encode_simple_frame(
            &Command::Flow(CommandFlow {
                consumer_id: 1,
                message_permits: 100,
            })
            .into_base(),
        ),
        pulsar_core::pending_ack::record::encode_batch(&[
            pulsar_core::pending_ack::PendingAckRecord::commit(
                pulsar_core::pending_ack::TxnId::new(1, 2),
                pulsar_core::pending_ack::AckType::Individual,
            ),
        ]),
    ]
}

fn mutate(rng: &mut ChaCha8Rng, seed: &[u8]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..rng.random_range(1..4) {
        match rng.random_range(0..5) {
            0 if !v.is_empty() => {
                let i = rng.random_range(0..v.len());
                v[i] ^= 1 << rng.random_range(0..8);
            }
            1 if !v.is_empty() => {
                let i = rng.random_range(0..v.len());
                v[i] = rng.random();
            }
            2 => {
                let i = rng.random_range(0..=v.len());
                v.insert(i, rng.random());
            }
            3 if !v.is_empty() => {
                let i = rng.random_range(0..v.len());
                v.truncate(i);
            }
            _ if v.len() >= 4 => {
                // a random big-endian size at a random offset
                let i = rng.random_range(0..=v.len() - 4);
                let n: u32 = if rng.random() {
                    rng.random()
                } else {
                    rng.random_range(0..64)
                };
                v[i..i + 4].copy_from_slice(&n.to_be_bytes());
            }
            _ => v.push(rng.random()),
        }
    }
    v
}

/// Every public decoder on one input: never a panic; the client settles
/// either nothing (protocol error, connection closed) or exactly P.
fn exercise(bytes: &[u8], consumer: &mut Option<(Arc<ClientConnection>, ClientConsumer)>) {
    let max = 64 * 1024;
    if let Ok(f) = decode_frame(bytes, max) {
        if let Some(hp) = f.headers_and_payload {
            if let Ok(e) = parse_entry_payload(hp) {
                let _ = split_batch(e.payload, e.metadata.batch_size().unwrap_or(1).min(1024));
            }
        }
    }
    let _ = decode_frame_prefix(bytes, max);
    if let Ok(e) = parse_entry_payload(bytes) {
        let _ = split_batch(e.payload, 3);
    }
    let _ = frame::read_batch_message_header(bytes, 0);
    let _ = wire::decode_base_command(bytes);
    let _ = wire::decode_command_message(bytes);
    let _ = wire::decode_command_flow(bytes);
    let _ = wire::decode_message_id(bytes);
    let _ = metadata::decode_message_metadata(bytes);
    let _ = metadata::decode_single_message_metadata(bytes);
    let _ = check_required(&BASE_COMMAND, bytes);
    let _ = decode_metadata(1, bytes);
    let _ = decode_segment(1, 1, bytes);
    let _ = decode_bitmap(1, bytes);
    let _ = pulsar_core::pending_ack::record::decode_entry(pulsar_core::Position::new(1, 0), bytes);

    let (conn, c) = consumer.get_or_insert_with(subscribed_consumer);
    let before = c.state().accumulated();
    match c.handle_frame(bytes, max) {
        Ok(out) => {
            if let CommandOutcomeKind::ProtocolError(_) = out.kind {
                assert_eq!((out.permits, out.delivered, out.returned), (0, 0, 0));
                assert!(conn.is_closed());
            } else if out.kind != CommandOutcomeKind::StaleIncarnation {
                assert_eq!(out.delivered + out.returned, out.permits, "{out:?}");
                // what the command returned is in the accumulator or was
                // drained into a Flow at the threshold
                let flowed: u64 = conn
                    .flush_flows()
                    .written
                    .iter()
                    .map(|(_, p)| u64::from(*p))
                    .sum();
                assert_eq!(
                    c.state().accumulated() + flowed,
                    before + u64::from(out.returned)
                );
            }
        }
        Err(ClientPermitError::UnexpectedCommand(_))
        | Err(ClientPermitError::WrongConsumer { .. }) => {
            assert_eq!(c.state().accumulated(), before, "nothing settled");
        }
        Err(e) => panic!("unexpected error {e:?}"),
    }
    // keep the consumer small and open: drop delivered messages, reset on close
    // or when the accumulator nears the Flow threshold
    while c.receive().is_some() {}
    if conn.is_closed() || c.state().accumulated() > 40 {
        *consumer = None;
    }
}

#[test]
fn decoders_never_panic_on_random_and_mutated_bytes() {
    let cases = fuzz_cases();
    let seeds = seeds();
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed_0013);
    let mut consumer = None;
    let mut accepted_frames = 0u64;
    for case in 0..cases {
        let bytes = if case % 4 == 0 {
            let len = rng.random_range(0..96);
            (0..len).map(|_| rng.random()).collect::<Vec<u8>>()
        } else {
            let seed = &seeds[rng.random_range(0..seeds.len())];
            mutate(&mut rng, seed)
        };
        if decode_frame(&bytes, 64 * 1024).is_ok() {
            accepted_frames += 1;
        }
        exercise(&bytes, &mut consumer);
    }
    // the mutations stay close enough to real frames to reach the deep paths
    assert!(
        accepted_frames > cases / 100,
        "{accepted_frames} of {cases}"
    );
    eprintln!("fuzz: {cases} cases, {accepted_frames} decoded as frames");
}

/// The default frame limit is Pulsar's: `maxMessageSize` (5 MiB) plus
/// `Commands.MESSAGE_SIZE_FRAME_PADDING` (10 KiB) = 5,253,120 bytes. A frame
/// whose `total_size` is the limit passes the size check (it is then only
/// short of bytes); one byte more is refused before anything is read.
#[test]
fn default_frame_limit_is_pulsars_max_message_size_plus_padding() {
    assert_eq!(DEFAULT_MAX_FRAME_SIZE, 5_253_120);
    let at_limit = (DEFAULT_MAX_FRAME_SIZE as u32).to_be_bytes();
    assert!(matches!(
        decode_frame_prefix(&at_limit, DEFAULT_MAX_FRAME_SIZE),
        Err(FrameError::Truncated { .. })
    ));
    let over = (DEFAULT_MAX_FRAME_SIZE as u32 + 1).to_be_bytes();
    assert!(matches!(
        decode_frame_prefix(&over, DEFAULT_MAX_FRAME_SIZE),
        Err(FrameError::FrameTooLarge {
            total_size: 5_253_121,
            max: 5_253_120
        })
    ));
}

/// A frame of `total_size` 4 holds a command size and nothing else: it is
/// well framed (4 is the smallest such frame; below it is `FrameTooSmall`),
/// and its empty `BaseCommand`, which lacks the required `type`, is refused
/// as a protobuf error.
#[test]
fn a_frame_of_total_size_4_is_framed_and_its_empty_command_refused() {
    let frame = [0, 0, 0, 4, 0, 0, 0, 0];
    assert!(matches!(
        decode_frame(&frame, DEFAULT_MAX_FRAME_SIZE),
        Err(FrameError::Proto {
            what: "BaseCommand",
            ..
        })
    ));
    assert_eq!(
        decode_frame(&[0, 0, 0, 3, 0, 0, 0], DEFAULT_MAX_FRAME_SIZE).err(),
        Some(FrameError::FrameTooSmall { total_size: 3 })
    );
}

/// A message that is not batched (no `num_messages_in_batch`) is encoded as
/// Pulsar's producer writes it: `[0x0e01][crc32c][metadata_size][metadata]`
/// and the payload bytes as they are, no `SingleMessageMetadata` framing.
#[test]
fn a_non_batched_message_is_encoded_with_its_payload_as_is() {
    // MessageMetadata{producer_name "p", sequence_id 7, publish_time 1000}.
    let md_bytes = &METADATA[..8];
    let md = MessageMetadata::decode(md_bytes).unwrap();
    assert_eq!(md.num_messages_in_batch, None);
    let bytes = encode_entry_payload(
        &md,
        &[(SingleMessageMetadata::default(), b"hello".to_vec())],
    );
    let mut body = vec![0, 0, 0, 8];
    body.extend_from_slice(md_bytes);
    body.extend_from_slice(b"hello");
    let mut expected = vec![0x0e, 0x01];
    expected.extend_from_slice(&reference_crc32c(&body).to_be_bytes());
    expected.extend_from_slice(&body);
    assert_eq!(bytes, expected);
    let entry = parse_entry_payload(&bytes).unwrap();
    assert_eq!(entry.payload, b"hello");
    assert_eq!(entry.metadata, md);
}

/// The broker-entry metadata prefix is `[0x0e02][size u32][bytes]` in front
/// of the entry payload, and parsing hands both back unchanged.
#[test]
fn broker_entry_metadata_prefix_round_trips() {
    let bem = [0x08, 0x05, 0x10, 0x09]; // BrokerEntryMetadata{broker_timestamp 5, index 9}
    let payload = headers_and_payload(false);
    let bytes = frame::with_broker_entry_metadata(&bem, &payload);
    assert_eq!(bytes, headers_and_payload(true));
    let entry = parse_entry_payload(&bytes).unwrap();
    assert_eq!(entry.broker_entry_metadata, Some(&bem[..]));
    assert_eq!(entry.checksum, Some(reference_crc32c(&checksummed_body())));
    assert_eq!(entry.metadata.num_messages_in_batch, Some(4));
}

/// A batched message may have an empty payload (`payload_size` 0); a
/// negative `payload_size` is refused.
#[test]
fn batch_message_payload_size_zero_is_valid_and_negative_refused() {
    // [size 2][SingleMessageMetadata{payload_size 0}] then [size 2][{payload_size 1}]["a"]
    let batch = [0, 0, 0, 2, 0x18, 0x00, 0, 0, 0, 2, 0x18, 0x01, b'a'];
    let msgs = split_batch(&batch, 2).unwrap();
    assert_eq!(msgs.len(), 2);
    assert!(msgs[0].payload.is_empty());
    assert_eq!(msgs[1].payload, b"a");
    // payload_size -1: varint of -1 as int32 (ten bytes)
    let mut neg = vec![0, 0, 0, 11, 0x18];
    neg.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
    assert_eq!(
        frame::read_batch_message_header(&neg, 0).err(),
        Some(FrameError::NegativePayloadSize(-1))
    );
}
