//! ebb: queue workers whose scaling decisions are hot-swapped WebAssembly rules.

pub mod cli;
pub mod handler;
pub mod listener;
pub mod queue;
pub mod rules;
