//! The control-protocol decoder (`shared::protocol::decode`): the bytes of one SEQPACKET
//! message from a peer, as simdev decodes a `Request` and the runtime decodes a `Reply`.
//! Properties: decoding never panics; whatever decodes re-encodes within `MAX_MSG_SIZE` and
//! decodes back to the same message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shared::protocol::{MAX_MSG_SIZE, Reply, Request, decode, encode};

fuzz_target!(|data: &[u8]| {
    let mut buf = vec![0u8; MAX_MSG_SIZE];
    if let Ok(req) = decode::<Request>(data) {
        let n = encode(&req, &mut buf).expect("a decoded request re-encodes");
        assert_eq!(decode::<Request>(&buf[..n]).expect("round trip"), req);
        let _ = req.is_posted();
    }
    if let Ok(reply) = decode::<Reply>(data) {
        let n = encode(&reply, &mut buf).expect("a decoded reply re-encodes");
        assert_eq!(decode::<Reply>(&buf[..n]).expect("round trip"), reply);
        assert!(reply.fd_count() <= 2);
    }
});
