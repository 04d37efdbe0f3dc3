//! Broker ack path: individual and cumulative acks into the cursor deletion
//! state, transactional acks through the pending-ack log first, commits.

use super::*;

impl Sim<'_> {
    pub(super) fn ack(
        &mut self,
        s: SubIdx,
        broker_generation: u64,
        key: ConsumerKey,
        position: Position,
        messages: Vec<MessageRef>,
        txn: Option<TxnId>,
    ) -> Result<(), SimError> {
        let Some(b) = self.broker.as_mut() else {
            return Ok(());
        };
        if b.generation != broker_generation {
            return Ok(()); // sent to a broker that has since restarted: lost
        }
        let sub = &mut b.subs[s];
        if sub.dispatcher.consumer(key).is_none() {
            // Sent on a connection since closed: never processed (Pulsar
            // drops a closed connection's unread frames). The message was
            // handed back for redelivery when the consumer went away.
            return Ok(());
        }
        let _ = sub.dispatcher.acknowledge(key, position);
        let acker = sub.client_of(key).map_or(usize::MAX, |c| c.0);
        let now = self.sched.now();
        self.checker.ack_applied(&sub.name, acker, &messages, now);
        if let (Some(txn), Some(h)) = (txn, &sub.pending_ack) {
            // Every 16th transactional ack, a probe: a transactional ack of
            // the subscription's mark-delete entry (already deleted) must be
            // refused as a conflict and write nothing (Pulsar checks the
            // subscription cursor: TransactionConflictException). Refused,
            // it changes nothing, so the run is the same with or without it.
            self.txn_acks_seen += 1;
            let md = sub.deletion.mark_delete_position();
            if self.txn_acks_seen.is_multiple_of(16) && md.entry_id >= 0 {
                let probe = TxnId::new(1, self.txn_acks_seen);
                let out = Arc::new(std::sync::Mutex::new(None));
                let o = Arc::clone(&out);
                h.append(
                    PendingAckRecord::individual_ack(probe, vec![AckedPosition::whole(md)]),
                    Box::new(move |r| {
                        *o.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
                    }),
                );
                let outcome = out.lock().unwrap_or_else(|e| e.into_inner()).take();
                match outcome {
                    Some(Err(crate::pending_ack::PendingAckError::AckConflict { .. })) => {
                        self.activity.txn_acks_of_deleted_refused += 1;
                    }
                    Some(Ok(_)) => self.checker.replay_violation(
                        &sub.name,
                        &format!("transactional ack of a deleted entry accepted: {md} is at the subscription's mark-delete (Pulsar: TransactionConflictException)"),
                        now,
                    ),
                    // Queued until the handle is ready, or not ready.
                    _ => {}
                }
            }
            let record =
                PendingAckRecord::individual_ack(txn, vec![AckedPosition::whole(position)]);
            let durable = pa_durable(&self.pa_truth[s], &record);
            h.append(record, durable);
            self.activity.txn_individual_acks += 1;
            sub.txn_acked.insert(position);
            // Transactions stay open for a while (the coordinator commits
            // later), so restarts find open ones in the pending-ack log.
            let delay = self.rng.random_range(10..=2_000);
            self.sched.after(
                delay,
                Ev::Commit {
                    sub: s,
                    broker_generation,
                    txn,
                    positions: vec![(position, messages)],
                    cumulative: false,
                },
            );
            return Ok(());
        }
        sub.deletion
            .delete(&[position], b.ledger.as_ref())
            .map_err(comp("ack"))?;
        sub.unpersisted.extend(messages);
        // Messages of the entry acknowledged earlier by batch-index acks.
        if let Some(earlier) = sub.partial_acked.remove(&position) {
            sub.unpersisted.extend(earlier);
        }
        if let Some(t) = &sub.delayed {
            if self.sabotage_seek.is_none() {
                t.update_mark_delete(sub.deletion.mark_delete_position());
                self.delayed_truth[s].mark_delete(sub.deletion.mark_delete_position());
            }
        }
        self.check_tracker_count(s);
        self.schedule_dispatch(s);
        Ok(())
    }

    /// A batch-index ack (Pulsar's individual ack with an `ack_set`):
    /// `messages` of the entry at `position` are acknowledged in the
    /// cursor's batch-index state; the entry stays with the consumer until
    /// no index is left, then it is deleted whole as by an individual ack.
    pub(super) fn batch_index_ack(
        &mut self,
        s: SubIdx,
        broker_generation: u64,
        key: ConsumerKey,
        position: Position,
        messages: Vec<MessageRef>,
        ack_set: Vec<i64>,
    ) -> Result<(), SimError> {
        let Some(b) = self.broker.as_mut() else {
            return Ok(());
        };
        if b.generation != broker_generation {
            return Ok(()); // sent to a broker that has since restarted: lost
        }
        let sub = &mut b.subs[s];
        if sub.dispatcher.consumer(key).is_none() {
            return Ok(()); // sent on a connection since closed: never processed
        }
        let acker = sub.client_of(key).map_or(usize::MAX, |c| c.0);
        let now = self.sched.now();
        self.checker.ack_applied(&sub.name, acker, &messages, now);
        self.activity.batch_index_acks += 1;
        let outcome = sub
            .deletion
            .delete_batch_indexes(position, &ack_set, b.ledger.as_ref())
            .map_err(comp("batch-index ack"))?;
        match outcome {
            crate::deletion::BatchAckOutcome::Partial(_) => {
                sub.partial_acked
                    .entry(position)
                    .or_default()
                    .extend(messages);
                return Ok(());
            }
            crate::deletion::BatchAckOutcome::EntryDeleted(_)
            | crate::deletion::BatchAckOutcome::AlreadyDeleted => {
                let _ = sub.dispatcher.acknowledge(key, position);
                sub.unpersisted.extend(messages);
                if let Some(earlier) = sub.partial_acked.remove(&position) {
                    sub.unpersisted.extend(earlier);
                }
            }
        }
        if let Some(t) = &sub.delayed {
            if self.sabotage_seek.is_none() {
                t.update_mark_delete(sub.deletion.mark_delete_position());
                self.delayed_truth[s].mark_delete(sub.deletion.mark_delete_position());
            }
        }
        self.check_tracker_count(s);
        self.schedule_dispatch(s);
        Ok(())
    }

    /// A negative ack (Pulsar's `redeliverUnacknowledgedMessages` with the
    /// entry's message id) from the consumer holding the entry: it leaves
    /// the consumer's pending acks and is redelivered, with the batch
    /// indexes acknowledged so far left out (a partial batch).
    pub(super) fn nack(
        &mut self,
        s: SubIdx,
        broker_generation: u64,
        key: ConsumerKey,
        position: Position,
        messages: Vec<MessageRef>,
    ) -> Result<(), SimError> {
        let Some(b) = self.broker.as_mut() else {
            return Ok(());
        };
        if b.generation != broker_generation {
            return Ok(()); // sent to a broker that has since restarted: lost
        }
        let sub = &mut b.subs[s];
        let held = sub
            .dispatcher
            .consumer(key)
            .is_some_and(|c| c.pending_acks().contains_key(&position));
        if !held {
            // The consumer is gone (its entries were handed back) or no
            // longer holds the entry: nothing to redeliver for it.
            return Ok(());
        }
        let acker = sub.client_of(key).map_or(usize::MAX, |c| c.0);
        let now = self.sched.now();
        self.checker.nacked(&sub.name, acker, &messages, now);
        self.activity.negative_acks += 1;
        let _ = sub.dispatcher.acknowledge(key, position);
        sub.redeliver.insert(position);
        self.schedule_dispatch(s);
        Ok(())
    }

    /// A new transaction for the next ack, with probability `txn_ack_ratio`.
    pub(super) fn maybe_txn(&mut self) -> Option<TxnId> {
        (self.w.txn_ack_ratio > 0.0 && self.rng.random_bool(self.w.txn_ack_ratio)).then(|| {
            self.next_txn += 1;
            TxnId::new(0, self.next_txn)
        })
    }

    /// The broker applies a cumulative ack up to `position` (Failover): the
    /// consumer's pending messages up to it are settled, then either the
    /// pending-ack store logs it for transaction `txn` or the cursor's
    /// mark-delete moves. As Pulsar's pending-ack handle, a transactional
    /// cumulative ack while another transaction's cumulative ack is still
    /// pending is rejected (a transaction conflict): nothing changes and the
    /// client acks that range again later.
    pub(super) fn cumulative_ack(
        &mut self,
        s: SubIdx,
        broker_generation: u64,
        key: ConsumerKey,
        position: Position,
        txn: Option<TxnId>,
    ) -> Result<(), SimError> {
        let now = self.sched.now();
        let Some(b) = self.broker.as_mut() else {
            return Ok(());
        };
        if b.generation != broker_generation {
            return Ok(()); // sent to a broker that has since restarted: lost
        }
        let sub = &mut b.subs[s];
        let Some(consumer) = sub.dispatcher.consumer(key) else {
            return Ok(()); // sent on a connection since closed: never processed
        };
        if let (Some(txn), Some(_), Some(open)) = (txn, &sub.pending_ack, sub.open_cumulative_txn) {
            if open != txn {
                self.activity.txn_cumulative_conflicts += 1;
                if let Some(c) = sub.client_of(key) {
                    let client = &mut self.clients[s][c];
                    client.cumulative_upto = client.cumulative_upto.max(Some(position));
                    self.schedule_ack_flush(s, c);
                }
                return Ok(());
            }
        }
        let settled: Vec<Position> = consumer
            .pending_acks()
            .range(..=position)
            .map(|(p, _)| *p)
            .collect();
        for p in settled {
            let _ = sub.dispatcher.acknowledge(key, p);
        }
        // The checker knows consumers by their stable client index.
        let acker = sub.client_of(key).map_or(usize::MAX, |c| c.0);
        self.checker
            .cumulative_ack_applied(&sub.name, acker, position, now);
        self.activity.cumulative_acks += 1;
        if let (Some(txn), Some(h), None) = (txn, &sub.pending_ack, sub.open_cumulative_txn) {
            self.activity.txn_cumulative_acks += 1;
            sub.open_cumulative_txn = Some(txn);
            let record = PendingAckRecord::cumulative_ack(txn, position);
            let durable = pa_durable(&self.pa_truth[s], &record);
            h.append(record, durable);
            let delay = self.rng.random_range(10..=2_000);
            self.sched.after(
                delay,
                Ev::Commit {
                    sub: s,
                    broker_generation,
                    txn,
                    positions: vec![(position, Vec::new())],
                    cumulative: true,
                },
            );
            return Ok(());
        }
        Self::apply_cumulative(sub, position, b.ledger.as_ref())?;
        self.schedule_dispatch(s);
        Ok(())
    }

    /// Moves the subscription's mark-delete to `position` (a stale
    /// cumulative ack below it is a no-op) and remembers it for the checker
    /// until persisted.
    pub(super) fn apply_cumulative(
        sub: &mut SubRt,
        position: Position,
        ledger: &ManagedLedger,
    ) -> Result<(), SimError> {
        match sub.deletion.mark_delete(position, ledger) {
            Ok(_) | Err(DeletionError::MarkDeleteBackward { .. }) => {}
            Err(e) => return Err(SimError::Component(format!("cumulative ack: {e}"))),
        }
        sub.unpersisted_cumulative = sub.unpersisted_cumulative.max(Some(position));
        Ok(())
    }

    pub(super) fn commit(
        &mut self,
        s: SubIdx,
        broker_generation: u64,
        txn: TxnId,
        positions: Vec<(Position, Vec<MessageRef>)>,
        cumulative: bool,
    ) -> Result<(), SimError> {
        let Some(b) = self.broker.as_mut() else {
            return Ok(());
        };
        if b.generation != broker_generation {
            return Ok(()); // the transaction was aborted by the restart
        }
        let sub = &mut b.subs[s];
        if cumulative {
            if let Some(h) = &sub.pending_ack {
                let record = PendingAckRecord::commit(txn, AckType::Cumulative);
                let durable = pa_durable(&self.pa_truth[s], &record);
                h.append(record, durable);
                self.activity.txn_commits += 1;
            }
            if sub.open_cumulative_txn == Some(txn) {
                sub.open_cumulative_txn = None;
            }
            for (position, _) in positions {
                Self::apply_cumulative(sub, position, b.ledger.as_ref())?;
            }
            self.schedule_dispatch(s);
            return Ok(());
        }
        let mut commit_durable = false;
        if let Some(h) = &sub.pending_ack {
            let record = PendingAckRecord::commit(txn, AckType::Individual);
            let durable = pa_durable(&self.pa_truth[s], &record);
            let done = Arc::new(AtomicBool::new(false));
            let d = Arc::clone(&done);
            h.append(
                record,
                Box::new(move |r| {
                    d.store(r.is_ok(), Ordering::SeqCst);
                    durable(r);
                }),
            );
            // Appended synchronously (batching off); a commit that is not
            // durable by now counts as a plain ack.
            commit_durable = done.load(Ordering::SeqCst);
            self.activity.txn_commits += 1;
        }
        let ps: Vec<Position> = positions.iter().map(|(p, _)| *p).collect();
        sub.deletion
            .delete(&ps, b.ledger.as_ref())
            .map_err(comp("commit ack"))?;
        for p in &ps {
            sub.txn_acked.remove(p);
            if let Some(earlier) = sub.partial_acked.remove(p) {
                sub.unpersisted.extend(earlier);
            }
        }
        for (p, refs) in positions {
            if commit_durable {
                self.committed_refs[s].insert(p, (txn, refs.clone()));
            }
            sub.unpersisted.extend(refs);
        }
        self.schedule_dispatch(s);
        Ok(())
    }
}
