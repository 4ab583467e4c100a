//! `[log]`: how the host writes its log. Read twice: by the CLI before the log starts
//! ([`log_format_in`]), so the setting holds from the first line, and with the rest of the
//! file, so a bad value is a config error like any other.

use serde::Deserialize;

/// Environment variable that sets the log format (`human` or `json`); it wins over
/// `[log] format`, as the other variables win over their keys (`EBB_API_TOKEN`).
pub(crate) const LOG_FORMAT_ENV: &str = "EBB_LOG_FORMAT";

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// For people: one line per event, colours on a terminal.
    Human,
    /// One JSON object per line (time, level, message, fields, target, spans), for log
    /// shippers (Vector, Fluent Bit, a cloud's log agent).
    Json,
}

impl LogFormat {
    /// The names the setting takes.
    pub const NAMES: [&str; 2] = ["human", "json"];

    /// The format named `name`, or why not (naming `key`, where the name came from).
    pub fn parse(key: &str, name: &str) -> Result<LogFormat, String> {
        match name {
            "human" => Ok(LogFormat::Human),
            "json" => Ok(LogFormat::Json),
            _ => Err(format!("{key}: must be \"human\" or \"json\", got {name:?}")),
        }
    }
}

impl Default for LogFormat {
    fn default() -> Self {
        LogFormat::parse("log.format", crate::defaults::LOG_FORMAT).expect("defaults::LOG_FORMAT names a format")
    }
}

impl std::fmt::Display for LogFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LogFormat::Human => "human",
            LogFormat::Json => "json",
        })
    }
}

impl<'de> Deserialize<'de> for LogFormat {
    /// Refused with the key and the names it takes: serde's own message for an unknown
    /// variant names neither the key nor, for a non-string, the names.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Format;
        impl serde::de::Visitor<'_> for Format {
            type Value = LogFormat;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("log.format: \"human\" or \"json\"")
            }
            fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<LogFormat, E> {
                LogFormat::parse("log.format", name).map_err(E::custom)
            }
        }
        deserializer.deserialize_str(Format)
    }
}

/// `[log]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogFile {
    /// `human` (default) or `json`; `EBB_LOG_FORMAT` wins over it.
    #[serde(default)]
    pub format: LogFormat,
}

/// The `[log] format` of config text, read before the log starts; `None` when the text does
/// not say, or says it wrongly (the full parse reports that, through the log this starts).
/// A file that is not TOML elsewhere still has its `[log]` table read on its own: the syntax
/// error is then reported in the format the file asks for.
pub(crate) fn log_format_in(text: &str) -> Option<LogFormat> {
    let table: toml::Table = toml::from_str(text).ok().or_else(|| toml::from_str(&log_table_lines(text)?).ok())?;
    let log: LogFile = table.get("log")?.clone().try_into().ok()?;
    Some(log.format)
}

/// The `[log]` header line of `text` and the lines after it up to the next table header, or
/// `None` without a `[log]` header. A line scan, not a parse: it must work on text that toml
/// refuses (a syntax error in another table).
fn log_table_lines(text: &str) -> Option<String> {
    let is_header = |line: &str| line.trim_start().starts_with('[');
    let is_log_header = |line: &str| line.split('#').next().is_some_and(|header| header.trim() == "[log]");
    let mut lines = text.lines().skip_while(|line| !is_log_header(line));
    let header = lines.next()?;
    let body = lines.take_while(|line| !is_header(line));
    Some(std::iter::once(header).chain(body).collect::<Vec<_>>().join("\n"))
}

#[cfg(test)]
mod tests {
    use super::{LogFormat, log_format_in};

    #[test]
    fn the_log_format_is_read_from_the_log_table_alone() {
        assert_eq!(log_format_in("[log]\nformat = \"json\"\n"), Some(LogFormat::Json));
        assert_eq!(log_format_in("[log]\nformat = \"json\"\n[queues.orders]\nbatch_size = 999\n"), Some(LogFormat::Json), "other keys are not its concern");
        assert_eq!(log_format_in("[log]\n"), Some(LogFormat::Human));
        assert_eq!(LogFormat::default().to_string(), crate::defaults::LOG_FORMAT);
        assert_eq!(log_format_in("[queues.orders]\n"), None);
        assert_eq!(log_format_in("[log]\nformat = \"xml\"\n"), None);
        assert_eq!(log_format_in("[log\n"), None, "not TOML");
    }

    #[test]
    fn the_log_format_is_read_when_another_table_is_not_toml() {
        assert_eq!(log_format_in("[log]\nformat=\"json\"\n[queues.a"), Some(LogFormat::Json));
        assert_eq!(log_format_in("[queues.a\n[log] # the log\nformat = \"json\" # for the shipper\n[queues.b]\n"), Some(LogFormat::Json));
        assert_eq!(log_format_in("[queues.a]\nx = \n[log]\nformat = \"xml\"\n"), None, "an unknown value is still not read");
        assert_eq!(log_format_in("[log]\nformat = \"json\n[queues.a]\n"), None, "nor a broken [log] table");
        assert_eq!(log_format_in("[queues.a\nformat = \"json\"\n"), None, "nor a format outside [log]");
    }
}
