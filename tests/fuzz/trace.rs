//! The trace CSV of `ebb simulate --trace`: `seconds[,count]` per line.

use std::time::Duration;

use proptest::prelude::*;

use crate::budget;
use ebb::simulate::scenario::{Arrival, MAX_COUNT_PER_LINE, MAX_DURATION, MAX_MESSAGES, parse_trace};

/// One line of a trace, as a spreadsheet or a hostile hand might write it.
#[derive(Debug, Clone)]
enum Line {
    Blank(String),
    Comment(String),
    /// Text that does not start like a number: a header if it is the first content line.
    Words(String),
    /// `seconds[,count[,extra]]`, each field as written.
    Fields {
        seconds: String,
        count: Option<String>,
        extra: Option<String>,
    },
}

fn seconds_text() -> impl Strategy<Value = String> {
    prop_oneof![
        (0u64..3_000_000).prop_map(|s| s.to_string()),
        (0.0f64..2_678_400.0).prop_map(|s| s.to_string()),
        (0u32..1000).prop_map(|ms| format!(".{ms:03}")),
        (0u32..1000).prop_map(|s| format!("+{s}")),
        (0u32..1000).prop_map(|s| format!("{s}.")),
        (0u32..100, -400i32..400).prop_map(|(m, e)| format!("{m}e{e}")),
        Just("2678400".to_string()),
        Just("2678400.000001".to_string()),
        Just("-0".to_string()),
        Just("-0.0".to_string()),
        Just("-1".to_string()),
        Just("-1e-320".to_string()),
        Just("1e400".to_string()),
        Just("NaN".to_string()),
        Just("inf".to_string()),
        Just("-inf".to_string()),
        Just("+".to_string()),
        Just(".".to_string()),
        Just("1_000".to_string()),
        Just("0x10".to_string()),
        Just("1.5.5".to_string()),
        Just("99999999999999999999999999999".to_string()),
        Just(String::new()),
        "[0-9.+-]{1,12}",
    ]
}

fn count_text() -> impl Strategy<Value = String> {
    prop_oneof![
        (1..=MAX_COUNT_PER_LINE).prop_map(|n| n.to_string()),
        Just(String::new()),
        Just("0".to_string()),
        Just((MAX_COUNT_PER_LINE + 1).to_string()),
        Just("-3".to_string()),
        Just("+3".to_string()),
        Just("1.5".to_string()),
        Just("4294967296".to_string()),
        Just("x".to_string()),
        "[0-9 +-]{1,8}",
    ]
}

fn padded(field: impl Strategy<Value = String>) -> impl Strategy<Value = String> {
    (field, prop_oneof![Just(""), Just(" "), Just("\t")], prop_oneof![Just(""), Just(" "), Just("\r")])
        .prop_map(|(f, before, after)| format!("{before}{f}{after}"))
}

fn line() -> impl Strategy<Value = Line> {
    prop_oneof![
        1 => prop_oneof![Just(String::new()), Just("   ".to_string()), Just("\t\r".to_string())].prop_map(Line::Blank),
        1 => "#[ -~]{0,20}".prop_map(Line::Comment),
        1 => prop_oneof![Just("seconds,count".to_string()), Just("time".to_string()), Just("x,1".to_string()), Just("٣".to_string()), "[a-zA-Z][ -~]{0,20}"].prop_map(Line::Words),
        8 => (padded(seconds_text()), proptest::option::weighted(0.5, padded(count_text())), proptest::option::weighted(0.05, "[ -~]{0,5}"))
            .prop_map(|(seconds, count, extra)| Line::Fields { seconds, count, extra }),
    ]
}

fn render(lines: &[Line], crlf: bool, bom: bool) -> String {
    let end = if crlf { "\r\n" } else { "\n" };
    let mut text = if bom { "\u{feff}".to_string() } else { String::new() };
    for line in lines {
        match line {
            Line::Blank(t) | Line::Comment(t) | Line::Words(t) => text.push_str(t),
            Line::Fields { seconds, count, extra } => {
                text.push_str(seconds);
                if let Some(count) = count {
                    text.push(',');
                    text.push_str(count);
                    if let Some(extra) = extra {
                        text.push(',');
                        text.push_str(extra);
                    }
                }
            }
        }
        text.push_str(end);
    }
    text
}

/// What the trace must give: its arrivals, or the number of the first line refused.
fn expected(text: &str) -> Result<Vec<Arrival>, usize> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut arrivals = Vec::new();
    let mut seen_content = false;
    let mut total = 0u64;
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let numeric = fields[0].starts_with(|c: char| c.is_ascii_digit() || "+-.".contains(c));
        if !std::mem::replace(&mut seen_content, true) && !numeric {
            continue;
        }
        let seconds: f64 = fields[0].parse().map_err(|_| number)?;
        if !(0.0..=MAX_DURATION.as_secs_f64()).contains(&seconds) {
            return Err(number);
        }
        let count = match fields.get(1) {
            None | Some(&"") => 1,
            Some(text) => text.parse::<u32>().ok().filter(|n| (1..=MAX_COUNT_PER_LINE).contains(n)).ok_or(number)?,
        };
        if fields.len() > 2 {
            return Err(number);
        }
        total += u64::from(count);
        if total > MAX_MESSAGES {
            return Err(number);
        }
        arrivals.push(Arrival { at: Duration::from_secs_f64(seconds), count });
    }
    arrivals.sort_by_key(|a| a.at);
    Ok(arrivals)
}

proptest! {
    #![proptest_config(budget(700))]

    /// Any text: no panic; a trace taken is sorted, within 31 days, 1 to 100,000 messages a
    /// line and at most 5,000,000 in all; a trace refused says which line or which limit.
    #[test]
    fn arbitrary_text_never_panics_and_a_taken_trace_is_bounded_and_sorted(text in prop_oneof![any::<String>(), "[0-9.,+\\-e# \r\n]{0,200}"]) {
        match parse_trace(&text) {
            Ok(arrivals) => {
                prop_assert!(arrivals.windows(2).all(|w| w[0].at <= w[1].at));
                prop_assert!(arrivals.iter().all(|a| a.at <= MAX_DURATION && (1..=MAX_COUNT_PER_LINE).contains(&a.count)));
                prop_assert!(arrivals.iter().map(|a| u64::from(a.count)).sum::<u64>() <= MAX_MESSAGES);
            }
            Err(error) => {
                let error = format!("{error:#}");
                prop_assert!(error.starts_with("line ") || error.starts_with("more than"), "{}", error);
            }
        }
    }

    /// Traces of headers, comments, blank lines, padded fields, CRLF ends, a byte-order mark
    /// and hostile numbers: taken with exactly the arrivals they list, or refused naming the
    /// first bad line.
    #[test]
    fn a_trace_gives_exactly_its_arrivals_or_names_its_first_bad_line(lines in proptest::collection::vec(line(), 0..12), crlf in any::<bool>(), bom in any::<bool>()) {
        let text = render(&lines, crlf, bom);
        match (parse_trace(&text), expected(&text)) {
            (Ok(arrivals), Ok(expected)) => prop_assert_eq!(arrivals, expected, "{:?}", text),
            (Err(error), Err(line)) => {
                let error = format!("{error:#}");
                prop_assert!(error.starts_with(&format!("line {line}: ")), "{:?}: {}", text, error);
            }
            (got, expected) => prop_assert!(false, "{:?}: got {:?}, expected {:?}", text, got.map_err(|e| format!("{e:#}")), expected),
        }
    }
}
