//! Durations as messages and help show them: humantime's spelling (`90s`, `1h 30m`, `7days`),
//! which `--since`, `--for` and the configuration read back as written.

use std::time::Duration;

const DAY_SECS: u64 = 24 * 3600;

/// `d` in humantime's words, but days stay days: humantime would write 31 days as
/// `1month 13h 26m 24s` (its month is 30.44 days), which nobody typed and nobody reads easily.
pub fn show(d: Duration) -> String {
    let days = d.as_secs() / DAY_SECS;
    if days == 0 {
        return humantime::format_duration(d).to_string();
    }
    let rest = d - Duration::from_secs(days * DAY_SECS);
    let mut text = format!("{days}{}", if days == 1 { "day" } else { "days" });
    if !rest.is_zero() {
        text.push(' ');
        text.push_str(&humantime::format_duration(rest).to_string());
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_stay_days_and_the_text_reads_back_as_the_same_duration() {
        let cases = [
            (Duration::from_millis(1500), "1s 500ms"),
            (Duration::from_secs(90 * 60), "1h 30m"),
            (Duration::from_secs(DAY_SECS), "1day"),
            (Duration::from_secs(31 * DAY_SECS), "31days"),
            (Duration::from_secs(365 * DAY_SECS), "365days"),
            (Duration::from_secs(40 * DAY_SECS + 3600), "40days 1h"),
        ];
        for (duration, text) in cases {
            assert_eq!(show(duration), text);
            assert_eq!(humantime::parse_duration(text).unwrap(), duration, "{text} reads back");
        }
    }
}
