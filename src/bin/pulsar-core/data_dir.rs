//! Where a run's store lives, and what happens to it at the end or on Ctrl-C.

use std::path::{Path, PathBuf};

/// The data directory of one run.
pub struct DataDir {
    path: PathBuf,
    /// `Some` while the directory is removed at the end (a fresh temporary
    /// directory without --keep-data).
    temp: Option<tempfile::TempDir>,
}

impl DataDir {
    /// `explicit` (kept), or a fresh, unpredictably named directory under the
    /// system temp dir (`$TMPDIR`), created with owner-only permissions and
    /// removed at the end unless `keep`.
    pub fn new(explicit: Option<&Path>, keep: bool) -> Result<Self, String> {
        if let Some(d) = explicit {
            if d.exists() && !d.is_dir() {
                return Err(format!(
                    "data dir {} exists and is not a directory",
                    d.display()
                ));
            }
            if d.join("pulsar-core.redb").exists() {
                return Err(format!(
                    "data dir {} already holds a store; use an empty directory",
                    d.display()
                ));
            }
            return Ok(Self {
                path: d.to_path_buf(),
                temp: None,
            });
        }
        let temp = tempfile::Builder::new()
            .prefix("pulsar-core-sim-")
            .tempdir()
            .map_err(|e| {
                format!(
                    "cannot create a temporary data dir under {} ({e}); set TMPDIR or pass --data-dir",
                    std::env::temp_dir().display()
                )
            })?;
        let path = temp.path().to_path_buf();
        if keep {
            // The directory outlives the process: the TempDir no longer owns it.
            let _ = temp.keep();
            return Ok(Self { path, temp: None });
        }
        Ok(Self {
            path,
            temp: Some(temp),
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the directory is removed at the end of the run.
    pub fn removed_at_end(&self) -> bool {
        self.temp.is_some()
    }

    /// One line for stderr at the start of the run.
    pub fn start_line(&self) -> String {
        if self.removed_at_end() {
            format!(
                "data dir: {} (temporary, removed at the end; --keep-data keeps it)",
                self.path.display()
            )
        } else {
            format!("data dir: {} (kept after the run)", self.path.display())
        }
    }

    /// On Ctrl-C / SIGTERM: removes a temporary directory, says what
    /// happened to the data dir, and exits with 130.
    pub fn exit_on_interrupt(&self) {
        let path = self.path.clone();
        let remove = self.removed_at_end();
        let installed = ctrlc::set_handler(move || {
            if remove {
                match std::fs::remove_dir_all(&path) {
                    Ok(()) => eprintln!("interrupted: removed data dir {}", path.display()),
                    Err(e) => eprintln!(
                        "interrupted: could not remove data dir {}: {e}",
                        path.display()
                    ),
                }
            } else {
                eprintln!(
                    "interrupted: data dir {} kept (its store holds the run up to the interrupt)",
                    path.display()
                );
            }
            std::process::exit(130);
        });
        if let Err(e) = installed {
            tracing::warn!("no Ctrl-C handler ({e}): an interrupt leaves the data dir as it is");
        }
    }

    /// Ends the run: removes a temporary directory and returns the line that
    /// says whether the directory was kept or removed.
    pub fn finish(self) -> String {
        match self.temp {
            Some(t) => match t.close() {
                Ok(()) => format!("data dir {} removed", self.path.display()),
                Err(e) => format!("data dir {} could not be removed: {e}", self.path.display()),
            },
            None => format!("data dir {} kept", self.path.display()),
        }
    }
}
