//! `pulsar-core serve` as a child process: started on a loopback port with a
//! data dir, killed with SIGKILL and restarted on the same data dir, stopped
//! with SIGTERM at the end. Dropping a `Server` kills a still-running child,
//! so no exit path of the program leaves a `serve` behind.

use std::fs::File;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Server {
    binary: PathBuf,
    workdir: PathBuf,
    pub port: u16,
    child: Option<Child>,
    pub boots: u32,
    /// `--permit-ledger` and `--record-frames` (the judges read them); off
    /// for the benchmark, whose serve writes nothing but its store.
    record: bool,
}

pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl Server {
    pub fn new(binary: &Path, workdir: &Path, port: u16) -> Server {
        Server {
            binary: binary.to_path_buf(),
            workdir: workdir.to_path_buf(),
            port,
            child: None,
            boots: 0,
            record: true,
        }
    }

    /// A serve that records nothing besides its store (no permit ledger, no
    /// frame recording) and logs warnings only: what the benchmark runs.
    pub fn unrecorded(mut self) -> Server {
        self.record = false;
        self
    }

    /// The running serve's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn url(&self) -> String {
        format!("pulsar://127.0.0.1:{}", self.port)
    }

    pub fn start(&mut self) -> Result<(), String> {
        self.boots += 1;
        let log_path = self.workdir.join(format!("serve-{}.log", self.boots));
        let log = File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
        let log2 = log.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&self.binary);
        cmd.arg("serve")
            .arg("--data-dir")
            .arg(self.workdir.join("data"))
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", self.port));
        if self.record {
            cmd.arg("--permit-ledger")
                .arg(self.workdir.join("permit-ledger.jsonl"))
                .arg("--record-frames")
                .arg(self.workdir.join("frames.txt"));
        }
        let default_log = if self.record { "info" } else { "warn" };
        let child = cmd
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| default_log.into()),
            )
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", self.binary.display()))?;
        std::fs::write(self.workdir.join("serve.pid"), child.id().to_string())
            .map_err(|e| e.to_string())?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if TcpStream::connect_timeout(
                &format!("127.0.0.1:{}", self.port)
                    .parse()
                    .expect("an address"),
                Duration::from_millis(500),
            )
            .is_ok()
            {
                return Ok(());
            }
            if let Some(st) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                return Err(format!(
                    "serve exited with {st} at start (log: {})",
                    log_path.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!(
            "serve did not listen on port {} within 20 s (log: {})",
            self.port,
            log_path.display()
        ))
    }

    /// SIGKILL (std's `Child::kill` on unix), then reap.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait up to 10 s for the exit status (then SIGKILL).
    pub fn stop(&mut self) -> Result<i32, String> {
        let Some(mut c) = self.child.take() else {
            return Err("serve is not running".into());
        };
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(c.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(st)) = c.try_wait() {
                return Ok(st.code().unwrap_or(-1));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = c.kill();
        let _ = c.wait();
        Err("serve did not exit within 10 s of SIGTERM (killed)".into())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}
