//! Trace recording of a node-engine run (`SimOptions::trace_dir`, cargo
//! feature `trace`): the hook lines the broker core's components record
//! while the event loop runs (`src/trace.rs`; the core adds the lines
//! that join them to its cursors, trackers and pending-ack handles), split
//! into the trace files by [`crate::sim::sim_trace::write`], as for the
//! model engine.

use super::{SimError, SimOptions, Workload, TOPIC};

/// Starts recording if `opts` asks for traces. A run with crash points is
/// refused: the trace specs' recovery actions assume the store holds what
/// was persisted before a clean close (they do not model a crash).
///
/// # Errors
/// [`SimError::Component`]: crash points, or no feature `trace`.
pub(super) fn start(w: &Workload, opts: &SimOptions) -> Result<(), SimError> {
    if opts.trace_dir.is_none() {
        return Ok(());
    }
    if opts.faults && w.faults.crash_points > 0 {
        return Err(SimError::Component(
            "trace recording with crash points: the trace specs do not model a crash (set faults.crash_points = 0)".into(),
        ));
    }
    #[cfg(feature = "trace")]
    {
        crate::trace::start();
        Ok(())
    }
    #[cfg(not(feature = "trace"))]
    Err(SimError::Component(
        "trace recording needs the cargo feature `trace`".into(),
    ))
}

/// Stops recording and writes the trace files (nothing without a trace
/// directory).
///
/// # Errors
/// [`SimError::DataDir`]: the files cannot be written.
pub(super) fn finish(w: &Workload, opts: &SimOptions) -> Result<(), SimError> {
    #[cfg(feature = "trace")]
    if let Some(dir) = &opts.trace_dir {
        let lines = crate::trace::finish();
        crate::sim::sim_trace::write(dir, w, TOPIC, &lines).map_err(|e| SimError::DataDir {
            path: dir.display().to_string(),
            reason: e.to_string(),
        })?;
    }
    #[cfg(not(feature = "trace"))]
    let _ = (w, opts, TOPIC);
    Ok(())
}
