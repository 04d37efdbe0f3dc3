//! Every public function of `ledger`, `pending_ack` and `delayed` that
//! performs durable I/O (a store write or commit, directly or through
//! another function of those modules) documents whether it blocks and on
//! what: a `# Blocking` section in its doc comment. An embedder on an async
//! runtime reads there which calls need the non-blocking forms.
//!
//! A text scan of the sources, no compiler: a function "performs durable
//! I/O" if its body matches one of `DURABLE` or calls (`self.f(`,
//! `Self::f(`) a function of the scanned files that does; a public
//! function is one declared `pub fn` (calls of a `new` are not followed:
//! the name is everyone's). The negative control runs the same
//! scan on a function that appends to the store without the section.
#![cfg(not(any(loom, feature = "shuttle")))]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Calls that write durably (the store's write methods, a redb commit,
/// the snapshot storage's writes, and the components' own durable calls
/// on the objects they hold).
const DURABLE: &[&str] = &[
    "store.append(",
    "store.save_mark_delete(",
    "store.save_deletion_state(",
    "store.set_cursor_property(",
    "store.mark_ledger_lost(",
    "store.delete_ledgers(",
    "store.create_ledger(",
    "store.submit(",
    ".commit()",
    "storage.create(",
    "storage.delete(",
    "ledger.append(",
    "ledger.append_batch(",
    "ledger.append_async(",
    "cursor.mark_delete(",
    "cursor.mark_delete_async(",
    "cursor.persist_deletion_state(",
    "writer.append(",
    "writer.append_async(",
    "group_committer(",
];

struct Fn {
    file: String,
    name: String,
    public: bool,
    doc: String,
    body: String,
}

/// The functions of `src` (up to its first `#[cfg(test)]` item).
fn functions(file: &str, src: &str) -> Vec<Fn> {
    let lines: Vec<&str> = src.lines().collect();
    let end = lines
        .iter()
        .position(|l| l.starts_with("#[cfg(test)]") || l.starts_with("#[cfg(all(test"))
        .unwrap_or(lines.len());
    let lines = &lines[..end];
    let starts: Vec<(usize, String, bool)> = lines
        .iter()
        .enumerate()
        .filter_map(|(i, l)| {
            let t = l.trim_start();
            let (public, rest) = if let Some(r) = t.strip_prefix("pub fn ") {
                (true, r)
            } else if let Some(r) = t
                .strip_prefix("pub(crate) fn ")
                .or_else(|| t.strip_prefix("pub(super) fn "))
                .or_else(|| t.strip_prefix("fn "))
            {
                (false, r)
            } else {
                return None;
            };
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            Some((i, name, public))
        })
        .collect();
    let mut out = Vec::new();
    for (k, (i, name, public)) in starts.iter().enumerate() {
        let next = starts.get(k + 1).map_or(lines.len(), |s| s.0);
        let mut j = *i;
        while j > 0 {
            let t = lines[j - 1].trim_start();
            if t.starts_with("///") || t.starts_with("#[") {
                j -= 1;
            } else {
                break;
            }
        }
        // Method chains split over lines (`self\n    .store\n    .append(`)
        // are joined, so the patterns see `self.store.append(`.
        let body: String = lines[*i..next]
            .iter()
            .map(|l| {
                let t = l.trim_start();
                if t.starts_with('.') {
                    t.to_string()
                } else {
                    format!("\n{l}")
                }
            })
            .collect();
        out.push(Fn {
            file: file.to_string(),
            name: name.clone(),
            public: *public,
            doc: lines[j..*i].join("\n"),
            body,
        });
    }
    out
}

/// Public functions that perform durable I/O and lack `# Blocking`.
fn undocumented(fns: &[Fn]) -> Vec<String> {
    let mut durable: BTreeSet<&str> = BTreeSet::new();
    let mut flagged: Vec<bool> = fns
        .iter()
        .map(|f| DURABLE.iter().any(|m| f.body.contains(m)))
        .collect();
    loop {
        // Constructors are not followed (every type has a `new`, so a call
        // of `Self::new(` names no particular one); one with durable I/O is
        // caught by its own body.
        durable.extend(
            fns.iter()
                .zip(&flagged)
                .filter(|(f, d)| **d && f.name != "new")
                .map(|(f, _)| f.name.as_str()),
        );
        let mut changed = false;
        for (f, d) in fns.iter().zip(flagged.iter_mut()) {
            if !*d
                && durable.iter().any(|n| {
                    f.body.contains(&format!("self.{n}("))
                        || f.body.contains(&format!("Self::{n}("))
                })
            {
                *d = true;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let mut missing: BTreeMap<String, ()> = BTreeMap::new();
    for (f, d) in fns.iter().zip(&flagged) {
        if *d && f.public && !f.doc.contains("# Blocking") {
            missing.insert(format!("{}: pub fn {}", f.file, f.name), ());
        }
    }
    missing.into_keys().collect()
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs")
            && p.file_name().is_none_or(|n| n != "tests.rs")
        {
            out.push(p);
        }
    }
}

#[test]
fn every_public_function_with_durable_io_documents_blocking() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    for m in ["ledger", "pending_ack", "delayed"] {
        rs_files(&root.join(m), &mut files);
    }
    files.sort();
    let mut fns = Vec::new();
    for f in &files {
        let src = std::fs::read_to_string(f).unwrap();
        let rel = f.strip_prefix(&root).unwrap().display().to_string();
        fns.extend(functions(&rel, &src));
    }
    assert!(
        fns.len() > 100,
        "the scan found only {} functions",
        fns.len()
    );
    let missing = undocumented(&fns);
    assert!(
        missing.is_empty(),
        "public functions with durable I/O and no `# Blocking` section:\n{}",
        missing.join("\n")
    );
}

#[test]
fn negative_control_an_undocumented_store_write_is_caught() {
    let src = r#"
impl Thing {
    /// Appends.
    pub fn add(&self, data: &[u8]) -> Result<(), E> {
        self.write_it(data)
    }

    fn write_it(&self, data: &[u8]) -> Result<(), E> {
        self.store.append(&self.name, data)
    }

    /// Reads.
    ///
    /// # Blocking
    /// Blocks on the write.
    pub fn documented(&self) {
        self.write_it(b"x");
    }

    /// Trims, the call split over lines.
    pub fn trim(&self) {
        self
            .store
            .delete_ledgers(&self.name, &[1]);
    }

    /// No I/O.
    pub fn pure(&self) -> u32 {
        1
    }
}
"#;
    let fns = functions("control.rs", src);
    assert_eq!(
        undocumented(&fns),
        vec![
            "control.rs: pub fn add".to_string(),
            "control.rs: pub fn trim".to_string()
        ]
    );
}
