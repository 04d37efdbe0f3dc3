//! `pulsar-core simulate`: a reconnecting consumer's held entries (read for
//! its old connection, never sent) are redelivered in position order with
//! its unacknowledged messages, never behind newer entries: held entries
//! left queued for the new connection with the replays queued behind them
//! are order violations on Failover with one consumer and on Key_Shared
//! (seeds 1, 2, 4 and 1, 3, 4 of these workloads).
#![cfg(not(any(loom, feature = "shuttle")))]

use pulsar_core::sim::{Faults, SubscriptionType, Workload};

#[path = "common/sim_run.rs"]
mod sim_run;

fn reconnect_heavy(subscription_type: SubscriptionType, consumers: u32) -> Workload {
    Workload {
        name: "reconnect-heavy".into(),
        subscription_type,
        producers: 5,
        subscriptions: 1,
        consumers_per_subscription: consumers,
        keys: 4,
        messages: 600,
        batch_size: 1,
        receiver_queue_size: 4,
        publish_interval_ms: 5,
        faults: Faults {
            reconnects: 10,
            ..Faults::none()
        },
        ..Workload::default()
    }
}

fn assert_clean(w: &Workload) {
    for seed in 1..=4 {
        let r = sim_run::run_seed_within(w, seed, std::time::Duration::from_secs(120));
        assert!(r.is_clean(), "{:?} seed {seed}: {r}", w.subscription_type);
        assert!(r.activity.reconnects > 0, "{r}");
    }
}

#[test]
fn failover_single_consumer_reconnects_keep_total_order() {
    let w = Workload {
        messages: 300,
        batch_size: 3,
        receiver_queue_size: 8,
        ..reconnect_heavy(SubscriptionType::Failover, 1)
    };
    assert_clean(&w);
}

#[test]
fn key_shared_reconnects_keep_per_key_order() {
    assert_clean(&reconnect_heavy(SubscriptionType::KeyShared, 2));
}
