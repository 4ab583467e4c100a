//! Names the host takes from outside and checks once, where they are read: a value of these
//! types is valid, so nothing downstream checks it again.

use std::fmt;

use anyhow::{Result, bail};

/// Longest queue name: Azure's 63 less the 7 of `-poison`, which names its poison queue.
pub const MAX_QUEUE_NAME_LEN: usize = 56;

/// A queue's (logical) name, valid on every backend: 3 to [`MAX_QUEUE_NAME_LEN`] lowercase
/// letters, digits and single dashes, neither first nor last, so that `<name>-poison` and
/// `<name>-<partition>` are valid Azure queue names too.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QueueName(String);

impl QueueName {
    /// `name`, if it is a valid queue name; else the reason, naming it.
    pub fn new(name: &str) -> Result<QueueName> {
        let ok_chars = name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if !(3..=MAX_QUEUE_NAME_LEN).contains(&name.len()) || !ok_chars || name.starts_with('-') || name.ends_with('-') || name.contains("--") {
            bail!(
                "{name:?} is not a valid queue name: 3 to {MAX_QUEUE_NAME_LEN} lowercase letters, digits and single dashes (\"-poison\" is added for its poison queue)"
            );
        }
        Ok(QueueName(name.to_string()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Its poison queue's name (one for all its partitions).
    pub fn poison(&self) -> String {
        format!("{}-poison", self.0)
    }
}

impl std::ops::Deref for QueueName {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for QueueName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for QueueName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for QueueName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl PartialEq<str> for QueueName {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for QueueName {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl From<QueueName> for String {
    fn from(name: QueueName) -> String {
        name.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_name_is_checked_once_where_it_is_read() {
        for good in ["abc", "orders", "orders-eu-1", &"a".repeat(MAX_QUEUE_NAME_LEN)] {
            assert_eq!(QueueName::new(good).unwrap().as_str(), good);
        }
        for bad in ["", "ab", "Orders", "-orders", "orders-", "or--ders", "ord_ers", "ordérs", &"a".repeat(MAX_QUEUE_NAME_LEN + 1)] {
            let error = QueueName::new(bad).unwrap_err().to_string();
            assert!(error.contains("is not a valid queue name"), "{bad}: {error}");
        }
        assert_eq!(QueueName::new("orders").unwrap().poison(), "orders-poison");
    }
}
