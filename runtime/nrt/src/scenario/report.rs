//! Results: one line per expectation, `PASS|FAIL <scenario> <where>: <expected> — <seen>`, or
//! one JSON object per file.

use serde::Serialize;

/// One expectation's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    /// Whether it held.
    pub pass: bool,
    /// Where: `step 3 execute(m)`, `expect 2 counters`, `setup`, ...
    pub at: String,
    /// What was expected.
    pub expected: String,
    /// What was seen.
    pub seen: String,
}

/// One file's report.
#[derive(Debug, Serialize)]
pub struct FileReport {
    /// The file.
    pub file: String,
    /// The scenario's name.
    pub scenario: String,
    /// The scenario's description.
    pub description: Option<String>,
    /// Every expectation held.
    pub passed: bool,
    /// Expectations that held.
    pub pass_count: usize,
    /// Expectations that did not.
    pub fail_count: usize,
    /// Wall-clock seconds the scenario took.
    pub seconds: f64,
    /// Each expectation, in order.
    pub results: Vec<Outcome>,
}

/// Outcomes as they are recorded, readable from another thread (the time-limit watchdog
/// reports what held and what did not before it stopped the scenario).
#[derive(Debug, Default)]
pub struct Tally {
    outcomes: std::sync::Mutex<Vec<Outcome>>,
}

impl Tally {
    /// The outcomes so far.
    pub fn outcomes(&self) -> Vec<Outcome> {
        self.outcomes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// Collects outcomes and prints them as they come (text mode).
#[derive(Debug)]
pub struct Recorder {
    scenario: String,
    print: bool,
    /// Outcomes so far.
    pub outcomes: Vec<Outcome>,
    tally: std::sync::Arc<Tally>,
}

impl Recorder {
    /// A recorder for `scenario`; `print` writes each line as it is recorded.
    pub fn new(scenario: &str, print: bool) -> Self {
        Self {
            scenario: scenario.into(),
            print,
            outcomes: Vec::new(),
            tally: std::sync::Arc::default(),
        }
    }

    /// Counts the outcomes from now on in `tally` as well.
    pub fn count_in(&mut self, tally: std::sync::Arc<Tally>) {
        self.tally = tally;
    }

    /// Records one outcome.
    pub fn record(
        &mut self,
        pass: bool,
        at: &str,
        expected: impl Into<String>,
        seen: impl Into<String>,
    ) {
        let o = Outcome {
            pass,
            at: at.into(),
            expected: expected.into(),
            seen: seen.into(),
        };
        if self.print {
            println!("{}", line(&self.scenario, &o));
        }
        self.tally
            .outcomes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(o.clone());
        self.outcomes.push(o);
    }

    /// A failure that is not a comparison (a step that could not run).
    pub fn fail(&mut self, at: &str, expected: impl Into<String>, seen: impl Into<String>) {
        self.record(false, at, expected, seen);
    }

    /// The scenario's name.
    pub fn scenario(&self) -> &str {
        &self.scenario
    }

    /// Whether anything failed.
    pub fn failed(&self) -> bool {
        self.outcomes.iter().any(|o| !o.pass)
    }
}

/// The text line of `o`.
pub fn line(scenario: &str, o: &Outcome) -> String {
    // One line per expectation, whatever a quoted message holds (clap's usage text, ...).
    let one_line = |s: &str| {
        s.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join("; ")
    };
    format!(
        "{} {scenario} {}: {} — {}",
        if o.pass { "PASS" } else { "FAIL" },
        o.at,
        one_line(&o.expected),
        one_line(&o.seen)
    )
}
