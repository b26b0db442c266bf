//! UDMA descriptors: the 16-byte entries of the M2S (TX) and S2M (RX) rings
//! (`reference/driver-abi.md` §2).
//!
//! A memory-to-memory copy is a TX descriptor (source) paired with an RX descriptor
//! (destination) of the same length, at the same index pass of the same queue's two rings.
//! [`m2m_copy_descriptors`] builds such a pair (the equivalent of the driver's
//! `al_udma_m2m_build_copy_descriptor`); [`UdmaDesc::decode_tx`] and [`UdmaDesc::decode_rx`]
//! check a descriptor read from untrusted ring memory and return a typed [`DescError`].

use thiserror::Error;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Bytes per descriptor.
pub const UDMA_DESC_SIZE: usize = 16;
/// Largest transfer one descriptor can carry, in bytes (`MAX_DMA_DESC_SIZE`); encoded as 0.
pub const MAX_DESC_LEN: u32 = 65536;

/// `len_ctrl` bits 15:0: the length in bytes, 0 meaning 65536.
pub const LEN_CTRL_LEN_MASK: u32 = 0x0000_FFFF;
/// `len_ctrl` bits 25:24: the ring id (phase) of the pass that wrote the descriptor.
pub const LEN_CTRL_RING_ID_MASK: u32 = 0x0300_0000;
/// Shift of the ring id in `len_ctrl`.
pub const LEN_CTRL_RING_ID_SHIFT: u32 = 24;
/// `len_ctrl` bit 26: FIRST descriptor of a packet (TX).
pub const LEN_CTRL_FIRST: u32 = 1 << 26;
/// `len_ctrl` bit 27: LAST descriptor of a packet (TX).
pub const LEN_CTRL_LAST: u32 = 1 << 27;
/// `len_ctrl` bit 28: interrupt on completion (never set by the driver).
pub const LEN_CTRL_INT_EN: u32 = 1 << 28;
/// `len_ctrl` bit 30: data memory barrier (V1 barrier; TX only).
pub const LEN_CTRL_DMB: u32 = 1 << 30;
/// Bits of `len_ctrl` with a defined meaning; any other bit set is malformed.
pub const LEN_CTRL_DEFINED: u32 = LEN_CTRL_LEN_MASK
    | LEN_CTRL_RING_ID_MASK
    | LEN_CTRL_FIRST
    | LEN_CTRL_LAST
    | LEN_CTRL_INT_EN
    | LEN_CTRL_DMB;

/// The driver's default TX `meta_ctrl`: first+last block, copy source data, ssmae op 2.
pub const TX_META_CTRL_DEFAULT: u32 = 0x0108_0003;
/// `meta_ctrl` bit 26: write barrier (V2/V3).
pub const TX_META_CTRL_WRITE_BARRIER: u32 = 1 << 26;
/// The default TX `meta_ctrl` with the write barrier set.
pub const TX_META_CTRL_DEFAULT_BARRIER: u32 = TX_META_CTRL_DEFAULT | TX_META_CTRL_WRITE_BARRIER;

/// Smallest DMA ring the driver accepts, in descriptors (`driver-abi.md` §2.5).
pub const MIN_RING_DESCS: u32 = 32;
/// Largest DMA ring the driver accepts, in descriptors: 2^24 − 16 (`driver-abi.md` §2.5).
/// Also the largest tail increment DMA_QUEUE_COPY_START accepts.
pub const MAX_RING_DESCS: u32 = (1 << 24) - 16;
/// Ring sizes are a multiple of this many descriptors (start and end 256-byte aligned).
pub const RING_DESC_MULTIPLE: u32 = 16;

/// The driver's ring-size rule for DMA_QUEUE_INIT (`driver-abi.md` §2.5): a ring of `count`
/// descriptors is accepted when [`MIN_RING_DESCS`] ≤ `count` ≤ [`MAX_RING_DESCS`] and `count`
/// is a multiple of [`RING_DESC_MULTIPLE`]. The runtime checks it before asking, the kernel
/// backend before the ioctl, and simdev when it is asked.
pub const fn is_valid_ring_size(count: u32) -> bool {
    count >= MIN_RING_DESCS && count <= MAX_RING_DESCS && count.is_multiple_of(RING_DESC_MULTIPLE)
}

/// The smallest ring size that holds `descs` descriptors and follows the size rule's lower
/// bound and multiple: `descs` rounded up to a multiple of [`RING_DESC_MULTIPLE`], at least
/// [`MIN_RING_DESCS`]. Check the result with [`is_valid_ring_size`] for the upper bound (it
/// saturates to `u32::MAX`, which the rule rejects).
pub const fn ring_size_for(descs: u32) -> u32 {
    match descs.checked_next_multiple_of(RING_DESC_MULTIPLE) {
        Some(n) if n < MIN_RING_DESCS => MIN_RING_DESCS,
        Some(n) => n,
        None => u32::MAX,
    }
}

/// One DMA queue of the device: (NC, engine on the NC, queue on the engine). The runtime's
/// backends name queues with it, and simdev its queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DmaQueueId {
    /// NC index.
    pub nc: u32,
    /// Engine on the NC, `0..dma_engines_per_nc`.
    pub engine: u32,
    /// Queue on the engine, `0..dma_queues_per_engine`.
    pub queue: u32,
}

impl std::fmt::Display for DmaQueueId {
    /// `NC 0 engine 1 queue 0`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "NC {} engine {} queue {}",
            self.nc, self.engine, self.queue
        )
    }
}

/// Ring id (phase) of a ring pass: 2 bits, starting at 1 and advancing 1, 2, 3, 0, 1, … each
/// time the slot at index size−1 has been used (`driver-abi.md` §2.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RingId(u8);

impl RingId {
    /// The ring id software starts with.
    pub const INITIAL: RingId = RingId(1);

    /// A ring id from its 2-bit value; `None` above 3.
    pub const fn new(value: u8) -> Option<Self> {
        if value <= 3 {
            Some(RingId(value))
        } else {
            None
        }
    }

    /// The 2-bit value.
    pub const fn value(self) -> u8 {
        self.0
    }

    /// The ring id of the next pass (modulo 4).
    pub const fn next(self) -> Self {
        RingId((self.0 + 1) & 3)
    }
}

/// Which ring a descriptor was read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// M2S: memory to stream, the source side.
    Tx,
    /// S2M: stream to memory, the destination side.
    Rx,
}

/// A descriptor that a decoder refused. Every variant names the rule the writer broke.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum DescError {
    /// The descriptor's ring id is not the pass the engine expects: a stale or future slot.
    #[error("{dir:?} descriptor carries ring id {found}, the ring is on pass {expected}")]
    StaleRingId {
        /// Ring being read.
        dir: Direction,
        /// Ring id the engine expects for this pass.
        expected: u8,
        /// Ring id found in `len_ctrl`.
        found: u8,
    },
    /// `len_ctrl` has bits set that the hardware does not define.
    #[error("{dir:?} descriptor len_ctrl {len_ctrl:#010x} sets undefined bits {bits:#010x}")]
    ReservedBits {
        /// Ring being read.
        dir: Direction,
        /// The whole word.
        len_ctrl: u32,
        /// The undefined bits that are set.
        bits: u32,
    },
    /// A TX descriptor without both FIRST and LAST: this device only takes one-descriptor packets.
    #[error("TX descriptor len_ctrl {len_ctrl:#010x} is not a whole packet (FIRST|LAST)")]
    NotWholePacket {
        /// The whole word.
        len_ctrl: u32,
    },
    /// A TX `meta_ctrl` other than the driver's copy operation (with or without write barrier).
    #[error(
        "TX descriptor meta_ctrl {meta_ctrl:#010x} is not a copy (expected {TX_META_CTRL_DEFAULT:#010x})"
    )]
    UnsupportedMetaCtrl {
        /// The word found.
        meta_ctrl: u32,
    },
    /// An RX descriptor whose second word (`buf2_ptr_lo`) is not zero.
    #[error("RX descriptor buf2_ptr_lo {word1:#010x} must be 0")]
    NonZeroBuf2 {
        /// The word found.
        word1: u32,
    },
    /// The buffer wraps around the 64-bit address space.
    #[error("{dir:?} descriptor buffer {addr:#x}+{len} wraps the address space")]
    AddressOverflow {
        /// Ring being read.
        dir: Direction,
        /// Buffer address.
        addr: u64,
        /// Length in bytes.
        len: u32,
    },
    /// TX and RX descriptors of one pair disagree on the length.
    #[error("TX length {tx} bytes != RX length {rx} bytes")]
    LengthMismatch {
        /// TX length in bytes.
        tx: u32,
        /// RX length in bytes.
        rx: u32,
    },
    /// A copy builder was asked for 0 bytes or more than 65536 bytes.
    #[error("descriptor length {0} bytes is outside 1..=65536")]
    BadLength(u64),
}

/// A UDMA descriptor (16 bytes, little-endian, 16-byte aligned in its ring). Word 1 is
/// `meta_ctrl` in the TX view and `buf2_ptr_lo` (always 0) in the RX view; bytes 8..16 are the
/// TX source (`buf_ptr`) or the RX destination (`buf1_ptr`), a device address.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct UdmaDesc {
    len_ctrl: u32,
    word1: u32,
    buf_ptr: u64,
}

const _: () = assert!(std::mem::size_of::<UdmaDesc>() == UDMA_DESC_SIZE);

/// A decoded TX (source) descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxDesc {
    /// Source device address.
    pub src: u64,
    /// Length in bytes, 1..=65536.
    pub len: u32,
    /// Whether the write barrier (V2/V3 `meta_ctrl` bit 26) or DMB (V1) is set.
    pub barrier: bool,
}

/// A decoded RX (destination) descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RxDesc {
    /// Destination device address.
    pub dst: u64,
    /// Length in bytes, 1..=65536.
    pub len: u32,
    /// Whether INT_EN is set.
    pub int_en: bool,
}

fn encode_len(len: u32) -> u32 {
    if len == MAX_DESC_LEN {
        0
    } else {
        len & LEN_CTRL_LEN_MASK
    }
}

fn decode_len(len_ctrl: u32) -> u32 {
    match len_ctrl & LEN_CTRL_LEN_MASK {
        0 => MAX_DESC_LEN,
        n => n,
    }
}

impl UdmaDesc {
    /// A descriptor from its three raw words.
    pub const fn from_raw(len_ctrl: u32, word1: u32, buf_ptr: u64) -> Self {
        Self {
            len_ctrl,
            word1,
            buf_ptr,
        }
    }

    /// A descriptor from 16 little-endian bytes.
    pub fn from_le_bytes(bytes: [u8; UDMA_DESC_SIZE]) -> Self {
        Self::read_from_bytes(&bytes).unwrap_or_default()
    }

    /// The 16 little-endian bytes of the descriptor.
    pub fn to_le_bytes(&self) -> [u8; UDMA_DESC_SIZE] {
        let mut out = [0u8; UDMA_DESC_SIZE];
        out.copy_from_slice(self.as_bytes());
        out
    }

    /// The raw `len_ctrl` word.
    pub const fn len_ctrl(&self) -> u32 {
        self.len_ctrl
    }

    /// Word 1: `meta_ctrl` (TX) or `buf2_ptr_lo` (RX).
    pub const fn word1(&self) -> u32 {
        self.word1
    }

    /// Bytes 8..16: `buf_ptr` (TX source) or `buf1_ptr` (RX destination).
    pub const fn buf_ptr(&self) -> u64 {
        self.buf_ptr
    }

    /// The ring id carried in `len_ctrl[25:24]`.
    pub const fn ring_id(&self) -> RingId {
        RingId(((self.len_ctrl & LEN_CTRL_RING_ID_MASK) >> LEN_CTRL_RING_ID_SHIFT) as u8)
    }

    /// This descriptor with its ring id (`len_ctrl[25:24]`) set to `ring_id` and every other
    /// bit unchanged: the one field that depends on where in the ring the descriptor lands.
    /// A descriptor encoded before its ring position is known is patched with it on append.
    #[must_use]
    pub const fn with_ring_id(self, ring_id: RingId) -> Self {
        let rid = (ring_id.0 as u32) << LEN_CTRL_RING_ID_SHIFT;
        Self {
            len_ctrl: (self.len_ctrl & !LEN_CTRL_RING_ID_MASK) | rid,
            ..self
        }
    }

    /// The length in bytes (1..=65536).
    pub fn len(&self) -> u32 {
        decode_len(self.len_ctrl)
    }

    /// Always false: a descriptor's length field cannot encode 0 bytes (0 means 65536).
    pub const fn is_empty(&self) -> bool {
        false
    }

    #[inline]
    fn check_common(&self, dir: Direction, expected: RingId) -> Result<u32, DescError> {
        let undefined = self.len_ctrl & !LEN_CTRL_DEFINED;
        if undefined != 0 {
            return Err(DescError::ReservedBits {
                dir,
                len_ctrl: self.len_ctrl,
                bits: undefined,
            });
        }
        let found = self.ring_id();
        if found != expected {
            return Err(DescError::StaleRingId {
                dir,
                expected: expected.value(),
                found: found.value(),
            });
        }
        let len = self.len();
        if self.buf_ptr.checked_add(u64::from(len)).is_none() {
            return Err(DescError::AddressOverflow {
                dir,
                addr: self.buf_ptr,
                len,
            });
        }
        Ok(len)
    }

    /// Decodes this descriptor as a TX (M2S) copy source read on ring pass `expected`.
    ///
    /// # Errors
    /// [`DescError`] naming the first rule broken: undefined `len_ctrl` bits, a stale ring id, a
    /// partial packet (FIRST and LAST both required), a `meta_ctrl` other than the copy
    /// operation, or a buffer that wraps the address space.
    #[inline]
    pub fn decode_tx(&self, expected: RingId) -> Result<TxDesc, DescError> {
        let len = self.check_common(Direction::Tx, expected)?;
        if self.len_ctrl & (LEN_CTRL_FIRST | LEN_CTRL_LAST) != LEN_CTRL_FIRST | LEN_CTRL_LAST {
            return Err(DescError::NotWholePacket {
                len_ctrl: self.len_ctrl,
            });
        }
        if self.word1 != TX_META_CTRL_DEFAULT && self.word1 != TX_META_CTRL_DEFAULT_BARRIER {
            return Err(DescError::UnsupportedMetaCtrl {
                meta_ctrl: self.word1,
            });
        }
        let barrier =
            self.word1 & TX_META_CTRL_WRITE_BARRIER != 0 || self.len_ctrl & LEN_CTRL_DMB != 0;
        Ok(TxDesc {
            src: self.buf_ptr,
            len,
            barrier,
        })
    }

    /// Decodes this descriptor as an RX (S2M) copy destination read on ring pass `expected`.
    ///
    /// # Errors
    /// [`DescError`]: undefined `len_ctrl` bits (FIRST/LAST/DMB are TX-only and count as
    /// undefined here), a stale ring id, a non-zero `buf2_ptr_lo`, or a wrapping buffer.
    #[inline]
    pub fn decode_rx(&self, expected: RingId) -> Result<RxDesc, DescError> {
        let tx_only = self.len_ctrl & (LEN_CTRL_FIRST | LEN_CTRL_LAST | LEN_CTRL_DMB);
        if tx_only != 0 {
            return Err(DescError::ReservedBits {
                dir: Direction::Rx,
                len_ctrl: self.len_ctrl,
                bits: tx_only,
            });
        }
        let len = self.check_common(Direction::Rx, expected)?;
        if self.word1 != 0 {
            return Err(DescError::NonZeroBuf2 { word1: self.word1 });
        }
        Ok(RxDesc {
            dst: self.buf_ptr,
            len,
            int_en: self.len_ctrl & LEN_CTRL_INT_EN != 0,
        })
    }
}

/// Builds the TX/RX descriptor pair of one M2M copy chunk (≤ 64 KiB), as the driver's
/// `al_udma_m2m_build_copy_descriptor` does: TX `len_ctrl` = FIRST|LAST|ring_id<<24|len with
/// the default `meta_ctrl` (write-barrier bit when `write_barrier`), RX `len_ctrl` =
/// ring_id<<24|len with word 1 zero. Both sides carry the same length.
///
/// # Errors
/// [`DescError::BadLength`] when `len` is 0 or above 65536 bytes.
pub fn m2m_copy_descriptors(
    src: u64,
    dst: u64,
    len: u64,
    ring_id: RingId,
    write_barrier: bool,
) -> Result<(UdmaDesc, UdmaDesc), DescError> {
    if len == 0 || len > u64::from(MAX_DESC_LEN) {
        return Err(DescError::BadLength(len));
    }
    let len = encode_len(u32::try_from(len).map_err(|_| DescError::BadLength(len))?);
    let rid = u32::from(ring_id.value()) << LEN_CTRL_RING_ID_SHIFT;
    let meta = if write_barrier {
        TX_META_CTRL_DEFAULT_BARRIER
    } else {
        TX_META_CTRL_DEFAULT
    };
    let tx = UdmaDesc::from_raw(LEN_CTRL_FIRST | LEN_CTRL_LAST | rid | len, meta, src);
    let rx = UdmaDesc::from_raw(rid | len, 0, dst);
    Ok((tx, rx))
}

/// Checks a decoded TX/RX pair for the one cross-descriptor rule: equal lengths.
///
/// # Errors
/// [`DescError::LengthMismatch`].
#[inline]
pub fn check_pair(tx: &TxDesc, rx: &RxDesc) -> Result<(), DescError> {
    if tx.len != rx.len {
        return Err(DescError::LengthMismatch {
            tx: tx.len,
            rx: rx.len,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_ring_id_changes_only_the_ring_id_bits() {
        for barrier in [false, true] {
            let (tx, rx) =
                m2m_copy_descriptors(0x1234, 0x5678, 65536, RingId::INITIAL, barrier).unwrap();
            for v in 0..=3 {
                let rid = RingId::new(v).unwrap();
                let (want_tx, want_rx) =
                    m2m_copy_descriptors(0x1234, 0x5678, 65536, rid, barrier).unwrap();
                assert_eq!(tx.with_ring_id(rid), want_tx, "TX ring id {v}");
                assert_eq!(rx.with_ring_id(rid), want_rx, "RX ring id {v}");
                assert_eq!(tx.with_ring_id(rid).ring_id(), rid);
            }
        }
        // Every other bit of len_ctrl survives, including ones a decoder would refuse.
        let odd = UdmaDesc::from_raw(!LEN_CTRL_RING_ID_MASK, 7, 9);
        let patched = odd.with_ring_id(RingId::new(2).unwrap());
        assert_eq!(
            patched.len_ctrl() & !LEN_CTRL_RING_ID_MASK,
            !LEN_CTRL_RING_ID_MASK
        );
        assert_eq!((patched.word1(), patched.buf_ptr()), (7, 9));
        assert_eq!(patched.ring_id().value(), 2);
    }

    #[test]
    fn the_ring_size_rule_is_the_drivers() {
        for ok in [32, 48, 4096, MAX_RING_DESCS] {
            assert!(is_valid_ring_size(ok), "{ok}");
        }
        for bad in [0, 16, 31, 33, 40, 4088, MAX_RING_DESCS + 16, u32::MAX] {
            assert!(!is_valid_ring_size(bad), "{bad}");
        }
        assert_eq!(MAX_RING_DESCS, 16_777_200);
        assert_eq!(MAX_RING_DESCS % RING_DESC_MULTIPLE, 0);
    }

    #[test]
    fn ring_size_for_rounds_up_to_the_smallest_valid_ring() {
        assert_eq!(ring_size_for(0), 32);
        assert_eq!(ring_size_for(6), 32);
        assert_eq!(ring_size_for(33), 48);
        assert_eq!(ring_size_for(48), 48);
        assert_eq!(ring_size_for(MAX_RING_DESCS), MAX_RING_DESCS);
        assert!(!is_valid_ring_size(ring_size_for(MAX_RING_DESCS + 1)));
        assert_eq!(ring_size_for(u32::MAX), u32::MAX);
    }
    use std::mem::offset_of;

    #[test]
    fn layout() {
        assert_eq!(offset_of!(UdmaDesc, len_ctrl), 0);
        assert_eq!(offset_of!(UdmaDesc, word1), 4);
        assert_eq!(offset_of!(UdmaDesc, buf_ptr), 8);
    }

    #[test]
    fn driver_example_4k_tx_on_pass_1() {
        // driver-abi.md §2.2: a single-descriptor 4 KiB TX packet on ring pass 1 is 0x0D001000.
        let (tx, _) = m2m_copy_descriptors(0x1000, 0x2000, 4096, RingId::INITIAL, false).unwrap();
        assert_eq!(tx.len_ctrl(), 0x0D00_1000);
    }

    #[test]
    fn golden_bytes_of_a_64k_pair_with_barrier() {
        let (tx, rx) = m2m_copy_descriptors(
            0x10_0000_2000,
            0x10_0001_0000,
            65536,
            RingId::new(2).unwrap(),
            true,
        )
        .unwrap();
        #[rustfmt::skip]
        assert_eq!(tx.to_le_bytes(), [
            0x00, 0x00, 0x00, 0x0E,   // len_ctrl: len 0 (=64 KiB), ring id 2, FIRST|LAST
            0x03, 0x00, 0x08, 0x05,   // meta_ctrl 0x05080003 (write barrier)
            0x00, 0x20, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, // buf_ptr
        ]);
        #[rustfmt::skip]
        assert_eq!(rx.to_le_bytes(), [
            0x00, 0x00, 0x00, 0x02,   // len_ctrl: len 0 (=64 KiB), ring id 2
            0x00, 0x00, 0x00, 0x00,   // buf2_ptr_lo
            0x00, 0x00, 0x01, 0x00, 0x10, 0x00, 0x00, 0x00, // buf1_ptr
        ]);
        assert_eq!(UdmaDesc::from_le_bytes(tx.to_le_bytes()), tx);
        assert_eq!(tx.len(), 65536);
    }

    #[test]
    fn builder_and_decoder_round_trip() {
        let rid = RingId::new(3).unwrap();
        let (tx, rx) = m2m_copy_descriptors(0xA000, 0xB000, 7, rid, false).unwrap();
        assert_eq!(
            tx.decode_tx(rid),
            Ok(TxDesc {
                src: 0xA000,
                len: 7,
                barrier: false
            })
        );
        assert_eq!(
            rx.decode_rx(rid),
            Ok(RxDesc {
                dst: 0xB000,
                len: 7,
                int_en: false
            })
        );
    }

    #[test]
    fn builder_rejects_bad_lengths() {
        assert_eq!(
            m2m_copy_descriptors(0, 0, 0, RingId::INITIAL, false),
            Err(DescError::BadLength(0))
        );
        assert_eq!(
            m2m_copy_descriptors(0, 0, 65537, RingId::INITIAL, false),
            Err(DescError::BadLength(65537))
        );
    }

    #[test]
    fn decoder_rejects_a_stale_ring_id() {
        let (tx, rx) = m2m_copy_descriptors(0, 0x100, 4, RingId::INITIAL, false).unwrap();
        let next = RingId::INITIAL.next();
        assert_eq!(
            tx.decode_tx(next),
            Err(DescError::StaleRingId {
                dir: Direction::Tx,
                expected: 2,
                found: 1
            })
        );
        assert!(matches!(
            rx.decode_rx(next),
            Err(DescError::StaleRingId { .. })
        ));
    }

    #[test]
    fn decoder_rejects_malformed_words() {
        let rid = RingId::INITIAL;
        let good = LEN_CTRL_FIRST | LEN_CTRL_LAST | (1 << 24) | 16;
        let reserved = UdmaDesc::from_raw(good | (1 << 31), TX_META_CTRL_DEFAULT, 0);
        assert!(
            matches!(reserved.decode_tx(rid), Err(DescError::ReservedBits { bits, .. }) if bits == 1 << 31)
        );
        let partial = UdmaDesc::from_raw(good & !LEN_CTRL_LAST, TX_META_CTRL_DEFAULT, 0);
        assert!(matches!(
            partial.decode_tx(rid),
            Err(DescError::NotWholePacket { .. })
        ));
        let meta = UdmaDesc::from_raw(good, 0xDEAD_BEEF, 0);
        assert_eq!(
            meta.decode_tx(rid),
            Err(DescError::UnsupportedMetaCtrl {
                meta_ctrl: 0xDEAD_BEEF
            })
        );
        let wrap = UdmaDesc::from_raw(good, TX_META_CTRL_DEFAULT, u64::MAX - 4);
        assert!(matches!(
            wrap.decode_tx(rid),
            Err(DescError::AddressOverflow { .. })
        ));
        let rx_first = UdmaDesc::from_raw((1 << 24) | LEN_CTRL_FIRST | 16, 0, 0);
        assert!(matches!(
            rx_first.decode_rx(rid),
            Err(DescError::ReservedBits { .. })
        ));
        let rx_buf2 = UdmaDesc::from_raw((1 << 24) | 16, 7, 0);
        assert_eq!(
            rx_buf2.decode_rx(rid),
            Err(DescError::NonZeroBuf2 { word1: 7 })
        );
    }

    #[test]
    fn pair_lengths_must_match() {
        let tx = TxDesc {
            src: 0,
            len: 8,
            barrier: false,
        };
        let rx = RxDesc {
            dst: 0,
            len: 4,
            int_en: false,
        };
        assert_eq!(
            check_pair(&tx, &rx),
            Err(DescError::LengthMismatch { tx: 8, rx: 4 })
        );
    }

    #[test]
    fn ring_id_advances_modulo_4() {
        let seq: Vec<u8> = std::iter::successors(Some(RingId::INITIAL), |r| Some(r.next()))
            .take(6)
            .map(RingId::value)
            .collect();
        assert_eq!(seq, [1, 2, 3, 0, 1, 2]);
        assert_eq!(RingId::new(4), None);
    }
}
