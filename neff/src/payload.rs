//! The payload: a gzip'd POSIX tar, unpacked into memory under caps on the unpacked bytes and
//! the member count (a zip bomb or a corrupt archive is refused naming the cap).
//!
//! The gzip stream may be followed by zero padding (the real files pad it), nothing else.
//!
//! Debug members (`debug_info/`, `*.dbg`) and `hlo_stats.json` are read through (they count
//! against the caps) but not kept.

use std::collections::BTreeMap;
use std::io::Read;

use flate2::bufread::GzDecoder;

use crate::NeffError;

/// Safety caps on the payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most bytes the gzip stream may unpack to (the tar, headers included).
    pub max_unpacked_bytes: u64,
    /// Most tar members.
    pub max_members: u64,
}

impl Limits {
    /// Generous for real NEFFs (weights of a large model are a few GiB): 16 GiB unpacked,
    /// 100,000 members.
    pub const DEFAULT: Self = Self {
        max_unpacked_bytes: 16 << 30,
        max_members: 100_000,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// The members kept, by name (leading `./` removed).
#[derive(Debug, Default)]
pub struct Members {
    files: BTreeMap<String, Vec<u8>>,
}

impl Members {
    /// The bytes of `member`.
    ///
    /// # Errors
    /// [`NeffError::MissingMember`].
    pub fn get(&self, member: &str) -> Result<&[u8], NeffError> {
        self.files
            .get(member)
            .map(Vec::as_slice)
            .ok_or_else(|| NeffError::MissingMember {
                member: member.to_owned(),
            })
    }

    /// Names of the members kept.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.files.keys().map(String::as_str)
    }
}

/// Whether a member is debug-only (never needed to load or describe the NEFF).
fn is_debug(name: &str) -> bool {
    name.starts_with("debug_info/")
        || name.contains("/debug_info")
        || name.ends_with(".dbg")
        || name.contains(".dbg_")
        || name == "hlo_stats.json"
}

/// Unpacks `payload` (the bytes after the header).
///
/// # Errors
/// [`NeffError::Gzip`], [`NeffError::TrailingBytes`], [`NeffError::Limit`],
/// [`NeffError::Tar`] or [`NeffError::DuplicateMember`].
pub fn unpack(payload: &[u8], limits: &Limits) -> Result<Members, NeffError> {
    let tar_bytes = gunzip(payload, limits)?;
    untar(&tar_bytes, limits)
}

fn gunzip(payload: &[u8], limits: &Limits) -> Result<Vec<u8>, NeffError> {
    let mut decoder = GzDecoder::new(payload);
    let mut out = Vec::new();
    (&mut decoder)
        .take(limits.max_unpacked_bytes.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|e| NeffError::Gzip {
            message: e.to_string(),
        })?;
    if out.len() as u64 > limits.max_unpacked_bytes {
        return Err(NeffError::Limit {
            what: "unpacked bytes",
            cap: limits.max_unpacked_bytes,
        });
    }
    // Real NEFFs pad the gzip stream with zeros; anything else after it
    // is not a NEFF.
    let rest = decoder.into_inner();
    if rest.iter().any(|&b| b != 0) {
        return Err(NeffError::TrailingBytes { count: rest.len() });
    }
    Ok(out)
}

pub(crate) fn untar(tar_bytes: &[u8], limits: &Limits) -> Result<Members, NeffError> {
    let tar_err = |e: std::io::Error| NeffError::Tar {
        message: e.to_string(),
    };
    let mut archive = tar::Archive::new(tar_bytes);
    let mut members = Members::default();
    let mut count = 0u64;
    for entry in archive.entries().map_err(tar_err)? {
        let mut entry = entry.map_err(tar_err)?;
        count += 1;
        if count > limits.max_members {
            return Err(NeffError::Limit {
                what: "tar members",
                cap: limits.max_members,
            });
        }
        let kind = entry.header().entry_type();
        if !(kind.is_file() || kind == tar::EntryType::Continuous) {
            continue;
        }
        let path = entry.path().map_err(tar_err)?;
        let name = path.to_string_lossy();
        let name = name.strip_prefix("./").unwrap_or(&name).to_owned();
        if is_debug(&name) {
            continue;
        }
        // The entry's data lies within `tar_bytes`, which is capped: reading it is bounded.
        let mut data = Vec::new();
        entry.read_to_end(&mut data).map_err(tar_err)?;
        if members.files.insert(name.clone(), data).is_some() {
            return Err(NeffError::DuplicateMember { member: name });
        }
    }
    Ok(members)
}
