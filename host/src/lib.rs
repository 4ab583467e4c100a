//! ebb: queue workers whose scaling decisions are hot-swapped WebAssembly rules.

pub mod bus;
pub mod cli;
pub mod config;
pub mod cost;
pub mod demo;
#[cfg(test)]
mod fuzz;
pub mod handler;
pub mod health;
pub mod http;
pub mod listener;
pub mod log_limit;
pub mod panics;
pub mod queue;
pub mod rules;
pub mod scaler;
pub mod service;
pub mod simulate;
