//! The simulator ISA: the instruction encoding of the five engines' programs on simdev
//! (DESIGN §6). **Simulator-defined**: the NeuronCore silicon ISA inside a NEFF is not public.
//! The runtime treats instruction blocks as opaque bytes it loads into device memory and whose
//! addresses it patches into the `device_exec_request`; only simdev and the model builder read
//! them.
//!
//! Every instruction is [`INSTRUCTION_SIZE`] (64) little-endian bytes:
//!
//! | offset | field | meaning |
//! |---|---|---|
//! | 0 | `opcode: u8` | [`Opcode`] |
//! | 1 | `flags: u8` | [`FLAG_WAIT`], [`FLAG_SIGNAL`], opcode-specific bits above |
//! | 2 | `wait_sem: u8` | semaphore to wait on (with `FLAG_WAIT`) |
//! | 3 | `signal_sem: u8` | semaphore to add to when done (with `FLAG_SIGNAL`) |
//! | 4 | `wait_value: u32` | wait until `semaphore >= wait_value` |
//! | 8 | `signal_value: u32` | amount added to `signal_sem` |
//! | 12 | `args: [u32; 13]` | operands, per opcode |
//!
//! A program is a sequence of instructions ending with [`Opcode::End`]. An engine executes its
//! instructions in order; before one with `FLAG_WAIT` it blocks until the wait holds; after one
//! with `FLAG_SIGNAL` completes it adds `signal_value` to `signal_sem`. The five engines of an NC
//! synchronise only through these semaphores (and the sequencer's events).

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Bytes per instruction.
pub const INSTRUCTION_SIZE: usize = 64;
/// Operand words per instruction.
pub const ARG_WORDS: usize = 13;
/// `flags` bit: wait for `wait_sem >= wait_value` before executing.
pub const FLAG_WAIT: u8 = 1 << 0;
/// `flags` bit: add `signal_value` to `signal_sem` after executing.
pub const FLAG_SIGNAL: u8 = 1 << 1;
/// Most instructions one engine may execute in one program (a bound on hostile programs).
pub const MAX_PROGRAM_INSTRUCTIONS: u32 = 1 << 20;

/// Instruction opcodes. Values are ABI (never renumbered).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Opcode {
    /// 0x00: no operation (waits and signals still apply).
    Nop = 0x00,
    /// 0x01: end of the engine's program.
    End = 0x01,
    /// 0x10 (SP): start DMA on one of the NC's queues: `args = [engine, queue, desc_count]`;
    /// adds `desc_count` to the queue's RX then TX tail, as a tail-increment register write does.
    DmaStart = 0x10,
    /// 0x11 (SP): wait for a queue's posted descriptors to finish: `args = [engine, queue]`. A
    /// queue stopped by a DMA abort fails the execution.
    DmaWait = 0x11,
    /// 0x12 (SP): wait until event `args[0]` of this NC is non-zero (set by the host or by
    /// DMA); waiting on an event is waiting for the outside world, never a deadlock.
    WaitEvent = 0x12,
}

impl Opcode {
    /// Decodes an opcode byte; `None` for an undefined one.
    pub const fn from_u8(v: u8) -> Option<Self> {
        match v {
            0x00 => Some(Self::Nop),
            0x01 => Some(Self::End),
            0x10 => Some(Self::DmaStart),
            0x11 => Some(Self::DmaWait),
            0x12 => Some(Self::WaitEvent),
            _ => None,
        }
    }
}

/// One 64-byte instruction, as stored in an instruction block.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct Instruction {
    /// [`Opcode`] byte.
    pub opcode: u8,
    /// [`FLAG_WAIT`] | [`FLAG_SIGNAL`] | opcode-specific bits.
    pub flags: u8,
    /// Semaphore index waited on.
    pub wait_sem: u8,
    /// Semaphore index signalled.
    pub signal_sem: u8,
    /// Wait until the semaphore is at least this.
    pub wait_value: u32,
    /// Added to the signalled semaphore.
    pub signal_value: u32,
    /// Operands.
    pub args: [u32; ARG_WORDS],
}

const _: () = assert!(std::mem::size_of::<Instruction>() == INSTRUCTION_SIZE);

impl Instruction {
    /// An instruction with `opcode` and `args` (missing args are 0), no wait, no signal.
    pub fn new(opcode: Opcode, args: &[u32]) -> Self {
        let mut a = [0u32; ARG_WORDS];
        for (slot, v) in a.iter_mut().zip(args) {
            *slot = *v;
        }
        Self {
            opcode: opcode as u8,
            args: a,
            ..Self::default()
        }
    }

    /// Adds a wait for `sem >= value` before the instruction.
    pub fn wait(mut self, sem: u8, value: u32) -> Self {
        self.flags |= FLAG_WAIT;
        self.wait_sem = sem;
        self.wait_value = value;
        self
    }

    /// Adds a signal `sem += value` after the instruction.
    pub fn signal(mut self, sem: u8, value: u32) -> Self {
        self.flags |= FLAG_SIGNAL;
        self.signal_sem = sem;
        self.signal_value = value;
        self
    }

    /// The decoded opcode, if defined.
    pub fn op(&self) -> Option<Opcode> {
        Opcode::from_u8(self.opcode)
    }
}

/// Encodes a program (instructions back to back) into bytes.
pub fn encode_program(program: &[Instruction]) -> Vec<u8> {
    program
        .iter()
        .flat_map(|i| i.as_bytes().iter().copied())
        .collect()
}

/// The program that does nothing but end (for engines a model does not use).
pub fn end_program() -> Vec<u8> {
    encode_program(&[Instruction::new(Opcode::End, &[])])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    #[test]
    fn layout() {
        assert_eq!(offset_of!(Instruction, opcode), 0);
        assert_eq!(offset_of!(Instruction, flags), 1);
        assert_eq!(offset_of!(Instruction, wait_sem), 2);
        assert_eq!(offset_of!(Instruction, signal_sem), 3);
        assert_eq!(offset_of!(Instruction, wait_value), 4);
        assert_eq!(offset_of!(Instruction, signal_value), 8);
        assert_eq!(offset_of!(Instruction, args), 12);
    }

    #[test]
    fn golden_bytes_of_a_dma_start_with_wait_and_signal() {
        let i = Instruction::new(Opcode::DmaStart, &[3, 2, 16])
            .wait(4, 1)
            .signal(5, 2);
        let mut golden = [0u8; 64];
        golden[..16].copy_from_slice(&[0x10, 0x03, 4, 5, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0]);
        golden[16] = 2;
        golden[20] = 16;
        assert_eq!(i.as_bytes(), golden);
        assert_eq!(Instruction::read_from_bytes(&golden).unwrap(), i);
    }

    #[test]
    fn undefined_opcodes_do_not_decode() {
        assert_eq!(Opcode::from_u8(0xFF), None);
        assert_eq!(Instruction::new(Opcode::End, &[]).op(), Some(Opcode::End));
        assert_eq!(end_program().len(), INSTRUCTION_SIZE);
    }
}
