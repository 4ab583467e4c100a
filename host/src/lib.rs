//! ebb: queue workers whose scaling decisions are hot-swapped WebAssembly rules.
//!
//! # The house, bottom to top
//! Dependencies point one way, down this list; a module imports only from modules above
//! its own layer (a test in `tests/all/shape.rs` checks it).
//!
//! 1. **Vocabulary**: [`defaults`] (every default, once), [`health`] (liveness and
//!    readiness), [`names`] (names checked once), `input` (bounded reads of files and
//!    stdin), [`log_limit`], [`panics`].
//! 2. **Parts**: [`queue`] (the storage seam, backends and decorators), [`rules`] (the
//!    WASM engine, the rule slots, the watcher), [`bus`] (push between hosts),
//!    [`handler`] (where messages go), [`cost`].
//! 3. **[`listener`]**: the paper's dequeue loop over one storage queue.
//! 4. **[`config`]**: the file form of `ebb.toml`, validated into each part's settings.
//! 5. **[`service`]**: what a host runs, assembled from the configuration: each queue's
//!    client stack and handle, its listeners, the rules, the bus, readiness.
//! 6. **Front ends**: [`http`] (the API), [`scaler`] (KEDA's external scaler).
//! 7. **Commands**: [`host`] (a running host: ports bound first, then the work),
//!    [`cli`], [`demo`], [`simulate`].

pub mod bus;
pub mod cli;
pub mod config;
pub mod cost;
pub mod defaults;
pub mod demo;
#[cfg(test)]
mod fuzz;
pub mod handler;
pub mod health;
pub mod host;
pub mod http;
pub(crate) mod input;
pub mod listener;
pub mod log_limit;
pub mod names;
pub mod panics;
pub mod queue;
pub mod rules;
pub mod scaler;
pub mod service;
pub mod simulate;
