//! Test helpers for the device's in-process tests: requests in, replies and shared-memory
//! effects out (no sockets, no child processes). Descriptors are built with
//! [`shared::udma::m2m_copy_descriptors`], as the runtime builds them.

use std::os::fd::OwnedFd;

use shared::address_map::{Arch, Register};
use shared::memory::SharedChunk;
use shared::notification::{
    NOTIFICATION_ENTRY_SIZE, NQ_HEADER_SIZE, NQ_TAIL_OFFSET, NotificationEntry,
};
use shared::protocol::{MemLocation, NcCounters, RemoteError, Reply, Request};
use shared::udma::{RingId, UDMA_DESC_SIZE, UdmaDesc, m2m_copy_descriptors};

use super::*;

pub(crate) const KIB: u64 = 1 << 10;
pub(crate) const MIB: u64 = 1 << 20;

pub(crate) fn config() -> Config {
    Config {
        socket: "/nonexistent/simdev.sock".into(),
        arch: Arch::Trn1,
        ncs: 2,
        hbm_bytes_per_nc: 16 * MIB,
        allow_uids: Vec::new(),
        trace: None,
        ..Config::default()
    }
}

pub(crate) fn device() -> Device {
    Device::new(&config()).unwrap()
}

/// An allocation as the client sees it: handle, PA and its own mapping of the chunk.
pub(crate) struct Buf {
    pub(crate) handle: u64,
    pub(crate) pa: u64,
    pub(crate) size: u64,
    pub(crate) view: SharedChunk,
}

impl Buf {
    pub(crate) fn write(&self, offset: u64, bytes: &[u8]) {
        self.view.write(self.pa + offset, bytes).unwrap();
    }

    pub(crate) fn read(&self, offset: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        self.view.read(self.pa + offset, &mut out).unwrap();
        out
    }
}

/// One client of the device, driving it the way the runtime's sim backend would.
pub(crate) struct Client<'a> {
    pub(crate) dev: &'a Device,
    pub(crate) id: ClientId,
}

impl<'a> Client<'a> {
    pub(crate) fn new(dev: &'a Device, pid: u32) -> Self {
        Self {
            dev,
            id: dev.connect(pid),
        }
    }

    pub(crate) fn call(&self, request: Request) -> Reply {
        self.dev.handle(self.id, request).0
    }

    pub(crate) fn ok(&self, request: Request) {
        let name = request.name();
        assert_eq!(self.call(request), Reply::Ok, "{name}");
    }

    pub(crate) fn refused(&self, request: Request) -> RemoteError {
        match self.call(request.clone()) {
            Reply::Error(err) => err,
            other => panic!("{request:?} was answered {other:?}"),
        }
    }

    pub(crate) fn claim(&self, nc: u32) -> Vec<OwnedFd> {
        let (reply, fds) = self.dev.handle(self.id, Request::ClaimNc { nc });
        assert_eq!(reply, Reply::NcClaimed { nc });
        assert_eq!(fds.len(), 2);
        fds
    }

    pub(crate) fn map(&self, handle: u64) -> SharedChunk {
        let (reply, fds) = self.dev.handle(self.id, Request::MemMap { handle });
        let Reply::MemMapped { pa, size, .. } = reply else {
            panic!("MemMap answered {reply:?}");
        };
        let len = usize::try_from(size).unwrap();
        SharedChunk::map_fd(&fds[0], pa, len, true).unwrap()
    }

    pub(crate) fn alloc(&self, location: MemLocation, size: u64) -> Buf {
        let reply = self.call(Request::MemAlloc {
            location,
            size,
            align: 0,
        });
        let Reply::MemAllocated { handle, pa, size } = reply else {
            panic!("MemAlloc answered {reply:?}");
        };
        Buf {
            handle,
            pa,
            size,
            view: self.map(handle),
        }
    }

    pub(crate) fn nq(&self, nc: u32, entries: u32) -> Buf {
        let reply = self.call(Request::NotificationInit {
            nc,
            nq_type: shared::ioctl::NQ_TYPE_NOTIFY,
            entries,
        });
        let Reply::NotificationQueue {
            handle, pa, size, ..
        } = reply
        else {
            panic!("NotificationInit answered {reply:?}");
        };
        Buf {
            handle,
            pa,
            size,
            view: self.map(handle),
        }
    }

    pub(crate) fn semaphore(&self, nc: u32, index: u32) -> u32 {
        match self.call(Request::SemaphoreRead { nc, index }) {
            Reply::Value(v) => v,
            other => panic!("SemaphoreRead answered {other:?}"),
        }
    }

    pub(crate) fn counters(&self, nc: u32) -> NcCounters {
        match self.call(Request::Counters { nc }) {
            Reply::Counters(c) => c,
            other => panic!("Counters answered {other:?}"),
        }
    }
}

/// The notification entries posted so far (the consumer does not advance `head`).
pub(crate) fn entries(nq: &Buf, ring: u32) -> Vec<NotificationEntry> {
    let tail = nq
        .view
        .load_u32(nq.pa + NQ_TAIL_OFFSET as u64, Ordering::Acquire)
        .unwrap();
    (0..u64::from(tail))
        .map(|n| {
            let slot = n % u64::from(ring);
            let pa = nq.pa + NQ_HEADER_SIZE as u64 + slot * NOTIFICATION_ENTRY_SIZE as u64;
            nq.view.read_obj(pa).unwrap()
        })
        .collect()
}

pub(crate) fn register(dev: &Device, reg: Register) -> u64 {
    dev.address_map().register_address(reg)
}

/// A DMA queue and its two rings, with the producer state the runtime keeps (next slot, ring
/// id of the pass being written).
pub(crate) struct Queue {
    pub(crate) nc: u32,
    pub(crate) engine: u32,
    pub(crate) queue: u32,
    pub(crate) tx: Buf,
    pub(crate) rx: Buf,
    pub(crate) descs: u32,
    pub(crate) next: u32,
    pub(crate) ring_id: RingId,
}

impl Queue {
    pub(crate) fn new(client: &Client<'_>, nc: u32, engine: u32, queue: u32, descs: u32) -> Self {
        let bytes = u64::from(descs) * UDMA_DESC_SIZE as u64;
        let tx = client.alloc(MemLocation::Host, bytes);
        let rx = client.alloc(MemLocation::Host, bytes);
        client.ok(Request::DmaQueueInit {
            nc,
            engine,
            queue,
            tx_ring: tx.handle,
            tx_desc_count: descs,
            rx_ring: rx.handle,
            rx_desc_count: descs,
        });
        Self {
            nc,
            engine,
            queue,
            tx,
            rx,
            descs,
            next: 0,
            ring_id: RingId::INITIAL,
        }
    }

    pub(crate) fn push_raw(&mut self, tx: UdmaDesc, rx: UdmaDesc) {
        let offset = u64::from(self.next) * UDMA_DESC_SIZE as u64;
        self.tx.write(offset, &tx.to_le_bytes());
        self.rx.write(offset, &rx.to_le_bytes());
        self.next += 1;
        if self.next == self.descs {
            self.next = 0;
            self.ring_id = self.ring_id.next();
        }
    }

    pub(crate) fn push(&mut self, src: u64, dst: u64, len: u64) {
        let (tx, rx) = m2m_copy_descriptors(src, dst, len, self.ring_id, false).unwrap();
        self.push_raw(tx, rx);
    }

    pub(crate) fn start_request(&self, tx: u32, rx: u32) -> Request {
        Request::DmaQueueCopyStart {
            nc: self.nc,
            engine: self.engine,
            queue: self.queue,
            tx_desc_count: tx,
            rx_desc_count: rx,
        }
    }

    pub(crate) fn start(&self, client: &Client<'_>, count: u32) {
        client.ok(self.start_request(count, count));
    }

    pub(crate) fn tail_registers(&self) -> (Register, Register) {
        let (nc, engine, queue) = (self.nc, self.engine, self.queue);
        (
            Register::TxTailIncrement { nc, engine, queue },
            Register::RxTailIncrement { nc, engine, queue },
        )
    }
}

pub(crate) fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| u8::try_from((i * 7 + i / 251) % 256).unwrap())
        .collect()
}
