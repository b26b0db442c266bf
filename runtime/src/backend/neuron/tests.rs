//! Unit tests of [`NeuronDevice`] through a recording fake port: no device, no threads. Each
//! golden test pins the exact request value and argument bytes the driver would receive; the
//! expected bytes are spelled out field by field in the C struct's order (driver-abi §1.4), not
//! produced by the `shared::ioctl` structs under test.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::errno::Errno;
use nix::sys::memfd::{MFdFlags, memfd_create};
use shared::NrtStatus;
use shared::address_map::Arch;
use shared::ioctl;
use shared::memory::{MemError, SharedChunk};
use shared::protocol::MemLocation;
use zerocopy::IntoBytes;

use super::{IoctlPort, MAX_NQ_ENTRIES, NeuronDevice};
use crate::backend::{Device, DeviceError, DmaQueueId, DmaRings, MemHandle};

/// What the backend handed the port.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Sent {
    /// [`IoctlPort::ioctl`]: request and argument bytes as sent.
    Ioctl { request: u32, arg: Vec<u8> },
    /// [`IoctlPort::ioctl_out_u64`]: request, argument bytes as sent, pointer field offset.
    OutIoctl {
        request: u32,
        arg: Vec<u8>,
        ptr_offset: usize,
    },
    /// [`IoctlPort::map`].
    Map {
        offset: u64,
        pa: u64,
        len: usize,
        writable: bool,
    },
}

/// A scripted driver answer to one request.
#[derive(Clone, Debug)]
enum Reply {
    /// Success, the argument overwritten with these bytes (the driver's in-place output).
    Fill(Vec<u8>),
    /// Success, this value written through the out-pointer.
    Handle(u64),
    /// Failure with this errno.
    Fail(Errno),
}

/// A port that records every call and answers from a script (unscripted ioctls succeed and
/// leave the argument alone; maps return a fresh memfd mapping of `len` bytes).
#[derive(Debug, Default)]
struct FakePort {
    sent: Mutex<Vec<Sent>>,
    replies: Mutex<HashMap<u32, VecDeque<Reply>>>,
}

impl FakePort {
    /// A port whose DEVICE_BASIC_INFO answers `architecture`.
    fn with_architecture(architecture: u32) -> Self {
        let port = Self::default();
        let basic = ioctl::DeviceBasicInfo {
            architecture,
            revision: 1,
        };
        port.reply(
            ioctl::DEVICE_BASIC_INFO,
            Reply::Fill(basic.as_bytes().to_vec()),
        );
        port
    }

    fn reply(&self, request: u32, reply: Reply) {
        self.replies
            .lock()
            .unwrap()
            .entry(request)
            .or_default()
            .push_back(reply);
    }

    fn next_reply(&self, request: u32) -> Option<Reply> {
        self.replies
            .lock()
            .unwrap()
            .get_mut(&request)
            .and_then(VecDeque::pop_front)
    }

    /// Everything sent so far, and forget it.
    fn take(&self) -> Vec<Sent> {
        std::mem::take(&mut self.sent.lock().unwrap())
    }
}

impl IoctlPort for FakePort {
    fn path(&self) -> &Path {
        Path::new("/dev/neuron7")
    }

    fn ioctl(&self, request: u32, arg: &mut [u8]) -> Result<(), Errno> {
        self.sent.lock().unwrap().push(Sent::Ioctl {
            request,
            arg: arg.to_vec(),
        });
        match self.next_reply(request) {
            None => Ok(()),
            Some(Reply::Fill(bytes)) => {
                arg.copy_from_slice(&bytes);
                Ok(())
            }
            Some(Reply::Fail(errno)) => Err(errno),
            Some(Reply::Handle(_)) => panic!("a handle reply to an in-place ioctl"),
        }
    }

    fn ioctl_out_u64(&self, request: u32, arg: &mut [u8], ptr_offset: usize) -> Result<u64, Errno> {
        self.sent.lock().unwrap().push(Sent::OutIoctl {
            request,
            arg: arg.to_vec(),
            ptr_offset,
        });
        match self.next_reply(request) {
            Some(Reply::Handle(handle)) => Ok(handle),
            Some(Reply::Fail(errno)) => Err(errno),
            other => panic!("unscripted out-pointer ioctl {request:#010x}: {other:?}"),
        }
    }

    fn map(
        &self,
        offset: u64,
        pa: u64,
        len: usize,
        writable: bool,
    ) -> Result<SharedChunk, MemError> {
        self.sent.lock().unwrap().push(Sent::Map {
            offset,
            pa,
            len,
            writable,
        });
        let file = File::from(memfd_create("fake-neuron-chunk", MFdFlags::MFD_CLOEXEC).unwrap());
        file.set_len(len as u64).unwrap();
        SharedChunk::map_fd(&file, pa, len, writable)
    }
}

/// Little-endian bytes of a `u32` field.
fn w(v: u32) -> [u8; 4] {
    v.to_le_bytes()
}

/// Little-endian bytes of a `u64` field.
fn d(v: u64) -> [u8; 8] {
    v.to_le_bytes()
}

/// Concatenates fields into the expected argument bytes.
macro_rules! golden {
    ($($field:expr),* $(,)?) => { [$(&$field[..]),*].concat() };
}

fn ioctl_sent(request: u32, arg: Vec<u8>) -> Sent {
    Sent::Ioctl { request, arg }
}

/// A V2 (trn1) device with its DEVICE_BASIC_INFO call already taken from the log.
fn trn1() -> NeuronDevice<FakePort> {
    device(2)
}

fn device(architecture: u32) -> NeuronDevice<FakePort> {
    let dev = NeuronDevice::with_port(FakePort::with_architecture(architecture)).unwrap();
    dev.port().take();
    dev
}

/// Scripts a successful MEM_ALLOC_V2 returning `handle` and its MEM_GET_EXTENDED_INFO answer,
/// which (as the driver does) clobbers `mem_handle` with a kernel pointer.
fn script_alloc(port: &FakePort, handle: u64, pa: u64, size: u64) {
    port.reply(ioctl::MEM_ALLOC_V2, Reply::Handle(handle));
    let info = ioctl::MemGetExtendedInfo {
        mem_handle: 0xFFFF_8881_2345_6000,
        version: 0xDEAD_BEEF,
        host_memory: 0,
        mmap_offset: pa,
        pa,
        pid: 4242,
        size,
    };
    port.reply(
        ioctl::MEM_GET_EXTENDED_INFO,
        Reply::Fill(info.as_bytes().to_vec()),
    );
}

fn queue(nc: u32, engine: u32, queue: u32) -> DmaQueueId {
    DmaQueueId { nc, engine, queue }
}

fn assert_out_of_range(result: Result<impl std::fmt::Debug, DeviceError>, expected_what: &str) {
    match result {
        Err(DeviceError::OutOfRange { what, .. }) => assert!(
            what.contains(expected_what),
            "{what:?} does not mention {expected_what:?}"
        ),
        other => panic!("expected OutOfRange({expected_what}), got {other:?}"),
    }
}

// ---- open and device info ----

#[test]
fn open_of_a_missing_node_is_a_clear_no_device_error() {
    let path = PathBuf::from("/nonexistent/dev/neuron0");
    let err = NeuronDevice::open(&path).unwrap_err();
    let DeviceError::NoDevice { hint } = &err else {
        panic!("expected NoDevice, got {err:?}");
    };
    assert!(hint.contains("/nonexistent/dev/neuron0"), "{hint}");
    assert!(hint.contains("aws-neuronx-dkms"), "{hint}");
    assert_eq!(err.status(), NrtStatus::HwError);
}

#[test]
fn open_sends_device_basic_info_with_a_zeroed_8_byte_argument() {
    let dev = NeuronDevice::with_port(FakePort::with_architecture(2)).unwrap();
    assert_eq!(dev.port().take(), [ioctl_sent(0x4008_4E64, vec![0; 8])]);
}

#[test]
fn v2_info_follows_the_driver_facts() {
    let dev = trn1();
    let info = dev.info();
    assert_eq!(info.arch, Arch::Trn1);
    assert_eq!(info.nc_count, 2);
    assert_eq!(info.hbm_bytes_per_nc, 16 << 30);
    assert_eq!(info.hbm_bases, [0x0, 0x10_0000_0000]);
    assert_eq!(info.host_base, 0x1000_0000_0000);
    assert_eq!(info.reg_base, 0);
    assert_eq!((info.semaphores_per_nc, info.events_per_nc), (256, 256));
    assert_eq!(
        (info.dma_engines_per_nc, info.dma_queues_per_engine),
        (16, 16)
    );
    assert_eq!(
        info.description,
        "/dev/neuron7 (aws-neuronx-dkms), not yet run on silicon"
    );
    assert_eq!(dev.backend_name(), "neuron");
}

#[test]
fn v3_info_puts_two_ncs_on_each_hbm_stack() {
    let dev = device(3);
    let info = dev.info();
    assert_eq!(info.arch, Arch::Trn2);
    assert_eq!(info.nc_count, 8);
    assert_eq!(info.hbm_bytes_per_nc, 12 << 30);
    assert_eq!(
        info.hbm_bases,
        [
            0x0,
            0x0,
            0x40_0000_0000,
            0x40_0000_0000,
            0x8000_0000_0000,
            0x8000_0000_0000,
            0x8040_0000_0000,
            0x8040_0000_0000,
        ]
    );
    assert_eq!(info.host_base, 0x4000_0000_0000);
}

#[test]
fn inf1_and_unknown_architectures_are_refused() {
    for architecture in [0, 1, 4] {
        let result = NeuronDevice::with_port(FakePort::with_architecture(architecture));
        let Err(DeviceError::NoDevice { hint }) = result else {
            panic!("architecture {architecture} accepted");
        };
        assert!(
            hint.contains(&format!("architecture {architecture}")),
            "{hint}"
        );
    }
}

#[test]
fn a_failing_device_basic_info_is_an_ioctl_error() {
    let port = FakePort::default();
    port.reply(ioctl::DEVICE_BASIC_INFO, Reply::Fail(Errno::EACCES));
    let err = NeuronDevice::with_port(port).unwrap_err();
    assert!(matches!(
        err,
        DeviceError::Ioctl {
            op: "DEVICE_BASIC_INFO",
            request: 0x4008_4E64,
            source: Errno::EACCES
        }
    ));
}

// ---- NC claim and release ----

#[test]
fn claim_nc_takes_the_writer_lock_then_maps_the_semaphore_window_read_only() {
    let dev = trn1();
    let window = ioctl::ResourceMmapInfo {
        block: 0,
        block_id: 1,
        resource: 0,
        _pad: 0,
        offset: 0x0FFF_C000_0000 + 0x400_0000 + 0x270_0000,
        size: 0x2000,
    };
    dev.port().reply(
        ioctl::RESOURCE_MMAP_INFO,
        Reply::Fill(window.as_bytes().to_vec()),
    );

    let claimed = dev.claim_nc(1).unwrap();

    let uuid = dev.uuid;
    assert_eq!(
        dev.port().take(),
        [
            ioctl_sent(0x4008_4E53, golden![w(1), uuid]),
            // block TPB 0, block_id 1, resource SEMAPHORE 0, pad, offset out, size out.
            ioctl_sent(0xC020_4E70, golden![w(0), w(1), w(0), w(0), d(0), d(0)]),
            Sent::Map {
                offset: 0x0FFF_C670_0000,
                pa: 0x0FFF_C670_0000,
                len: 0x2000,
                writable: false,
            },
        ]
    );
    assert_eq!(claimed.nc, 1);
    assert_eq!(
        claimed.semaphore_window.as_ref().map(SharedChunk::len),
        Some(0x2000)
    );
    assert!(
        claimed.notification_fd.is_none(),
        "silicon has no completion interrupt"
    );
}

#[test]
fn claim_nc_without_a_semaphore_window_still_claims() {
    let dev = trn1();
    dev.port()
        .reply(ioctl::RESOURCE_MMAP_INFO, Reply::Fail(Errno::ENOTSUP));

    let claimed = dev.claim_nc(0).unwrap();

    assert!(claimed.semaphore_window.is_none());
    let sent = dev.port().take();
    assert_eq!(
        sent.len(),
        2,
        "no map after a failed RESOURCE_MMAP_INFO: {sent:?}"
    );
}

#[test]
fn a_busy_nc_is_an_ioctl_error_with_status_nc_busy() {
    let dev = trn1();
    dev.port()
        .reply(ioctl::CRWL_WRITER_ENTER, Reply::Fail(Errno::EBUSY));

    let err = dev.claim_nc(0).unwrap_err();

    assert!(matches!(
        err,
        DeviceError::Ioctl {
            op: "CRWL_WRITER_ENTER",
            request: 0x4008_4E53,
            source: Errno::EBUSY
        }
    ));
    assert_eq!(err.status(), NrtStatus::ExecNcBusy);
    assert_eq!(dev.port().take().len(), 1, "nothing after the failed lock");
}

#[test]
fn release_nc_downgrades_then_exits_as_reader() {
    let dev = trn1();

    dev.release_nc(1).unwrap();

    let uuid = dev.uuid;
    assert_eq!(
        dev.port().take(),
        [
            ioctl_sent(0x4008_4E54, golden![w(1), uuid]),
            ioctl_sent(0x4008_4E52, golden![w(1), uuid]),
        ]
    );
}

#[test]
fn the_lock_uuid_names_this_process() {
    let dev = trn1();
    assert_eq!(dev.uuid[0..4], std::process::id().to_le_bytes());
    assert_eq!(&dev.uuid[28..32], b"nrrs");
    assert_eq!(dev.uuid, trn1().uuid, "one uuid per process");
}

// ---- memory ----

#[test]
fn mem_alloc_in_hbm_sends_mem_alloc_v2_then_mem_get_extended_info() {
    let dev = trn1();
    script_alloc(dev.port(), 7, 0x10_0100_0000, 0x3000);

    let allocation = dev
        .mem_alloc(MemLocation::Hbm { nc: 1 }, 0x2345, 0x1000)
        .unwrap();

    assert_eq!(
        dev.port().take(),
        [
            Sent::OutIoctl {
                request: 0x8008_4E66,
                // size, align, host_memory 0, dram_channel 1 (NC 1 → HBM 1), dram_region 0,
                // nc_id 1, mem_handle: zero here, pointed at the port's own u64 by the port.
                arg: golden![d(0x2345), d(0x1000), w(0), w(1), w(0), w(1), d(0)],
                ptr_offset: 32,
            },
            ioctl_sent(0x8008_4E1D, golden![d(7), [0; 40]]),
        ]
    );
    assert_eq!(allocation.handle, MemHandle(7));
    assert_eq!(allocation.pa, 0x10_0100_0000);
    assert_eq!(allocation.size, 0x3000);
    assert_eq!(allocation.location, MemLocation::Hbm { nc: 1 });
}

#[test]
fn mem_alloc_on_v3_uses_the_nc_pairs_hbm_stack() {
    let dev = device(3);
    script_alloc(dev.port(), 9, 0x8000_0100_0000, 0x1000);

    dev.mem_alloc(MemLocation::Hbm { nc: 5 }, 0x1000, 0)
        .unwrap();

    let sent = dev.port().take();
    let Sent::OutIoctl { arg, .. } = &sent[0] else {
        panic!("{sent:?}");
    };
    assert_eq!(
        *arg,
        golden![d(0x1000), d(0), w(0), w(2), w(0), w(5), d(0)],
        "NC 5 allocates from HBM 2"
    );
}

#[test]
fn mem_alloc_of_host_memory_sets_host_memory_and_no_alignment() {
    let dev = trn1();
    script_alloc(dev.port(), 3, 0x1000_8000_0000, 0x1000);

    let allocation = dev.mem_alloc(MemLocation::Host, 0x1000, 0).unwrap();

    let sent = dev.port().take();
    assert_eq!(
        sent[0],
        Sent::OutIoctl {
            request: 0x8008_4E66,
            arg: golden![d(0x1000), d(0), w(1), w(0), w(0), w(0), d(0)],
            ptr_offset: 32,
        }
    );
    assert_eq!(allocation.location, MemLocation::Host);
}

#[test]
fn host_memory_with_an_alignment_never_reaches_the_driver() {
    let dev = trn1();

    let result = dev.mem_alloc(MemLocation::Host, 0x1000, 0x1000);

    assert_out_of_range(result, "align");
    assert_eq!(dev.port().take(), []);
}

#[test]
fn the_handle_clobbered_by_mem_get_extended_info_is_not_used() {
    let dev = trn1();
    script_alloc(dev.port(), 7, 0x10_0100_0000, 0x2000);
    let allocation = dev
        .mem_alloc(MemLocation::Hbm { nc: 1 }, 0x2000, 0)
        .unwrap();
    dev.port().take();

    let mapping = dev.mem_map(&allocation).unwrap();
    dev.mem_free(allocation.handle).unwrap();

    assert_eq!(allocation.handle, MemHandle(7), "not the kernel pointer");
    assert_eq!(
        dev.port().take(),
        [
            Sent::Map {
                offset: 0x10_0100_0000,
                pa: 0x10_0100_0000,
                len: 0x2000,
                writable: true,
            },
            ioctl_sent(0x8008_4E16, golden![d(7)]),
        ],
        "mapped from the recorded chunk without asking again, freed by the real handle"
    );
    assert_eq!(mapping.pa(), 0x10_0100_0000);
}

#[test]
fn a_failed_mem_get_extended_info_frees_the_new_chunk() {
    let dev = trn1();
    dev.port().reply(ioctl::MEM_ALLOC_V2, Reply::Handle(11));
    dev.port()
        .reply(ioctl::MEM_GET_EXTENDED_INFO, Reply::Fail(Errno::EIO));

    let err = dev
        .mem_alloc(MemLocation::Hbm { nc: 0 }, 0x1000, 0)
        .unwrap_err();

    assert!(matches!(
        err,
        DeviceError::Ioctl {
            op: "MEM_GET_EXTENDED_INFO",
            ..
        }
    ));
    let sent = dev.port().take();
    assert_eq!(sent.last(), Some(&ioctl_sent(0x8008_4E16, golden![d(11)])));
}

#[test]
fn out_of_memory_reports_nrt_resource() {
    let dev = trn1();
    dev.port()
        .reply(ioctl::MEM_ALLOC_V2, Reply::Fail(Errno::ENOMEM));

    let err = dev
        .mem_alloc(MemLocation::Hbm { nc: 0 }, 1 << 40, 0)
        .unwrap_err();

    assert_eq!(err.status(), NrtStatus::Resource);
    assert_eq!(
        dev.port().take().len(),
        1,
        "no info call after a failed alloc"
    );
}

#[test]
fn mem_map_of_a_chunk_not_allocated_here_asks_the_driver_first() {
    let dev = trn1();
    let info = ioctl::MemGetExtendedInfo {
        mem_handle: 0xFFFF_8881_0000_0000,
        host_memory: 1,
        mmap_offset: 0x1000_4000_0000,
        pa: 0x1000_4000_0000,
        size: 0x1000,
        ..Default::default()
    };
    dev.port().reply(
        ioctl::MEM_GET_EXTENDED_INFO,
        Reply::Fill(info.as_bytes().to_vec()),
    );
    let foreign = crate::backend::Allocation {
        handle: MemHandle(5),
        pa: 0,
        size: 0,
        location: MemLocation::Host,
    };

    dev.mem_map(&foreign).unwrap();

    assert_eq!(
        dev.port().take(),
        [
            ioctl_sent(0x8008_4E1D, golden![d(5), [0; 40]]),
            Sent::Map {
                offset: 0x1000_4000_0000,
                pa: 0x1000_4000_0000,
                len: 0x1000,
                writable: true,
            },
        ]
    );
}

// ---- DMA queues ----

fn rings(tx_desc_count: u32, rx_desc_count: u32) -> DmaRings {
    DmaRings {
        tx_ring: MemHandle(0x21),
        tx_desc_count,
        rx_ring: MemHandle(0x22),
        rx_desc_count,
    }
}

#[test]
fn dma_queue_init_numbers_engines_device_wide() {
    let dev = trn1();

    dev.dma_queue_init(queue(1, 2, 3), &rings(64, 4096))
        .unwrap();

    assert_eq!(
        dev.port().take(),
        [ioctl_sent(
            0x8008_4E21,
            // eng_id 1·16+2 = 18, qid 3, tx 64, rx 4096, tx_handle, rx_handle, rxc_handle 0,
            // axi_port 0, pad.
            golden![
                w(18),
                w(3),
                w(64),
                w(4096),
                d(0x21),
                d(0x22),
                d(0),
                w(0),
                w(0)
            ],
        )]
    );
}

#[test]
fn ring_sizes_outside_the_driver_rules_never_reach_the_driver() {
    let dev = trn1();
    for (tx, rx, what) in [
        (16, 64, "tx_desc_count"),
        (31, 64, "tx_desc_count"),
        (40, 64, "tx_desc_count"),
        (64, (1 << 24) - 15, "rx_desc_count"),
        (64, 1 << 24, "rx_desc_count"),
        (64, 0, "rx_desc_count"),
    ] {
        assert_out_of_range(dev.dma_queue_init(queue(0, 0, 0), &rings(tx, rx)), what);
    }
    assert_eq!(dev.port().take(), []);
    dev.dma_queue_init(queue(0, 0, 0), &rings(32, (1 << 24) - 16))
        .unwrap();
}

#[test]
fn a_ring_larger_than_its_chunk_never_reaches_the_driver() {
    let dev = trn1();
    script_alloc(dev.port(), 0x21, 0x10_0000_0000 + (16 << 20), 0x1000);
    dev.mem_alloc(MemLocation::Hbm { nc: 0 }, 0x1000, 0)
        .unwrap();
    dev.port().take();

    // 0x1000 bytes hold 256 descriptors.
    let result = dev.dma_queue_init(queue(0, 0, 0), &rings(512, 64));

    assert_out_of_range(result, "fit the TX ring chunk");
    assert_eq!(dev.port().take(), []);
    dev.dma_queue_init(queue(0, 0, 0), &rings(256, 64)).unwrap();
}

#[test]
fn dma_queue_release_sends_engine_and_queue() {
    let dev = trn1();

    dev.dma_queue_release(queue(1, 15, 14)).unwrap();

    assert_eq!(
        dev.port().take(),
        [ioctl_sent(0x8008_4E22, golden![w(31), w(14)])]
    );
}

#[test]
fn dma_queue_copy_start_is_the_doorbell() {
    let dev = trn1();

    dev.dma_queue_copy_start(queue(0, 2, 1), 3, 4).unwrap();

    assert_eq!(
        dev.port().take(),
        [ioctl_sent(
            0x8008_4E23,
            vec![2, 0, 0, 0, 1, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0]
        )]
    );
}

#[test]
fn rx_desc_count_zero_never_reaches_the_driver() {
    let dev = trn1();

    let result = dev.dma_queue_copy_start(queue(0, 0, 0), 1, 0);

    assert_out_of_range(result, "BUG_ON");
    assert_eq!(dev.port().take(), []);
}

#[test]
fn an_rx_only_doorbell_is_allowed_and_tx_counts_are_bounded() {
    let dev = trn1();
    dev.dma_queue_copy_start(queue(0, 0, 0), 0, 1).unwrap();
    assert_eq!(
        dev.port().take(),
        [ioctl_sent(0x8008_4E23, golden![w(0), w(0), w(0), w(1)])]
    );
    assert_out_of_range(
        dev.dma_queue_copy_start(queue(0, 0, 0), 1 << 24, 1),
        "tx_desc_count",
    );
}

// ---- semaphores and events ----

#[test]
fn semaphore_increment_is_the_12_byte_seed_argument() {
    let dev = trn1();

    dev.semaphore_increment(1, 5, 1).unwrap();

    assert_eq!(
        dev.port().take(),
        [ioctl_sent(
            0x8008_4E29,
            vec![1, 0, 0, 0, 5, 0, 0, 0, 1, 0, 0, 0]
        )]
    );
}

#[test]
fn semaphore_decrement_and_write_send_the_value() {
    let dev = trn1();

    dev.semaphore_decrement(0, 255, 2).unwrap();
    dev.semaphore_write(1, 0, 0xFFFF_FFFF).unwrap();

    assert_eq!(
        dev.port().take(),
        [
            ioctl_sent(0x8008_4E2A, golden![w(0), w(255), w(2)]),
            ioctl_sent(0x8008_4E2C, golden![w(1), w(0), w(0xFFFF_FFFF)]),
        ]
    );
}

#[test]
fn semaphore_read_returns_the_value_the_driver_writes_back() {
    let dev = trn1();
    let answer = ioctl::Semaphore {
        nc_id: 1,
        semaphore_index: 9,
        value: 42,
    };
    dev.port().reply(
        ioctl::SEMAPHORE_READ,
        Reply::Fill(answer.as_bytes().to_vec()),
    );

    let value = dev.semaphore_read(1, 9).unwrap();

    assert_eq!(value, 42);
    assert_eq!(
        dev.port().take(),
        [ioctl_sent(0xC008_4E2B, golden![w(1), w(9), w(0)])]
    );
}

#[test]
fn event_set_and_get() {
    let dev = trn1();
    let answer = ioctl::Event {
        nc_id: 0,
        event_index: 255,
        value: 1,
    };
    dev.port()
        .reply(ioctl::EVENT_GET, Reply::Fill(answer.as_bytes().to_vec()));

    dev.event_set(1, 3, 1).unwrap();
    let value = dev.event_get(0, 255).unwrap();

    assert_eq!(value, 1);
    assert_eq!(
        dev.port().take(),
        [
            ioctl_sent(0x8008_4E2D, golden![w(1), w(3), w(1)]),
            ioctl_sent(0xC008_4E2E, golden![w(0), w(255), w(0)]),
        ]
    );
}

#[test]
fn events_the_driver_would_accept_are_still_range_checked() {
    let dev = trn1();

    // The driver does not check nc_id for events and accepts index == event count.
    assert_out_of_range(dev.event_set(0, 256, 1), "event index");
    assert_out_of_range(dev.event_get(2, 0), "nc");

    assert_eq!(dev.port().take(), []);
}

// ---- notification queues ----

#[test]
fn notification_queue_init_asks_for_a_power_of_two_host_ring_and_maps_it() {
    let dev = trn1();
    let answer = ioctl::NotificationsInitV2 {
        mmap_offset: 0x1000_0123_0000,
        mem_handle: 0x31,
        ..Default::default()
    };
    dev.port().reply(
        ioctl::NOTIFICATIONS_INIT_V2,
        Reply::Fill(answer.as_bytes().to_vec()),
    );

    let nq = dev.notification_queue_init(1, 1024).unwrap();

    // 128-byte header + 1024 × 32-byte entries = 32 896 bytes → 65 536.
    assert_eq!(
        dev.port().take(),
        [
            ioctl_sent(
                0x8008_4E35,
                // nq_dev_id 1, NEURON_CORE 0, NOTIFY 1, engine 0, size, on_host_memory 1,
                // dram_channel 0, dram_region 0, mmap_offset out, mem_handle out.
                golden![
                    w(1),
                    w(0),
                    w(1),
                    w(0),
                    w(65536),
                    w(1),
                    w(0),
                    w(0),
                    d(0),
                    d(0)
                ],
            ),
            Sent::Map {
                offset: 0x1000_0123_0000,
                pa: 0x1000_0123_0000,
                len: 65536,
                writable: true,
            },
        ]
    );
    assert_eq!(nq.entries, 1024);
    assert_eq!(nq.allocation.handle, MemHandle(0x31));
    assert_eq!(nq.allocation.pa, 0x1000_0123_0000);
    assert_eq!(nq.allocation.size, 65536);
    assert_eq!(nq.allocation.location, MemLocation::Host);
    assert_eq!(nq.memory.len(), 65536);
}

#[test]
fn a_small_notification_queue_is_one_4k_chunk() {
    let dev = trn1();
    dev.port().reply(
        ioctl::NOTIFICATIONS_INIT_V2,
        Reply::Fill(
            ioctl::NotificationsInitV2 {
                mmap_offset: 0x1000_0000_4000,
                mem_handle: 2,
                ..Default::default()
            }
            .as_bytes()
            .to_vec(),
        ),
    );

    let nq = dev.notification_queue_init(0, 4).unwrap();

    assert_eq!(nq.allocation.size, 4096);
    // The device wraps at the end of the 4 KiB ring, so the queue reports what the ring holds:
    // 128-byte header + 64 × 32-byte entries = 2 176 ≤ 4 096 < 128 + 128 × 32.
    assert_eq!(nq.entries, 64);
}

#[test]
fn notification_queue_sizes_that_are_not_powers_of_two_never_reach_the_driver() {
    let dev = trn1();
    for entries in [0, 3, 1000, MAX_NQ_ENTRIES * 2] {
        assert_out_of_range(dev.notification_queue_init(0, entries), "entries");
    }
    assert_eq!(dev.port().take(), []);
}

// ---- reset and counters ----

#[test]
fn nc_reset_waits_on_the_request_id_the_driver_returns() {
    let dev = device(3);
    dev.port()
        .reply(ioctl::NC_RESET, Reply::Fill(golden![w(1 << 6), w(4242)]));

    dev.nc_reset(6).unwrap();

    assert_eq!(
        dev.port().take(),
        [
            ioctl_sent(0x8008_4E67, golden![w(0x40), w(0)]),
            ioctl_sent(0x8008_4E68, golden![w(4242), w(0)]),
        ]
    );
}

#[test]
fn a_failed_reset_is_an_error() {
    let dev = trn1();
    dev.port().reply(
        ioctl::NC_RESET_READY,
        Reply::Fill(golden![w(0), 1i32.to_le_bytes()]),
    );

    let err = dev.nc_reset(0).unwrap_err();

    assert!(matches!(
        err,
        DeviceError::Ioctl {
            op: "NC_RESET_READY",
            source: Errno::EIO,
            ..
        }
    ));
    assert_eq!(err.status(), NrtStatus::HwError);
}

#[test]
fn nc_counters_are_unsupported_on_hardware() {
    let dev = trn1();

    assert!(matches!(
        dev.nc_counters(0),
        Err(DeviceError::Unsupported {
            backend: "neuron",
            ..
        })
    ));
    assert_out_of_range(dev.nc_counters(2), "nc");
    assert_eq!(dev.port().take(), []);
}

// ---- range checks ----

#[test]
fn out_of_range_ids_never_reach_the_driver() {
    let dev = trn1();
    let ring = rings(64, 64);

    let results: Vec<(&str, Result<(), DeviceError>)> = vec![
        ("claim_nc", dev.claim_nc(2).map(drop)),
        ("release_nc", dev.release_nc(2)),
        (
            "mem_alloc",
            dev.mem_alloc(MemLocation::Hbm { nc: 2 }, 4096, 0).map(drop),
        ),
        (
            "dma_queue_init nc",
            dev.dma_queue_init(queue(2, 0, 0), &ring),
        ),
        (
            "dma_queue_init engine",
            dev.dma_queue_init(queue(0, 16, 0), &ring),
        ),
        (
            "dma_queue_release queue",
            dev.dma_queue_release(queue(0, 0, 16)),
        ),
        (
            "dma_queue_copy_start",
            dev.dma_queue_copy_start(queue(0, 16, 0), 1, 1),
        ),
        ("semaphore_increment nc", dev.semaphore_increment(2, 0, 1)),
        (
            "semaphore_increment index",
            dev.semaphore_increment(0, 256, 1),
        ),
        ("semaphore_decrement", dev.semaphore_decrement(0, 256, 1)),
        ("semaphore_read", dev.semaphore_read(2, 0).map(drop)),
        ("semaphore_write", dev.semaphore_write(0, 256, 0)),
        ("event_set", dev.event_set(2, 0, 1)),
        ("event_get", dev.event_get(0, 256).map(drop)),
        (
            "notification_queue_init",
            dev.notification_queue_init(2, 64).map(drop),
        ),
        ("nc_reset", dev.nc_reset(2)),
        ("nc_counters", dev.nc_counters(2).map(drop)),
    ];

    for (call, result) in results {
        assert!(
            matches!(result, Err(DeviceError::OutOfRange { .. })),
            "{call}: {result:?}"
        );
    }
    assert_eq!(dev.port().take(), []);
}

#[test]
fn a_forked_child_reaches_no_ioctl() {
    // What a child forked after open sees: the device's owner is another process.
    let mut dev = trn1();
    dev.owner = std::process::id().wrapping_add(1);
    dev.port().take();
    let forked = |e: DeviceError| {
        assert!(matches!(e, DeviceError::Forked { .. }), "{e:?}");
        assert_eq!(e.status(), shared::NrtStatus::Uninitialized);
        assert!(
            e.to_string().contains("call nrt_init in this process"),
            "{e}"
        );
    };
    forked(dev.mem_free(MemHandle(11)).unwrap_err());
    forked(
        dev.mem_alloc(MemLocation::Hbm { nc: 0 }, 0x1000, 0)
            .unwrap_err(),
    );
    forked(dev.semaphore_increment(0, 1, 1).unwrap_err());
    forked(dev.release_nc(0).unwrap_err());
    assert!(dev.port().take().is_empty(), "nothing reached the driver");
}
