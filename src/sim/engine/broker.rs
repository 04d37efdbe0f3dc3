//! Broker side: opening (and re-opening after a crash) the topic, its
//! subscriptions and their components from the store, registering
//! consumers, publishing, and persisting mark-delete + deleted ranges.

use super::*;

impl Sim<'_> {
    pub(super) fn open_broker(&mut self) -> Result<(), SimError> {
        // Counted over every open, a failed one (a crash during recovery)
        // included: events sent to an earlier broker never reach this one.
        let generation = self.brokers_opened;
        self.brokers_opened += 1;
        // The old handles go with the old broker (they hold the store).
        self.heartbeat.set_interrupt(Box::new(|| {}));
        // A crash: every in-memory structure goes. Handles are closed first
        // only so their timer/executor tasks release the store (they hold
        // references to it); nothing is flushed or persisted by this.
        if let Some(old) = self.broker.take() {
            self.collect_tracker_stats(&old);
            for sub in &old.subs {
                if let Some(h) = &sub.pending_ack {
                    h.close();
                }
            }
            old.pool.shutdown();
        }
        self.snapshot_faults.clear();
        let store = self.open_store()?;
        let dyn_store: Arc<dyn LedgerStore> = Arc::new(store.clone());
        let ledger = ManagedLedger::open(
            TOPIC,
            LedgerConfig {
                max_entries_per_ledger: self.w.max_entries_per_ledger,
                auto_skip_non_recoverable_data: false,
            },
            Arc::clone(&dyn_store),
        )
        .map_err(comp("open topic"))?;
        install_outage(&ledger, &self.outage);
        let pool = ReplayExecutorPool::new(2, ExecutorMode::Manual).map_err(comp("executors"))?;
        let timer = Arc::new(VirtualTimer::new());
        timer.advance_to(self.sched.now());
        let mut subs = Vec::new();
        for s in SubIdx::all(self.w.subscriptions) {
            let name = format!("sub-{s}");
            let cursor = Arc::new(ledger.open_cursor(&name).map_err(comp("open cursor"))?);
            let deletion = Arc::new(
                CursorDeletionState::recover(
                    cursor.mark_delete_position(),
                    &cursor.individually_deleted_ranges(),
                )
                .map_err(comp("recover cursor"))?,
            );
            #[cfg(feature = "trace")]
            crate::trace::deletion::cursor(&deletion, TOPIC, &name);
            let delayed = if self.w.delayed_ratio > 0.0 {
                let redb = RedbSnapshotStorage::new(store.clone(), TOPIC, &name)
                    .map_err(comp("snapshot storage"))?;
                let faulty = Arc::new(FaultyStorage::new(redb));
                self.snapshot_faults.push(Arc::clone(&faulty));
                let storage: Arc<dyn BucketSnapshotStorage> = Arc::new(ObservedStorage::new(
                    faulty,
                    self.delayed_truth[s].snapshot_log(),
                ));
                let tracker = BucketDelayedDeliveryTracker::new(
                    BucketTrackerConfig {
                        tick_time_ms: self.w.delayed_tick_ms,
                        min_index_count_per_bucket: self.w.delayed_min_index_count_per_bucket,
                        max_num_buckets: self.w.delayed_max_num_buckets,
                        max_time_step_per_bucket_snapshot_segment_ms: 5_000,
                        max_indexes_per_bucket_snapshot_segment: 100,
                        recovery_policy: RecoveryPolicy::SkipCorrupt,
                        ..BucketTrackerConfig::default()
                    },
                    storage,
                    self.clock.clone(),
                )
                .map_err(comp("delayed tracker recovery"))?;
                #[cfg(feature = "trace")]
                crate::trace::bucket_merge::tracker(tracker.trace_id(), &name);
                // Pulsar's tracker reads the mark-delete from the cursor.
                let truth = &mut self.delayed_truth[s];
                if self.sabotage_seek.is_none() {
                    tracker.update_mark_delete(deletion.mark_delete_position());
                    truth.mark_delete(deletion.mark_delete_position());
                }
                let cutoff =
                    self.sched.now() + self.broker_clock_offset_ms + self.w.delayed_tick_ms;
                if let Some(what) = truth.check_recovery(cutoff, |p| {
                    tracker.contains_message(p.ledger_id, p.entry_id)
                }) {
                    self.checker
                        .tracker_violation(&name, &what, self.sched.now());
                }
                // What recovery restored is what the tracker holds now.
                let held: Vec<(Position, u64)> = truth
                    .ever_added()
                    .filter(|(p, _)| tracker.contains_message(p.ledger_id, p.entry_id))
                    .collect();
                truth.resync(held);
                if generation > 0 {
                    self.activity.delayed_recoveries += 1;
                }
                Some(tracker)
            } else {
                None
            };
            let (pending_ack, pending_ack_cursor) = if self.w.txn_ack_ratio > 0.0 {
                let pa_ledger = ManagedLedger::open(
                    format!("{TOPIC}-{name}__transaction_pending_ack"),
                    LedgerConfig {
                        max_entries_per_ledger: 50,
                        auto_skip_non_recoverable_data: self.pa_auto_skip(),
                    },
                    Arc::clone(&dyn_store),
                )
                .map_err(comp("open pending-ack log"))?;
                install_read_faults(
                    &pa_ledger,
                    &self.outage,
                    Some(Arc::clone(&self.replay_plans[s])),
                );
                let pa_cursor = Arc::new(
                    pa_ledger
                        .open_cursor(PENDING_ACK_CURSOR)
                        .map_err(comp("open pending-ack cursor"))?,
                );
                let handle = PendingAckHandle::new(
                    format!("{TOPIC}-{name}"),
                    Arc::clone(&pa_cursor),
                    Arc::new(CursorSubscription::new(
                        Arc::clone(&cursor),
                        Arc::clone(&deletion),
                    )),
                    &pool,
                    if self.opts.sabotage == Some(Sabotage::LoseReplayReadCallbacks) {
                        Arc::new(LostReads)
                    } else {
                        Arc::new(InlineReads)
                    },
                    timer.clone(),
                    HandleConfig {
                        jitter_seed: self.opts.seed,
                        replay: crate::pending_ack::ReplayConfig {
                            queue_capacity: PENDING_ACK_QUEUE_CAPACITY,
                            read_batch: PENDING_ACK_READ_BATCH,
                        },
                        ..HandleConfig::default()
                    },
                )
                .map_err(comp("pending-ack handle"))?;
                let expected = self.pa_truth[s]
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone();
                self.pa_expected[s] = Some((expected, self.pa_ledger_lost[s].clone()));
                self.pa_not_ready_since[s] = Some(self.sched.now());
                self.pa_error_seen[s] = false;
                self.pa_awaiting_reload[s] = false;
                #[cfg(feature = "trace")]
                self.trace_pending_ack_init(s, &handle, &pa_ledger, &pa_cursor);
                handle.init();
                drop(pa_ledger);
                (Some(handle), Some(pa_cursor))
            } else {
                (None, None)
            };
            subs.push(SubRt {
                name,
                cursor,
                deletion,
                dispatcher: SharedDispatcher::new(),
                delayed,
                ready: pending_ack.is_none(),
                pending_ack,
                pending_ack_cursor,
                blocked: BTreeMap::new(),
                redeliver: BTreeSet::new(),
                consumer_keys: BTreeMap::new(),
                unpersisted: Vec::new(),
                partial_acked: BTreeMap::new(),
                unpersisted_cumulative: None,
                recovered_commits: false,
                failover_order: Vec::new(),
                open_cumulative_txn: None,
                txn_acked: BTreeSet::new(),
                pending_read: None,
                dispatch_scheduled: false,
            });
        }
        // The hang watchdog's interrupt: closing a handle interrupts its
        // running replay attempt (a replay spinning inside one event).
        let handles: Vec<PendingAckHandle> =
            subs.iter().filter_map(|s| s.pending_ack.clone()).collect();
        self.heartbeat.set_interrupt(Box::new(move || {
            for h in &handles {
                h.close();
            }
        }));
        self.broker = Some(Broker {
            generation,
            ledger,
            subs,
            pool,
            timer,
        });
        for s in SubIdx::all(self.w.subscriptions) {
            self.check_tracker_count(s);
        }
        self.drive_replays()?;
        Ok(())
    }

    /// The `Init` line of a new pending-ack handle's trace run (feature
    /// `trace`; `crate::sim::sim_trace`): its log's entries after the
    /// cursor's mark-delete, the read position the replay starts from,
    /// whether the log's ledgers are lost, auto-skip.
    #[cfg(feature = "trace")]
    fn trace_pending_ack_init(
        &self,
        s: SubIdx,
        handle: &PendingAckHandle,
        ledger: &ManagedLedger,
        cursor: &ManagedCursor,
    ) {
        let md = cursor.mark_delete_position();
        let lost = &self.pa_ledger_lost[s];
        let log: Vec<Position> = ledger
            .ledgers()
            .into_iter()
            .flat_map(|(id, entries)| (0..entries).map(move |e| Position::new(id, e)))
            .filter(|p| *p > md)
            .collect();
        let ledgers: BTreeSet<i64> = log.iter().map(|p| p.ledger_id).collect();
        // The spec's `lost`: every read of the log fails non-recoverably.
        // A log only partly lost is recorded as not lost; sim_trace drops
        // such runs (`partial_loss`).
        let all_lost = !ledgers.is_empty() && ledgers.iter().all(|l| lost.contains(l));
        crate::trace::pending_ack::init(
            handle.name(),
            &log,
            cursor.read_position(),
            all_lost,
            self.pa_auto_skip(),
        );
        if !all_lost && ledgers.iter().any(|l| lost.contains(l)) {
            crate::trace::pending_ack::partial_loss(handle.name());
        }
    }

    pub(super) fn collect_tracker_stats(&mut self, b: &Broker) {
        for sub in &b.subs {
            if let Some(t) = &sub.delayed {
                let st = t.stats();
                self.activity.bucket_seals += st.seals;
                self.activity.bucket_merges += st.merges;
                self.activity.bucket_trims += st.trimmed_buckets;
            }
            // Each handle is counted once: when its broker goes (restart,
            // reload) or at the end of the run.
            if let Some(h) = &sub.pending_ack {
                self.activity.replay_retries += h.stats().attempts.saturating_sub(1);
            }
        }
    }

    pub(super) fn connect_consumer(&mut self, s: SubIdx, c: ConsumerIdx) -> Result<(), SimError> {
        let Some(b) = self.broker.as_mut() else {
            return Ok(());
        };
        let client = &mut self.clients[s][c];
        let incarnation = client.consumer.state().incarnation();
        let key = ConsumerKey {
            connection_id: client.connection.id(),
            consumer_id: client.consumer.consumer_id(),
        };
        let sub = &mut b.subs[s];
        if sub.consumer_keys.get(&c) == Some(&key) && sub.dispatcher.consumer(key).is_some() {
            // A Subscribe for a consumer id this connection already has
            // (a retried Subscribe): Pulsar's `ServerCnx.handleSubscribe`
            // answers Success and keeps the consumer as it is: same
            // incarnation, same permits and pending acks, same place in
            // a Failover order. The client must not grant its receiver
            // queue a second time.
            let held = sub
                .dispatcher
                .consumer(key)
                .map(|x| (x.available_permits(), x.pending_acks().len()));
            self.activity.duplicate_subscribes += 1;
            if self.opts.sabotage == Some(Sabotage::DuplicateSubscribeReplacesConsumer)
                && !self.sabotage_done
            {
                self.sabotage_done = true;
                let _ = sub.dispatcher.remove_consumer(key);
                sub.dispatcher
                    .add_consumer(key, client.consumer.epoch())
                    .map_err(comp("add consumer"))?;
            }
            match client.consumer.subscribe_succeeded(incarnation) {
                Err(crate::permits::client::ClientPermitError::AlreadySubscribed(_)) => {}
                Ok(granted) => self.checker.permit_violation(
                    &sub.name,
                    c.0,
                    &format!(
                        "a duplicate Subscribe success granted {granted} permits a second time"
                    ),
                    self.sched.now(),
                ),
                Err(e) => return Err(SimError::Component(format!("duplicate subscribe: {e}"))),
            }
            let after = sub
                .dispatcher
                .consumer(key)
                .map(|x| (x.available_permits(), x.pending_acks().len()));
            if after != held {
                self.checker.permit_violation(
                    &sub.name,
                    c.0,
                    &format!("a duplicate Subscribe changed the broker consumer: (permits, pending) {held:?} -> {after:?}"),
                    self.sched.now(),
                );
            }
            return Ok(());
        }
        // Entries of the old connection handed back for redelivery.
        let mut handed_back = 0;
        if let Some(old) = sub.consumer_keys.insert(c, key) {
            if old != key {
                // The old connection closed: the broker removes its
                // consumers (no CloseConsumer frame arrives).
                for removed in sub.dispatcher.remove_connection(old.connection_id) {
                    handed_back += removed.replayed.len();
                }
                // What was read for the old connection but never sent goes
                // back too: it is re-read in position order together with
                // the unacknowledged messages `remove_consumer` put into
                // replay, never behind newer entries (as Pulsar's Key_Shared
                // replays before new reads and its single-active-consumer
                // dispatcher rewinds).
                if let Some(q) = sub.blocked.remove(&c) {
                    handed_back += q.len();
                    sub.redeliver.extend(q.iter().map(|e| e.entry.position));
                }
            }
        }
        if self.w.subscription_type == SubscriptionType::Failover {
            // A (re)subscribing consumer goes to the end of the order; when
            // the active one changes, what was held for the old one is
            // redelivered (with its unacknowledged messages, which
            // `remove_consumer` put into replay) to the new one, in order.
            let active_before = sub.failover_order.first().copied();
            sub.failover_order.retain(|&x| x != c);
            sub.failover_order.push(c);
            if active_before.is_some_and(|a| Some(a) != sub.failover_order.first().copied()) {
                self.activity.active_consumer_changes += 1;
                for (_, q) in std::mem::take(&mut sub.blocked) {
                    handed_back += q.len();
                    sub.redeliver.extend(q.iter().map(|e| e.entry.position));
                }
                self.activity.handover_entries += handed_back as u64;
            }
        }
        if sub.dispatcher.consumer(key).is_none() {
            sub.dispatcher
                .add_consumer(key, client.consumer.epoch())
                .map_err(comp("add consumer"))?;
        }
        client
            .consumer
            .subscribe_succeeded(incarnation)
            .map_err(comp("subscribe succeeded"))?;
        self.sched.after(
            0,
            Ev::FlushFlows {
                sub: s,
                consumer: c,
            },
        );
        Ok(())
    }

    pub(super) fn schedule_dispatch(&mut self, s: SubIdx) {
        if let Some(b) = self.broker.as_mut() {
            if !b.subs[s].dispatch_scheduled {
                b.subs[s].dispatch_scheduled = true;
                self.sched.after(0, Ev::Dispatch(s));
            }
        }
    }

    pub(super) fn publish(&mut self) -> Result<(), SimError> {
        let now = self.sched.now();
        let Some(b) = self.broker.as_ref() else {
            return Ok(());
        };
        let published_before = self.published;
        let producer_seq_before = self.producer_seq.clone();
        // (entry bytes, per message (key, deliver_at_ms))
        type Planned = (Vec<u8>, Vec<(u32, u64)>);
        let mut entries: Vec<Planned> = Vec::new();
        for p in 0..self.w.producers {
            if self.published >= self.w.messages {
                break;
            }
            let delayed = self.w.delayed_ratio > 0.0 && self.rng.random_bool(self.w.delayed_ratio);
            let batch = if delayed {
                1
            } else {
                (u64::from(self.w.batch_size)).min(self.w.messages - self.published) as u32
            };
            let key = self.rng.random_range(0..self.w.keys);
            let deliver_at_ms = if delayed {
                now + self.rng.random_range(1..=self.w.max_delay_ms.max(1))
            } else {
                0
            };
            let seq = self.producer_seq[p as usize];
            self.producer_seq[p as usize] += u64::from(batch);
            let body = SimPayload {
                producer: p,
                key,
                deliver_at_ms,
            }
            .encode_to_vec();
            let metadata = MessageMetadata {
                producer_name: format!("producer-{p}"),
                sequence_id: seq,
                publish_time: now,
                num_messages_in_batch: (batch > 1).then_some(batch as i32),
                ..Default::default()
            };
            let messages: Vec<(SingleMessageMetadata, Vec<u8>)> = (0..batch)
                .map(|_| {
                    (
                        SingleMessageMetadata {
                            partition_key: Some(key.to_string()),
                            payload_size: body.len() as i32,
                            ..SingleMessageMetadata::default()
                        },
                        body.clone(),
                    )
                })
                .collect();
            entries.push((
                encode_entry_payload(&metadata, &messages),
                vec![(key, deliver_at_ms); batch as usize],
            ));
            self.published += u64::from(batch);
        }
        if entries.is_empty() {
            return Ok(());
        }
        let refs: Vec<&[u8]> = entries.iter().map(|(e, _)| e.as_slice()).collect();
        let last_before = b.ledger.last_confirmed_entry();
        let positions = match b.ledger.append_batch(&refs) {
            Ok(p) => p,
            Err(_) if self.store_dead() => {
                // The broker died in the append: no receipt (see `crashes`).
                self.unreceipted_publish = Some(UnreceiptedPublish {
                    after: last_before,
                    entries: entries.into_iter().map(|(_, m)| m).collect(),
                    published_before,
                    producer_seq_before,
                });
                return Ok(());
            }
            Err(e) => return Err(comp("append")(e)),
        };
        for (pos, (_, msgs)) in positions.iter().zip(&entries) {
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
        if self.published < self.w.messages {
            self.sched.after(self.w.publish_interval_ms, Ev::Publish);
        }
        for s in SubIdx::all(self.w.subscriptions) {
            self.schedule_dispatch(s);
        }
        Ok(())
    }

    /// Decodes an entry's key and delivery time (first message of the batch).
    pub(super) fn entry_info(data: &[u8]) -> Option<(u32, u32, u64)> {
        // Pulsar's entry payload layout, parsed by the frame codec.
        let entry = crate::proto::frame::parse_entry_payload(data).ok()?;
        let md = &entry.metadata;
        let batch = md.num_messages_in_batch.unwrap_or(1).max(1) as u32;
        let rest = entry.payload;
        let body = if md.num_messages_in_batch.is_none() {
            rest
        } else {
            let (smm, start) = crate::proto::frame::read_batch_message_header(rest, 0).ok()?;
            rest.get(start..start + smm.payload_size as usize)?
        };
        let p = SimPayload::decode(body).ok()?;
        Some((batch, p.key, p.deliver_at_ms))
    }

    pub(super) fn persist(&mut self, s: SubIdx) -> Result<(), SimError> {
        let Some(b) = self.broker.as_mut() else {
            return Ok(());
        };
        let sub = &mut b.subs[s];
        if sub.unpersisted.is_empty()
            && sub.unpersisted_cumulative.is_none()
            && !sub.recovered_commits
        {
            return Ok(());
        }
        let md = sub.deletion.mark_delete_position();
        let ranges = sub.deletion.individually_deleted_ranges();
        self.activity.peak_individually_deleted_ranges = self
            .activity
            .peak_individually_deleted_ranges
            .max(ranges.len() as u64);
        match sub.cursor.mark_delete_with_ranges(md, ranges) {
            Ok(()) => {}
            Err(LedgerError::MarkDeleteBackward { .. }) => {}
            Err(e) => return Err(SimError::Component(format!("persist mark-delete: {e}"))),
        }
        sub.recovered_commits = false;
        let deletion = Arc::clone(&sub.deletion);
        self.committed_refs[s].retain(|p, _| !deletion.is_message_deleted(*p));
        // The pending-ack log may now forget the commits the subscription
        // holds durably.
        if let Some(h) = &sub.pending_ack {
            h.subscription_persisted();
        }
        let name = sub.name.clone();
        let now = self.sched.now();
        for m in std::mem::take(&mut sub.unpersisted) {
            self.checker.acked(&name, m, now);
            self.acked_at_last_check[s] += 1;
        }
        if let Some(upto) = sub.unpersisted_cumulative.take() {
            self.acked_at_last_check[s] += self.checker.cumulative_acked(&name, upto);
        }
        Ok(())
    }
}
