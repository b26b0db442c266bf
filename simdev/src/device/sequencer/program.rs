//! What an execution runs once its batch is fetched and its request decoded: a [`Program`].
//!
//! The request's sequencer-config word names the program's encoding in bits 8..16
//! ([`ProgramEncoding::of_request`], the contract in [`shared::neff_program`]); simdev never
//! guesses it from the bytes it fetches:
//!
//! - [`Program::Isa`] (encoding 0): five instruction streams in the client's memory, one per
//!   engine, interpreted by [`crate::engines`].
//! - [`Program::Neff`] (encoding 1): a NEFF subgraph's five engine streams, run
//!   **shape-only** by [`crate::shape_only`] (no instruction semantics).
//! - Any other encoding is an execution error (GENERIC) naming the value.
//!
//! Everything around the program stays as it is: the batch fetch, the request's reload flags,
//! the faults, the latency model, the trace and the notification (`execution`), and the NC's
//! registers, DMA queues, compute state and the client's memory as the program sees them (the
//! [`engines::Host`] and [`shape_only::Host`]).

use shared::exec_request::{DeviceExecRequest, Engine};
use shared::neff_program::ProgramEncoding;

use crate::engines::{self, Limits, Progress, Stop};
use crate::shape_only;

/// One execution's program (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Program {
    /// The simulator ISA ([`shared::isa`]): each engine starts at its instruction block's
    /// device address (a PA in the client's memory), in [`Engine::ALL`] order.
    Isa {
        /// The instruction blocks' device addresses, in [`Engine::ALL`] order.
        addresses: [u64; 5],
    },
    /// A NEFF subgraph run shape-only ([`crate::shape_only`]): each engine's stream of 64-byte
    /// records at its device address, the program header 128 bytes before the PE stream.
    Neff {
        /// The streams' device addresses, in [`Engine::ALL`] order.
        addresses: [u64; 5],
    },
}

impl Program {
    /// The program `request` names.
    ///
    /// # Errors
    /// GENERIC naming the value when the request's program encoding is not one simdev runs.
    pub fn of_request(request: &DeviceExecRequest) -> Result<Self, Stop> {
        let addresses = Engine::ALL.map(|e| request.engine_address(e));
        match ProgramEncoding::of_request(request) {
            ProgramEncoding::SimdevIsa => Ok(Self::Isa { addresses }),
            ProgramEncoding::Neff => Ok(Self::Neff { addresses }),
            ProgramEncoding::Unknown(v) => Err(Stop::generic(format!(
                "the request's sequencer-config word {:#x} names program encoding {v} (bits \
                 8..16); simdev runs 0 (simulator ISA) and 1 (NEFF, shape-only)",
                request.reload_seq_config
            ))),
        }
    }

    /// Whether it is run shape-only.
    pub const fn is_shape_only(&self) -> bool {
        matches!(self, Self::Neff { .. })
    }

    /// The program before its first instruction.
    pub fn start(&self) -> Running {
        match *self {
            Self::Isa { addresses } => Running::Isa(engines::Run::new(addresses)),
            Self::Neff { addresses } => Running::Neff { addresses },
        }
    }
}

/// A [`Program`] in progress: what an execution suspended at a park keeps until it resumes
/// (only ISA programs park; a NEFF runs shape-only to its end at once).
#[derive(Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "it lives in the execution on the running thread's stack; boxing the engines' \
              state would allocate per execution"
)]
pub enum Running {
    /// The engines' state ([`engines::Run`]).
    Isa(engines::Run),
    /// A NEFF subgraph, not started.
    Neff {
        /// The streams' device addresses, in [`Engine::ALL`] order.
        addresses: [u64; 5],
    },
}

impl Running {
    /// Runs the program on `host`, within `limits` (which bound ISA programs only), to its end
    /// or until `host` suspends it at a park ([`engines::Park::Suspend`]).
    ///
    /// # Errors
    /// The [`Stop`] that ended it: a failure with its error flags, or the execution abandoned.
    pub fn resume(
        &mut self,
        limits: &Limits,
        host: &mut (impl engines::Host + shape_only::Host),
    ) -> Result<Progress, Stop> {
        match self {
            Self::Isa(run) => run.resume(limits, host),
            Self::Neff { addresses } => shape_only::run(*addresses, host).map(Progress::Done),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::neff_program::{PROGRAM_ENCODING_SHIFT, SEQ_CONFIG_RELOAD};
    use shared::notification::error_flags;

    fn request_with_addresses() -> DeviceExecRequest {
        let mut request = DeviceExecRequest::default();
        for (i, engine) in Engine::ALL.into_iter().enumerate() {
            // High halves set, so a lost `eng_addresses_hi` would show.
            request.set_engine_address(engine, 0x1_0000_0000 * (i as u64 + 1) + 0x40 * i as u64);
        }
        request
    }

    const ADDRESSES: [u64; 5] = [
        0x1_0000_0000,
        0x2_0000_0040,
        0x3_0000_0080,
        0x4_0000_00C0,
        0x5_0000_0100,
    ];

    #[test]
    fn a_request_names_the_isa_program_at_its_engines_addresses() {
        let request = request_with_addresses();
        assert_eq!(
            Program::of_request(&request),
            Ok(Program::Isa {
                addresses: ADDRESSES
            })
        );
    }

    #[test]
    fn bits_8_to_16_of_the_config_word_name_a_neff_or_an_unknown_encoding() {
        let mut request = request_with_addresses();
        request.reload_seq_config = SEQ_CONFIG_RELOAD | ProgramEncoding::Neff.config_bits();
        let program = Program::of_request(&request).unwrap();
        assert_eq!(
            program,
            Program::Neff {
                addresses: ADDRESSES
            }
        );
        assert!(program.is_shape_only());
        request.reload_seq_config = 0x2A << PROGRAM_ENCODING_SHIFT;
        let Err(Stop::Failed { flags, reason }) = Program::of_request(&request) else {
            panic!("an unknown encoding is refused");
        };
        assert_eq!(flags, error_flags::GENERIC);
        assert!(reason.contains("program encoding 42"), "{reason}");
    }
}
