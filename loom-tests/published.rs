//! loom: the published-value cell (`sync::Published`) never shows a value that
//! was not published, and never goes back to an older value once a newer one
//! was observed by the same thread.
#![cfg(loom)]

use pulsar_core::sync::{thread, Arc, Published};

#[test]
fn published_cell_is_monotonic_and_never_invents_values() {
    loom::model(|| {
        let cell = Arc::new(Published::new(0u32));
        let writer = {
            let cell = Arc::clone(&cell);
            thread::spawn(move || {
                cell.store(1);
                cell.store(2);
            })
        };
        let reader = {
            let cell = Arc::clone(&cell);
            thread::spawn(move || {
                let mut last = 0;
                for _ in 0..3 {
                    let v = cell.with(|v| *v);
                    assert!(v <= 2, "observed a value never published: {v}");
                    assert!(v >= last, "went back from {last} to {v}");
                    last = v;
                }
            })
        };
        writer.join().unwrap();
        reader.join().unwrap();
        assert_eq!(*cell.load(), 2);
    });
}

#[test]
fn rcu_never_loses_an_update() {
    loom::model(|| {
        let cell = Arc::new(Published::new(0u32));
        let hs: Vec<_> = (0..2)
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
        assert_eq!(*cell.load(), 2);
    });
}
