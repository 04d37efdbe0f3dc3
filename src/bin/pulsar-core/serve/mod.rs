//! `pulsar-core serve`: a network adapter that runs the library's broker
//! core ([`pulsar_core::broker::Broker`]) for real Pulsar clients
//! (non-partitioned persistent topics; see the README section "serve" for
//! what is supported). The core decides every answer; this module adds
//! what a network node needs around it: accept, framing and its size
//! limit, a writer thread and outbound queue per connection (whose written
//! bytes it reports to the core), keep-alive, the wall clock, the timer,
//! the permit-ledger and frame-recording files.
//!
//! Threads: one acceptor (which also fires the core's timer when its
//! deadline has passed, sweeps every subscription once a second, and
//! writes the permit-ledger snapshot every second) and two threads per
//! connection (std::net, blocking): one reads frames and hands them to the
//! core, one writes the connection's outbound queue, so no socket write
//! ever happens under the core's lock. The core is behind one lock
//! ([`Node`]); lock order: the node, then a connection's outbound queue.
//! SIGINT/SIGTERM stop accepting, write a final permit-ledger snapshot and
//! exit 0; every acknowledged send and ack is already committed (the store
//! fsyncs each commit, and the core sends a receipt only after the commit
//! of what it confirms), so a kill -9 loses nothing acknowledged either.
//!
//! Turns: a connection thread reads what its socket has buffered (up to
//! 64 KiB per read) and hands every whole frame of it to the core in one
//! turn ([`Node::handle_frames`]); the turn ends (the core's group commit
//! of the turn's SENDs and acks, one fsync) when no other connection
//! thread is queued for the core, so many sends in flight on many
//! connections share a commit. The grouping is the core's; this adapter
//! only decides when a turn ends.

mod conn;
mod record;

use std::collections::BTreeMap;
use std::io::Write;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pulsar_core::broker::{Broker, BrokerConfig, IncarnationRecord, Output};
use pulsar_core::ledger::{RedbStore, RetentionPolicy, SyncMode};

use conn::ConnWriter;
use record::Recorder;

/// Locks a mutex, recovering it from a panicked holder (a panic in one
/// connection's thread must not take the node down).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Current wall time in epoch milliseconds (the core's `now`).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The broker core behind one lock, with the writers its outputs go to.
pub struct Node {
    inner: Mutex<NodeInner>,
    /// Test fault (`--fail-message-writes-every`): every n-th MESSAGE frame
    /// is not written and reported failed to the core (0: never).
    pub fail_message_writes_every: u64,
    /// MESSAGE frames the writers have seen (for the fault above).
    pub message_writes: AtomicU64,
    /// Connection threads holding frames for the core or handing them
    /// ([`Node::handle_frames`]): the last one ends the turn.
    turn_waiters: AtomicUsize,
}

/// Frames handed to the core after which a turn ends even while more
/// connection threads wait (so a steady stream of frames still gets its
/// receipts; the core bounds its group commit itself as well).
const MAX_TURN_FRAMES: usize = 4096;

struct NodeInner {
    core: Broker,
    /// Frames handed to the core since the turn last ended.
    turn_frames: usize,
    writers: BTreeMap<u64, Arc<ConnWriter>>,
    permit_ledger: Option<std::fs::File>,
}

impl NodeInner {
    /// Routes every queued output: frames to their connection's queue,
    /// closes to its socket, incarnation records to the permit ledger.
    fn flush(&mut self) {
        self.turn_frames = 0;
        // Reads the core issued complete at once (the store reads
        // synchronously): their entries go out in this iteration.
        while let Some(o) = self.core.poll_output() {
            match o {
                Output::ReadIssued { read } => {
                    self.core.complete_read(read, now_ms());
                }
                Output::Frame { conn, frame } => {
                    if let Some(w) = self.writers.get(&conn) {
                        w.send(&frame);
                    }
                }
                Output::Close { conn, reason } => {
                    tracing::debug!(conn, %reason, "the core closed the connection");
                    if let Some(w) = self.writers.get(&conn) {
                        w.close();
                    }
                }
                Output::Incarnation(r) => self.write_ledger(&r),
            }
        }
    }

    /// Writes one permit-ledger line.
    fn write_ledger(&mut self, c: &IncarnationRecord) {
        let Some(f) = &mut self.permit_ledger else {
            return;
        };
        let line = format!(
            "{{\"boot\":{},\"incarnation\":{},\"connection_id\":{},\"consumer_id\":{},\"topic\":{:?},\"subscription\":{:?},\"granted\":{},\"debited\":{},\"available\":{},\"min_available\":{},\"commands\":{},\"unacked\":{},\"end\":{:?}}}\n",
            std::process::id(),
            c.incarnation,
            c.connection_id,
            c.consumer_id,
            c.topic,
            c.subscription,
            c.granted,
            c.debited,
            c.available,
            c.min_available,
            c.commands,
            c.unacked,
            c.end
        );
        if let Err(e) = f.write_all(line.as_bytes()).and_then(|()| f.flush()) {
            tracing::error!(error = %e, "cannot write the permit ledger");
        }
    }
}

impl Node {
    /// Whether the test fault fails this frame's write: every
    /// `fail_message_writes_every`-th MESSAGE (`BaseCommand.type`, its
    /// first field, after the two 4-byte sizes: 0x08, 9).
    pub fn fail_this_write(&self, frame: &[u8]) -> bool {
        let every = self.fail_message_writes_every;
        every > 0
            && frame.get(8..10) == Some(&[0x08, 9][..])
            && (self.message_writes.fetch_add(1, Ordering::Relaxed) + 1).is_multiple_of(every)
    }

    /// Runs `f` on the core, then routes its outputs.
    pub fn with<R>(&self, f: impl FnOnce(&mut Broker) -> R) -> R {
        let mut g = lock(&self.inner);
        let r = f(&mut g.core);
        g.flush();
        r
    }

    /// Hands the core the frames connection `id` has received, in one
    /// turn, and leaves the turn's end (the core's group commit of SENDs
    /// and acks, then the outputs: [`NodeInner::flush`]) to the last of
    /// the connection threads that queued for the core meanwhile: the
    /// frames every connection had buffered while a commit ran share the
    /// next one (at most [`MAX_TURN_FRAMES`] per turn). A thread that
    /// finds no one queued behind it ends the turn itself, so no frame
    /// waits for another connection's traffic.
    ///
    /// # Errors
    /// The core's [`ConnectionError`] for a frame that closes the
    /// connection (the frames after it are not handed over).
    pub fn handle_frames(
        &self,
        id: u64,
        frames: &[pulsar_core::broker::CutFrame],
    ) -> Result<(), pulsar_core::broker::ConnectionError> {
        self.turn_waiters.fetch_add(1, Ordering::SeqCst);
        let mut g = lock(&self.inner);
        let mut result = Ok(());
        for f in frames {
            result = g.core.handle_frame(id, f.command(), f.payload(), now_ms());
            g.turn_frames += 1;
            if result.is_err() {
                break;
            }
        }
        // Under the node's lock: a thread counted in `turn_waiters` has not
        // handed its frames yet, and ends the turn after them (or one after
        // it does).
        let last = self.turn_waiters.fetch_sub(1, Ordering::SeqCst) == 1;
        if last || g.turn_frames >= MAX_TURN_FRAMES {
            g.flush();
        }
        result
    }

    /// A connection opened: its writer receives the core's frames for it.
    pub fn open(&self, writer: Arc<ConnWriter>) {
        let mut g = lock(&self.inner);
        let id = writer.id;
        g.writers.insert(id, writer);
        g.core.handle_open(id, now_ms());
        g.flush();
    }

    /// A connection ended.
    pub fn close(&self, id: u64) {
        let mut g = lock(&self.inner);
        g.core.handle_close(id, now_ms());
        g.flush();
        g.writers.remove(&id);
    }

    /// Snapshots every live incarnation into the permit ledger.
    fn snapshot_ledger(&self, end: &str) {
        let mut g = lock(&self.inner);
        for r in g.core.incarnations(end) {
            g.write_ledger(&r);
        }
    }
}

/// `serve` arguments.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Directory of the redb store (`serve.redb`); created if missing, and
    /// recovered (topics, cursors, delayed trackers) when it holds a store.
    #[arg(long, default_value = "pulsar-core-data")]
    data_dir: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:6650")]
    listen: String,
    /// URL returned by lookups (default: pulsar://LISTEN address).
    #[arg(long)]
    advertised_url: Option<String>,
    /// Append one JSON line per consumer incarnation (Flow permits granted,
    /// message_permits debited, balance) to this file when it ends, plus a
    /// snapshot of the live ones every second.
    #[arg(long)]
    permit_ledger: Option<PathBuf>,
    /// Record every frame's command (both directions) to this file.
    #[arg(long)]
    record_frames: Option<PathBuf>,
    /// Seconds without a command after which the server PINGs a connection;
    /// a second interval without one (or without CONNECT) closes it
    /// (Pulsar's `keepAliveIntervalSeconds`).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    keep_alive_secs: u64,
    /// Connections served at once; one more is closed at accept with a
    /// logged reason (each connection holds two threads, one frame being
    /// read and an outbound queue bounded by `conn::OUTBOUND_LIMIT`).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..))]
    max_connections: u64,
    /// Test fault: the core's pending-ack admission refuses every n-th
    /// entry it offers (0: admit all). For `tests/serve.rs`.
    #[arg(long, hide = true, default_value_t = 0)]
    reject_admission_every: u64,
    /// Test fault: every n-th MESSAGE frame is not written and reported to
    /// the core as a failed write; the connection stays (0: never). For
    /// `tests/serve.rs`.
    #[arg(long, hide = true, default_value_t = 0)]
    fail_message_writes_every: u64,
    /// Entries per ledger before a topic rolls over to a new ledger
    /// (`managedLedgerMaxEntriesPerLedger`); consumed ledgers are deleted
    /// whole, so this is the unit in which the store's space comes back.
    #[arg(long, default_value_t = 50_000, value_parser = clap::value_parser!(u32).range(1..))]
    ledger_max_entries: u32,
    /// Consumed ledgers are kept this many minutes (`retentionTimeInMinutes`;
    /// 0: not kept, -1: forever).
    #[arg(long, default_value_t = 0, allow_hyphen_values = true, value_parser = clap::value_parser!(i64).range(-1..))]
    retention_time_minutes: i64,
    /// Consumed ledgers are kept while a topic holds less than this many MiB
    /// (`retentionSizeInMB`; 0: not kept, -1: no limit).
    #[arg(long, default_value_t = 0, allow_hyphen_values = true, value_parser = clap::value_parser!(i64).range(-1..))]
    retention_size_mb: i64,
    /// Seconds between two trims of consumed ledgers
    /// (`retentionCheckIntervalInSeconds`).
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    retention_check_interval_secs: u64,
    /// Delayed delivery: indexes a bucket holds before it is sealed into a
    /// snapshot (`delayedDeliveryMinIndexCountPerBucket`).
    #[arg(long, default_value_t = 50_000, value_parser = clap::value_parser!(u64).range(1..))]
    delayed_min_index_count_per_bucket: u64,
    /// Delayed delivery: indexes per snapshot segment
    /// (`delayedDeliveryMaxIndexesPerBucketSnapshotSegment`).
    #[arg(long, default_value_t = 5_000, value_parser = clap::value_parser!(i64).range(1..))]
    delayed_bucket_max_indexes: i64,
    /// Delayed delivery: sealed buckets kept before the oldest are merged
    /// (`delayedDeliveryMaxNumBuckets`; -1: no limit, no merge).
    #[arg(long, default_value_t = -1, allow_hyphen_values = true, value_parser = clap::value_parser!(i64).range(-1..))]
    delayed_max_num_buckets: i64,
    /// Transactions: a topic's transaction buffer takes a snapshot after
    /// this many transactions ended on it since its last one
    /// (`transactionBufferSnapshotMaxTransactionCount`).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    transaction_buffer_snapshot_max_transaction_count: u64,
    /// Transactions: every this many ms, a topic whose max read position
    /// moved since its last transaction buffer snapshot takes one
    /// (`transactionBufferSnapshotMinTimeInMillis`).
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1..))]
    transaction_buffer_snapshot_min_time_in_millis: u64,
    /// Every store commit fsyncs on its own instead of one fsync per turn
    /// of the core (`broker::turn_commit`; for measuring the difference).
    #[arg(long, hide = true)]
    no_turn_commit: bool,
}

impl ServeArgs {
    /// The core's settings from these arguments.
    fn broker_config(&self, advertised: String) -> BrokerConfig {
        let mut c = BrokerConfig::new(advertised);
        c.ledger.max_entries_per_ledger = self.ledger_max_entries;
        c.retention = RetentionPolicy {
            time_ms: if self.retention_time_minutes < 0 {
                -1
            } else {
                self.retention_time_minutes.saturating_mul(60_000)
            },
            size_bytes: if self.retention_size_mb < 0 {
                -1
            } else {
                self.retention_size_mb.saturating_mul(1024 * 1024)
            },
        };
        c.retention_check_interval_ms = self.retention_check_interval_secs * 1000;
        c.delayed.min_index_count_per_bucket = self.delayed_min_index_count_per_bucket;
        c.delayed.max_indexes_per_bucket_snapshot_segment = self.delayed_bucket_max_indexes;
        c.delayed.max_num_buckets = self.delayed_max_num_buckets;
        c.turn_commit = !self.no_turn_commit;
        c.txn_snapshot = pulsar_core::broker::txn::SnapshotConfig {
            max_transaction_count: self.transaction_buffer_snapshot_max_transaction_count,
            min_time_ms: self.transaction_buffer_snapshot_min_time_in_millis,
        };
        c
    }
}

fn open_append(p: &PathBuf) -> Result<std::fs::File, String> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(p)
        .map_err(|e| format!("cannot open {}: {e}", p.display()))
}

/// Runs the server until SIGINT/SIGTERM.
pub fn run(args: ServeArgs) -> ExitCode {
    match serve(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn serve(args: ServeArgs) -> Result<(), String> {
    std::fs::create_dir_all(&args.data_dir)
        .map_err(|e| format!("cannot create data dir {}: {e}", args.data_dir.display()))?;
    let path = args.data_dir.join("serve.redb");
    let store = RedbStore::open_with(&path, SyncMode::Immediate)
        .map_err(|e| format!("cannot open store {}: {e}", path.display()))?;
    let ledger = args.permit_ledger.as_ref().map(open_append).transpose()?;
    let recorder = args
        .record_frames
        .as_ref()
        .map(open_append)
        .transpose()?
        .map(|f| Arc::new(Recorder::new(f)));
    let listener = TcpListener::bind(&args.listen)
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let advertised = args
        .advertised_url
        .clone()
        .unwrap_or_else(|| format!("pulsar://{local}"));
    let mut config = args.broker_config(advertised.clone());
    if args.reject_admission_every > 0 {
        let every = args.reject_admission_every;
        let offered = AtomicU64::new(0);
        config.admission = Some(pulsar_core::broker::AdmissionHook::new(move |_, _| {
            !(offered.fetch_add(1, Ordering::Relaxed) + 1).is_multiple_of(every)
        }));
    }
    let node = Arc::new(Node {
        inner: Mutex::new(NodeInner {
            core: Broker::new(store, config, now_ms()),
            turn_frames: 0,
            writers: BTreeMap::new(),
            permit_ledger: ledger,
        }),
        fail_message_writes_every: args.fail_message_writes_every,
        message_writes: AtomicU64::new(0),
        turn_waiters: AtomicUsize::new(0),
    });
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = Arc::clone(&stop);
        ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst))
            .map_err(|e| format!("cannot install the signal handler: {e}"))?;
    }
    eprintln!(
        "pulsar-core serve: listening on {local}, advertised {advertised}, store {}",
        path.display()
    );
    let keep_alive = Duration::from_secs(args.keep_alive_secs);
    let next_conn = AtomicU64::new(1);
    let open_conns = Arc::new(AtomicUsize::new(0));
    let max_conns = usize::try_from(args.max_connections).unwrap_or(usize::MAX);
    let mut last_snapshot = Instant::now();
    let mut last_sweep = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            // Only the acceptor increments the count: the check then the
            // add below cannot overshoot.
            Ok((stream, peer)) if open_conns.load(Ordering::Acquire) >= max_conns => {
                tracing::warn!(%peer, max_conns, "connection closed at accept: --max-connections reached");
                let _ = stream.shutdown(std::net::Shutdown::Both);
            }
            Ok((stream, peer)) => {
                let _ = stream.set_nonblocking(false);
                let id = next_conn.fetch_add(1, Ordering::Relaxed);
                open_conns.fetch_add(1, Ordering::AcqRel);
                let open = Arc::clone(&open_conns);
                let node = Arc::clone(&node);
                let recorder = recorder.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("conn-{id}"))
                    .spawn(move || {
                        tracing::info!(conn = id, %peer, "connection opened");
                        let why = conn::serve_connection(node, stream, id, recorder, keep_alive);
                        match why {
                            conn::ConnError::Io(e)
                                if e.kind() == std::io::ErrorKind::UnexpectedEof =>
                            {
                                tracing::info!(conn = id, "connection closed by the client")
                            }
                            other => {
                                tracing::warn!(conn = id, reason = %other, "connection closed")
                            }
                        }
                        open.fetch_sub(1, Ordering::AcqRel);
                    });
                if let Err(e) = spawned {
                    open_conns.fetch_sub(1, Ordering::AcqRel);
                    tracing::error!(error = %e, "cannot spawn a connection thread");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        // The core's timer (due delayed entries), and a sweep of every
        // subscription once a second.
        let now = now_ms();
        let due = node.with(|core| core.poll_timeout().is_some_and(|t| t <= now));
        if due || last_sweep.elapsed() >= Duration::from_secs(1) {
            node.with(|core| core.handle_timeout(now));
            last_sweep = Instant::now();
        }
        if last_snapshot.elapsed() >= Duration::from_secs(1) {
            node.snapshot_ledger("snapshot");
            last_snapshot = Instant::now();
        }
    }
    node.snapshot_ledger("shutdown");
    eprintln!("pulsar-core serve: stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::ServeArgs;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn config(args: &[&str]) -> Result<pulsar_core::broker::BrokerConfig, clap::Error> {
        let cli = Cli::try_parse_from(std::iter::once("serve").chain(args.iter().copied()))?;
        Ok(cli.serve.broker_config("pulsar://localhost:6650".into()))
    }

    /// The transaction buffer snapshot settings reach the core
    /// (`BrokerConfig::txn_snapshot`), Pulsar's defaults without them; 0 is
    /// refused.
    #[test]
    fn transaction_buffer_snapshot_settings_reach_the_core() {
        let d = config(&[]).unwrap().txn_snapshot;
        assert_eq!(d, pulsar_core::broker::txn::SnapshotConfig::default());
        let c = config(&[
            "--transaction-buffer-snapshot-max-transaction-count",
            "7",
            "--transaction-buffer-snapshot-min-time-in-millis",
            "250",
        ])
        .unwrap()
        .txn_snapshot;
        assert_eq!((c.max_transaction_count, c.min_time_ms), (7, 250));
        assert!(config(&["--transaction-buffer-snapshot-min-time-in-millis", "0"]).is_err());
        assert!(config(&["--transaction-buffer-snapshot-max-transaction-count", "0"]).is_err());
        assert!(!config(&["--no-turn-commit"]).unwrap().turn_commit);
    }
}
