//! The 1024-byte NEFF header (`nrt-api.md` §4): its layout, the checks libnrt makes before it
//! unpacks the payload, and the payload hash.
//!
//! Invariant: a [`NeffHeader`] returned by [`check`] has `header_size == 1024`,
//! `pkg_version` in 1..=2, `header_size + data_size` equal to the file length,
//! `neff_version_major == 2`, `num_tpb` in 1..=64 and `lnc_size` in 1..=2.

use md5::{Digest, Md5};
use zerocopy::FromBytes;

use crate::NeffError;

/// Bytes of the header.
pub const NEFF_HEADER_SIZE: usize = 1024;

/// The NEFF major version this reader accepts.
pub const NEFF_VERSION_MAJOR: u64 = 2;

/// Largest `num_tpb` accepted (`tpb_per_node` has 64 entries).
pub const MAX_NUM_TPB: u32 = 64;

/// The gzip magic the payload starts with.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// The 1024-byte NEFF header (`nrt-api.md` §4), little-endian.
#[repr(C)]
#[derive(
    Clone,
    Copy,
    Debug,
    zerocopy::FromBytes,
    zerocopy::IntoBytes,
    zerocopy::Immutable,
    zerocopy::KnownLayout,
)]
pub struct NeffHeader {
    /// Packaging version (2 observed).
    pub pkg_version: u64,
    /// Header bytes (1024).
    pub header_size: u64,
    /// Payload (gzip) bytes: the file is `header_size + data_size` long.
    pub data_size: u64,
    /// NEFF major version (2 observed).
    pub neff_version_major: u64,
    /// NEFF minor version (0 observed).
    pub neff_version_minor: u64,
    /// Build version string (zero in observed files).
    pub neff_build_version: [u8; 128],
    /// TPBs (cores) needed.
    pub num_tpb: u32,
    /// MD5 of the payload as four byte-swapped 32-bit words, the rest zero.
    pub hash: [u8; 32],
    /// Unique id.
    pub uuid: [u8; 16],
    /// NUL-terminated name ("file.neff").
    pub name: [u8; 256],
    /// Requested TPB count.
    pub requested_tpb_count: u32,
    /// TPBs per kelf node.
    pub tpb_per_node: [u8; 64],
    /// Incompatible-feature bits.
    pub feature_bits: u64,
    /// Logical core size the NEFF needs (2 observed).
    pub lnc_size: u32,
    /// Zero.
    pub pad: [u8; 468],
}

const _: () = assert!(std::mem::size_of::<NeffHeader>() == NEFF_HEADER_SIZE);

impl NeffHeader {
    /// The header at the start of `bytes`, unchecked; `None` when `bytes` is shorter than it.
    pub fn read(bytes: &[u8]) -> Option<Self> {
        NeffHeader::read_from_prefix(bytes).ok().map(|(h, _)| h)
    }

    /// `name` up to its first NUL, lossily decoded.
    pub fn name(&self) -> String {
        c_string(&self.name)
    }

    /// `neff_build_version` up to its first NUL, lossily decoded.
    pub fn build_version(&self) -> String {
        c_string(&self.neff_build_version)
    }

    /// `uuid` as 32 lowercase hex digits.
    pub fn uuid_hex(&self) -> String {
        hex(&self.uuid)
    }

    /// The stored MD5 in digest byte order (the four 32-bit words swapped back).
    pub fn stored_md5(&self) -> [u8; 16] {
        let mut md5 = [0u8; 16];
        for (out, word) in md5.chunks_exact_mut(4).zip(self.hash.chunks_exact(4)) {
            out.copy_from_slice(word);
            out.reverse();
        }
        md5
    }
}

/// Reads and checks the header of a whole NEFF file (see the module invariant).
///
/// # Errors
/// [`NeffError::TooShort`], [`NeffError::HeaderSize`], [`NeffError::PkgVersion`],
/// [`NeffError::DataSize`], [`NeffError::UnsupportedVersion`] or [`NeffError::HeaderField`].
pub fn check(bytes: &[u8]) -> Result<NeffHeader, NeffError> {
    let header = NeffHeader::read(bytes).ok_or(NeffError::TooShort { len: bytes.len() })?;
    if header.header_size != NEFF_HEADER_SIZE as u64 {
        return Err(NeffError::HeaderSize {
            found: header.header_size,
        });
    }
    if !(1..=2).contains(&header.pkg_version) {
        return Err(NeffError::PkgVersion {
            found: header.pkg_version,
        });
    }
    let actual = (bytes.len() - NEFF_HEADER_SIZE) as u64;
    if header.data_size != actual {
        return Err(NeffError::DataSize {
            data_size: header.data_size,
            actual,
        });
    }
    if header.neff_version_major != NEFF_VERSION_MAJOR {
        return Err(NeffError::UnsupportedVersion {
            major: header.neff_version_major,
            minor: header.neff_version_minor,
        });
    }
    if !(1..=MAX_NUM_TPB).contains(&header.num_tpb) {
        return Err(NeffError::HeaderField {
            field: "num_tpb",
            value: header.num_tpb.into(),
            expected: "1..=64",
        });
    }
    if !(1..=2).contains(&header.lnc_size) {
        return Err(NeffError::HeaderField {
            field: "lnc_size",
            value: header.lnc_size.into(),
            expected: "1 or 2",
        });
    }
    Ok(header)
}

/// Whether `bytes` starts like a NEFF: `header_size` 1024, `pkg_version` 1..=2, `data_size`
/// consistent with the length, and the gzip magic right after the header. A recognizer only:
/// [`crate::Neff::parse`] decides whether it is a valid one.
pub fn looks_like_neff(bytes: &[u8]) -> bool {
    let Some(header) = NeffHeader::read(bytes) else {
        return false;
    };
    header.header_size == NEFF_HEADER_SIZE as u64
        && (1..=2).contains(&header.pkg_version)
        && header.data_size.checked_add(header.header_size) == Some(bytes.len() as u64)
        && bytes.get(NEFF_HEADER_SIZE..NEFF_HEADER_SIZE + 2) == Some(&GZIP_MAGIC[..])
}

/// The MD5 of a payload, in digest byte order.
pub fn payload_md5(payload: &[u8]) -> [u8; 16] {
    Md5::digest(payload).into()
}

/// The header's hash field for a payload: its MD5 as four byte-swapped 32-bit words, then 16
/// zero bytes.
pub fn hash_field(payload: &[u8]) -> [u8; 32] {
    let md5 = payload_md5(payload);
    let mut field = [0u8; 32];
    for (out, word) in field.chunks_exact_mut(4).zip(md5.chunks_exact(4)) {
        out.copy_from_slice(word);
        out.reverse();
    }
    field
}

/// Whether the header of `bytes` holds the MD5 of the bytes after it (the whole 32-byte field:
/// the swapped digest, then zeros). False for a file shorter than the header.
pub fn hash_matches(bytes: &[u8]) -> bool {
    match (NeffHeader::read(bytes), bytes.get(NEFF_HEADER_SIZE..)) {
        (Some(header), Some(payload)) => header.hash == hash_field(payload),
        _ => false,
    }
}

/// Checks the header's hash against the payload.
///
/// # Errors
/// [`NeffError::HashMismatch`] with both digests in hex, in digest byte order (as `md5sum`
/// prints the payload's), and whether the field's 16 bytes after the digest are not zero.
pub fn check_hash(header: &NeffHeader, payload: &[u8]) -> Result<(), NeffError> {
    if header.hash == hash_field(payload) {
        Ok(())
    } else {
        let tail = header.hash.get(16..).unwrap_or_default();
        let mut stored = hex(&header.stored_md5());
        if tail.iter().any(|&b| b != 0) {
            stored.push_str(&format!(" (and {} after it where zeros belong)", hex(tail)));
        }
        Err(NeffError::HashMismatch {
            stored,
            computed: hex(&payload_md5(payload)),
        })
    }
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}
