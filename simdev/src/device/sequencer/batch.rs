//! The exec-queue batch's shape (step 1 of the [sequencer](crate::device::sequencer)'s
//! contract): [`check_batch`] checks the head pairs the sequencer peeked, and [`is_cc_poke`]
//! recognises a collectives chain. The fetch itself, under the NC's lock, is in `execution`.

use shared::address_map::Register;
use shared::exec_request::{
    CC_DMA_INCREMENT_OFFSET, DEVICE_EXEC_REQUEST_SIZE, DeviceExecRequest, Engine,
};
use shared::sequencer::{
    EVENT_COLLECTIVES_CTX_LOAD, EVENT_HW_EXEC_QUEUE_REQUEST_LOAD, EXEC_QUEUE, EXEC_QUEUE_ENGINE,
};

use crate::dma::{PairEffect, PeekedPair};

/// Pairs of a batch before its chain: the request copy, the event poke and the two tail
/// increments.
pub const BATCH_HEAD_PAIRS: u32 = 4;

/// Checks the head pairs of a batch for NC `nc` (see the module doc), in order: `pairs` may
/// be the first 1 to 4 of them, so a deviation is reported before later slots are read.
/// Returns `M`, the number of chain pairs they post, once all four are given.
///
/// # Errors
/// A sentence naming the first pair that breaks the shape and what it does instead.
pub fn check_batch(nc: u32, pairs: &[PeekedPair]) -> Result<Option<u32>, String> {
    if pairs.is_empty() || pairs.len() > 4 {
        return Err(format!(
            "{} pairs given, a batch starts with {BATCH_HEAD_PAIRS}",
            pairs.len()
        ));
    }
    let request_len = u32::try_from(DEVICE_EXEC_REQUEST_SIZE).unwrap_or(u32::MAX);
    let exec_rx = Register::RxTailIncrement {
        nc,
        engine: EXEC_QUEUE_ENGINE,
        queue: EXEC_QUEUE,
    };
    let exec_tx = Register::TxTailIncrement {
        nc,
        engine: EXEC_QUEUE_ENGINE,
        queue: EXEC_QUEUE,
    };
    let mut m = None;
    for (position, pair) in pairs.iter().enumerate() {
        // Built only on the error paths: a well-formed batch allocates nothing.
        let what = || describe(pair.len, &pair.effect);
        match (position, &pair.effect) {
            (
                0,
                PairEffect::Dmem {
                    nc: n, offset: 0, ..
                },
            ) if *n == nc && pair.len == request_len => {}
            (0, _) => {
                return Err(format!(
                    "pair 1 must copy the {request_len}-byte request into NC {nc}'s DMEM at \
                     offset 0; it {}",
                    what()
                ));
            }
            (
                1,
                PairEffect::Register {
                    reg: Register::Event { nc: n, index },
                    value: 1,
                },
            ) if *n == nc && *index == EVENT_HW_EXEC_QUEUE_REQUEST_LOAD => {}
            (1, _) => {
                return Err(format!(
                    "pair 2 must write 1 to event {EVENT_HW_EXEC_QUEUE_REQUEST_LOAD} of NC \
                     {nc}; it {}",
                    what()
                ));
            }
            (2, PairEffect::Register { reg, value }) if *reg == exec_rx => m = Some(*value),
            (2, _) => {
                return Err(format!(
                    "pair 3 must first write the exec queue's RX tail increment; it {}",
                    what()
                ));
            }
            (_, PairEffect::Register { reg, value }) if *reg == exec_tx => {
                let rx = m.unwrap_or_default();
                if *value != rx {
                    return Err(format!(
                        "pair 3 posts {rx} chain pairs on the exec queue's RX ring but {value} \
                         on its TX ring"
                    ));
                }
                return Ok(Some(rx));
            }
            (_, _) => {
                return Err(format!(
                    "pair 3 must then write the exec queue's TX tail increment; it {}",
                    what()
                ));
            }
        }
    }
    Ok(None)
}

/// Checks the request's `cc_dma_increment` trailer against `m`, the chain pairs the batch's
/// tail increments post. `trailer` is the 4-byte word at
/// [`CC_DMA_INCREMENT_OFFSET`] past pair 1's source (the request slot), `None` when pair 1 does
/// not read client memory or the word is not in it.
///
/// # Errors
/// A sentence naming the trailer and both values.
pub fn check_trailer(m: u32, trailer: Option<u32>) -> Result<(), String> {
    match trailer {
        Some(t) if t == m => Ok(()),
        Some(t) => Err(format!(
            "the request's cc_dma_increment trailer (byte {CC_DMA_INCREMENT_OFFSET:#x} of its \
             slot) says {t} collectives-chain pairs, the tail increments post {m}"
        )),
        None => Err(format!(
            "the request's cc_dma_increment trailer (byte {CC_DMA_INCREMENT_OFFSET:#x} past pair \
             1's source) is not in client memory"
        )),
    }
}

/// Checks `do_model_switch` against the programs this NC ran: a request that does not switch
/// models (`do_model_switch` = 0) must run the same engine addresses as the NC's previous
/// request. (A switch to a model loaded where an unloaded one was may reuse its addresses, so
/// `do_model_switch` = 1 is always accepted.)
///
/// # Errors
/// A sentence naming the flag and the engine whose address changed.
pub fn check_model_switch(
    previous: Option<[u64; 5]>,
    request: &DeviceExecRequest,
) -> Result<(), String> {
    if request.do_model_switch != 0 {
        return Ok(());
    }
    let Some(previous) = previous else {
        return Err(
            "do_model_switch is 0 on the first request since the NC was claimed or reset"
                .to_owned(),
        );
    };
    for (engine, prev) in Engine::ALL.iter().zip(previous) {
        let now = request.engine_address(*engine);
        if now != prev {
            return Err(format!(
                "do_model_switch is 0 but the {} program moved from {prev:#x} to {now:#x} (another model)",
                engine.name()
            ));
        }
    }
    Ok(())
}

/// Whether `pair` (the last of a chain) pokes NC `nc`'s collectives-context-load event.
pub fn is_cc_poke(nc: u32, pair: &PeekedPair) -> bool {
    matches!(
        pair.effect,
        PairEffect::Register {
            reg: Register::Event { nc: n, index },
            ..
        } if n == nc && index == EVENT_COLLECTIVES_CTX_LOAD
    )
}

fn describe(len: u32, effect: &PairEffect) -> String {
    match effect {
        PairEffect::Copy { dst } => format!("copies {len} bytes to memory at {dst:#x}"),
        PairEffect::Sbuf {
            nc,
            partition,
            offset,
        } => format!("copies {len} bytes into NC {nc}'s SBUF partition {partition} at {offset}"),
        PairEffect::Dmem { nc, offset, .. } => {
            format!("copies {len} bytes into NC {nc}'s DMEM at offset {offset}")
        }
        PairEffect::Register { reg, value } => format!("writes {value} to {reg:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(len: u32, effect: PairEffect) -> PeekedPair {
        PeekedPair {
            len,
            effect,
            src_pa: None,
        }
    }

    fn reg(reg: Register, value: u32) -> PeekedPair {
        pair(4, PairEffect::Register { reg, value })
    }

    fn batch(nc: u32, m_rx: u32, m_tx: u32) -> Vec<PeekedPair> {
        let (engine, queue) = (EXEC_QUEUE_ENGINE, EXEC_QUEUE);
        vec![
            pair(
                52,
                PairEffect::Dmem {
                    nc,
                    offset: 0,
                    data: vec![0; 52].into(),
                },
            ),
            reg(
                Register::Event {
                    nc,
                    index: EVENT_HW_EXEC_QUEUE_REQUEST_LOAD,
                },
                1,
            ),
            reg(Register::RxTailIncrement { nc, engine, queue }, m_rx),
            reg(Register::TxTailIncrement { nc, engine, queue }, m_tx),
        ]
    }

    #[test]
    fn the_staged_shape_passes_and_gives_m() {
        assert_eq!(check_batch(1, &batch(1, 0, 0)), Ok(Some(0)));
        assert_eq!(check_batch(0, &batch(0, 3, 3)), Ok(Some(3)));
        assert_eq!(
            check_batch(0, &batch(0, 3, 3)[..3]),
            Ok(None),
            "a good prefix"
        );
    }

    #[test]
    fn every_deviation_is_named() {
        let err = check_batch(0, &batch(1, 0, 0)[..1]).unwrap_err();
        assert!(err.starts_with("pair 1"), "another NC's DMEM: {err}");
        let mut b = batch(0, 2, 1);
        assert!(check_batch(0, &b).unwrap_err().contains("2 chain pairs"));
        b.swap(2, 3);
        assert!(
            check_batch(0, &b)
                .unwrap_err()
                .starts_with("pair 3 must first")
        );
        let mut b = batch(0, 0, 0);
        b.remove(1);
        let err = check_batch(0, &b[..2]).unwrap_err();
        assert!(err.starts_with("pair 2 must"), "pair 2 missing: {err}");
        assert!(check_batch(0, &[]).unwrap_err().contains("0 pairs given"));
        let mut b = batch(0, 0, 0);
        b[1] = reg(Register::Event { nc: 0, index: 9 }, 1);
        assert!(check_batch(0, &b).unwrap_err().starts_with("pair 2"));
        let mut b = batch(0, 0, 0);
        b[0] = pair(48, b[0].effect.clone());
        assert!(check_batch(0, &b).unwrap_err().contains("copies 48 bytes"));
        let cc = reg(
            Register::Event {
                nc: 0,
                index: EVENT_COLLECTIVES_CTX_LOAD,
            },
            1,
        );
        assert!(is_cc_poke(0, &cc));
        assert!(!is_cc_poke(1, &cc));
    }

    #[test]
    fn the_event_poke_must_write_1() {
        for wrong in [0, 2, 0x0000_0100] {
            let mut b = batch(0, 0, 0);
            b[1] = reg(
                Register::Event {
                    nc: 0,
                    index: EVENT_HW_EXEC_QUEUE_REQUEST_LOAD,
                },
                wrong,
            );
            let err = check_batch(0, &b).unwrap_err();
            assert!(
                err.starts_with("pair 2 must write 1") && err.contains(&format!("writes {wrong}")),
                "{err}"
            );
        }
    }

    #[test]
    fn the_trailer_must_equal_the_tail_increments() {
        assert_eq!(check_trailer(0, Some(0)), Ok(()));
        assert_eq!(check_trailer(5, Some(5)), Ok(()));
        let err = check_trailer(5, Some(0)).unwrap_err();
        assert!(
            err.contains("cc_dma_increment") && err.contains("says 0") && err.contains("post 5"),
            "{err}"
        );
        assert!(
            check_trailer(0, None)
                .unwrap_err()
                .contains("not in client memory")
        );
    }

    #[test]
    fn a_request_that_does_not_switch_must_run_the_previous_programs() {
        let mut a = DeviceExecRequest::default();
        for (i, e) in Engine::ALL.iter().enumerate() {
            a.set_engine_address(*e, 0x1000 * (i as u64 + 1));
        }
        let programs = Engine::ALL.map(|e| a.engine_address(e));
        assert!(
            check_model_switch(Some(programs), &a).is_ok(),
            "A then A, no switch"
        );
        let mut b = a;
        b.set_engine_address(Engine::Act, 0x9000);
        let err = check_model_switch(Some(programs), &b).unwrap_err();
        assert!(
            err.contains("do_model_switch is 0") && err.contains("ACT"),
            "{err}"
        );
        b.do_model_switch = 1;
        assert!(
            check_model_switch(Some(programs), &b).is_ok(),
            "A then B, a switch"
        );
        assert!(
            check_model_switch(None, &a)
                .unwrap_err()
                .contains("first request")
        );
        a.do_model_switch = 1;
        assert!(check_model_switch(None, &a).is_ok());
    }
}
