//! What an execution runs once its batch is fetched and its request decoded: a [`Program`].
//!
//! Today there is one kind, the simulator-ISA program ([`Program::Isa`]): five instruction
//! streams in the client's memory, one per engine, interpreted by [`crate::engines`].
//!
//! **A second kind of program goes here.** The NEFF issue adds a NEFF run ("shape-only"): add
//! it as a variant of [`Program`], say in [`Program::of_request`] how a request names it, and
//! run it in [`Program::run`]. Everything around the program stays as it is: the batch fetch,
//! the request's reload flags, the faults, the latency model, the trace and the notification
//! (`execution`), and the NC's registers, DMA queues and compute state as the program sees
//! them (the [`engines::Host`]).

use shared::exec_request::{DeviceExecRequest, Engine};

use crate::engines::{self, Limits, Stats, Stop};

/// One execution's program (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Program {
    /// The simulator ISA ([`shared::isa`]): each engine starts at its instruction block's
    /// device address (a PA in the client's memory), in [`Engine::ALL`] order.
    Isa {
        /// The instruction blocks' device addresses, in [`Engine::ALL`] order.
        addresses: [u64; 5],
    },
}

impl Program {
    /// The program `request` names.
    pub fn of_request(request: &DeviceExecRequest) -> Self {
        Self::Isa {
            addresses: Engine::ALL.map(|e| request.engine_address(e)),
        }
    }

    /// Runs the program to its end on `host`, within `limits`.
    ///
    /// # Errors
    /// The [`Stop`] that ended it: a failure with its error flags, or the execution abandoned.
    pub fn run(&self, limits: &Limits, host: &mut impl engines::Host) -> Result<Stats, Stop> {
        match self {
            Self::Isa { addresses } => engines::run(*addresses, limits, host),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_names_the_isa_program_at_its_engines_addresses() {
        let mut request = DeviceExecRequest::default();
        for (i, engine) in Engine::ALL.into_iter().enumerate() {
            // High halves set, so a lost `eng_addresses_hi` would show.
            request.set_engine_address(engine, 0x1_0000_0000 * (i as u64 + 1) + 0x40 * i as u64);
        }
        let Program::Isa { addresses } = Program::of_request(&request);
        assert_eq!(
            addresses,
            [
                0x1_0000_0000,
                0x2_0000_0040,
                0x3_0000_0080,
                0x4_0000_00C0,
                0x5_0000_0100
            ]
        );
    }
}
