//! Request dispatch: one [`Request`] of one client in, one [`Reply`] (and the fds it carries)
//! out, with each refusal mapped to its [`ErrorKind`]. A panic inside a handler is caught and
//! answered as an error; a failed posted request is counted in the NC's `posted_errors`.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use shared::ioctl::NQ_TYPE_NOTIFY;
use shared::notification::{NQ_MAX_ENTRIES, nq_bytes};
use shared::protocol::{
    ClientSummary, DeviceStats, ErrorKind, FaultSpec, LatencyModel, MemLocation, PROTOCOL_VERSION,
    RemoteError, Reply, Request,
};
use shared::sequencer::{EXEC_QUEUE, EXEC_QUEUE_ENGINE, SEM_INFERENCE_START};
use shared::udma::Direction;

use crate::counters::bump;
use crate::dma::{self, DmaQueueId, QueueError, error_chain};
use crate::memory::{AllocError, Chunk, Region};
use crate::notify::NotificationQueue;
use crate::timing;

use super::{Core, lock, read, write};
use crate::client::{ClientId, truncate_identity};

pub(super) fn refuse(kind: ErrorKind, message: impl Into<String>) -> RemoteError {
    RemoteError {
        kind,
        message: message.into(),
    }
}

fn alloc_refusal(err: &AllocError) -> RemoteError {
    let kind = match err {
        AllocError::BadSize { .. } | AllocError::BadAlign { .. } => ErrorKind::InvalidArgument,
        AllocError::NoSuchNc { .. } => ErrorKind::OutOfRange,
        AllocError::OutOfMemory { .. } | AllocError::MapChunk { .. } => ErrorKind::OutOfMemory,
        AllocError::CreateMemfd { source, .. } if out_of_fds(*source) => {
            return fds_refusal("creating the chunk's memfd", *source);
        }
        AllocError::SizeMemfd { source, .. } if *source == nix::Error::EFBIG => {
            return fsize_refusal(&error_chain(err));
        }
        AllocError::CreateMemfd { source, .. } | AllocError::SizeMemfd { source, .. } => {
            if matches!(
                source,
                nix::Error::ENOMEM | nix::Error::ENOSPC | nix::Error::EFBIG
            ) {
                ErrorKind::OutOfMemory
            } else {
                ErrorKind::Internal
            }
        }
        AllocError::SealMemfd { .. } => ErrorKind::Internal,
    };
    refuse(kind, error_chain(err))
}

/// An NC claim refused for an OS resource: for want of a descriptor (the window's memfd, the
/// notification eventfd or their duplicates for the client), as a chunk's; else simdev's
/// failure, naming the call.
pub(super) fn registers_refusal(what: &str, err: &crate::registers::RegistersError) -> RemoteError {
    match err.errno() {
        Some(errno) if out_of_fds(errno) => fds_refusal(&format!("{what}: {err}"), errno),
        Some(nix::Error::EFBIG) => fsize_refusal(&format!("{what}: {}", error_chain(err))),
        _ => os_refusal(what, err),
    }
}

/// A memfd (a chunk of device memory, an NC's semaphore window) larger than simdev's file-size
/// limit (`RLIMIT_FSIZE` bounds a memfd's size too): NRT_RESOURCE, naming the limit and how to
/// raise it. `what` names the call that failed, with its errno.
fn fsize_refusal(what: &str) -> RemoteError {
    let limit = match nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_FSIZE) {
        Ok((soft, _)) if soft != nix::sys::resource::RLIM_INFINITY => format!("{soft} bytes"),
        Ok(_) => "unlimited".to_owned(),
        Err(_) => "unknown".to_owned(),
    };
    refuse(
        ErrorKind::OutOfMemory,
        format!(
            "{what}: simdev's file-size limit (RLIMIT_FSIZE, ulimit -f) is {limit}, and it \
             bounds every chunk of device memory and register window (each a memfd); raise it in \
             the shell that starts simdev (or the program, for a private one)"
        ),
    )
}

/// Whether `errno` says this process (EMFILE) or the system (ENFILE) has no descriptor left.
const fn out_of_fds(errno: nix::Error) -> bool {
    matches!(errno, nix::Error::EMFILE | nix::Error::ENFILE)
}

/// A chunk refused for want of a file descriptor: a resource running out (NRT_RESOURCE, as
/// for memory), saying which limit and how to raise it.
fn fds_refusal(what: &str, errno: nix::Error) -> RemoteError {
    let limit = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or_else(|_| "unknown".to_owned(), |(soft, _)| soft.to_string());
    refuse(
        ErrorKind::OutOfMemory,
        format!(
            "{what}: {errno}: simdev keeps one memfd per chunk of device memory and a few per \
             claimed NC, and has none left (its RLIMIT_NOFILE is {limit}); free tensors, or \
             raise the hard limit (`ulimit -Hn`) of the shell that starts simdev (or the \
             program, for a private one)"
        ),
    )
}

fn queue_refusal(err: &QueueError) -> RemoteError {
    let kind = match err {
        QueueError::OutOfRange { .. } | QueueError::Overrun { .. } => ErrorKind::OutOfRange,
        QueueError::RingSize { .. } | QueueError::RingTooSmall { .. } => ErrorKind::BadRing,
        QueueError::NotInitialized { .. } | QueueError::Stopped { .. } => ErrorKind::QueueStopped,
        QueueError::ZeroRx | QueueError::ZeroIncrement => ErrorKind::InvalidArgument,
    };
    refuse(kind, err.to_string())
}

pub(super) fn os_refusal(what: &str, err: &dyn std::error::Error) -> RemoteError {
    refuse(ErrorKind::Internal, format!("{what}: {}", error_chain(err)))
}

fn range(err: crate::registers::BadIndex) -> RemoteError {
    refuse(ErrorKind::OutOfRange, err.to_string())
}

pub(super) fn panic_text(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("unknown panic")
}

/// The NC a request addresses, if any.
const fn request_nc(request: &Request) -> Option<u32> {
    match *request {
        Request::ClaimNc { nc }
        | Request::ReleaseNc { nc }
        | Request::DmaQueueInit { nc, .. }
        | Request::DmaQueueRelease { nc, .. }
        | Request::DmaQueueCopyStart { nc, .. }
        | Request::SemaphoreIncrement { nc, .. }
        | Request::SemaphoreDecrement { nc, .. }
        | Request::SemaphoreRead { nc, .. }
        | Request::SemaphoreWrite { nc, .. }
        | Request::EventSet { nc, .. }
        | Request::EventGet { nc, .. }
        | Request::NotificationInit { nc, .. }
        | Request::NcReset { nc }
        | Request::Counters { nc }
        | Request::InjectFault(FaultSpec { nc: Some(nc), .. }) => Some(nc),
        Request::MemAlloc {
            location: MemLocation::Hbm { nc },
            ..
        } => Some(nc),
        Request::Hello { .. }
        | Request::DeviceInfo
        | Request::MemAlloc { .. }
        | Request::MemFree { .. }
        | Request::MemMap { .. }
        | Request::InjectFault(_)
        | Request::ClearFaults
        | Request::SetLatency(_)
        | Request::DeviceStats
        | Request::References
        | Request::Identify { .. }
        | Request::Clients => None,
        Request::TraceSubscribe { .. } | Request::TraceDrain => None,
    }
}

pub(super) type Handled = Result<(Reply, Vec<OwnedFd>), RemoteError>;

fn ok() -> Handled {
    Ok((Reply::Ok, Vec::new()))
}

fn reply(reply: Reply) -> Handled {
    Ok((reply, Vec::new()))
}

impl Core {
    pub(super) fn handle(&self, client: ClientId, request: Request) -> (Reply, Vec<OwnedFd>) {
        let name = request.name();
        let posted = request.is_posted();
        let nc = request_nc(&request);
        let outcome = catch_unwind(AssertUnwindSafe(|| self.dispatch(client, request)));
        let (reply, fds) = match outcome {
            Ok(Ok(answer)) => answer,
            Ok(Err(err)) => (Reply::Error(err), Vec::new()),
            Err(payload) => {
                let what = panic_text(payload.as_ref());
                tracing::error!("handling {name} panicked: {what}");
                let err = refuse(
                    ErrorKind::Internal,
                    format!("simdev failed internally handling {name} (a simdev bug): {what}"),
                );
                (Reply::Error(err), Vec::new())
            }
        };
        if let Reply::Error(err) = &reply {
            if posted {
                tracing::warn!("posted {name} of client {} failed: {err}", client.0);
                if let Some(n) = nc.and_then(|nc| self.nc_ref(nc)) {
                    bump(&n.counters.posted_errors, 1);
                }
            } else {
                tracing::debug!("{name} of client {} refused: {err}", client.0);
            }
        }
        (reply, fds)
    }

    fn dispatch(&self, client: ClientId, request: Request) -> Handled {
        match request {
            Request::Hello { version } => self.hello(version),
            Request::DeviceInfo => reply(Reply::DeviceInfo(self.info.clone())),
            Request::ClaimNc { nc } => self.claim_nc(client, nc),
            Request::ReleaseNc { nc } => {
                let (n, _) = self.owned(client, nc)?;
                self.reset_nc(n, client, true);
                ok()
            }
            Request::MemAlloc {
                location,
                size,
                align,
            } => self.mem_alloc(client, location, size, align),
            Request::MemFree { handle } => {
                write(&self.memory)
                    .free(client, handle)
                    .map_err(|e| refuse(ErrorKind::BadHandle, e.to_string()))?;
                ok()
            }
            Request::MemMap { handle } => self.mem_map(client, handle),
            Request::DmaQueueInit {
                nc,
                engine,
                queue,
                tx_ring,
                tx_desc_count,
                rx_ring,
                rx_desc_count,
            } => self.dma_queue_init(
                client,
                DmaQueueId { nc, engine, queue },
                (tx_ring, tx_desc_count),
                (rx_ring, rx_desc_count),
            ),
            Request::DmaQueueRelease { nc, engine, queue } => {
                let (n, _) = self.owned(client, nc)?;
                lock(&n.state)
                    .queues
                    .release(engine, queue)
                    .map_err(|e| queue_refusal(&e))?;
                ok()
            }
            Request::DmaQueueCopyStart {
                nc,
                engine,
                queue,
                tx_desc_count,
                rx_desc_count,
            } => {
                let (n, _) = self.owned(client, nc)?;
                lock(&n.state)
                    .queues
                    .post(engine, queue, tx_desc_count, rx_desc_count)
                    .map_err(|e| queue_refusal(&e))?;
                let fired = if self.faults_armed() {
                    self.with_faults(|f| f.on_copy_start(nc, engine, queue))
                } else {
                    Vec::new()
                };
                if fired.is_empty() {
                    self.run_dma(client, DmaQueueId { nc, engine, queue });
                } else {
                    self.abort_doorbell(n, engine, queue, &fired);
                }
                ok()
            }
            Request::SemaphoreIncrement { nc, index, value } => {
                if let Some(n) = self.nc_ref(nc) {
                    bump(&n.counters.doorbells, 1);
                }
                let (n, added) =
                    self.with_owned(client, nc, |c| c.registers.semaphore_add(index, value))?;
                added.map_err(range)?;
                if self.tracer.enabled() {
                    self.trace_doorbell(n, index, value);
                }
                if index == SEM_INFERENCE_START {
                    self.doorbell(n);
                } else {
                    self.registers_changed(n, false);
                }
                ok()
            }
            Request::SemaphoreDecrement { nc, index, value } => {
                let (n, c) = self.owned(client, nc)?;
                c.registers.semaphore_sub(index, value).map_err(range)?;
                self.registers_changed(n, false);
                ok()
            }
            Request::SemaphoreRead { nc, index } => {
                let (_, c) = self.owned(client, nc)?;
                reply(Reply::Value(c.registers.semaphore(index).map_err(range)?))
            }
            Request::SemaphoreWrite { nc, index, value } => {
                let (n, c) = self.owned(client, nc)?;
                c.registers.semaphore_set(index, value).map_err(range)?;
                self.registers_changed(n, index == SEM_INFERENCE_START);
                ok()
            }
            Request::EventSet { nc, index, value } => {
                let (n, c) = self.owned(client, nc)?;
                c.registers.event_set(index, value).map_err(range)?;
                self.registers_changed(n, false);
                ok()
            }
            Request::EventGet { nc, index } => {
                let (_, c) = self.owned(client, nc)?;
                reply(Reply::Value(c.registers.event(index).map_err(range)?))
            }
            Request::NotificationInit {
                nc,
                nq_type,
                entries,
            } => self.notification_init(client, nc, nq_type, entries),
            Request::NcReset { nc } => {
                let (n, _) = self.owned(client, nc)?;
                self.reset_nc(n, client, false);
                ok()
            }
            Request::Counters { nc } => reply(Reply::Counters(self.nc(nc)?.counters())),
            Request::InjectFault(spec) => self.inject_fault(spec),
            Request::ClearFaults => {
                let disarmed = self.with_faults(crate::faults::FaultTable::clear);
                tracing::info!("{disarmed} armed faults cleared");
                ok()
            }
            Request::SetLatency(model) => {
                self.set_latency(model);
                ok()
            }
            Request::DeviceStats => reply(Reply::DeviceStats(self.stats())),
            Request::References => reply(Reply::References(self.references.described())),
            Request::Identify { runtime_version } => {
                if let Some(info) = lock(&self.clients).get_mut(&client) {
                    info.runtime_version = Some(truncate_identity(runtime_version));
                }
                ok()
            }
            Request::Clients => reply(Reply::Clients(self.clients_summary())),
            Request::TraceSubscribe { max_events } => {
                let ncs: Vec<u32> = self
                    .ncs
                    .iter()
                    .filter(|n| self.owned_by(n, client))
                    .map(|n| n.index)
                    .collect();
                self.tracer.subscribe(client.0, &ncs, max_events as usize);
                reply(Reply::TraceSubscribed {
                    ncs,
                    clock: self.trace_clock(),
                })
            }
            Request::TraceDrain => reply(self.trace_drain(client)),
        }
    }

    /// [`Request::TraceDrain`]: as many of `client`'s held trace events as fit one message.
    /// The budget counts what the client's decoder counts against [`MAX_MSG_SIZE`]: each
    /// event's encoded bytes, plus the memory its decoding claims (the vector slot and the
    /// reference label's string).
    ///
    /// [`MAX_MSG_SIZE`]: shared::protocol::MAX_MSG_SIZE
    fn trace_drain(&self, client: ClientId) -> Reply {
        /// Room kept for the reply's other fields and the events vector's length.
        const OVERHEAD: usize = 64;
        let mut scratch = [0u8; shared::protocol::MAX_MSG_SIZE];
        let mut used = OVERHEAD;
        let (events, dropped, more) = self.tracer.drain(client.0, |event| {
            let encoded = shared::protocol::encode(event, &mut scratch)
                .unwrap_or(shared::protocol::MAX_MSG_SIZE);
            let label = match &event.detail {
                crate::trace::Detail::Stream {
                    reference: Some(r), ..
                } => r.len(),
                _ => 0,
            };
            let claim = encoded + std::mem::size_of::<crate::trace::Event>() + label;
            if used + claim > shared::protocol::MAX_MSG_SIZE {
                return false;
            }
            used += claim;
            true
        });
        Reply::TraceEvents {
            events,
            dropped,
            more,
            clock: self.trace_clock(),
        }
    }

    /// The clients that hold NCs or memory chunks, by pid (what [`Request::Clients`]
    /// answers). Reads the NC owners, then the memory, then the clients table: one lock at a
    /// time, so the figures are each exact but not taken at one instant.
    pub(super) fn clients_summary(&self) -> Vec<ClientSummary> {
        let mut ncs: HashMap<ClientId, Vec<u32>> = HashMap::new();
        for (index, nc) in self.ncs.iter().enumerate() {
            if let Some(claim) = self.owner(nc) {
                ncs.entry(claim.client)
                    .or_default()
                    .push(u32::try_from(index).unwrap_or(u32::MAX));
            }
        }
        let memory = read(&self.memory).bytes_by_owner();
        let clients = lock(&self.clients);
        let mut out: Vec<ClientSummary> = clients
            .iter()
            .filter_map(|(id, info)| {
                let held = ncs.remove(id).unwrap_or_default();
                let bytes = memory.get(id).copied().unwrap_or(0);
                (!held.is_empty() || bytes > 0).then(|| ClientSummary {
                    pid: info.peer.pid(),
                    command: info.peer.command(),
                    runtime_version: info.runtime_version.clone().unwrap_or_default(),
                    ncs: held,
                    memory_bytes: bytes,
                })
            })
            .collect();
        out.sort_by_key(|c| (c.ncs.first().copied().unwrap_or(u32::MAX), c.pid));
        out
    }

    fn inject_fault(&self, spec: FaultSpec) -> Handled {
        if let Some(nc) = spec.nc {
            self.nc(nc)?;
        }
        self.with_faults(|f| f.arm(spec))
            .map_err(|e| refuse(ErrorKind::InvalidArgument, e.to_string()))?;
        tracing::info!("fault armed: {spec:?}");
        ok()
    }

    /// Sets the latency model; every NC's simulated clock restarts at 0.
    fn set_latency(&self, model: LatencyModel) {
        let mut current = lock(&self.latency);
        *current = model;
        for nc in &self.ncs {
            nc.clock.reset();
        }
        self.simulated
            .store(!timing::is_wall_clock(&model), Ordering::SeqCst);
        drop(current);
        tracing::info!("latency model set: {model:?}");
    }

    pub(super) fn stats(&self) -> DeviceStats {
        let (memory_in_use, chunks) = {
            let memory = read(&self.memory);
            (memory.bytes_in_use(), memory.chunk_count())
        };
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let claimed = self.ncs.iter().filter(|n| self.owner(n).is_some()).count();
        let queues: usize = self
            .ncs
            .iter()
            .map(|n| lock(&n.state).queues.initialised())
            .sum();
        DeviceStats {
            memory_in_use,
            chunks: u64::try_from(chunks).unwrap_or(u64::MAX),
            clients: count(lock(&self.clients).len()),
            claimed_ncs: count(claimed),
            dma_queues: count(queues),
            armed_faults: count(lock(&self.faults).len()),
        }
    }

    fn hello(&self, version: u32) -> Handled {
        if version != PROTOCOL_VERSION {
            return Err(refuse(
                ErrorKind::Handshake,
                format!("protocol version {version} is not simdev's version {PROTOCOL_VERSION}"),
            ));
        }
        reply(Reply::Hello {
            version: PROTOCOL_VERSION,
            device: self.info.clone(),
        })
    }

    fn mem_alloc(&self, client: ClientId, location: MemLocation, size: u64, align: u64) -> Handled {
        if let MemLocation::Hbm { nc } = location {
            self.owned(client, nc)?;
        }
        let chunk = write(&self.memory)
            .allocate(client, Region::from(location), size, align)
            .map_err(|e| alloc_refusal(&e))?;
        reply(Reply::MemAllocated {
            handle: chunk.handle(),
            pa: chunk.pa(),
            size: chunk.size(),
        })
    }

    fn mem_map(&self, client: ClientId, handle: u64) -> Handled {
        let chunk = read(&self.memory)
            .get(client, handle)
            .map_err(|e| refuse(ErrorKind::BadHandle, e.to_string()))?;
        let fd = chunk.memfd().try_clone_to_owned().map_err(|e| {
            match e.raw_os_error().map(nix::Error::from_raw) {
                Some(errno) if out_of_fds(errno) => {
                    fds_refusal("duplicating the chunk's memfd", errno)
                }
                _ => os_refusal("duplicating the chunk's memfd", &e),
            }
        })?;
        Ok((
            Reply::MemMapped {
                handle,
                pa: chunk.pa(),
                size: chunk.size(),
            },
            vec![fd],
        ))
    }

    fn chunk(&self, client: ClientId, handle: u64) -> Result<Arc<Chunk>, RemoteError> {
        read(&self.memory)
            .get(client, handle)
            .map_err(|e| refuse(ErrorKind::BadHandle, format!("ring {e}")))
    }

    fn dma_queue_init(
        &self,
        client: ClientId,
        id: DmaQueueId,
        tx: (u64, u32),
        rx: (u64, u32),
    ) -> Handled {
        let (n, _) = self.owned(client, id.nc)?;
        let mut state = lock(&n.state);
        let queues = &mut state.queues;
        queues
            .check_id(id.engine, id.queue)
            .map_err(|e| queue_refusal(&e))?;
        dma::check_ring_size(Direction::Tx, tx.1).map_err(|e| queue_refusal(&e))?;
        dma::check_ring_size(Direction::Rx, rx.1).map_err(|e| queue_refusal(&e))?;
        let tx_chunk = self.chunk(client, tx.0)?;
        let rx_chunk = self.chunk(client, rx.0)?;
        queues
            .init(id.engine, id.queue, (tx_chunk, tx.1), (rx_chunk, rx.1))
            .map_err(|e| queue_refusal(&e))?;
        if (id.engine, id.queue) == (EXEC_QUEUE_ENGINE, EXEC_QUEUE) {
            state.exec_batches = 0;
            lock(&n.compute).set_tables_loaded(false);
        }
        ok()
    }

    fn notification_init(&self, client: ClientId, nc: u32, nq_type: u32, entries: u32) -> Handled {
        let (n, _) = self.owned(client, nc)?;
        if nq_type != NQ_TYPE_NOTIFY {
            return Err(refuse(
                ErrorKind::Unsupported,
                format!(
                    "NQ type {nq_type} is not emulated; simdev posts every notification of an NC \
                     to its NOTIFY ({NQ_TYPE_NOTIFY}) queue"
                ),
            ));
        }
        if !entries.is_power_of_two() || !(2..=NQ_MAX_ENTRIES).contains(&entries) {
            return Err(refuse(
                ErrorKind::InvalidArgument,
                format!("{entries} NQ entries: must be a power of two from 2 to {NQ_MAX_ENTRIES}"),
            ));
        }
        let bytes = u64::try_from(nq_bytes(entries)).unwrap_or(u64::MAX);
        let chunk = write(&self.memory)
            .allocate(client, Region::Host, bytes, 0)
            .map_err(|e| alloc_refusal(&e))?;
        let answer = Reply::NotificationQueue {
            handle: chunk.handle(),
            pa: chunk.pa(),
            size: chunk.size(),
            entries,
        };
        let old = lock(&n.state)
            .nq
            .replace(NotificationQueue::new(chunk, entries));
        if let Some(old) = old {
            let _ = write(&self.memory).free(client, old.chunk().handle());
        }
        reply(answer)
    }
}

#[cfg(test)]
mod tests;
