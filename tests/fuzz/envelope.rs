//! The envelope decoder (issue 20): every message a listener takes goes through it, and a
//! producer that is careless or hostile writes it.
//!
//! Beyond "no panic", each case checks that what is taken stays within the [`Limits`],
//! that every refusal has a reason, and, with an allocator that counts this thread's bytes,
//! that decoding never holds more memory than the limits allow, bombs included.

use std::sync::OnceLock;

use bytes::Bytes;
use proptest::prelude::*;

use crate::budget;
use ebb::payload::{
    AllowedReferences, AzureContainer, BlobRef, Body, ClaimCheck, Codec, Decoded, EnvelopeError, Item, Limits, MAGIC, MIN_ENVELOPE_BYTES, Origin, Packer,
    decode, decode_text, encode, to_text,
};
use ebb::telemetry::TraceContext;

/// Counts the bytes the current thread holds, while asked to: the whole test binary
/// allocates through it, and only a thread inside [`peak_bytes`] pays more than a check.
mod allocations {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    struct Counting;

    thread_local! {
        // Constant and without destructors: reading them never allocates, so the
        // allocator may.
        static COUNTING: Cell<bool> = const { Cell::new(false) };
        static LIVE: Cell<isize> = const { Cell::new(0) };
        static PEAK: Cell<isize> = const { Cell::new(0) };
    }

    fn note(delta: isize) {
        let _ = COUNTING.try_with(|counting| {
            if counting.get() {
                let live = LIVE.get() + delta;
                LIVE.set(live);
                PEAK.set(PEAK.get().max(live));
            }
        });
    }

    // SAFETY: every call is passed on to the system allocator unchanged; the counting
    // touches thread-locals only.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            let pointer = unsafe { System.alloc(layout) };
            if !pointer.is_null() {
                note(layout.size() as isize);
            }
            pointer
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            let pointer = unsafe { System.alloc_zeroed(layout) };
            if !pointer.is_null() {
                note(layout.size() as isize);
            }
            pointer
        }

        unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
            unsafe { System.dealloc(pointer, layout) };
            note(-(layout.size() as isize));
        }

        unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            let moved = unsafe { System.realloc(pointer, layout, new_size) };
            if !moved.is_null() {
                note(new_size as isize - layout.size() as isize);
            }
            moved
        }
    }

    #[global_allocator]
    static COUNTING_ALLOCATOR: Counting = Counting;

    /// What `work` returns, and the most bytes this thread held above its start meanwhile
    /// (what it returns included).
    pub(super) fn peak_bytes<T>(work: impl FnOnce() -> T) -> (T, usize) {
        LIVE.set(0);
        PEAK.set(0);
        COUNTING.set(true);
        let result = work();
        COUNTING.set(false);
        (result, PEAK.get().max(0) as usize)
    }
}

/// What the fuzzed consumer accepts: small, so a decoder that allocates by what the input
/// says rather than by the limits is caught at once.
fn limits() -> Limits {
    Limits {
        max_items: 256,
        max_decoded_bytes: 64 << 10,
        max_claim_check_bytes: 1 << 30,
        references: AllowedReferences {
            azure: Some(AzureContainer { account: "devstoreaccount1".into(), container: "orders-bodies".into() }),
            embedded_queue: Some("orders".into()),
            s3_bucket: None,
        },
    }
}

/// Most bytes decoding may hold under `limits`: the section, the items' strings (copied
/// from the section), one `Item` per allowed item, and a decompressor's state.
fn memory_bound(limits: &Limits) -> usize {
    2 * limits.max_decoded_bytes + limits.max_items as usize * std::mem::size_of::<Item>() + (64 << 10)
}

/// Decodes under the allocation counter; checks the memory bound, and that what is taken
/// is within the limits and a refusal has a reason.
fn decode_checked(bytes: &[u8], limits: &Limits) -> Result<Result<Decoded, EnvelopeError>, TestCaseError> {
    let (decoded, peak) = allocations::peak_bytes(|| decode(bytes, limits));
    prop_assert!(peak <= memory_bound(limits), "decoding {} bytes held {peak} bytes, over {}", bytes.len(), memory_bound(limits));
    match &decoded {
        Ok(Decoded::NotAnEnvelope) => prop_assert!(!bytes.starts_with(&MAGIC)),
        Ok(Decoded::Envelope(envelope)) => {
            prop_assert!(bytes.starts_with(&MAGIC));
            prop_assert!(envelope.items.len() <= limits.max_items as usize);
            let inline: usize = envelope.items.iter().map(|item| if let Body::Inline(b) = &item.body { b.len() } else { 0 }).sum();
            prop_assert!(inline <= limits.max_decoded_bytes);
            for item in &envelope.items {
                if let Body::ClaimCheck(check) = &item.body {
                    prop_assert!(limits.references.allows(&check.location) && check.size <= limits.max_claim_check_bytes);
                }
            }
        }
        Err(error) => {
            let reason = error.to_string();
            prop_assert!(reason.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit()), "{:?}", reason);
            prop_assert!(bytes.starts_with(&MAGIC), "refused a plain message: {}", reason);
        }
    }
    Ok(decoded)
}

fn codec() -> impl Strategy<Value = Codec> {
    proptest::sample::select(Codec::ALL.to_vec())
}

fn body() -> impl Strategy<Value = Bytes> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..64).prop_map(Bytes::from),
        // JSON-like text: repeats that the codecs shrink.
        (0u32..100_000, "[a-z ]{0,40}", 0usize..12)
            .prop_map(|(id, note, repeats)| { Bytes::from(format!("{{\"id\":{id},\"status\":\"created\",\"note\":\"{}\"}}", note.repeat(repeats))) }),
        (any::<u8>(), 0usize..3000).prop_map(|(byte, length)| Bytes::from(vec![byte; length])),
    ]
}

fn location() -> impl Strategy<Value = BlobRef> {
    prop_oneof![
        "[ -~é/]{1,40}".prop_map(|blob| BlobRef::Azure { account: "devstoreaccount1".into(), container: "orders-bodies".into(), blob }),
        any::<u64>().prop_map(|key| BlobRef::Embedded { queue: "orders".into(), key }),
    ]
}

fn item() -> impl Strategy<Value = Item> {
    let body = prop_oneof![
        6 => body().prop_map(Body::Inline),
        1 => (location(), 0u64..(1 << 30), any::<[u8; 32]>()).prop_map(|(location, size, sha256)| Body::ClaimCheck(ClaimCheck { location, size, sha256 })),
    ];
    let origin = proptest::option::of(("[0-9a-zé:-]{1,60}", any::<u32>()).prop_map(|(message_id, index)| Origin { message_id, index }));
    let trace = proptest::option::of(trace_context());
    (prop_oneof![Just(0u32), 0u32..10, Just(u32::MAX)], body, origin, trace).prop_map(|(attempts, body, origin, trace)| Item { attempts, body, origin, trace })
}

/// A `tracestate` a producer may send: members `key=value`, or none.
fn tracestate() -> impl Strategy<Value = Option<String>> {
    proptest::option::of(proptest::collection::vec("[a-z][a-z0-9_]{0,8}=[!-+--<>-~]{1,12}", 1..4).prop_map(|members| members.join(",")))
}

/// A well-formed context (its `tracestate` dropped by the checker when two members share a key).
fn trace_context() -> impl Strategy<Value = TraceContext> {
    (1u128.., 1u64.., any::<u8>(), tracestate()).prop_map(|(trace, span, flags, state)| {
        TraceContext::parse(&format!("00-{trace:032x}-{span:016x}-{flags:02x}"), state.as_deref()).expect("a well-formed traceparent")
    })
}

/// The bytes of a `traceparent` after an item's trace bit, and whether the checker must
/// take them (`None`: any bytes, its call): well-formed, or malformed each way it refuses.
fn traceparent_bytes() -> impl Strategy<Value = (Vec<u8>, Option<bool>)> {
    let ids = || (1u128.., 1u64.., any::<u8>());
    prop_oneof![
        4 => ids().prop_map(|(trace, span, flags)| (format!("00-{trace:032x}-{span:016x}-{flags:02x}").into_bytes(), Some(true))),
        1 => ids().prop_map(|(trace, span, flags)| (format!("ff-{trace:032x}-{span:016x}-{flags:02x}").into_bytes(), Some(false))),
        1 => (1u64.., any::<u8>()).prop_map(|(span, flags)| (format!("00-{:032x}-{span:016x}-{flags:02x}", 0).into_bytes(), Some(false))),
        1 => (1u128.., any::<u8>()).prop_map(|(trace, flags)| (format!("00-{trace:032x}-{:016x}-{flags:02x}", 0).into_bytes(), Some(false))),
        1 => (ids(), "-[a-z0-9]{1,20}").prop_map(|((trace, span, flags), more)| (format!("00-{trace:032x}-{span:016x}-{flags:02x}{more}").into_bytes(), Some(false))),
        1 => (ids(), 3usize..35, "[g-zG-Z]").prop_map(|((trace, span, flags), at, letter)| {
            let mut text = format!("00-{trace:032x}-{span:016x}-{flags:02x}");
            text.replace_range(at..=at, &letter);
            (text.into_bytes(), Some(false))
        }),
        // Uppercase: refused, unless the trace id has no letter to raise.
        1 => ids().prop_map(|(trace, span, flags)| {
            let taken = format!("{trace:x}").bytes().all(|b| b.is_ascii_digit());
            (format!("00-{trace:032X}-{span:016x}-{flags:02x}").into_bytes(), Some(taken))
        }),
        1 => Just((Vec::new(), Some(false))),
        1 => proptest::collection::vec(any::<u8>(), 0..80).prop_map(|bytes| (bytes, None)),
    ]
}

/// One inline item's record with the trace bit set (and maybe an origin): the kind, its
/// attempts, the context's bytes, its body; and whether its `traceparent` must be taken.
fn traced_record() -> impl Strategy<Value = (Vec<u8>, Vec<u8>, Vec<u8>, Option<bool>)> {
    let state = prop_oneof![3 => tracestate().prop_map(|state| state.unwrap_or_default().into_bytes()), 1 => proptest::collection::vec(any::<u8>(), 0..40)];
    (traceparent_bytes(), state, any::<bool>(), body()).prop_map(|((parent, taken), state, with_origin, body)| {
        let mut record = vec![0x40 | if with_origin { 0x80 } else { 0 }];
        record.extend_from_slice(&3u32.to_le_bytes());
        if with_origin {
            record.extend_from_slice(&[2, b'm', b'1']);
            record.extend_from_slice(&7u32.to_le_bytes());
        }
        record.push(parent.len() as u8);
        record.extend_from_slice(&parent);
        record.extend_from_slice(&(state.len() as u16).to_le_bytes());
        record.extend_from_slice(&state);
        record.extend_from_slice(&(body.len() as u32).to_le_bytes());
        record.extend_from_slice(&body);
        (record, parent, state, taken)
    })
}

/// An uncompressed envelope of `count` items whose section is `section`.
fn sealed(count: usize, section: &[u8]) -> Vec<u8> {
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(&[1, Codec::None.id(), 0, 0]);
    bytes.extend_from_slice(&(count as u32).to_le_bytes());
    bytes.extend_from_slice(&(section.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&(section.len() as u32).to_le_bytes());
    bytes.extend_from_slice(section);
    bytes.extend_from_slice(&[0; 4]);
    reseal(bytes)
}

fn items() -> impl Strategy<Value = Vec<Item>> {
    proptest::collection::vec(item(), 0..24)
}

/// `bytes` with its CRC32 recomputed, so the decoder reads on past the checksum.
fn reseal(mut bytes: Vec<u8>) -> Vec<u8> {
    if bytes.len() >= 4 {
        let end = bytes.len() - 4;
        let crc = crc32fast::hash(&bytes[..end]);
        bytes[end..].copy_from_slice(&crc.to_le_bytes());
    }
    bytes
}

/// A change to an envelope's bytes.
#[derive(Debug, Clone)]
enum Mutation {
    Flip {
        at: usize,
        bit: u8,
    },
    Set {
        at: usize,
        value: u8,
    },
    /// A header field (at 8..24) set to a value that matters: 0, 1, large, the maximum.
    Field {
        at: usize,
        value: u32,
    },
    Truncate {
        to: usize,
    },
    Insert {
        at: usize,
        bytes: Vec<u8>,
    },
    Remove {
        at: usize,
        count: usize,
    },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
        (any::<usize>(), any::<u8>()).prop_map(|(at, value)| Mutation::Set { at, value }),
        (
            prop_oneof![Just(9usize), Just(10), Just(12), Just(16), Just(20)],
            prop_oneof![Just(0u32), Just(1), Just(2), Just(255), Just(65_537), Just(u32::MAX), any::<u32>()]
        )
            .prop_map(|(at, value)| Mutation::Field { at, value }),
        any::<usize>().prop_map(|to| Mutation::Truncate { to }),
        (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..8)).prop_map(|(at, bytes)| Mutation::Insert { at, bytes }),
        (any::<usize>(), 1usize..16).prop_map(|(at, count)| Mutation::Remove { at, count }),
    ]
}

fn mutate(bytes: &mut Vec<u8>, mutation: &Mutation) {
    let len = bytes.len().max(1);
    match mutation {
        Mutation::Flip { at, bit } => {
            if let Some(byte) = bytes.get_mut(at % len) {
                *byte ^= 1 << bit;
            }
        }
        Mutation::Set { at, value } => {
            if let Some(byte) = bytes.get_mut(at % len) {
                *byte = *value;
            }
        }
        Mutation::Field { at, value } => {
            if bytes.len() >= at + 4 {
                bytes[*at..at + 4].copy_from_slice(&value.to_le_bytes());
            }
        }
        Mutation::Truncate { to } => bytes.truncate(to % len),
        Mutation::Insert { at, bytes: inserted } => {
            let at = at % (bytes.len() + 1);
            bytes.splice(at..at, inserted.iter().copied());
        }
        Mutation::Remove { at, count } => {
            let at = at % len;
            let end = (at + count).min(bytes.len());
            if at < end {
                bytes.drain(at..end);
            }
        }
    }
}

/// Headers that pass the checksum with fields a forger picks, around any section.
fn forged() -> impl Strategy<Value = Vec<u8>> {
    (
        prop_oneof![8 => Just(1u8), 1 => any::<u8>()],
        prop_oneof![8 => 0u8..4, 1 => any::<u8>()],
        prop_oneof![8 => Just(0u16), 1 => any::<u16>()],
        prop_oneof![0u32..20, any::<u32>()],
        prop_oneof![0u32..200, 0u32..(128 << 10), any::<u32>()],
        proptest::collection::vec(any::<u8>(), 0..200),
        prop_oneof![4 => Just(None), 1 => any::<u32>().prop_map(Some)],
    )
        .prop_map(|(version, codec, flags, count, declared, section, stored)| {
            let mut bytes = MAGIC.to_vec();
            bytes.extend_from_slice(&[version, codec]);
            bytes.extend_from_slice(&flags.to_le_bytes());
            bytes.extend_from_slice(&count.to_le_bytes());
            bytes.extend_from_slice(&declared.to_le_bytes());
            bytes.extend_from_slice(&stored.unwrap_or(section.len() as u32).to_le_bytes());
            bytes.extend_from_slice(&section);
            bytes.extend_from_slice(&[0; 4]);
            reseal(bytes)
        })
}

/// Per codec, one item of 1 MiB of zeros, compressed: a few hundred bytes or less that
/// inflate sixteen times past the fuzzed limit.
fn bombs() -> &'static [(Codec, Vec<u8>)] {
    static BOMBS: OnceLock<Vec<(Codec, Vec<u8>)>> = OnceLock::new();
    BOMBS.get_or_init(|| {
        [Codec::Deflate, Codec::Zstd, Codec::Lz4]
            .into_iter()
            .map(|codec| {
                let envelope = encode(&[Item::inline(vec![0u8; 1 << 20])], codec).unwrap();
                (codec, envelope[24..envelope.len() - 4].to_vec())
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(budget(1000))]

    /// Any bytes, bytes after the magic, and forged headers with a valid checksum: never a
    /// panic; plain messages are plain; envelopes within the limits; refusals with reasons;
    /// memory bounded.
    #[test]
    fn arbitrary_bytes_never_panic_and_what_is_taken_stays_within_the_limits(
        bytes in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..300),
            proptest::collection::vec(any::<u8>(), 0..300).prop_map(|rest| [&MAGIC[..], &rest].concat()),
            forged(),
        ]
    ) {
        let _taken_or_refused = decode_checked(&bytes, &limits())?;
    }

    /// The same, as message text: plain text is plain, the base64 of an envelope decodes or
    /// is refused with its reason.
    #[test]
    fn arbitrary_text_never_panics(text in prop_oneof![any::<String>(), "wUVCQg0K[A-Za-z0-9+/= \r\n]{0,120}", forged().prop_map(|b| to_text(&b))]) {
        match decode_text(&text, &limits()) {
            Ok(Decoded::NotAnEnvelope) => {
                // Plain text, or the base64 of bytes that only begin like the magic.
                let compact: String = text.split_ascii_whitespace().collect();
                let bytes = azure_core::base64::decode(compact).unwrap_or_default();
                prop_assert!(!text.trim_start().starts_with("wUVCQg0K") || !bytes.starts_with(&MAGIC), "{:?}", text);
            }
            Ok(Decoded::Envelope(envelope)) => prop_assert!(envelope.items.len() <= 256),
            Err(error) => prop_assert!(!error.to_string().is_empty()),
        }
    }
}

proptest! {
    #![proptest_config(budget(500))]

    /// What is encoded decodes to the same items, codec and attempts, from bytes and from
    /// text.
    #[test]
    fn every_valid_envelope_decodes_to_what_was_encoded(items in items(), codec in codec()) {
        let envelope = encode(&items, codec).unwrap();
        match decode_checked(&envelope, &limits())? {
            Ok(Decoded::Envelope(decoded)) => prop_assert_eq!((decoded.codec, &decoded.items), (codec, &items)),
            other => prop_assert!(false, "{:?}", other),
        }
        match decode_text(&to_text(&envelope), &limits()) {
            Ok(Decoded::Envelope(decoded)) => prop_assert_eq!(decoded.items, items),
            other => prop_assert!(false, "{:?}", other),
        }
    }

    /// Valid envelopes changed: a byte flipped or set, or a cut, is always caught (a CRC32
    /// catches every change of up to 32 bits, and the lengths every cut); changes with the
    /// checksum recomputed reach the item parser, which refuses or decodes within the
    /// limits, never panics, never holds more than the limits allow.
    #[test]
    fn mutated_envelopes_are_caught_or_stay_within_the_limits(
        items in items(),
        codec in codec(),
        mutations in proptest::collection::vec(mutation(), 1..4),
        resealed in any::<bool>(),
    ) {
        let envelope = encode(&items, codec).unwrap();
        let mut bytes = envelope.clone();
        for mutation in &mutations {
            mutate(&mut bytes, mutation);
        }
        if resealed {
            bytes = reseal(bytes);
        }
        let decoded = decode_checked(&bytes, &limits())?;
        let one_byte_or_a_cut = matches!(mutations[..], [Mutation::Flip { .. } | Mutation::Set { .. } | Mutation::Truncate { .. }]);
        if !resealed && one_byte_or_a_cut && bytes != envelope {
            prop_assert!(!matches!(decoded, Ok(Decoded::Envelope(_))), "{:?} went unnoticed", mutations);
        }
    }

    /// A section that inflates past its declared length is a bomb, refused before the
    /// decoder holds more than the limits allow; cut anywhere, it is refused or (cut to
    /// nothing) read as the empty stream it then is, within the limits.
    #[test]
    fn bombs_are_refused_without_holding_more_than_the_limit(
        which in 0usize..3,
        declared in prop_oneof![0u32..100, 0u32..=(64 << 10)],
        count in 0u32..4,
        cut in proptest::option::weighted(0.2, any::<usize>()),
    ) {
        let (codec, section) = &bombs()[which];
        let mut section = section.clone();
        if let Some(cut) = cut {
            section.truncate(cut % section.len().max(1));
        }
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&[1, codec.id(), 0, 0]);
        bytes.extend_from_slice(&count.to_le_bytes());
        bytes.extend_from_slice(&declared.to_le_bytes());
        bytes.extend_from_slice(&(section.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&section);
        bytes.extend_from_slice(&[0; 4]);
        let decoded = decode_checked(&reseal(bytes), &limits())?;
        if cut.is_none() {
            prop_assert!(decoded.is_err(), "{codec}: a 1 MiB section declared as {declared} bytes was taken");
            if count as usize <= declared as usize / ebb::payload::MIN_ITEM_BYTES {
                prop_assert!(matches!(decoded, Err(EnvelopeError::Bomb { .. })), "{:?}", decoded);
            }
        }
    }

    /// Whatever the items and the limit, the packer's envelopes fit, decode to the items in
    /// order, and every item is in one envelope or handed back for a claim check.
    #[test]
    fn packed_envelopes_fit_and_give_back_every_item(items in items(), codec in codec(), limit in prop_oneof![MIN_ENVELOPE_BYTES..200, 200usize..5000]) {
        let packer = Packer::new(codec, limit).unwrap().within(&limits());
        let packed = packer.pack(&items).unwrap();
        let mut seen = packed.needs_claim_check.clone();
        for envelope in &packed.envelopes {
            prop_assert!(envelope.bytes.len() <= limit);
            match decode_checked(&envelope.bytes, &limits())? {
                Ok(Decoded::Envelope(decoded)) => {
                    let expected: Vec<Item> = envelope.items.iter().map(|&i| items[i].clone()).collect();
                    prop_assert_eq!(decoded.items, expected);
                }
                other => prop_assert!(false, "{:?}", other),
            }
            seen.extend(&envelope.items);
        }
        for &index in &packed.needs_claim_check {
            // Handed back only when it fits no envelope alone.
            prop_assert!(encode(&items[index..=index], codec).unwrap().len() > limit);
        }
        seen.sort_unstable();
        prop_assert_eq!(seen, (0..items.len()).collect::<Vec<_>>());
    }

    /// Items with the trace bit and any context after it: never a panic; each item is kept,
    /// its context the one the checker makes of those bytes (a well-formed one kept, a
    /// malformed one dropped, never a broken envelope); a record cut anywhere after its
    /// kind is refused with its reason.
    #[test]
    fn traced_items_keep_a_well_formed_context_drop_a_malformed_one_and_a_cut_is_refused(
        records in proptest::collection::vec(traced_record(), 1..6),
        cut in proptest::option::weighted(0.3, any::<usize>()),
    ) {
        let section: Vec<u8> = records.iter().flat_map(|(record, ..)| record.clone()).collect();
        if let Some(cut) = cut {
            // Within the last record, after its kind byte: the bit promises bytes that never come.
            let last = records.last().map_or(0, |(record, ..)| record.len());
            let keep = section.len() - last + 1 + cut % (last - 1);
            let decoded = decode_checked(&sealed(records.len(), &section[..keep]), &limits())?;
            prop_assert!(decoded.is_err(), "a record cut after {} of its {last} bytes was taken", keep - (section.len() - last));
            return Ok(());
        }
        let decoded = match decode_checked(&sealed(records.len(), &section), &limits())? {
            Ok(Decoded::Envelope(envelope)) => envelope,
            other => return Err(TestCaseError::fail(format!("{other:?}"))),
        };
        prop_assert_eq!(decoded.items.len(), records.len());
        for (item, (_, parent, state, taken)) in decoded.items.iter().zip(&records) {
            let parent_text = String::from_utf8_lossy(parent);
            let parent_text = parent_text.as_ref();
            let state_text = String::from_utf8_lossy(state);
            let checked = TraceContext::parse(parent_text, Some(state_text.as_ref()).filter(|state| !state.is_empty()));
            prop_assert_eq!(&item.trace, &checked);
            if let Some(taken) = taken {
                prop_assert_eq!(item.trace.is_some(), *taken, "{:?}", parent_text);
            }
            if let Some(trace) = &item.trace {
                // Passed on as version 00 of the same ids.
                prop_assert_eq!(&trace.traceparent()[3..52], &parent_text.trim()[3..52]);
            }
        }
    }
}
