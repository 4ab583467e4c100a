//! Rule parameters: the queue's `rule_params` from the host configuration.

use std::collections::BTreeSet;
use std::str::FromStr;

/// The `rule_params` of one queue, as string pairs in the order of the config file.
pub type Params = [(String, String)];

/// Reads parameters by name and, at [`ParamReader::finish`], rejects any it was not asked for.
///
/// ```
/// use ebb_rules_sdk::params::ParamsExt;
/// let params = vec![("floor".to_string(), "4".to_string())];
/// let mut reader = params.reader();
/// let floor: u32 = reader.get_or("floor", 1)?;
/// reader.finish()?;
/// assert_eq!(floor, 4);
/// # Ok::<(), String>(())
/// ```
pub struct ParamReader<'a> {
    params: &'a Params,
    asked: BTreeSet<&'a str>,
}

/// Adds [`ParamsExt::reader`] to a parameter list.
pub trait ParamsExt {
    /// Starts reading these parameters.
    fn reader(&self) -> ParamReader<'_>;
}

impl ParamsExt for Params {
    fn reader(&self) -> ParamReader<'_> {
        ParamReader { params: self, asked: BTreeSet::new() }
    }
}

impl<'a> ParamReader<'a> {
    /// The raw text of parameter `key`, if given (the last one wins when repeated).
    pub fn raw(&mut self, key: &'a str) -> Option<&'a str> {
        self.asked.insert(key);
        self.params.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// Parameter `key` parsed as `T`, or `None` when absent. The error names the key and the value.
    pub fn get<T: FromStr>(&mut self, key: &'a str) -> Result<Option<T>, String> {
        match self.raw(key) {
            None => Ok(None),
            Some(text) => text.trim().parse().map(Some).map_err(|_| format!("parameter {key:?}: cannot read {text:?} as {}", short_type_name::<T>())),
        }
    }

    /// Parameter `key` parsed as `T`, or `default` when absent.
    pub fn get_or<T: FromStr>(&mut self, key: &'a str, default: T) -> Result<T, String> {
        Ok(self.get(key)?.unwrap_or(default))
    }

    /// Parameter `key` parsed by `parse`, whose error is prefixed with the key.
    pub fn parse_with<T>(&mut self, key: &'a str, parse: impl FnOnce(&str) -> Result<T, String>) -> Result<Option<T>, String> {
        match self.raw(key) {
            None => Ok(None),
            Some(text) => parse(text).map(Some).map_err(|e| format!("parameter {key:?}: {e}")),
        }
    }

    /// Fails if a parameter was given that no call above asked for.
    pub fn finish(self) -> Result<(), String> {
        let unknown: BTreeSet<&str> = self.params.iter().map(|(k, _)| k.as_str()).filter(|k| !self.asked.contains(k)).collect();
        if unknown.is_empty() {
            return Ok(());
        }
        let unknown: Vec<&str> = unknown.into_iter().collect();
        let known: Vec<&str> = self.asked.into_iter().collect();
        let known = if known.is_empty() { "none".to_string() } else { known.join(", ") };
        Err(format!("unknown parameter {} (this rule takes: {known})", unknown.join(", ")))
    }
}

fn short_type_name<T>() -> &'static str {
    let name = std::any::type_name::<T>();
    name.rsplit("::").next().unwrap_or(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn unknown_keys_are_rejected_with_the_known_ones_listed() {
        let p = params(&[("floor", "2"), ("flor", "3")]);
        let mut r = p.reader();
        assert_eq!(r.get_or("floor", 1u32), Ok(2));
        assert_eq!(r.finish().unwrap_err(), "unknown parameter flor (this rule takes: floor)");
    }

    #[test]
    fn bad_values_name_key_and_value() {
        let p = params(&[("floor", "two")]);
        let err = p.reader().get::<u32>("floor").unwrap_err();
        assert_eq!(err, "parameter \"floor\": cannot read \"two\" as u32");
    }
}
