//! Crash points: the broker dies at a durable write of the store
//! ([`CrashStorage`]), without a clean close. Whatever the event that hit
//! the crash point did afterwards belongs to the dead process: nothing of
//! it reaches a client (every client reconnects on a new connection, so the
//! frames in flight to the old ones are dropped; acks and commits in flight
//! to the dead broker carry its generation and are dropped too). Every
//! in-memory structure of the broker is dropped, the store goes back to
//! exactly what was fsynced, and the broker recovers from it as after a
//! restart (cursor, deletion state, delayed tracker, pending-ack replay).
//!
//! What the dead broker wrote durably but never learned of (a commit that
//! reached the disk while its caller saw an error), the checker is told
//! from the recovered store: an append it holds is published, an ack it
//! holds is acknowledged, a reset it holds completed. Everything else the
//! dead broker applied in memory is simply gone, which the checker's
//! restart rules already allow (un-persisted acks may be redelivered).

use super::*;
use crate::sim::crash_storage::{CrashKind, CrashPoint, CrashRecord, CrashStorage};

/// Largest distance, in durable writes, between a drawn crash point's
/// arming (at a planned virtual time) and the crash.
const MID_RUN_SPREAD: u64 = 8;
/// A crash during recovery falls at one of the first this many durable
/// writes after the previous crash's reopen.
const RECOVERY_SPREAD: u64 = 4;

/// The crash points of a run still to take.
#[derive(Debug, Default)]
pub(super) struct CrashPlan {
    /// Explicit points (`faults.crash_at_writes`), in order.
    explicit: VecDeque<u64>,
    /// Drawn points that fall during the recovery after the next crash.
    recovery_points: u32,
}

/// A publish whose append failed because the store died: the producer got
/// no receipt. After the reopen the store says whether it was durable.
#[derive(Debug)]
pub(super) struct UnreceiptedPublish {
    /// The topic's last entry before the append.
    pub(super) after: Position,
    /// Per entry of the append, its messages' (key, deliver_at_ms).
    pub(super) entries: Vec<Vec<(u32, u64)>>,
    /// `published` and the producers' sequence ids before the append.
    pub(super) published_before: u64,
    pub(super) producer_seq_before: Vec<u64>,
}

impl Sim<'_> {
    /// The in-memory store with crash points, if the run has them. The
    /// store exists before the broker's first start (created and closed
    /// cleanly): redb does not create a database atomically (a crash
    /// between the fsyncs of its creation leaves an image it refuses to
    /// open, see `crash_storage`'s tests), and the crash points are the
    /// broker's, counted from its first open of an existing store.
    pub(super) fn crash_storage_for(
        w: &Workload,
        opts: &SimOptions,
    ) -> Result<Option<CrashStorage>, SimError> {
        if !(opts.faults && w.faults.has_crash_points()) {
            return Ok(None);
        }
        if opts.trace_dir.is_some() {
            // The trace specs' recovery actions assume the store holds what
            // the last persist line says; a crash may undo it.
            return Err(SimError::Component(
                "trace recording with crash points: the trace specs do not model a crash (set faults.crash_points = 0 and faults.crash_at_writes = [])".into(),
            ));
        }
        let storage = CrashStorage::new();
        RedbStore::open_on_backend(storage.backend(), SyncMode::Immediate, STORE_CACHE_BYTES)
            .map_err(comp("create the store on the crash storage"))?;
        Ok(Some(storage))
    }

    /// Whether the store died at a crash point.
    pub(super) fn store_dead(&self) -> bool {
        self.crash.as_ref().is_some_and(CrashStorage::is_dead)
    }

    /// Plans the workload's crash points: the explicit ones are armed now
    /// (before the first open) and after each crash; the drawn ones at
    /// planned times over the publish window (`Ev::ArmCrash`), except
    /// that every drawn point after the first falls, with probability 1/3,
    /// during the recovery after the previous crash.
    pub(super) fn plan_crashes(&mut self) {
        if self.crash.is_none() {
            return;
        }
        self.crash_plan.explicit = self.w.faults.crash_at_writes.iter().copied().collect();
        self.arm_next_explicit();
    }

    /// Schedules the drawn crash points over the publish window.
    pub(super) fn plan_drawn_crashes(&mut self, window: u64) {
        if self.crash.is_none() {
            return;
        }
        let n = self.w.faults.crash_points;
        let mut mid_run = 0u32;
        for i in 0..n {
            if i > 0 && self.rng.random_bool(1.0 / 3.0) {
                self.crash_plan.recovery_points += 1;
            } else {
                mid_run += 1;
            }
        }
        for i in 0..mid_run {
            // Offset from the restarts (at window·(i+1)/(restarts+1)).
            let at = (u128::from(window) * (2 * u128::from(i) + 1) / (2 * u128::from(mid_run)))
                as u64
                + 75;
            self.faults_pending += 1;
            self.sched.at(at, Ev::ArmCrash);
        }
    }

    fn draw_kind(&mut self) -> CrashKind {
        if self.rng.random_bool(0.5) {
            CrashKind::BeforeSync
        } else {
            CrashKind::AfterSync
        }
    }

    fn arm_next_explicit(&mut self) -> bool {
        let Some(k) = self.crash_plan.explicit.pop_front() else {
            return false;
        };
        let kind = self.draw_kind();
        if let Some(st) = &self.crash {
            st.arm(CrashPoint { k, kind });
        }
        true
    }

    /// `Ev::ArmCrash`: the store dies a few durable writes from now (or,
    /// while another point is armed, this one falls during the recovery
    /// after that crash).
    pub(super) fn arm_mid_run_crash(&mut self) {
        self.faults_pending = self.faults_pending.saturating_sub(1);
        let Some(st) = self.crash.clone() else {
            return;
        };
        if st.armed().is_some() {
            self.crash_plan.recovery_points += 1;
            return;
        }
        let k = st.durable_writes_since_open() + self.rng.random_range(1..=MID_RUN_SPREAD);
        let kind = self.draw_kind();
        st.arm(CrashPoint { k, kind });
    }

    /// Opens the store: on the file in the data dir, or on the crash
    /// storage. A crash storage that died (at a crash point, during the
    /// event or the close just before) first goes back to its durable
    /// image: the crash is counted and the next point armed.
    pub(super) fn open_store(&mut self) -> Result<RedbStore, SimError> {
        let Some(st) = self.crash.clone() else {
            return RedbStore::open_with_cache(
                self.store_path(),
                self.opts.sync,
                STORE_CACHE_BYTES,
            )
            .map_err(|e| SimError::DataDir {
                path: self.opts.data_dir.display().to_string(),
                reason: e.to_string(),
            });
        };
        if st.is_dead() {
            let point = st.recover();
            if let Some(p) = point {
                tracing::debug!(k = p.k, kind = ?p.kind, at_ms = self.sched.now(), "crash point taken");
                self.activity.crashes.push(CrashRecord {
                    k: p.k,
                    kind: p.kind,
                    at_ms: self.sched.now(),
                });
            }
            if !self.arm_next_explicit() && self.crash_plan.recovery_points > 0 {
                self.crash_plan.recovery_points -= 1;
                let k = self.rng.random_range(1..=RECOVERY_SPREAD);
                let kind = self.draw_kind();
                st.arm(CrashPoint { k, kind });
            }
        }
        RedbStore::open_on_backend(st.backend(), self.opts.sync, STORE_CACHE_BYTES)
            .map_err(comp("open the store on the crash storage"))
    }

    /// Opens the broker; a crash during its recovery is taken and the
    /// broker opens again, until one recovery survives.
    pub(super) fn open_broker_surviving_crashes(&mut self) -> Result<(), SimError> {
        loop {
            let opened = self.open_broker();
            if !self.store_dead() {
                return opened;
            }
        }
    }

    /// After an event: if the store died at a crash point, the broker
    /// crashes (see the module docs) and restarts; every client reconnects.
    pub(super) fn crash_if_dead(&mut self) -> Result<(), SimError> {
        if !self.store_dead() {
            return Ok(());
        }
        // What the dead broker applied but had not persisted, and the reset
        // it was making: the store may hold some of it.
        let unpersisted: Vec<(Vec<MessageRef>, Option<Position>)> = self
            .broker
            .as_mut()
            .map(|b| {
                b.subs
                    .iter_mut()
                    .map(|sub| {
                        (
                            std::mem::take(&mut sub.unpersisted),
                            sub.unpersisted_cumulative.take(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let reset = self.reset_in_flight.take();
        let publish = self.unreceipted_publish.take();
        self.checker.restarted();
        self.open_broker_surviving_crashes()?;
        self.reconcile_acks(unpersisted);
        if let Some((s, target)) = reset {
            self.reconcile_reset(s, target);
        }
        if let Some(p) = publish {
            self.reconcile_publish(p)?;
            if self.published < self.w.messages {
                self.sched.after(0, Ev::Publish);
            }
        }
        for s in SubIdx::all(self.w.subscriptions) {
            for c in ConsumerIdx::all(self.w.consumers_per_subscription) {
                self.resubscribe_on_new_connection(s, c)?;
            }
            self.schedule_dispatch(s);
        }
        Ok(())
    }

    /// Acks the dead broker applied but had not persisted: those the
    /// recovered cursor holds were durable (their commit reached the disk
    /// after the broker stopped waiting for it) and count; the others are
    /// lost with the broker and may be redelivered.
    fn reconcile_acks(&mut self, unpersisted: Vec<(Vec<MessageRef>, Option<Position>)>) {
        let now = self.sched.now();
        let Some(b) = self.broker.as_ref() else {
            return;
        };
        for (s, (messages, cumulative)) in unpersisted.into_iter().enumerate() {
            let sub = &b.subs[s];
            for m in messages {
                if sub.deletion.is_message_deleted(m.position) {
                    self.checker.acked(&sub.name, m, now);
                    self.acked_at_last_check[s] += 1;
                }
            }
            if let Some(upto) = cumulative {
                if sub.deletion.mark_delete_position() >= upto {
                    self.acked_at_last_check[s] += self.checker.cumulative_acked(&sub.name, upto);
                }
            }
        }
    }

    /// A seek or clear-backlog the broker died in: if the recovered cursor
    /// holds its reset, it completed (the admin got no answer).
    fn reconcile_reset(&mut self, s: SubIdx, target: Position) {
        let now = self.sched.now();
        let Some(b) = self.broker.as_ref() else {
            return;
        };
        let sub = &b.subs[s];
        let mark_delete = sub.deletion.mark_delete_position();
        if mark_delete >= target {
            let name = sub.name.clone();
            self.seeks_done[s] = self.checker.seek_completed(&name, mark_delete, now);
        }
    }

    /// A publish the broker died in: if the recovered topic holds its
    /// entries, they are published (the producer got no receipt, and with
    /// deduplication does not send them again); otherwise the producers
    /// publish those messages again.
    fn reconcile_publish(&mut self, p: UnreceiptedPublish) -> Result<(), SimError> {
        let Some(b) = self.broker.as_ref() else {
            return Ok(());
        };
        let stored: Vec<Position> = b
            .ledger
            .ledgers()
            .into_iter()
            .filter(|(id, _)| *id >= p.after.ledger_id)
            .flat_map(|(id, n)| (0..n).map(move |e| Position::new(id, e)))
            .filter(|pos| *pos > p.after)
            .take(p.entries.len())
            .collect();
        if stored.is_empty() {
            self.published = p.published_before;
            self.producer_seq = p.producer_seq_before;
            return Ok(());
        }
        if stored.len() != p.entries.len() {
            return Err(SimError::Component(format!(
                "torn append after a crash: {} of {} entries after {} are in the store",
                stored.len(),
                p.entries.len(),
                p.after
            )));
        }
        for (pos, msgs) in stored.iter().zip(&p.entries) {
            for (i, (key, deliver_at)) in msgs.iter().enumerate() {
                self.checker.published(
                    MessageRef {
                        position: *pos,
                        batch_index: i as u32,
                    },
                    *key,
                    *deliver_at,
                );
            }
        }
        Ok(())
    }

    /// At the end of the run: the crash points not reached and the store's
    /// figures go into the report.
    pub(super) fn finish_crashes(&mut self) {
        let Some(st) = &self.crash else {
            return;
        };
        let unreached = u64::from(st.disarm().is_some())
            + self.crash_plan.explicit.len() as u64
            + u64::from(self.crash_plan.recovery_points);
        self.activity.crash_points_unreached = unreached;
        self.activity.crash_storage = Some(st.stats());
    }
}
