//! The bus trigger JSON: what arrives on `<channel_prefix><queue>` from any publisher.

use proptest::prelude::*;

use crate::bus::{MAX_PAYLOAD_BYTES, MAX_TRIGGER_DELAY_MS, Trigger, parse_trigger};
use crate::fuzz::budget;

const PREFIX: &str = "ebb:queue:";

/// A queue name as a publisher might write it: a real one, a near miss, or any text.
fn queue_name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("orders".to_string()),
        "[a-z0-9-]{1,12}",
        Just(String::new()),
        Just("orders ".to_string()),
        Just("ORDERS".to_string()),
        Just("ord\u{0}ers".to_string()),
        any::<String>(),
    ]
}

/// A queue name as JSON text: plainly escaped, or with every character written as `\uXXXX`
/// (surrogate pairs beyond the basic plane), which must mean the same name.
fn json_string(name: &str, all_escaped: bool) -> String {
    if !all_escaped {
        return serde_json::to_string(name).expect("a string serialises");
    }
    let mut units = [0u16; 2];
    let escaped: String = name.chars().flat_map(|c| c.encode_utf16(&mut units).iter().map(|u| format!("\\u{u:04x}")).collect::<Vec<_>>()).collect();
    format!("\"{escaped}\"")
}

/// The `count` values a publisher might send, with whether the trigger takes them (and as what).
fn count_value() -> impl Strategy<Value = (String, Result<Option<u64>, ()>)> {
    prop_oneof![
        any::<u64>().prop_map(|n| (n.to_string(), Ok(Some(n)))),
        Just(("null".to_string(), Ok(None))),
        Just(("18446744073709551616".to_string(), Err(()))),
        Just(("-1".to_string(), Err(()))),
        Just(("1.0".to_string(), Err(()))),
        Just(("1e2".to_string(), Err(()))),
        Just(("1e400".to_string(), Err(()))),
        Just(("\"3\"".to_string(), Err(()))),
        Just(("true".to_string(), Err(()))),
        Just(("[]".to_string(), Err(()))),
        Just(("{}".to_string(), Err(()))),
        (i64::MIN..0).prop_map(|n| (n.to_string(), Err(()))),
    ]
}

/// The `delay_ms` values a publisher might send: a count's, bounded to 7 days.
fn delay_value() -> impl Strategy<Value = (String, Result<Option<u64>, ()>)> {
    prop_oneof![
        count_value().prop_map(|(text, taken)| (text, taken.and_then(|n| if n.is_some_and(|d| d > MAX_TRIGGER_DELAY_MS) { Err(()) } else { Ok(n) }))),
        (0..=MAX_TRIGGER_DELAY_MS).prop_map(|n| (n.to_string(), Ok(Some(n)))),
        Just(((MAX_TRIGGER_DELAY_MS + 1).to_string(), Err(()))),
    ]
}

/// One field of the object: the queue (the channel's or another), the count, the delay, or
/// a stranger.
#[derive(Debug, Clone)]
enum Field {
    Queue { same_as_channel: bool, other: String, all_escaped: bool },
    Count(String, Result<Option<u64>, ()>),
    Delay(String, Result<Option<u64>, ()>),
    Unknown(String),
}

fn field() -> impl Strategy<Value = Field> {
    prop_oneof![
        3 => (any::<bool>(), queue_name(), any::<bool>()).prop_map(|(same_as_channel, other, all_escaped)| Field::Queue { same_as_channel, other, all_escaped }),
        2 => count_value().prop_map(|(text, taken)| Field::Count(text, taken)),
        1 => delay_value().prop_map(|(text, taken)| Field::Delay(text, taken)),
        1 => prop_oneof![Just("Queue".to_string()), Just("counts".to_string()), Just("pad".to_string()), Just(String::new()), any::<String>()].prop_map(Field::Unknown),
    ]
}

/// A payload built from fields, with what `parse_trigger` must make of it.
#[derive(Debug, Clone)]
struct Built {
    payload: Vec<u8>,
    expected: Option<Trigger>,
}

fn build(queue: &str, fields: &[Field], space: &str, padding: usize) -> Built {
    let mut members = Vec::new();
    let (mut queues, mut counts, mut delays, mut unknown) = (Vec::new(), Vec::new(), Vec::new(), false);
    for field in fields {
        match field {
            Field::Queue { same_as_channel, other, all_escaped } => {
                let name = if *same_as_channel { queue } else { other.as_str() };
                members.push(format!("\"queue\"{space}:{space}{}", json_string(name, *all_escaped)));
                queues.push(name.to_string());
            }
            Field::Count(text, taken) => {
                members.push(format!("\"count\"{space}:{space}{text}"));
                counts.push(*taken);
            }
            Field::Delay(text, taken) => {
                members.push(format!("\"delay_ms\"{space}:{space}{text}"));
                delays.push(*taken);
            }
            Field::Unknown(key) => {
                // A key spelled as a field would be that field, not a stranger.
                let key = if key == "queue" || key == "count" || key == "delay_ms" { format!("{key}s") } else { key.clone() };
                members.push(format!("{}{space}:{space}1", json_string(&key, false)));
                unknown = true;
            }
        }
    }
    let padding = " ".repeat(padding);
    let payload = format!("{padding}{{{space}{}{space}}}{padding}", members.join(&format!("{space},{space}"))).into_bytes();
    let count = match counts.as_slice() {
        [] => Some(None),
        [Ok(count)] => Some(*count),
        _ => None,
    };
    let delay_ms = match delays.as_slice() {
        [] => Some(None),
        [Ok(delay)] => Some(*delay),
        _ => None,
    };
    let expected = match (queues.as_slice(), count, delay_ms) {
        ([name], Some(count), Some(delay_ms)) if name == queue && !unknown && payload.len() <= MAX_PAYLOAD_BYTES => {
            Some(Trigger { queue: queue.to_string(), count, delay_ms })
        }
        _ => None,
    };
    Built { payload, expected }
}

proptest! {
    #![proptest_config(budget(1000))]

    /// Any bytes on any channel: no panic, and a trigger taken is always the channel's own
    /// queue's, from a payload within the size limit.
    #[test]
    fn arbitrary_payloads_never_panic_and_a_taken_trigger_is_for_the_channels_queue(
        channel in prop_oneof![queue_name().prop_map(|q| format!("{PREFIX}{q}")), any::<String>()],
        payload in prop_oneof![proptest::collection::vec(any::<u8>(), 0..64), any::<String>().prop_map(String::into_bytes), proptest::collection::vec(any::<u8>(), MAX_PAYLOAD_BYTES - 8..MAX_PAYLOAD_BYTES + 8)],
    ) {
        if let Some(trigger) = parse_trigger(PREFIX, &channel, &payload) {
            prop_assert_eq!(format!("{PREFIX}{}", trigger.queue), channel);
            prop_assert!(payload.len() <= MAX_PAYLOAD_BYTES);
        }
    }

    /// Objects of the trigger's fields, strangers, duplicates, hostile counts, escapes and
    /// padding up to the limit: taken exactly when they are one trigger for the channel's
    /// queue, with the count they say.
    #[test]
    fn a_trigger_is_taken_exactly_when_it_is_well_formed_for_the_channels_queue(
        queue in queue_name(),
        fields in proptest::collection::vec(field(), 0..4),
        space in prop_oneof![Just(""), Just(" "), Just("\n\t ")],
        padding in prop_oneof![4 => 0..4usize, 1 => 2000..2100usize],
    ) {
        let built = build(&queue, &fields, space, padding);
        let parsed = parse_trigger(PREFIX, &format!("{PREFIX}{queue}"), &built.payload);
        prop_assert_eq!(parsed, built.expected, "{}", String::from_utf8_lossy(&built.payload));
    }

    /// What this host publishes (`publish_once`'s encoding), every other host takes back as is.
    #[test]
    fn every_trigger_a_host_publishes_is_taken_back_as_sent(
        queue in queue_name(),
        count in any::<Option<u64>>(),
        delay_ms in proptest::option::of(1..=MAX_TRIGGER_DELAY_MS),
        prefix in prop_oneof![Just(PREFIX.to_string()), any::<String>()],
    ) {
        let trigger = Trigger { queue: queue.clone(), count, delay_ms };
        let payload = serde_json::to_vec(&trigger).expect("a trigger serialises");
        let parsed = parse_trigger(&prefix, &format!("{prefix}{queue}"), &payload);
        if payload.len() <= MAX_PAYLOAD_BYTES {
            prop_assert_eq!(parsed, Some(trigger));
        } else {
            prop_assert_eq!(parsed, None);
        }
    }
}
