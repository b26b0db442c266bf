//! The unread end of a private simdev's log (`<tmp>/simdev.log`, its stderr): what it said at
//! warn or error level since the last look, so a failed execution's reason (a reference's
//! exception, a DMA abort, a mismatch with a golden file) reaches the user's stderr instead of
//! staying in a file that is removed with the private directory.
//!
//! simdev writes each log event with one `write` before it posts the notification the event
//! explains, so when the runtime has harvested a failed execution, the lines that explain it
//! are already in the file. Only whole lines are taken; a line still being written is left for
//! the next look.
//!
//! simdev's lines are `tracing_subscriber`'s default format, `<timestamp>  <LEVEL> <target>:
//! <message>`. Lines at INFO, DEBUG or TRACE are skipped; of WARN and ERROR lines the message
//! is kept; lines not in that format (a panic message, a Python reference's own stderr) are
//! kept whole.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;

/// Bytes read per look at most: of a longer backlog only the last [`MAX_READ`] bytes are
/// read, and the skip is said.
const MAX_READ: u64 = 64 * 1024;
/// Lines kept per look at most (the latest); the count of the earlier ones is said.
const MAX_LINES: usize = 32;

/// Where the last look at a log file stopped.
#[derive(Debug)]
pub struct LogTail {
    path: PathBuf,
    /// Byte offset of the first byte not yet taken (always just past a newline, or 0).
    offset: u64,
}

impl LogTail {
    /// A tail of `path` from its start.
    pub fn new(path: PathBuf) -> Self {
        Self { path, offset: 0 }
    }

    /// The warn and error lines written since the last call: the latest [`MAX_LINES`], after
    /// one line counting what was left out, if anything was. Empty when the file cannot be
    /// read (it is gone with its directory, or was never written).
    pub fn take(&mut self) -> Vec<String> {
        let Ok(mut file) = File::open(&self.path) else {
            return Vec::new();
        };
        let Ok(len) = file.metadata().map(|m| m.len()) else {
            return Vec::new();
        };
        if len < self.offset {
            // Truncated under us (it is simdev's alone to write): start again.
            self.offset = 0;
        }
        let skipped = (len - self.offset).saturating_sub(MAX_READ);
        let start = self.offset + skipped;
        let mut bytes = Vec::new();
        if file.seek(SeekFrom::Start(start)).is_err()
            || file.take(MAX_READ).read_to_end(&mut bytes).is_err()
        {
            return Vec::new();
        }
        let Some(whole) = bytes.iter().rposition(|&b| b == b'\n').map(|i| i + 1) else {
            if skipped > 0 {
                // One line longer than a look: taken as it is, not waited for.
                self.offset = start + bytes.len() as u64;
                return vec![format!("(a log line of over {MAX_READ} bytes skipped)")];
            }
            return Vec::new();
        };
        self.offset = start + whole as u64;
        let text = String::from_utf8_lossy(&bytes[..whole]);
        let mut lines = text.lines();
        if skipped > 0 {
            // The first line may have been cut at `start`.
            lines.next();
        }
        let mut kept: Vec<String> = lines.filter_map(keep).collect();
        // The latest lines are the ones that explain what just failed.
        let dropped = kept.len().saturating_sub(MAX_LINES);
        kept.drain(..dropped);
        if skipped > 0 || dropped > 0 {
            kept.insert(
                0,
                format!(
                    "(earlier lines of simdev's log not shown: {skipped} bytes, {dropped} lines)"
                ),
            );
        }
        kept
    }
}

/// `line` as it is passed on: `None` for an empty line or one below warn level.
fn keep(line: &str) -> Option<String> {
    let line = strip_ansi(line);
    let line = line.trim();
    if line.is_empty() {
        return None;
    }
    let Some((stamp, after_stamp)) = line.split_once(char::is_whitespace) else {
        return Some(line.to_string());
    };
    let is_stamp = stamp.len() >= 20
        && stamp.bytes().take(4).all(|b| b.is_ascii_digit())
        && stamp.as_bytes().get(10) == Some(&b'T')
        && stamp.ends_with('Z');
    if !is_stamp {
        return Some(line.to_string());
    }
    let (level, rest) = after_stamp
        .trim_start()
        .split_once(char::is_whitespace)
        .unwrap_or((after_stamp.trim_start(), ""));
    match level {
        "TRACE" | "DEBUG" | "INFO" => None,
        "WARN" | "ERROR" => {
            let rest = rest.trim_start();
            // The target (a module path of simdev's, after any span names) says nothing
            // to the user; the message names the NC and the execution itself.
            let message = match rest.split_once(": ") {
                Some((target, message)) if !target.contains(' ') => message,
                _ => rest,
            };
            Some(message.to_string()).filter(|m| !m.is_empty())
        }
        _ => Some(line.to_string()),
    }
}

/// `line` without ANSI colour sequences (`ESC [ ... m`), which a simdev logging to a
/// terminal would write.
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::io::Write;

    fn append(path: &std::path::Path, text: &str) {
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }

    #[test]
    fn keeps_warn_and_error_lines_and_lines_of_no_level_and_skips_the_rest() {
        // As simdev wrote them before it stopped colouring files (escape sequences included).
        let coloured = "\u{1b}[2m2026-12-03T08:52:56.625288Z\u{1b}[0m \u{1b}[33m WARN\u{1b}[0m \
                        \u{1b}[2msimdev::server\u{1b}[0m\u{1b}[2m:\u{1b}[0m client 1: refused";
        assert_eq!(keep(coloured).as_deref(), Some("client 1: refused"));
        assert_eq!(
            keep("2026-12-03T08:52:56.625288Z ERROR simdev::device: NC 0 execution 3: kaboom")
                .as_deref(),
            Some("NC 0 execution 3: kaboom")
        );
        assert_eq!(
            keep("2026-12-03T08:52:56.625288Z  INFO simdev::device: late notification"),
            None
        );
        assert_eq!(keep("2026-12-03T08:52:56.625288Z DEBUG simdev: x"), None);
        assert_eq!(
            keep("2026-12-03T08:52:56.625288Z  WARN load{nc=0}:simdev::dma: a hostile descriptor")
                .as_deref(),
            Some("a hostile descriptor")
        );
        assert_eq!(
            keep("Traceback (most recent call last):").as_deref(),
            Some("Traceback (most recent call last):")
        );
        assert_eq!(keep("   "), None);
        // Anything else, however odd, is kept or skipped without a panic.
        assert_eq!(
            keep("  2026-12-03T08:52:56.625288Z  WARN  é: ü").as_deref(),
            Some("ü")
        );
        assert_eq!(keep("2026-12-03T08:52:56.625288Z ERROR"), None);
        assert_eq!(
            keep("2026-12-03T08:52:56.625288Z").as_deref(),
            Some("2026-12-03T08:52:56.625288Z")
        );
        assert_eq!(
            keep("ééééééééééééééééééééééé x").as_deref(),
            Some("ééééééééééééééééééééééé x")
        );
        assert_eq!(keep("\u{1b}[").as_deref(), None);
    }

    #[test]
    fn each_line_is_taken_once_and_a_partial_line_waits_for_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("simdev.log");
        let mut tail = LogTail::new(path.clone());
        assert!(tail.take().is_empty(), "no file yet");
        append(&path, "2026-12-03T08:00:00.000000Z ERROR simdev: first\n");
        append(&path, "2026-12-03T08:00:00.000001Z  WARN simdev: sec");
        assert_eq!(tail.take(), ["first"]);
        assert!(tail.take().is_empty(), "the first line is not taken twice");
        append(
            &path,
            "ond\n2026-12-03T08:00:00.000002Z  INFO simdev: quiet\n",
        );
        assert_eq!(tail.take(), ["second"]);
        assert!(tail.take().is_empty());
    }

    #[test]
    fn a_long_backlog_is_cut_to_its_end_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("simdev.log");
        let line = "2026-12-03T08:00:00.000000Z ERROR simdev: a failure of some length\n";
        let max_read = usize::try_from(MAX_READ).unwrap();
        let n = 2 * max_read / line.len();
        append(&path, &line.repeat(n));
        append(
            &path,
            "2026-12-03T08:00:00.000000Z ERROR simdev: the last\n",
        );
        let mut tail = LogTail::new(path.clone());
        let got = tail.take();
        assert_eq!(got.len(), MAX_LINES + 1);
        // The last look reads the last MAX_READ bytes: "the last" line and, before it, whole
        // repeated lines after the first newline in the window.
        let last = "2026-12-03T08:00:00.000000Z ERROR simdev: the last\n".len();
        let before = max_read - last;
        let whole = before / line.len() - usize::from(before.is_multiple_of(line.len()));
        let bytes = (n * line.len() + last) as u64 - MAX_READ;
        assert_eq!(
            got[0],
            format!(
                "(earlier lines of simdev's log not shown: {bytes} bytes, {} lines)",
                whole + 1 - MAX_LINES
            )
        );
        assert_eq!(got[MAX_LINES], "the last", "the latest line is kept");
        assert!(tail.take().is_empty(), "everything was taken");
        // A truncated file is read again from its start.
        std::fs::write(&path, "2026-12-03T08:00:00.000000Z ERROR simdev: anew\n").unwrap();
        assert_eq!(tail.take(), ["anew"]);
    }

    #[test]
    fn a_line_longer_than_a_look_is_skipped_not_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("simdev.log");
        append(&path, &"x".repeat(2 * usize::try_from(MAX_READ).unwrap()));
        let mut tail = LogTail::new(path.clone());
        assert_eq!(tail.take().len(), 1);
        append(
            &path,
            "x\n2026-12-03T08:00:00.000000Z ERROR simdev: after\n",
        );
        assert_eq!(tail.take(), ["x", "after"]);
    }

    proptest! {
        #[test]
        fn any_line_is_kept_or_skipped_without_a_panic_or_an_escape(line in "(\\PC|\u{1b}| ){0,80}") {
            if let Some(kept) = keep(&line) {
                prop_assert!(!kept.contains('\u{1b}'), "an escape in {:?}", kept);
                prop_assert!(!kept.is_empty());
            }
        }

        #[test]
        fn every_whole_line_is_taken_once_however_the_writes_split_it(
            lines in proptest::collection::vec(
                prop_oneof![
                    "[a-z ]{0,20}",
                    "(ERROR|WARN|INFO) [a-z]{1,8}: [a-z ]{0,20}"
                        .prop_map(|l| format!("2026-12-03T08:00:00.000000Z {l}")),
                ],
                0..20,
            ),
            cuts in proptest::collection::vec(0usize..400, 0..8),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("simdev.log");
            std::fs::write(&path, "").unwrap();
            let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(text.len())).collect();
            cuts.push(text.len());
            cuts.sort_unstable();
            let mut tail = LogTail::new(path.clone());
            let (mut got, mut from) = (Vec::new(), 0);
            for cut in cuts {
                append(&path, &text[from..cut]);
                from = cut;
                got.extend(tail.take());
            }
            let want: Vec<String> = lines.iter().filter_map(|l| keep(l)).collect();
            prop_assert_eq!(got, want);
        }
    }
}
