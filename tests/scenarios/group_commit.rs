//! Group commit's completion handoff, written once and run by
//! `loom-tests/group_commit.rs` (every interleaving) and
//! `shuttle-tests/group_commit.rs` (random and PCT schedules): the shipped
//! [`GroupCommitter`] on an in-memory backend whose commit makes a
//! transaction's writes durable, with submitter threads that wait for
//! their completion and then check that their write is durable.
//!
//! Property (the group committer's "never early" rule): once a caller sees
//! its write's completion succeed, the write is in the durable state.
//! Negative control: the same committer with a write that completes its
//! caller when it is applied (inside the transaction, before the commit);
//! both checkers must find the caller that sees a completion whose write
//! is not durable yet.

use std::cell::RefCell;

use pulsar_core::__model::sync::{thread, Arc, Mutex};
use pulsar_core::ledger::{
    completion_pair, CommitBackend, Completer, FnWrite, GroupCommitConfig, GroupCommitter,
    StoreError, StoreWrite,
};

/// The durable state: the values of every committed transaction.
type Durable = Arc<Mutex<Vec<u32>>>;

/// In-memory backend: a transaction is a list of values; its commit
/// appends them to the durable state in one step.
struct ModelBackend {
    durable: Durable,
}

impl CommitBackend for ModelBackend {
    type Txn = RefCell<Vec<u32>>;

    fn begin(&mut self) -> Result<Self::Txn, StoreError> {
        Ok(RefCell::new(Vec::new()))
    }

    fn commit(&mut self, txn: Self::Txn) -> Result<(), StoreError> {
        self.durable.lock().extend(txn.into_inner());
        Ok(())
    }
}

fn abandoned() -> StoreError {
    StoreError::Backend("the committer stopped".into())
}

/// The shipped write shape: applied in the transaction, completed by the
/// committer after the commit.
fn write(value: u32, done: Completer<(), StoreError>) -> Box<dyn StoreWrite<RefCell<Vec<u32>>>> {
    Box::new(FnWrite::new(
        4,
        move |txn: &RefCell<Vec<u32>>| {
            txn.borrow_mut().push(value);
            Ok(())
        },
        move |r| done.complete(r),
    ))
}

/// Negative control: completes its caller as soon as it is applied.
struct EarlyWrite {
    value: u32,
    done: Option<Completer<(), StoreError>>,
}

impl StoreWrite<RefCell<Vec<u32>>> for EarlyWrite {
    fn apply(&mut self, txn: &RefCell<Vec<u32>>) -> Result<(), StoreError> {
        txn.borrow_mut().push(self.value);
        if let Some(done) = self.done.take() {
            done.complete(Ok(()));
        }
        Ok(())
    }

    fn finish(self: Box<Self>, _outcome: Result<(), StoreError>) {}
}

/// A write maker: the shipped shape or the negative control's.
type MakeWrite = fn(u32, Completer<(), StoreError>) -> Box<dyn StoreWrite<RefCell<Vec<u32>>>>;

/// Submits value `v` and waits for its completion; whether it was durable
/// when the completion returned (the check runs on the calling thread).
fn submit_and_wait(
    committer: &GroupCommitter<ModelBackend>,
    durable: &Durable,
    v: u32,
    make: MakeWrite,
) -> bool {
    let (completion, completer) = completion_pair(abandoned);
    committer.submit(make(v, completer));
    completion.wait().expect("the model's commits succeed");
    durable.lock().contains(&v)
}

/// `writers` threads (plus the calling thread) each submit one write and
/// wait for it; each checks its own value is durable once it completed.
fn run(writers: u32, make: MakeWrite) {
    let durable: Durable = Arc::new(Mutex::new(Vec::new()));
    let committer = Arc::new(GroupCommitter::start(
        ModelBackend {
            durable: Arc::clone(&durable),
        },
        GroupCommitConfig::default(),
    ));
    let threads: Vec<_> = (1..=writers)
        .map(|v| {
            let (committer, durable) = (Arc::clone(&committer), Arc::clone(&durable));
            thread::spawn(move || (v, submit_and_wait(&committer, &durable, v, make)))
        })
        .collect();
    let mut seen = vec![(0, submit_and_wait(&committer, &durable, 0, make))];
    for t in threads {
        seen.push(t.join().unwrap());
    }
    for (v, was_durable) in seen {
        assert!(
            was_durable,
            "write {v} completed before its commit: not durable yet"
        );
    }
    // Dropping the last handle drains the queue and joins the writer.
    drop(committer);
    let mut all = durable.lock().clone();
    all.sort_unstable();
    assert_eq!(
        all,
        (0..=writers).collect::<Vec<_>>(),
        "every write committed once"
    );
}

/// The shipped committer and write: never early.
pub fn completion_never_fires_before_its_commit(writers: u32) {
    run(writers, write);
}

/// Must fail with "completed before its commit".
pub fn early_completion_is_caught(writers: u32) {
    run(writers, |value, done| {
        Box::new(EarlyWrite {
            value,
            done: Some(done),
        })
    });
}
