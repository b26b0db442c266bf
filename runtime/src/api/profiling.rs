//! The runtime's system trace and profile calls (`nrt_sys_trace.h`, `nrt_profile.h`); the
//! recorder is [`crate::sys_trace`].

use std::path::Path;
use std::sync::Arc;

use shared::NrtStatus;
use shared::ids::SeqId;

use super::{ModelHandle, Runtime, status_err};
use crate::completion::NqEngine;
use crate::error::NrtResult;
use crate::kmgr::LoadedModel;
use crate::sys_trace::{
    DeviceProgram, SysTrace, SysTraceConfig, SysTraceFetchOptions, chrome_trace,
};
use crate::xu::Xu;

/// The sequence id the request being staged on `xu` will get: stage runs inside
/// `schedule_request` under its `submit_work_lock`, before `client_submit` assigns the id of the
/// slot at `scheduled_tail`, and only the holder of that lock moves `scheduled_tail`. So
/// `scheduled_tail = exec_head + depth` is stable here; `exec_head` (`last_completed + 1`) only
/// grows, so a `depth` read between two equal `last_completed` reads saw that same head.
pub(super) fn staged_seq_id(xu: &Xu<NqEngine>) -> u64 {
    loop {
        let head = xu.last_completed();
        let depth = xu.depth();
        if xu.last_completed() == head {
            let tail = head.seq_num().wrapping_add(1).wrapping_add(depth);
            return SeqId::new(xu.xu_id(), tail).raw();
        }
    }
}

impl Runtime {
    /// The recorder (for the parts of the runtime that record tensor operations).
    pub fn sys_trace(&self) -> &Arc<SysTrace> {
        &self.trace
    }

    /// `nrt_sys_trace_start`: captures execute and tensor-op events into one bounded ring per
    /// logical core, as `config` says ([`SysTrace::start`]).
    ///
    /// # Errors
    /// NRT_INVALID when already started, for 0 events per core or an `nc_idx` that is not a
    /// logical core of this runtime; NRT_RESOURCE when the rings cannot be allocated.
    pub fn sys_trace_start(&self, config: &SysTraceConfig) -> NrtResult<()> {
        self.check_process()?;
        self.trace.start(config)
    }

    /// `nrt_sys_trace_stop`: capture ends; the held events stay fetchable.
    ///
    /// # Errors
    /// NRT_INVALID when not started.
    pub fn sys_trace_stop(&self) -> NrtResult<()> {
        self.check_process()?;
        self.trace.stop()
    }

    /// `nrt_sys_trace_fetch_events`: the JSON document of the held events (of every logical
    /// core, or of `options.nc_idx`), which are removed from the rings. The schema is in
    /// [`crate::sys_trace`]'s docs.
    ///
    /// # Errors
    /// NRT_INVALID for an `nc_idx` that is not a logical core of this runtime.
    pub fn sys_trace_fetch_events(&self, options: &SysTraceFetchOptions) -> NrtResult<String> {
        self.check_process()?;
        self.trace.fetch(options, |id| {
            (self.models.get(id)).map(|m| (m.name().to_owned(), self.device_program(&m)))
        })
    }

    /// `nrt_profile_start`: captures `model`'s executions until [`Runtime::profile_stop`] with
    /// the same `path`, which then writes them there. The file is created (not truncated) now,
    /// so an unwritable path fails here.
    ///
    /// # Errors
    /// NRT_INVALID for a model handle that is not loaded, or a path already being profiled;
    /// NRT_FAILURE when `path` cannot be created or opened for writing.
    pub fn profile_start(&self, model: ModelHandle, path: impl AsRef<Path>) -> NrtResult<()> {
        self.check_process()?;
        let path = path.as_ref();
        let m = self.resolve(model).map_err(|e| {
            status_err(
                NrtStatus::Invalid,
                format!(
                    "model handle {} (logical core {}) is not a loaded model: {}",
                    model.id, model.vnc, e.message
                ),
            )
        })?;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| {
                status_err(
                    NrtStatus::Failure,
                    format!("cannot write the profile file {}: {e}", path.display()),
                )
            })?;
        let device_program = self.device_program(&m);
        self.trace
            .profile_start(m.id(), m.name(), m.vnc(), device_program, path.to_owned())
    }

    /// What the device runs for `m`: which its outputs and reported execution time are.
    fn device_program(&self, m: &LoadedModel) -> DeviceProgram {
        match (self.device.backend_name(), m.reference()) {
            ("sim", Some(r)) => DeviceProgram::NeffReference(r.to_owned()),
            ("sim", None) if m.is_neff() => DeviceProgram::NeffShapeOnly,
            ("sim", None) => DeviceProgram::Container,
            _ => DeviceProgram::Device,
        }
    }

    /// `nrt_profile_stop`: ends the profile started with `path` and writes it there (truncating
    /// the file) as Chrome trace-event JSON, which Perfetto opens; it is not NTFF (the file
    /// says so in its `otherData`).
    ///
    /// # Errors
    /// NRT_INVALID when no profile was started with `path`; NRT_FAILURE when the file cannot be
    /// written (the profile is ended either way).
    pub fn profile_stop(&self, path: impl AsRef<Path>) -> NrtResult<()> {
        self.check_process()?;
        let path = path.as_ref();
        let p = self.trace.profile_stop(path)?;
        let text = chrome_trace(
            &p,
            self.pid,
            self.device.backend_name(),
            self.trace.physical_ncs(p.vnc),
        );
        std::fs::write(path, text).map_err(|e| {
            status_err(
                NrtStatus::Failure,
                format!("cannot write the profile file {}: {e}", path.display()),
            )
        })
    }
}
