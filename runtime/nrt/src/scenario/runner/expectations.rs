//! Judging a step's results against its expectations: one call (`init`, `load`, `unload`,
//! `spawn_client`: status, message, duration) or an `execute` step's executions (status rules,
//! messages, outputs, per-call and per-step timing, NRT_QUEUE_FULL refusals).
//!
//! Each expectation records one PASS/FAIL outcome; without any status expectation an `execute`
//! step expects every call to return NRT_SUCCESS.

use std::collections::BTreeMap;

use runtime::NrtError;
use shared::NrtStatus;

use super::execution::{ExecOutcome, ExecRecord};
use super::{Runner, secs, status_of};
use crate::scenario::models::BuiltModel;
use crate::scenario::report::Recorder;
use crate::scenario::spec::{CallExpect, ExecuteStep, StatusList, StatusSel, parse_status};

/// How many executions ended with each status.
fn histogram(records: &[ExecRecord]) -> BTreeMap<&'static str, u64> {
    let mut h = BTreeMap::new();
    for r in records {
        *h.entry(r.status.name()).or_insert(0) += 1;
    }
    h
}

/// `NAME ×n, ...` or `no calls`.
fn show_hist(h: &BTreeMap<&'static str, u64>) -> String {
    if h.is_empty() {
        return "no calls".into();
    }
    h.iter()
        .map(|(k, v)| format!("{k} ×{v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `A | B | ...`.
fn names(v: &[NrtStatus]) -> String {
    v.iter().map(|s| s.name()).collect::<Vec<_>>().join(" | ")
}

/// The status expectations of a step, resolved.
struct StatusRules {
    each: Option<Vec<NrtStatus>>,
    counts: Option<Vec<(NrtStatus, u64)>>,
    all: Option<NrtStatus>,
    not: Option<Vec<NrtStatus>>,
    one_of: Option<Vec<NrtStatus>>,
}

/// Every status of a list.
fn resolve(list: &[StatusSel]) -> Result<Vec<NrtStatus>, String> {
    list.iter().map(StatusSel::status).collect()
}

impl StatusRules {
    /// The rules of `step` (every call NRT_SUCCESS when it gives none).
    fn of(step: &ExecuteStep) -> Result<Self, String> {
        let counts = match &step.expect_counts {
            None => None,
            Some(m) => {
                let mut out = Vec::new();
                for (k, v) in m {
                    out.push((parse_status(k)?, *v));
                }
                Some(out)
            }
        };
        let mut r = Self {
            each: step.expect_each.as_deref().map(resolve).transpose()?,
            counts,
            all: step.expect.as_ref().map(StatusSel::status).transpose()?,
            not: step
                .expect_not
                .as_ref()
                .map(StatusList::statuses)
                .transpose()?,
            one_of: step.expect_one_of.as_deref().map(resolve).transpose()?,
        };
        if r.each.is_none()
            && r.counts.is_none()
            && r.all.is_none()
            && r.not.is_none()
            && r.one_of.is_none()
        {
            r.all = Some(NrtStatus::Success);
        }
        Ok(r)
    }

    /// Records one outcome per rule over `records` (sorted by execution index).
    fn judge(&self, rec: &mut Recorder, at: &str, records: &[ExecRecord]) {
        let h = histogram(records);
        if let Some(all) = self.all {
            let ok = !records.is_empty() && records.iter().all(|r| r.status == all);
            let seen = match records.iter().find(|r| r.status != all) {
                Some(r) if !r.message.is_empty() => {
                    format!(
                        "{} (first other: call {}: {})",
                        show_hist(&h),
                        r.e,
                        r.message
                    )
                }
                _ => show_hist(&h),
            };
            rec.record(ok, at, format!("every call returns {}", all.name()), seen);
        }
        if let Some(each) = &self.each {
            let seen: Vec<NrtStatus> = records.iter().map(|r| r.status).collect();
            rec.record(
                seen == *each,
                at,
                format!("calls return, in order, [{}]", names(each)),
                format!("[{}]", names(&seen)),
            );
        }
        if let Some(counts) = &self.counts {
            let mut ok = true;
            for (s, n) in counts {
                if h.get(s.name()).copied().unwrap_or(0) != *n {
                    ok = false;
                }
            }
            for (name, n) in &h {
                if *n > 0 && !counts.iter().any(|(s, _)| s.name() == *name) {
                    ok = false;
                }
            }
            let want: BTreeMap<&'static str, u64> =
                counts.iter().map(|(s, n)| (s.name(), *n)).collect();
            rec.record(
                ok,
                at,
                format!("statuses {}", show_hist(&want)),
                show_hist(&h),
            );
        }
        if let Some(not) = &self.not {
            let ok = !records.is_empty() && records.iter().all(|r| !not.contains(&r.status));
            rec.record(
                ok,
                at,
                format!("no call returns {}", names(not)),
                show_hist(&h),
            );
        }
        if let Some(one_of) = &self.one_of {
            let ok = !records.is_empty() && records.iter().all(|r| one_of.contains(&r.status));
            rec.record(
                ok,
                at,
                format!("every call returns one of {}", names(one_of)),
                show_hist(&h),
            );
        }
    }
}

impl Runner<'_> {
    /// Judges one call: its status (default NRT_SUCCESS), message and duration.
    pub(super) fn judge_call(
        &mut self,
        at: &str,
        step: CallExpect<'_>,
        r: &Result<(), NrtError>,
        took: f64,
    ) {
        let want = match step.expect.map(StatusSel::status).transpose() {
            Ok(w) => w.unwrap_or(NrtStatus::Success),
            Err(e) => {
                self.rec.fail(at, "a valid expect", e);
                return;
            }
        };
        let seen = match r {
            Ok(()) => NrtStatus::Success.name().to_string(),
            Err(e) => format!("{}: {}", e.status.name(), e.message),
        };
        self.rec
            .record(status_of(r) == want, at, want.name().to_string(), seen);
        if let Some(sub) = step.message_contains {
            let msg = r
                .as_ref()
                .err()
                .map(|e| e.message.clone())
                .unwrap_or_default();
            self.rec.record(
                msg.contains(sub),
                at,
                format!("the error message contains {sub:?}"),
                if msg.is_empty() {
                    "no error".to_string()
                } else {
                    format!("{msg:?}")
                },
            );
        }
        if let Some(max) = step.max_step_s {
            self.rec.record(
                took <= max,
                at,
                format!("returns within {}", secs(max)),
                format!("took {}", secs(took)),
            );
        }
    }
    /// Judges an `execute` step's executions (`m`: the model, for output checks).
    pub(super) fn judge_exec(
        &mut self,
        at: &str,
        step: &ExecuteStep,
        o: &ExecOutcome,
        m: Option<&BuiltModel>,
    ) {
        for e in &o.errors {
            self.rec.fail(at, "the execution is set up", e.clone());
        }
        match StatusRules::of(step) {
            Ok(rules) => rules.judge(&mut self.rec, at, &o.records),
            Err(e) => self.rec.fail(at, "valid status expectations", e),
        }
        if let Some(sub) = &step.expect_message_contains {
            let failed: Vec<&ExecRecord> = o
                .records
                .iter()
                .filter(|r| r.status != NrtStatus::Success)
                .collect();
            let bad = failed.iter().find(|r| !r.message.contains(sub.as_str()));
            let ok = !failed.is_empty() && bad.is_none();
            let seen = match (failed.first(), bad) {
                (None, _) => "no call failed".to_string(),
                (_, Some(r)) => format!("call {}: {:?}", r.e, r.message),
                (Some(r), None) => format!("{:?}", r.message),
            };
            self.rec.record(
                ok,
                at,
                format!("every failed call's message contains {sub:?}"),
                seen,
            );
        }
        if m.is_some_and(BuiltModel::checkable) && step.check_outputs.unwrap_or(true) {
            let checked: Vec<&ExecRecord> =
                o.records.iter().filter(|r| r.output.is_some()).collect();
            if !checked.is_empty() {
                let wrong: Vec<&String> = checked
                    .iter()
                    .filter_map(|r| r.output.as_ref().and_then(|x| x.as_ref().err()))
                    .collect();
                self.rec.record(
                    wrong.is_empty(),
                    at,
                    "every delivered output equals the reference",
                    match wrong.first() {
                        None => format!("{}/{} equal", checked.len(), checked.len()),
                        Some(w) => format!(
                            "{}/{} equal; {w}",
                            checked.len() - wrong.len(),
                            checked.len()
                        ),
                    },
                );
            }
        }
        let slowest = o.records.iter().max_by(|a, b| a.secs.total_cmp(&b.secs));
        let fastest = o.records.iter().min_by(|a, b| a.secs.total_cmp(&b.secs));
        let limit = |rec: &mut Recorder, max: f64, what: String| {
            let seen = slowest.map_or("no calls".to_string(), |r| {
                format!(
                    "slowest {} (call {}, {})",
                    secs(r.secs),
                    r.e,
                    r.status.name()
                )
            });
            rec.record(slowest.is_some_and(|r| r.secs <= max), at, what, seen);
        };
        if let Some(max) = step.max_call_s {
            limit(
                &mut self.rec,
                max,
                format!("every call returns within {}", secs(max)),
            );
        }
        if let Some(margin) = step.within_timeout_plus_s {
            let t = self.exec_timeout();
            limit(
                &mut self.rec,
                t + margin,
                format!(
                    "every call returns within the timeout + {} = {}",
                    secs(margin),
                    secs(t + margin)
                ),
            );
        }
        if let Some(min) = step.min_call_s {
            self.rec.record(
                fastest.is_some_and(|r| r.secs >= min),
                at,
                format!("every call takes at least {}", secs(min)),
                fastest.map_or("no calls".to_string(), |r| {
                    format!("fastest {} (call {})", secs(r.secs), r.e)
                }),
            );
        }
        if let Some(min) = step.min_queue_full {
            self.rec.record(
                o.queue_full >= min,
                at,
                format!("NRT_QUEUE_FULL refused a schedule at least {min} times"),
                format!("{} times", o.queue_full),
            );
        }
        if let Some(max) = step.max_step_s {
            self.rec.record(
                o.seconds <= max,
                at,
                format!("the step takes at most {}", secs(max)),
                format!("took {}", secs(o.seconds)),
            );
        }
    }
}
