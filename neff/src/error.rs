//! [`NeffError`]: why a NEFF was refused, one variant per rule, each naming the member and field
//! where it applies.

use thiserror::Error;

/// Why a NEFF was refused. Each names the member and field where it applies.
#[derive(Debug, Error)]
pub enum NeffError {
    /// The file is shorter than the 1024-byte header.
    #[error("not a NEFF: the file is {len} bytes, shorter than a NEFF's 1024-byte header")]
    TooShort {
        /// File length.
        len: usize,
    },
    /// `header_size` is not 1024.
    #[error(
        "not a NEFF: header_size (bytes 0x8..0x10, little-endian) reads {found}, where a NEFF has 1024"
    )]
    HeaderSize {
        /// The header's value.
        found: u64,
    },
    /// `pkg_version` is not 1 or 2.
    #[error("NEFF pkg_version {found} is not supported (1 or 2)")]
    PkgVersion {
        /// The header's value.
        found: u64,
    },
    /// `data_size` disagrees with the bytes after the header.
    #[error(
        "NEFF header data_size is {data_size} bytes but the file has {actual} bytes after the header"
    )]
    DataSize {
        /// The header's `data_size`.
        data_size: u64,
        /// Bytes after the header.
        actual: u64,
    },
    /// `neff_version_major` is not 2 (libnrt: `NRT_UNSUPPORTED_NEFF_VERSION`).
    #[error("NEFF version {major}.{minor} is not supported (major version 2)")]
    UnsupportedVersion {
        /// `neff_version_major`.
        major: u64,
        /// `neff_version_minor`.
        minor: u64,
    },
    /// A header field out of its range.
    #[error("NEFF header field {field} is {value}, expected {expected}")]
    HeaderField {
        /// The field's name.
        field: &'static str,
        /// Its value.
        value: u64,
        /// The accepted values.
        expected: &'static str,
    },
    /// The header's hash is not the payload's MD5 (checked under `NEURON_RT_VALIDATE_HASH`).
    #[error("NEFF hash mismatch: header has {stored}, payload MD5 is {computed}")]
    HashMismatch {
        /// The header's MD5, hex.
        stored: String,
        /// The payload's MD5, hex.
        computed: String,
    },
    /// The payload is not a whole gzip stream.
    #[error("NEFF payload is not valid gzip: {message}")]
    Gzip {
        /// The decoder's message.
        message: String,
    },
    /// Non-zero bytes after the end of the gzip stream (zero padding is allowed).
    #[error(
        "NEFF payload has {count} bytes after the end of its gzip stream, not all zero padding"
    )]
    TrailingBytes {
        /// How many.
        count: usize,
    },
    /// The unpacked payload is not a valid tar archive.
    #[error("NEFF payload is not a valid tar archive: {message}")]
    Tar {
        /// The reader's message.
        message: String,
    },
    /// The payload exceeds a safety cap (a zip bomb or a corrupt archive).
    #[error("NEFF payload exceeds the cap on {what}: more than {cap}")]
    Limit {
        /// "unpacked bytes" or "tar members".
        what: &'static str,
        /// The cap.
        cap: u64,
    },
    /// A member appears twice in the tar.
    #[error("NEFF member {member} appears twice")]
    DuplicateMember {
        /// Member name.
        member: String,
    },
    /// A member the NEFF names is not in the tar.
    #[error("NEFF member {member} is missing")]
    MissingMember {
        /// Member name.
        member: String,
    },
    /// A JSON member does not parse (or lacks a field or has one of the wrong type: serde's
    /// message names it).
    #[error("NEFF member {member}: {message}")]
    Json {
        /// Member name.
        member: String,
        /// serde's message (names the field, line and column).
        message: String,
    },
    /// A field of a JSON member has a value the NEFF cannot have.
    #[error("NEFF member {member} field {field}: {problem}")]
    Field {
        /// Member name.
        member: String,
        /// Field path ("var.x.size").
        field: String,
        /// What is wrong.
        problem: String,
    },
    /// An instruction stream's length is not a multiple of the 64-byte record.
    #[error("NEFF instruction stream {member} is {len} bytes, not a multiple of 64")]
    StreamLength {
        /// Member name.
        member: String,
        /// Its length.
        len: usize,
    },
    /// A constant's `.npy` member is not a valid array for its var.
    #[error("NEFF constant {member}: {problem}")]
    Npy {
        /// Member name.
        member: String,
        /// What is wrong.
        problem: String,
    },
    /// The subgraphs disagree about the model's I/O, or an I/O tensor's facts disagree.
    #[error("NEFF I/O tensor {tensor}: {problem}")]
    Io {
        /// Tensor name.
        tensor: String,
        /// What is wrong.
        problem: String,
    },
}
