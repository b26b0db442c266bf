//! `[[expect]]` and `[[steps.check]]`: one serde enum, tagged by `what`, one struct per check.
//!
//! As with steps, every struct has `deny_unknown_fields`, and the list deserializers put the
//! check's position and `what` in front of an error (`expect 2 (counters): unknown field ...`).

use serde::{Deserialize, Deserializer};

use super::{Bound, named_list};

/// One check.
#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "what", rename_all = "snake_case")]
pub enum Check {
    /// simdev's counters of one NC (boxed: 14 bounds).
    Counters(Box<CountersCheck>),
    /// simdev's device-wide usage.
    DeviceStats(DeviceStatsCheck),
    /// Nothing held beyond the baseline.
    NoLeaks(NoLeaksCheck),
    /// The runtime's XU of a logical core.
    XuHealth(XuHealthCheck),
    /// Late notifications the runtime discarded.
    StaleNotifications(StaleNotificationsCheck),
    /// Simulated execution time of an NC.
    SimTime(SimTimeCheck),
    /// Whether simdev still runs.
    Simdev(SimdevCheck),
}

impl Check {
    /// The `what` value, as written in the file.
    pub fn what(&self) -> &'static str {
        match self {
            Self::Counters(_) => "counters",
            Self::DeviceStats(_) => "device_stats",
            Self::NoLeaks(_) => "no_leaks",
            Self::XuHealth(_) => "xu_health",
            Self::StaleNotifications(_) => "stale_notifications",
            Self::SimTime(_) => "sim_time",
            Self::Simdev(_) => "simdev",
        }
    }

    /// How long to poll until the check holds (`within_s`; default 0, `no_leaks` 3 s).
    pub fn within_s(&self) -> f64 {
        match self {
            Self::Counters(c) => c.within_s.unwrap_or(0.0),
            Self::DeviceStats(c) => c.within_s.unwrap_or(0.0),
            Self::NoLeaks(c) => c.within_s.unwrap_or(3.0),
            Self::Simdev(c) => c.within_s.unwrap_or(0.0),
            Self::XuHealth(_) | Self::StaleNotifications(_) | Self::SimTime(_) => 0.0,
        }
    }
}

/// `[[expect]]`: each entry's errors name `expect N (what)`.
pub(super) fn expect_checks<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Check>, D::Error> {
    named_list(d, "expect", "what")
}

/// A `check` step's `[[steps.check]]`: each entry's errors name `check N (what)`.
pub(super) fn step_checks<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Check>, D::Error> {
    named_list(d, "check", "what")
}

/// `counters`: bounds on simdev's counters of one NC (cumulative since simdev started).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CountersCheck {
    /// The physical NC.
    pub nc: Option<u32>,
    /// Poll until the check holds, for at most this long.
    #[serde(default, deserialize_with = "super::seconds::opt")]
    pub within_s: Option<f64>,
    /// DMA descriptors processed.
    pub dma_descriptors: Option<Bound>,
    /// Bytes moved by the NC's DMA engines.
    pub dma_bytes: Option<Bound>,
    /// Queues stopped by a bad descriptor or a DMA abort.
    pub dma_aborts: Option<Bound>,
    /// Register writes.
    pub register_writes: Option<Bound>,
    /// Doorbells rung.
    pub doorbells: Option<Bound>,
    /// Notifications written.
    pub notifications: Option<Bound>,
    /// Notification-queue overflows.
    pub nq_overflows: Option<Bound>,
    /// Errors posted.
    pub posted_errors: Option<Bound>,
    /// Resets.
    pub resets: Option<Bound>,
    /// Executions that posted a notification.
    pub executions: Option<Bound>,
    /// ... with error flags.
    pub exec_errors: Option<Bound>,
    /// Sequencer config reloads.
    pub config_reloads: Option<Bound>,
    /// Activation/DVE table loads.
    pub table_loads: Option<Bound>,
    /// Collectives model-switch chains.
    pub cc_chains: Option<Bound>,
    /// NEFF programs simdev ran shape-only (no instruction semantics).
    pub neff_shape_only_executions: Option<Bound>,
    /// NEFF programs whose outputs a bound reference computed.
    pub neff_reference_executions: Option<Bound>,
    /// Executions run on the thread that delivered their doorbell (no thread hand-off).
    pub inline_executions: Option<Bound>,
    /// Executions handed to the NC's sequencer thread.
    pub sequencer_handoffs: Option<Bound>,
}

impl CountersCheck {
    /// Every counter key with its bound, in report order.
    pub fn bounds(&self) -> [(&'static str, Option<&Bound>); 18] {
        [
            ("dma_descriptors", self.dma_descriptors.as_ref()),
            ("dma_bytes", self.dma_bytes.as_ref()),
            ("dma_aborts", self.dma_aborts.as_ref()),
            ("register_writes", self.register_writes.as_ref()),
            ("doorbells", self.doorbells.as_ref()),
            ("notifications", self.notifications.as_ref()),
            ("nq_overflows", self.nq_overflows.as_ref()),
            ("posted_errors", self.posted_errors.as_ref()),
            ("resets", self.resets.as_ref()),
            ("executions", self.executions.as_ref()),
            ("exec_errors", self.exec_errors.as_ref()),
            ("config_reloads", self.config_reloads.as_ref()),
            ("table_loads", self.table_loads.as_ref()),
            ("cc_chains", self.cc_chains.as_ref()),
            (
                "neff_shape_only_executions",
                self.neff_shape_only_executions.as_ref(),
            ),
            (
                "neff_reference_executions",
                self.neff_reference_executions.as_ref(),
            ),
            ("inline_executions", self.inline_executions.as_ref()),
            ("sequencer_handoffs", self.sequencer_handoffs.as_ref()),
        ]
    }
}

/// `device_stats`: bounds on simdev's device-wide usage.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceStatsCheck {
    /// Poll until the check holds, for at most this long.
    #[serde(default, deserialize_with = "super::seconds::opt")]
    pub within_s: Option<f64>,
    /// Bytes of client chunks.
    pub memory_in_use: Option<Bound>,
    /// Client chunks.
    pub chunks: Option<Bound>,
    /// Connected clients (the runner's control connection is one).
    pub clients: Option<Bound>,
    /// Claimed NCs.
    pub claimed_ncs: Option<Bound>,
    /// DMA queues.
    pub dma_queues: Option<Bound>,
    /// Faults armed and not yet fired.
    pub armed_faults: Option<Bound>,
}

impl DeviceStatsCheck {
    /// Every stat key with its bound, in report order.
    pub fn bounds(&self) -> [(&'static str, Option<&Bound>); 6] {
        [
            ("memory_in_use", self.memory_in_use.as_ref()),
            ("chunks", self.chunks.as_ref()),
            ("clients", self.clients.as_ref()),
            ("claimed_ncs", self.claimed_ncs.as_ref()),
            ("dma_queues", self.dma_queues.as_ref()),
            ("armed_faults", self.armed_faults.as_ref()),
        ]
    }
}

/// `no_leaks`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoLeaksCheck {
    /// Poll until the check holds, for at most this long (default 3 s).
    #[serde(default, deserialize_with = "super::seconds::opt")]
    pub within_s: Option<f64>,
}

/// The health of an XU, as `xu_health` names it.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum HealthName {
    /// Running.
    #[default]
    Healthy,
    /// Shut down.
    Shutdown,
    /// Degraded: calls get 101.
    FatalShutdown,
}

impl HealthName {
    /// As written in the file.
    pub fn name(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::Shutdown => "shutdown",
            Self::FatalShutdown => "fatal_shutdown",
        }
    }
}

/// `xu_health`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct XuHealthCheck {
    /// The logical core (default 0).
    pub vnc: Option<u32>,
    /// The health (default healthy).
    #[serde(default)]
    pub health: HealthName,
}

/// `stale_notifications`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaleNotificationsCheck {
    /// Late notifications the runtime discarded.
    pub count: Option<Bound>,
}

/// `sim_time`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimTimeCheck {
    /// The physical NC.
    pub nc: Option<u32>,
    /// Subtract this NC's simulated time.
    pub minus_nc: Option<u32>,
    /// Simulated nanoseconds.
    pub ns: Option<Bound>,
}

/// `simdev`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimdevCheck {
    /// Whether simdev is still running (default true).
    pub running: Option<bool>,
    /// Poll until the check holds, for at most this long.
    #[serde(default, deserialize_with = "super::seconds::opt")]
    pub within_s: Option<f64>,
}

#[cfg(test)]
mod tests {
    use crate::scenario::spec::parse;

    /// Every check with a minimal body.
    const MINIMAL: [(&str, &str); 7] = [
        ("counters", "nc = 0\nexecutions = 1"),
        ("device_stats", "clients = \"baseline\""),
        ("no_leaks", ""),
        ("xu_health", "vnc = 0"),
        ("stale_notifications", "count = 0"),
        ("sim_time", "nc = 0\nns = { min = 1 }"),
        ("simdev", "running = true"),
    ];

    #[test]
    fn every_check_parses_and_refuses_an_unknown_key() {
        let e = parse("[[expect]]\nwhat = \"nope\"\n").unwrap_err();
        assert!(
            e.starts_with("expect 1 (nope): unknown variant `nope`"),
            "{e}"
        );
        let known = e.split("expected one of ").nth(1).unwrap_or_default();
        assert_eq!(known.split(", ").count(), MINIMAL.len(), "{e}");
        for (what, body) in MINIMAL {
            assert!(known.contains(&format!("`{what}`")), "{known}");
            let sc = parse(&format!("[[expect]]\nwhat = \"{what}\"\n{body}\n"))
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(sc.expect[0].what(), what);
            let e = parse(&format!(
                "[[expect]]\nwhat = \"{what}\"\n{body}\nbogus_key = 1\n"
            ))
            .unwrap_err();
            assert!(
                e.starts_with(&format!("expect 1 ({what}): unknown field `bogus_key`")),
                "{what}: {e}"
            );
        }
        let e = parse("[[expect]]\nnc = 0\n").unwrap_err();
        assert!(e.starts_with("expect 1: missing field `what`"), "{e}");
    }

    #[test]
    fn no_leaks_polls_three_seconds_by_default() {
        let sc =
            parse("[[expect]]\nwhat = \"no_leaks\"\n[[expect]]\nwhat = \"counters\"\nnc = 0\nexecutions = 1\n")
                .unwrap();
        assert_eq!(sc.expect[0].within_s(), 3.0);
        assert_eq!(sc.expect[1].within_s(), 0.0);
    }

    #[test]
    fn a_misspelt_range_key_is_refused() {
        let e = parse("[[expect]]\nwhat = \"counters\"\nnc = 0\nexecutions = { mn = 1 }\n")
            .unwrap_err();
        assert!(
            e.starts_with("expect 1 (counters): unknown field `mn`, expected `min` or `max`"),
            "{e}"
        );
        let e = parse("[[expect]]\nwhat = \"counters\"\nnc = 0\nexecutions = -1\n").unwrap_err();
        assert!(
            e.starts_with("expect 1 (counters): a bound is a number"),
            "{e}"
        );
        for ok in ["3", "\"baseline\"", "{ max = 2 }"] {
            parse(&format!(
                "[[expect]]\nwhat = \"counters\"\nnc = 0\nexecutions = {ok}\n"
            ))
            .unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        parse("[[expect]]\nwhat = \"counters\"\nnc = 0\nexecutions = { min = 1 }\n").unwrap();
    }
}
