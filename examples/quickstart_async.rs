//! The README's non-blocking quick start: a send and its acknowledgement
//! made durable without blocking the caller. `append_async` and
//! `persist_deletion_state_async` return at once; their completions are
//! plain `Future`s (any executor, here a ten-line one on std's `Waker`),
//! fire only after the write's fsync, and the writes of concurrent callers
//! share one commit (group commit). Uses only what `default-features =
//! false` builds.
//!
//! Run: `cargo run --example quickstart_async`

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use pulsar_core::deletion::CursorDeletionState;
use pulsar_core::ledger::{LedgerConfig, ManagedLedger, RedbStore};

async fn broker(path: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    // A durable store: its writes go through one group-commit writer thread.
    let store = Arc::new(RedbStore::open(path)?);
    let topic = ManagedLedger::open("orders", LedgerConfig::default(), store)?;
    let cursor = topic.open_cursor("sub")?;

    // SEND: the receipt may go out once the entry is durable.
    let sent = topic.append_async(b"order 1".to_vec()).await?;

    // ACK: acknowledged in memory at once, durable when the persist completes.
    let acks = CursorDeletionState::new(cursor.mark_delete_position())?;
    acks.delete(&[sent], &*topic)?;
    cursor
        .persist_deletion_state_async(&acks, Vec::new())
        .await?;

    // Without a runtime: `.wait()` blocks the thread, `.on_complete(f)` runs
    // `f` on the store writer thread after the commit.
    assert!(cursor.recover_deletion_state()?.is_message_deleted(sent));
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    block_on(broker(&dir.path().join("store.redb")))
}

/// A minimal executor: polls `f`, parking the thread until its waker runs.
fn block_on<F: Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        match f.as_mut().poll(&mut cx) {
            Poll::Ready(out) => return out,
            Poll::Pending => std::thread::park(),
        }
    }
}
