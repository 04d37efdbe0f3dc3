//! `pulsar-core inspect` and `pulsar-core verify` end to end: on a data dir
//! kept from `simulate`, on stores built (and then corrupted) through the
//! library, and on single artifact files. Also checks that both leave the
//! store file byte-for-byte unchanged (read-only open).

#![cfg(feature = "cli")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use prost::Message;
use roaring::RoaringBitmap;
use serde_json::Value;

use pulsar_core::delayed::snapshot::encode_bitmap;
use pulsar_core::delayed::{
    bucket_key, cut_segments, BucketSnapshotStorage, IndexEntry, RedbSnapshotStorage,
    SnapshotMetadata,
};
use pulsar_core::ledger::{LedgerConfig, LedgerStore, ManagedLedger, RedbStore};
use pulsar_core::pending_ack::record::encode_batch;
use pulsar_core::pending_ack::{AckType, AckedPosition, PendingAckRecord, TxnId};
use pulsar_core::proto::frame::{encode_entry_payload, encode_payload_frame};
use pulsar_core::proto::metadata::{MessageMetadata, SingleMessageMetadata};
use pulsar_core::proto::wire::{Command as WireCommand, CommandMessage, MessageIdData};
use pulsar_core::Position;

const BIN: &str = env!("CARGO_BIN_EXE_pulsar-core");
const TOPIC: &str = "persistent://public/default/t";

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .output()
        .expect("spawn pulsar-core")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn json_of(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout(o)))
}

fn store_file(dir: &Path) -> PathBuf {
    dir.join("pulsar-core.redb")
}

/// A store with a topic of 12 entries (ledgers of 5), cursor `sub` with
/// mark-delete 1:2, one committed bucket snapshot over ledgers 1..=2 (two
/// segments), and a pending-ack log with one open txn.
fn build_store(dir: &Path) {
    let store = RedbStore::open(store_file(dir)).unwrap();
    let dyn_store: Arc<dyn LedgerStore> = Arc::new(store.clone());
    let cfg = LedgerConfig {
        max_entries_per_ledger: 5,
        auto_skip_non_recoverable_data: false,
    };
    let ml = ManagedLedger::open(TOPIC, cfg.clone(), Arc::clone(&dyn_store)).unwrap();
    for i in 0..12u8 {
        ml.append(&[i]).unwrap();
    }
    let ledgers: Vec<i64> = ml.ledgers().iter().map(|(l, _)| *l).collect();
    let cursor = ml.open_cursor("sub").unwrap();
    cursor.mark_delete(Position::new(ledgers[0], 2)).unwrap();
    let snaps = RedbSnapshotStorage::new(store.clone(), TOPIC, "sub").unwrap();
    let idx = [
        (100, ledgers[0], 3),
        (100, ledgers[0], 4),
        (250, ledgers[1], 0),
    ];
    let segs = cut_segments(
        idx.iter().map(|&(t, l, e)| IndexEntry {
            timestamp: t,
            ledger_id: l,
            entry_id: e,
        }),
        100,
        -1,
    );
    assert_eq!(segs.len(), 2);
    let meta = SnapshotMetadata {
        metadata_list: segs.iter().map(|s| s.to_metadata()).collect(),
    };
    let protos: Vec<_> = segs.iter().map(|s| s.to_proto()).collect();
    snaps
        .create(&meta, &protos, &bucket_key(ledgers[0], ledgers[1]), &[])
        .unwrap();
    let pa = ManagedLedger::open(
        format!("{TOPIC}-sub__transaction_pending_ack"),
        cfg,
        Arc::clone(&dyn_store),
    )
    .unwrap();
    pa.open_cursor("__pending_ack_state").unwrap();
    let t = TxnId::new(1, 1);
    pa.append(
        &PendingAckRecord::individual_ack(
            t,
            vec![AckedPosition::whole(Position::new(ledgers[1], 1))],
        )
        .encode(),
    )
    .unwrap();
}

fn file_bytes(dir: &Path) -> Vec<u8> {
    std::fs::read(store_file(dir)).unwrap()
}

#[test]
fn verify_and_inspect_a_library_built_store_read_only() {
    let dir = tempfile::tempdir().unwrap();
    build_store(dir.path());
    let before = file_bytes(dir.path());
    let d = dir.path().to_str().unwrap();

    let v = run(&["verify", d]);
    assert!(
        v.status.success(),
        "{}{}",
        stdout(&v),
        String::from_utf8_lossy(&v.stderr)
    );
    assert!(
        stdout(&v).contains("1 buckets (3 delayed messages"),
        "{}",
        stdout(&v)
    );

    let i = run(&["inspect", "store", d, "--json"]);
    assert!(i.status.success());
    let j = json_of(&i);
    assert_eq!(j["opened"], "read-only");
    let b = &j["delayed_buckets"][0];
    assert_eq!(b["delayed_messages"], 3);
    assert_eq!(b["metadata"]["segments"].as_array().unwrap().len(), 2);
    assert_eq!(b["segments"][1]["all"][0], "250@2:0");
    let log = &j["pending_ack_logs"][0];
    assert_eq!(log["records"]["ACK"], 1);
    assert_eq!(
        log["pending_individual"]["(1,1)"].as_array().unwrap().len(),
        1
    );
    let topic = j["managed_ledgers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == TOPIC)
        .unwrap();
    assert_eq!(topic["stored_entries"], 12);
    assert!(topic["cursors"][0]["properties"]
        .as_object()
        .unwrap()
        .keys()
        .any(|k| k.starts_with("#pulsar.internal.delayed.bucket_")));
    // text form too
    let t = run(&["inspect", "store", d]);
    assert!(stdout(&t).contains("mark_delete:"), "{}", stdout(&t));

    assert_eq!(
        file_bytes(dir.path()),
        before,
        "inspect/verify must not write"
    );
}

#[test]
fn verify_lists_each_violation_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    build_store(dir.path());
    {
        let store = RedbStore::open(store_file(dir.path())).unwrap();
        let ledgers: Vec<i64> = store
            .load_ledger(TOPIC)
            .unwrap()
            .ledgers
            .keys()
            .copied()
            .collect();
        // a pending ack on a position the subscription already deleted, and
        // a mark-delete outside the topic's ledgers
        store
            .save_mark_delete(
                TOPIC,
                "sub",
                Position::new(ledgers[0], 2),
                &[(Position::new(ledgers[1], 0), Position::new(ledgers[1], 1))],
            )
            .unwrap();
        store
            .save_mark_delete(TOPIC, "other", Position::new(99, 0), &[])
            .unwrap();
        // an undecodable pending-ack log entry
        let pa = format!("{TOPIC}-sub__transaction_pending_ack");
        let next = store
            .load_ledger(&pa)
            .unwrap()
            .ledgers
            .iter()
            .next_back()
            .map(|(l, i)| (*l, i.entries))
            .unwrap();
        let garbage: &[u8] = &[0xff, 0xff, 0xff];
        store
            .append(
                &pa,
                &[pulsar_core::ledger::AppendSegment {
                    ledger_id: next.0,
                    first_entry_id: next.1,
                    payloads: &[garbage],
                }],
            )
            .unwrap();
        // a second bucket whose segment disagrees with its metadata bitmaps
        let snaps = RedbSnapshotStorage::new(store.clone(), TOPIC, "sub").unwrap();
        let segs = cut_segments(
            [IndexEntry {
                timestamp: 500,
                ledger_id: ledgers[2],
                entry_id: 0,
            }],
            100,
            -1,
        );
        let mut meta = segs[0].to_metadata();
        let mut bm = RoaringBitmap::new();
        bm.insert(1);
        meta.delayed_index_bit_map
            .insert(ledgers[2] as u64, encode_bitmap(&bm));
        snaps
            .create(
                &SnapshotMetadata {
                    metadata_list: vec![meta],
                },
                &[segs[0].to_proto()],
                &bucket_key(ledgers[2], ledgers[2]),
                &[],
            )
            .unwrap();
    }
    let v = run(&["verify", dir.path().to_str().unwrap()]);
    assert_eq!(v.status.code(), Some(1), "{}", stdout(&v));
    let out = stdout(&v);
    eprintln!("{out}");
    for needle in [
        "FAILED",
        "cursor persistent://public/default/t / other: mark-delete 99:0 is outside the ledgers",
        "which the subscription already acknowledged",
        "entry ",
        "indexes differ from its metadata bitmaps",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in:\n{out}");
    }
    let j = json_of(&run(&["verify", dir.path().to_str().unwrap(), "--json"]));
    assert_eq!(j["ok"], false);
    assert!(j["violations"].as_array().unwrap().len() >= 4);
}

#[test]
fn inspect_and_verify_a_data_dir_kept_from_simulate() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("data");
    let d = d.to_str().unwrap();
    let sim = run(&[
        "simulate",
        "--workload",
        // Transactional acks on the broker core: the run's in-memory store
        // is saved to the data dir at its end.
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/workloads/shared_delayed_txn_restarts.toml"
        ),
        "--messages",
        "200",
        "--data-dir",
        d,
        "--quiet",
    ]);
    assert!(sim.status.success(), "{}", stdout(&sim));
    let before = std::fs::read(Path::new(d).join("pulsar-core.redb")).unwrap();
    let v = run(&["verify", d]);
    assert!(v.status.success(), "{}", stdout(&v));
    let j = json_of(&run(&["inspect", "store", d, "--json"]));
    assert!(!j["pending_ack_logs"].as_array().unwrap().is_empty());
    assert!(j["managed_ledgers"].as_array().unwrap().len() >= 2);
    assert_eq!(
        std::fs::read(Path::new(d).join("pulsar-core.redb")).unwrap(),
        before
    );
}

#[test]
fn inspect_single_artifact_files() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, bytes: &[u8]| {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        p.to_str().unwrap().to_string()
    };
    // a MESSAGE frame with a 3-message batch, P = 2 (ack_set 0b101)
    let md = MessageMetadata {
        producer_name: "p".into(),
        sequence_id: 1,
        publish_time: 2,
        num_messages_in_batch: Some(3),
        deliver_at_time: Some(1_700_000_000_000),
        txnid_least_bits: Some(9),
        ..Default::default()
    };
    let msgs: Vec<_> = (0..3u8)
        .map(|i| {
            (
                SingleMessageMetadata {
                    payload_size: 1,
                    ..Default::default()
                },
                vec![i],
            )
        })
        .collect();
    let cmd = CommandMessage {
        consumer_id: 7,
        message_id: MessageIdData {
            ledger_id: 3,
            entry_id: 4,
            ..Default::default()
        },
        ack_set: vec![0b101],
        message_permits: Some(2),
        ..Default::default()
    };
    let frame = encode_payload_frame(
        &WireCommand::Message(cmd).into_base(),
        &encode_entry_payload(&md, &msgs),
    );
    let f = write("frame.bin", &frame);
    let j = json_of(&run(&["inspect", "frame", &f, "--json"]));
    assert_eq!(j["command"]["type"], "MESSAGE");
    assert_eq!(j["command"]["fields"]["message_permits"], 2);
    // every field the metadata carries is shown, absent ones are not
    let meta = &j["headers_and_payload"]["metadata"];
    assert_eq!(meta["deliver_at_time"], 1_700_000_000_000i64);
    assert_eq!(meta["txnid_least_bits"], 9);
    assert!(meta.get("txnid_most_bits").is_none() && meta.get("partition_key").is_none());
    assert_eq!(
        j["headers_and_payload"]["messages"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    assert!(j["headers_and_payload"]["checksum"]
        .as_str()
        .unwrap()
        .ends_with("(verified)"));
    let hex: String = frame.iter().map(|b| format!("{b:02x}")).collect();
    let h = json_of(&run(&["inspect", "frame", "--hex", &hex, "--json"]));
    assert_eq!(h, j);
    // a FLOW command as hex
    let flow = run(&["inspect", "command", "--hex", "08 0b 5a 04 08 01 10 64"]);
    assert!(stdout(&flow).contains("FLOW") && stdout(&flow).contains("message_permits: 100"));
    // bucket snapshot entries
    let segs = cut_segments(
        [IndexEntry {
            timestamp: 9,
            ledger_id: 0,
            entry_id: 5,
        }],
        10,
        -1,
    );
    let meta = SnapshotMetadata {
        metadata_list: vec![segs[0].to_metadata()],
    };
    let m = write("meta.bin", &meta.encode_to_vec());
    let j = json_of(&run(&["inspect", "snapshot-metadata", &m, "--json"]));
    assert_eq!(j["segments"][0]["entries_per_ledger"]["0"], 1);
    let s = write("seg.bin", &segs[0].to_proto().encode_to_vec());
    let j = json_of(&run(&["inspect", "snapshot-segment", &s, "--json"]));
    assert_eq!(j["all"][0], "9@0:5");
    // a batched pending-ack entry
    let t = TxnId::new(2, 3);
    let pa = write(
        "pa.bin",
        &encode_batch(&[
            PendingAckRecord::cumulative_ack(t, Position::new(3, 9)),
            PendingAckRecord::commit(t, AckType::Cumulative),
        ]),
    );
    let j = json_of(&run(&["inspect", "pending-ack", &pa, "--json"]));
    assert_eq!(j["records"][1]["op"], "COMMIT");
    // a roaring bitmap
    let mut bm = RoaringBitmap::new();
    bm.insert_range(10..13);
    let b = write("bm.bin", &encode_bitmap(&bm));
    let j = json_of(&run(&["inspect", "bitmap", &b, "--json"]));
    assert_eq!(j["values"], serde_json::json!([10, 11, 12]));
    // garbage: a typed error and exit 1, never a panic
    let g = write("garbage.bin", &[0xff; 40]);
    for kind in [
        "frame",
        "command",
        "snapshot-metadata",
        "snapshot-segment",
        "pending-ack",
        "bitmap",
    ] {
        let o = run(&["inspect", kind, &g]);
        assert_eq!(o.status.code(), Some(1), "{kind}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.starts_with("error: ") && !err.contains("panicked"),
            "{kind}: {err}"
        );
    }
    let o = run(&["inspect", "frame", "--hex", "0x0g"]);
    assert_eq!(o.status.code(), Some(1));
    let o = run(&["verify", g.as_str()]);
    assert_eq!(o.status.code(), Some(2), "not a store: cannot open");
}

/// `--hex` input with non-ASCII characters is a typed error (exit 1), not a
/// panic slicing the string inside a multi-byte character.
#[test]
fn inspect_hex_with_non_ascii_characters_is_a_typed_error() {
    for hex in ["aé0", "é0", "0a\u{00a0}0b", "08\u{2003}0b"] {
        let o = run(&["inspect", "command", "--hex", hex]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{hex:?}: {err}");
        assert!(
            err.starts_with("error: ") && !err.contains("panicked"),
            "{hex:?}: {err}"
        );
    }
}

/// A malformed entry payload is malformed input: `inspect payload` and
/// `inspect frame` print what decoded but exit 1 with an `error:` line, as
/// for every other artifact.
#[test]
fn inspect_malformed_payload_exits_1() {
    // truncated metadata size; a bad checksum
    for hex in ["00", "0e01deadbeef00000000"] {
        let o = run(&["inspect", "payload", "--hex", hex]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{hex}: {}", stdout(&o));
        assert!(err.starts_with("error: "), "{hex}: {err}");
    }
    // MessageMetadata {producer "p", sequence 7, publish 9, num_messages_in_batch 0}
    let o = run(&[
        "inspect",
        "payload",
        "--hex",
        "00000009 0a0170 1007 1809 5800",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("num_messages_in_batch 0"));
    // MESSAGE {consumer_id 1, message_id 3:4} whose payload's checksum is 0
    let frame = "00000021 0000000c 0809 4a08 0801120408031004 \
                 0e01 00000000 00000007 0a017010071809";
    let o = run(&["inspect", "frame", "--hex", frame, "--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let j: Value = serde_json::from_slice(&o.stdout).expect("partial output is JSON");
    assert_eq!(j["command"]["type"], "MESSAGE");
    assert!(String::from_utf8_lossy(&o.stderr).contains("checksum mismatch"));
    // the same frame with the right checksum decodes and exits 0
    let body = hex_bytes("00000007 0a017010071809");
    let crc = crc32c::crc32c(&body);
    let good = format!(
        "00000021 0000000c 0809 4a08 0801120408031004 0e01 {crc:08x} 00000007 0a017010071809"
    );
    let o = run(&["inspect", "frame", "--hex", &good]);
    assert!(o.status.success(), "{}", stdout(&o));
}

fn hex_bytes(h: &str) -> Vec<u8> {
    let h: String = h.chars().filter(|c| !c.is_whitespace()).collect();
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
        .collect()
}

/// A store file with corrupted bytes anywhere (redb pages, table data, keys)
/// is a typed error — inspect exits 1, verify 0, 1 or 2 — never a panic,
/// whichever layer (redb or the decoders) meets the damage first.
#[test]
fn corrupted_store_file_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    build_store(dir.path());
    let pristine = file_bytes(dir.path());
    let path = store_file(dir.path());
    let path = path.to_str().unwrap();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for case in 0..48 {
        let mut bytes = pristine.clone();
        let flips = [1, 8, 64][case % 3];
        for _ in 0..flips {
            let at = (next() % bytes.len() as u64) as usize;
            bytes[at] = next() as u8;
        }
        std::fs::write(path, &bytes).unwrap();
        for args in [
            vec!["verify", path],
            vec!["inspect", "store", path, "--json"],
        ] {
            let o = run(&args);
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(
                !err.contains("panicked") && matches!(o.status.code(), Some(0..=2)),
                "case {case} {args:?}: exit {:?}: {err}",
                o.status.code()
            );
            if o.status.code() == Some(0) && args[0] == "inspect" {
                serde_json::from_slice::<Value>(&o.stdout).expect("inspect --json prints JSON");
            }
        }
    }
}
