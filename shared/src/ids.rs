//! Execution-unit ids and sequence ids (seed 004 §1–§2, `nrt_async.h` 3.x).
//!
//! An [`XuId`] is 16 bits `{type:4, queue:4, vnc_id:8}`, LSB first: the XU type in bits 3:0,
//! the queue index in bits 7:4 and the vNC in the high byte. A [`SeqId`] is
//! `seq_num:48 | xu_id << 48`; seq_num 0 is never an in-queue sequence (cursors start at 1).

use serde::{Deserialize, Serialize};

/// Largest seq_num a queue may hand out: `scheduled_tail` is asserted below it on every submit.
pub const NRTA_SEQ_NUM_MAX: u64 = 0xFFFF_FFFF_FFFE;
/// Mask of the 48-bit seq_num field.
pub const SEQ_NUM_MASK: u64 = 0xFFFF_FFFF_FFFF;
/// Number of vNC slots in the XU table (`MAX_VIRTUAL_TPB`).
pub const MAX_VIRTUAL_TPB: usize = 256;

/// XU types of the async 3.x API (`nrta_xu_t`).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum XuType {
    /// 0: tensor read/write copies.
    TensorOp = 0,
    /// 1: model executions (the only type the compute XU table accepts).
    Compute = 1,
    /// 2: collectives.
    Collectives = 2,
}

impl XuType {
    /// Decodes the 4-bit type field; `None` for an undefined type.
    pub const fn from_bits(bits: u8) -> Option<Self> {
        match bits {
            0 => Some(Self::TensorOp),
            1 => Some(Self::Compute),
            2 => Some(Self::Collectives),
            _ => None,
        }
    }
}

/// A 16-bit execution-unit id `{type:4, queue:4, vnc_id:8}`.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct XuId(u16);

const _: () = assert!(std::mem::size_of::<XuId>() == 2);

impl XuId {
    /// Packs an id from its fields; `queue` is 0..16, the vNC 0..256.
    ///
    /// # Panics
    /// If `queue` is 16 or more (it has 4 bits).
    pub const fn new(xu_type: XuType, queue: u8, vnc_id: u8) -> Self {
        assert!(queue < 16, "xu queue index has 4 bits");
        XuId((xu_type as u16) | ((queue as u16) << 4) | ((vnc_id as u16) << 8))
    }

    /// The raw 16-bit value.
    pub const fn raw(self) -> u16 {
        self.0
    }

    /// An id from its raw value (any 16 bits; the type may be undefined).
    pub const fn from_raw(raw: u16) -> Self {
        XuId(raw)
    }

    /// The 4-bit type field (bits 3:0), raw.
    pub const fn type_bits(self) -> u8 {
        (self.0 & 0xF) as u8
    }

    /// The type, if defined.
    pub const fn xu_type(self) -> Option<XuType> {
        XuType::from_bits(self.type_bits())
    }

    /// The queue index (bits 7:4).
    pub const fn queue(self) -> u8 {
        ((self.0 >> 4) & 0xF) as u8
    }

    /// The vNC id (the high byte): the index into the XU table.
    pub const fn vnc_id(self) -> u8 {
        (self.0 >> 8) as u8
    }
}

/// A 64-bit sequence id: `(seq_num & 0xFFFF_FFFF_FFFF) | (xu_id << 48)`.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SeqId(u64);

const _: () = assert!(std::mem::size_of::<SeqId>() == 8);

impl SeqId {
    /// Encodes the id of the slot at `cursor` in the queue of `xu_id` (seed 004 §2).
    pub const fn new(xu_id: XuId, cursor: u64) -> Self {
        SeqId((cursor & SEQ_NUM_MASK) | ((xu_id.raw() as u64) << 48))
    }

    /// The raw 64-bit value handed to API users.
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// An id from its raw value.
    pub const fn from_raw(raw: u64) -> Self {
        SeqId(raw)
    }

    /// The low 48 bits: the monotone per-queue sequence number.
    pub const fn seq_num(self) -> u64 {
        self.0 & SEQ_NUM_MASK
    }

    /// The high 16 bits: the id of the XU that issued it.
    pub const fn xu_id(self) -> XuId {
        XuId((self.0 >> 48) as u16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xu_id_bit_layout() {
        let id = XuId::new(XuType::Compute, 3, 0xAB);
        assert_eq!(id.raw(), 0xAB31);
        assert_eq!(id.raw().to_le_bytes(), [0x31, 0xAB], "golden bytes");
        assert_eq!(id.xu_type(), Some(XuType::Compute));
        assert_eq!(id.queue(), 3);
        assert_eq!(id.vnc_id(), 0xAB);
        assert_eq!(XuId::from_raw(0x000F).xu_type(), None);
    }

    #[test]
    fn seq_id_packs_seq_num_and_xu_id() {
        let xu = XuId::new(XuType::Compute, 0, 2);
        let seq = SeqId::new(xu, 1);
        assert_eq!(seq.raw(), 0x0201_0000_0000_0001);
        assert_eq!(
            seq.raw().to_le_bytes(),
            [1, 0, 0, 0, 0, 0, 0x01, 0x02],
            "golden bytes"
        );
        assert_eq!(seq.seq_num(), 1);
        assert_eq!(seq.xu_id(), xu);
        // The cursor is masked to 48 bits: bits above never leak into the xu_id.
        assert_eq!(SeqId::new(xu, 0xFFFF_0000_0000_0005).seq_num(), 5);
        assert_eq!(SeqId::new(xu, 0xFFFF_0000_0000_0005).xu_id(), xu);
    }

    #[test]
    fn seq_num_max_is_two_pow_48_minus_two() {
        assert_eq!(NRTA_SEQ_NUM_MAX, (1u64 << 48) - 2);
    }
}
