//! simdev's device address space: where HBM, host-visible memory and the register window live
//! for each arch. Device physical addresses (PAs) are never file offsets: HBM starts at a
//! non-zero base and the register window at another, so a host pointer or a raw offset used as a
//! PA lands in no region and simdev reports it as out of bounds.
//!
//! Bases follow the driver's facts (`reference/driver-abi.md` §4–§5): HBM at the address of the
//! arch's second HBM stack (V2 `0x10_0000_0000`, V3 `0x40_0000_0000`), host-visible memory at the
//! PCIe host base (V2 `0x1000_0000_0000`, V3 `0x4000_0000_0000`), and the register window at
//! the V2 device-side TPB view `0x0FFF_C000_0000 + nc·0x400_0000`. Within one NC's 64 MiB block,
//! events and the semaphore READ/SET/INCR/DECR windows sit at the V2 offsets; the DMA engines'
//! tail-increment registers use the UDMA per-queue offsets (TX `+0x1038 + q·0x1000`, RX
//! `+0x21038 + q·0x1000`) from a simulator-defined engine base `0x100_0000 + e·0x4_0000`.

use serde::{Deserialize, Serialize};
use std::ops::Range;

/// Base of the register window (NC 0's TPB block).
pub const REG_WINDOW_BASE: u64 = 0x0FFF_C000_0000;
/// Bytes between two NCs' register blocks (64 MiB, the TPB window).
pub const REG_NC_STRIDE: u64 = 0x400_0000;
/// Offset of the event registers in an NC block (4 bytes each).
pub const REG_EVENTS: u64 = 0x270_0000;
/// Offset of the semaphore READ window (reads return the value).
pub const REG_SEM_READ: u64 = 0x270_1000;
/// Offset of the semaphore SET window (a write sets the value).
pub const REG_SEM_SET: u64 = 0x270_1400;
/// Offset of the semaphore INCR window (a write adds the value, atomically).
pub const REG_SEM_INCR: u64 = 0x270_1800;
/// Offset of the semaphore DECR window (a write subtracts the value, atomically).
pub const REG_SEM_DECR: u64 = 0x270_1C00;
/// Offset of DMA engine 0 in an NC block (simulator-defined).
pub const REG_DMA_ENGINES: u64 = 0x100_0000;
/// Bytes between two DMA engines' register blocks.
pub const REG_DMA_ENGINE_STRIDE: u64 = 0x4_0000;
/// Offset of an M2S (TX) queue's DRTP_INC register in its engine, for queue 0.
pub const REG_TX_TAIL_INC: u64 = 0x1038;
/// Offset of an S2M (RX) queue's DRTP_INC register in its engine, for queue 0.
pub const REG_RX_TAIL_INC: u64 = 0x2_1038;
/// Bytes between two queues' register groups in an engine.
pub const REG_DMA_QUEUE_STRIDE: u64 = 0x1000;
/// Offset of the sequencer DMEM window in an NC block ([`crate::sequencer::SEQ_DMEM_SIZE`]
/// bytes; DMA may write any bytes of it).
pub const REG_SEQ_DMEM: u64 = 0x280_0000;
/// Offset of the SBUF DMA window in an NC block: partition `p` at `+ p · REG_SBUF_STRIDE`, each
/// [`crate::isa::SBUF_PARTITION_BYTES`] long (one DMA descriptor stays inside one partition).
pub const REG_SBUF: u64 = 0x300_0000;
/// Bytes between two partitions in the SBUF window.
pub const REG_SBUF_STRIDE: u64 = 0x2_0000;
/// Size of the semaphore/event window a claiming client maps read-only: events at +0,
/// semaphore values at [`SEM_WINDOW_SEMAPHORES`] (the RESOURCE_MMAP_INFO SEMAPHORE layout).
pub const SEM_WINDOW_SIZE: usize = 0x2000;
/// Offset of the semaphore values in the mapped semaphore window.
pub const SEM_WINDOW_SEMAPHORES: usize = 0x1000;
/// Bytes of host-visible address space simdev hands out (64 GiB of PA space; backing memory is
/// only what clients allocate).
pub const HOST_WINDOW_SIZE: u64 = 1 << 36;
/// Allocation granule: every chunk's size is rounded up to 4 KiB, as the driver does.
pub const CHUNK_GRANULE: u64 = 4096;

/// The emulated device generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Arch {
    /// Trainium1 (V2): 2 NCs.
    Trn1,
    /// Inferentia2 (V2): 2 NCs.
    Inf2,
    /// Trainium2 (V3): 8 NCs.
    Trn2,
}

impl Arch {
    /// Parses `trn1`, `inf2` or `trn2`.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "trn1" => Some(Self::Trn1),
            "inf2" => Some(Self::Inf2),
            "trn2" => Some(Self::Trn2),
            _ => None,
        }
    }

    /// The lower-case name (`trn1`, `inf2`, `trn2`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Trn1 => "trn1",
            Self::Inf2 => "inf2",
            Self::Trn2 => "trn2",
        }
    }

    /// The driver's architecture number (DEVICE_BASIC_INFO): 2 for V2, 3 for V3.
    pub const fn version(self) -> u32 {
        match self {
            Self::Trn1 | Self::Inf2 => 2,
            Self::Trn2 => 3,
        }
    }

    /// The arch of a driver architecture number, as the hardware backend sees it.
    pub const fn from_version(version: u32) -> Option<Self> {
        match version {
            2 => Some(Self::Trn1),
            3 => Some(Self::Trn2),
            _ => None,
        }
    }

    /// Physical NCs per device (driver-abi.md §5).
    pub const fn default_nc_count(self) -> u32 {
        match self {
            Self::Trn1 | Self::Inf2 => 2,
            Self::Trn2 => 8,
        }
    }

    /// NCs sharing one HBM stack (driver-abi.md §5): NC `n` is on stack `n / ncs_per_hbm` —
    /// one per stack on V2, two on V3 (4 stacks for 8 NCs).
    pub const fn ncs_per_hbm(self) -> u32 {
        match self {
            Self::Trn1 | Self::Inf2 => 1,
            Self::Trn2 => 2,
        }
    }

    /// Semaphores per NC (256 on V2/V3).
    pub const fn semaphores_per_nc(self) -> u32 {
        256
    }

    /// Events per NC (256).
    pub const fn events_per_nc(self) -> u32 {
        256
    }

    /// DMA engines per NC (16 on V2/V3).
    pub const fn dma_engines_per_nc(self) -> u32 {
        16
    }

    /// Queues per DMA engine (16).
    pub const fn dma_queues_per_engine(self) -> u32 {
        16
    }

    /// HBM bytes per physical NC on silicon (`reference/driver-abi.md` §5): trn1 and inf2
    /// have 2 HBM stacks of 16 GiB for 2 NCs (16 GiB each), trn2 4 stacks totalling 96 GiB
    /// for 8 NCs (12 GiB each). simdev's default device size.
    pub const fn hbm_bytes_per_nc(self) -> u64 {
        match self {
            Self::Trn1 | Self::Inf2 => 16 << 30,
            Self::Trn2 => 12 << 30,
        }
    }

    /// Base PA of NC 0's HBM in simdev (non-zero on every arch).
    pub const fn hbm_base(self) -> u64 {
        match self {
            Self::Trn1 | Self::Inf2 => 0x10_0000_0000,
            Self::Trn2 => 0x40_0000_0000,
        }
    }

    /// Base PA of host-visible memory: the arch's PCIe host base.
    pub const fn host_base(self) -> u64 {
        match self {
            Self::Trn1 | Self::Inf2 => 0x1000_0000_0000,
            Self::Trn2 => 0x4000_0000_0000,
        }
    }
}

/// A register in the window, decoded from its PA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Register {
    /// An event register: a write sets it.
    Event {
        /// NC index.
        nc: u32,
        /// Event index.
        index: u32,
    },
    /// A semaphore's READ window (writes are ignored by hardware; simdev refuses them).
    SemaphoreRead {
        /// NC index.
        nc: u32,
        /// Semaphore index.
        index: u32,
    },
    /// A semaphore's SET window.
    SemaphoreSet {
        /// NC index.
        nc: u32,
        /// Semaphore index.
        index: u32,
    },
    /// A semaphore's INCR window.
    SemaphoreIncrement {
        /// NC index.
        nc: u32,
        /// Semaphore index.
        index: u32,
    },
    /// A semaphore's DECR window.
    SemaphoreDecrement {
        /// NC index.
        nc: u32,
        /// Semaphore index.
        index: u32,
    },
    /// A DMA queue's TX (M2S) tail-increment register.
    TxTailIncrement {
        /// NC index.
        nc: u32,
        /// Engine on the NC.
        engine: u32,
        /// Queue on the engine.
        queue: u32,
    },
    /// A DMA queue's RX (S2M) tail-increment register.
    RxTailIncrement {
        /// NC index.
        nc: u32,
        /// Engine on the NC.
        engine: u32,
        /// Queue on the engine.
        queue: u32,
    },
}

/// The layout of one simulated device's PA space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddressMap {
    /// The arch (fixes the bases).
    pub arch: Arch,
    /// Number of NCs.
    pub nc_count: u32,
    /// HBM bytes per NC.
    pub hbm_bytes_per_nc: u64,
}

impl AddressMap {
    /// Bytes between two NCs' HBM ranges: the HBM size rounded up to a power of two, at least
    /// 1 GiB, so NC boundaries are easy to read in a PA.
    pub const fn hbm_stride(&self) -> u64 {
        let s = self.hbm_bytes_per_nc.next_power_of_two();
        if s < (1 << 30) { 1 << 30 } else { s }
    }

    /// The PA range of NC `nc`'s HBM.
    pub const fn hbm_range(&self, nc: u32) -> Range<u64> {
        let start = self.arch.hbm_base() + nc as u64 * self.hbm_stride();
        start..start + self.hbm_bytes_per_nc
    }

    /// The PA range of host-visible memory.
    pub const fn host_range(&self) -> Range<u64> {
        let start = self.arch.host_base();
        start..start + HOST_WINDOW_SIZE
    }

    /// The PA range of the whole register window.
    #[inline]
    pub const fn register_range(&self) -> Range<u64> {
        REG_WINDOW_BASE..REG_WINDOW_BASE + self.nc_count as u64 * REG_NC_STRIDE
    }

    /// The NC whose HBM holds `pa`, if any.
    pub fn hbm_nc_of(&self, pa: u64) -> Option<u32> {
        (0..self.nc_count).find(|&nc| self.hbm_range(nc).contains(&pa))
    }

    /// The PA of `reg` (no range check of its indices: use [`AddressMap::decode_register`] on
    /// untrusted input).
    pub fn register_address(&self, reg: Register) -> u64 {
        let nc_base = |nc: u32| REG_WINDOW_BASE + u64::from(nc) * REG_NC_STRIDE;
        let dma = |nc: u32, engine: u32, queue: u32, off: u64| {
            nc_base(nc)
                + REG_DMA_ENGINES
                + u64::from(engine) * REG_DMA_ENGINE_STRIDE
                + off
                + u64::from(queue) * REG_DMA_QUEUE_STRIDE
        };
        match reg {
            Register::Event { nc, index } => nc_base(nc) + REG_EVENTS + 4 * u64::from(index),
            Register::SemaphoreRead { nc, index } => {
                nc_base(nc) + REG_SEM_READ + 4 * u64::from(index)
            }
            Register::SemaphoreSet { nc, index } => {
                nc_base(nc) + REG_SEM_SET + 4 * u64::from(index)
            }
            Register::SemaphoreIncrement { nc, index } => {
                nc_base(nc) + REG_SEM_INCR + 4 * u64::from(index)
            }
            Register::SemaphoreDecrement { nc, index } => {
                nc_base(nc) + REG_SEM_DECR + 4 * u64::from(index)
            }
            Register::TxTailIncrement { nc, engine, queue } => {
                dma(nc, engine, queue, REG_TX_TAIL_INC)
            }
            Register::RxTailIncrement { nc, engine, queue } => {
                dma(nc, engine, queue, REG_RX_TAIL_INC)
            }
        }
    }

    /// The PA of byte `offset` of NC `nc`'s sequencer DMEM.
    pub fn dmem_address(&self, nc: u32, offset: u64) -> u64 {
        REG_WINDOW_BASE + u64::from(nc) * REG_NC_STRIDE + REG_SEQ_DMEM + offset
    }

    /// The PA of byte `offset` of SBUF partition `partition` of NC `nc` (the SBUF DMA window).
    pub fn sbuf_address(&self, nc: u32, partition: u32, offset: u64) -> u64 {
        REG_WINDOW_BASE
            + u64::from(nc) * REG_NC_STRIDE
            + REG_SBUF
            + u64::from(partition) * REG_SBUF_STRIDE
            + offset
    }

    /// Decodes `pa..pa+len` as a range inside one SBUF partition of an existing NC:
    /// `(nc, partition, offset)`; `None` when it is not in the window or crosses a partition's
    /// end.
    #[inline]
    pub fn decode_sbuf(&self, pa: u64, len: u64) -> Option<(u32, u32, u64)> {
        if !self.register_range().contains(&pa) {
            return None;
        }
        let rel = pa - REG_WINDOW_BASE;
        let nc = u32::try_from(rel / REG_NC_STRIDE).ok()?;
        let off = (rel % REG_NC_STRIDE).checked_sub(REG_SBUF)?;
        let partition = u32::try_from(off / REG_SBUF_STRIDE).ok()?;
        let offset = off % REG_SBUF_STRIDE;
        let end = offset.checked_add(len)?;
        (partition < crate::isa::SBUF_PARTITIONS
            && end <= u64::from(crate::isa::SBUF_PARTITION_BYTES))
        .then_some((nc, partition, offset))
    }

    /// Decodes `pa..pa+len` as a range inside one NC's sequencer DMEM: `(nc, offset)`, or
    /// `None` when any byte falls outside the DMEM of an existing NC.
    #[inline]
    pub fn decode_dmem(&self, pa: u64, len: u64) -> Option<(u32, u64)> {
        if !self.register_range().contains(&pa) {
            return None;
        }
        let rel = pa - REG_WINDOW_BASE;
        let nc = u32::try_from(rel / REG_NC_STRIDE).ok()?;
        let off = (rel % REG_NC_STRIDE).checked_sub(REG_SEQ_DMEM)?;
        let end = off.checked_add(len)?;
        (end <= crate::sequencer::SEQ_DMEM_SIZE).then_some((nc, off))
    }

    /// Decodes the 4-byte register at `pa`; `None` when `pa` is outside the window, unaligned,
    /// or names no register (an index past the arch's counts included).
    #[inline]
    pub fn decode_register(&self, pa: u64) -> Option<Register> {
        if !self.register_range().contains(&pa) || !pa.is_multiple_of(4) {
            return None;
        }
        let rel = pa - REG_WINDOW_BASE;
        let nc = u32::try_from(rel / REG_NC_STRIDE).ok()?;
        let off = rel % REG_NC_STRIDE;
        let sems = u64::from(self.arch.semaphores_per_nc());
        let window = |base: u64, count: u64| -> Option<u32> {
            if off >= base && off < base + 4 * count {
                u32::try_from((off - base) / 4).ok()
            } else {
                None
            }
        };
        if let Some(index) = window(REG_EVENTS, u64::from(self.arch.events_per_nc())) {
            return Some(Register::Event { nc, index });
        }
        if let Some(index) = window(REG_SEM_READ, sems) {
            return Some(Register::SemaphoreRead { nc, index });
        }
        if let Some(index) = window(REG_SEM_SET, sems) {
            return Some(Register::SemaphoreSet { nc, index });
        }
        if let Some(index) = window(REG_SEM_INCR, sems) {
            return Some(Register::SemaphoreIncrement { nc, index });
        }
        if let Some(index) = window(REG_SEM_DECR, sems) {
            return Some(Register::SemaphoreDecrement { nc, index });
        }
        let engines = u64::from(self.arch.dma_engines_per_nc());
        if off >= REG_DMA_ENGINES && off < REG_DMA_ENGINES + engines * REG_DMA_ENGINE_STRIDE {
            let engine = u32::try_from((off - REG_DMA_ENGINES) / REG_DMA_ENGINE_STRIDE).ok()?;
            let in_engine = (off - REG_DMA_ENGINES) % REG_DMA_ENGINE_STRIDE;
            let queues = u64::from(self.arch.dma_queues_per_engine());
            for (base, tx) in [(REG_TX_TAIL_INC, true), (REG_RX_TAIL_INC, false)] {
                if in_engine >= base
                    && (in_engine - base).is_multiple_of(REG_DMA_QUEUE_STRIDE)
                    && (in_engine - base) / REG_DMA_QUEUE_STRIDE < queues
                {
                    let queue = u32::try_from((in_engine - base) / REG_DMA_QUEUE_STRIDE).ok()?;
                    return Some(if tx {
                        Register::TxTailIncrement { nc, engine, queue }
                    } else {
                        Register::RxTailIncrement { nc, engine, queue }
                    });
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trn1() -> AddressMap {
        AddressMap {
            arch: Arch::Trn1,
            nc_count: 2,
            hbm_bytes_per_nc: 256 << 20,
        }
    }

    #[test]
    fn hbm_starts_at_a_non_zero_base_and_ncs_do_not_overlap() {
        let map = trn1();
        assert_eq!(map.hbm_range(0), 0x10_0000_0000..0x10_1000_0000);
        assert_eq!(map.hbm_range(1).start, 0x10_4000_0000);
        assert_eq!(map.hbm_nc_of(0x10_4000_0010), Some(1));
        assert_eq!(map.hbm_nc_of(0x1000), None, "a raw offset is not HBM");
        let trn2 = AddressMap {
            arch: Arch::Trn2,
            nc_count: 8,
            hbm_bytes_per_nc: 256 << 20,
        };
        assert_eq!(trn2.hbm_range(0).start, 0x40_0000_0000);
    }

    #[test]
    fn every_arch_at_its_real_hbm_size_and_eight_ncs_fits_below_the_register_window() {
        assert_eq!(Arch::Trn1.hbm_bytes_per_nc(), 16 << 30);
        assert_eq!(Arch::Inf2.hbm_bytes_per_nc(), 16 << 30);
        assert_eq!(Arch::Trn2.hbm_bytes_per_nc(), 12 << 30);
        for arch in [Arch::Trn1, Arch::Inf2, Arch::Trn2] {
            let map = AddressMap {
                arch,
                nc_count: 8,
                hbm_bytes_per_nc: arch.hbm_bytes_per_nc(),
            };
            assert_eq!(
                map.hbm_stride(),
                16 << 30,
                "{arch:?}: 12 GiB rounds up to 16"
            );
            let last = map.hbm_range(7);
            assert_eq!(last.end - last.start, arch.hbm_bytes_per_nc());
            assert!(
                map.hbm_range(6).end <= last.start,
                "{arch:?}: NC ranges do not overlap"
            );
            assert!(
                last.end <= REG_WINDOW_BASE && last.end <= map.host_range().start,
                "{arch:?}: NC 7's HBM ends at {:#x}, inside the register window or host memory",
                last.end
            );
            assert_eq!(map.hbm_nc_of(last.end - 1), Some(7));
        }
        let trn2 = AddressMap {
            arch: Arch::Trn2,
            nc_count: 8,
            hbm_bytes_per_nc: Arch::Trn2.hbm_bytes_per_nc(),
        };
        assert_eq!(trn2.hbm_range(7), 0x5C_0000_0000..0x5F_0000_0000);
    }

    #[test]
    fn semaphore_windows_follow_the_v2_tpb_layout() {
        let map = trn1();
        // driver-abi.md §4: V2 NC1 semaphore 5 increment is TPB base + nc·0x400_0000 + 0x270_1814.
        let pa = map.register_address(Register::SemaphoreIncrement { nc: 1, index: 5 });
        assert_eq!(pa, 0x0FFF_C000_0000 + 0x400_0000 + 0x270_1814);
        assert_eq!(
            map.decode_register(pa),
            Some(Register::SemaphoreIncrement { nc: 1, index: 5 })
        );
    }

    #[test]
    fn every_register_round_trips() {
        let map = trn1();
        let regs = [
            Register::Event { nc: 0, index: 255 },
            Register::SemaphoreRead { nc: 1, index: 0 },
            Register::SemaphoreSet { nc: 1, index: 7 },
            Register::SemaphoreDecrement { nc: 0, index: 255 },
            Register::TxTailIncrement {
                nc: 1,
                engine: 15,
                queue: 15,
            },
            Register::RxTailIncrement {
                nc: 0,
                engine: 3,
                queue: 2,
            },
        ];
        for reg in regs {
            assert_eq!(
                map.decode_register(map.register_address(reg)),
                Some(reg),
                "{reg:?}"
            );
        }
    }

    #[test]
    fn tail_increment_registers_use_udma_queue_offsets() {
        let map = trn1();
        let base = REG_WINDOW_BASE + REG_DMA_ENGINES + 2 * REG_DMA_ENGINE_STRIDE;
        let tx = map.register_address(Register::TxTailIncrement {
            nc: 0,
            engine: 2,
            queue: 3,
        });
        let rx = map.register_address(Register::RxTailIncrement {
            nc: 0,
            engine: 2,
            queue: 3,
        });
        assert_eq!(tx, base + 0x1038 + 3 * 0x1000);
        assert_eq!(rx, base + 0x21038 + 3 * 0x1000);
    }

    #[test]
    fn holes_and_out_of_range_indices_are_not_registers() {
        let map = trn1();
        assert_eq!(
            map.decode_register(REG_WINDOW_BASE),
            None,
            "offset 0 is a hole"
        );
        assert_eq!(
            map.decode_register(REG_WINDOW_BASE + REG_EVENTS + 2),
            None,
            "unaligned"
        );
        let nc2 = REG_WINDOW_BASE + 2 * REG_NC_STRIDE + REG_EVENTS;
        assert_eq!(
            map.decode_register(nc2),
            None,
            "NC 2 does not exist on a 2-NC device"
        );
        let engine16 = REG_WINDOW_BASE + REG_DMA_ENGINES + 16 * REG_DMA_ENGINE_STRIDE + 0x1038;
        assert_eq!(map.decode_register(engine16), None);
        let between = REG_WINDOW_BASE + REG_DMA_ENGINES + 0x1040;
        assert_eq!(map.decode_register(between), None);
    }

    #[test]
    fn dmem_ranges_decode_only_inside_the_window() {
        let map = trn1();
        let pa = map.dmem_address(1, 0);
        assert_eq!(map.decode_dmem(pa, 52), Some((1, 0)));
        assert_eq!(map.decode_dmem(pa + 4092, 4), Some((1, 4092)));
        assert_eq!(map.decode_dmem(pa + 4093, 4), None, "runs past the window");
        assert_eq!(map.decode_dmem(pa - 4, 4), None);
        assert_eq!(map.decode_register(pa), None, "DMEM is not a register");
    }

    #[test]
    fn sbuf_ranges_stay_inside_one_partition() {
        let map = trn1();
        let pa = map.sbuf_address(1, 127, 0);
        assert_eq!(map.decode_sbuf(pa, 65536), Some((1, 127, 0)));
        assert_eq!(map.decode_sbuf(pa + 100, 65436), Some((1, 127, 100)));
        assert_eq!(
            map.decode_sbuf(pa + 100, 65437),
            None,
            "crosses the partition's end"
        );
        assert_eq!(
            map.decode_sbuf(map.sbuf_address(0, 3, 0), 4),
            Some((0, 3, 0))
        );
        assert_eq!(map.decode_register(pa), None);
        assert_eq!(map.decode_dmem(pa, 4), None);
    }

    #[test]
    fn regions_are_disjoint() {
        let map = AddressMap {
            arch: Arch::Trn2,
            nc_count: 8,
            hbm_bytes_per_nc: 8 << 30,
        };
        let hbm_end = map.hbm_range(7).end;
        assert!(hbm_end <= map.register_range().start);
        assert!(map.register_range().end <= map.host_range().start);
    }
}
