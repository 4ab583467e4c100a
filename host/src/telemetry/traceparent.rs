//! W3C Trace Context (<https://www.w3.org/TR/trace-context/>): a producer's `traceparent`
//! and `tracestate` headers, parsed and checked. A malformed one is refused and counted
//! ([`rejected`]), never passed on: the span it would have parented starts a new trace.

use std::sync::LazyLock;

use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
use prometheus_client::metrics::counter::Counter;

/// `traceparent` headers refused (and `tracestate` headers dropped) since start, for
/// `/metrics`.
static REJECTED: LazyLock<Counter> = LazyLock::new(Counter::default);

/// The counter of refused headers (a handle on the one count).
pub fn rejected() -> Counter {
    REJECTED.clone()
}

/// The longest `tracestate` kept: the specification's 32 members of up to 256 characters
/// each bound it near 8 KiB; more is not a tracestate but a header used as a channel.
const MAX_TRACESTATE_BYTES: usize = 8192;

/// The most members a `tracestate` list may have.
const MAX_TRACESTATE_MEMBERS: usize = 32;

/// Why a header was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Not `version-traceid-parentid-flags` of 2, 32, 16 and 2 lowercase hex digits.
    #[error("traceparent: not version-traceid-parentid-flags in lowercase hex")]
    Shape,
    /// Version `ff` is forbidden; a version other than `00` is read only if it is longer.
    #[error("traceparent: version {0:?} is not one this host reads")]
    Version(String),
    /// An all-zero trace id or parent id names no span.
    #[error("traceparent: all-zero trace id or parent id")]
    ZeroId,
    /// A `tracestate` over the size bound or not a list of `key=value` members.
    #[error("tracestate: malformed or over {MAX_TRACESTATE_BYTES} bytes")]
    State,
}

/// The remote parent named by `traceparent` (and `tracestate`), checked: `Err` (counted)
/// when `traceparent` is malformed. A malformed `tracestate` beside a good `traceparent` is
/// dropped and counted, the parent kept, as the specification asks.
pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Result<SpanContext, Refused> {
    let parent = parse_traceparent(traceparent).inspect_err(|_| {
        REJECTED.inc();
    })?;
    let state = match tracestate.map(parse_tracestate) {
        None => TraceState::default(),
        Some(Ok(state)) => state,
        Some(Err(_)) => {
            REJECTED.inc();
            TraceState::default()
        }
    };
    let (trace_id, span_id, flags) = parent;
    Ok(SpanContext::new(trace_id, span_id, flags, true, state))
}

fn parse_traceparent(header: &str) -> Result<(TraceId, SpanId, TraceFlags), Refused> {
    let header = header.trim();
    // Version 00 is exactly 55 characters; a later version may append fields after a dash.
    if header.len() < 55 || !header.is_ascii() {
        return Err(Refused::Shape);
    }
    let version = &header[..2];
    let fields = &header[..55];
    let rest = &header[55..];
    let parts: Vec<&str> = fields.split('-').collect();
    let [_, trace, parent, flags] = parts.as_slice() else {
        return Err(Refused::Shape);
    };
    let lower_hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !(lower_hex(version, 2) && lower_hex(trace, 32) && lower_hex(parent, 16) && lower_hex(flags, 2)) {
        return Err(Refused::Shape);
    }
    match version {
        "ff" => return Err(Refused::Version(version.to_string())),
        "00" if !rest.is_empty() => return Err(Refused::Shape),
        // A later version is read as 00 when what follows its four fields is a new field.
        "00" => {}
        _ if !rest.is_empty() && !rest.starts_with('-') => return Err(Refused::Shape),
        _ => {}
    }
    let trace_id = TraceId::from_hex(trace).map_err(|_| Refused::Shape)?;
    let span_id = SpanId::from_hex(parent).map_err(|_| Refused::Shape)?;
    if trace_id == TraceId::INVALID || span_id == SpanId::INVALID {
        return Err(Refused::ZeroId);
    }
    let flags = u8::from_str_radix(flags, 16).map_err(|_| Refused::Shape)?;
    // Only the sampled bit is defined for version 00; the others are not passed on.
    Ok((trace_id, span_id, TraceFlags::new(flags & TraceFlags::SAMPLED.to_u8())))
}

fn parse_tracestate(header: &str) -> Result<TraceState, Refused> {
    if header.len() > MAX_TRACESTATE_BYTES {
        return Err(Refused::State);
    }
    // Empty members are allowed (and come of combining headers); more than 32 members, or a
    // key twice, make the whole list invalid.
    let members: Vec<&str> = header.split(',').map(str::trim).filter(|member| !member.is_empty()).collect();
    let mut keys = std::collections::HashSet::new();
    if members.len() > MAX_TRACESTATE_MEMBERS || !members.iter().all(|member| keys.insert(member.split_once('=').map_or(*member, |(key, _)| key))) {
        return Err(Refused::State);
    }
    if members.is_empty() {
        return Ok(TraceState::default());
    }
    members.join(",").parse::<TraceState>().map_err(|_| Refused::State)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_well_formed_traceparent_names_its_remote_parent() {
        let parent = parse(GOOD, Some("vendor=value,other=1")).unwrap();
        assert_eq!(parent.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(parent.span_id().to_string(), "00f067aa0ba902b7");
        assert!(parent.is_sampled() && parent.is_remote());
        assert_eq!(parent.trace_state().get("vendor"), Some("value"));
    }

    #[test]
    fn malformed_traceparents_are_refused_and_counted() {
        let cases = [
            ("wrong version", "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", Refused::Version("ff".into())),
            ("zero trace id", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", Refused::ZeroId),
            ("zero parent id", "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", Refused::ZeroId),
            ("too long for 00", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", Refused::Shape),
            ("too short", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1", Refused::Shape),
            ("non-hex", "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01", Refused::Shape),
            ("uppercase", "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01", Refused::Shape),
            ("wrong separators", "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01", Refused::Shape),
            ("empty", "", Refused::Shape),
        ];
        for (name, header, refused) in cases {
            let before = rejected().get();
            assert_eq!(parse(header, None).unwrap_err(), refused, "{name}");
            assert!(rejected().get() > before, "{name}: counted");
        }
    }

    #[test]
    fn a_later_version_is_read_as_far_as_version_00_goes() {
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03-whatever";
        let parent = parse(later, None).unwrap();
        assert_eq!(parent.trace_flags(), TraceFlags::SAMPLED, "undefined flags are not passed on");
    }

    #[test]
    fn a_malformed_tracestate_is_dropped_the_parent_kept() {
        let before = rejected().get();
        let parent = parse(GOOD, Some(&"k=v,".repeat(3000))).unwrap();
        assert_eq!(parent.trace_state().header(), "", "dropped");
        assert!(rejected().get() > before, "counted");
        assert_eq!(parse(GOOD, Some("not a member")).unwrap().trace_state().header(), "");
    }

    #[test]
    fn a_tracestate_of_over_32_members_or_a_key_twice_is_dropped_the_parent_kept() {
        let members = |n: usize| (0..n).map(|i| format!("k{i}=v")).collect::<Vec<_>>().join(",");
        assert_eq!(parse(GOOD, Some(&members(32))).unwrap().trace_state().header().split(',').count(), 32);
        for (name, state) in [("33 members", members(33)), ("a key twice", "a=1,b=2,a=3".to_string())] {
            let before = rejected().get();
            assert_eq!(parse(GOOD, Some(&state)).unwrap().trace_state().header(), "", "{name}: dropped");
            assert!(rejected().get() > before, "{name}: counted");
        }
    }

    #[test]
    fn empty_tracestate_members_are_skipped() {
        assert_eq!(parse(GOOD, Some(" a=1 ,, b=2,")).unwrap().trace_state().header(), "a=1,b=2");
        // Not refused (the count is shared with the tests running beside this one).
        assert_eq!(parse_tracestate("").map(|state| state.header()), Ok(String::new()), "an empty list is no fault");
    }
}
