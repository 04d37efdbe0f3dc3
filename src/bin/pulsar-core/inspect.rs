//! `pulsar-core inspect`: decode Pulsar artifacts (frames, commands, entry
//! payloads, bucket snapshots, pending-ack log entries, roaring bitmaps) and
//! kept `--data-dir` stores (opened read-only) to text or JSON.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::{json, Map, Value};

use pulsar_core::delayed::snapshot::{
    decode_bitmap, decode_metadata, decode_segment, decode_segment_bitmaps, parse_bucket_key,
    SnapshotMetadata, SnapshotSegment,
};
use pulsar_core::delayed::RedbSnapshotStorage;
use pulsar_core::ledger::{RedbStore, StoreContents};
use pulsar_core::pending_ack::record::decode_entry;
use pulsar_core::pending_ack::{AckType, PendingAckOp, PendingAckRecord, PendingAckState};
use pulsar_core::proto::frame::{self, DEFAULT_MAX_FRAME_SIZE};
use pulsar_core::proto::metadata::MessageMetadata;
use pulsar_core::proto::wire::{self, Command, MessageIdData};
use pulsar_core::Position;

/// The store file inside a data dir (as `simulate` writes it).
pub const STORE_FILE: &str = "pulsar-core.redb";
/// The store file `pulsar-core serve` keeps in its data dir.
pub const SERVE_STORE_FILE: &str = "serve.redb";
/// Suffix of a pending-ack log's managed ledger name (`{topic}-{sub}` + it).
pub const PENDING_ACK_SUFFIX: &str = "__transaction_pending_ack";
/// The pending-ack log's own cursor (its mark-delete is where replay starts).
pub const PENDING_ACK_CURSOR: &str = "__pending_ack_state";

#[derive(Args, Debug)]
pub struct InspectArgs {
    #[command(subcommand)]
    what: What,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
}

/// Where an artifact's bytes come from.
#[derive(Args, Debug)]
pub struct Input {
    /// File holding the raw bytes.
    file: Option<PathBuf>,
    /// The bytes as hex (whitespace and a leading 0x allowed) instead of a file.
    #[arg(long, conflicts_with = "file")]
    hex: Option<String>,
}

#[derive(Subcommand, Debug)]
enum What {
    /// A whole frame: [total_size][command_size][BaseCommand][headers_and_payload].
    Frame(Input),
    /// A BaseCommand without framing.
    Command(Input),
    /// An entry payload (headersAndPayload): [0x0e02 …]? [0x0e01][crc32c]? [size][MessageMetadata][payload].
    Payload(Input),
    /// Entry 0 of a bucket snapshot (SnapshotMetadata).
    SnapshotMetadata(Input),
    /// Entry i ≥ 1 of a bucket snapshot (SnapshotSegment).
    SnapshotSegment(Input),
    /// A pending-ack log entry (single or batched).
    PendingAck(Input),
    /// A portable (32-bit) roaring bitmap.
    Bitmap(Input),
    /// A kept data dir (or its store file), opened read-only.
    Store(StoreArgs),
}

#[derive(Args, Debug)]
struct StoreArgs {
    /// The data dir (holding pulsar-core.redb, or serve.redb of `serve`) or the store file.
    dir: PathBuf,
}

pub fn read_input(input: &Input) -> Result<Vec<u8>, String> {
    match (&input.file, &input.hex) {
        (_, Some(h)) => parse_hex(h),
        (Some(f), None) => {
            std::fs::read(f).map_err(|e| format!("cannot read {}: {e}", f.display()))
        }
        (None, None) => Err("give a FILE or --hex".into()),
    }
}

fn parse_hex(h: &str) -> Result<Vec<u8>, String> {
    let clean: String = h
        .trim()
        .trim_start_matches("0x")
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    // every char is then one byte, so the two-digit slices below lie on
    // char boundaries
    if let Some((i, c)) = clean.char_indices().find(|(_, c)| !c.is_ascii_hexdigit()) {
        return Err(format!("invalid hex digit {c:?} at offset {i}"));
    }
    if !clean.len().is_multiple_of(2) {
        return Err(format!(
            "hex input has an odd number of digits ({})",
            clean.len()
        ));
    }
    (0..clean.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(&clean[i..i + 2], 16)
                .map_err(|_| format!("invalid hex digits {:?} at offset {i}", &clean[i..i + 2]))
        })
        .collect()
}

pub fn run(args: InspectArgs) -> ExitCode {
    let result = match &args.what {
        What::Frame(i) => read_input(i).and_then(|b| inspect_frame(&b)),
        What::Command(i) => read_input(i).and_then(|b| {
            wire::decode_base_command(&b)
                .map(|(_, c)| command_json(&c))
                .map_err(|e| e.to_string())
        }),
        What::Payload(i) => read_input(i).map(|b| payload_json(&b)),
        What::SnapshotMetadata(i) => read_input(i).and_then(|b| {
            decode_metadata(0, &b)
                .map(|m| snapshot_metadata_json(&m))
                .map_err(|e| e.to_string())
        }),
        What::SnapshotSegment(i) => read_input(i).and_then(|b| {
            decode_segment(0, 1, &b)
                .map(|s| segment_json(&s))
                .map_err(|e| e.to_string())
        }),
        What::PendingAck(i) => read_input(i).and_then(|b| {
            decode_entry(Position::new(-1, -1), &b)
                .map(|r| json!({ "records": r.iter().map(record_json).collect::<Vec<_>>() }))
                .map_err(|e| e.to_string())
        }),
        What::Bitmap(i) => read_input(i).and_then(|b| {
            decode_bitmap(0, &b)
                .map(|bm| json!({ "cardinality": bm.len(), "values": bm.iter().collect::<Vec<_>>() }))
                .map_err(|e| e.to_string())
        }),
        What::Store(s) => load_store(&s.dir).map(|st| st.to_json()),
    };
    match result {
        Ok(v) => {
            if args.json {
                println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            } else {
                print!("{}", render_text(&v));
            }
            // a malformed entry payload is shown as far as it decodes, and is
            // still malformed input
            let payload = match &args.what {
                What::Payload(_) => Some(&v),
                What::Frame(_) => v.get("headers_and_payload"),
                _ => None,
            };
            match payload.and_then(payload_problem) {
                Some(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(1)
                }
                None => ExitCode::SUCCESS,
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

// ---------------------------------------------------------------- artifacts

fn inspect_frame(bytes: &[u8]) -> Result<Value, String> {
    let f = frame::decode_frame(bytes, DEFAULT_MAX_FRAME_SIZE).map_err(|e| e.to_string())?;
    let mut v = json!({
        "total_size": bytes.len() - 4,
        "command": command_json(&f.command),
    });
    if let Some(hp) = f.headers_and_payload {
        v["headers_and_payload"] = payload_json(hp);
    }
    Ok(v)
}

fn id_json(id: &MessageIdData) -> Value {
    let mut v = json!({ "ledger_id": id.ledger_id, "entry_id": id.entry_id });
    if let Some(p) = id.partition {
        v["partition"] = json!(p);
    }
    if let Some(b) = id.batch_index {
        v["batch_index"] = json!(b);
    }
    if !id.ack_set.is_empty() {
        v["ack_set"] = json!(id.ack_set);
    }
    if let Some(b) = id.batch_size {
        v["batch_size"] = json!(b);
    }
    v
}

pub fn command_json(c: &Command) -> Value {
    let body = match c {
        Command::Message(m) => json!({
            "consumer_id": m.consumer_id,
            "message_id": id_json(&m.message_id),
            "redelivery_count": m.redelivery_count,
            "ack_set": m.ack_set,
            "consumer_epoch": m.consumer_epoch,
            "message_permits": m.message_permits,
        }),
        Command::Flow(f) => {
            json!({ "consumer_id": f.consumer_id, "message_permits": f.message_permits })
        }
        Command::Subscribe(s) => json!({
            "topic": s.topic, "subscription": s.subscription, "sub_type": s.sub_type,
            "consumer_id": s.consumer_id, "request_id": s.request_id, "consumer_name": s.consumer_name,
        }),
        Command::Ack(a) => json!({
            "consumer_id": a.consumer_id, "ack_type": a.ack_type,
            "message_id": a.message_id.iter().map(id_json).collect::<Vec<_>>(),
            "validation_error": a.validation_error, "request_id": a.request_id,
        }),
        Command::Success(s) => json!({ "request_id": s.request_id }),
        Command::CloseConsumer(c) => {
            json!({ "consumer_id": c.consumer_id, "request_id": c.request_id })
        }
        Command::RedeliverUnacknowledgedMessages(r) => json!({
            "consumer_id": r.consumer_id,
            "message_ids": r.message_ids.iter().map(id_json).collect::<Vec<_>>(),
            "consumer_epoch": r.consumer_epoch,
        }),
        Command::Ping | Command::Pong => json!({}),
        Command::Other(t) => {
            json!({ "type_value": t, "note": "command type not declared by pulsar-core; fields skipped" })
        }
    };
    json!({ "type": c.type_name(), "fields": body })
}

/// The required fields and `num_messages_in_batch`, then every other field
/// the entry carries (absent ones left out; bytes as hex).
fn metadata_json(m: &MessageMetadata) -> Value {
    let mut v = json!({
        "producer_name": m.producer_name,
        "sequence_id": m.sequence_id,
        "publish_time": m.publish_time,
        "num_messages_in_batch": m.num_messages_in_batch,
    });
    let hex = |b: &Vec<u8>| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let optional = [
        (
            "replicated_from",
            m.replicated_from.as_ref().map(|x| json!(x)),
        ),
        ("partition_key", m.partition_key.as_ref().map(|x| json!(x))),
        ("compression", m.compression.map(|x| json!(x))),
        ("uncompressed_size", m.uncompressed_size.map(|x| json!(x))),
        ("event_time", m.event_time.map(|x| json!(x))),
        (
            "encryption_algo",
            m.encryption_algo.as_ref().map(|x| json!(x)),
        ),
        (
            "encryption_param",
            m.encryption_param.as_ref().map(|x| json!(hex(x))),
        ),
        (
            "schema_version",
            m.schema_version.as_ref().map(|x| json!(hex(x))),
        ),
        (
            "partition_key_b64_encoded",
            m.partition_key_b64_encoded.map(|x| json!(x)),
        ),
        (
            "ordering_key",
            m.ordering_key.as_ref().map(|x| json!(hex(x))),
        ),
        ("deliver_at_time", m.deliver_at_time.map(|x| json!(x))),
        ("marker_type", m.marker_type.map(|x| json!(x))),
        ("txnid_least_bits", m.txnid_least_bits.map(|x| json!(x))),
        ("txnid_most_bits", m.txnid_most_bits.map(|x| json!(x))),
        (
            "highest_sequence_id",
            m.highest_sequence_id.map(|x| json!(x)),
        ),
        ("null_value", m.null_value.map(|x| json!(x))),
        ("uuid", m.uuid.as_ref().map(|x| json!(x))),
        (
            "num_chunks_from_msg",
            m.num_chunks_from_msg.map(|x| json!(x)),
        ),
        (
            "total_chunk_msg_size",
            m.total_chunk_msg_size.map(|x| json!(x)),
        ),
        ("chunk_id", m.chunk_id.map(|x| json!(x))),
        ("null_partition_key", m.null_partition_key.map(|x| json!(x))),
    ];
    for (name, value) in optional {
        if let Some(value) = value {
            v[name] = value;
        }
    }
    if !m.properties.is_empty() {
        v["properties"] = m
            .properties
            .iter()
            .map(|p| json!([p.key, p.value]))
            .collect();
    }
    if !m.replicate_to.is_empty() {
        v["replicate_to"] = json!(m.replicate_to);
    }
    if !m.encryption_keys.is_empty() {
        v["encryption_keys"] = m.encryption_keys.iter().map(|k| json!(k.key)).collect();
    }
    v
}

/// An entry payload; a malformed one yields an `error` field (inspection
/// shows as much as decodes).
pub fn payload_json(bytes: &[u8]) -> Value {
    let e = match frame::parse_entry_payload(bytes) {
        Ok(e) => e,
        Err(err) => return json!({ "bytes": bytes.len(), "error": err.to_string() }),
    };
    let mut v = json!({
        "bytes": bytes.len(),
        "broker_entry_metadata_bytes": e.broker_entry_metadata.map(<[u8]>::len),
        "checksum": e.checksum.map(|c| format!("{c:#010x} (verified)")),
        "metadata": metadata_json(&e.metadata),
    });
    if e.metadata.num_messages_in_batch.is_some() {
        let split = e
            .metadata
            .batch_size()
            .map_err(|err| err.to_string())
            .and_then(|b| frame::split_batch(e.payload, b).map_err(|err| err.to_string()));
        match split {
            Ok(msgs) => {
                v["messages"] = json!(msgs
                    .iter()
                    .enumerate()
                    .map(|(i, m)| json!({
                        "batch_index": i,
                        "payload_size": m.metadata.payload_size,
                        "compacted_out": m.metadata.compacted_out(),
                        "partition_key": m.metadata.partition_key,
                    }))
                    .collect::<Vec<_>>())
            }
            Err(err) => v["batch_error"] = json!(err),
        }
    } else {
        v["payload_bytes"] = json!(e.payload.len());
    }
    v
}

/// The error [`payload_json`] recorded for a malformed payload or batch.
fn payload_problem(v: &Value) -> Option<String> {
    ["error", "batch_error"]
        .iter()
        .find_map(|k| v.get(*k).and_then(Value::as_str))
        .map(str::to_string)
}

fn snapshot_metadata_json(m: &SnapshotMetadata) -> Value {
    json!({
        "segments": m.metadata_list.iter().enumerate().map(|(i, s)| {
            let bitmaps: Map<String, Value> = match decode_segment_bitmaps(0, s) {
                Ok(b) => b.iter().map(|(l, bm)| (l.to_string(), json!(bm.len()))).collect(),
                Err(e) => [("error".to_string(), json!(e.to_string()))].into_iter().collect(),
            };
            json!({
                "segment": i + 1,
                "min_schedule_timestamp": s.min_schedule_timestamp,
                "max_schedule_timestamp": s.max_schedule_timestamp,
                "entries_per_ledger": bitmaps,
            })
        }).collect::<Vec<_>>()
    })
}

fn segment_json(s: &SnapshotSegment) -> Value {
    json!({
        "indexes": s.indexes.len(),
        "first": s.indexes.first().map(|i| json!([i.timestamp, i.ledger_id, i.entry_id])),
        "last": s.indexes.last().map(|i| json!([i.timestamp, i.ledger_id, i.entry_id])),
        "all": s.indexes.iter().map(|i| format!("{}@{}:{}", i.timestamp, i.ledger_id, i.entry_id)).collect::<Vec<_>>(),
    })
}

pub fn record_json(r: &PendingAckRecord) -> Value {
    json!({
        "txn_id": r.txn_id.to_string(),
        "op": match r.op { PendingAckOp::Ack => "ACK", PendingAckOp::Commit => "COMMIT", PendingAckOp::Abort => "ABORT" },
        "ack_type": match r.ack_type { AckType::Individual => "Individual", AckType::Cumulative => "Cumulative" },
        "positions": r.positions.iter().map(|p| {
            if p.ack_set.is_empty() { json!(p.position.to_string()) }
            else { json!({ "position": p.position.to_string(), "batch_size": p.batch_size, "ack_set": p.ack_set }) }
        }).collect::<Vec<_>>(),
    })
}

// ---------------------------------------------------------------- store

/// One committed bucket snapshot as read from the store.
pub struct Bucket {
    pub managed_ledger: String,
    pub cursor: String,
    pub key: String,
    pub range: Option<(i64, i64)>,
    pub snapshot_id: i64,
    /// Raw entries `(entry id, bytes)` of the snapshot.
    pub entries: Vec<(u64, Vec<u8>)>,
}

/// A pending-ack log and its replay.
pub struct PendingAckLog {
    pub managed_ledger: String,
    /// `(topic, subscription)` whose acks the log holds, if found.
    pub subscription: Option<(String, String)>,
    /// Where replay started (the log cursor's mark-delete).
    pub replay_from: Position,
    pub entries: usize,
    pub records: Vec<(Position, PendingAckRecord)>,
    pub errors: Vec<String>,
    pub state: PendingAckState,
}

/// A data dir's store, read-only.
pub struct LoadedStore {
    pub path: PathBuf,
    pub contents: StoreContents,
    pub buckets: Vec<Bucket>,
    /// Snapshot ids present in the table but named by no cursor property.
    pub orphan_snapshots: BTreeSet<i64>,
    pub pending_ack_logs: Vec<PendingAckLog>,
}

/// The store file of a data dir: the simulator's `pulsar-core.redb`, or
/// `serve.redb` when only that one is there; a file path is taken as is.
pub fn store_path(dir: &Path) -> PathBuf {
    if dir.is_dir() {
        let sim = dir.join(STORE_FILE);
        let serve = dir.join(SERVE_STORE_FILE);
        if !sim.exists() && serve.exists() {
            serve
        } else {
            sim
        }
    } else {
        dir.to_path_buf()
    }
}

/// Opens and reads a store read-only.
///
/// # Errors
/// A message when the file is missing, not a redb database, or corrupt (the
/// library turns redb's panics on a damaged file into typed errors; the
/// default panic hook, which would still print redb's message as if this
/// command had crashed, is silenced while the store is read).
pub fn load_store(dir: &Path) -> Result<LoadedStore, String> {
    let path = store_path(dir);
    if !path.is_file() {
        return Err(format!("no store file at {}", path.display()));
    }
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let read = load_store_file(&path);
    std::panic::set_hook(hook);
    read
}

fn load_store_file(path: &Path) -> Result<LoadedStore, String> {
    let path = path.to_path_buf();
    let keep = |name: &str| name.ends_with(PENDING_ACK_SUFFIX);
    let (contents, db) = RedbStore::read_only_contents(&path, &keep)
        .map_err(|e| format!("cannot open {} read-only: {e}", path.display()))?;
    let snapshots = RedbSnapshotStorage::read_only_entries(&db)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut buckets = Vec::new();
    let mut referenced = BTreeSet::new();
    for ((ml, cursor), c) in &contents.cursors {
        for (key, id) in &c.properties {
            if !key.starts_with(pulsar_core::delayed::BUCKET_KEY_PREFIX) {
                continue;
            }
            referenced.insert(*id);
            buckets.push(Bucket {
                managed_ledger: ml.clone(),
                cursor: cursor.clone(),
                key: key.clone(),
                range: parse_bucket_key(key),
                snapshot_id: *id,
                entries: snapshots.get(id).cloned().unwrap_or_default(),
            });
        }
    }
    let orphan_snapshots = snapshots
        .keys()
        .filter(|id| !referenced.contains(id))
        .copied()
        .collect();
    let mut pending_ack_logs = Vec::new();
    for name in contents.ledgers.keys().filter(|n| keep(n)) {
        let subscription = contents
            .cursors
            .iter()
            .find(|((ml, c), _)| format!("{ml}-{c}{PENDING_ACK_SUFFIX}") == *name)
            .map(|((ml, c), _)| (ml.clone(), c.clone()));
        let sub_mark_delete = subscription
            .as_ref()
            .and_then(|k| contents.cursors.get(k))
            .map_or(Position::EARLIEST, |c| c.mark_delete);
        let replay_from = contents
            .cursors
            .get(&(name.clone(), PENDING_ACK_CURSOR.to_string()))
            .map_or(Position::EARLIEST, |c| c.mark_delete);
        let mut log = PendingAckLog {
            managed_ledger: name.clone(),
            subscription,
            replay_from,
            entries: 0,
            records: Vec::new(),
            errors: Vec::new(),
            state: PendingAckState::new(sub_mark_delete),
        };
        let lo = (name.clone(), i64::MIN, i64::MIN);
        let hi = (name.clone(), i64::MAX, i64::MAX);
        for ((_, l, e), data) in contents.entries.range(lo..=hi) {
            let p = Position::new(*l, *e);
            if p <= replay_from {
                continue;
            }
            log.entries += 1;
            match decode_entry(p, data) {
                Ok(recs) => {
                    for r in recs {
                        log.state.apply(&r);
                        log.records.push((p, r));
                    }
                }
                Err(err) => log.errors.push(format!("entry {p}: {err}")),
            }
        }
        pending_ack_logs.push(log);
    }
    Ok(LoadedStore {
        path,
        contents,
        buckets,
        orphan_snapshots,
        pending_ack_logs,
    })
}

fn pos_str(p: Position) -> String {
    p.to_string()
}

impl LoadedStore {
    fn to_json(&self) -> Value {
        let c = &self.contents;
        let managed_ledgers: Vec<Value> = c
            .ledgers
            .iter()
            .map(|(name, l)| {
                let (stored, bytes) = c.entry_stats.get(name).copied().unwrap_or_default();
                json!({
                    "name": name,
                    "ledgers": l.ledgers.iter().map(|(id, i)| json!({ "ledger_id": id, "entries": i.entries, "lost": i.lost })).collect::<Vec<_>>(),
                    "stored_entries": stored,
                    "stored_bytes": bytes,
                    "cursors": c.cursors.iter().filter(|((ml, _), _)| ml == name).map(|((_, cur), s)| json!({
                        "name": cur,
                        "mark_delete": pos_str(s.mark_delete),
                        "individually_deleted": s.individually_deleted.iter().map(|(a, b)| format!("({a}, {b}]")).collect::<Vec<_>>(),
                        "properties": s.properties,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        let buckets: Vec<Value> = self
            .buckets
            .iter()
            .map(|b| {
                let mut v = json!({
                    "managed_ledger": b.managed_ledger,
                    "cursor": b.cursor,
                    "key": b.key,
                    "snapshot_id": b.snapshot_id,
                    "stored_entries": b.entries.len(),
                });
                match b
                    .entries
                    .iter()
                    .find(|(e, _)| *e == 0)
                    .map(|(_, d)| decode_metadata(b.snapshot_id, d))
                {
                    Some(Ok(m)) => {
                        v["metadata"] = snapshot_metadata_json(&m);
                        let delayed: u64 = m
                            .metadata_list
                            .iter()
                            .filter_map(|s| decode_segment_bitmaps(b.snapshot_id, s).ok())
                            .flat_map(|bms| bms.into_values().map(|bm| bm.len()))
                            .sum();
                        v["delayed_messages"] = json!(delayed);
                        v["segments"] = json!(b
                            .entries
                            .iter()
                            .filter(|(e, _)| *e > 0)
                            .map(|(e, d)| match decode_segment(b.snapshot_id, *e, d) {
                                Ok(seg) => segment_json(&seg),
                                Err(err) => json!({ "error": err.to_string() }),
                            })
                            .collect::<Vec<_>>());
                    }
                    Some(Err(e)) => v["error"] = json!(e.to_string()),
                    None => v["error"] = json!("snapshot metadata (entry 0) missing"),
                }
                v
            })
            .collect();
        let logs: Vec<Value> = self
            .pending_ack_logs
            .iter()
            .map(|l| {
                let s = l.state.summary();
                let mut by_op: BTreeMap<&str, u64> = BTreeMap::new();
                for (_, r) in &l.records {
                    let k = match r.op {
                        PendingAckOp::Ack => "ACK",
                        PendingAckOp::Commit => "COMMIT",
                        PendingAckOp::Abort => "ABORT",
                    };
                    *by_op.entry(k).or_default() += 1;
                }
                json!({
                    "managed_ledger": l.managed_ledger,
                    "subscription": l.subscription.as_ref().map(|(t, c)| format!("{t} / {c}")),
                    "replay_from": pos_str(l.replay_from),
                    "entries_replayed": l.entries,
                    "records": by_op,
                    "pending_individual": s.individual.iter().map(|(t, ps)| (t.to_string(), json!(ps.iter().map(|p| p.to_string()).collect::<Vec<_>>()))).collect::<Map<_, _>>(),
                    "pending_cumulative": s.cumulative.map(|(t, p)| format!("{t} -> {p}")),
                    "committed_individual_deletes": s.deleted.len(),
                    "mark_delete_after_replay": pos_str(s.mark_delete),
                    "errors": l.errors,
                })
            })
            .collect();
        json!({
            "store": self.path.display().to_string(),
            "opened": "read-only",
            "managed_ledgers": managed_ledgers,
            "delayed_buckets": buckets,
            "orphan_snapshots": self.orphan_snapshots,
            "pending_ack_logs": logs,
        })
    }
}

// ---------------------------------------------------------------- text

fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::Null => Some("-".into()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        Value::String(s) => Some(s.clone()),
        Value::Array(a) if a.is_empty() => Some("[]".into()),
        Value::Object(o) if o.is_empty() => Some("{}".into()),
        Value::Array(a) if a.iter().all(|x| !x.is_array() && !x.is_object()) => Some(format!(
            "[{}]",
            a.iter().filter_map(scalar).collect::<Vec<_>>().join(", ")
        )),
        _ => None,
    }
}

fn render_into(v: &Value, indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    match v {
        Value::Object(o) => {
            for (k, x) in o {
                match scalar(x) {
                    Some(s) => out.push_str(&format!("{pad}{k}: {s}\n")),
                    None => {
                        out.push_str(&format!("{pad}{k}:\n"));
                        render_into(x, indent + 2, out);
                    }
                }
            }
        }
        Value::Array(a) => {
            for x in a {
                match scalar(x) {
                    Some(s) => out.push_str(&format!("{pad}- {s}\n")),
                    None => {
                        // "- first: …" then the other keys aligned under it
                        let mut item = String::new();
                        render_into(x, indent + 2, &mut item);
                        out.push_str(&pad);
                        out.push_str("- ");
                        out.push_str(item.get(indent + 2..).unwrap_or(""));
                    }
                }
            }
        }
        other => out.push_str(&format!("{pad}{}\n", scalar(other).unwrap_or_default())),
    }
}

/// Renders a JSON value as indented `key: value` text.
pub fn render_text(v: &Value) -> String {
    let mut out = String::new();
    render_into(v, 0, &mut out);
    out
}
