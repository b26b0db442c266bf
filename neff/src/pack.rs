//! Unpacking a NEFF into its members and packing members back into a NEFF — what
//! `neuron-packager unpack` and `pack` do — for tools that edit a NEFF and for tests that build
//! damaged ones. [`crate::Neff::parse`] does not use this: it keeps only the members it needs.

use std::io::{Read, Write};

use crate::payload::Limits;
use crate::{NEFF_HEADER_SIZE, NeffError, NeffHeader, header};

/// Every file member of `neff`'s payload, debug members included, in archive order, within
/// [`Limits::DEFAULT`].
///
/// # Errors
/// [`NeffError::TooShort`], [`NeffError::Gzip`], [`NeffError::Tar`] or [`NeffError::Limit`].
pub fn members(neff: &[u8]) -> Result<Vec<(String, Vec<u8>)>, NeffError> {
    let payload = neff
        .get(NEFF_HEADER_SIZE..)
        .ok_or(NeffError::TooShort { len: neff.len() })?;
    let limits = Limits::DEFAULT;
    let mut tar_bytes = Vec::new();
    flate2::read::GzDecoder::new(payload)
        .take(limits.max_unpacked_bytes)
        .read_to_end(&mut tar_bytes)
        .map_err(|e| NeffError::Gzip {
            message: e.to_string(),
        })?;
    let tar_err = |e: std::io::Error| NeffError::Tar {
        message: e.to_string(),
    };
    let mut out = Vec::new();
    for entry in tar::Archive::new(&tar_bytes[..])
        .entries()
        .map_err(tar_err)?
    {
        let mut entry = entry.map_err(tar_err)?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        if out.len() as u64 >= limits.max_members {
            return Err(NeffError::Limit {
                what: "tar members",
                cap: limits.max_members,
            });
        }
        let name = entry
            .path()
            .map_err(tar_err)?
            .to_string_lossy()
            .into_owned();
        let mut data = Vec::new();
        entry.read_to_end(&mut data).map_err(tar_err)?;
        out.push((name, data));
    }
    Ok(out)
}

/// A NEFF of `header` (every field kept but `data_size` and `hash`, which are set for the new
/// payload) whose payload is a gzip'd tar of `members`, in order.
///
/// # Errors
/// [`NeffError::Tar`] when a member name cannot go into a tar header.
pub fn pack(header: &NeffHeader, members: &[(String, Vec<u8>)]) -> Result<Vec<u8>, NeffError> {
    let tar_err = |e: std::io::Error| NeffError::Tar {
        message: e.to_string(),
    };
    let mut builder = tar::Builder::new(Vec::new());
    for (name, data) in members {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        builder
            .append_data(&mut h, name, &data[..])
            .map_err(tar_err)?;
    }
    let tar_bytes = builder.into_inner().map_err(tar_err)?;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar_bytes).map_err(tar_err)?;
    let payload = gz.finish().map_err(tar_err)?;
    let mut h = *header;
    h.data_size = payload.len() as u64;
    h.hash = header::hash_field(&payload);
    let mut out = zerocopy::IntoBytes::as_bytes(&h).to_vec();
    out.extend_from_slice(&payload);
    Ok(out)
}
