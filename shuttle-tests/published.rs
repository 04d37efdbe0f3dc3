//! shuttle: the published-value cell (`sync::Published`) under random and PCT
//! schedules: readers never see an unpublished value and never go backwards.
#![cfg(feature = "shuttle")]

use pulsar_core::sync::{thread, Arc, Published};

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
