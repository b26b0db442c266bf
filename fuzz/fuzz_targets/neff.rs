//! The NEFF reader (`neff::Neff::parse`): a NEFF file from disk, as `nrt_load` reads it.
//! Properties: parsing never panics nor unpacks past its caps; whatever parses keeps the
//! reader's invariants (I/O sizes are shape × width, streams are whole 64-byte records). Each
//! input is tried as a whole file and as the tar inside a well-formed header and gzip stream
//! (hash made right), so the tar, JSON and `.npy` readers behind the gzip CRC are fuzzed too.
#![no_main]

use std::io::Write;

use libfuzzer_sys::fuzz_target;
use neff::header::{NEFF_VERSION_MAJOR, hash_field};
use neff::{
    Limits, NEFF_HEADER_SIZE, Neff, NeffHeader, ParseOptions, hash_matches, looks_like_neff,
};
use zerocopy::{FromZeros, IntoBytes};

/// Small caps: no input needs more, and -malloc_limit_mb=64 holds.
const LIMITS: Limits = Limits {
    max_unpacked_bytes: 16 << 20,
    max_members: 4096,
};

fn check(bytes: &[u8], options: &ParseOptions) {
    if let Ok(neff) = Neff::parse_with_limits(bytes, options, &LIMITS) {
        assert!(looks_like_neff(bytes), "a parsed NEFF is recognised");
        for t in neff.inputs.iter().chain(&neff.outputs) {
            let elements: u64 = t.shape.iter().product();
            assert_eq!(elements * t.dtype.size(), t.size);
        }
        for sg in &neff.subgraphs {
            assert!(sg.streams.iter().all(|s| s.bytes.len() % 64 == 0));
            let _ = sg.device_bytes().total();
        }
        let _ = neff.device_bytes();
    }
}

fuzz_target!(|data: &[u8]| {
    let _ = hash_matches(data);
    check(data, &ParseOptions::default());

    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(data).expect("writing to a Vec");
    let payload = gz.finish().expect("writing to a Vec");
    let mut header = NeffHeader::new_zeroed();
    header.pkg_version = 2;
    header.header_size = NEFF_HEADER_SIZE as u64;
    header.data_size = payload.len() as u64;
    header.neff_version_major = NEFF_VERSION_MAJOR;
    header.num_tpb = 1;
    header.lnc_size = 2;
    header.hash = hash_field(&payload);
    let mut file = header.as_bytes().to_vec();
    file.extend_from_slice(&payload);
    assert!(looks_like_neff(&file) && hash_matches(&file));
    check(
        &file,
        &ParseOptions {
            validate_hash: true,
        },
    );
});
