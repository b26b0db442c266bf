//! The UDMA descriptor decoder (`shared::udma`): descriptors a client writes into rings that
//! simdev's engines read. The first byte picks the ring id the engine expects; the rest is
//! 16-byte descriptors, decoded as TX and as RX, consecutive ones paired.
//! Properties: decoding never panics; a decoded descriptor has a length in 1..=65536 and a
//! buffer that does not wrap; the raw bytes round-trip; the builder's pairs always decode.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shared::udma::{
    MAX_DESC_LEN, RingId, UDMA_DESC_SIZE, UdmaDesc, check_pair, m2m_copy_descriptors,
};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let ring = RingId::new(sel & 3).expect("2-bit ring id");
    let mut prev_tx = None;
    for chunk in rest.chunks_exact(UDMA_DESC_SIZE) {
        let bytes: [u8; UDMA_DESC_SIZE] = chunk.try_into().expect("16 bytes");
        let desc = UdmaDesc::from_le_bytes(bytes);
        assert_eq!(desc.to_le_bytes(), bytes);
        let _ = (desc.len(), desc.is_empty(), desc.ring_id());
        if let Ok(tx) = desc.decode_tx(ring) {
            assert!((1..=MAX_DESC_LEN).contains(&tx.len));
            assert!(tx.src.checked_add(u64::from(tx.len)).is_some());
            prev_tx = Some(tx);
        }
        if let Ok(rx) = desc.decode_rx(ring) {
            assert!((1..=MAX_DESC_LEN).contains(&rx.len));
            assert!(rx.dst.checked_add(u64::from(rx.len)).is_some());
            if let Some(tx) = prev_tx.take() {
                assert_eq!(check_pair(&tx, &rx).is_ok(), tx.len == rx.len);
            }
        }
    }
    // The builder: whatever it accepts, the decoders accept with the same fields.
    if rest.len() >= 24 {
        let word = |i: usize| u64::from_le_bytes(rest[i..i + 8].try_into().expect("8 bytes"));
        let (src, dst, len) = (word(0), word(8), word(16) % (u64::from(MAX_DESC_LEN) + 2));
        let barrier = sel & 4 != 0;
        if let Ok((tx, rx)) = m2m_copy_descriptors(src, dst, len, ring, barrier) {
            let no_wrap = |a: u64| a.checked_add(len).is_some();
            match (tx.decode_tx(ring), rx.decode_rx(ring)) {
                (Ok(t), Ok(r)) => {
                    assert_eq!((t.src, u64::from(t.len), t.barrier), (src, len, barrier));
                    assert_eq!((r.dst, u64::from(r.len)), (dst, len));
                    assert!(check_pair(&t, &r).is_ok());
                }
                (t, r) => assert!(
                    !no_wrap(src) || !no_wrap(dst),
                    "a built pair failed to decode: {t:?} {r:?}"
                ),
            }
        }
    }
});
