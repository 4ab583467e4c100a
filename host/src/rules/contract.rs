//! Checking a component against the `ebb:rules` contract, naming what does not match: which
//! version it speaks (read from the interface it exports), and each function's type.

use anyhow::{Context as _, Result, bail};
use wasmtime::Engine;
use wasmtime::component::ComponentType;
use wasmtime::component::types::ComponentFunc;

use super::bindings::{CONTRACT_INTERFACE, CONTRACT_VERSIONS, ContractVersion, FAILURES_INTERFACE, v0_1, v0_2, v0_3, v0_4};

/// The contract version a component speaks, from the `ebb:rules/decisions@<version>` it
/// exports: the newest the host serves when it exports several.
pub(super) fn contract_version(exports: &[String]) -> Result<ContractVersion> {
    if let Some(version) = CONTRACT_VERSIONS.iter().find(|v| exports.contains(&format!("{CONTRACT_INTERFACE}@{v}"))) {
        return Ok(ContractVersion::from_version(version).expect("every served version has bindings"));
    }
    let speaks = CONTRACT_VERSIONS.iter().map(|v| format!("{CONTRACT_INTERFACE}@{v}")).collect::<Vec<_>>().join(" or ");
    if let Some(other) = exports.iter().find(|e| e.starts_with(&format!("{CONTRACT_INTERFACE}@"))) {
        bail!("it exports {other}, but this host speaks {speaks}");
    }
    let listed = if exports.is_empty() { "nothing".to_string() } else { exports.join(", ") };
    bail!("it does not export {speaks} (it exports {listed}); build it for the ebb:rules/scaling-rule world")
}

/// The functions every rule of `version` exports.
pub(super) fn functions(version: ContractVersion) -> &'static [&'static str] {
    const BEFORE_0_3: &[&str] = &["configure", "optimal-dequeue-task-count", "on-queue-empty"];
    const SINCE_0_3: &[&str] = &["configure", "optimal-dequeue-task-count", "on-queue-empty", "max-concurrent-calls"];
    if version.decides_concurrency() { SINCE_0_3 } else { BEFORE_0_3 }
}

/// Checks each decision function's type against the contract `version`, so that a
/// mismatch names the function.
pub(super) fn check_signatures(engine: &Engine, ty: &wasmtime::component::types::Component, version: ContractVersion) -> Result<()> {
    use wasmtime::component::types::ComponentItem;
    let interface = version.interface();
    let Some(ComponentItem::ComponentInstance(decisions)) = ty.get_export(engine, &interface).map(|e| e.ty) else {
        bail!("its export {interface} is not an instance");
    };
    for &name in functions(version) {
        let Some(ComponentItem::ComponentFunc(func)) = decisions.get_export(engine, name).map(|e| e.ty) else {
            bail!("its export {interface} lacks the function {name}");
        };
        let checked = match version {
            ContractVersion::V0_1 => typecheck::<v0_1::wit::QueueState, v0_1::wit::IdleContext, v0_1::wit::IdleDecision>(ty, &func, name),
            ContractVersion::V0_2 => typecheck::<v0_2::wit::QueueState, v0_2::wit::IdleContext, v0_2::wit::IdleDecision>(ty, &func, name),
            ContractVersion::V0_3 => match name {
                "max-concurrent-calls" => func.typecheck::<(v0_3::wit::HandlerState,), (Option<u32>,)>(&ty.instance_type()).map_err(anyhow::Error::from),
                _ => typecheck::<v0_3::wit::QueueState, v0_3::wit::IdleContext, v0_3::wit::IdleDecision>(ty, &func, name),
            },
            ContractVersion::V0_4 => match name {
                "max-concurrent-calls" => func.typecheck::<(v0_4::wit::HandlerState,), (Option<u32>,)>(&ty.instance_type()).map_err(anyhow::Error::from),
                _ => typecheck::<v0_4::wit::QueueState, v0_4::wit::IdleContext, v0_4::wit::IdleDecision>(ty, &func, name),
            },
        };
        checked.with_context(|| format!("its function {name} does not have the type of contract {version}"))?;
    }
    Ok(())
}

/// Whether the component exports the optional `ebb:rules/failures@0.4.0` (the
/// `failure-aware-rule` world) and, if it does, that `on-handler-failure` has its type.
/// Another version of the interface is refused by name: no host serves one yet.
pub(super) fn exports_failures(engine: &Engine, ty: &wasmtime::component::types::Component, exports: &[String]) -> Result<bool> {
    use wasmtime::component::types::ComponentItem;
    if !exports.iter().any(|e| e == FAILURES_INTERFACE) {
        if let Some(other) = exports.iter().find(|e| e.starts_with("ebb:rules/failures@")) {
            bail!("it exports {other}, but this host speaks {FAILURES_INTERFACE}");
        }
        return Ok(false);
    }
    let Some(ComponentItem::ComponentInstance(failures)) = ty.get_export(engine, FAILURES_INTERFACE).map(|e| e.ty) else {
        bail!("its export {FAILURES_INTERFACE} is not an instance");
    };
    let Some(ComponentItem::ComponentFunc(func)) = failures.get_export(engine, "on-handler-failure").map(|e| e.ty) else {
        bail!("its export {FAILURES_INTERFACE} lacks the function on-handler-failure");
    };
    func.typecheck::<(v0_4::failures_wit::FailureContext,), (v0_4::failures_wit::FailureDecision,)>(&ty.instance_type())
        .map_err(anyhow::Error::from)
        .context("its function on-handler-failure does not have the type of contract 0.4.0")?;
    Ok(true)
}

/// Type-checks the decision function `name` (one of the three every version has) against
/// one version's records.
fn typecheck<State, Idle, Decision>(ty: &wasmtime::component::types::Component, func: &ComponentFunc, name: &str) -> Result<()>
where
    State: ComponentType + wasmtime::component::Lower,
    Idle: ComponentType + wasmtime::component::Lower,
    Decision: ComponentType + wasmtime::component::Lift,
{
    let cx = ty.instance_type();
    let checked = match name {
        "configure" => func.typecheck::<(Vec<(String, String)>,), (Result<(), String>,)>(&cx),
        "optimal-dequeue-task-count" => func.typecheck::<(State,), (u32,)>(&cx),
        _ => func.typecheck::<(Idle,), (Decision,)>(&cx),
    };
    checked.map_err(anyhow::Error::from)
}
