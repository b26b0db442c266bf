//! The aws-neuronx-dkms ioctl ABI the `Device` trait uses: exact 32-bit request values and
//! `#[repr(C)]` argument structs (`reference/driver-abi.md` §1.3–§1.4, driver 2.24.7.0, x86-64).
//!
//! Request values are hard-coded as the driver compares them, not derived from a "correct"
//! direction: most requests declare a *pointer* type, so their `_IOC` size field is 8 even
//! though the driver copies 12–56 bytes (seed 000 QUIRK: SEMAPHORE_INCREMENT says 8 but passes a
//! 12-byte `{nc_id, semaphore_index, value}`). [`ioc`] recomputes each value in the tests.
//!
//! Pointer fields (out-pointers such as `mem_handle`) are carried as `u64` user addresses.
//! Implicit C padding is an explicit `_pad` field, so every struct is `IntoBytes` with no
//! uninitialised bytes.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// The ioctl type byte of the neuron driver (`'N'`).
pub const NEURON_IOCTL_TYPE: u32 = 0x4E;

/// Computes a Linux `_IOC` request value: `dir << 30 | size << 16 | type << 8 | nr`.
/// `dir`: 0 none, 1 write (`_IOW`), 2 read (`_IOR`), 3 read/write.
pub const fn ioc(dir: u32, size: u32, nr: u32) -> u32 {
    (dir << 30) | (size << 16) | (NEURON_IOCTL_TYPE << 8) | nr
}

/// `NEURON_IOCTL_DEVICE_INFO` (nr 3): [`DeviceInfoArg`].
pub const DEVICE_INFO: u32 = 0x8008_4E03;
/// `NEURON_IOCTL_DEVICE_BASIC_INFO` (nr 100, declared `_IOW` but output only): [`DeviceBasicInfo`].
pub const DEVICE_BASIC_INFO: u32 = 0x4008_4E64;
/// `NEURON_IOCTL_COMPATIBLE_VERSION` (nr 93): [`CompatibleVersion`].
pub const COMPATIBLE_VERSION: u32 = 0x4008_4E5D;
/// `NEURON_IOCTL_NC_RESET` (nr 103): [`DeviceReset`].
pub const NC_RESET: u32 = 0x8008_4E67;
/// `NEURON_IOCTL_NC_RESET_READY` (nr 104): [`DeviceReady`].
pub const NC_RESET_READY: u32 = 0x8008_4E68;
/// `NEURON_IOCTL_MEM_ALLOC_V2` (nr 102, pointer-declared): [`MemAllocV2`].
pub const MEM_ALLOC_V2: u32 = 0x8008_4E66;
/// `NEURON_IOCTL_MEM_FREE` (nr 22): [`MemFree`].
pub const MEM_FREE: u32 = 0x8008_4E16;
/// `NEURON_IOCTL_MEM_GET_EXTENDED_INFO` (nr 29): [`MemGetExtendedInfo`].
pub const MEM_GET_EXTENDED_INFO: u32 = 0x8008_4E1D;
/// `NEURON_IOCTL_DMA_QUEUE_INIT` (nr 33): [`DmaQueueInit`].
pub const DMA_QUEUE_INIT: u32 = 0x8008_4E21;
/// `NEURON_IOCTL_DMA_QUEUE_RELEASE` (nr 34, a no-op in the driver): [`DmaQueueRelease`].
pub const DMA_QUEUE_RELEASE: u32 = 0x8008_4E22;
/// `NEURON_IOCTL_DMA_QUEUE_COPY_START` (nr 35), the DMA doorbell: [`DmaQueueCopyStart`].
pub const DMA_QUEUE_COPY_START: u32 = 0x8008_4E23;
/// `NEURON_IOCTL_SEMAPHORE_INCREMENT` (nr 41): [`Semaphore`].
pub const SEMAPHORE_INCREMENT: u32 = 0x8008_4E29;
/// `NEURON_IOCTL_SEMAPHORE_DECREMENT` (nr 42): [`Semaphore`].
pub const SEMAPHORE_DECREMENT: u32 = 0x8008_4E2A;
/// `NEURON_IOCTL_SEMAPHORE_READ` (nr 43, value written back): [`Semaphore`].
pub const SEMAPHORE_READ: u32 = 0xC008_4E2B;
/// `NEURON_IOCTL_SEMAPHORE_WRITE` (nr 44): [`Semaphore`].
pub const SEMAPHORE_WRITE: u32 = 0x8008_4E2C;
/// `NEURON_IOCTL_EVENT_SET` (nr 45): [`Event`].
pub const EVENT_SET: u32 = 0x8008_4E2D;
/// `NEURON_IOCTL_EVENT_GET` (nr 46, value written back): [`Event`].
pub const EVENT_GET: u32 = 0xC008_4E2E;
/// `NEURON_IOCTL_NOTIFICATIONS_INIT_V2` (nr 53): [`NotificationsInitV2`].
pub const NOTIFICATIONS_INIT_V2: u32 = 0x8008_4E35;
/// `NEURON_IOCTL_CRWL_WRITER_ENTER` (nr 83): [`Crwl`]; takes the NC's exclusive lock.
pub const CRWL_WRITER_ENTER: u32 = 0x4008_4E53;
/// `NEURON_IOCTL_CRWL_WRITER_DOWNGRADE` (nr 84): [`Crwl`].
pub const CRWL_WRITER_DOWNGRADE: u32 = 0x4008_4E54;
/// `NEURON_IOCTL_CRWL_READER_EXIT` (nr 82): [`Crwl`].
pub const CRWL_READER_EXIT: u32 = 0x4008_4E52;
/// `NEURON_IOCTL_RESOURCE_MMAP_INFO` (nr 112): [`ResourceMmapInfo`].
pub const RESOURCE_MMAP_INFO: u32 = 0xC020_4E70;

/// `neuron_ioctl_device_basic_info` (8 bytes).
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct DeviceBasicInfo {
    /// 1 = V1 (inf1), 2 = V2 (trn1/inf2), 3 = V3 (trn2).
    pub architecture: u32,
    /// Silicon revision.
    pub revision: u32,
}

/// `neuron_ioctl_device_info` (80 bytes).
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct DeviceInfoArg {
    /// 1/2/3 as in [`DeviceBasicInfo`].
    pub architecture: u32,
    /// Silicon revision.
    pub revision: u32,
    /// Number of valid entries in `connected_devices`.
    pub connected_device_count: u32,
    /// Indices of devices connected to this one.
    pub connected_devices: [u32; 8],
    /// Implicit padding at 44.
    pub _pad: u32,
    /// Kernel virtual addresses of BAR0 and BAR2.
    pub bar_address: [u64; 2],
    /// Sizes of BAR0 and BAR2 in bytes.
    pub bar_size: [u64; 2],
}

/// `neuron_ioctl_compatible_version` (8 bytes): the runtime interface version window.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct CompatibleVersion {
    /// Highest supported version.
    pub max: u32,
    /// Lowest supported version.
    pub min: u32,
}

/// `neuron_ioctl_device_reset` (8 bytes).
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct DeviceReset {
    /// Bit map of NCs to reset; 0xFFFF_FFFF = whole device.
    pub nc_map: u32,
    /// Out: the request id (the caller's tgid) to pass to NC_RESET_READY.
    pub request_id: u32,
}

/// `neuron_ioctl_device_ready` (8 bytes).
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct DeviceReady {
    /// The request id NC_RESET returned.
    pub request_id: u32,
    /// Out: 0 completed, 1 failed or unknown id.
    pub result: i32,
}

/// `neuron_ioctl_mem_alloc_v2` (40 bytes).
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct MemAllocV2 {
    /// Bytes to allocate (rounded up to 4 KiB by the driver).
    pub size: u64,
    /// Alignment in bytes; must be 0 for host memory.
    pub align: u64,
    /// 1 = host memory, 0 = device HBM.
    pub host_memory: u32,
    /// HBM channel (the NC's HBM on V2).
    pub dram_channel: u32,
    /// Region within the channel (forced to 0 on V2/V3).
    pub dram_region: u32,
    /// NC the allocation is accounted to.
    pub nc_id: u32,
    /// User address of a `u64` the driver writes the new handle to.
    pub mem_handle: u64,
}

/// `neuron_ioctl_mem_free` (8 bytes).
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct MemFree {
    /// Handle from MEM_ALLOC.
    pub mem_handle: u64,
}

/// `neuron_ioctl_mem_get_extended_info` (48 bytes), filled in place.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct MemGetExtendedInfo {
    /// In: the handle (out: overwritten with a kernel pointer — re-read it from your records).
    pub mem_handle: u64,
    /// Left uninitialised by the driver.
    pub version: u32,
    /// Out: 1 for host memory.
    pub host_memory: u32,
    /// Out: the mmap offset (the chunk's physical address).
    pub mmap_offset: u64,
    /// Out: the device physical address.
    pub pa: u64,
    /// Out: owning pid.
    pub pid: u64,
    /// Out: chunk size in bytes.
    pub size: u64,
}

/// `neuron_ioctl_dma_queue_init` (48 bytes).
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct DmaQueueInit {
    /// Device-wide DMA engine id (< 132).
    pub eng_id: u32,
    /// Queue on the engine (< 16).
    pub qid: u32,
    /// TX ring size in descriptors.
    pub tx_desc_count: u32,
    /// RX ring size in descriptors.
    pub rx_desc_count: u32,
    /// Memory handle of the TX ring.
    pub tx_handle: u64,
    /// Memory handle of the RX ring.
    pub rx_handle: u64,
    /// Completion ring handle; must be 0 (unsupported).
    pub rxc_handle: u64,
    /// AXI port (V1 only).
    pub axi_port: u32,
    /// Implicit padding at 44.
    pub _pad: u32,
}

/// `neuron_ioctl_dma_queue_release` (8 bytes).
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct DmaQueueRelease {
    /// Device-wide engine id.
    pub eng_id: u32,
    /// Queue on the engine.
    pub qid: u32,
}

/// `neuron_ioctl_dma_queue_copy_start` (16 bytes): RX count then TX count to the tail increments.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct DmaQueueCopyStart {
    /// Device-wide engine id.
    pub eng_id: u32,
    /// Queue on the engine.
    pub qid: u32,
    /// TX descriptors to post (0 = RX only).
    pub tx_desc_count: u32,
    /// RX descriptors to post (must be ≥ 1: 0 trips a kernel `BUG_ON`).
    pub rx_desc_count: u32,
}

/// `neuron_ioctl_semaphore` (12 bytes), for all four semaphore requests.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct Semaphore {
    /// NC index on the device.
    pub nc_id: u32,
    /// Semaphore index on the NC.
    pub semaphore_index: u32,
    /// Value to add, subtract or set; out for READ.
    pub value: u32,
}

/// `neuron_ioctl_event` (12 bytes), the same layout as [`Semaphore`].
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct Event {
    /// NC index on the device.
    pub nc_id: u32,
    /// Event index on the NC.
    pub event_index: u32,
    /// Value to set (0/1); out for GET.
    pub value: u32,
}

/// `neuron_ioctl_notifications_init_v2` (48 bytes).
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct NotificationsInitV2 {
    /// NC (or TOP_SP) index.
    pub nq_dev_id: u32,
    /// 0 NeuronCore, 1 TOP_SP.
    pub nq_dev_type: u32,
    /// `NQ_TYPE`: TRACE 0, NOTIFY 1, EVENT 2, ERROR 3, TRACE_DMA 4, THROTTLE 5.
    pub nq_type: u32,
    /// Engine index of the queue.
    pub engine_index: u32,
    /// Ring size in bytes (a power of two).
    pub size: u32,
    /// 1 = ring in host memory.
    pub on_host_memory: u32,
    /// HBM channel for a device ring.
    pub dram_channel: u32,
    /// HBM region for a device ring.
    pub dram_region: u32,
    /// Out: mmap offset (all-ones for device rings).
    pub mmap_offset: u64,
    /// Out: memory handle of the ring.
    pub mem_handle: u64,
}

/// `neuron_ioctl_crwl` (36 bytes): the NC lock requests.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct Crwl {
    /// NC index.
    pub nc_id: u32,
    /// Caller-chosen uuid identifying the holder.
    pub uuid: [u8; 32],
}

/// `neuron_ioctl_resource_mmap_info` (32 bytes).
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct ResourceMmapInfo {
    /// Block: TPB 0, TOPSP 1, HBM 2.
    pub block: u32,
    /// Block instance (the NC for TPB).
    pub block_id: u32,
    /// Resource: SEMAPHORE 0, ALL 1, SBUF 2, DMEM 3.
    pub resource: u32,
    /// Implicit padding at 12.
    pub _pad: u32,
    /// Out: mmap offset.
    pub offset: u64,
    /// Out: size in bytes.
    pub size: u64,
}

macro_rules! assert_size {
    ($($t:ty => $n:expr),* $(,)?) => { $(const _: () = assert!(std::mem::size_of::<$t>() == $n);)* };
}
assert_size!(
    DeviceBasicInfo => 8, DeviceInfoArg => 80, CompatibleVersion => 8, DeviceReset => 8,
    DeviceReady => 8, MemAllocV2 => 40, MemFree => 8, MemGetExtendedInfo => 48,
    DmaQueueInit => 48, DmaQueueRelease => 8, DmaQueueCopyStart => 16, Semaphore => 12,
    Event => 12, NotificationsInitV2 => 48, Crwl => 36, ResourceMmapInfo => 32,
);

/// `NQ_TYPE` value of the NOTIFY queue (explicit notifications; simdev's completion queue).
pub const NQ_TYPE_NOTIFY: u32 = 1;
/// `NQ_TYPE` value of the ERROR queue.
pub const NQ_TYPE_ERROR: u32 = 3;
/// `NQ_DEVICE_TYPE` NEURON_CORE.
pub const NQ_DEVICE_TYPE_NEURON_CORE: u32 = 0;
/// RESOURCE_MMAP_INFO block TPB.
pub const MMAP_BLOCK_TPB: u32 = 0;
/// RESOURCE_MMAP_INFO resource SEMAPHORE (the 8 KiB events + semaphores window).
pub const MMAP_RESOURCE_SEMAPHORE: u32 = 0;

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    #[test]
    fn request_values_match_their_ioc_encoding() {
        let table = [
            (DEVICE_INFO, ioc(2, 8, 3)),
            (DEVICE_BASIC_INFO, ioc(1, 8, 100)),
            (COMPATIBLE_VERSION, ioc(1, 8, 93)),
            (NC_RESET, ioc(2, 8, 103)),
            (NC_RESET_READY, ioc(2, 8, 104)),
            (MEM_ALLOC_V2, ioc(2, 8, 102)),
            (MEM_FREE, ioc(2, 8, 22)),
            (MEM_GET_EXTENDED_INFO, ioc(2, 8, 29)),
            (DMA_QUEUE_INIT, ioc(2, 8, 33)),
            (DMA_QUEUE_RELEASE, ioc(2, 8, 34)),
            (DMA_QUEUE_COPY_START, ioc(2, 8, 35)),
            (SEMAPHORE_INCREMENT, ioc(2, 8, 41)),
            (SEMAPHORE_DECREMENT, ioc(2, 8, 42)),
            (SEMAPHORE_READ, ioc(3, 8, 43)),
            (SEMAPHORE_WRITE, ioc(2, 8, 44)),
            (EVENT_SET, ioc(2, 8, 45)),
            (EVENT_GET, ioc(3, 8, 46)),
            (NOTIFICATIONS_INIT_V2, ioc(2, 8, 53)),
            (CRWL_READER_EXIT, ioc(1, 8, 82)),
            (CRWL_WRITER_ENTER, ioc(1, 8, 83)),
            (CRWL_WRITER_DOWNGRADE, ioc(1, 8, 84)),
            (RESOURCE_MMAP_INFO, ioc(3, 32, 112)),
        ];
        for (value, encoded) in table {
            assert_eq!(value, encoded, "{value:#010x}");
        }
        assert_eq!(
            SEMAPHORE_INCREMENT, 0x8008_4E29,
            "the seed's doorbell request"
        );
    }

    #[test]
    fn field_offsets() {
        assert_eq!(offset_of!(DeviceInfoArg, connected_devices), 12);
        assert_eq!(offset_of!(DeviceInfoArg, bar_address), 48);
        assert_eq!(offset_of!(DeviceInfoArg, bar_size), 64);
        assert_eq!(offset_of!(DeviceBasicInfo, architecture), 0);
        assert_eq!(offset_of!(DeviceBasicInfo, revision), 4);
        assert_eq!(offset_of!(CompatibleVersion, max), 0);
        assert_eq!(offset_of!(CompatibleVersion, min), 4);
        assert_eq!(offset_of!(MemAllocV2, align), 8);
        assert_eq!(offset_of!(MemAllocV2, host_memory), 16);
        assert_eq!(offset_of!(MemAllocV2, dram_channel), 20);
        assert_eq!(offset_of!(MemAllocV2, dram_region), 24);
        assert_eq!(offset_of!(MemAllocV2, nc_id), 28);
        assert_eq!(offset_of!(MemAllocV2, mem_handle), 32);
        assert_eq!(offset_of!(MemGetExtendedInfo, version), 8);
        assert_eq!(offset_of!(MemGetExtendedInfo, host_memory), 12);
        assert_eq!(offset_of!(MemGetExtendedInfo, mmap_offset), 16);
        assert_eq!(offset_of!(MemGetExtendedInfo, pa), 24);
        assert_eq!(offset_of!(MemGetExtendedInfo, pid), 32);
        assert_eq!(offset_of!(MemGetExtendedInfo, size), 40);
        assert_eq!(offset_of!(DmaQueueInit, tx_desc_count), 8);
        assert_eq!(offset_of!(DmaQueueInit, rx_desc_count), 12);
        assert_eq!(offset_of!(DmaQueueInit, tx_handle), 16);
        assert_eq!(offset_of!(DmaQueueInit, rx_handle), 24);
        assert_eq!(offset_of!(DmaQueueInit, rxc_handle), 32);
        assert_eq!(offset_of!(DmaQueueInit, axi_port), 40);
        assert_eq!(offset_of!(DmaQueueCopyStart, tx_desc_count), 8);
        assert_eq!(offset_of!(DmaQueueCopyStart, rx_desc_count), 12);
        assert_eq!(offset_of!(Semaphore, nc_id), 0);
        assert_eq!(offset_of!(Semaphore, semaphore_index), 4);
        assert_eq!(offset_of!(Semaphore, value), 8);
        assert_eq!(offset_of!(Event, event_index), 4);
        assert_eq!(offset_of!(NotificationsInitV2, size), 16);
        assert_eq!(offset_of!(NotificationsInitV2, on_host_memory), 20);
        assert_eq!(offset_of!(NotificationsInitV2, mmap_offset), 32);
        assert_eq!(offset_of!(NotificationsInitV2, mem_handle), 40);
        assert_eq!(offset_of!(DeviceReset, request_id), 4);
        assert_eq!(offset_of!(DeviceReady, result), 4);
        assert_eq!(offset_of!(Crwl, uuid), 4);
        assert_eq!(offset_of!(ResourceMmapInfo, offset), 16);
        assert_eq!(offset_of!(ResourceMmapInfo, size), 24);
    }

    #[test]
    fn golden_bytes_semaphore_increment() {
        let arg = Semaphore {
            nc_id: 1,
            semaphore_index: 5,
            value: 1,
        };
        assert_eq!(arg.as_bytes(), [1, 0, 0, 0, 5, 0, 0, 0, 1, 0, 0, 0]);
    }

    #[test]
    fn golden_bytes_dma_queue_init() {
        let arg = DmaQueueInit {
            eng_id: 17,
            qid: 3,
            tx_desc_count: 64,
            rx_desc_count: 64,
            tx_handle: 0x0102,
            rx_handle: 0x0304,
            ..Default::default()
        };
        #[rustfmt::skip]
        let golden: [u8; 48] = [
            17, 0, 0, 0,  3, 0, 0, 0,  64, 0, 0, 0,  64, 0, 0, 0,
            0x02, 0x01, 0, 0, 0, 0, 0, 0,
            0x04, 0x03, 0, 0, 0, 0, 0, 0,
            0, 0, 0, 0, 0, 0, 0, 0,
            0, 0, 0, 0,  0, 0, 0, 0,
        ];
        assert_eq!(arg.as_bytes(), golden);
    }

    #[test]
    fn golden_bytes_copy_start_and_mem_alloc() {
        let arg = DmaQueueCopyStart {
            eng_id: 2,
            qid: 1,
            tx_desc_count: 3,
            rx_desc_count: 4,
        };
        assert_eq!(
            arg.as_bytes(),
            [2, 0, 0, 0, 1, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0]
        );
        let alloc = MemAllocV2 {
            size: 0x2000,
            align: 0x100,
            host_memory: 0,
            dram_channel: 1,
            dram_region: 0,
            nc_id: 1,
            mem_handle: 0x7FFF_0000_1000,
        };
        #[rustfmt::skip]
        let golden: [u8; 40] = [
            0x00, 0x20, 0, 0, 0, 0, 0, 0,
            0x00, 0x01, 0, 0, 0, 0, 0, 0,
            0, 0, 0, 0,  1, 0, 0, 0,  0, 0, 0, 0,  1, 0, 0, 0,
            0x00, 0x10, 0x00, 0x00, 0xFF, 0x7F, 0, 0,
        ];
        assert_eq!(alloc.as_bytes(), golden);
    }

    #[test]
    fn golden_bytes_device_info_and_compatible_version() {
        let info = DeviceInfoArg {
            architecture: 3,
            revision: 1,
            connected_device_count: 2,
            connected_devices: [4, 9, 0, 0, 0, 0, 0, 0],
            _pad: 0,
            bar_address: [0x1122_3344_5566_7788, 0x10],
            bar_size: [0x0200_0000, 0x4000_0000],
        };
        #[rustfmt::skip]
        let golden: [u8; 80] = [
            3, 0, 0, 0,  1, 0, 0, 0,  2, 0, 0, 0,
            4, 0, 0, 0,  9, 0, 0, 0,  0, 0, 0, 0,  0, 0, 0, 0,
            0, 0, 0, 0,  0, 0, 0, 0,  0, 0, 0, 0,  0, 0, 0, 0,
            0, 0, 0, 0,
            0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11,
            0x10, 0, 0, 0, 0, 0, 0, 0,
            0, 0, 0, 0x02, 0, 0, 0, 0,
            0, 0, 0, 0x40, 0, 0, 0, 0,
        ];
        assert_eq!(info.as_bytes(), golden);
        let version = CompatibleVersion { max: 7, min: 5 };
        assert_eq!(version.as_bytes(), [7, 0, 0, 0, 5, 0, 0, 0]);
        let basic = DeviceBasicInfo {
            architecture: 2,
            revision: 0x10,
        };
        assert_eq!(basic.as_bytes(), [2, 0, 0, 0, 0x10, 0, 0, 0]);
    }

    #[test]
    fn golden_bytes_notifications_init_v2() {
        let arg = NotificationsInitV2 {
            nq_dev_id: 1,
            nq_type: NQ_TYPE_NOTIFY,
            size: 4096,
            on_host_memory: 1,
            ..Default::default()
        };
        let mut golden = [0u8; 48];
        golden[0] = 1;
        golden[8] = 1;
        golden[16..20].copy_from_slice(&4096u32.to_le_bytes());
        golden[20] = 1;
        assert_eq!(arg.as_bytes(), golden);
    }
}
