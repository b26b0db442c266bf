//! The C types of `include/nrt/*.h`, mirrored byte for byte: `#[repr(C)]` structs with size
//! asserts (compile time) and per-field offset tests, and the enum values libnrt's ABI fixes.
//!
//! Pointer fields are carried as `u64` addresses: the library is built for 64-bit targets only
//! (asserted below), where a pointer and a `u64` have the same size and alignment.

use zerocopy::{Immutable, IntoBytes, KnownLayout};

const _: () = assert!(
    std::mem::size_of::<usize>() == 8,
    "libnrt's C ABI is built for 64-bit targets"
);

/// `NRT_TENSOR_NAME_MAX`: size of a tensor name field, and the longest name (with its NUL) the
/// API takes.
pub const NRT_TENSOR_NAME_MAX: usize = 256;

/// `NRT_TENSOR_PLACEMENT_DEVICE`.
pub const PLACEMENT_DEVICE: u32 = 0;
/// `NRT_TENSOR_PLACEMENT_HOST`.
pub const PLACEMENT_HOST: u32 = 1;
/// `NRT_FRAMEWORK_TYPE_PRECHECK`, the largest framework value.
pub const FRAMEWORK_TYPE_MAX: u32 = 5;
/// `NRT_TENSOR_USAGE_INPUT`.
pub const USAGE_INPUT: u32 = 0;
/// `NRT_TENSOR_USAGE_OUTPUT`.
pub const USAGE_OUTPUT: u32 = 1;

/// `nrt_version_t` (224 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, IntoBytes, Immutable, KnownLayout)]
pub struct NrtVersion {
    /// Major version.
    pub rt_major: u64,
    /// Minor version.
    pub rt_minor: u64,
    /// Patch level.
    pub rt_patch: u64,
    /// Maintenance level.
    pub rt_maintenance: u64,
    /// Free text, NUL-terminated.
    pub rt_detail: [u8; 128],
    /// Source revision, NUL-terminated.
    pub git_hash: [u8; 64],
}

/// `nrt_instance_info_t` (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, IntoBytes, Immutable, KnownLayout)]
pub struct NrtInstanceInfo {
    /// `NRT_INSTANCE_*`.
    pub family: u32,
    /// `NRT_INSTANCE_SIZE_*`.
    pub size: u32,
    /// Device generation, NUL-terminated.
    pub arch_name: [u8; 16],
    /// Device revision, NUL-terminated.
    pub device_revision: [u8; 8],
}

/// `nrt_tensor_info_t` (296 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, IntoBytes, Immutable, KnownLayout)]
pub struct NrtTensorInfo {
    /// The I/O name, NUL-terminated.
    pub name: [u8; NRT_TENSOR_NAME_MAX],
    /// `nrt_tensor_usage_t`.
    pub usage: u32,
    /// Padding before `size`.
    pub _pad0: u32,
    /// Size in bytes.
    pub size: u64,
    /// `nrt_dtype_t`.
    pub dtype: u32,
    /// Padding before `shape`.
    pub _pad1: u32,
    /// Address of `ndim` `uint32_t` dimensions.
    pub shape: u64,
    /// Number of dimensions.
    pub ndim: u32,
    /// Tail padding.
    pub _pad2: u32,
}

/// The header of `nrt_tensor_info_array_t`: `tensor_count`, then the entries at offset 8.
pub const TENSOR_INFO_ARRAY_HEADER: usize = 8;

/// `nrt_tensor_device_allocation_info_t` (24 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, IntoBytes, Immutable, KnownLayout)]
pub struct NrtTensorDeviceAllocationInfo {
    /// Device address of the tensor's first byte.
    pub physical_address: u64,
    /// Size of the allocation.
    pub size: u64,
    /// The HBM.
    pub hbm_index: i32,
    /// Tail padding.
    pub _pad: u32,
}

/// `nrt_vnc_memory_stats_t` (16 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, IntoBytes, Immutable, KnownLayout)]
pub struct NrtVncMemoryStats {
    /// Bytes in use.
    pub bytes_used: u64,
    /// Bytes available.
    pub bytes_limit: u64,
}

/// `nrt_model_info_t` (4 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, IntoBytes, Immutable, KnownLayout)]
pub struct NrtModelInfo {
    /// The logical core.
    pub vnc: u32,
}

/// `nrt_tensor_batch_op_t` (24 bytes): `size` bytes at byte `offset` of the batch's tensor,
/// to or from `buffer`.
#[repr(C)]
#[derive(Clone, Copy, Debug, IntoBytes, Immutable, KnownLayout)]
pub struct NrtTensorBatchOp {
    /// `nrt_tensor_batch_offset_t`: byte offset in the tensor.
    pub offset: u64,
    /// `nrt_tensor_batch_size_t`: bytes.
    pub size: u64,
    /// Address of the caller's buffer.
    pub buffer: u64,
}

/// `nrt_tensor_batch_t` (24 bytes): the operations on one tensor.
#[repr(C)]
#[derive(Clone, Copy, Debug, IntoBytes, Immutable, KnownLayout)]
pub struct NrtTensorBatch {
    /// The tensor handle.
    pub tensor: u64,
    /// Address of `num_ops` [`NrtTensorBatchOp`]s.
    pub ops: u64,
    /// Number of operations.
    pub num_ops: u32,
    /// Tail padding.
    pub _pad: u32,
}

/// `NDEBUG_STREAM_EVENT_TYPE_DEBUG_TENSOR_READ`: a device print's tensor.
pub const NDEBUG_STREAM_EVENT_TYPE_DEBUG_TENSOR_READ: u32 = 1;

/// `ndebug_stream_event_header_t` (64 bytes): the header of one debug-stream event.
#[repr(C)]
#[derive(Clone, Copy, Debug, IntoBytes, Immutable, KnownLayout)]
pub struct NdebugStreamEventHeader {
    /// Bytes of the event's payload.
    pub data_size: u64,
    /// `ndebug_stream_event_type_t`.
    pub event_type: u32,
    /// Reserved.
    pub reserved: [u8; 52],
}

const _: () = {
    assert!(std::mem::size_of::<NdebugStreamEventHeader>() == 64);
    assert!(std::mem::size_of::<NrtVersion>() == 224);
    assert!(std::mem::size_of::<NrtInstanceInfo>() == 32);
    assert!(std::mem::size_of::<NrtTensorInfo>() == 296);
    assert!(std::mem::size_of::<NrtTensorDeviceAllocationInfo>() == 24);
    assert!(std::mem::size_of::<NrtVncMemoryStats>() == 16);
    assert!(std::mem::size_of::<NrtModelInfo>() == 4);
    assert!(std::mem::size_of::<NrtTensorBatchOp>() == 24);
    assert!(std::mem::size_of::<NrtTensorBatch>() == 24);
};

/// The pointer a `u64` address field holds (exact: 64-bit targets only, asserted above). The
/// caller's structs carry pointers the caller made, so their provenance is exposed.
pub fn field_ptr<T>(addr: u64) -> *mut T {
    usize::try_from(addr).map_or(std::ptr::null_mut(), std::ptr::with_exposed_provenance_mut)
}

/// `s` as a NUL-terminated C string in a fixed field (cut to fit, always terminated).
pub fn c_field<const N: usize>(s: &str) -> [u8; N] {
    let mut out = [0u8; N];
    let n = s.len().min(N.saturating_sub(1));
    out[..n].copy_from_slice(&s.as_bytes()[..n]);
    out
}

#[cfg(test)]
mod tests {
    use std::mem::offset_of;

    use super::*;

    #[test]
    fn field_offsets_match_the_reference_table() {
        assert_eq!(offset_of!(NrtVersion, rt_major), 0);
        assert_eq!(offset_of!(NrtVersion, rt_minor), 8);
        assert_eq!(offset_of!(NrtVersion, rt_patch), 16);
        assert_eq!(offset_of!(NrtVersion, rt_maintenance), 24);
        assert_eq!(offset_of!(NrtVersion, rt_detail), 32);
        assert_eq!(offset_of!(NrtVersion, git_hash), 160);
        assert_eq!(offset_of!(NrtInstanceInfo, family), 0);
        assert_eq!(offset_of!(NrtInstanceInfo, size), 4);
        assert_eq!(offset_of!(NrtInstanceInfo, arch_name), 8);
        assert_eq!(offset_of!(NrtInstanceInfo, device_revision), 24);
        assert_eq!(offset_of!(NrtTensorInfo, name), 0);
        assert_eq!(offset_of!(NrtTensorInfo, usage), 256);
        assert_eq!(offset_of!(NrtTensorInfo, size), 264);
        assert_eq!(offset_of!(NrtTensorInfo, dtype), 272);
        assert_eq!(offset_of!(NrtTensorInfo, shape), 280);
        assert_eq!(offset_of!(NrtTensorInfo, ndim), 288);
        assert_eq!(
            offset_of!(NrtTensorDeviceAllocationInfo, physical_address),
            0
        );
        assert_eq!(offset_of!(NrtTensorDeviceAllocationInfo, size), 8);
        assert_eq!(offset_of!(NrtTensorDeviceAllocationInfo, hbm_index), 16);
        assert_eq!(offset_of!(NrtVncMemoryStats, bytes_used), 0);
        assert_eq!(offset_of!(NrtVncMemoryStats, bytes_limit), 8);
        assert_eq!(offset_of!(NrtModelInfo, vnc), 0);
        assert_eq!(offset_of!(NrtTensorBatchOp, offset), 0);
        assert_eq!(offset_of!(NrtTensorBatchOp, size), 8);
        assert_eq!(offset_of!(NrtTensorBatchOp, buffer), 16);
        assert_eq!(offset_of!(NrtTensorBatch, tensor), 0);
        assert_eq!(offset_of!(NrtTensorBatch, ops), 8);
        assert_eq!(offset_of!(NrtTensorBatch, num_ops), 16);
        assert_eq!(offset_of!(NdebugStreamEventHeader, data_size), 0);
        assert_eq!(offset_of!(NdebugStreamEventHeader, event_type), 8);
        assert_eq!(offset_of!(NdebugStreamEventHeader, reserved), 12);
    }

    #[test]
    fn a_debug_stream_event_header_has_the_golden_bytes() {
        let h = NdebugStreamEventHeader {
            data_size: 0x0102_0304_0506_0708,
            event_type: NDEBUG_STREAM_EVENT_TYPE_DEBUG_TENSOR_READ,
            reserved: [0; 52],
        };
        let b = h.as_bytes();
        assert_eq!(b.len(), 64);
        assert_eq!(&b[..8], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(&b[8..12], &[1, 0, 0, 0]);
        assert!(b[12..].iter().all(|&x| x == 0));
    }

    #[test]
    fn a_tensor_info_entry_has_the_golden_bytes() {
        let info = NrtTensorInfo {
            name: c_field("input"),
            usage: USAGE_OUTPUT,
            _pad0: 0,
            size: 0x0102_0304_0506_0708,
            dtype: 0xA,
            _pad1: 0,
            shape: 0x1122_3344_5566_7788,
            ndim: 3,
            _pad2: 0,
        };
        let b = info.as_bytes();
        assert_eq!(b.len(), 296);
        assert_eq!(&b[..6], b"input\0");
        assert!(b[6..256].iter().all(|&x| x == 0));
        assert_eq!(&b[256..264], &[1, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&b[264..272], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(&b[272..280], &[0xA, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(
            &b[280..288],
            &[0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11]
        );
        assert_eq!(&b[288..296], &[3, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn a_version_has_the_golden_bytes() {
        let v = NrtVersion {
            rt_major: 2,
            rt_minor: 0,
            rt_patch: 7,
            rt_maintenance: 1,
            rt_detail: c_field("d"),
            git_hash: c_field("abc"),
        };
        let b = v.as_bytes();
        assert_eq!(&b[..8], &[2, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&b[16..24], &[7, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&b[24..32], &[1, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&b[32..34], b"d\0");
        assert_eq!(&b[160..164], b"abc\0");
    }

    #[test]
    fn a_tensor_batch_and_its_op_have_the_golden_bytes() {
        let op = NrtTensorBatchOp {
            offset: 0x10,
            size: 0x0102_0304,
            buffer: 0x1122_3344_5566_7788,
        };
        assert_eq!(
            op.as_bytes(),
            &[
                0x10, 0, 0, 0, 0, 0, 0, 0, 4, 3, 2, 1, 0, 0, 0, 0, 0x88, 0x77, 0x66, 0x55, 0x44,
                0x33, 0x22, 0x11
            ]
        );
        let batch = NrtTensorBatch {
            tensor: 0xAB,
            ops: 0xCD00,
            num_ops: 3,
            _pad: 0,
        };
        assert_eq!(
            batch.as_bytes(),
            &[
                0xAB, 0, 0, 0, 0, 0, 0, 0, 0, 0xCD, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0
            ]
        );
    }

    #[test]
    fn c_fields_are_cut_and_always_terminated() {
        let f: [u8; 4] = c_field("trn1x");
        assert_eq!(&f, b"trn\0");
    }
}
