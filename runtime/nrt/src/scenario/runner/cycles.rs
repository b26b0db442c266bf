//! `cycles`: `count` load / unload cycles of one model (with `execute_each`, one checked
//! execution per cycle), then the resident-memory bound: after `warmup` cycles the runner's
//! `VmRSS` is taken as the baseline (and a snapshot is recorded under `name`), and at the end it
//! may have grown at most `max_rss_growth_kib`.

use std::time::Instant;

use runtime::NrtError;
use shared::NrtStatus;

use super::execution::{ExecParams, prepare, slot, verify};
use super::{Runner, secs};
use crate::scenario::spec::CyclesStep;

/// Resident memory of this process in KiB (`VmRSS`).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

impl Runner<'_> {
    /// `cycles`.
    pub(super) fn cycles(&mut self, at: &str, step: &CyclesStep) {
        let Some(rt) = self.runtime(at) else { return };
        let Some((_, m)) = self.defined_model(at, step.model.as_deref()) else {
            return;
        };
        let count = step.count.unwrap_or(1000);
        let warmup = step.warmup.unwrap_or(50).min(count);
        let vnc = step.vnc.unwrap_or(0);
        let exec = step.execute_each.unwrap_or(false);
        let p = ExecParams {
            count: 1,
            threads: 1,
            asynchronous: false,
            host: false,
            tensors_vnc: u32::try_from(vnc.max(0)).unwrap_or(0),
            tensors_from: None,
            check: true,
            inflight: 1,
            seed: self.sc.device.seed,
            jobs: None,
        };
        let s = if exec {
            match slot(&rt, &m, &p) {
                Ok(s) => Some(s),
                Err(e) => {
                    self.rec.fail(at, "the tensors are allocated", e);
                    return;
                }
            }
        } else {
            None
        };
        let t0 = Instant::now();
        let (mut ok, mut first_err) = (0u64, None::<String>);
        let mut rss_base = rss_kib();
        let snap_name = step.name.clone().unwrap_or_else(|| "warmup".into());
        let mut warm = None;
        for i in 0..count {
            if i == warmup {
                rss_base = rss_kib();
                warm = Some(self.snapshot());
            }
            let r = rt.load(&m.container, vnc).and_then(|h| {
                let run = match &s {
                    Some(s) => {
                        let input = prepare(&m, &p, s, i)
                            .map_err(|e| NrtError::new(NrtStatus::Failure, e))?;
                        let r = rt.execute(h, &s.ins, &s.outs);
                        match (r, verify(&m, &p, s, i, NrtStatus::Success, &input)) {
                            (Err(e), _) => Err(e),
                            (Ok(()), Some(Err(e))) => Err(NrtError::new(NrtStatus::Failure, e)),
                            (Ok(()), _) => Ok(()),
                        }
                    }
                    None => Ok(()),
                };
                let u = rt.unload(h);
                run.and(u)
            });
            match r {
                Ok(()) => ok += 1,
                Err(e) => {
                    if first_err.is_none() {
                        first_err = Some(format!("cycle {i}: {e}"));
                    }
                }
            }
        }
        drop(s);
        let took = t0.elapsed().as_secs_f64();
        let warm = warm.unwrap_or_else(|| self.snapshot());
        self.snapshots.insert(snap_name, warm);
        let rss_end = rss_kib();
        self.rec.record(
            ok == count,
            at,
            format!(
                "{count} load{} / unload cycles succeed",
                if exec { " / execute" } else { "" }
            ),
            format!(
                "{ok} succeeded in {}{}",
                secs(took),
                first_err.map(|e| format!("; {e}")).unwrap_or_default()
            ),
        );
        if let Some(max) = step.max_rss_growth_kib {
            let grew = rss_end.saturating_sub(rss_base);
            self.rec.record(
                grew <= max,
                at,
                format!("resident memory grows at most {max} KiB after {warmup} warm-up cycles"),
                format!("{rss_base} KiB -> {rss_end} KiB (+{grew} KiB)"),
            );
        }
        if let Some(max) = step.max_step_s {
            self.rec.record(
                took <= max,
                at,
                format!("the step takes at most {}", secs(max)),
                format!("took {}", secs(took)),
            );
        }
    }
}
