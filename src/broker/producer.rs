//! Producers on a topic (Pulsar's `AbstractTopic.addProducer`,
//! `incrementTopicEpochIfNeeded`, `internalAddProducer`,
//! `handleProducerRemoved`): producer access modes, the topic epoch and
//! unique producer names.
//!
//! | mode | admitted when | refused with |
//! |---|---|---|
//! | `Shared` (0) | no exclusive producer holds or waits for the topic | `ProducerBusy` |
//! | `Exclusive` (1) | no other producer at all, and its `topic_epoch` (if any) is not below the topic's | `ProducerFenced` |
//! | `WaitForExclusive` (2) | as `Exclusive`; otherwise queued: PRODUCER_SUCCESS `producer_ready = false` now, a second one (`producer_ready = true`, the new epoch) when it gets the topic | `ProducerFenced` (epoch below the topic's) |
//! | `ExclusiveWithFencing` (3) | always: every producer on the topic is closed (CLOSE_PRODUCER) and every waiting one refused, unless its `topic_epoch` is below the topic's | `ProducerFenced` |
//!
//! Each exclusive admission moves the topic epoch (`epoch + 1`, 0 the first
//! time, or the producer's own `topic_epoch` when it reconnects with one);
//! the epoch is durable ([`super::dedup`] keeps it with the producers'
//! sequence ids), so a producer fenced before a restart stays fenced.
//! A name already held by a producer on the topic is refused with
//! `ProducerBusy` (Pulsar's `NamingException`): the core cannot probe the
//! old connection's liveness as Pulsar's `checkConnectionLiveness` does; the
//! old one leaves when its connection closes (keep-alive) or it closes.

use std::collections::{BTreeMap, VecDeque};

use super::error::BrokerError;
use super::ConnectionId;

/// `ProducerAccessMode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessMode {
    /// Many producers.
    Shared,
    /// The only producer, or refused at once.
    Exclusive,
    /// The only producer, queued until the topic is free.
    WaitForExclusive,
    /// The only producer, closing every other one.
    ExclusiveWithFencing,
}

impl AccessMode {
    /// The mode of a `producer_access_mode` value (`None`: no such value).
    pub fn from_wire(v: i32) -> Option<Self> {
        match v {
            0 => Some(Self::Shared),
            1 => Some(Self::Exclusive),
            2 => Some(Self::WaitForExclusive),
            3 => Some(Self::ExclusiveWithFencing),
            _ => None,
        }
    }
}

/// A producer as the topic knows it: its connection and id there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerSlot {
    /// Its connection.
    pub conn: ConnectionId,
    /// Its `producer_id` on that connection.
    pub producer_id: u64,
    /// The PRODUCER's `request_id` (a queued producer's second
    /// PRODUCER_SUCCESS names it).
    pub request_id: u64,
    /// Its name.
    pub name: String,
    /// The `topic_epoch` it asked with.
    pub topic_epoch: Option<u64>,
}

/// What admitting a producer did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admitted {
    /// Ready now, at this topic epoch (if the topic has one).
    Ready {
        /// The epoch to answer (`topic_epoch` of PRODUCER_SUCCESS).
        topic_epoch: Option<u64>,
        /// Producers fenced out (`ExclusiveWithFencing`): closed on their
        /// connections (CLOSE_PRODUCER) or, queued, refused.
        fenced: Vec<ProducerSlot>,
        /// Queued producers refused by the fencing (answered `ProducerFenced`).
        refused: Vec<ProducerSlot>,
    },
    /// Queued (`WaitForExclusive`): `producer_ready = false`.
    Queued,
}

/// A queued producer that got the topic, or was refused on its turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Promotion {
    /// It holds the topic now at `topic_epoch`.
    Ready(ProducerSlot, u64),
    /// Refused (its name is held, or its epoch is below the topic's).
    Refused(ProducerSlot, BrokerError),
}

/// The producers of one topic.
#[derive(Debug, Default)]
pub struct TopicProducers {
    /// Admitted producers by name.
    by_name: BTreeMap<String, ProducerSlot>,
    /// Whether an exclusive producer holds the topic.
    has_exclusive: bool,
    exclusive_name: Option<String>,
    /// `WaitForExclusive` producers, in arrival order.
    waiting: VecDeque<ProducerSlot>,
    /// The topic epoch (`None`: no exclusive producer ever held the topic).
    topic_epoch: Option<u64>,
}

fn fenced(msg: String) -> BrokerError {
    BrokerError::ProducerFenced(msg)
}

impl TopicProducers {
    /// A topic whose durable epoch is `topic_epoch`.
    pub fn new(topic_epoch: Option<u64>) -> Self {
        Self {
            topic_epoch,
            ..Self::default()
        }
    }

    /// The topic epoch.
    pub fn topic_epoch(&self) -> Option<u64> {
        self.topic_epoch
    }

    /// Admitted producers, by name.
    pub fn admitted(&self) -> impl Iterator<Item = &ProducerSlot> {
        self.by_name.values()
    }

    /// Queued producers, in order.
    pub fn waiting(&self) -> impl Iterator<Item = &ProducerSlot> {
        self.waiting.iter()
    }

    /// Whether `name` is held by an admitted producer.
    pub fn holds_name(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    fn stale_epoch(&self, p: &ProducerSlot) -> Option<BrokerError> {
        match (p.topic_epoch, self.topic_epoch) {
            (Some(e), Some(t)) if e < t => Some(fenced(format!(
                "Topic epoch has already moved. Current epoch: {t}, Producer epoch: {e}"
            ))),
            _ => None,
        }
    }

    fn busy_name(&self, p: &ProducerSlot) -> Option<BrokerError> {
        self.by_name.contains_key(&p.name).then(|| {
            BrokerError::ProducerBusy(format!(
                "Producer with name '{}' is already connected to topic",
                p.name
            ))
        })
    }

    /// The epoch an exclusive admission of `p` moves the topic to.
    fn next_epoch(&self, p: &ProducerSlot) -> u64 {
        p.topic_epoch
            .unwrap_or_else(|| self.topic_epoch.map_or(0, |e| e.saturating_add(1)))
    }

    /// Decides the admission of `p` in `mode` without changing anything:
    /// the epoch it would move the topic to (`Some` for an exclusive
    /// admission), or `None` for a shared one or a queued one (`queued`).
    ///
    /// # Errors
    /// `ProducerBusy` / `ProducerFenced` as in the module table.
    pub fn check(
        &self,
        p: &ProducerSlot,
        mode: AccessMode,
    ) -> Result<(Option<u64>, bool), BrokerError> {
        let exclusive_held = self.has_exclusive || !self.waiting.is_empty();
        let holder = || self.exclusive_name.clone().unwrap_or_default();
        match mode {
            AccessMode::Shared => {
                if exclusive_held {
                    return Err(BrokerError::ProducerBusy(format!(
                        "Topic has an existing exclusive producer: {}",
                        holder()
                    )));
                }
                if let Some(e) = self.busy_name(p) {
                    return Err(e);
                }
                Ok((None, false))
            }
            AccessMode::Exclusive => {
                if exclusive_held {
                    return Err(fenced(format!(
                        "Topic has an existing exclusive producer: {}",
                        holder()
                    )));
                }
                if !self.by_name.is_empty() {
                    return Err(fenced("Topic has existing shared producers".into()));
                }
                if let Some(e) = self.stale_epoch(p) {
                    return Err(e);
                }
                Ok((Some(self.next_epoch(p)), false))
            }
            AccessMode::WaitForExclusive => {
                if self.has_exclusive || !self.by_name.is_empty() {
                    return Ok((None, true));
                }
                if let Some(e) = self.stale_epoch(p) {
                    return Err(e);
                }
                Ok((Some(self.next_epoch(p)), false))
            }
            AccessMode::ExclusiveWithFencing => {
                if let Some(e) = self.stale_epoch(p) {
                    return Err(e);
                }
                Ok((Some(self.next_epoch(p)), false))
            }
        }
    }

    /// Applies an admission [`TopicProducers::check`] allowed (`epoch`, and
    /// `queued`, are what it returned); the caller made `epoch` durable
    /// first.
    pub fn admit(
        &mut self,
        p: ProducerSlot,
        mode: AccessMode,
        epoch: Option<u64>,
        queued: bool,
    ) -> Admitted {
        if queued {
            self.waiting.push_back(p);
            return Admitted::Queued;
        }
        let mut fenced = Vec::new();
        let mut refused = Vec::new();
        if mode == AccessMode::ExclusiveWithFencing {
            refused.extend(self.waiting.drain(..));
            fenced.extend(std::mem::take(&mut self.by_name).into_values());
        }
        if let Some(e) = epoch {
            self.has_exclusive = true;
            self.exclusive_name = Some(p.name.clone());
            self.topic_epoch = Some(e);
        }
        self.by_name.insert(p.name.clone(), p);
        Admitted::Ready {
            topic_epoch: self.topic_epoch,
            fenced,
            refused,
        }
    }

    /// Removes producer `producer_id` of `conn` (admitted or queued); when it
    /// held the topic exclusively, the next queued producer is considered:
    /// the returned promotion, whose epoch the caller makes durable before
    /// [`TopicProducers::promote`]. `None` when nothing changed hands.
    pub fn remove(&mut self, conn: ConnectionId, producer_id: u64) -> Option<ProducerSlot> {
        self.waiting
            .retain(|w| !(w.conn == conn && w.producer_id == producer_id));
        let name = self
            .by_name
            .iter()
            .find(|(_, s)| s.conn == conn && s.producer_id == producer_id)
            .map(|(n, _)| n.clone())?;
        let removed = self.by_name.remove(&name);
        if self.has_exclusive {
            self.has_exclusive = false;
            self.exclusive_name = None;
        }
        removed
    }

    /// The next queued producer, if the topic is free for it: taken off the
    /// queue with the epoch it would move the topic to (or the error that
    /// refuses it). The caller makes the epoch durable, then calls
    /// [`TopicProducers::promote`].
    pub fn next_waiting(
        &mut self,
    ) -> Option<Result<(ProducerSlot, u64), (ProducerSlot, BrokerError)>> {
        if self.has_exclusive || !self.by_name.is_empty() {
            return None;
        }
        let p = self.waiting.pop_front()?;
        if let Some(e) = self.stale_epoch(&p).or_else(|| self.busy_name(&p)) {
            return Some(Err((p, e)));
        }
        let epoch = self.next_epoch(&p);
        Some(Ok((p, epoch)))
    }

    /// Gives the topic to a producer [`TopicProducers::next_waiting`] chose.
    pub fn promote(&mut self, p: ProducerSlot, epoch: u64) {
        self.has_exclusive = true;
        self.exclusive_name = Some(p.name.clone());
        self.topic_epoch = Some(epoch);
        self.by_name.insert(p.name.clone(), p);
    }
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;

    fn slot(conn: u64, id: u64, name: &str, epoch: Option<u64>) -> ProducerSlot {
        ProducerSlot {
            conn,
            producer_id: id,
            request_id: id,
            name: name.into(),
            topic_epoch: epoch,
        }
    }

    fn add(
        t: &mut TopicProducers,
        p: ProducerSlot,
        mode: AccessMode,
    ) -> Result<Admitted, BrokerError> {
        let (epoch, queued) = t.check(&p, mode)?;
        Ok(t.admit(p, mode, epoch, queued))
    }

    #[test]
    fn a_second_exclusive_producer_is_fenced_and_a_shared_one_busy() {
        let mut t = TopicProducers::new(None);
        let a = add(&mut t, slot(1, 1, "a", None), AccessMode::Exclusive).unwrap();
        assert!(matches!(
            a,
            Admitted::Ready {
                topic_epoch: Some(0),
                ..
            }
        ));
        let e = add(&mut t, slot(2, 1, "b", None), AccessMode::Exclusive).unwrap_err();
        assert!(matches!(e, BrokerError::ProducerFenced(_)), "{e:?}");
        let e = add(&mut t, slot(2, 2, "c", None), AccessMode::Shared).unwrap_err();
        assert!(matches!(e, BrokerError::ProducerBusy(_)), "{e:?}");
        // Freed: the next exclusive producer moves the epoch.
        t.remove(1, 1);
        let a = add(&mut t, slot(2, 1, "b", None), AccessMode::Exclusive).unwrap();
        assert!(matches!(
            a,
            Admitted::Ready {
                topic_epoch: Some(1),
                ..
            }
        ));
    }

    #[test]
    fn exclusive_is_refused_while_shared_producers_are_attached() {
        let mut t = TopicProducers::new(None);
        add(&mut t, slot(1, 1, "a", None), AccessMode::Shared).unwrap();
        let e = add(&mut t, slot(2, 1, "b", None), AccessMode::Exclusive).unwrap_err();
        assert_eq!(e, fenced("Topic has existing shared producers".into()));
    }

    #[test]
    fn two_producers_may_not_share_a_name() {
        let mut t = TopicProducers::new(None);
        add(&mut t, slot(1, 1, "a", None), AccessMode::Shared).unwrap();
        let e = add(&mut t, slot(2, 7, "a", None), AccessMode::Shared).unwrap_err();
        assert!(matches!(e, BrokerError::ProducerBusy(_)), "{e:?}");
        assert_eq!(t.admitted().count(), 1);
    }

    #[test]
    fn wait_for_exclusive_is_queued_then_promoted_with_the_next_epoch() {
        let mut t = TopicProducers::new(Some(4));
        add(&mut t, slot(1, 1, "a", None), AccessMode::Exclusive).unwrap();
        assert_eq!(t.topic_epoch(), Some(5));
        let q = add(&mut t, slot(2, 1, "w", None), AccessMode::WaitForExclusive).unwrap();
        assert_eq!(q, Admitted::Queued);
        // Nothing to promote while the holder is there.
        assert!(t.next_waiting().is_none());
        // A shared producer is refused while one waits.
        assert!(add(&mut t, slot(3, 1, "s", None), AccessMode::Shared).is_err());
        t.remove(1, 1);
        let (p, epoch) = t.next_waiting().unwrap().unwrap();
        assert_eq!((p.name.as_str(), epoch), ("w", 6));
        t.promote(p, epoch);
        assert!(t.holds_name("w"));
        assert_eq!(t.topic_epoch(), Some(6));
    }

    #[test]
    fn fencing_closes_every_producer_and_refuses_the_queued_ones() {
        let mut t = TopicProducers::new(None);
        add(&mut t, slot(1, 1, "a", None), AccessMode::Exclusive).unwrap();
        add(&mut t, slot(2, 1, "w", None), AccessMode::WaitForExclusive).unwrap();
        let r = add(
            &mut t,
            slot(3, 1, "f", None),
            AccessMode::ExclusiveWithFencing,
        )
        .unwrap();
        let Admitted::Ready {
            topic_epoch,
            fenced,
            refused,
        } = r
        else {
            panic!("{r:?}")
        };
        assert_eq!(topic_epoch, Some(1));
        assert_eq!(
            fenced.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
            ["a"]
        );
        assert_eq!(
            refused.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
            ["w"]
        );
        assert_eq!(t.admitted().count(), 1);
        // The fenced producer reconnecting with its old epoch stays fenced.
        let e = add(&mut t, slot(1, 1, "a", Some(0)), AccessMode::Exclusive).unwrap_err();
        assert!(matches!(e, BrokerError::ProducerFenced(_)), "{e:?}");
    }

    #[test]
    fn a_refused_producer_changes_nothing() {
        let mut t = TopicProducers::new(Some(3));
        let e = add(
            &mut t,
            slot(1, 1, "a", Some(2)),
            AccessMode::ExclusiveWithFencing,
        )
        .unwrap_err();
        assert!(matches!(e, BrokerError::ProducerFenced(_)));
        assert_eq!((t.topic_epoch(), t.admitted().count()), (Some(3), 0));
        // Its own (current) epoch is accepted on reconnect.
        let a = add(&mut t, slot(1, 1, "a", Some(3)), AccessMode::Exclusive).unwrap();
        assert!(matches!(
            a,
            Admitted::Ready {
                topic_epoch: Some(3),
                ..
            }
        ));
    }
}
