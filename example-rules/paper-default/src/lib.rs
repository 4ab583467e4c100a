//! The whitepaper's rule, exactly: every decision is the SDK's default.

use ebb_rules_sdk::{ScalingRule, export_rule};

#[derive(Default)]
struct PaperDefault;

impl ScalingRule for PaperDefault {}

export_rule!(PaperDefault);
