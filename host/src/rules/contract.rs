//! Checking a component against the `ebb:rules` contract, naming what does not match.

use anyhow::{Context as _, Result, bail};
use wasmtime::Engine;

use super::bindings::{CONTRACT_INTERFACE, CONTRACT_VERSION, wit};

pub(super) fn check_contract_version(exports: &[String]) -> Result<()> {
    let wanted = format!("{CONTRACT_INTERFACE}@{CONTRACT_VERSION}");
    if exports.contains(&wanted) {
        return Ok(());
    }
    if let Some(other) = exports.iter().find(|e| e.starts_with(&format!("{CONTRACT_INTERFACE}@"))) {
        bail!("it exports {other}, but this host speaks {wanted}");
    }
    let listed = if exports.is_empty() { "nothing".to_string() } else { exports.join(", ") };
    bail!("it does not export {wanted} (it exports {listed}); build it for the ebb:rules/scaling-rule world")
}

/// Checks each decision function's type, so that a mismatch names the function.
pub(super) fn check_signatures(engine: &Engine, ty: &wasmtime::component::types::Component) -> Result<()> {
    use wasmtime::component::types::ComponentItem;
    let interface = format!("{CONTRACT_INTERFACE}@{CONTRACT_VERSION}");
    let Some(ComponentItem::ComponentInstance(decisions)) = ty.get_export(engine, &interface).map(|e| e.ty) else {
        bail!("its export {interface} is not an instance");
    };
    let cx = ty.instance_type();
    for name in ["configure", "optimal-dequeue-task-count", "on-queue-empty"] {
        let Some(ComponentItem::ComponentFunc(func)) = decisions.get_export(engine, name).map(|e| e.ty) else {
            bail!("its export {interface} lacks the function {name}");
        };
        let checked = match name {
            "configure" => func.typecheck::<(Vec<(String, String)>,), (Result<(), String>,)>(&cx),
            "optimal-dequeue-task-count" => func.typecheck::<(wit::QueueState,), (u32,)>(&cx),
            _ => func.typecheck::<(wit::IdleContext,), (wit::IdleDecision,)>(&cx),
        };
        checked.map_err(anyhow::Error::from).with_context(|| format!("its function {name} does not have the contract's type"))?;
    }
    Ok(())
}
