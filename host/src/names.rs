//! Names the host takes from outside and checks once, where they are read or made: a value
//! of these types is valid, so nothing downstream checks or formats it again. Each reads as
//! a `&str` (`Deref`, `AsRef`, `Borrow`, `Display`) wherever a name is only read.
//!
//! - [`QueueName`]: a logical queue, from the configuration;
//! - [`PartitionName`] and [`PoisonQueueName`]: its storage queues, made from it;
//! - [`DecisionSite`]: where a rule decides (a storage queue, or a queue's KEDA site);
//! - [`RuleFileName`]: a rule file in the rules folder, from the configuration.

use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

/// Longest queue name: Azure's 63 less the 7 of `-poison`, which names its poison queue.
pub const MAX_QUEUE_NAME_LEN: usize = 56;

/// Azure's longest queue name: the bound of every storage queue's name.
const MAX_STORAGE_NAME_LEN: usize = 63;

/// Most partitions of one logical queue: `-63`, the longest suffix, keeps a partition's
/// name within Azure's 63 characters.
pub(crate) const MAX_PARTITIONS: u32 = 64;

/// The suffix of a queue's KEDA decision site.
const SCALER_SITE_SUFFIX: &str = "/instances";

/// The suffix of a site's shadow site: its own group, counters and quarantine, so that a
/// shadow rule never shares an instance (or a fault run) with a live one.
const SHADOW_SITE_SUFFIX: &str = "/shadow";

/// Lowercase letters, digits and single dashes, neither first nor last, `min..=max` long.
fn is_storage_name(name: &str, max: usize) -> bool {
    let ok_chars = name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    (3..=max).contains(&name.len()) && ok_chars && !name.starts_with('-') && !name.ends_with('-') && !name.contains("--")
}

/// The `&str` views every name type has: it reads as the text it holds.
macro_rules! name_views {
    ($name:ident) => {
        impl $name {
            /// The name.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl std::ops::Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.0, f)
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl From<$name> for String {
            fn from(name: $name) -> String {
                name.0
            }
        }
    };
}

/// A queue's (logical) name, valid on every backend: 3 to [`MAX_QUEUE_NAME_LEN`] lowercase
/// letters, digits and single dashes, neither first nor last, so that `<name>-poison` and
/// `<name>-<partition>` are valid Azure queue names too.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QueueName(String);

impl QueueName {
    /// `name`, if it is a valid queue name; else the reason, naming it.
    pub fn new(name: &str) -> Result<QueueName> {
        if !is_storage_name(name, MAX_QUEUE_NAME_LEN) {
            bail!(
                "{name:?} is not a valid queue name: 3 to {MAX_QUEUE_NAME_LEN} lowercase letters, digits and single dashes (\"-poison\" is added for its poison queue)"
            );
        }
        Ok(QueueName(name.to_string()))
    }

    /// Its poison queue (one for all its partitions).
    pub fn poison(&self) -> PoisonQueueName {
        PoisonQueueName(format!("{}-poison", self.0))
    }

    /// Its partition `index`, `<name>-<index>`.
    ///
    /// # Panics
    /// At an `index` of `MAX_PARTITIONS` or more (the configuration's `partitions` is checked
    /// against it), whose name could be too long.
    pub fn partition(&self, index: u32) -> PartitionName {
        assert!(index < MAX_PARTITIONS, "partition {index} of queue {}: at most {MAX_PARTITIONS} partitions", self.0);
        PartitionName(format!("{}-{index}", self.0))
    }

    /// The storage queues of the queue in `count` partitions: the queue itself when `count`
    /// is 1 (or 0), else its partitions `<name>-0` … `<name>-(count-1)`.
    pub fn partitions(&self, count: u32) -> Vec<PartitionName> {
        if count <= 1 { vec![PartitionName(self.0.clone())] } else { (0..count).map(|index| self.partition(index)).collect() }
    }
}

name_views!(QueueName);

/// A storage queue a logical queue's listeners work on: the queue itself when it is not
/// partitioned, or one of its partitions (`<queue>-<index>`). Made by
/// [`QueueName::partitions`] and [`QueueName::partition`].
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PartitionName(String);

name_views!(PartitionName);

/// A queue's poison queue, `<queue>-poison` (one for all its partitions). Made by
/// [`QueueName::poison`].
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PoisonQueueName(String);

name_views!(PoisonQueueName);

/// Where a rule decides, with counters of its own: a storage queue (a worker's listeners on
/// one partition), or a logical queue's KEDA site `<queue>/instances` (`/` never occurs in a
/// queue name, so the two cannot collide).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DecisionSite(String);

impl DecisionSite {
    /// `name`, if it names a decision site: a storage queue's name (3 to 63 lowercase letters,
    /// digits and single dashes), or `<queue>/instances`; else the reason, naming it.
    pub fn new(name: &str) -> Result<DecisionSite> {
        let valid = match name.strip_suffix(SCALER_SITE_SUFFIX) {
            Some(queue) => is_storage_name(queue, MAX_QUEUE_NAME_LEN),
            None => is_storage_name(name, MAX_STORAGE_NAME_LEN),
        };
        if !valid {
            bail!(
                "{name:?} is not a valid rule slot: a storage queue's name (3 to {MAX_STORAGE_NAME_LEN} lowercase letters, digits and single dashes) or <queue>{SCALER_SITE_SUFFIX}"
            );
        }
        Ok(DecisionSite(name.to_string()))
    }

    /// The site the shadow rule of this site decides in: never applied, only compared.
    pub fn shadow(&self) -> DecisionSite {
        DecisionSite(format!("{}{SHADOW_SITE_SUFFIX}", self.0))
    }

    /// Whether this is a queue's KEDA site (see [`DecisionSite::scaler`]).
    pub fn is_scaler(&self) -> bool {
        self.0.ends_with(SCALER_SITE_SUFFIX)
    }

    /// Whether this is a shadow rule's site (see [`DecisionSite::shadow`]).
    pub fn is_shadow(&self) -> bool {
        self.0.ends_with(SHADOW_SITE_SUFFIX)
    }

    /// The site the KEDA scaler decides in for `queue`: its own counters, the same rule
    /// instance as the queue's listeners (same file, same parameters).
    pub fn scaler(queue: &QueueName) -> DecisionSite {
        DecisionSite(format!("{queue}{SCALER_SITE_SUFFIX}"))
    }
}

impl From<PartitionName> for DecisionSite {
    fn from(partition: PartitionName) -> DecisionSite {
        DecisionSite(partition.0)
    }
}

impl From<&QueueName> for DecisionSite {
    /// The site of the queue itself, unpartitioned.
    fn from(queue: &QueueName) -> DecisionSite {
        DecisionSite(queue.0.clone())
    }
}

name_views!(DecisionSite);

/// A rule file's name in the rules folder: a `.wasm` file name without a path.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RuleFileName(String);

impl RuleFileName {
    /// `name`, if it is a `.wasm` file name without a path; else the reason, naming it.
    pub fn new(name: &str) -> Result<RuleFileName> {
        let bare = !name.contains('/') && !name.contains('\\') && !name.contains('\0') && name != ".wasm";
        if !bare || !name.ends_with(".wasm") {
            bail!("{name:?} must be a .wasm file name inside rules_dir, without a path");
        }
        Ok(RuleFileName(name.to_string()))
    }

    /// The file in `rules_dir`.
    pub fn in_dir(&self, rules_dir: &Path) -> PathBuf {
        rules_dir.join(&self.0)
    }
}

name_views!(RuleFileName);

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
    }

    #[test]
    fn a_queue_names_its_partitions_poison_queue_and_rule_slots() -> Result<()> {
        let orders = QueueName::new("orders")?;
        assert_eq!(orders.poison(), "orders-poison");
        assert_eq!(orders.partitions(1), ["orders"]);
        assert_eq!(orders.partitions(3), ["orders-0", "orders-1", "orders-2"]);
        assert_eq!(DecisionSite::scaler(&orders), "orders/instances");
        // The longest queue's last partition and poison queue are valid Azure names.
        let longest = QueueName::new(&"a".repeat(MAX_QUEUE_NAME_LEN))?;
        assert!(is_storage_name(&longest.partition(MAX_PARTITIONS - 1), MAX_STORAGE_NAME_LEN));
        assert!(is_storage_name(&longest.poison(), MAX_STORAGE_NAME_LEN));
        for slot in [longest.partition(MAX_PARTITIONS - 1).into(), DecisionSite::scaler(&longest), DecisionSite::from(&orders)] {
            assert_eq!(DecisionSite::new(&slot)?, slot, "what a queue makes, a slot takes");
        }
        for bad in ["", "or", "Orders", "orders/", "/instances", "or/instances", "orders/other", &"a".repeat(MAX_STORAGE_NAME_LEN + 1)] {
            let error = DecisionSite::new(bad).unwrap_err().to_string();
            assert!(error.contains("is not a valid rule slot"), "{bad}: {error}");
        }
        Ok(())
    }

    #[test]
    fn a_rule_file_name_is_a_wasm_file_without_a_path() -> Result<()> {
        assert_eq!(RuleFileName::new("scale.wasm")?.in_dir(Path::new("/rules")), Path::new("/rules/scale.wasm"));
        for bad in ["", ".wasm", "scale", "scale.wat", "sub/scale.wasm", "../scale.wasm", "/abs/scale.wasm", "sub\\scale.wasm", "sc\0ale.wasm"] {
            let error = RuleFileName::new(bad).unwrap_err().to_string();
            assert!(error.contains("must be a .wasm file name inside rules_dir, without a path"), "{bad:?}: {error}");
        }
        Ok(())
    }
}
