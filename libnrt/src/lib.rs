//! `libnrt.so.1`: libnrt's C ABI over this project's runtime, so that unchanged C and C++
//! programs (compiled against `include/nrt/*.h`, linked with `-lnrt`) and `dlopen` users run on
//! a Neuron device or, without one, on simdev.
//!
//! A thin layer: every export checks its arguments ([`raw`]: NULL, bounded strings, buffers),
//! resolves the opaque handles it was given through the registries of [`handles`] (a pointer
//! this library did not hand out, or already freed, is refused with NRT_INVALID and logged,
//! never dereferenced), calls the runtime and maps its error to an NRT_STATUS. Every entry runs
//! under [`boundary`] (`catch_unwind`: no panic crosses into C). All behaviour lives in the
//! `runtime` crate; the device is found by the runtime's backend selection (`/dev/neuron0`, else
//! `NEURON_SIMDEV_SOCKET`, else a private simdev: `NEURON_SIMDEV_BIN`, then a `simdev` beside
//! this library or in its `../bin`, then beside the executable, then on `PATH`).
//!
//! The exports, by header: [`lifecycle`] (`nrt.h` lifecycle and topology, `nrt_status.h`,
//! `nrt_version.h`), [`model`] (`nrt.h` models, `nrt_experimental.h` tensor info), [`tensor`]
//! (`nrt.h` tensors, `nrt_experimental.h` mapped copies), [`pinned`] (`nrt.h` pinned host
//! buffers), [`set`] (`nrt.h` tensor sets),
//! [`implicit_async`] (`nrt_experimental.h` implicit asynchronous mode), [`explicit_async`]
//! (`nrt_async.h`, with [`completions`]: each request's `ret` written before its completion is
//! reported, and the caller's completion eventfds), [`profiling`] (`nrt_profile.h`,
//! `nrt_sys_trace.h`), [`collectives`] (`nrt.h` and `nrt_experimental.h` host collectives, a
//! group of one rank), [`debug_stream`] (`ndebug_stream.h`, whose connection is refused: no
//! events exist to deliver).

pub mod abi;
mod boundary;
pub mod collectives;
pub mod completions;
pub mod debug_stream;
pub mod explicit_async;
pub mod handles;
pub mod implicit_async;
pub mod lifecycle;
pub mod model;
pub mod pinned;
pub mod profiling;
mod raw;
pub mod set;
pub mod tensor;

use std::sync::Arc;

use runtime::{NrtError, Runtime, nrt};

/// The initialised runtime, behind libnrt's gates (13 before `nrt_init`, 14 after
/// `nrt_close`), held by the entry point that asked for it ([`InCall`]).
fn rt() -> Result<InCall, NrtError> {
    nrt::current().map(InCall)
}

/// The runtime an entry point holds for its whole call. `nrt_close` on another thread waits
/// for the calls holding the runtime, so a call that let go of it early (a bare `rt()?;` as a
/// gate) would race the close and see the device go away under it — NRT_HW_ERROR where the
/// caller is owed NRT_CLOSED or a finished call. Dropping one unused is a warning, and CI
/// refuses warnings: bind it (`let _rt = rt()?;`) for as long as the call runs.
#[must_use = "hold the runtime for the whole call (`let _rt = rt()?;`): nrt_close waits only for \
              calls that hold it"]
struct InCall(Arc<Runtime>);

impl std::ops::Deref for InCall {
    type Target = Arc<Runtime>;

    fn deref(&self) -> &Arc<Runtime> {
        &self.0
    }
}
