//! Shared helpers for the end-to-end tests in `tests/all`.

pub mod azurite;
pub mod baselines;
pub mod conformance;

/// Paths of the rule components built by `build.rs`, one constant per guest.
pub mod guests {
    include!(concat!(env!("OUT_DIR"), "/guests.rs"));
}
