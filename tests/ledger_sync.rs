//! `SyncMode::Deferred` durability contract of [`RedbStore`]: deferred
//! commits reach the disk only with a later durable commit,
//! [`RedbStore::sync`] or a clean close. A process killed (SIGKILL) after
//! `sync` keeps every entry appended before it; one killed without `sync`
//! reopens at the last durable commit (the deferred entries are gone, the
//! store still opens).
#![cfg(not(any(loom, feature = "shuttle")))]

use std::sync::Arc;
use std::time::{Duration, Instant};

use pulsar_core::ledger::{LedgerConfig, LedgerStore, ManagedLedger, RedbStore, SyncMode};

const CHILD_ENV: &str = "PULSAR_CORE_LEDGER_SYNC_CHILD";
const SYNCED: usize = 10;

fn cfg() -> LedgerConfig {
    LedgerConfig {
        max_entries_per_ledger: 1000,
        auto_skip_non_recoverable_data: false,
    }
}

/// Child half: appends `SYNCED` entries on a deferred store, calls `sync`
/// unless told not to, then appends more without syncing and waits to be
/// killed.
#[test]
fn deferred_sync_child() {
    let Ok(path) = std::env::var(CHILD_ENV) else {
        return; // only meaningful when spawned by the parent test
    };
    let do_sync = std::env::var("PULSAR_CORE_LEDGER_SYNC_CALL").as_deref() == Ok("1");
    let store = Arc::new(RedbStore::open_with(&path, SyncMode::Deferred).unwrap());
    let ml = ManagedLedger::open("topic", cfg(), store.clone() as Arc<dyn LedgerStore>).unwrap();
    for i in 0..SYNCED as u64 {
        ml.append(&i.to_le_bytes()).unwrap();
    }
    if do_sync {
        store.sync().unwrap();
    }
    for i in 0..5u64 {
        ml.append(&(100 + i).to_le_bytes()).unwrap();
    }
    std::fs::write(format!("{path}.ready"), b"1").unwrap();
    // Bounded: the parent kills this process long before.
    std::thread::sleep(Duration::from_secs(60));
}

/// Runs the child, kills it once it has appended, reopens the store and
/// returns the entries the first cursor reads.
fn kill_and_reopen(call_sync: bool) -> Vec<u64> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let path_s = path.to_str().unwrap().to_string();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "deferred_sync_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, &path_s)
        .env(
            "PULSAR_CORE_LEDGER_SYNC_CALL",
            if call_sync { "1" } else { "0" },
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let ready = format!("{path_s}.ready");
    let t0 = Instant::now();
    while !std::path::Path::new(&ready).exists() {
        if t0.elapsed() > Duration::from_secs(30) || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            panic!("child never got ready (exited or took over 30 s)");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();

    let store: Arc<dyn LedgerStore> = Arc::new(RedbStore::open(&path).unwrap());
    let ml = ManagedLedger::open("topic", cfg(), store).unwrap();
    let c = ml.open_cursor("check").unwrap();
    let mut out = Vec::new();
    loop {
        let got = c.read_entries(100).unwrap();
        if got.is_empty() {
            break;
        }
        out.extend(
            got.iter()
                .map(|e| u64::from_le_bytes(e.data[..8].try_into().unwrap())),
        );
    }
    out
}

#[test]
fn sync_makes_deferred_appends_survive_a_kill() {
    let got = kill_and_reopen(true);
    assert!(
        got.len() >= SYNCED && got[..SYNCED] == (0..SYNCED as u64).collect::<Vec<_>>()[..],
        "entries after sync and kill: {got:?}"
    );
}

#[test]
fn deferred_appends_without_sync_are_lost_by_a_kill_and_the_store_reopens() {
    assert_eq!(kill_and_reopen(false), Vec::<u64>::new());
}
