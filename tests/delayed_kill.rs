//! Process-kill test: a child process (this test binary re-invoked with
//! `DELAYED_KILL_CHILD=<dir>`) runs the tracker on the durable redb store —
//! sealing, merging, loading segments and deleting exhausted snapshots — and
//! the parent SIGKILLs it at a random moment. The restarted tracker must
//! recover without error, and after the dispatcher's re-read it must track
//! exactly the messages that are not yet due (count right) and deliver every
//! message exactly once (nothing lost).
#![cfg(not(any(loom, feature = "shuttle")))]

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use pulsar_core::delayed::{
    BucketDelayedDeliveryTracker, BucketTrackerConfig, RecoveryPolicy, RedbSnapshotStorage,
    VirtualClock,
};
use pulsar_core::ledger::RedbStore;
use pulsar_core::Position;
use rand::{Rng, SeedableRng};

const ENV: &str = "DELAYED_KILL_CHILD";
const N: u64 = 3000;
const TICK: u64 = 10;
const END_CLOCK: u64 = 6000;
const KILLS: usize = 8;

fn plan(i: u64) -> (Position, u64) {
    let p = Position::new(1 + (i / 40) as i64, (i % 40) as i64);
    (p, 1000 + (i * 7919) % 4000)
}

fn config() -> BucketTrackerConfig {
    BucketTrackerConfig {
        tick_time_ms: TICK,
        deliver_at_time_strict: false,
        min_index_count_per_bucket: 50,
        max_time_step_per_bucket_snapshot_segment_ms: 200,
        max_indexes_per_bucket_snapshot_segment: 20,
        max_num_buckets: 3,
        recovery_policy: RecoveryPolicy::Fail,
    }
}

fn open(dir: &std::path::Path, clock: Arc<VirtualClock>) -> BucketDelayedDeliveryTracker {
    let store = RedbStore::open(dir.join("delayed.redb")).expect("open redb");
    let storage = Arc::new(
        RedbSnapshotStorage::new(store, "persistent://t/ns/topic", "sub").expect("tables"),
    );
    BucketDelayedDeliveryTracker::new(config(), storage, clock).expect("recovery after SIGKILL")
}

/// Child: run the workload until killed.
fn child(dir: &str) -> ! {
    let clock = Arc::new(VirtualClock::new(0));
    let tracker = open(std::path::Path::new(dir), clock.clone());
    println!("ready");
    for i in 0..N {
        let (p, at) = plan(i);
        tracker
            .add_message(p.ledger_id, p.entry_id, at as i64)
            .expect("add");
        if i % 200 == 199 {
            clock.advance(150);
            tracker.get_scheduled_messages(100).expect("get");
            tracker.trim_and_merge().expect("merge");
            let st = tracker.stats();
            println!(
                "progress adds={} seals={} merges={} deletes={}",
                i + 1,
                st.seals,
                st.merges,
                st.snapshot_deletes
            );
        }
    }
    while clock.advance(200) < END_CLOCK {
        tracker.get_scheduled_messages(500).expect("get");
        let st = tracker.stats();
        println!("progress draining deletes={}", st.snapshot_deletes);
    }
    println!("done");
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[test]
fn process_kill_loses_nothing_and_counts_right() {
    if let Ok(dir) = std::env::var(ENV) {
        child(&dir);
    }
    let exe = std::env::current_exe().expect("test binary");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x5eed_0000);
    let mut finished_before_kill = 0;
    for round in 0..KILLS {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut child = Command::new(&exe)
            .args([
                "process_kill_loses_nothing_and_counts_right",
                "--exact",
                "--nocapture",
            ])
            .env(ENV, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn child");
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        loop {
            let line = lines.next().expect("child output").expect("utf8");
            if line.contains("ready") {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(rng.random_range(1..400)));
        child.kill().expect("SIGKILL");
        child.wait().expect("reaped");
        let rest: Vec<String> = lines.map_while(Result::ok).collect();
        if rest.iter().any(|l| l.contains("done")) {
            finished_before_kill += 1;
        }
        let last = rest
            .iter()
            .rev()
            .find(|l| l.starts_with("progress"))
            .cloned();
        eprintln!(
            "round {round}: killed after {:?}",
            last.unwrap_or_else(|| "start".into())
        );

        // Restart at an arbitrary time and let the dispatcher re-read.
        let restart = rng.random_range(0..END_CLOCK);
        let clock = Arc::new(VirtualClock::new(restart));
        let tracker = open(dir.path(), clock.clone());
        tracker
            .verify_invariants()
            .expect("invariants after recovery");
        let cutoff = restart + TICK;
        let mut dispatched_now = BTreeSet::new();
        let mut expected_tracked = BTreeSet::new();
        for i in 0..N {
            let (p, at) = plan(i);
            let tracked = tracker
                .add_message(p.ledger_id, p.entry_id, at as i64)
                .expect("add");
            assert_eq!(
                tracked,
                at > cutoff,
                "round {round}: {p} at {at}, cutoff {cutoff}"
            );
            if tracked {
                expected_tracked.insert(p);
            } else {
                dispatched_now.insert(p);
            }
        }
        assert_eq!(
            tracker.number_of_delayed_messages(),
            expected_tracked.len() as u64,
            "round {round}: count after recovery + re-read"
        );
        clock.set(u64::MAX / 4);
        let mut delivered = BTreeSet::new();
        // Every non-empty batch delivers at least one tracked message: the
        // drain ends within `tracked + 1` calls, or the tracker is wrong.
        let bound = expected_tracked.len() + 1;
        for call in 1.. {
            assert!(
                call <= bound,
                "round {round}: get_scheduled_messages still returns messages after {bound} calls"
            );
            let batch = tracker.get_scheduled_messages(1000).expect("get");
            if batch.is_empty() {
                break;
            }
            for p in batch {
                assert!(delivered.insert(p), "round {round}: {p} delivered twice");
            }
        }
        assert_eq!(
            delivered, expected_tracked,
            "round {round}: lost or extra messages"
        );
        assert!(dispatched_now.is_disjoint(&delivered));
        assert_eq!(tracker.number_of_delayed_messages(), 0);
    }
    eprintln!("process-kill: {KILLS} rounds, {finished_before_kill} children had finished before the kill");
}
