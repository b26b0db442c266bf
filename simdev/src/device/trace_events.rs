//! Trace helpers: the doorbell and DMA-run events the device records, and the time each is
//! stamped with ([`crate::trace`] holds the tracer and the event format).

use crate::dma::{DmaCounts, DmaQueueId};
use crate::trace::{Detail, Event};

use super::{Core, Nc};

impl Core {
    pub(super) fn trace_doorbell(&self, nc: &Nc, semaphore: u32, value: u32) {
        self.tracer.record(Event {
            nc: nc.index,
            ts_ns: self.device_time_ns(nc),
            dur_ns: None,
            detail: Detail::Doorbell { semaphore, value },
        });
    }

    /// Records a run of queue `id` that completed `pairs` pairs of `bytes` bytes (nothing when
    /// it completed none); `wall_ns` is when it began on the wall clock.
    #[expect(clippy::too_many_arguments, reason = "one event's fields")]
    pub(super) fn trace_dma(
        &self,
        nc: &Nc,
        id: DmaQueueId,
        pairs: u64,
        bytes: u64,
        batch: bool,
        at: TraceAt,
        wall_ns: u64,
    ) {
        if pairs == 0 {
            return;
        }
        let (ts_ns, dur_ns) = match at {
            TraceAt::Sim(ts) => (ts, 0),
            TraceAt::Now if self.simulated() => (nc.clock.now(), 0),
            TraceAt::Now => (wall_ns, self.now_ns().saturating_sub(wall_ns)),
        };
        self.tracer.record(Event {
            nc: nc.index,
            ts_ns,
            dur_ns: Some(dur_ns),
            detail: Detail::Dma {
                engine: id.engine,
                queue: id.queue,
                pairs,
                bytes,
                batch,
            },
        });
    }
}

/// The trace time of a DMA run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TraceAt {
    /// The NC's device time when it runs (measured on the wall clock without a latency model).
    Now,
    /// This simulated time (inside an execution, under a latency model).
    Sim(u64),
}

/// Counters and time at the start of a traced DMA run.
pub(super) struct DmaMark {
    pub(super) wall_ns: u64,
    pub(super) pairs: u64,
    pub(super) bytes: u64,
}

impl DmaMark {
    /// The mark of a run starting now, with the NC's DMA counts `counts` (copied under its
    /// state lock, which the run holds).
    pub(super) fn take(core: &Core, counts: DmaCounts) -> Self {
        Self {
            wall_ns: core.now_ns(),
            pairs: counts.descriptors,
            bytes: counts.bytes,
        }
    }
}
