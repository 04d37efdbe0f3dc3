//! Frame recording (`serve --record-frames FILE`): one line per frame in
//! either direction, `DIR BOOT CONN PAYLOAD_LEN HEX(BaseCommand)`
//! (BOOT is the server's process id, so connection ids of a restarted
//! server stay distinct), so a checker
//! can decode every command the server read and wrote (the payload bytes
//! are not kept, only their length).

use std::fs::File;
use std::io::Write;
use std::sync::Mutex;

use super::lock;

/// Appends frame lines to a file.
pub struct Recorder {
    out: Mutex<std::io::BufWriter<File>>,
}

impl Recorder {
    /// Records into `file`.
    pub fn new(file: File) -> Self {
        Self {
            out: Mutex::new(std::io::BufWriter::new(file)),
        }
    }

    /// Records one frame.
    pub fn record(&self, dir: &str, conn: u64, command: &[u8], payload_len: usize) {
        let mut line = String::with_capacity(command.len() * 2 + 32);
        line.push_str(dir);
        line.push(' ');
        line.push_str(&std::process::id().to_string());
        line.push(' ');
        line.push_str(&conn.to_string());
        line.push(' ');
        line.push_str(&payload_len.to_string());
        line.push(' ');
        for b in command {
            line.push_str(&format!("{b:02x}"));
        }
        line.push('\n');
        let mut out = lock(&self.out);
        if let Err(e) = out.write_all(line.as_bytes()).and_then(|()| out.flush()) {
            tracing::error!(error = %e, "cannot write the frame recording");
        }
    }
}
