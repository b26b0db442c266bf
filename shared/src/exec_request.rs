//! `device_exec_request`: the 52-byte request the runtime stages into the NC's DMEM for one
//! execution (seed 000 §3, "Stage").
//!
//! Layout (all `u32`, little-endian): `do_model_switch` @0x00, `eng_addresses_lo[5]` @0x04,
//! `eng_addresses_hi[5]` @0x18, `reload_seq_config` @0x2C, `load_act_dve_tables` @0x30. The
//! request buffer also carries a 4-byte `cc_dma_increment` trailer at byte
//! [`CC_DMA_INCREMENT_OFFSET`] (0x34), written after the request copy-in. Engine order is
//! [`Engine::ALL`]: PE, ACT, POOL, DVE, SP.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Size of [`DeviceExecRequest`] in bytes (the size of trigger pair 1's copy).
pub const DEVICE_EXEC_REQUEST_SIZE: usize = 52;
/// Byte offset of the 4-byte `cc_dma_increment` trailer in the request buffer.
pub const CC_DMA_INCREMENT_OFFSET: usize = 0x34;
/// Bytes of a request buffer: the request plus its trailer.
pub const REQUEST_BUFFER_SIZE: usize = CC_DMA_INCREMENT_OFFSET + 4;

/// The five NeuronCore engines, in the order the request carries their instruction-block
/// addresses.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Engine {
    /// PE: the tensor engine (matmul).
    Pe = 0,
    /// ACT: the activation engine.
    Act = 1,
    /// POOL: the pooling / general-purpose engine.
    Pool = 2,
    /// DVE: the vector engine.
    Dve = 3,
    /// SP: the sync / DMA-control processor.
    Sp = 4,
}

impl Engine {
    /// Every engine, in request order.
    pub const ALL: [Engine; 5] = [Self::Pe, Self::Act, Self::Pool, Self::Dve, Self::Sp];

    /// The engine's index in `eng_addresses_lo/hi` (0..5).
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The short name used in traces and logs ("PE", "ACT", ...).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Pe => "PE",
            Self::Act => "ACT",
            Self::Pool => "POOL",
            Self::Dve => "DVE",
            Self::Sp => "SP",
        }
    }
}

/// The 52-byte `device_exec_request` (seed 000 §3). Mirrors the C struct field for field; 52 is
/// not a multiple of 8, which is why the 64-bit engine addresses are split into 32-bit halves.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct DeviceExecRequest {
    /// 1 when this execution switches the NC to a different model than the last one posted.
    pub do_model_switch: u32,
    /// Low 32 bits of each engine's instruction-block device address, in [`Engine::ALL`] order.
    pub eng_addresses_lo: [u32; 5],
    /// High 32 bits of each engine's instruction-block device address.
    pub eng_addresses_hi: [u32; 5],
    /// 1 when the sequencer must reload its configuration (exec_req_flags changed).
    pub reload_seq_config: u32,
    /// 1 when the activation / DVE tables must be (re)loaded (table hash changed).
    pub load_act_dve_tables: u32,
}

const _: () = assert!(std::mem::size_of::<DeviceExecRequest>() == DEVICE_EXEC_REQUEST_SIZE);
const _: () = assert!(std::mem::align_of::<DeviceExecRequest>() == 4);

impl DeviceExecRequest {
    /// Sets engine `engine`'s instruction-block device address, split into lo/hi halves.
    pub fn set_engine_address(&mut self, engine: Engine, device_addr: u64) {
        let i = engine.index();
        self.eng_addresses_lo[i] = (device_addr & 0xFFFF_FFFF) as u32;
        self.eng_addresses_hi[i] = (device_addr >> 32) as u32;
    }

    /// Engine `engine`'s instruction-block device address, joined from its lo/hi halves.
    pub fn engine_address(&self, engine: Engine) -> u64 {
        let i = engine.index();
        (u64::from(self.eng_addresses_hi[i]) << 32) | u64::from(self.eng_addresses_lo[i])
    }

    /// Decodes a request from the first 52 bytes of `bytes`; `None` if `bytes` is shorter.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        Self::read_from_prefix(bytes).ok().map(|(req, _)| req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    #[test]
    fn field_offsets_match_the_seed() {
        assert_eq!(offset_of!(DeviceExecRequest, do_model_switch), 0x00);
        assert_eq!(offset_of!(DeviceExecRequest, eng_addresses_lo), 0x04);
        assert_eq!(offset_of!(DeviceExecRequest, eng_addresses_hi), 0x18);
        assert_eq!(offset_of!(DeviceExecRequest, reload_seq_config), 0x2C);
        assert_eq!(offset_of!(DeviceExecRequest, load_act_dve_tables), 0x30);
        assert_eq!(CC_DMA_INCREMENT_OFFSET, DEVICE_EXEC_REQUEST_SIZE);
    }

    #[test]
    fn golden_bytes() {
        let mut req = DeviceExecRequest {
            do_model_switch: 1,
            ..Default::default()
        };
        req.set_engine_address(Engine::Pe, 0x0000_0010_0000_1000);
        req.set_engine_address(Engine::Sp, 0x0000_0012_3456_7800);
        req.reload_seq_config = 1;
        req.load_act_dve_tables = 0;
        #[rustfmt::skip]
        let golden: [u8; 52] = [
            0x01, 0, 0, 0,                                  // do_model_switch
            0x00, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,       // lo: PE, ACT, POOL
            0, 0, 0, 0, 0x00, 0x78, 0x56, 0x34,             // lo: DVE, SP
            0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,          // hi: PE, ACT, POOL
            0, 0, 0, 0, 0x12, 0, 0, 0,                      // hi: DVE, SP
            0x01, 0, 0, 0,                                  // reload_seq_config
            0x00, 0, 0, 0,                                  // load_act_dve_tables
        ];
        assert_eq!(req.as_bytes(), &golden);
        assert_eq!(DeviceExecRequest::decode(&golden), Some(req));
        assert_eq!(req.engine_address(Engine::Sp), 0x0000_0012_3456_7800);
    }

    #[test]
    fn decode_rejects_a_short_buffer() {
        assert_eq!(DeviceExecRequest::decode(&[0u8; 51]), None);
    }

    #[test]
    fn engine_order_is_pe_act_pool_dve_sp() {
        let names: Vec<_> = Engine::ALL.iter().map(|e| e.name()).collect();
        assert_eq!(names, ["PE", "ACT", "POOL", "DVE", "SP"]);
        assert!(Engine::ALL.iter().enumerate().all(|(i, e)| e.index() == i));
    }
}
