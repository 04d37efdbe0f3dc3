//! shuttle: the published-value cell (`sync::Published`) under random and PCT
//! schedules: readers never see an unpublished value and never go backwards.
#![cfg(feature = "shuttle")]

use pulsar_core::__model::sync::{thread, Arc, Published};

fn scenario() {
    let cell = Arc::new(Published::new(0u32));
    let writer = {
        let cell = Arc::clone(&cell);
        thread::spawn(move || {
            for v in 1..=3 {
                cell.store(v);
            }
        })
    };
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let cell = Arc::clone(&cell);
            thread::spawn(move || {
                let mut last = 0;
                for _ in 0..4 {
                    let v = *cell.load();
                    assert!(v <= 3, "observed a value never published: {v}");
                    assert!(v >= last, "went back from {last} to {v}");
                    last = v;
                }
            })
        })
        .collect();
    writer.join().unwrap();
    for r in readers {
        r.join().unwrap();
    }
    assert_eq!(*cell.load(), 3);
}

#[test]
fn published_cell_random() {
    shuttle::check_random(scenario, 2_000);
}

#[test]
fn published_cell_pct() {
    shuttle::check_pct(scenario, 2_000, 3);
}

/// Negative control: a test-only cell that publishes a pair as two separate
/// atomic stores. shuttle's random scheduler must find a reader that sees
/// the torn pair (6, 100), which was never published.
fn torn_pair_scenario() {
    use pulsar_core::__model::sync::{AtomicU32, Ordering};
    let hi = Arc::new(AtomicU32::new(5));
    let lo = Arc::new(AtomicU32::new(100));
    let writer = {
        let (hi, lo) = (Arc::clone(&hi), Arc::clone(&lo));
        thread::spawn(move || {
            hi.store(6, Ordering::SeqCst);
            lo.store(3, Ordering::SeqCst);
        })
    };
    let seen = (hi.load(Ordering::SeqCst), lo.load(Ordering::SeqCst));
    assert!(
        seen == (5, 100) || seen == (6, 3),
        "torn pair observed: {seen:?}"
    );
    writer.join().unwrap();
}

#[test]
#[should_panic(expected = "torn pair observed")]
fn negative_control_two_atomics_tear() {
    shuttle::check_random(torn_pair_scenario, 2_000);
}

#[test]
fn published_pair_never_tears() {
    shuttle::check_random(
        || {
            let cell = Arc::new(Published::new((5u32, 100u32)));
            let writer = {
                let cell = Arc::clone(&cell);
                thread::spawn(move || cell.store((6, 3)))
            };
            let seen = *cell.load();
            assert!(seen == (5, 100) || seen == (6, 3), "torn pair: {seen:?}");
            writer.join().unwrap();
        },
        2_000,
    );
}
