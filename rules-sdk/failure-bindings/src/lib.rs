//! Bindings of the `ebb:rules/failure-aware-rule@0.4.0` world, used through
//! `ebb_rules_sdk::export_rule!(MyRule, failures)`. A crate of its own because the export
//! macros wit-bindgen generates live at the crate root, and those of the `decisions`
//! interface would clash with the ones of the SDK's `scaling-rule` world.
#![allow(missing_docs)]

wit_bindgen::generate!({
    path: "../../wit/ebb-rules-0.4.0",
    world: "ebb:rules/failure-aware-rule@0.4.0",
    pub_export_macro: true,
    export_macro_name: "__export_failure_aware_rule",
    default_bindings_module: "ebb_rules_sdk::failure_bindings",
});
