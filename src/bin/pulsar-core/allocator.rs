//! The binary's global allocator: mimalloc instead of the system's.
//!
//! A simulated run allocates and frees on every frame, every store commit
//! (redb's pages and buffers) and every checker event; with glibc's malloc
//! that was 15-25 % of a swarm run's instructions
//! (docs/measurements/swarm-throughput-2026-12-08.toml). The choice belongs to
//! the program, not the library: it is made here, in the `pulsar-core`
//! binary (feature `cli`), and an embedder's `default-features = false`
//! build keeps its own allocator. No behaviour depends on it: the same seed
//! gives the same report with either allocator.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
