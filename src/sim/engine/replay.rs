//! Pending-ack replay: the truth a replay must find, the injected read
//! failures, driving the handles' replay work, and the replay rules.

use super::*;

/// Read faults planned for one pending-ack log's replay: read number
/// `fail_at.0` (counted over every read of the log) fails with `fail_at.1`;
/// from read `persistent.0` on, every read fails with `persistent.1` until
/// the replay completes (a fence or a closed cursor does not go away by
/// retrying).
#[derive(Debug, Default)]
pub(super) struct ReplayReadPlan {
    reads: u64,
    fail_at: Option<(u64, ReadFailureKind)>,
    persistent: Option<(u64, ReadFailureKind)>,
    injected: u64,
}

/// Every failure class Pulsar's replay classification distinguishes.
pub(super) const REPLAY_FAILURE_KINDS: [ReadFailureKind; 6] = [
    ReadFailureKind::StorageUnavailable,
    ReadFailureKind::TooManyRequests,
    ReadFailureKind::NonRecoverableData,
    ReadFailureKind::LedgerNotExist,
    ReadFailureKind::Fenced,
    ReadFailureKind::CursorAlreadyClosed,
];

/// The pending-ack records of one subscription known durable (their append
/// callback succeeded): the transactions a replay must find open.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct PaTruth {
    individual: BTreeSet<TxnId>,
    cumulative: Option<TxnId>,
    /// Per transaction, the ledgers of the pending-ack log holding one of
    /// its durable records (ACK, COMMIT or ABORT): a lost ledger can change
    /// what a replay finds only for the transactions it held records of.
    record_ledgers: BTreeMap<TxnId, BTreeSet<i64>>,
}

impl PaTruth {
    /// The transactions with a durable record in one of `lost` (ledger ids).
    fn touched_by(&self, lost: &BTreeSet<i64>) -> BTreeSet<TxnId> {
        self.record_ledgers
            .iter()
            .filter(|(_, ledgers)| !ledgers.is_disjoint(lost))
            .map(|(t, _)| *t)
            .collect()
    }
}

/// Whether a replay that found `found` (individual, cumulative) agrees with
/// `expected` (the durable records), allowing any difference for the
/// transactions in `touched` (those with a record in a skipped lost
/// ledger). Pulsar's `OpReadEntry` with `autoSkipNonRecoverableData` moves
/// the read position to the next valid ledger, so the replay never sees the
/// lost ledger's records: a transaction whose ACK was there is not found,
/// one whose COMMIT/ABORT was there is found still open. Every other
/// transaction must be exactly as the log says: the simulator loses the
/// ledger holding the first record the next replay needs, so skipping it
/// replays a suffix of the log, which holds no pending position the whole
/// log does not, and no later acknowledgement is rejected as a conflict.
fn replay_agrees(
    found: (&BTreeSet<TxnId>, Option<TxnId>),
    expected: &PaTruth,
    touched: &BTreeSet<TxnId>,
) -> bool {
    let individual = found
        .0
        .symmetric_difference(&expected.individual)
        .all(|t| touched.contains(t));
    let cumulative = found.1 == expected.cumulative
        || found.1.is_some_and(|t| touched.contains(&t))
        || expected.cumulative.is_some_and(|t| touched.contains(&t));
    individual && cumulative
}

pub(super) type SharedPaTruth = Arc<std::sync::Mutex<PaTruth>>;

/// An append callback that records `record` in `truth` once it is durable.
pub(super) fn pa_durable(
    truth: &SharedPaTruth,
    record: &PendingAckRecord,
) -> crate::pending_ack::AppendCallback {
    use crate::pending_ack::PendingAckOp;
    let truth = Arc::clone(truth);
    let txn = record.txn_id;
    let (op, ack_type) = (record.op, record.ack_type);
    Box::new(move |r| {
        let Ok(ack) = r else { return };
        let mut t = truth.lock().unwrap_or_else(|e| e.into_inner());
        t.record_ledgers
            .entry(txn)
            .or_default()
            .insert(ack.position.ledger_id);
        match (op, ack_type) {
            (PendingAckOp::Ack, AckType::Individual) => {
                t.individual.insert(txn);
            }
            (PendingAckOp::Ack, AckType::Cumulative) => {
                t.cumulative = Some(txn);
            }
            (PendingAckOp::Commit | PendingAckOp::Abort, _) => {
                t.individual.remove(&txn);
                if t.cumulative == Some(txn) {
                    t.cumulative = None;
                }
            }
        }
    })
}

/// Whether a replay failure is (caused by) non-recoverable data.
pub(super) fn is_non_recoverable(e: &crate::pending_ack::PendingAckError) -> bool {
    use crate::pending_ack::PendingAckError as E;
    match e {
        E::Ledger(l) => l.is_non_recoverable(),
        E::InitFailed { cause, .. } => is_non_recoverable(cause),
        _ => false,
    }
}

/// Makes every read of `ledger` fail as storage-unavailable while `outage`
/// is set (the simulated BookKeeper outage window), and injects the
/// replay plan's failures, if any.
pub(super) fn install_read_faults(
    ledger: &ManagedLedger,
    outage: &Arc<AtomicBool>,
    plan: Option<Arc<std::sync::Mutex<ReplayReadPlan>>>,
) {
    let outage = Arc::clone(outage);
    ledger.faults().set_policy(move |_| {
        if outage.load(Ordering::Relaxed) {
            return Some(ReadFailureKind::StorageUnavailable);
        }
        let plan = plan.as_ref()?;
        let mut p = plan.lock().unwrap_or_else(|e| e.into_inner());
        p.reads += 1;
        let n = p.reads;
        if let Some((from, kind)) = p.persistent {
            if n >= from {
                p.injected += 1;
                return Some(kind);
            }
        }
        if let Some((at, kind)) = p.fail_at {
            if n == at {
                p.fail_at = None;
                p.injected += 1;
                return Some(kind);
            }
        }
        None
    });
}

/// [`Sabotage::LoseReplayReadCallbacks`]: every issued replay read is
/// dropped unfinished (a read whose callback never arrives), so the replay
/// attempt waits for it until it is interrupted.
#[derive(Debug)]
pub(super) struct LostReads;

impl crate::pending_ack::ReadDispatcher for LostReads {
    fn dispatch(&self, job: crate::pending_ack::ReadJob) {
        drop(job);
    }
}

/// A subscription's replay ended (complete, or ended by a completing
/// failure): its persistent injected read failure is disarmed and the
/// failures the plan injected are counted.
fn end_replay_plan(plan: &std::sync::Mutex<ReplayReadPlan>, activity: &mut Activity) {
    let mut plan = plan.lock().unwrap_or_else(|e| e.into_inner());
    plan.persistent = None;
    activity.replay_read_failures_injected += std::mem::take(&mut plan.injected);
}

impl Sim<'_> {
    /// Runs queued replay work and schedules the next retry timer.
    pub(super) fn drive_replays(&mut self) -> Result<(), SimError> {
        let Some(b) = self.broker.as_mut() else {
            return Ok(());
        };
        self.heartbeat.enter("pending_ack replay");
        b.pool.run_pending();
        let mut newly_ready = Vec::new();
        let mut reload = false;
        let mut reload_topic = false;
        let now = self.sched.now();
        for (s, sub) in b.subs.iter_mut().enumerate() {
            let s = SubIdx(s);
            let Some(h) = &sub.pending_ack else { continue };
            match h.state() {
                HandleState::Ready if !sub.ready && !self.pa_awaiting_reload[s] => {
                    let stats = h.stats();
                    let partial = stats
                        .completed
                        .as_ref()
                        .is_some_and(|r| r.completing_failure.is_some());
                    if partial {
                        // A completing failure leaves the handle Ready
                        // with what it read (Pulsar's TransactionTest pins
                        // that). In Pulsar the store is gone then: a fenced
                        // log was taken over (this broker's appends to it
                        // fail), a closed cursor is being torn down with its
                        // topic, non-recoverable data with auto-skip on
                        // reaches the store only when nothing readable
                        // follows. The injected failures are one-shot, so a
                        // broker serving from that partial state would
                        // append records the log's next replay reads
                        // differently: nothing is served from it, the topic
                        // is reloaded and its next owner's replay must find
                        // the whole log, which the truth still describes.
                        self.pa_awaiting_reload[s] = true;
                        self.pa_not_ready_since[s] = None;
                        self.activity.replays_ended_by_completing_failure += 1;
                        end_replay_plan(&self.replay_plans[s], &mut self.activity);
                        reload_topic = true;
                        continue;
                    }
                    sub.ready = true;
                    newly_ready.push(s);
                    self.pa_not_ready_since[s] = None;
                    self.pa_ledger_lost[s].clear();
                    let summary = h.summary();
                    // A replay reported complete holds exactly the
                    // transactions open in the log up to its end at the
                    // start, except those with a record in a skipped lost
                    // ledger.
                    let found_individual: BTreeSet<TxnId> =
                        summary.individual.keys().copied().collect();
                    let found_cumulative = summary.cumulative.map(|(t, _)| t);
                    // Transactions with a record in a skipped lost ledger:
                    // their commits may be lost with it.
                    let mut lost_txns = BTreeSet::new();
                    if let Some((_, lost)) = self.pa_expected[s].take() {
                        // What is durable now: no append happens while the
                        // subscription replays, and records the crashed
                        // broker's writer flushed on close may report
                        // durable only after the replay started.
                        let expected = self.pa_truth[s]
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .clone();
                        let touched = expected.touched_by(&lost);
                        lost_txns.clone_from(&touched);
                        let bad = !replay_agrees(
                            (&found_individual, found_cumulative),
                            &expected,
                            &touched,
                        );
                        if bad {
                            let missing: Vec<String> = expected
                                .individual
                                .difference(&found_individual)
                                .filter(|t| !touched.contains(t))
                                .map(|t| format!("{t:?}"))
                                .collect();
                            let extra: Vec<String> = found_individual
                                .difference(&expected.individual)
                                .filter(|t| !touched.contains(t))
                                .map(|t| format!("{t:?}"))
                                .collect();
                            self.checker.replay_violation(
                                &sub.name,
                                &format!(
                                    "reported complete after {} attempts without every record up to the log's end: {} open transactions expected, {} found (missing: [{}]; unexpected: [{}]; cumulative expected {:?}, found {:?}; {} transactions with a record in a lost ledger exempt)",
                                    stats.attempts,
                                    expected.individual.len(),
                                    found_individual.len(),
                                    missing.join(", "),
                                    extra.join(", "),
                                    expected.cumulative,
                                    found_cumulative,
                                    touched.len(),
                                ),
                                now,
                            );
                        }
                    }
                    // From here on the broker's view is the replayed one.
                    {
                        let mut truth = self.pa_truth[s].lock().unwrap_or_else(|e| e.into_inner());
                        truth.individual = found_individual;
                        truth.cumulative = found_cumulative;
                    }
                    end_replay_plan(&self.replay_plans[s], &mut self.activity);
                    // Commits the log still holds that the subscription's
                    // persisted state lacks (the broker crashed before
                    // persisting the subscription): re-applied to the
                    // subscription, persisted with its next persist.
                    let view =
                        CursorSubscription::new(Arc::clone(&sub.cursor), Arc::clone(&sub.deletion));
                    for ack in h.committed_acks() {
                        view.apply(&ack, b.ledger.as_ref())
                            .map_err(comp("re-apply a committed ack"))?;
                        sub.recovered_commits = true;
                        self.activity.commits_reapplied += 1;
                        match ack {
                            CommittedAck::Entry(p) => {
                                if let Some((_, refs)) = self.committed_refs[s].get(&p) {
                                    sub.unpersisted.extend(refs.iter().copied());
                                }
                            }
                            CommittedAck::MarkDelete(p) => {
                                sub.unpersisted_cumulative =
                                    sub.unpersisted_cumulative.max(Some(p));
                            }
                            CommittedAck::BatchIndexes { .. } => {}
                        }
                    }
                    // A committed ack is never redelivered after a restart:
                    // every entry whose commit was durable and not yet
                    // persisted with the subscription is deleted again.
                    for (p, (txn, _)) in &self.committed_refs[s] {
                        if !lost_txns.contains(txn) && !sub.deletion.is_message_deleted(*p) {
                            self.checker.replay_violation(
                                &sub.name,
                                &format!(
                                    "committed ack lost in a restart: {p} (transaction {txn:?}, COMMIT durable) is not deleted after the replay and will be redelivered"
                                ),
                                now,
                            );
                        }
                    }
                    let deletion = Arc::clone(&sub.deletion);
                    self.committed_refs[s].retain(|p, _| deletion.is_message_deleted(*p));
                    // Transactions left open by the restart are aborted (the
                    // coordinator timed them out): their messages are redelivered.
                    for txn in summary.individual.keys() {
                        let record = PendingAckRecord::abort(*txn, AckType::Individual);
                        let durable = pa_durable(&self.pa_truth[s], &record);
                        h.append(record, durable);
                    }
                    if let Some((txn, _)) = summary.cumulative {
                        let record = PendingAckRecord::abort(txn, AckType::Cumulative);
                        let durable = pa_durable(&self.pa_truth[s], &record);
                        h.append(record, durable);
                    }
                    let completed_reads = stats
                        .completed
                        .as_ref()
                        .map_or(0, |r| r.reads_issued as u64);
                    self.activity.replays_completed += 1;
                    self.activity.replay_failed_attempts += stats.attempts.saturating_sub(1);
                    self.activity.replay_reads_in_failed_attempts +=
                        stats.reads_issued.saturating_sub(completed_reads);
                }
                HandleState::Error if !self.pa_error_seen[s] => {
                    self.pa_error_seen[s] = true;
                    let error = h.error();
                    let auto_skip = self.w.faults.pending_ack_auto_skip || self.operator_auto_skip;
                    let expected = !auto_skip && error.as_ref().is_some_and(is_non_recoverable);
                    if expected {
                        // Pulsar with auto-skip off: the subscription fails to
                        // load until an operator turns auto-skip on and
                        // reloads the topic.
                        self.activity.replay_gave_up_non_recoverable += 1;
                        reload = true;
                    } else {
                        self.checker.replay_violation(
                            &sub.name,
                            &format!("gave up with {error:?} (auto-skip {auto_skip})"),
                            now,
                        );
                    }
                }
                _ => {}
            }
        }
        if let Some(due) = b.timer.next_due_ms() {
            self.sched.at(due, Ev::ReplayTimers);
        }
        for s in newly_ready {
            self.schedule_dispatch(s);
        }
        if reload_topic && !self.topic_reload_planned {
            self.topic_reload_planned = true;
            self.faults_pending += 1;
            self.sched.after(0, Ev::TopicReload);
        }
        if reload && !self.operator_reload_planned {
            self.operator_reload_planned = true;
            self.faults_pending += 1;
            self.sched.after(
                self.w.faults.operator_auto_skip_after_ms,
                Ev::OperatorReload,
            );
        }
        Ok(())
    }

    /// Whether the pending-ack logs are opened with
    /// `auto_skip_non_recoverable_data` (the workload's setting, or on once
    /// the operator turned it on).
    pub(super) fn pa_auto_skip(&self) -> bool {
        self.w.faults.pending_ack_auto_skip || self.operator_auto_skip
    }

    /// The operator turns auto-skip on and reloads the topic (a restart as
    /// far as every component and client is concerned).
    pub(super) fn operator_reload(&mut self) -> Result<(), SimError> {
        self.operator_auto_skip = true;
        self.activity.operator_reloads += 1;
        self.reload_topic()
    }

    /// The topic is unloaded and loaded again (a restart as far as every
    /// component and client is concerned).
    pub(super) fn reload_topic(&mut self) -> Result<(), SimError> {
        self.topic_reload_planned = false;
        self.checker.restarted();
        self.open_broker()?;
        for s in SubIdx::all(self.w.subscriptions) {
            for c in ConsumerIdx::all(self.w.consumers_per_subscription) {
                self.resubscribe_on_new_connection(s, c)?;
            }
        }
        Ok(())
    }

    /// At a restart (the first `faults.replay_read_failures` ones), each
    /// subscription's replay gets one read failure on a read after its
    /// first (so entries were read ahead and not yet applied), of a class
    /// picked from every class Pulsar's classification distinguishes; a
    /// fence or a closed cursor then persists until the replay completes.
    pub(super) fn arm_replay_read_failures(&mut self) {
        if !self.opts.faults
            || self.w.txn_ack_ratio == 0.0
            || self.activity.restarts > u64::from(self.w.faults.replay_read_failures)
        {
            return;
        }
        for s in SubIdx::all(self.w.subscriptions) {
            // Half transient (the attempt fails, rewinds and retries),
            // half one of the four other classes.
            let kind = if self.rng.random_bool(0.5) {
                REPLAY_FAILURE_KINDS[self.rng.random_range(0..2)]
            } else {
                REPLAY_FAILURE_KINDS[self.rng.random_range(2..REPLAY_FAILURE_KINDS.len())]
            };
            let nth = self.rng.random_range(2..=3u64);
            let mut plan = self.replay_plans[s]
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let at = plan.reads + nth;
            if matches!(
                kind,
                ReadFailureKind::Fenced | ReadFailureKind::CursorAlreadyClosed
            ) {
                plan.persistent = Some((at, kind));
                plan.fail_at = None;
            } else {
                plan.fail_at = Some((at, kind));
                plan.persistent = None;
            }
        }
    }

    /// A pending-ack replay must complete within the replay bound of the
    /// broker's start (or the end of the last outage).
    pub(super) fn check_replay_bound(&mut self) {
        let now = self.sched.now();
        for s in SubIdx::all(self.w.subscriptions) {
            let Some(since) = self.pa_not_ready_since[s] else {
                continue;
            };
            if self.replay_bound_reported[s] || now.saturating_sub(since) <= REPLAY_BOUND_MS {
                continue;
            }
            if self.outage.load(Ordering::Relaxed)
                || self.operator_reload_planned && self.activity.operator_reloads == 0
            {
                continue;
            }
            self.replay_bound_reported[s] = true;
            let attempts = self
                .broker
                .as_ref()
                .and_then(|b| b.subs[s].pending_ack.as_ref())
                .map_or(0, |h| h.stats().attempts);
            self.checker.replay_violation(
                &format!("sub-{s}"),
                &format!(
                    "not complete {}ms after the broker started it ({attempts} attempts; bound {REPLAY_BOUND_MS}ms)",
                    now - since
                ),
                now,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn txn(n: u64) -> TxnId {
        TxnId {
            most_sig_bits: 0,
            least_sig_bits: n,
        }
    }

    /// The log's truth after ACK(1) and ACK(2) in ledger 1, COMMIT(2) in
    /// ledger 2, ACK(3) in ledger 3: transactions 1 and 3 open.
    fn truth() -> PaTruth {
        let t = SharedPaTruth::default();
        let durable = |record: PendingAckRecord, ledger_id: i64| {
            pa_durable(&t, &record)(Ok(crate::pending_ack::AppendAck {
                position: Position::new(ledger_id, 0),
                batch_size: 1,
                batch_index: 0,
            }));
        };
        let ack = |n| PendingAckRecord::individual_ack(txn(n), Vec::new());
        durable(ack(1), 1);
        durable(ack(2), 1);
        durable(PendingAckRecord::commit(txn(2), AckType::Individual), 2);
        durable(ack(3), 3);
        let out = t.lock().unwrap().clone();
        out
    }

    #[test]
    fn a_replay_with_no_lost_ledger_must_find_exactly_the_open_transactions() {
        let t = truth();
        let none = t.touched_by(&BTreeSet::new());
        assert!(none.is_empty());
        let exact: BTreeSet<TxnId> = [txn(1), txn(3)].into();
        assert!(replay_agrees((&exact, None), &t, &none));
        // A partial replay (missing 3) and one that kept a committed
        // transaction open (2) are both rejected.
        assert!(!replay_agrees((&[txn(1)].into(), None), &t, &none));
        assert!(!replay_agrees(
            (&[txn(1), txn(2), txn(3)].into(), None),
            &t,
            &none
        ));
        assert!(!replay_agrees((&exact, Some(txn(3))), &t, &none));
    }

    #[test]
    fn a_skipped_lost_ledger_exempts_only_the_transactions_with_a_record_in_it() {
        let t = truth();
        // Ledger 2 lost: COMMIT(2) is never read, so 2 may be found open.
        let touched = t.touched_by(&[2].into());
        assert_eq!(touched, [txn(2)].into());
        assert!(replay_agrees(
            (&[txn(1), txn(2), txn(3)].into(), None),
            &t,
            &touched
        ));
        // Transactions 1 and 3 have no record there: still exact.
        assert!(!replay_agrees(
            (&[txn(1), txn(2)].into(), None),
            &t,
            &touched
        ));
        // Ledger 1 lost: ACK(1) and ACK(2) are never read.
        let touched = t.touched_by(&[1].into());
        assert_eq!(touched, [txn(1), txn(2)].into());
        assert!(replay_agrees((&[txn(3)].into(), None), &t, &touched));
        assert!(!replay_agrees((&BTreeSet::new(), None), &t, &touched));
    }
}
