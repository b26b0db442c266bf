//! Per-NC counters.
//!
//! Two kinds, by who writes them:
//! - [`Counters`]: atomics any thread bumps (a locked add each) or reads without the NC's
//!   locks;
//! - the counts of what happens under the NC's state lock — its DMA queues' work
//!   ([`crate::dma::DmaCounts`]) and its notifications and executions ([`PostCounts`]) — plain
//!   fields of the locked state, added to and copied under that lock. Each execution makes
//!   about eight of those counts: as atomic adds they were eight locked instructions, about
//!   30 cycles each on the CI VM.
//!
//! [`Counters::snapshot`] joins both into one [`NcCounters`].

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use shared::protocol::NcCounters;

use crate::dma::DmaCounts;

/// The counters of one NC that any thread bumps (see [`NcCounters`] for each field's meaning).
#[derive(Debug, Default)]
pub struct Counters {
    /// Bytes the engines moved outside the DMA queues (a shape-only NEFF program's streams),
    /// added to the queues' own bytes in `dma_bytes`.
    pub stream_bytes: AtomicU64,
    /// Posted semaphore increments received.
    pub doorbells: AtomicU64,
    /// Posted requests that failed.
    pub posted_errors: AtomicU64,
    /// NC resets.
    pub resets: AtomicU64,
    /// Sequencer config reloads.
    pub config_reloads: AtomicU64,
    /// Activation/DVE table loads.
    pub table_loads: AtomicU64,
    /// Collectives model-switch chains run.
    pub cc_chains: AtomicU64,
    /// Injected faults that fired on the NC's executions (not in [`NcCounters`]: reported in
    /// the exit report and by [`crate::Device::faults_fired`]).
    pub faults_fired: AtomicU64,
    /// NEFF programs run shape-only to their end (no instruction semantics; see
    /// [`crate::shape_only`]), and replays of a golden file recorded from such outputs: the
    /// executions whose outputs are not the NEFF's numbers.
    pub neff_shape_only_executions: AtomicU64,
    /// NEFF programs whose outputs a bound reference computed ([`crate::reference`]).
    pub neff_reference_executions: AtomicU64,
    /// Executions run on the thread that delivered their doorbell.
    pub inline_executions: AtomicU64,
    /// Executions handed to the NC's sequencer thread.
    pub sequencer_handoffs: AtomicU64,
}

/// What an NC posted: notifications and executions, counted under the NC's state lock where
/// they are posted (plain adds; see the module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PostCounts {
    /// Notifications written.
    pub notifications: u64,
    /// Notifications dropped (NQ full or absent).
    pub nq_overflows: u64,
    /// Executions that posted an `Execution` notification.
    pub executions: u64,
    /// Executions that ended with error flags.
    pub exec_errors: u64,
}

/// Adds `n` to a counter (relaxed: counters order nothing).
pub fn bump(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl Counters {
    /// A consistent-enough copy for a [`shared::protocol::Reply::Counters`], with the counts
    /// `dma` and `posted` copied under the NC's state lock (each atomic field is read
    /// atomically; fields are not read at one instant).
    pub fn snapshot(&self, dma: DmaCounts, posted: PostCounts) -> NcCounters {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        NcCounters {
            dma_descriptors: dma.descriptors,
            dma_bytes: dma.bytes.wrapping_add(get(&self.stream_bytes)),
            dma_aborts: dma.aborts,
            register_writes: dma.register_writes,
            doorbells: get(&self.doorbells),
            notifications: posted.notifications,
            nq_overflows: posted.nq_overflows,
            posted_errors: get(&self.posted_errors),
            resets: get(&self.resets),
            executions: posted.executions,
            exec_errors: posted.exec_errors,
            config_reloads: get(&self.config_reloads),
            table_loads: get(&self.table_loads),
            cc_chains: get(&self.cc_chains),
            faults_fired: get(&self.faults_fired),
            neff_shape_only_executions: get(&self.neff_shape_only_executions),
            neff_reference_executions: get(&self.neff_reference_executions),
            inline_executions: get(&self.inline_executions),
            sequencer_handoffs: get(&self.sequencer_handoffs),
        }
    }
}

/// Displays [`NcCounters`] as `name value` pairs on one line, for the exit report.
#[derive(Debug)]
pub struct CountersLine(pub NcCounters);

impl fmt::Display for CountersLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (name, value)) in self.0.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(f, "{sep}{name} {value}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exit_report_line_names_every_counter_in_order() {
        let counters = Counters::default();
        bump(&counters.faults_fired, 15);
        bump(&counters.stream_bytes, 100);
        let dma = DmaCounts {
            descriptors: 1,
            bytes: 20,
            register_writes: 3,
            aborts: 4,
        };
        let posted = PostCounts {
            notifications: 5,
            nq_overflows: 6,
            executions: 7,
            exec_errors: 8,
        };
        let line = CountersLine(counters.snapshot(dma, posted)).to_string();
        assert_eq!(
            line,
            "dma_descriptors 1, dma_bytes 120, dma_aborts 4, register_writes 3, doorbells 0, \
             notifications 5, nq_overflows 6, posted_errors 0, resets 0, executions 7, \
             exec_errors 8, config_reloads 0, table_loads 0, cc_chains 0, faults_fired 15, \
             neff_shape_only_executions 0, neff_reference_executions 0, inline_executions 0, \
             sequencer_handoffs 0"
        );
    }
}
