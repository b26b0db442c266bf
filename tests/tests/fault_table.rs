//! The fault table of `scenarios/README.md` and the code agree about which injected faults
//! degrade a logical core (issue 11 item 4): for every fault that sets notification error flags,
//! the table's status and "degrades the logical core" column are what simdev's flags for that
//! fault ([`simdev::faults::Effects`]) decode to in the runtime ([`decode_flags`], whose module
//! states the rule). The faults without flags are pinned by their scenarios.

use runtime::completion::decode_flags;
use shared::protocol::FaultKind;
use simdev::faults::Effects;

/// The table's rows: kind → (status column, degrades column).
fn table() -> Vec<(String, String, String)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../scenarios/README.md");
    let text = std::fs::read_to_string(path).expect("scenarios/README.md");
    let start = text
        .find("| kind | what simdev does | what the runtime returns | degrades the logical core |")
        .expect("the fault table with its degrade column");
    text[start..]
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            assert_eq!(cells.len(), 6, "a row of four cells: {l}");
            (
                cells[1].trim_matches('`').to_string(),
                cells[3].to_string(),
                cells[4].to_string(),
            )
        })
        .collect()
}

#[test]
fn the_readme_fault_table_says_what_the_code_does_about_degrading_a_core() {
    let rows = table();
    let flagged = [
        ("nc_uncorrectable", FaultKind::NcUncorrectable),
        ("hbm_uncorrectable", FaultKind::HbmUncorrectable),
        ("hbm_repairable", FaultKind::HbmRepairable),
        ("dma_abort", FaultKind::DmaAbort),
        ("out_of_bounds", FaultKind::OutOfBounds),
        ("generic_error", FaultKind::GenericError),
        ("numerical", FaultKind::Numerical),
    ];
    for (name, kind) in flagged {
        let (_, status, degrades) = rows
            .iter()
            .find(|(k, _, _)| k == name)
            .unwrap_or_else(|| panic!("no row for {name}"));
        let flags = Effects::of(vec![kind]).flags;
        let (decoded, fatal) = decode_flags(flags);
        let code = decoded as i32;
        // Numerical is reported only when asked for (its row says so); the code is the status.
        assert!(
            status.starts_with(&code.to_string()),
            "{name}: the table says {status:?}, the code returns {code}"
        );
        let says = match degrades.as_str() {
            "yes" => true,
            "no" => false,
            other => panic!("{name}: degrade column {other:?} is neither yes nor no"),
        };
        assert_eq!(
            says, fatal,
            "{name}: the table says degrades = {says}, the code decides {fatal}"
        );
    }
    // A timeout and a lost device always degrade the core.
    for name in ["missing_completion", "device_lost"] {
        let (_, _, degrades) = rows.iter().find(|(k, _, _)| k == name).unwrap();
        assert_eq!(degrades, "yes", "{name}");
    }
    let lost = Effects::of(vec![FaultKind::DeviceLost]);
    assert!(lost.device_lost);
    assert!(decode_flags(shared::notification::error_flags::DEVICE_LOST).1);
    // An OOB that a DMA engine refused mid-execution comes with DMA_ABORT: still 1006, and
    // degrading (the queue is stopped), as the text under the table says.
    use shared::notification::error_flags as f;
    assert_eq!(
        decode_flags(f::OOB | f::DMA_ABORT),
        (shared::NrtStatus::ExecOob, true)
    );
}
