//! Client side: a delivered CommandMessage through the real frame codec and
//! [`ClientConsumer`], the application's polls and acks, and the
//! connection task's Flow requests.

use super::*;

/// The P the broker put on `command` unless the faulty-broker mode
/// replaced it: an explicit P the broker computed is at least 1 and at most
/// the entry's message count; anything else was injected.
pub(super) fn command_permits_sent(command: &CommandMessage, entry: &[u8]) -> Option<u32> {
    let batch = Sim::entry_info(entry).map_or(1, |(b, _, _)| b);
    match command.message_permits {
        Some(p) if p == 0 || p > batch => None,
        other => other,
    }
}

impl Sim<'_> {
    pub(super) fn deliver(
        &mut self,
        s: SubIdx,
        c: ConsumerIdx,
        command: &CommandMessage,
        payload: &[u8],
        seeks_before_dispatch: u32,
    ) -> Result<(), SimError> {
        if seeks_before_dispatch > 0 {
            let pos = Position::new(
                command.message_id.ledger_id as i64,
                command.message_id.entry_id as i64,
            );
            self.clients[s][c]
                .dispatch_seeks
                .insert(pos, seeks_before_dispatch);
        }
        let corrupt = self.opts.faults
            && self.w.faults.corrupted_batch_ratio > 0.0
            && self.rng.random_bool(self.w.faults.corrupted_batch_ratio);
        let original = payload;
        let mut bytes;
        let payload = if corrupt {
            bytes = payload.to_vec();
            let last = bytes.len() - 1;
            bytes[last] ^= 0xff; // breaks the checksum
            self.activity.corrupted_batches += 1;
            &bytes[..]
        } else {
            payload
        };
        // Faulty-broker mode: an invalid explicit P (0, or above the batch's
        // message count); the client must close the connection and return
        // no credit for it. Only on a payload the client can read: a
        // corrupted batch has no metadata to check P against, so the client
        // returns the P it was sent (PIP-491) and cannot tell it is wrong.
        // (The draw happens either way, so the run's random sequence does
        // not depend on the corruption.)
        //
        // Fairness: once this consumer's connection closed on an injected
        // P `faulty_closes_without_progress` times in a row with nothing
        // received in between, the broker sends valid P until the
        // application receives a message. The draws still happen (so a run
        // that never reaches the bound is unchanged).
        let fair = self.clients[s][c].faulty_closes_in_a_row
            < self.w.faults.faulty_closes_without_progress;
        let draw_invalid = self.opts.faults
            && self.w.faults.invalid_permits_ratio > 0.0
            && self.rng.random_bool(self.w.faults.invalid_permits_ratio)
            && !corrupt;
        // Faulty-broker mode on a corrupted batch: P = 0 is invalid
        // without any metadata (the client resolves P from the command
        // alone when the payload cannot be parsed), so the client must
        // close the connection here too.
        let draw_zero = !draw_invalid
            && self.opts.faults
            && corrupt
            && self.w.faults.zero_permits_on_corrupted_ratio > 0.0
            && self
                .rng
                .random_bool(self.w.faults.zero_permits_on_corrupted_ratio);
        if (draw_invalid || draw_zero) && !fair {
            self.activity.faulty_permits_held_back += 1;
        }
        let mut faulty;
        let command = if draw_invalid && fair {
            faulty = command.clone();
            let batch = Self::entry_info(original).map_or(1, |(b, _, _)| b);
            faulty.message_permits = Some(if self.rng.random_bool(0.5) {
                0
            } else {
                batch + 1
            });
            &faulty
        } else if draw_zero && fair {
            faulty = command.clone();
            faulty.message_permits = Some(0);
            &faulty
        } else {
            command
        };
        let invalid_p = command.message_permits != command_permits_sent(command, original);
        // The broker writes a real Pulsar payload frame; the client decodes it.
        let frame_bytes = crate::proto::frame::encode_payload_frame(
            &crate::proto::wire::Command::Message(command.clone()).into_base(),
            payload,
        );
        let client = &mut self.clients[s][c];
        let outcome = client
            .consumer
            .handle_frame(&frame_bytes, crate::proto::frame::DEFAULT_MAX_FRAME_SIZE)
            .map_err(comp("handle message"))?;
        if invalid_p {
            if client.connection.is_closed() {
                self.activity.invalid_permit_closes += 1;
                client.faulty_closes_in_a_row += 1;
                self.faults_pending += 1;
                self.sched.after(
                    NET_MS,
                    Ev::Reconnect {
                        sub: s,
                        consumer: c,
                    },
                );
            } else {
                let p = command.message_permits;
                self.checker.permit_violation(
                    &format!("sub-{s}"),
                    c.0,
                    &format!("the client accepted invalid message_permits {p:?} without closing the connection"),
                    self.sched.now(),
                );
            }
            return Ok(());
        }
        if corrupt {
            // Pulsar's client acks a corrupted entry with a validation error
            // and the broker drops it. Here the corruption happens in transit
            // only (the stored entry is intact), so the simulated broker
            // treats it as a negative ack and replays it instead of losing it.
            if let Some(b) = self.broker.as_mut() {
                let pos = Position::new(
                    command.message_id.ledger_id as i64,
                    command.message_id.entry_id as i64,
                );
                if let Some(key) = b.subs[s].consumer_keys.get(&c).copied() {
                    let _ = b.subs[s].dispatcher.acknowledge(key, pos);
                }
                b.subs[s].redeliver.insert(pos);
            }
            // Nothing of the batch reached the application (the checksum
            // failed); its redelivery comes after later entries, so the
            // entry is exempt from the per-key order check.
            let batch = Self::entry_info(original).map_or(1, |(b, _, _)| b);
            for batch_index in 0..batch {
                self.checker.exempt_from_order(
                    &format!("sub-{s}"),
                    MessageRef {
                        position: Position::new(
                            command.message_id.ledger_id as i64,
                            command.message_id.entry_id as i64,
                        ),
                        batch_index,
                    },
                );
            }
            self.schedule_dispatch(s);
        }
        let client = &mut self.clients[s][c];
        if outcome.delivered > 0 {
            let pos = Position::new(
                command.message_id.ledger_id as i64,
                command.message_id.entry_id as i64,
            );
            client.delivery_messages.insert(pos, outcome.delivered);
        }
        if !client.poll_scheduled {
            client.poll_scheduled = true;
            self.sched.after(
                APP_POLL_MS,
                Ev::AppPoll {
                    sub: s,
                    consumer: c,
                },
            );
        }
        self.sched.after(
            0,
            Ev::FlushFlows {
                sub: s,
                consumer: c,
            },
        );
        Ok(())
    }

    pub(super) fn app_poll(&mut self, s: SubIdx, c: ConsumerIdx) -> Result<(), SimError> {
        let now = self.sched.now();
        let sub_name = format!("sub-{s}");
        let broker_generation = self.broker.as_ref().map_or(0, |b| b.generation);
        let key = self
            .broker
            .as_ref()
            .and_then(|b| b.subs[s].consumer_keys.get(&c).copied());
        let mut acks = Vec::new();
        // Split entries: messages acknowledged on their own, and the
        // negative acks of entries whose delivery was fully processed.
        let mut single_acks: Vec<(Position, MessageRef, Vec<i64>)> = Vec::new();
        let mut nacks: Vec<(Position, Vec<MessageRef>)> = Vec::new();
        let mut flow_queued = false;
        let cumulative_every = self.w.cumulative_ack_every;
        let nack_ratio = if cumulative_every == 0 && self.opts.faults {
            self.w.negative_ack_ratio
        } else {
            0.0
        };
        {
            let client = &mut self.clients[s][c];
            client.poll_scheduled = false;
            if client.connection.is_closed() {
                return Ok(()); // reconnecting: the new incarnation starts empty
            }
            for _ in 0..APP_BATCH {
                let Some(msg) = client.consumer.receive() else {
                    break;
                };
                let id = msg.message_id.clone();
                let position = Position::new(id.ledger_id as i64, id.entry_id as i64);
                let batch_index = id.batch_index.unwrap_or(-1).max(0) as u32;
                let batch_size = id.batch_size.unwrap_or(1).max(1) as u32;
                let mref = MessageRef {
                    position,
                    batch_index,
                };
                let batched = id.batch_index.is_some();
                let mut deliveries = 1;
                let mut release = true;
                if self.opts.sabotage == Some(Sabotage::StopReturningPermits) {
                    release = false;
                }
                if !self.sabotage_done {
                    match self.opts.sabotage {
                        Some(Sabotage::DropOneDelivery) => {
                            self.sabotage_done = true;
                            deliveries = 0;
                        }
                        Some(Sabotage::DeliverOneTwice) => {
                            self.sabotage_done = true;
                            deliveries = 2;
                        }
                        Some(Sabotage::ReturnOnePermitTooFew) => {
                            self.sabotage_done = true;
                            release = false;
                        }
                        Some(
                            Sabotage::StopReturningPermits
                            | Sabotage::DeliverOneTrimmedMessage
                            | Sabotage::CumulativeAckOnePastReceived
                            | Sabotage::DropFailoverHandover
                            | Sabotage::LoseReplayReadCallbacks
                            | Sabotage::DuplicateSubscribeReplacesConsumer
                            | Sabotage::NoDeduplication
                            | Sabotage::FilterWhenReadIssued,
                        )
                        | None => {}
                    }
                }
                let seeks = client.dispatch_seeks.get(&position).copied().unwrap_or(0);
                for _ in 0..deliveries {
                    self.checker.delivered(&sub_name, c.0, mref, now, seeks);
                }
                client.last_delivery_ms = now;
                client.stall_since = None;
                client.faulty_closes_in_a_row = 0;
                if release {
                    let returned = msg.release_permit().map_err(comp("permit return"))?;
                    if matches!(
                        returned,
                        crate::permits::client::ReturnOutcome::Accepted { flow_requested }
                            if flow_requested > 0
                    ) {
                        flow_queued = true;
                    }
                } else {
                    std::mem::forget(msg.token);
                }
                if deliveries == 0 {
                    continue; // dropped: never acknowledged
                }
                if !client.in_progress.contains_key(&position) {
                    // The messages this delivery handed over (fewer than
                    // the batch for a partial batch).
                    let remaining = client
                        .delivery_messages
                        .remove(&position)
                        .unwrap_or(batch_size);
                    let split = nack_ratio > 0.0 && self.rng.random_bool(nack_ratio);
                    client.in_progress.insert(
                        position,
                        InProgress {
                            remaining,
                            split,
                            ..InProgress::default()
                        },
                    );
                }
                let Some(entry) = client.in_progress.get_mut(&position) else {
                    continue; // inserted just above
                };
                entry.remaining = entry.remaining.saturating_sub(1);
                if !entry.split {
                    client.consumer.acknowledge(&id);
                    entry.refs.push(mref);
                } else if self.rng.random_bool(0.5) {
                    // Acknowledged on its own: for a batched entry a
                    // batch-index ack (`ack_set`: every index but this one
                    // still unacknowledged), else the whole entry.
                    client.consumer.acknowledge(&id);
                    let ack_set = if batched {
                        crate::proto::wire::ack_set_from_indexes(
                            (0..batch_size).filter(|i| *i != batch_index),
                        )
                    } else {
                        Vec::new()
                    };
                    single_acks.push((position, mref, ack_set));
                } else {
                    entry.nacked.push(mref);
                }
                client.since_cumulative += 1;
                if entry.remaining == 0 {
                    let done = client.in_progress.remove(&position).unwrap_or_default();
                    client.dispatch_seeks.remove(&position);
                    if done.split {
                        if !done.nacked.is_empty() {
                            nacks.push((position, done.nacked));
                        }
                    } else if cumulative_every > 0 {
                        client.cumulative_upto = Some(position);
                    } else {
                        acks.push((position, done.refs));
                    }
                }
            }
            if client.consumer.queued() > 0 {
                client.poll_scheduled = true;
                self.sched.after(
                    APP_POLL_MS,
                    Ev::AppPoll {
                        sub: s,
                        consumer: c,
                    },
                );
            }
        }
        let incarnation = self.clients[s][c].consumer.state().incarnation();
        if let Some(key) = key {
            for (position, messages) in acks {
                let txn = self.maybe_txn();
                self.sched.after(
                    NET_MS,
                    Ev::Ack {
                        sub: s,
                        incarnation,
                        broker_generation,
                        key,
                        position,
                        messages,
                        txn,
                        cumulative: false,
                        ack_set: Vec::new(),
                    },
                );
            }
            for (position, mref, ack_set) in single_acks {
                self.sched.after(
                    NET_MS,
                    Ev::Ack {
                        sub: s,
                        incarnation,
                        broker_generation,
                        key,
                        position,
                        messages: vec![mref],
                        txn: None,
                        cumulative: false,
                        ack_set,
                    },
                );
            }
            // After this poll's acks (the connection is ordered): the
            // broker redelivers what is still unacknowledged of the entry.
            for (position, messages) in nacks {
                self.sched.after(
                    NET_MS,
                    Ev::Nack {
                        sub: s,
                        incarnation,
                        broker_generation,
                        key,
                        position,
                        messages,
                    },
                );
            }
        }
        // A pending same-connection re-creation happens right after a poll
        // that queued a Flow (so that Flow is queued across it).
        let client = &mut self.clients[s][c];
        if client.recreate_pending > 0 && flow_queued {
            client.recreate_pending -= 1;
            return self.recreate_on_same_connection(s, c);
        }
        if cumulative_every > 0 {
            let client = &mut self.clients[s][c];
            if client.since_cumulative >= cumulative_every {
                self.send_cumulative_ack(s, c);
            } else if client.cumulative_upto.is_some() {
                self.schedule_ack_flush(s, c);
            }
        }
        self.sched.after(
            0,
            Ev::FlushFlows {
                sub: s,
                consumer: c,
            },
        );
        Ok(())
    }

    /// Schedules client `c`'s pending cumulative ack to be sent after the
    /// ack grouping time, unless a flush is already scheduled.
    pub(super) fn schedule_ack_flush(&mut self, s: SubIdx, c: ConsumerIdx) {
        let client = &mut self.clients[s][c];
        if !client.ack_flush_scheduled {
            client.ack_flush_scheduled = true;
            self.sched.after(
                ACK_GROUP_MS,
                Ev::AckFlush {
                    sub: s,
                    consumer: c,
                },
            );
        }
    }

    /// Failover: consumer `c` of subscription `s` sends a cumulative ack up
    /// to the last entry it received completely (if any since the last
    /// one); some go inside a transaction.
    pub(super) fn send_cumulative_ack(&mut self, s: SubIdx, c: ConsumerIdx) {
        let Some(b) = self.broker.as_ref() else {
            return;
        };
        let broker_generation = b.generation;
        let Some(key) = b.subs[s].consumer_keys.get(&c).copied() else {
            return;
        };
        let last_confirmed = b.ledger.last_confirmed_entry();
        let next_entry = |p: Position| b.ledger.next_valid_position(p);
        let client = &mut self.clients[s][c];
        let Some(mut position) = client.cumulative_upto.take() else {
            return;
        };
        client.since_cumulative = 0;
        if self.opts.sabotage == Some(Sabotage::CumulativeAckOnePastReceived) && !self.sabotage_done
        {
            let next = next_entry(position);
            if next <= last_confirmed {
                self.sabotage_done = true;
                position = next;
            }
        }
        let txn = self.maybe_txn();
        let incarnation = self.clients[s][c].consumer.state().incarnation();
        self.sched.after(
            NET_MS,
            Ev::Ack {
                sub: s,
                incarnation,
                broker_generation,
                key,
                position,
                messages: Vec::new(),
                txn,
                cumulative: true,
                ack_set: Vec::new(),
            },
        );
    }

    /// The client connection task: writes pending Flow requests (after its
    /// identity revalidation), then the broker reads the connection's frames.
    pub(super) fn flush_flows(&mut self, s: SubIdx, c: ConsumerIdx) -> Result<(), SimError> {
        let client = &self.clients[s][c];
        let flushed = client.connection.flush_flows();
        self.activity.stale_flows_dropped += flushed.dropped.len() as u64;
        let frames = client.connection.take_outbox();
        let connection_id = client.connection.id();
        let current = client.consumer.state().incarnation();
        let Some(b) = self.broker.as_mut() else {
            return Ok(());
        };
        let mut any = false;
        for frame in frames {
            if let ClientFrame::Flow {
                command,
                incarnation,
            } = frame
            {
                // PIP-491: credit is scoped to one incarnation. A Flow of
                // an incarnation closed since (re-created on this same
                // connection, so the broker cannot tell) would credit its
                // replacement with permits it never used.
                if incarnation != current {
                    self.checker.permit_violation(
                        &format!("sub-{s}"),
                        c.0,
                        &format!(
                            "a Flow of {} permits from closed incarnation {incarnation:?} reached its replacement {current:?} on the same connection",
                            command.message_permits
                        ),
                        self.sched.now(),
                    );
                }
                // The client writes a real FLOW frame; the broker decodes it.
                let bytes = crate::proto::frame::encode_simple_frame(
                    &crate::proto::wire::Command::Flow(command).into_base(),
                );
                let command = match crate::proto::frame::decode_frame(
                    &bytes,
                    crate::proto::frame::DEFAULT_MAX_FRAME_SIZE,
                ) {
                    Ok(crate::proto::frame::Frame {
                        command: crate::proto::wire::Command::Flow(f),
                        ..
                    }) => f,
                    other => {
                        return Err(SimError::Component(format!(
                            "flow frame did not decode as FLOW: {other:?}"
                        )))
                    }
                };
                self.activity.flows += 1;
                let key = ConsumerKey {
                    connection_id,
                    consumer_id: command.consumer_id,
                };
                if b.subs[s].dispatcher.consumer(key).is_some() {
                    b.subs[s]
                        .dispatcher
                        .consumer_flow(key, command.message_permits)
                        .map_err(comp("flow"))?;
                    any = true;
                }
            }
        }
        if any {
            self.schedule_dispatch(s);
        }
        Ok(())
    }
}
