//! The concurrent scenarios of the published-value cell (`sync::Published`),
//! written once and run by `loom-tests/published.rs` (every interleaving)
//! and `shuttle-tests/published.rs` (random and PCT schedules): a reader
//! never sees a value that was not published and never goes back to an older
//! value once it saw a newer one; `rcu` never loses an update; a published
//! pair never tears. Negative control: `torn_pair.rs`.

use pulsar_core::__model::sync::{thread, Arc, Published};

/// One writer stores `1..=values` in order while `readers` threads read
/// `reads` times each.
pub fn monotonic_and_never_invents_values(values: u32, readers: usize, reads: usize) {
    let cell = Arc::new(Published::new(0u32));
    let writer = {
        let cell = Arc::clone(&cell);
        thread::spawn(move || {
            for v in 1..=values {
                cell.store(v);
            }
        })
    };
    let readers: Vec<_> = (0..readers)
        .map(|_| {
            let cell = Arc::clone(&cell);
            thread::spawn(move || {
                let mut last = 0;
                for _ in 0..reads {
                    let v = cell.with(|v| *v);
                    assert!(v <= values, "observed a value never published: {v}");
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
    assert_eq!(*cell.load(), values);
}

/// `threads` threads each `rcu(+1)` once: the final value counts them all.
pub fn rcu_never_loses_an_update(threads: u32) {
    let cell = Arc::new(Published::new(0u32));
    let hs: Vec<_> = (0..threads)
        .map(|_| {
            let cell = Arc::clone(&cell);
            thread::spawn(move || {
                cell.rcu(|v| v + 1);
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    assert_eq!(*cell.load(), threads);
}

/// The pair that `torn_pair::two_atomics_tear` tears, published through the
/// cell: never torn.
pub fn pair_never_tears() {
    let cell = Arc::new(Published::new((5u32, 100u32)));
    let writer = {
        let cell = Arc::clone(&cell);
        thread::spawn(move || cell.store((6, 3)))
    };
    let seen = cell.with(|v| *v);
    assert!(seen == (5, 100) || seen == (6, 3), "torn pair: {seen:?}");
    writer.join().unwrap();
}
