//! **Not public API.** The internals the crate's own model-checking test
//! crates (`loom-tests/`, `shuttle-tests/`, and the trace recorder
//! `tests/trace_deletion.rs`) drive directly. They are external crates, so
//! what they need must be `pub`; it is gathered here, `#[doc(hidden)]`,
//! instead of in the documented modules. Nothing here is covered by semver:
//! it may change in any release. Embedders use the documented modules only.
//!
//! | item | why the models need it |
//! |---|---|
//! | [`sync`] | the facade (std / loom / shuttle primitives): a model spawns its threads and builds its `Arc`s and negative-control atomics with the primitives the components use |
//! | [`pending_ack::ReplayAttempt`] | one replay attempt's read pipeline (`fill_queue`, `read_complete`, `read_failed`, `stop_replay`), raced directly by the loom models without a handle around it (and timed alone by `benches/pending_ack_replay.rs`) |

/// The primitives the models build their threads, `Arc`s and
/// negative-control atomics with: the crate's synchronisation facade
/// (`crate::sync`, crate-private), so a model runs on the backend the
/// components run on.
pub mod sync {
    pub use crate::sync::{
        fence, thread, Arc, AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Condvar, Mutex,
        Ordering, Published,
    };
}

/// Pending-ack replay internals driven by `loom-tests/pending_ack.rs` and
/// `shuttle-tests/pending_ack.rs`.
pub mod pending_ack {
    pub use crate::pending_ack::replay::ReplayAttempt;
}
