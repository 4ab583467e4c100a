//! ebb: queue workers whose scaling decisions are hot-swapped WebAssembly rules.
//!
//! Most people run the `ebb` binary (see the README). This library is for a Rust program
//! that embeds a host with handlers of its own, and for tools around ebb's parts.
//!
//! # Embedding a host with a Rust handler
//! [`Host::builder`] starts what `ebb run` starts (the dequeue tasks, the rules from the
//! watched folder, the API, the scaler) for a [`Config`]; a queue given a
//! [`Handler`](handler::Handler) needs no `handler.url`.
//!
//! ```
//! use std::time::Duration;
//! use ebb::handler::{Handler, IncomingMessage};
//!
//! /// Sends each body it handles to the channel.
//! struct Forward(tokio::sync::mpsc::UnboundedSender<bytes::Bytes>);
//!
//! #[async_trait::async_trait]
//! impl Handler for Forward {
//!     async fn handle(&self, message: &IncomingMessage) -> anyhow::Result<()> {
//!         self.0.send(message.body.clone())?;
//!         Ok(()) // Ok deletes the message; Err retries it, then moves it to orders-poison.
//!     }
//! }
//!
//! #[tokio::main]
//! async fn main() -> anyhow::Result<()> {
//!     let dir = tempfile::tempdir()?;
//!     // The embedded queue, in data_dir; the API on a free port.
//!     let text = "[api]\nlisten = \"127.0.0.1:0\"\n[queues.orders]\n";
//!     let config = ebb::Config::parse(text, dir.path(), None)?;
//!     let (handled, mut bodies) = tokio::sync::mpsc::unbounded_channel();
//!     let host = ebb::Host::builder(&config).handler("orders", Forward(handled)).start().await?;
//!     let orders = host.queue("orders").expect("configured");
//!     orders.send(b"hello", Duration::ZERO, Duration::from_secs(5)).await?;
//!     assert_eq!(bodies.recv().await.as_deref(), Some(&b"hello"[..]));
//!     host.shutdown().await; // Drains: running handlers finish. (Dropping `host` stops it abruptly.)
//!     Ok(())
//! }
//! ```
//!
//! # What the library exports
//! - [`Config`], [`Host`], [`QueueHandle`], [`Role`]: a host as `ebb run` and `ebb scaler`
//!   start it.
//! - [`handler`]: the [`Handler`](handler::Handler) trait, and the HTTP handler.
//! - [`queue`]: the storage seam ([`QueueClient`](queue::QueueClient)) with its backends
//!   (embedded, Azure, in memory) and decorators (retries, metering, partitions).
//! - [`rules`]: the WASM rule engine and the built-in rule, to evaluate rules from Rust.
//! - [`listener`]: one queue's dequeue loop, to run without a host.
//! - [`payload`]: the envelope that packs many work items into one message (issue 20),
//!   its codecs and its bomb-safe decoder.
//! - [`bus`]: push notifications between hosts (publish from a producer).
//! - [`status`]: what `GET /status` answers, as types to read it with.
//! - [`simulate`]: `ebb simulate` as a function; [`keda`]: a client of the KEDA scaler.
//! - [`config`], [`health`], [`names`]: the parts of a configuration and a host's health;
//!   [`record`]: each queue's arrivals, as `ebb trace export` reads them; [`api`]: the HTTP
//!   API's routes that need a token.
//! - [`run_command_line`]: the `ebb` command; nothing else of the command line is public.
//!
//! Items that only the crate itself uses are `pub(crate)`.
//!
//! # The house, bottom to top
//! Dependencies point one way, down this list; a module imports only from modules above
//! its own layer (a test in `tests/all/shape.rs` checks it). Modules not named above are
//! private.
//!
//! 1. **Vocabulary**: `defaults` (every default, once), [`health`] (liveness and
//!    readiness), [`names`] (names checked once), `input` (bounded reads of files and
//!    stdin), `output` (files written whole, or into a device or FIFO as it is),
//!    `durations` (durations shown as they are written), `log_limit`, `panics`,
//!    [`telemetry`] (span names and fields, the OTLP exporter), and `fuzz`
//!    (tests only: the budget of the fuzzers of private parsers).
//! 2. **Parts**: [`queue`] (the storage seam, backends and decorators), [`rules`] (the
//!    WASM engine, the rule slots, the watcher), [`bus`] (push between hosts),
//!    [`handler`] (where messages go), [`payload`] (envelopes of many items), `cost`,
//!    [`record`] (each queue's arrivals, for `ebb trace export`).
//! 3. **[`listener`]**: the paper's dequeue loop over one storage queue; [`status`]: what
//!    `GET /status` answers, as types (the listeners' statuses, costs, bus and storage).
//! 4. **[`config`]**: the file form of `ebb.toml`, validated into each part's settings.
//! 5. **`service`**: what a host runs, assembled from the configuration: each queue's
//!    client stack and handle, its listeners, the rules, the bus, readiness.
//! 6. **Front ends**: `http` (the API), `scaler` (KEDA's external scaler).
//! 7. **Commands**: `host` (a running host: ports bound first, then the work),
//!    `cli` (through [`run_command_line`]), `demo`, [`simulate`]. (`ebb bench` runs `ebb-bench`,
//!    a crate of its own in host/bench.)

#![warn(missing_docs)]

pub mod bus;
mod cli;
pub mod config;
mod cost;
mod defaults;
mod demo;
mod durations;
#[cfg(test)]
mod fuzz;
pub mod handler;
pub mod health;
mod host;
mod http;
mod input;
pub mod listener;
mod log_limit;
pub mod names;
mod output;
mod panics;
pub mod payload;
pub mod queue;
pub mod record;
pub mod rules;
mod scaler;
mod service;
pub mod simulate;
pub mod status;
pub mod telemetry;

pub use config::Config;
pub use host::Host;
pub use service::packing::{ItemId, ItemsError, ItemsSent};
pub use service::{QueueHandle, Role};

/// The `ebb` command, as the binary runs it: parses the process's arguments (exiting with
/// clap's usage on a bad one), runs the command, and on failure prints the error with its
/// causes and returns code 1.
pub fn run_command_line() -> std::process::ExitCode {
    cli::main(cli::Cli::from_env())
}

/// The HTTP API's routes that need a token.
pub mod api {
    pub use crate::http::authenticated_route_table;
}

/// KEDA's external scaler protocol (`externalscaler.proto`), as a client: what KEDA calls
/// on `ebb scaler` (or on a host with `[scaler] listen`), for tests and tools.
pub mod keda {
    pub use crate::scaler::{ExternalScalerClient, GetMetricsRequest, IsActiveResponse, MAX_CONNECTIONS, MAX_STREAMS, ScaledObjectRef};
}
