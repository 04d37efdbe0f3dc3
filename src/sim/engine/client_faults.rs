//! Client behaviours planned as faults besides `faults.rs`: duplicate
//! Subscribes (see
//! [`Faults::duplicate_subscribes`](crate::sim::Faults::duplicate_subscribes)).

use super::*;

impl Sim<'_> {
    /// Spreads the duplicate Subscribes over the publish window. Consumer
    /// and time come from an RNG of their own (derived from the seed), so
    /// turning them on leaves every other draw of the run as it was.
    pub(super) fn plan_client_faults(&mut self) {
        let n = self.w.faults.duplicate_subscribes;
        if n == 0 {
            return;
        }
        let batches = self.w.messages.div_ceil(u64::from(self.w.batch_size));
        let ticks = batches.div_ceil(u64::from(self.w.producers)).max(1);
        let window = ticks.saturating_mul(self.w.publish_interval_ms).max(1_000);
        self.faults_pending += n;
        let mut rng = ChaCha8Rng::seed_from_u64(self.opts.seed ^ 0x4455_5053_5542_0000);
        for _ in 0..n {
            let at = rng.random_range(0..window);
            let sub = SubIdx(rng.random_range(0..self.w.subscriptions as usize));
            let consumer =
                ConsumerIdx(rng.random_range(0..self.w.consumers_per_subscription as usize));
            self.sched.at(at, Ev::DuplicateSubscribe { sub, consumer });
        }
    }

    /// Consumer `c` of `s` sends Subscribe again for its current
    /// incarnation on its connection; the broker's subscribe path handles
    /// it ([`Sim::connect_consumer`]). While the connection is closed (a
    /// reconnect on its way) or the consumer is not registered with the
    /// broker (a restart's recovery), there is nothing to duplicate.
    pub(super) fn duplicate_subscribe(
        &mut self,
        s: SubIdx,
        c: ConsumerIdx,
    ) -> Result<(), SimError> {
        let client = &self.clients[s][c];
        if client.connection.is_closed() || client.consumer.state().is_closed() {
            return Ok(());
        }
        let key = ConsumerKey {
            connection_id: client.connection.id(),
            consumer_id: client.consumer.consumer_id(),
        };
        let registered = self
            .broker
            .as_ref()
            .is_some_and(|b| b.subs[s].consumer_keys.get(&c) == Some(&key));
        if !registered {
            return Ok(());
        }
        self.connect_consumer(s, c)
    }
}
