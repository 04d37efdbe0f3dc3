//! Producer access modes and unique producer names, as the clients see
//! them (Pulsar's `AbstractTopic.incrementTopicEpochIfNeeded` and
//! `internalAddProducer`; PIP-68).
//!
//! The core's answers reach every client over one FIFO link (the node
//! engine's outbound link), so the order in which the clients observe
//! PRODUCER_SUCCESS, ERROR, CLOSE_PRODUCER and a closed connection is the
//! order the core emitted them. A client's own close (its connection, or a
//! CLOSE_PRODUCER it sent) releases its admission when sent. On that order
//! the rules are:
//!
//! 1. **One exclusive holder.** A producer admitted (PRODUCER_SUCCESS with
//!    `producer_ready` true) while another admission that conflicts with
//!    it is live is a violation: any two where one is exclusive
//!    (`Exclusive`, `WaitForExclusive`, `ExclusiveWithFencing`) conflict,
//!    so a second exclusive producer, a shared one beside an exclusive one
//!    and an exclusive one beside shared ones are all refused
//!    (`ProducerFenced` / `ProducerBusy`) or queued. The one exception is
//!    an `ExclusiveWithFencing` admission: it fences the live ones out
//!    (their CLOSE_PRODUCER may follow its answer).
//! 2. **Fenced means fenced.** An admission another admission conflicted
//!    with is void from then on: a SEND its client sent after that point
//!    must never be receipted (the core refuses it), and its message is
//!    never delivered (the node engine does not count such a send as
//!    possibly stored, so a delivery of it is an unknown message).
//! 3. **WaitForExclusive in order.** A queued producer (PRODUCER_SUCCESS
//!    `producer_ready = false`) is promoted only after every producer
//!    queued before it and still queued was promoted or left (refused
//!    with `ProducerFenced`, or its connection closed); that it is promoted
//!    only after the holder left is rule 1.
//! 4. **Unique names.** A second producer with the name of a live one
//!    (a second producer id on the same connection) is refused with
//!    `ProducerBusy`; a PRODUCER_SUCCESS for it is a violation.

use std::collections::BTreeMap;

use super::DeliveryChecker;

/// A live admission as the checker knows it.
#[derive(Debug, Clone)]
struct Admission {
    label: String,
    exclusive: bool,
    /// Its client sent CLOSE_PRODUCER (released for rule 1).
    closing: bool,
    /// Another admission conflicted with it after it (rule 2).
    void: bool,
}

/// The access-mode rules' state.
#[derive(Debug, Default)]
pub(super) struct AccessState {
    next_id: u64,
    live: BTreeMap<u64, Admission>,
    /// Queued `WaitForExclusive` producers, in the order their queued
    /// answers were observed.
    waiting: Vec<String>,
}

impl DeliveryChecker {
    fn access_violation(&mut self, what: String, now_ms: u64) {
        self.counts.producer_access_violations += 1;
        self.violation(now_ms, format!("producer access: {what}"));
    }

    /// Producer `label` was queued (`WaitForExclusive`, `producer_ready =
    /// false`).
    pub fn producer_queued(&mut self, label: &str) {
        self.access.waiting.push(label.to_string());
    }

    /// Queued producer `label` left the queue without being promoted
    /// (refused, or its connection closed).
    pub fn producer_waiter_left(&mut self, label: &str) {
        self.access.waiting.retain(|w| w != label);
    }

    /// Producer `label` was admitted (`producer_ready` true), in an
    /// exclusive mode or not; `fencing`: `ExclusiveWithFencing`;
    /// `promoted`: it had been queued. Returns the admission's id.
    pub fn producer_granted(
        &mut self,
        label: &str,
        exclusive: bool,
        fencing: bool,
        promoted: bool,
        now_ms: u64,
    ) -> u64 {
        let mut broken = Vec::new();
        for a in self.access.live.values_mut() {
            if !(a.exclusive || exclusive) {
                continue;
            }
            if !a.closing && !a.void && !fencing {
                broken.push(format!(
                    "{label} admitted ({}) while {} holds the topic ({})",
                    mode_word(exclusive),
                    a.label,
                    mode_word(a.exclusive)
                ));
            }
            a.void = true;
        }
        for b in broken {
            self.access_violation(b, now_ms);
        }
        if promoted {
            if let Some(i) = self.access.waiting.iter().position(|w| w == label) {
                if i > 0 {
                    let first = self.access.waiting[0].clone();
                    self.access_violation(
                        format!(
                            "WaitForExclusive {label} promoted before {first}, queued before it and still queued"
                        ),
                        now_ms,
                    );
                }
                self.access.waiting.remove(i);
            }
        }
        let id = self.access.next_id;
        self.access.next_id += 1;
        self.access.live.insert(
            id,
            Admission {
                label: label.to_string(),
                exclusive,
                closing: false,
                void: false,
            },
        );
        id
    }

    /// The client of admission `id` sent CLOSE_PRODUCER.
    pub fn producer_closing(&mut self, id: u64) {
        if let Some(a) = self.access.live.get_mut(&id) {
            a.closing = true;
        }
    }

    /// Admission `id` ended (its close answered, CLOSE_PRODUCER from the
    /// core, or its connection closed).
    pub fn producer_left(&mut self, id: u64) {
        self.access.live.remove(&id);
    }

    /// Whether admission `id` was fenced out (rule 2): a SEND sent now
    /// must not be receipted.
    pub fn producer_void(&self, id: u64) -> bool {
        self.access.live.get(&id).is_some_and(|a| a.void)
    }

    /// A SEND sent after its admission was fenced out got a receipt.
    pub fn fenced_send_receipted(&mut self, what: &str, now_ms: u64) {
        self.access_violation(
            format!("a SEND sent after the producer was fenced out was receipted: {what}"),
            now_ms,
        );
    }

    /// A second producer with a live producer's name was admitted.
    pub fn same_name_admitted(&mut self, what: &str, now_ms: u64) {
        self.access_violation(
            format!("two producers named {what} both admitted (ProducerBusy expected)"),
            now_ms,
        );
    }
}

fn mode_word(exclusive: bool) -> &'static str {
    if exclusive {
        "exclusive"
    } else {
        "shared"
    }
}

#[cfg(test)]
mod tests {
    use super::super::{DeliveryChecker, OrderCheck};

    fn checker() -> DeliveryChecker {
        DeliveryChecker::new(["s".to_string()], 0, OrderCheck::None)
    }

    fn violations(c: DeliveryChecker) -> u64 {
        c.finish(0).0.producer_access_violations
    }

    #[test]
    fn a_second_exclusive_admission_while_one_holds_is_a_violation() {
        let mut c = checker();
        c.producer_granted("a", true, false, false, 1);
        c.producer_granted("b", true, false, false, 2);
        assert_eq!(violations(c), 1);
    }

    #[test]
    fn shared_beside_exclusive_is_a_violation_and_shared_beside_shared_is_not() {
        let mut c = checker();
        c.producer_granted("a", false, false, false, 1);
        c.producer_granted("b", false, false, false, 1);
        assert_eq!(violations(c), 0);
        let mut c = checker();
        c.producer_granted("a", true, false, false, 1);
        c.producer_granted("b", false, false, false, 2);
        assert_eq!(violations(c), 1);
    }

    #[test]
    fn a_released_holder_or_a_fencing_admission_is_no_violation() {
        let mut c = checker();
        let a = c.producer_granted("a", true, false, false, 1);
        c.producer_closing(a);
        let b = c.producer_granted("b", true, false, false, 2);
        c.producer_left(a);
        c.producer_granted("f", true, true, false, 3);
        assert!(c.producer_void(b));
        assert_eq!(violations(c), 0);
    }

    #[test]
    fn a_receipt_for_a_send_after_the_fence_is_a_violation() {
        let mut c = checker();
        let a = c.producer_granted("a", true, false, false, 1);
        assert!(!c.producer_void(a));
        c.producer_granted("f", true, true, false, 2);
        assert!(c.producer_void(a));
        c.fenced_send_receipted("a seq 3", 3);
        assert_eq!(violations(c), 1);
    }

    #[test]
    fn waiters_are_promoted_in_queue_order() {
        let mut c = checker();
        c.producer_queued("w1");
        c.producer_queued("w2");
        c.producer_granted("w2", true, false, true, 1);
        assert_eq!(violations(c), 1);
        let mut c = checker();
        c.producer_queued("w1");
        c.producer_queued("w2");
        c.producer_waiter_left("w1");
        c.producer_granted("w2", true, false, true, 1);
        assert_eq!(violations(c), 0);
    }
}
