//! proptest model tests for the pending-ack module: the wire format round
//! trip, and the replay handlers against a simple reference model, including
//! re-reading any suffix after a rewind (idempotency across attempts).
#![cfg(not(any(loom, feature = "shuttle")))]

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use pulsar_core::pending_ack::record::{decode_entry, encode_batch};
use pulsar_core::pending_ack::*;
use pulsar_core::Position;

#[derive(Debug, Clone, Copy)]
enum End {
    Commit,
    Abort,
    Pending,
}

fn end() -> impl Strategy<Value = End> {
    prop_oneof![Just(End::Commit), Just(End::Abort), Just(End::Pending)]
}

/// A log of well-formed transactions: individual txns with distinct
/// positions (ACK then maybe COMMIT/ABORT, interleaved arbitrarily), and
/// cumulative txns one after another on increasing positions.
fn log() -> impl Strategy<Value = (Vec<PendingAckRecord>, PendingAckSummary)> {
    (
        prop::collection::vec((1usize..3, end()), 0..6),
        prop::collection::vec(end(), 0..3),
        prop::collection::vec(any::<u8>(), 12),
    )
        .prop_map(|(indiv, cumul, shuffle)| {
            let mut expected = PendingAckSummary {
                mark_delete: Position::new(-1, -1),
                ..Default::default()
            };
            // Per-txn record sequences.
            let mut seqs: Vec<Vec<PendingAckRecord>> = Vec::new();
            let mut next_entry = 0i64;
            for (i, (n, e)) in indiv.iter().enumerate() {
                let t = TxnId::new(1, i as u64);
                let ps: Vec<Position> = (0..*n)
                    .map(|_| {
                        next_entry += 1;
                        Position::new(100, next_entry)
                    })
                    .collect();
                let mut s = vec![PendingAckRecord::individual_ack(
                    t,
                    ps.iter().map(|p| AckedPosition::whole(*p)).collect(),
                )];
                match e {
                    End::Commit => {
                        s.push(PendingAckRecord::commit(t, AckType::Individual));
                        expected.deleted.extend(ps.iter().copied());
                    }
                    End::Abort => s.push(PendingAckRecord::abort(t, AckType::Individual)),
                    End::Pending => {
                        expected.individual.insert(t, ps.iter().copied().collect());
                    }
                }
                seqs.push(s);
            }
            // Cumulative txns are sequential: one sequence.
            let mut cum = Vec::new();
            for (i, e) in cumul.iter().enumerate() {
                let t = TxnId::new(2, i as u64);
                let p = Position::new(50, 10 * (i as i64 + 1));
                cum.push(PendingAckRecord::cumulative_ack(t, p));
                match e {
                    End::Commit => {
                        cum.push(PendingAckRecord::commit(t, AckType::Cumulative));
                        expected.mark_delete = p;
                    }
                    End::Abort => cum.push(PendingAckRecord::abort(t, AckType::Cumulative)),
                    End::Pending => {
                        expected.cumulative = Some((t, p));
                        break; // nothing after a pending cumulative ack
                    }
                }
            }
            seqs.push(cum);
            // Interleave the sequences, keeping each one's order.
            let mut out = Vec::new();
            let mut k = 0;
            while seqs.iter().any(|s| !s.is_empty()) {
                let live: Vec<usize> = (0..seqs.len()).filter(|i| !seqs[*i].is_empty()).collect();
                let pick = live[shuffle[k % shuffle.len()] as usize % live.len()];
                k += 1;
                out.push(seqs[pick].remove(0));
            }
            (out, expected)
        })
}

fn apply_all(records: &[PendingAckRecord]) -> PendingAckState {
    let mut s = PendingAckState::default();
    for r in records {
        s.apply(r);
    }
    s
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn replay_matches_reference((records, expected) in log()) {
        prop_assert_eq!(apply_all(&records).summary(), expected);
    }

    #[test]
    fn rereading_any_suffix_after_a_rewind_is_harmless(
        (records, expected) in log(),
        a in any::<prop::sample::Index>(),
        b in any::<prop::sample::Index>(),
    ) {
        // Attempt 1 applied a prefix of length k, then failed; the retry
        // re-reads from j <= k (the rewound position) to the end.
        let k = if records.is_empty() { 0 } else { a.index(records.len() + 1) };
        let j = if k == 0 { 0 } else { b.index(k + 1) };
        let mut s = PendingAckState::default();
        for r in &records[..k] {
            s.apply(r);
        }
        for r in &records[j..] {
            s.apply(r);
        }
        prop_assert_eq!(s.summary(), expected);
    }

    #[test]
    fn wire_format_round_trips((records, _) in log()) {
        for r in &records {
            prop_assert_eq!(decode_entry(Position::new(1, 0), &r.encode()).unwrap(), vec![r.clone()]);
        }
        if !records.is_empty() {
            let b = encode_batch(&records);
            prop_assert_eq!(decode_entry(Position::new(1, 0), &b).unwrap(), records);
        }
    }

    #[test]
    fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        let _ = decode_entry(Position::new(1, 0), &bytes);
        let mut framed = vec![0x0e, 0x01, 0x00, 0x01];
        framed.extend_from_slice(&bytes);
        let _ = decode_entry(Position::new(1, 0), &framed);
    }

    #[test]
    fn backoff_stays_within_jitter_band(seed in any::<u64>()) {
        let mut b = Backoff::new(BackoffConfig::default(), seed);
        let mut nominal = 100u64;
        for _ in 0..14 {
            let d = b.next_delay_ms();
            prop_assert!(d <= nominal && d >= 100);
            prop_assert!(d > nominal - nominal / 10 || nominal <= 10);
            nominal = (nominal * 2).min(60_000);
        }
    }
}

#[test]
fn reference_model_is_not_trivial() {
    // A log where the §4 caveat matters: re-reading COMMIT(t1) after t2's
    // cumulative ack must not commit t2.
    let t1 = TxnId::new(2, 0);
    let t2 = TxnId::new(2, 1);
    let log = vec![
        PendingAckRecord::cumulative_ack(t1, Position::new(50, 10)),
        PendingAckRecord::commit(t1, AckType::Cumulative),
        PendingAckRecord::cumulative_ack(t2, Position::new(50, 20)),
    ];
    let mut s = apply_all(&log);
    s.apply(&log[1]);
    let m: BTreeMap<_, BTreeSet<Position>> = BTreeMap::new();
    assert_eq!(s.summary().individual, m);
    assert_eq!(s.summary().cumulative, Some((t2, Position::new(50, 20))));
    assert_eq!(s.summary().mark_delete, Position::new(50, 10));
}
