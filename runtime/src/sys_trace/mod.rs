//! The system trace (`nrt_sys_trace.h`) and the per-model profile (`nrt_profile_start` /
//! `nrt_profile_stop`): what the runtime saw of each execution and tensor operation, on the host.
//!
//! # Recording
//! One [`SysTrace`] per runtime. Every execution is *stamped* when it is staged (its sequence id
//! and the moment its doorbell is about to ring, [`SysTrace::stamp`]) and *recorded* when the
//! completion engine harvests its completion ([`SysTrace::record_execution`]); the async tensor
//! operations record theirs with [`SysTrace::record_tensor_op`]. While nothing captures, each of
//! these calls is one relaxed atomic load and a return. While capturing, an event goes into the
//! bounded ring of its logical core (preallocated at [`SysTrace::start`], never grown: a full
//! ring overwrites its oldest event and counts it as dropped) under that ring's own mutex, so
//! executions on different logical cores do not contend, and nothing on the execute path
//! allocates. An execution staged before capture started is not recorded (it has no stamp).
//!
//! `nc_idx` is the logical core index as this process sees it (`0..visible vNC count`, the
//! index `nrt_execute`'s model and the `nrta_*` calls' `lnc_idx` use); each event also names the
//! physical NCs.
//!
//! Fetching ([`SysTrace::fetch`]) removes the returned events from the rings (as libnrt's
//! `nrt_sys_trace_fetch_events` consumes them); stopping keeps the held events fetchable.
//!
//! # The fetched JSON document (`nrt_sys_trace_fetch_events`)
//! Timestamps are host `CLOCK_MONOTONIC` nanoseconds since the runtime's `nrt_init`
//! (`epoch_unix_ns` is the wall clock at that origin).
//!
//! ```json
//! {
//!   "schema": "nrt_sys_trace/1",
//!   "clock": "host monotonic ns since nrt_init",
//!   "epoch_unix_ns": 1764600000000000000,
//!   "capturing": true,
//!   "event_types": ["execute", "tensor_op"],
//!   "ncs": [
//!     { "nc_idx": 0, "physical_ncs": [0], "capture_enabled": true, "capacity": 16384,
//!       "recorded": 12, "dropped": 0, "held": 0, "events": [ ... ] }
//!   ]
//! }
//! ```
//!
//! `ncs` lists every logical core (or only `nc_idx` when the fetch options name one).
//! `recorded` counts events recorded since `start`, `dropped` those overwritten before they were
//! fetched, `held` those still in the ring after this fetch. Each event has `event_idx` (its
//! position among the core's recorded events: a gap is a drop) and `type`:
//!
//! - `"execute"`: one model execution that reached the device. `model_id`, `model` (its name
//!   while loaded, else `null`), `seq_id` (the `nrta_seq_t` of the execution: `xu_id << 48 |
//!   seq_num`; under the implicit async pool, the job id the completion callback gets), `seq_num`,
//!   `compute_idx`, `physical_ncs`, `submit_ns` (the call was bound and its work item made),
//!   `start_ns` (staged, doorbell about to ring: the device may start from here), `end_ns` (the
//!   runtime harvested its completion), `device_ts_ns` and `device_busy_ns` (the device's clock
//!   at the notification — its own, not comparable with the host times; simdev's counts from
//!   its start — and its execution time, from the main NC's notification), `status`
//!   (name, `"NRT_SUCCESS"`) and `status_code` (its number). `submit_ns <= start_ns <= end_ns`.
//!   While the model is loaded, also what the device ran ([`DeviceProgram::tag`]:
//!   `device_program`, `"container"`, `"neff_shape_only"`, `"neff_reference"` or `"device"`) and
//!   `shape_only` (`true` when its outputs and `device_busy_ns` are simdev's shape-only stand-in
//!   for a NEFF, not the model's); both `null` once it is unloaded.
//! - `"tensor_op"`: one tensor operation. `op` (`"read"`, `"write"` or `"copy"`), `seq_id`,
//!   `seq_num`, `queue`, `bytes`, `submit_ns`, `start_ns`, `end_ns`, `status`, `status_code`.
//!
//! # The profile file
//! [`Profile`] captures one model's executions (as `execute` events, up to
//! [`PROFILE_MAX_EXECUTIONS`], oldest overwritten) while active, whatever the system trace does;
//! stopping writes a Chrome trace-event JSON file ([`chrome_trace`]) that Perfetto and
//! `chrome://tracing` open: one process (the runtime), per logical core a host track (bind to
//! doorbell) and a logical-core track (doorbell to completion). Its `otherData` says that it is
//! not NTFF and that the NEFF's instruction-level timeline is not in it. Unlike libnrt's
//! (whose NTFF profile has no hook in `nrta_execute_schedule`), every execution path is
//! captured: sync, explicit async and the implicit async pool.

mod json;
mod ring;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock};
use std::time::{Instant, SystemTime};

use shared::NrtStatus;

use crate::completion::ExecRequest;
use crate::error::{NrtError, NrtResult};
use crate::xu::{ExecInfo, MAX_TPBS_PER_VNC};

pub use json::chrome_trace;
pub use ring::EventRing;

/// Events each logical core's ring holds unless the config says otherwise.
pub const DEFAULT_MAX_EVENTS_PER_NC: u64 = 16_384;

/// Executions a profile holds (the oldest are overwritten beyond this).
pub const PROFILE_MAX_EXECUTIONS: u64 = 65_536;

/// The event types, as `nrt_sys_trace_get_event_types` lists them.
pub const EVENT_TYPES: [&str; 2] = [EventType::Execute.name(), EventType::TensorOp.name()];

/// A kind of event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// A model execution (`"execute"`).
    Execute,
    /// A tensor read, write or copy (`"tensor_op"`).
    TensorOp,
}

impl EventType {
    /// Its name in configs and in the JSON.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Execute => "execute",
            Self::TensorOp => "tensor_op",
        }
    }

    /// The type named `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        [Self::Execute, Self::TensorOp]
            .into_iter()
            .find(|t| t.name() == name)
    }

    const fn bit(self) -> u8 {
        match self {
            Self::Execute => 1,
            Self::TensorOp => 2,
        }
    }
}

const ALL_TYPES: u8 = EventType::Execute.bit() | EventType::TensorOp.bit();

/// `nrt_sys_trace_config_t`: what [`SysTrace::start`] captures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SysTraceConfig {
    max_events_per_nc: u64,
    /// Per logical core overrides of the default (every core captures), in call order.
    nc_overrides: Vec<(u32, bool)>,
    types: u8,
}

impl Default for SysTraceConfig {
    fn default() -> Self {
        Self {
            max_events_per_nc: DEFAULT_MAX_EVENTS_PER_NC,
            nc_overrides: Vec::new(),
            types: ALL_TYPES,
        }
    }
}

impl SysTraceConfig {
    /// The defaults: [`DEFAULT_MAX_EVENTS_PER_NC`], every logical core, every event type.
    pub fn new() -> Self {
        Self::default()
    }

    /// `_set_defaults`.
    pub fn set_defaults(&mut self) {
        *self = Self::default();
    }

    /// `_set_max_events_per_nc` (checked at start: 0 is refused).
    pub fn set_max_events_per_nc(&mut self, max: u64) {
        self.max_events_per_nc = max;
    }

    /// The ring size per logical core.
    pub fn max_events_per_nc(&self) -> u64 {
        self.max_events_per_nc
    }

    /// `_set_capture_enabled_for_nc` (`nc_idx`: a logical core index, checked at start).
    pub fn set_capture_enabled_for_nc(&mut self, nc_idx: u32, enabled: bool) {
        self.nc_overrides.retain(|(n, _)| *n != nc_idx);
        self.nc_overrides.push((nc_idx, enabled));
    }

    /// Whether logical core `nc_idx` captures.
    pub fn capture_enabled_for_nc(&self, nc_idx: u32) -> bool {
        self.nc_overrides
            .iter()
            .find(|(n, _)| *n == nc_idx)
            .is_none_or(|(_, e)| *e)
    }

    /// `_set_capture_enabled_for_event_type`.
    ///
    /// # Errors
    /// NRT_INVALID for a name that is not one of [`EVENT_TYPES`], naming it.
    pub fn set_capture_enabled_for_event_type(
        &mut self,
        event_type: &str,
        enabled: bool,
    ) -> NrtResult<()> {
        let t = EventType::from_name(event_type).ok_or_else(|| {
            NrtError::new(
                NrtStatus::Invalid,
                format!(
                    "unknown system trace event type {event_type:?} (known: {})",
                    EVENT_TYPES.join(", ")
                ),
            )
        })?;
        if enabled {
            self.types |= t.bit();
        } else {
            self.types &= !t.bit();
        }
        Ok(())
    }

    /// Whether events of type `t` are captured.
    pub fn capture_enabled_for_event_type(&self, t: EventType) -> bool {
        self.types & t.bit() != 0
    }

    /// `nrt_sys_trace_config_get_enabled_event_types`.
    pub fn enabled_event_types(&self) -> Vec<&'static str> {
        [EventType::Execute, EventType::TensorOp]
            .into_iter()
            .filter(|t| self.capture_enabled_for_event_type(*t))
            .map(EventType::name)
            .collect()
    }
}

/// `nrt_sys_trace_fetch_options_t`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SysTraceFetchOptions {
    /// Only this logical core (default: all).
    pub nc_idx: Option<u32>,
    /// At most this many events per core, the oldest first (default: all held).
    pub max_events_per_nc: Option<u64>,
}

/// A tensor operation's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorOpKind {
    /// Device to host.
    Read,
    /// Host to device.
    Write,
    /// Device to device.
    Copy,
}

impl TensorOpKind {
    /// Its name in the JSON.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::Copy => "copy",
        }
    }
}

/// A tensor operation as its recorder reports it ([`SysTrace::record_tensor_op`]).
#[derive(Clone, Copy, Debug)]
pub struct TensorOp {
    /// Read, write or copy.
    pub op: TensorOpKind,
    /// Its `nrta_seq_t`.
    pub seq_id: u64,
    /// The TENSOR_OP XU queue it ran on.
    pub queue: u32,
    /// Bytes moved.
    pub bytes: u64,
    /// When it was scheduled.
    pub submit: Instant,
    /// When its transfer started.
    pub start: Instant,
    /// When it completed.
    pub end: Instant,
    /// How it ended.
    pub status: NrtStatus,
}

/// What an execution's work item carries for the trace: set at stage when anything captures.
#[derive(Clone, Copy, Debug, Default)]
pub struct ExecStamp {
    /// When it was staged (doorbell about to ring); `None`: nothing captured then.
    pub staged: Option<Instant>,
    /// Its sequence id (the implicit async pool's job id there).
    pub seq_id: u64,
}

/// A recorded execution (times in ns since the trace's origin).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecuteEvent {
    /// The model's handle id.
    pub model_id: u64,
    /// Its sequence id.
    pub seq_id: u64,
    /// Its compute index.
    pub compute_idx: u32,
    /// The logical core.
    pub vnc: u32,
    /// The physical NCs (`num_ncs` of them).
    pub ncs: [u32; MAX_TPBS_PER_VNC],
    /// How many of `ncs` are used.
    pub num_ncs: usize,
    /// Bound, work item made.
    pub submit_ns: u64,
    /// Staged, doorbell about to ring.
    pub start_ns: u64,
    /// Completion harvested.
    pub end_ns: u64,
    /// The device's clock at the notification (main NC).
    pub device_ts_ns: u64,
    /// The device's execution time (main NC).
    pub device_busy_ns: u64,
    /// How it ended.
    pub status: NrtStatus,
}

/// A recorded tensor operation (times in ns since the trace's origin).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorOpEvent {
    /// Read, write or copy.
    pub op: TensorOpKind,
    /// Its sequence id.
    pub seq_id: u64,
    /// The logical core.
    pub vnc: u32,
    /// The queue.
    pub queue: u32,
    /// Bytes moved.
    pub bytes: u64,
    /// Scheduled.
    pub submit_ns: u64,
    /// Started.
    pub start_ns: u64,
    /// Completed.
    pub end_ns: u64,
    /// How it ended.
    pub status: NrtStatus,
}

/// One event of a ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// An execution.
    Execute(ExecuteEvent),
    /// A tensor operation.
    TensorOp(TensorOpEvent),
}

/// What the system trace captures and holds.
#[derive(Debug, Default)]
struct Capture {
    capturing: bool,
    types: u8,
    nc_enabled: Vec<bool>,
    /// One ring per logical core (empty until the first start).
    rings: Vec<Mutex<EventRing<Event>>>,
}

/// One active profile (`nrt_profile_start`).
#[derive(Debug)]
pub struct Profile {
    /// The file written at stop.
    pub path: PathBuf,
    /// The model's handle id.
    pub model_id: u64,
    /// The model's name.
    pub model_name: String,
    /// Its logical core.
    pub vnc: u32,
    /// What the device runs for it (what `device_busy_ns` measures).
    pub device_program: DeviceProgram,
    /// Its executions.
    pub ring: EventRing<ExecuteEvent>,
}

/// What the device runs for a profiled model, which is what its reported execution time
/// measures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceProgram {
    /// A model container's simulator-ISA program, on simdev.
    Container,
    /// A NEFF on simdev, run shape-only (no reference bound).
    NeffShapeOnly,
    /// A NEFF on simdev whose outputs a CPU reference computes (its label).
    NeffReference(String),
    /// The model on a Neuron device.
    Device,
}

impl DeviceProgram {
    /// Whether the outputs (and the time) are the shape-only stand-in, not the model's.
    pub fn shape_only(&self) -> bool {
        matches!(self, Self::NeffShapeOnly)
    }

    /// A short tag for each execute event of the system trace: `"container"`,
    /// `"neff_shape_only"`, `"neff_reference"` or `"device"`.
    pub fn tag(&self) -> &'static str {
        match self {
            Self::Container => "container",
            Self::NeffShapeOnly => "neff_shape_only",
            Self::NeffReference(_) => "neff_reference",
            Self::Device => "device",
        }
    }

    /// A sentence for the profile file.
    pub fn describe(&self) -> String {
        match self {
            Self::Container => "simdev ran the model container's program (the simulator ISA); device_busy_ns is simdev's time for it".into(),
            Self::NeffShapeOnly => "a NEFF, which simdev ran shape-only: its outputs are the documented shape-only function of its inputs, not the model's numbers, and device_busy_ns is simdev's time for that, not the model's (simdev does not decode the NEFF's instruction streams)".into(),
            Self::NeffReference(r) => format!("a NEFF whose outputs simdev computed with the CPU reference {r}; device_busy_ns is that reference's time, not the device's (simdev does not decode the NEFF's instruction streams)"),
            Self::Device => "the Neuron device ran the model; device_busy_ns is the execution time the device reported".into(),
        }
    }
}

/// A runtime's recorder (see the module docs).
#[derive(Debug)]
pub struct SysTrace {
    /// System trace capturing, or a profile active: the only thing a disabled recorder reads.
    armed: AtomicBool,
    /// A profile is active (so a recorded execution looks for its profile).
    profiling: AtomicBool,
    origin: Instant,
    origin_unix_ns: u64,
    /// The physical NCs of each logical core.
    vncs: Vec<Vec<u32>>,
    capture: RwLock<Capture>,
    profiles: Mutex<Vec<Profile>>,
    /// Serialises start/stop/profile changes, so `armed` follows both.
    control: Mutex<()>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn invalid(message: String) -> NrtError {
    NrtError::new(NrtStatus::Invalid, message)
}

impl SysTrace {
    /// A recorder for logical cores whose physical NCs are `vncs`; nothing captures yet.
    pub fn new(vncs: Vec<Vec<u32>>) -> Self {
        let origin_unix_ns = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        Self {
            armed: AtomicBool::new(false),
            profiling: AtomicBool::new(false),
            origin: Instant::now(),
            origin_unix_ns,
            vncs,
            capture: RwLock::new(Capture::default()),
            profiles: Mutex::new(Vec::new()),
            control: Mutex::new(()),
        }
    }

    /// Nanoseconds from the trace's origin to `t` (0 before it).
    pub fn ns(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Whether anything captures (system trace or a profile).
    pub fn armed(&self) -> bool {
        self.armed.load(Ordering::Relaxed)
    }

    fn rearm(&self) {
        let capturing = self
            .capture
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .capturing;
        let profiling = !lock(&self.profiles).is_empty();
        self.profiling.store(profiling, Ordering::Relaxed);
        self.armed.store(capturing || profiling, Ordering::Relaxed);
    }

    /// Stamps a work item at stage: its sequence id (`seq_id` is called only when armed) and
    /// now. One relaxed load when nothing captures.
    #[inline]
    pub fn stamp(&self, stamp: &mut ExecStamp, seq_id: impl FnOnce() -> u64) {
        if !self.armed.load(Ordering::Relaxed) {
            return;
        }
        *stamp = ExecStamp {
            staged: Some(Instant::now()),
            seq_id: seq_id(),
        };
    }

    /// Records a completed execution of logical core `vnc` (the completion engine calls it
    /// when it returns the execution's status). One relaxed load when nothing captures.
    #[inline]
    pub fn record_execution(&self, vnc: u32, info: &ExecInfo<ExecRequest>, status: NrtStatus) {
        if !self.armed.load(Ordering::Relaxed) {
            return;
        }
        self.record_execution_armed(vnc, info, status);
    }

    #[cold]
    #[inline(never)]
    fn record_execution_armed(&self, vnc: u32, info: &ExecInfo<ExecRequest>, status: NrtStatus) {
        let stamp = info.request.trace;
        let Some(staged) = stamp.staged else {
            return; // staged before anything captured
        };
        let end = Instant::now();
        let req = &info.request;
        let ev = ExecuteEvent {
            model_id: info.model_id,
            seq_id: stamp.seq_id,
            compute_idx: req.compute_idx,
            vnc,
            ncs: req.ncs,
            num_ncs: req.num_tpbs.min(MAX_TPBS_PER_VNC),
            submit_ns: self.ns(info.submission_ts.min(staged)),
            start_ns: self.ns(staged),
            end_ns: self.ns(end),
            device_ts_ns: info.resp[0].device_ts_ns,
            device_busy_ns: info.resp[0].nc_ns,
            status,
        };
        self.push(vnc, EventType::Execute, Event::Execute(ev));
        if !self.profiling.load(Ordering::Relaxed) {
            return;
        }
        let mut profiles = lock(&self.profiles);
        for p in profiles.iter_mut().filter(|p| p.model_id == ev.model_id) {
            p.ring.push(ev);
        }
    }

    /// Records a tensor operation on logical core `vnc` (for the async tensor-op XU). One
    /// relaxed load when nothing captures.
    #[inline]
    pub fn record_tensor_op(&self, vnc: u32, op: &TensorOp) {
        if !self.armed.load(Ordering::Relaxed) {
            return;
        }
        let ev = TensorOpEvent {
            op: op.op,
            seq_id: op.seq_id,
            vnc,
            queue: op.queue,
            bytes: op.bytes,
            submit_ns: self.ns(op.submit),
            start_ns: self.ns(op.start),
            end_ns: self.ns(op.end),
            status: op.status,
        };
        self.push(vnc, EventType::TensorOp, Event::TensorOp(ev));
    }

    /// Puts `ev` in `vnc`'s ring if the system trace captures it.
    fn push(&self, vnc: u32, t: EventType, ev: Event) {
        let cap = self.capture.read().unwrap_or_else(PoisonError::into_inner);
        if !cap.capturing
            || cap.types & t.bit() == 0
            || !cap.nc_enabled.get(vnc as usize).copied().unwrap_or(false)
        {
            return;
        }
        if let Some(ring) = cap.rings.get(vnc as usize) {
            lock(ring).push(ev);
        }
    }

    /// `nrt_sys_trace_start`: new rings of `config.max_events_per_nc()` events per logical
    /// core (dropping anything held), then capture.
    ///
    /// # Errors
    /// NRT_INVALID when already capturing, for 0 events per core, or for a logical core index
    /// not of this runtime; NRT_RESOURCE when the rings cannot be allocated.
    pub fn start(&self, config: &SysTraceConfig) -> NrtResult<()> {
        let _control = lock(&self.control);
        let n = self.vncs.len();
        if let Some((nc, _)) = config.nc_overrides.iter().find(|(i, _)| *i as usize >= n) {
            return Err(invalid(format!(
                "system trace config enables or disables nc_idx {nc}, but this runtime has {n} logical core(s) (nc_idx is a logical core index)"
            )));
        }
        if self
            .capture
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .capturing
        {
            return Err(invalid(
                "the system trace is already started: stop it first".into(),
            ));
        }
        let rings = (0..n)
            .map(|_| EventRing::with_capacity(config.max_events_per_nc).map(Mutex::new))
            .collect::<NrtResult<Vec<_>>>()?;
        *self.capture.write().unwrap_or_else(PoisonError::into_inner) = Capture {
            capturing: true,
            types: config.types,
            nc_enabled: (0..n)
                .map(|i| config.capture_enabled_for_nc(u32::try_from(i).unwrap_or(u32::MAX)))
                .collect(),
            rings,
        };
        self.rearm();
        Ok(())
    }

    /// `nrt_sys_trace_stop`: capture ends; held events stay fetchable.
    ///
    /// # Errors
    /// NRT_INVALID when not capturing.
    pub fn stop(&self) -> NrtResult<()> {
        let _control = lock(&self.control);
        {
            let mut cap = self.capture.write().unwrap_or_else(PoisonError::into_inner);
            if !cap.capturing {
                return Err(invalid("the system trace is not started".into()));
            }
            cap.capturing = false;
        }
        self.rearm();
        Ok(())
    }

    /// `nrt_sys_trace_fetch_events`: the JSON document of the module docs, with the fetched
    /// events removed from the rings; `model` gives a model id's name and what the device runs
    /// for it (`None`: unloaded).
    ///
    /// # Errors
    /// NRT_INVALID for an `nc_idx` that is not a logical core of this runtime.
    pub fn fetch(
        &self,
        options: &SysTraceFetchOptions,
        model: impl Fn(u64) -> Option<(String, DeviceProgram)>,
    ) -> NrtResult<String> {
        let n = self.vncs.len();
        if let Some(i) = options.nc_idx.filter(|i| *i as usize >= n) {
            return Err(invalid(format!(
                "fetch options name nc_idx {i}, but this runtime has {n} logical core(s)"
            )));
        }
        let max = options
            .max_events_per_nc
            .map_or(usize::MAX, |m| usize::try_from(m).unwrap_or(usize::MAX));
        let cap = self.capture.read().unwrap_or_else(PoisonError::into_inner);
        let mut ncs = Vec::new();
        for (i, phys) in self.vncs.iter().enumerate() {
            if options.nc_idx.is_some_and(|want| want as usize != i) {
                continue;
            }
            let taken = cap.rings.get(i).map(|r| {
                let mut r = lock(r);
                let (first, events) = r.take_oldest(max);
                (
                    r.capacity(),
                    r.recorded(),
                    r.dropped(),
                    r.len(),
                    first,
                    events,
                )
            });
            let (capacity, recorded, dropped, held, first, events) =
                taken.unwrap_or((0, 0, 0, 0, 0, Vec::new()));
            ncs.push(json::NcSection {
                nc_idx: i,
                physical_ncs: phys,
                capture_enabled: cap.nc_enabled.get(i).copied().unwrap_or(false),
                capacity,
                recorded,
                dropped,
                held,
                first_event_idx: first,
                events,
            });
        }
        let types = [EventType::Execute, EventType::TensorOp]
            .into_iter()
            .filter(|t| cap.types & t.bit() != 0)
            .map(EventType::name)
            .collect::<Vec<_>>();
        let capturing = cap.capturing;
        // Model names are looked up (under the model database's lock) with no trace lock held.
        drop(cap);
        Ok(json::fetch_document(
            self.origin_unix_ns,
            capturing,
            &types,
            &ncs,
            &model,
        ))
    }

    /// `nrt_profile_start`: captures the executions of model `model_id` (named `model_name`,
    /// on logical core `vnc`) until [`SysTrace::profile_stop`] with the same `path`.
    ///
    /// # Errors
    /// NRT_INVALID when a profile with this path is active; NRT_RESOURCE when its ring cannot
    /// be allocated.
    pub fn profile_start(
        &self,
        model_id: u64,
        model_name: &str,
        vnc: u32,
        device_program: DeviceProgram,
        path: PathBuf,
    ) -> NrtResult<()> {
        let _control = lock(&self.control);
        let ring = EventRing::with_capacity(PROFILE_MAX_EXECUTIONS)?;
        {
            let mut profiles = lock(&self.profiles);
            if profiles.iter().any(|p| p.path == path) {
                return Err(invalid(format!(
                    "a profile is already being captured for {}: stop it first",
                    path.display()
                )));
            }
            profiles.push(Profile {
                path,
                model_id,
                model_name: model_name.to_owned(),
                vnc,
                device_program,
                ring,
            });
        }
        self.rearm();
        Ok(())
    }

    /// The files of the profiles being captured.
    pub fn active_profiles(&self) -> Vec<PathBuf> {
        lock(&self.profiles)
            .iter()
            .map(|p| p.path.clone())
            .collect()
    }

    /// `nrt_profile_stop`: ends the profile started with `path` and returns it.
    ///
    /// # Errors
    /// NRT_INVALID when no profile was started with `path`.
    pub fn profile_stop(&self, path: &std::path::Path) -> NrtResult<Profile> {
        let _control = lock(&self.control);
        let p = {
            let mut profiles = lock(&self.profiles);
            let i = profiles
                .iter()
                .position(|p| p.path == path)
                .ok_or_else(|| {
                    invalid(format!(
                        "nrt_profile_stop({}): no profile was started with this file name",
                        path.display()
                    ))
                })?;
            profiles.swap_remove(i)
        };
        self.rearm();
        Ok(p)
    }

    /// The physical NCs of logical core `vnc`.
    pub fn physical_ncs(&self, vnc: u32) -> &[u32] {
        self.vncs.get(vnc as usize).map_or(&[], Vec::as_slice)
    }
}

#[cfg(test)]
mod tests;
