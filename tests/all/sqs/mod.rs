//! Amazon SQS, against moto's server (started once for this test binary): the queue and its
//! conformance, the binary end to end, hosts competing, FIFO groups, redrive, claim checks in
//! the Extended Client's format, faults and throttling, metering, cost and the simulator.

mod bad_input;
mod bench;
mod check;
mod claims;
mod cost;
mod faults;
mod fifo;
mod hosts;
mod metering;
mod queue;
mod record;
mod redrive;
mod run;
mod simulate;
