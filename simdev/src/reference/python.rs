//! The Python reference worker: `simdev/python/neff_reference_worker.py` (embedded in the
//! binary, run as `python3 -u -c SOURCE`; the interpreter is [`ENV_PYTHON`], default
//! `python3`), started lazily on the first reference execution and kept for the next ones.
//!
//! simdev and the worker talk over a `SOCK_SEQPACKET` socketpair whose worker end is the
//! worker's stdin (its stdout goes to simdev's stderr). A started worker first says it is ready
//! (`{"ready": true}`, after importing numpy) within [`STARTUP_TIMEOUT`] (or the execution
//! timeout, if longer), so interpreter start-up is not charged to the first execution's
//! timeout. Per execution simdev sends one JSON
//! request ([`request`]) with the tensors' chunks' memfds attached (`SCM_RIGHTS`, each chunk
//! once) and waits at most the timeout for one JSON reply. The worker maps the memfds and
//! writes the outputs in place; nothing is copied through the socket.
//!
//! Invariant: after any failure that leaves the worker's state unknown (a send error, EOF, a
//! timeout, a reply that is not JSON) the worker is killed and reaped, and the slot is empty,
//! so the next execution starts a fresh worker; a reference's own error (`{"error": ...}`)
//! keeps the worker.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::PoisonError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::socket::{MsgFlags, setsockopt, sockopt};
use nix::sys::time::TimeVal;
use serde_json::{Value, json};
use shared::fd_passing::{recv_with_fds, send_with_fds};

use super::BoundTensor;

/// The worker's source, embedded so an installed simdev needs no repository checkout.
pub const WORKER_SOURCE: &str = include_str!("../../python/neff_reference_worker.py");

/// The worker's `-c` program: runs [`WORKER_SOURCE`], taken out of the environment (so its
/// own children do not inherit it), as `__main__` under the script's file name.
const WORKER_BOOTSTRAP: &str = "import os; exec(compile(os.environ.pop('SIMDEV_REFERENCE_WORKER_SOURCE'), 'neff_reference_worker.py', 'exec'))";

/// The variable [`WORKER_BOOTSTRAP`] reads the source from.
const WORKER_SOURCE_VAR: &str = "SIMDEV_REFERENCE_WORKER_SOURCE";

/// The worker's `sys.argv[1]`: what `ps` shows after the bootstrap.
const WORKER_NAME: &str = "simdev-reference-worker";

/// Environment variable naming the Python interpreter (default `python3`).
pub const ENV_PYTHON: &str = "NEURON_SIMDEV_PYTHON";

/// How long a starting worker may take to say it is ready (at least).
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// Largest reply read (a longer one is cut, which only shortens an error message).
const MAX_REPLY: usize = 64 * 1024;

/// A running worker.
#[derive(Debug)]
struct Worker {
    child: Child,
    socket: OwnedFd,
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Killing a process that already exited is harmless; waiting reaps it.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The worker, if one runs, and the per-execution timeout.
#[derive(Debug, Default)]
pub struct WorkerSlot {
    worker: Option<Worker>,
    timeout: Duration,
    stop: WorkerStop,
}

/// Ends a reference in progress from another thread (the device going away) without the slot's
/// lock, which the execution waiting for the reply holds: a `shutdown(2)` of simdev's end of
/// the socketpair (through a duplicate of it, kept here while the worker runs) wakes that wait
/// with EOF, and the execution then kills and reaps the worker as for any worker that died.
/// Once stopped, no worker starts again.
#[derive(Clone, Debug, Default)]
pub struct WorkerStop(std::sync::Arc<(std::sync::Mutex<Option<OwnedFd>>, AtomicBool)>);

impl WorkerStop {
    /// Stops the worker's reference in progress, if any, and every later start.
    pub fn stop(&self) {
        let (socket, stopped) = &*self.0;
        stopped.store(true, Ordering::SeqCst);
        let socket = socket.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(fd) = socket.as_ref() {
            let _ = nix::sys::socket::shutdown(fd.as_raw_fd(), nix::sys::socket::Shutdown::Both);
        }
    }

    fn stopped(&self) -> bool {
        self.0.1.load(Ordering::SeqCst)
    }

    /// Keeps `socket` (a duplicate of simdev's end of a new worker's socketpair) for
    /// [`WorkerStop::stop`], or forgets the last one (`None`). A stop that came between the
    /// start's check and this call shuts the new socket down here: `stop` sets the flag before
    /// it takes the lock, and this reads the flag under it.
    fn watch(&self, socket: Option<OwnedFd>) {
        let (slot, stopped) = &*self.0;
        let mut slot = slot.lock().unwrap_or_else(PoisonError::into_inner);
        *slot = socket;
        if stopped.load(Ordering::SeqCst)
            && let Some(fd) = slot.as_ref()
        {
            let _ = nix::sys::socket::shutdown(fd.as_raw_fd(), nix::sys::socket::Shutdown::Both);
        }
    }
}

/// The JSON request for one execution and the fds to attach, each chunk once, in the order
/// the request's `fd` indices name them.
pub fn request<'t>(
    module: &Path,
    function: &str,
    tensors: &'t [BoundTensor],
) -> (Value, Vec<BorrowedFd<'t>>) {
    let mut fds = Vec::new();
    let mut index: HashMap<u64, usize> = HashMap::new();
    let mut describe = |t: &'t BoundTensor| {
        let fd = *index.entry(t.chunk.handle()).or_insert_with(|| {
            fds.push(t.chunk.memfd());
            fds.len() - 1
        });
        json!({
            "name": t.name,
            "dtype": t.dtype.neff_name(),
            "shape": t.shape,
            "fd": fd,
            "offset": t.offset,
            "size": t.size,
        })
    };
    let inputs: Vec<Value> = tensors
        .iter()
        .filter(|t| t.input)
        .map(&mut describe)
        .collect();
    let outputs: Vec<Value> = tensors
        .iter()
        .filter(|t| !t.input)
        .map(&mut describe)
        .collect();
    let value = json!({
        "module": module.to_string_lossy(),
        "function": function,
        "inputs": inputs,
        "outputs": outputs,
    });
    (value, fds)
}

impl WorkerSlot {
    /// An empty slot whose executions time out after `timeout`.
    pub fn new(timeout: Duration) -> Self {
        Self {
            worker: None,
            timeout,
            stop: WorkerStop::default(),
        }
    }

    /// What stops this slot's worker from another thread.
    pub fn stopper(&self) -> WorkerStop {
        self.stop.clone()
    }

    /// The running worker's pid.
    pub fn pid(&self) -> Option<u32> {
        self.worker.as_ref().map(|w| w.child.id())
    }

    fn start(&mut self) -> Result<&Worker, String> {
        if self.stop.stopped() {
            return Err("simdev is stopping: no reference runs any more".to_owned());
        }
        if self.worker.is_none() {
            let (ours, theirs) = shared::fd_passing::seqpacket_pair()
                .map_err(|e| format!("socketpair for the reference worker: {e}"))?;
            // Unset or empty: `python3`.
            let python = std::env::var(ENV_PYTHON)
                .ok()
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| "python3".to_owned());
            let stdout = std::io::stderr()
                .as_fd()
                .try_clone_to_owned()
                .map_err(|e| format!("dup stderr for the reference worker: {e}"))?;
            // The source comes through the environment, so `ps` shows a short bootstrap and
            // the worker's name instead of the whole script; tracebacks name the file.
            let child = Command::new(&python)
                .arg("-u")
                .arg("-c")
                .arg(WORKER_BOOTSTRAP)
                .arg(WORKER_NAME)
                .env(WORKER_SOURCE_VAR, WORKER_SOURCE)
                .stdin(Stdio::from(theirs))
                .stdout(Stdio::from(stdout))
                .spawn()
                .map_err(|e| format!("cannot start the reference worker {python:?}: {e}"))?;
            tracing::info!("reference worker started: pid {}", child.id());
            self.stop.watch(ours.try_clone().ok());
            let worker = Worker {
                child,
                socket: ours,
            };
            let ready = receive(worker.socket.as_fd(), self.timeout.max(STARTUP_TIMEOUT));
            self.worker = Some(worker);
            let trouble = match ready {
                Ok(Some(r)) if r.contains("\"ready\"") => None,
                Ok(Some(r)) => Some(format!("started with {r:?}")),
                Ok(None) => Some("did not start".to_owned()),
                Err(e) => Some(format!("did not say it was ready ({e})")),
            };
            if let Some(t) = trouble {
                let how = self.discard();
                return Err(format!(
                    "the reference worker ({python:?}, from {ENV_PYTHON} or else python3; it \
                     needs numpy: `{python} -m pip install numpy`) {t}; {how}"
                ));
            }
        }
        self.worker
            .as_ref()
            .ok_or_else(|| "no reference worker".to_owned())
    }

    /// Kills and reaps the worker, and says how it ended.
    fn discard(&mut self) -> String {
        self.stop.watch(None);
        match self.worker.take() {
            Some(mut w) => match w.child.try_wait() {
                Ok(Some(s)) => format!("it exited ({s})"),
                _ => {
                    let _ = w.child.kill();
                    match w.child.wait() {
                        // It exited by itself between the check and the kill.
                        Ok(s) if s.code().is_some() => format!("it exited ({s})"),
                        Ok(s) => format!("it was killed ({s})"),
                        Err(e) => format!("it was killed (wait: {e})"),
                    }
                }
            },
            None => "no worker".to_owned(),
        }
    }

    /// Runs `module`'s `function` on `tensors` in the worker (started if none runs).
    ///
    /// # Errors
    /// The reference's error message; or that the worker could not start, died, or did not
    /// reply within the timeout (it is then killed and reaped: see the module invariant).
    pub fn run(
        &mut self,
        module: &Path,
        function: &str,
        tensors: &[BoundTensor],
    ) -> Result<(), String> {
        let timeout = self.timeout;
        // The timeout covers the whole call, a worker's start included: the runtime times the
        // whole execution, and the reference must fail (1004) before it gives up (a cold start
        // importing numpy can take seconds).
        let called = std::time::Instant::now();
        let (value, fds) = request(module, function, tensors);
        let bytes = value.to_string();
        let socket = self.start()?.socket.as_fd();
        if let Err(e) = send_with_fds(socket, bytes.as_bytes(), &fds) {
            let how = self.discard();
            return Err(format!(
                "the reference worker could not take the request ({e}); {how}"
            ));
        }
        let left = timeout
            .saturating_sub(called.elapsed())
            .max(std::time::Duration::from_millis(1));
        let reply = match receive(socket, left) {
            Ok(Some(r)) => r,
            Ok(None) => {
                let how = self.discard();
                return Err(format!(
                    "the reference worker died during the execution: {how}"
                ));
            }
            Err(Errno::EAGAIN) => {
                let how = self.discard();
                return Err(format!(
                    "no reply within the reference timeout of {timeout:?}; {how}"
                ));
            }
            Err(e) => {
                let how = self.discard();
                return Err(format!("the reference worker's socket failed ({e}); {how}"));
            }
        };
        match serde_json::from_str::<Value>(&reply) {
            Ok(v) if v.get("ok") == Some(&Value::Bool(true)) => Ok(()),
            Ok(v) => match v.get("error").and_then(Value::as_str) {
                Some(e) => Err(e.to_owned()),
                None => {
                    let how = self.discard();
                    Err(format!("the reference worker replied {reply:?}; {how}"))
                }
            },
            Err(_) => {
                let how = self.discard();
                Err(format!(
                    "the reference worker replied {reply:?}, not JSON; {how}"
                ))
            }
        }
    }
}

/// One message from the worker within `timeout`: `None` at EOF.
fn receive(socket: BorrowedFd<'_>, timeout: Duration) -> nix::Result<Option<String>> {
    let tv = TimeVal::new(
        i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
        i64::from(timeout.subsec_micros()),
    );
    setsockopt(&socket, sockopt::ReceiveTimeout, &tv)?;
    let mut buf = vec![0u8; MAX_REPLY];
    let r = loop {
        match recv_with_fds(socket, &mut buf, MsgFlags::empty()) {
            Err(Errno::EINTR) => {}
            other => break other?,
        }
    };
    if r.is_eof() {
        return Ok(None);
    }
    Ok(Some(String::from_utf8_lossy(&buf[..r.len]).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::ClientId;
    use crate::memory::{AddressSpace, Region};
    use shared::address_map::{AddressMap, Arch};
    use shared::model::DType;

    #[test]
    fn a_request_names_each_tensor_and_attaches_each_chunk_once() {
        let mut space = AddressSpace::new(AddressMap {
            arch: Arch::Trn1,
            nc_count: 1,
            hbm_bytes_per_nc: 1 << 26,
        });
        let a = ClientId(1);
        let shared_chunk = space.allocate(a, Region::Hbm(0), 1 << 16, 0).unwrap();
        let out_chunk = space.allocate(a, Region::Hbm(0), 1 << 12, 0).unwrap();
        let t =
            |name: &str, input, chunk: &std::sync::Arc<crate::memory::Chunk>, offset| BoundTensor {
                name: name.into(),
                dtype: DType::F16,
                shape: vec![2, 3],
                input,
                chunk: chunk.clone(),
                offset,
                size: 12,
            };
        let tensors = [
            t("x", true, &shared_chunk, 0),
            t("y", true, &shared_chunk, 4096),
            t("output0", false, &out_chunk, 0),
        ];
        let (v, fds) = request(Path::new("/r/ref.py"), "f", &tensors);
        assert_eq!(fds.len(), 2, "the shared chunk is attached once");
        assert_eq!(
            v,
            json!({
                "module": "/r/ref.py",
                "function": "f",
                "inputs": [
                    {"name": "x", "dtype": "float16", "shape": [2, 3], "fd": 0, "offset": 0, "size": 12},
                    {"name": "y", "dtype": "float16", "shape": [2, 3], "fd": 0, "offset": 4096, "size": 12},
                ],
                "outputs": [
                    {"name": "output0", "dtype": "float16", "shape": [2, 3], "fd": 1, "offset": 0, "size": 12},
                ],
            })
        );
    }
}
