//! The run's event log: what the clients did and saw, in one total order.
//!
//! Every record carries `i` (its place in the order, assigned under the log's
//! lock) and `boot` (which incarnation of `serve` was current when it was
//! written: a `kill` record starts the next one). The judge reads only this
//! log, so a doctored copy of it is all a negative control needs.

use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

/// A message id as magnetar reports it (ledger_id, entry_id, batch_index,
/// batch_size); ordered by position: (ledger_id, entry_id, batch_index).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Mid {
    pub l: u64,
    pub e: u64,
    pub b: i32,
    pub n: i32,
}

impl Mid {
    pub fn pos(&self) -> (u64, u64, i32) {
        (self.l, self.e, self.b)
    }
    pub fn entry(&self) -> (u64, u64) {
        (self.l, self.e)
    }
    pub fn from_magnetar(m: &magnetar::MessageId) -> Self {
        Mid {
            l: m.ledger_id,
            e: m.entry_id,
            b: m.batch_index,
            n: m.batch_size,
        }
    }
}

impl std::fmt::Display for Mid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "({},{},{}/{})", self.l, self.e, self.b, self.n)
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Ev {
    /// A send is about to be issued (payload `{"p":P,"seq":S,"key":K}`, or
    /// with `txn` for a transactional one).
    Attempt {
        topic: String,
        p: u32,
        seq: u32,
        key: String,
        txn: Option<String>,
    },
    /// The send's outcome: `ok` with the broker's message id, or the error.
    Sent {
        topic: String,
        p: u32,
        seq: u32,
        ok: bool,
        mid: Option<Mid>,
        err: Option<String>,
    },
    /// A message handed to the application by a consumer.
    Recv {
        topic: String,
        sub: String,
        c: String,
        mid: Mid,
        body: String,
        /// The message's partition key (`MessageMetadata.partition_key`).
        mkey: Option<String>,
        redelivery: u32,
        /// A one-message batch that magnetar handed over still framed
        /// (see `plain::app_message`), unwrapped by this program.
        #[serde(default)]
        unwrapped: bool,
    },
    /// An acknowledgment and the broker's answer (`ok`: an ACK_RESPONSE
    /// without error). `sent_boot` is the boot when it was issued.
    Ack {
        topic: String,
        sub: String,
        c: String,
        mid: Mid,
        cumulative: bool,
        ok: bool,
        err: Option<String>,
        sent_boot: u32,
        txn: Option<String>,
    },
    Nack {
        sub: String,
        c: String,
        mid: Mid,
    },
    /// A receive that failed (a connection lost at the kill, ...).
    RecvErr {
        sub: String,
        c: String,
        err: String,
    },
    Resubscribed {
        sub: String,
        c: String,
    },
    Kill,
    Restart,
    /// A second consumer on the Exclusive subscription: refused (`ok`) or not.
    ExclusiveBusy {
        ok: bool,
        err: String,
    },
    Produced,
    Stopping,
    /// `serve`'s exit status after SIGTERM at the end.
    Stopped {
        rc: i32,
    },
    /// Transactions: a transaction opened, its end requested, its end answered.
    TxnOpen {
        txn: String,
    },
    TxnStep {
        txn: String,
        step: String,
        ok: bool,
        err: Option<String>,
    },
    TxnEnd {
        txn: String,
        commit: bool,
        /// None: no answer (the broker was killed during it).
        ok: Option<bool>,
        err: Option<String>,
    },
    Note {
        text: String,
    },
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Rec {
    pub i: u64,
    pub boot: u32,
    /// Milliseconds since the run started.
    pub t: u64,
    #[serde(flatten)]
    pub ev: Ev,
}

struct Inner {
    out: Option<File>,
    next: u64,
    boot: u32,
    all: Vec<Rec>,
}

pub struct Log {
    start: Instant,
    inner: Mutex<Inner>,
}

impl Log {
    pub fn create(path: &Path) -> std::io::Result<Log> {
        Ok(Log {
            start: Instant::now(),
            inner: Mutex::new(Inner {
                out: Some(File::create(path)?),
                next: 0,
                boot: 1,
                all: Vec::new(),
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn boot(&self) -> u32 {
        self.lock().boot
    }

    pub fn write(&self, ev: Ev) {
        let mut g = self.lock();
        if matches!(ev, Ev::Kill) {
            g.boot += 1;
        }
        let rec = Rec {
            i: g.next,
            boot: g.boot,
            t: self.start.elapsed().as_millis() as u64,
            ev,
        };
        g.next += 1;
        if let Some(f) = g.out.as_mut() {
            // The log is for the judge and for a post-mortem of a hang: one
            // line per record, written through.
            let line = serde_json::to_string(&rec).expect("a record serialises");
            let _ = writeln!(f, "{line}");
        }
        g.all.push(rec);
    }

    pub fn snapshot(&self) -> Vec<Rec> {
        self.lock().all.clone()
    }
}

pub fn read(path: &Path) -> Result<Vec<Rec>, String> {
    let f = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = Vec::new();
    for (n, line) in BufReader::new(f).lines().enumerate() {
        let line = line.map_err(|e| format!("{}: {e}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        out.push(
            serde_json::from_str(&line)
                .map_err(|e| format!("{}:{}: {e}", path.display(), n + 1))?,
        );
    }
    Ok(out)
}

/// The payload the producers send: `{"p":P,"seq":S,"key":K}` (plus `txn`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Body {
    pub p: u32,
    pub seq: u32,
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub txn: Option<String>,
}
