//! Producer access modes and unique names through `serve` (Pulsar's
//! `AbstractTopic.incrementTopicEpochIfNeeded` / `internalAddProducer`,
//! PIP-68): what a client sees.

use super::*;

const EXCLUSIVE: i32 = 1;
const EXCLUSIVE_WITH_FENCING: i32 = 3;

impl Client {
    /// Sends PRODUCER (`mode`, `name`) as producer `pid`; returns the
    /// answer (PRODUCER_SUCCESS or ERROR).
    fn open_producer(&mut self, topic: &str, pid: u64, name: &str, mode: i32) -> BrokerCommand {
        let request_id = self.request();
        self.send(BrokerCommand {
            r#type: ty::PRODUCER,
            producer: Some(proto::CommandProducer {
                topic: topic.into(),
                producer_id: pid,
                request_id,
                producer_name: Some(name.into()),
                producer_access_mode: Some(mode),
                topic_epoch: None,
            }),
            ..Default::default()
        });
        self.expect(
            |f| {
                f.producer_success.as_ref().map(|s| s.request_id) == Some(request_id)
                    || f.error.as_ref().map(|e| e.request_id) == Some(request_id)
            },
            "the PRODUCER's answer",
        )
    }
}

fn error_code(answer: &BrokerCommand) -> Option<i32> {
    answer.error.as_ref().map(|e| e.error)
}

/// A second `Exclusive` producer is refused `ProducerFenced` and a shared
/// one `ProducerBusy` while the first holds the topic; a second producer
/// of a held name is refused `ProducerBusy`; only the holder's entries are
/// stored.
#[test]
fn exclusive_producer_access_and_unique_names() {
    let s = server(&[]);
    let mut a = Client::connect(&s);
    let ok = a.open_producer("excl", 1, "p-excl", EXCLUSIVE);
    assert_eq!(ok.r#type, ty::PRODUCER_SUCCESS, "{ok:?}");
    let mut b = Client::connect(&s);
    let second = b.open_producer("excl", 1, "b", EXCLUSIVE);
    assert_eq!(
        error_code(&second),
        Some(proto::server_error::PRODUCER_FENCED),
        "a second Exclusive producer: {second:?}"
    );
    let shared = b.open_producer("excl", 2, "c", 0);
    assert_eq!(
        error_code(&shared),
        Some(proto::server_error::PRODUCER_BUSY),
        "a Shared producer beside an Exclusive one: {shared:?}"
    );
    let first = a.publish(0, None, None);
    // The holder leaves: a shared producer, then a second of its name.
    drop(a);
    let mut c = Client::connect(&s);
    let deadline = Instant::now() + WAIT;
    loop {
        let r = c.open_producer("excl", 1, "s1", 0);
        if r.r#type == ty::PRODUCER_SUCCESS {
            break;
        }
        assert!(Instant::now() < deadline, "the topic never freed: {r:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let twin = c.open_producer("excl", 2, "s1", 0);
    assert_eq!(
        error_code(&twin),
        Some(proto::server_error::PRODUCER_BUSY),
        "a second producer named s1: {twin:?}"
    );
    let mut d = Client::connect(&s);
    d.subscribe("excl", 1, "sub", SHARED, "d");
    d.flow(1, 10);
    assert_eq!(d.messages(1, SETTLE), vec![first]);
}

/// `ExclusiveWithFencing` closes the holder (CLOSE_PRODUCER); a SEND the
/// fenced producer sends afterwards gets no receipt and is never stored.
#[test]
fn a_fenced_exclusive_producer_cannot_write() {
    let s = server(&[]);
    let mut a = Client::connect(&s);
    let ok = a.open_producer("fence", 1, "a", EXCLUSIVE);
    assert_eq!(ok.r#type, ty::PRODUCER_SUCCESS, "{ok:?}");
    let before = a.publish(0, None, None);
    let mut f = Client::connect(&s);
    let ok = f.open_producer("fence", 1, "f", EXCLUSIVE_WITH_FENCING);
    assert_eq!(ok.r#type, ty::PRODUCER_SUCCESS, "{ok:?}");
    // The fenced producer writes on regardless.
    a.send_with(
        BrokerCommand {
            r#type: ty::SEND,
            send: Some(proto::CommandSend {
                producer_id: 1,
                sequence_id: 1,
                ..Default::default()
            }),
            ..Default::default()
        },
        entry(1, None, None),
    );
    let deadline = Instant::now() + SETTLE;
    while Instant::now() < deadline {
        if let Some(cmd) = a.next(Duration::from_millis(100)) {
            assert_ne!(
                cmd.r#type,
                ty::SEND_RECEIPT,
                "a SEND of the fenced producer was receipted: {cmd:?}"
            );
        }
    }
    let after = f.publish(0, None, None);
    let mut c = Client::connect(&s);
    c.subscribe("fence", 1, "sub", SHARED, "c");
    c.flow(1, 10);
    assert_eq!(c.messages(1, SETTLE), vec![before, after]);
}

/// `WaitForExclusive` producers are answered `producer_ready = false`
/// while the topic is held, then get it one at a time in the order they
/// asked, each when the one before it left.
#[test]
fn wait_for_exclusive_producers_get_the_topic_in_order() {
    const WAIT_FOR_EXCLUSIVE: i32 = 2;
    let s = server(&[]);
    let mut a = Client::connect(&s);
    let ok = a.open_producer("wait", 1, "a", EXCLUSIVE);
    assert_eq!(ok.r#type, ty::PRODUCER_SUCCESS, "{ok:?}");
    let mut w: Vec<Client> = (0..3).map(|_| Client::connect(&s)).collect();
    for (i, c) in w.iter_mut().enumerate() {
        let q = c.open_producer("wait", 1, &format!("w{i}"), WAIT_FOR_EXCLUSIVE);
        let q = q.producer_success.expect("queued: PRODUCER_SUCCESS");
        assert_eq!(q.producer_ready, Some(false), "w{i}");
    }
    let ready = |c: &mut Client, within: Duration| loop {
        let deadline = Instant::now() + within;
        match c.next(within) {
            Some(f) => {
                if f.producer_success.and_then(|s| s.producer_ready) == Some(true) {
                    return true;
                }
            }
            None => return false,
        }
        if Instant::now() >= deadline {
            return false;
        }
    };
    drop(a);
    for i in 0..3 {
        assert!(ready(&mut w[i], WAIT), "w{i} never got the topic");
        for (j, later) in w.iter_mut().enumerate().skip(i + 1) {
            assert!(
                !ready(later, Duration::from_millis(200)),
                "w{j} got the topic while w{i} holds it"
            );
        }
        // w_i leaves (closes its connection).
        w[i] = Client::connect(&s);
    }
}
