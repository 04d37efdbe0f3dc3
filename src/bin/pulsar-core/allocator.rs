//! The binary's global allocator: mimalloc instead of the system's.
//!
//! A simulated run allocates and frees on every frame, every store commit
//! (redb's pages and buffers) and every checker event; glibc's malloc and
//! free were about 22 % of a swarm run's instructions, mimalloc's are
//! about 7 % (docs/measurements/swarm-throughput-2026-12-08.toml). It
//! keeps freed pages, so a run's peak RSS is higher (about 50 MiB for a
//! swarm of two runs at a time instead of 20). The choice belongs to the
//! program, not the library: it is made here, in the `pulsar-core` binary
//! (`simulate`, `swarm`, `serve`; feature `cli`), and an embedder's
//! `default-features = false` build keeps its own allocator. No behaviour
//! depends on it: the same seed gives the same report with either
//! allocator, apart from the wall-time and memory lines.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
