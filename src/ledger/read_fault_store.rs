//! A [`LedgerStore`] whose entry reads fail where a predicate says, every
//! other operation being the inner store's: storage faults as the store
//! reports them (typed errors, or entries whose data is gone), for the
//! simulator's node engine and the broker core's tests. Built only with
//! `test` or feature `sim`.

use super::{AppendSegment, LedgerStore, StoreError, StoredCursor, StoredLedger};
use crate::position::Position;

/// The failure to inject on a read of managed ledger `name`, if any.
type ReadFault = dyn Fn(&str) -> Option<StoreError> + Send + Sync;

/// Whether the entries of managed ledger `name` from (`ledger_id`,
/// `first`) on that a read asks for are gone (the read returns none).
type MissingEntries = dyn Fn(&str, i64, i64) -> bool + Send + Sync;

/// `inner` with `fault` consulted before each entry read.
pub(crate) struct ReadFaultStore<S> {
    inner: S,
    fault: Box<ReadFault>,
    missing: Option<Box<MissingEntries>>,
}

impl<S> ReadFaultStore<S> {
    pub(crate) fn new(
        inner: S,
        fault: impl Fn(&str) -> Option<StoreError> + Send + Sync + 'static,
    ) -> Self {
        Self {
            inner,
            fault: Box::new(fault),
            missing: None,
        }
    }

    /// A read `missing` names (managed ledger, ledger id, first entry)
    /// returns no entry, as if their data were gone (BookKeeper's
    /// `NoSuchEntry`): the managed ledger reports the short read as
    /// `NonRecoverableData`.
    pub(crate) fn with_missing_entries(
        mut self,
        missing: impl Fn(&str, i64, i64) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.missing = Some(Box::new(missing));
        self
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for ReadFaultStore<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadFaultStore")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S: LedgerStore> LedgerStore for ReadFaultStore<S> {
    fn load_ledger(&self, name: &str) -> Result<StoredLedger, StoreError> {
        self.inner.load_ledger(name)
    }

    fn create_ledger(&self, name: &str, ledger_id: i64) -> Result<(), StoreError> {
        self.inner.create_ledger(name, ledger_id)
    }

    fn append(&self, name: &str, segments: &[AppendSegment<'_>]) -> Result<(), StoreError> {
        self.inner.append(name, segments)
    }

    fn read(
        &self,
        name: &str,
        ledger_id: i64,
        first: i64,
        last: i64,
    ) -> Result<Vec<(i64, Vec<u8>)>, StoreError> {
        if let Some(e) = (self.fault)(name) {
            return Err(e);
        }
        if self
            .missing
            .as_ref()
            .is_some_and(|m| m(name, ledger_id, first))
        {
            return Ok(Vec::new());
        }
        self.inner.read(name, ledger_id, first, last)
    }

    fn mark_ledger_lost(&self, name: &str, ledger_id: i64) -> Result<(), StoreError> {
        self.inner.mark_ledger_lost(name, ledger_id)
    }

    fn delete_ledgers(&self, name: &str, ledger_ids: &[i64]) -> Result<(), StoreError> {
        self.inner.delete_ledgers(name, ledger_ids)
    }

    fn load_cursor(&self, name: &str, cursor: &str) -> Result<Option<StoredCursor>, StoreError> {
        self.inner.load_cursor(name, cursor)
    }

    fn save_mark_delete(
        &self,
        name: &str,
        cursor: &str,
        mark_delete: Position,
        individually_deleted: &[(Position, Position)],
    ) -> Result<(), StoreError> {
        self.inner
            .save_mark_delete(name, cursor, mark_delete, individually_deleted)
    }

    fn set_cursor_property(
        &self,
        name: &str,
        cursor: &str,
        key: &str,
        value: Option<i64>,
    ) -> Result<(), StoreError> {
        self.inner.set_cursor_property(name, cursor, key, value)
    }

    fn list_cursors(&self, name: &str) -> Result<Vec<String>, StoreError> {
        self.inner.list_cursors(name)
    }

    fn save_deletion_state(
        &self,
        name: &str,
        cursor: &str,
        mark_delete: Position,
        chunks: &[Vec<u8>],
        property_updates: &[(&str, Option<i64>)],
    ) -> Result<(), StoreError> {
        self.inner
            .save_deletion_state(name, cursor, mark_delete, chunks, property_updates)
    }

    fn load_deletion_state(
        &self,
        name: &str,
        cursor: &str,
    ) -> Result<Option<Vec<Vec<u8>>>, StoreError> {
        self.inner.load_deletion_state(name, cursor)
    }

    fn delete_cursor(&self, name: &str, cursor: &str) -> Result<(), StoreError> {
        self.inner.delete_cursor(name, cursor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::MemoryStore;

    #[test]
    fn a_fault_fails_the_read_and_missing_entries_return_none() {
        let inner = MemoryStore::new();
        for name in ["a", "b"] {
            inner.create_ledger(name, 1).unwrap();
            inner
                .append(
                    name,
                    &[AppendSegment {
                        ledger_id: 1,
                        first_entry_id: 0,
                        payloads: &[b"x".as_slice(); 3],
                    }],
                )
                .unwrap();
        }
        let s = ReadFaultStore::new(inner, |name| {
            (name == "a").then(|| StoreError::Unavailable("down".into()))
        })
        .with_missing_entries(|name, ledger_id, first| name == "b" && ledger_id == 1 && first < 2);
        assert!(matches!(
            s.read("a", 1, 0, 2),
            Err(StoreError::Unavailable(_))
        ));
        assert!(
            s.read("b", 1, 0, 2).unwrap().is_empty(),
            "entries 0..2 gone"
        );
        assert_eq!(s.read("b", 1, 2, 2).unwrap().len(), 1, "entry 2 is not");
    }
}
