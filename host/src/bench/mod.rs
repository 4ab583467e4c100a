//! `ebb bench`: ebb measured against what a user would write instead, in the same run.
//!
//! Each bench interleaves its contenders (A, B, C, A, B, C …) so that the drift of a shared,
//! noisy machine hits all of them alike, and reports medians over the rounds.
//!
//! - `http`: the handler path (issue 24): messages POSTed to a local app by a plain reqwest
//!   loop, by a hand-written redb queue loop, and by ebb's listener over the embedded store;
//!   throughput, CPU per message and bytes written to the store per message.
//! - `server`: that local app, an HTTP server answering 200 at once, run as a process of its
//!   own (`ebb bench serve`) so that its CPU is not counted as the client's.
//! - `plan`: what `http` runs and the runs it gathers.
//! - `contenders`: the three ways of moving the messages, one run each.
//! - `measure`: what a run is measured with: the process's CPU time, and a storage backend
//!   counting the bytes redb writes.
//! - `report`: medians, ratios, the goals, and the table or JSON printed.
//! - `claims`: a large body (50 MiB by default) through a claim-check store on Azurite's
//!   blob service, against the official SDK's own upload and download of the same bytes.
//! - `record`: what recording arrivals costs at load (issue 22): the same run, recording
//!   on and off, alternating.
//! - `codecs`: the envelope's codecs (issue 20) on a corpus of JSON work items: ratio,
//!   items per envelope, packing and decoding speed, against no compression.
//! - `payloads`: producers sending one item at a time, packed against unpacked, through a
//!   real host (issue 20): billed transactions per item, pickup latency, items per second.
//! - `shadow`: a shadow rule's added cost per decision (issue 22), against no shadow.

pub(crate) mod claims;
pub(crate) mod codecs;
pub(crate) mod contenders;
pub(crate) mod failures;
pub(crate) mod http;
pub(crate) mod measure;
pub(crate) mod payloads;
pub(crate) mod plan;
pub(crate) mod record;
pub(crate) mod report;
pub(crate) mod server;
pub(crate) mod shadow;
