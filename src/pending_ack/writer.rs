//! The pending-ack store's buffered writer (Pulsar's
//! `TxnLogBufferedWriter`): appends ACK/COMMIT/ABORT records to the
//! pending-ack log, optionally batching them into one entry of the batched
//! form (magic `0x0e01`, version 1).
//!
//! * Batching off: each append goes straight to the managed ledger; no timer.
//! * Batching on: records are buffered and flushed when the count reaches
//!   [`WriterConfig::max_records`] (512), the bytes reach
//!   [`WriterConfig::max_bytes`] (4 MiB), or the one-shot flush timer of
//!   [`WriterConfig::max_delay_ms`] (1 ms) fires; the timer is re-armed after
//!   each run (deliberately not fixed-rate). A record alone at least
//!   `max_bytes` long flushes the batch, then is written by itself.
//! * [`BufferedWriter::close`] (idempotent, Open→Closing→Closed) fails every
//!   unflushed callback with [`PendingAckError::WriterClosed`], cancels the
//!   pending flush timer and refuses later appends. It closes neither the
//!   cursor nor the managed ledger (both are shared with the next attempt).
//!
//! Concurrency: any thread may append or close; flushes are serialised by
//! the writer's lock (the "single write thread"); callbacks run after the
//! lock is released, on the appending, closing or timer thread.

use std::sync::{Arc, Weak};

use super::error::PendingAckError;
use super::record::{encode_batch, PendingAckRecord};
use super::timer::{Timer, TimerId};
use crate::ledger::ManagedLedger;
use crate::position::Position;
use crate::sync::Mutex;
use prost::Message as _;

/// Buffered-writer settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriterConfig {
    /// `transactionPendingAckBatchedWriteEnabled` (default false).
    pub batch_enabled: bool,
    /// Records per batch (default 512; ≥ 10 when batching).
    pub max_records: usize,
    /// Bytes per batch (default 4 MiB; ≥ 128 KiB when batching).
    pub max_bytes: usize,
    /// Flush delay in ms (default 1; ≥ 1 when batching).
    pub max_delay_ms: u64,
}

impl Default for WriterConfig {
    fn default() -> Self {
        Self {
            batch_enabled: false,
            max_records: 512,
            max_bytes: 4 * 1024 * 1024,
            max_delay_ms: 1,
        }
    }
}

impl WriterConfig {
    /// Pulsar's validator: with batching on, at least 10 records, 128 KiB
    /// and 1 ms.
    ///
    /// # Errors
    /// [`PendingAckError::InvalidConfig`].
    pub fn validate(&self) -> Result<(), PendingAckError> {
        if self.batch_enabled
            && (self.max_records < 10 || self.max_bytes < 128 * 1024 || self.max_delay_ms < 1)
        {
            return Err(PendingAckError::InvalidConfig(format!(
                "batched pending-ack writes need max_records >= 10, max_bytes >= 131072, max_delay_ms >= 1; got {}, {}, {}",
                self.max_records, self.max_bytes, self.max_delay_ms
            )));
        }
        Ok(())
    }

    fn batching(&self) -> bool {
        self.batch_enabled && self.max_records > 1
    }
}

/// Where a record was persisted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendAck {
    /// The log entry holding it.
    pub position: Position,
    /// Records in that entry.
    pub batch_size: usize,
    /// Index of the record within the entry.
    pub batch_index: usize,
}

/// Completion of one append; called exactly once.
pub type AppendCallback = Box<dyn FnOnce(Result<AppendAck, PendingAckError>) + Send>;

/// Lifecycle of a [`BufferedWriter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriterState {
    /// Accepting appends.
    Open,
    /// Close in progress.
    Closing,
    /// Closed: appends fail at once, the timer is not re-armed.
    Closed,
}

struct WriterInner {
    state: WriterState,
    buffer: Vec<(PendingAckRecord, AppendCallback)>,
    bytes: usize,
    flush_timer: Option<TimerId>,
    flushes: u64,
    timer_runs: u64,
}

type Completions = Vec<(AppendCallback, Result<AppendAck, PendingAckError>)>;

/// See the module docs.
pub struct BufferedWriter {
    ledger: Arc<ManagedLedger>,
    timer: Arc<dyn Timer>,
    config: WriterConfig,
    inner: Mutex<WriterInner>,
    me: Weak<BufferedWriter>,
}

impl std::fmt::Debug for BufferedWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = self.inner.lock();
        f.debug_struct("BufferedWriter")
            .field("state", &i.state)
            .field("buffered", &i.buffer.len())
            .field("flush_timer", &i.flush_timer)
            .finish()
    }
}

impl BufferedWriter {
    /// Opens a writer on `ledger`; with batching on it arms the flush timer.
    ///
    /// # Errors
    /// [`PendingAckError::InvalidConfig`] (see [`WriterConfig::validate`]).
    pub fn open(
        ledger: Arc<ManagedLedger>,
        timer: Arc<dyn Timer>,
        config: WriterConfig,
    ) -> Result<Arc<Self>, PendingAckError> {
        config.validate()?;
        let w = Arc::new_cyclic(|me| Self {
            ledger,
            timer,
            config,
            inner: Mutex::new(WriterInner {
                state: WriterState::Open,
                buffer: Vec::new(),
                bytes: 0,
                flush_timer: None,
                flushes: 0,
                timer_runs: 0,
            }),
            me: me.clone(),
        });
        if config.batching() {
            let mut i = w.inner.lock();
            w.arm(&mut i);
        }
        Ok(w)
    }

    fn arm(&self, inner: &mut WriterInner) {
        if inner.state != WriterState::Open {
            return;
        }
        let me = self.me.clone();
        let id = self.timer.schedule(
            self.config.max_delay_ms,
            Box::new(move || {
                if let Some(w) = me.upgrade() {
                    w.on_flush_timer();
                }
            }),
        );
        inner.flush_timer = Some(id);
    }

    fn on_flush_timer(&self) {
        let done = {
            let mut i = self.inner.lock();
            if i.state != WriterState::Open {
                return;
            }
            i.flush_timer = None;
            i.timer_runs += 1;
            let done = self.flush_locked(&mut i);
            self.arm(&mut i);
            done
        };
        run(done);
    }

    fn flush_locked(&self, inner: &mut WriterInner) -> Completions {
        if inner.buffer.is_empty() {
            return Vec::new();
        }
        let batch = std::mem::take(&mut inner.buffer);
        inner.bytes = 0;
        inner.flushes += 1;
        let records: Vec<PendingAckRecord> = batch.iter().map(|(r, _)| r.clone()).collect();
        let size = batch.len();
        match self.ledger.append(&encode_batch(&records)) {
            Ok(position) => batch
                .into_iter()
                .enumerate()
                .map(|(i, (_, cb))| {
                    (
                        cb,
                        Ok(AppendAck {
                            position,
                            batch_size: size,
                            batch_index: i,
                        }),
                    )
                })
                .collect(),
            Err(e) => batch
                .into_iter()
                .map(|(_, cb)| (cb, Err(PendingAckError::Ledger(e.clone()))))
                .collect(),
        }
    }

    fn write_single(&self, record: &PendingAckRecord) -> Result<AppendAck, PendingAckError> {
        let position = self.ledger.append(&record.encode())?;
        Ok(AppendAck {
            position,
            batch_size: 1,
            batch_index: 0,
        })
    }

    /// Appends `record`; `callback` gets where it was persisted or why not.
    /// Invalid records and appends after close fail through the callback.
    ///
    /// # Blocking
    /// With batching off, or when the record fills a batch: one store commit of
    /// the log append on the calling thread (an fsync on a
    /// [`RedbStore`](crate::ledger::RedbStore) in `SyncMode::Immediate`), under
    /// the writer's lock. Otherwise it only buffers (the flush timer writes the
    /// batch on its own thread). The non-blocking form is
    /// [`BufferedWriter::append_async`].
    pub fn append(&self, record: PendingAckRecord, callback: AppendCallback) {
        if let Err(e) = record.validate() {
            callback(Err(e));
            return;
        }
        let mut done: Completions = Vec::new();
        {
            let mut i = self.inner.lock();
            if i.state != WriterState::Open {
                drop(i);
                callback(Err(PendingAckError::WriterClosed));
                return;
            }
            if !self.config.batching() {
                let r = self.write_single(&record);
                drop(i);
                callback(r);
                return;
            }
            let len = record.encoded_len_hint();
            if len >= self.config.max_bytes {
                done.extend(self.flush_locked(&mut i));
                let r = self.write_single(&record);
                done.push((callback, r));
            } else {
                i.buffer.push((record, callback));
                i.bytes += len;
                if i.buffer.len() >= self.config.max_records || i.bytes >= self.config.max_bytes {
                    done.extend(self.flush_locked(&mut i));
                }
            }
        }
        run(done);
    }

    /// Non-blocking [`BufferedWriter::append`]: the record's log entry is
    /// queued on the managed ledger's store writer
    /// ([`ManagedLedger::append_async`]; on a
    /// [`RedbStore`](crate::ledger::RedbStore) it shares a group commit
    /// with the writes that arrive meanwhile) and `callback` runs once it is
    /// durable, on the store writer thread. With batching on, the record is
    /// buffered as by [`BufferedWriter::append`]; a batch this record fills
    /// is queued the same way (the flush timer's batches are written on
    /// the timer's thread).
    ///
    /// # Blocking
    /// Never blocks on I/O with a `RedbStore` (takes the writer's lock to
    /// queue the write). With a store whose `submit` is the default (the
    /// in-memory store) the write and `callback` run on the calling thread.
    pub fn append_async(&self, record: PendingAckRecord, callback: AppendCallback) {
        if let Err(e) = record.validate() {
            callback(Err(e));
            return;
        }
        let mut done: Completions = Vec::new();
        let queued = {
            let mut i = self.inner.lock();
            if i.state != WriterState::Open {
                drop(i);
                callback(Err(PendingAckError::WriterClosed));
                return;
            }
            if !self.config.batching() || record.encoded_len_hint() >= self.config.max_bytes {
                done.extend(self.flush_locked(&mut i));
                Some((self.ledger.append_async(record.encode()), vec![callback]))
            } else {
                let len = record.encoded_len_hint();
                i.buffer.push((record, callback));
                i.bytes += len;
                if i.buffer.len() >= self.config.max_records || i.bytes >= self.config.max_bytes {
                    let batch = std::mem::take(&mut i.buffer);
                    i.bytes = 0;
                    i.flushes += 1;
                    let records: Vec<PendingAckRecord> =
                        batch.iter().map(|(r, _)| r.clone()).collect();
                    let callbacks = batch.into_iter().map(|(_, cb)| cb).collect();
                    Some((self.ledger.append_async(encode_batch(&records)), callbacks))
                } else {
                    None
                }
            }
        };
        run(done);
        // Attached after the writer's lock is released: with a store that
        // completes inline the callbacks run here, on the calling thread.
        if let Some((completion, callbacks)) = queued {
            completion.on_complete(move |r| {
                let size = callbacks.len();
                for (i, cb) in callbacks.into_iter().enumerate() {
                    cb(r.clone()
                        .map(|position| AppendAck {
                            position,
                            batch_size: size,
                            batch_index: i,
                        })
                        .map_err(PendingAckError::Ledger));
                }
            });
        }
    }

    /// Closes the writer (idempotent): fails unflushed callbacks, cancels the
    /// flush timer, refuses later appends. Returns how many callbacks failed.
    pub fn close(&self) -> usize {
        let (failed, timer) = {
            let mut i = self.inner.lock();
            if i.state != WriterState::Open {
                return 0;
            }
            i.state = WriterState::Closing;
            let failed = std::mem::take(&mut i.buffer);
            i.bytes = 0;
            let timer = i.flush_timer.take();
            if let Some(id) = timer {
                self.timer.cancel(id);
            }
            i.state = WriterState::Closed;
            (failed, timer)
        };
        let n = failed.len();
        tracing::debug!(
            failed = n,
            cancelled_timer = timer.is_some(),
            "pending-ack buffered writer closed"
        );
        for (_, cb) in failed {
            cb(Err(PendingAckError::WriterClosed));
        }
        n
    }

    /// Current lifecycle state.
    pub fn state(&self) -> WriterState {
        self.inner.lock().state
    }

    /// Whether a flush timer is armed.
    pub fn has_flush_timer(&self) -> bool {
        self.inner.lock().flush_timer.is_some()
    }

    /// Records buffered and not yet flushed.
    pub fn buffered(&self) -> usize {
        self.inner.lock().buffer.len()
    }

    /// Batches flushed so far.
    pub fn flushes(&self) -> u64 {
        self.inner.lock().flushes
    }

    /// Times the flush timer ran.
    pub fn timer_runs(&self) -> u64 {
        self.inner.lock().timer_runs
    }
}

impl PendingAckRecord {
    fn encoded_len_hint(&self) -> usize {
        self.to_wire().encoded_len()
    }
}

fn run(done: Completions) {
    for (cb, r) in done {
        cb(r);
    }
}
