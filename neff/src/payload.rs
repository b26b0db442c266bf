//! The payload: a gzip'd POSIX tar, unpacked into memory under caps on the unpacked bytes and
//! the member count (a zip bomb or a corrupt archive is refused naming the cap).
//!
//! The tar is read as the gzip stream inflates, one member at a time: only the members kept are
//! ever held. The unpacked bytes are capped twice: by [`Limits::max_unpacked_bytes`], and by
//! [`MAX_RATIO`] bytes per compressed byte (but never below [`RATIO_FREE`]) — real NEFFs
//! inflate about 6 times; a few MiB of zeros inflating to GiBs is refused once its inflating
//! passes the cap, holding at most the cap.
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

/// Most unpacked bytes per compressed byte of the payload (a payload may always inflate to
/// [`RATIO_FREE`]).
pub const MAX_RATIO: u64 = 100;
/// Unpacked bytes any payload may have, whatever its compressed size.
pub const RATIO_FREE: u64 = 64 << 20;

impl Limits {
    /// The cap on the unpacked bytes of a payload of `compressed` bytes, and its name.
    fn unpacked_cap(&self, compressed: usize) -> (u64, &'static str) {
        let by_ratio = MAX_RATIO.saturating_mul(compressed as u64).max(RATIO_FREE);
        if by_ratio < self.max_unpacked_bytes {
            (
                by_ratio,
                "unpacked bytes for the payload's size (100 per compressed byte, at least 64 MiB: \
                 a zip bomb?)",
            )
        } else {
            (self.max_unpacked_bytes, "unpacked bytes")
        }
    }
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
    let (cap, what) = limits.unpacked_cap(payload.len());
    let mut stream = Capped {
        inflate: GzDecoder::new(payload),
        read: 0,
        cap,
        gzip_error: None,
    };
    let untarred = untar(&mut stream, limits);
    // The tar's end blocks and the stream's own end count too; and a tar the reader refused is
    // read to the stream's end as well, so that a corrupt stream (its CRC is at the end) is
    // named as such rather than by the garbage it inflated to.
    let drained = std::io::copy(&mut stream, &mut std::io::sink());
    let members = untarred.and_then(|members| {
        drained.map(|_| members).map_err(|e| NeffError::Gzip {
            message: e.to_string(),
        })
    });
    // What stopped the reading is the error, whatever the tar reader made of it.
    if stream.read > cap {
        return Err(NeffError::Limit { what, cap });
    }
    if let Some(message) = stream.gzip_error.take() {
        return Err(NeffError::Gzip { message });
    }
    let members = members?;
    // Real NEFFs pad the gzip stream with zeros; anything else after it
    // is not a NEFF.
    let rest = stream.inflate.into_inner();
    if rest.iter().any(|&b| b != 0) {
        return Err(NeffError::TrailingBytes { count: rest.len() });
    }
    Ok(members)
}

/// The inflating payload, failing once it has given more than `cap` bytes.
struct Capped<'a> {
    inflate: GzDecoder<&'a [u8]>,
    read: u64,
    cap: u64,
    /// The gzip stream's own error, if reading stopped on one.
    gzip_error: Option<String>,
}

impl Read for Capped<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self.inflate.read(buf) {
            Ok(n) => {
                self.read = self.read.saturating_add(n as u64);
                if self.read > self.cap {
                    return Err(std::io::Error::other("the payload's unpacked-bytes cap"));
                }
                Ok(n)
            }
            Err(e) => {
                self.gzip_error = Some(e.to_string());
                Err(e)
            }
        }
    }
}

pub(crate) fn untar(tar: impl Read, limits: &Limits) -> Result<Members, NeffError> {
    let tar_err = |e: std::io::Error| NeffError::Tar {
        message: e.to_string(),
    };
    let mut archive = tar::Archive::new(tar);
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
        // Read from the capped stream: holding it is bounded by the cap.
        let mut data = Vec::new();
        entry.read_to_end(&mut data).map_err(tar_err)?;
        if members.files.insert(name.clone(), data).is_some() {
            return Err(NeffError::DuplicateMember { member: name });
        }
    }
    Ok(members)
}
