//! A validator of Prometheus text exposition format 0.0.4, shared by `nrt monitor`'s unit tests
//! and its scrape test: every line is `# HELP name text`, `# TYPE name kind`, another comment,
//! or a sample `name{label="value",...} value` with valid name and label syntax and a parseable
//! float; every sample belongs to a family declared by a TYPE line before it (a summary's
//! `_sum` and `_count` to the summary, a histogram's `_bucket` too), each family is declared
//! once, and samples of one family are contiguous.

use std::collections::{BTreeMap, BTreeSet};

/// One sample line.
#[derive(Clone, Debug, PartialEq)]
pub struct ParsedSample {
    /// The metric name.
    pub name: String,
    /// Its labels in order.
    pub labels: Vec<(String, String)>,
    /// Its value.
    pub value: f64,
}

impl ParsedSample {
    /// The label `key`'s value.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// A validated exposition: families by name → kind, and the samples.
#[derive(Debug, Default)]
pub struct Exposition {
    /// TYPE of every declared family.
    pub types: BTreeMap<String, String>,
    /// Every sample, in order.
    pub samples: Vec<ParsedSample>,
}

impl Exposition {
    /// The samples named `name`.
    pub fn named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a ParsedSample> + 'a {
        self.samples.iter().filter(move |s| s.name == name)
    }
}

fn is_metric_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn is_label_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn parse_value(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        s => s.parse().ok(),
    }
}

/// Labels in order, as `(name, value)`.
type Labels = Vec<(String, String)>;

/// Parses `{k="v",...}` at the start of `s`; returns the labels and the rest.
fn parse_labels(s: &str) -> Result<(Labels, &str), String> {
    let mut labels = Vec::new();
    let mut rest = s.strip_prefix('{').ok_or("expected '{'")?;
    loop {
        if let Some(r) = rest.strip_prefix('}') {
            return Ok((labels, r));
        }
        let eq = rest.find('=').ok_or("label without '='")?;
        let name = &rest[..eq];
        if !is_label_name(name) {
            return Err(format!("bad label name {name:?}"));
        }
        rest = rest[eq + 1..]
            .strip_prefix('"')
            .ok_or("label value not quoted")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next() {
                None => return Err("unterminated label value".into()),
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    other => return Err(format!("bad escape {other:?}")),
                },
                Some((_, c)) => value.push(c),
            }
        };
        if labels.iter().any(|(k, _)| k == name) {
            return Err(format!("label {name} repeated"));
        }
        labels.push((name.to_string(), value));
        rest = &rest[end + 1..];
        if let Some(r) = rest.strip_prefix(',') {
            rest = r;
        } else if !rest.starts_with('}') {
            return Err("expected ',' or '}' after a label".into());
        }
    }
}

/// The family a sample named `name` belongs to, given the declared types.
fn family_of<'a>(name: &'a str, types: &BTreeMap<String, String>) -> Option<&'a str> {
    if types.contains_key(name) {
        return Some(name);
    }
    for suffix in ["_sum", "_count", "_bucket"] {
        if let Some(base) = name.strip_suffix(suffix)
            && matches!(
                types.get(base).map(String::as_str),
                Some("summary" | "histogram")
            )
        {
            return Some(base);
        }
    }
    None
}

/// Validates `text`; the error names the line and what is wrong with it.
pub fn validate(text: &str) -> Result<Exposition, String> {
    let mut exp = Exposition::default();
    let mut helped = BTreeSet::new();
    let mut finished = BTreeSet::new();
    let mut current: Option<String> = None;
    // Every series (name and label set, labels in any order) once.
    let mut series: BTreeSet<(String, Vec<(String, String)>)> = BTreeSet::new();
    for (i, line) in text.lines().enumerate() {
        let at = |e: String| format!("line {}: {e}: {line:?}", i + 1);
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let mut words = comment.trim_start().splitn(3, ' ');
            match words.next() {
                Some("HELP") => {
                    let name = words.next().unwrap_or("");
                    if !is_metric_name(name) {
                        return Err(at(format!("HELP of a bad name {name:?}")));
                    }
                    if !helped.insert(name.to_string()) {
                        return Err(at(format!("second HELP for {name}")));
                    }
                }
                Some("TYPE") => {
                    let name = words.next().unwrap_or("");
                    let kind = words.next().unwrap_or("");
                    if !is_metric_name(name) {
                        return Err(at(format!("TYPE of a bad name {name:?}")));
                    }
                    if !["counter", "gauge", "summary", "histogram", "untyped"].contains(&kind) {
                        return Err(at(format!("unknown type {kind:?}")));
                    }
                    if exp
                        .types
                        .insert(name.to_string(), kind.to_string())
                        .is_some()
                    {
                        return Err(at(format!("second TYPE for {name}")));
                    }
                }
                _ => {}
            }
            continue;
        }
        let name_end = line.find(['{', ' ']).ok_or_else(|| at("no value".into()))?;
        let name = &line[..name_end];
        if !is_metric_name(name) {
            return Err(at(format!("bad metric name {name:?}")));
        }
        let (labels, rest) = if line[name_end..].starts_with('{') {
            parse_labels(&line[name_end..]).map_err(at)?
        } else {
            (Vec::new(), &line[name_end..])
        };
        let mut fields = rest.split_whitespace();
        let value = fields
            .next()
            .and_then(parse_value)
            .ok_or_else(|| at("value is not a float".into()))?;
        if let Some(ts) = fields.next() {
            ts.parse::<i64>().map_err(|_| at("bad timestamp".into()))?;
        }
        if fields.next().is_some() {
            return Err(at("trailing text".into()));
        }
        let family = family_of(name, &exp.types)
            .ok_or_else(|| at(format!("sample of {name} before any TYPE line for it")))?
            .to_string();
        if exp.types.get(&family).map(String::as_str) == Some("summary")
            && name == family
            && labels.iter().all(|(k, _)| k != "quantile")
        {
            return Err(at("summary sample without a quantile label".into()));
        }
        if current.as_deref() != Some(family.as_str()) {
            if !finished.insert(family.clone()) {
                return Err(at(format!("samples of {family} are not contiguous")));
            }
            current = Some(family);
        }
        let mut key = labels.clone();
        key.sort();
        if !series.insert((name.to_string(), key)) {
            return Err(at("a second sample of the same series".into()));
        }
        exp.samples.push(ParsedSample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    Ok(exp)
}

/// The validator refuses what it should (run by each includer's tests).
pub fn self_test() {
    assert!(validate("# TYPE a counter\na 1\n").is_ok());
    assert!(validate("a 1\n").is_err(), "sample without TYPE");
    assert!(
        validate("# TYPE a counter\na{b=\"x\"} one\n").is_err(),
        "bad value"
    );
    assert!(
        validate("# TYPE a counter\na{1b=\"x\"} 1\n").is_err(),
        "bad label name"
    );
    assert!(
        validate("# TYPE a counter\na{b=x} 1\n").is_err(),
        "unquoted"
    );
    assert!(validate("# TYPE a-b counter\n").is_err(), "bad family name");
    assert!(validate("# TYPE a counter\n# TYPE b gauge\na 1\nb 1\na 2\n").is_err());
    assert!(
        validate("# TYPE s summary\ns 1\n").is_err(),
        "summary without quantile"
    );
    assert!(
        validate("# TYPE a counter\na{x=\"1\",y=\"2\"} 1\na{y=\"2\",x=\"1\"} 2\n").is_err(),
        "one series twice"
    );
    assert!(validate("# TYPE a counter\na{x=\"1\"} 1\na{x=\"2\"} 2\n").is_ok());
    let e = validate(
        "# HELP s x y\n# TYPE s summary\ns{quantile=\"0.5\",p=\"a\\\"b\"} 1e-3\ns_sum 2\ns_count 3\n",
    )
    .unwrap();
    assert_eq!(e.samples.len(), 3);
    assert_eq!(e.samples[0].label("p"), Some("a\"b"));
}
