//! Per-NC counters, kept as atomics so any thread can bump or read them without the NC's lock.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use shared::protocol::NcCounters;

/// The live counters of one NC (see [`NcCounters`] for each field's meaning).
#[derive(Debug, Default)]
pub struct Counters {
    /// Descriptor pairs completed.
    pub dma_descriptors: AtomicU64,
    /// Bytes moved by DMA (register writes count their 4 bytes).
    pub dma_bytes: AtomicU64,
    /// Queues stopped on a bad descriptor.
    pub dma_aborts: AtomicU64,
    /// Register writes performed by DMA.
    pub register_writes: AtomicU64,
    /// Posted semaphore increments received.
    pub doorbells: AtomicU64,
    /// Notifications written.
    pub notifications: AtomicU64,
    /// Notifications dropped (NQ full or absent).
    pub nq_overflows: AtomicU64,
    /// Posted requests that failed.
    pub posted_errors: AtomicU64,
    /// NC resets.
    pub resets: AtomicU64,
    /// Executions that posted an `Execution` notification.
    pub executions: AtomicU64,
    /// Executions that ended with error flags.
    pub exec_errors: AtomicU64,
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

/// Adds `n` to a counter (relaxed: counters order nothing).
pub fn bump(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl Counters {
    /// A consistent-enough copy for a [`shared::protocol::Reply::Counters`] (each field is read
    /// atomically; fields are not read at one instant).
    pub fn snapshot(&self) -> NcCounters {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        NcCounters {
            dma_descriptors: get(&self.dma_descriptors),
            dma_bytes: get(&self.dma_bytes),
            dma_aborts: get(&self.dma_aborts),
            register_writes: get(&self.register_writes),
            doorbells: get(&self.doorbells),
            notifications: get(&self.notifications),
            nq_overflows: get(&self.nq_overflows),
            posted_errors: get(&self.posted_errors),
            resets: get(&self.resets),
            executions: get(&self.executions),
            exec_errors: get(&self.exec_errors),
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
        bump(&counters.dma_descriptors, 1);
        bump(&counters.faults_fired, 15);
        let line = CountersLine(counters.snapshot()).to_string();
        assert_eq!(
            line,
            "dma_descriptors 1, dma_bytes 0, dma_aborts 0, register_writes 0, doorbells 0, \
             notifications 0, nq_overflows 0, posted_errors 0, resets 0, executions 0, \
             exec_errors 0, config_reloads 0, table_loads 0, cc_chains 0, faults_fired 15, \
             neff_shape_only_executions 0, neff_reference_executions 0, inline_executions 0, \
             sequencer_handoffs 0"
        );
    }
}
