//! loom: the published-value cell (`sync::Published`) never shows a value that
//! was not published, and never goes back to an older value once a newer one
//! was observed by the same thread.
#![cfg(loom)]

use pulsar_core::__model::sync::{thread, Arc, Published};

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

/// Negative control: a test-only "published cell" that stores a pair as two
/// separate atomics (the shape the facade's `Published` exists to avoid).
/// loom must find the interleaving where a reader sees a torn pair, i.e. a
/// value that was never published.
mod torn_pair_model {
    use pulsar_core::__model::sync::{AtomicU32, Ordering};

    pub struct TwoAtomics {
        hi: AtomicU32,
        lo: AtomicU32,
    }

    impl TwoAtomics {
        pub fn new(hi: u32, lo: u32) -> Self {
            Self {
                hi: AtomicU32::new(hi),
                lo: AtomicU32::new(lo),
            }
        }
        pub fn store(&self, hi: u32, lo: u32) {
            self.hi.store(hi, Ordering::SeqCst);
            self.lo.store(lo, Ordering::SeqCst);
        }
        pub fn load(&self) -> (u32, u32) {
            (
                self.hi.load(Ordering::SeqCst),
                self.lo.load(Ordering::SeqCst),
            )
        }
    }
}

#[test]
#[should_panic(expected = "torn pair observed")]
fn negative_control_two_atomics_tear() {
    use torn_pair_model::TwoAtomics;
    loom::model(|| {
        // Published values: (5, 100) then (6, 3). (6, 100) was never published.
        let cell = Arc::new(TwoAtomics::new(5, 100));
        let writer = {
            let cell = Arc::clone(&cell);
            thread::spawn(move || cell.store(6, 3))
        };
        let seen = cell.load();
        assert!(
            seen == (5, 100) || seen == (6, 3),
            "torn pair observed: {seen:?}"
        );
        writer.join().unwrap();
    });
}

#[test]
fn published_pair_never_tears() {
    loom::model(|| {
        let cell = Arc::new(Published::new((5u32, 100u32)));
        let writer = {
            let cell = Arc::clone(&cell);
            thread::spawn(move || cell.store((6, 3)))
        };
        let seen = cell.with(|v| *v);
        assert!(seen == (5, 100) || seen == (6, 3), "torn pair: {seen:?}");
        writer.join().unwrap();
    });
}
