//! `pulsar-core serve`: a single-node endpoint of Pulsar's binary protocol
//! on the crate's components, for real Pulsar clients (non-partitioned
//! persistent topics; see the README section "serve" for what is supported).
//!
//! Threads: one acceptor (which also runs dispatch on every subscription
//! every 50 ms, for due delayed entries and consumers whose connection
//! drained its outbound queue, and the permit-ledger snapshot every second)
//! and two threads per connection (std::net, blocking): one reads and
//! handles commands, one writes the connection's outbound queue, so no
//! socket write ever happens under a subscription's lock. SIGINT/SIGTERM stop accepting, write a
//! final permit-ledger snapshot and exit 0; every acknowledged send and ack
//! is already committed (the store fsyncs each commit), so a kill -9 loses
//! nothing acknowledged either.

mod broker;
mod conn;
mod proto;
mod record;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pulsar_core::ledger::{RedbStore, SyncMode};

use broker::Broker;
use record::Recorder;

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
    let broker = Arc::new(Broker::new(store, ledger));
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
                let broker = Arc::clone(&broker);
                let advertised = advertised.clone();
                let recorder = recorder.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("conn-{id}"))
                    .spawn(move || {
                        tracing::info!(conn = id, %peer, "connection opened");
                        let why = conn::serve_connection(
                            broker, stream, id, advertised, recorder, keep_alive,
                        );
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
        broker.dispatch_all();
        if last_snapshot.elapsed() >= Duration::from_secs(1) {
            broker.snapshot_ledger("snapshot");
            last_snapshot = Instant::now();
        }
    }
    broker.snapshot_ledger("shutdown");
    eprintln!("pulsar-core serve: stopped");
    Ok(())
}
