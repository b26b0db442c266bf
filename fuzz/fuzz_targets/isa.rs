//! The simulator-ISA decoder: an instruction block from a model file or a client's device
//! memory, cut into 64-byte instructions (`shared::isa::Instruction`), each checked for every
//! engine by simdev's decoder (`simdev::compute::decode`), with the operand decoders of
//! `shared::isa` (tiles, activation functions, ALU and reduce ops, scalar modes).
//! Properties: nothing panics; every defined opcode byte round-trips.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shared::exec_request::Engine;
use shared::isa::{
    ARG_WORDS, ActFunc, AluOp, INSTRUCTION_SIZE, Instruction, Opcode, ReduceOp, ScalarMode, Tile,
};
use zerocopy::FromBytes;

fuzz_target!(|data: &[u8]| {
    for chunk in data.chunks_exact(INSTRUCTION_SIZE) {
        let inst = Instruction::read_from_bytes(chunk).expect("64 bytes");
        if let Some(op) = inst.op() {
            assert_eq!(op as u8, inst.opcode);
            for engine in Engine::ALL {
                let _ = simdev::compute::decode(engine, op, &inst);
            }
        }
        for w in 0..ARG_WORDS - 2 {
            let words = [inst.args[w], inst.args[w + 1], inst.args[w + 2]];
            if let Some(t) = Tile::decode(words) {
                assert_eq!(Tile::decode(t.encode()), Some(t));
            }
        }
        for &a in &inst.args {
            let _ = (
                ActFunc::from_u32(a),
                AluOp::from_u32(a),
                ReduceOp::from_u32(a),
                ScalarMode::from_u32(a),
            );
        }
    }
    let _ = Opcode::from_u8(data.first().copied().unwrap_or(0));
});
