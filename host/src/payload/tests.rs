//! The format as documented, hostile envelopes each refused with its reason, and the packer.

use bytes::Bytes;

use super::format::layout;
use super::wire::{FLAG_MESSAGE, FORMAT_VERSION};
use super::*;

fn azure_blob(container: &str, blob: &str) -> BlobRef {
    BlobRef::Azure { account: "devstoreaccount1".into(), container: container.into(), blob: blob.into() }
}

fn claim_check(location: BlobRef) -> Item {
    Item::claim_check(ClaimCheck { location, size: 50 << 20, sha256: [7; 32] })
}

/// Limits that take claim checks into container `orders-bodies` and queue `orders`.
fn limits_with_references() -> Limits {
    Limits {
        references: AllowedReferences {
            azure: Some(AzureContainer { account: "devstoreaccount1".into(), container: "orders-bodies".into() }),
            embedded_queue: Some("orders".into()),
            s3_bucket: None,
        },
        ..Limits::default()
    }
}

fn items(envelope: &[u8], limits: &Limits) -> Result<Vec<Item>, EnvelopeError> {
    match decode(envelope, limits)? {
        Decoded::Envelope(envelope) => Ok(envelope.items),
        Decoded::NotAnEnvelope => panic!("not an envelope"),
    }
}

/// A work item as producers send them: JSON of `size` bytes (at least 100), alike but not
/// equal, with free text of random words.
fn json_item(index: usize, size: usize) -> Item {
    const WORDS: [&str; 12] = ["leave", "the", "parcel", "at", "back", "door", "call", "on", "arrival", "fragile", "invoice", "attached"];
    let mut rng = fastrand::Rng::with_seed(index as u64);
    let head = format!("{{\"id\":\"order-{index:08}\",\"customer\":\"c-{}\",\"status\":\"created\",\"note\":\"", rng.u32(..100_000));
    let mut note = String::new();
    while head.len() + note.len() + 2 < size {
        note.push_str(WORDS[rng.usize(..WORDS.len())]);
        note.push(' ');
    }
    note.truncate(size.saturating_sub(head.len() + 2));
    Item::inline(format!("{head}{note}\"}}"))
}

/// Bytes that no codec shrinks.
fn noise(length: usize, seed: u64) -> Bytes {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..length).map(|_| rng.u8(..)).collect::<Vec<u8>>().into()
}

/// `bytes` with its CRC32 recomputed, as a forger who knows the format would.
fn reseal(mut bytes: Vec<u8>) -> Vec<u8> {
    let end = bytes.len() - 4;
    let crc = crc32fast::hash(&bytes[..end]);
    bytes[end..].copy_from_slice(&crc.to_le_bytes());
    bytes
}

/// An envelope of `codec` byte, `count` and `declared` length around a `stored` section,
/// with a valid CRC.
fn forge(codec: u8, count: u32, declared: u32, stored: &[u8]) -> Vec<u8> {
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(&[FORMAT_VERSION, codec, 0, 0]);
    bytes.extend_from_slice(&count.to_le_bytes());
    bytes.extend_from_slice(&declared.to_le_bytes());
    bytes.extend_from_slice(&(stored.len() as u32).to_le_bytes());
    bytes.extend_from_slice(stored);
    bytes.extend_from_slice(&[0; 4]);
    reseal(bytes)
}

fn compressed(codec: Codec, section: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    super::codec::Compressor::new(codec).unwrap().compress(section, &mut out).unwrap();
    out
}

#[test]
fn the_azure_limit_is_what_an_azure_queue_carries_in_either_encoding() {
    use crate::queue::azure::Encoding;
    assert_eq!(AZURE_MAX_ENVELOPE_BYTES, Encoding::Base64.max_body_bytes());
    assert_eq!(to_text(&[0; AZURE_MAX_ENVELOPE_BYTES]).len(), Encoding::None.max_body_bytes());
}

/// The example `docs/reference/envelope.md` dumps, byte for byte.
#[test]
fn an_envelope_is_laid_out_byte_by_byte_as_documented() -> anyhow::Result<()> {
    let check = ClaimCheck { location: BlobRef::Embedded { queue: "orders".into(), key: 258 }, size: 7, sha256: [0xab; 32] };
    let envelope = encode(&[Item::inline("hi").with_attempts(3), Item::claim_check(check)], Codec::None)?;
    let documented = "
        c1 45 42 42 0d 0a 1a 0a 01 00 00 00 02 00 00 00
        48 00 00 00 48 00 00 00 00 03 00 00 00 02 00 00
        00 68 69 01 00 00 00 00 07 00 00 00 00 00 00 00
        ab ab ab ab ab ab ab ab ab ab ab ab ab ab ab ab
        ab ab ab ab ab ab ab ab ab ab ab ab ab ab ab ab
        02 06 6f 72 64 65 72 73 02 01 00 00 00 00 00 00
        4c ed 71 1e";
    assert_eq!(hex::encode(&envelope), documented.split_whitespace().collect::<String>());
    Ok(())
}

#[test]
fn every_codec_round_trips_inline_and_claim_check_items_with_their_attempts() -> anyhow::Result<()> {
    let sent = vec![
        Item::inline(""),
        json_item(1, 300).with_attempts(4),
        Item::inline(noise(700, 1)).with_attempts(u32::MAX),
        claim_check(azure_blob("orders-bodies", "2026/11/25/ünïcode name.json")),
        claim_check(BlobRef::Embedded { queue: "orders".into(), key: u64::MAX }).with_attempts(1),
    ];
    for codec in Codec::ALL {
        let envelope = encode(&sent, codec)?;
        assert_eq!(envelope[layout::CODEC], codec.id());
        let Decoded::Envelope(got) = decode(&envelope, &limits_with_references())? else { panic!("{codec}: not an envelope") };
        assert_eq!((got.codec, got.items), (codec, sent.clone()), "{codec}");
    }
    Ok(())
}

#[test]
fn a_message_without_the_whole_magic_is_not_an_envelope() {
    let plain: [&[u8]; 6] = [b"", b"{\"order\": 1}", b"<xml/>", &MAGIC[..7], &[0xC1, b'E', b'B', b'B', b'\n', b'\n', 0x1A, b'\n', 1, 0], &[0xff; 64]];
    for body in plain {
        assert_eq!(decode(body, &Limits::default()), Ok(Decoded::NotAnEnvelope), "{body:?}");
    }
}

#[test]
fn every_codec_decodes_an_empty_envelope() -> anyhow::Result<()> {
    for codec in Codec::ALL {
        assert_eq!(items(&encode(&[], codec)?, &Limits::default())?, vec![], "{codec}");
    }
    Ok(())
}

/// Each hostile or broken envelope is refused with the error that names its defect.
#[test]
fn hostile_envelopes_are_refused_each_with_its_reason() -> anyhow::Result<()> {
    let limits = Limits { max_items: 100, max_decoded_bytes: 64 << 10, ..limits_with_references() };
    let good = encode(&[Item::inline("alpha"), Item::inline("beta")], Codec::None)?;
    let edited = |at: usize, bytes: &[u8]| {
        let mut copy = good.clone();
        copy[at..at + bytes.len()].copy_from_slice(bytes);
        reseal(copy)
    };
    let inline = |body: &[u8]| [&[0u8, 0, 0, 0, 0][..], &(body.len() as u32).to_le_bytes(), body].concat();
    let zeros = vec![0u8; 1 << 20];
    let mut cases: Vec<(String, Vec<u8>, &str)> = vec![
        ("header cut short".into(), MAGIC.iter().copied().chain([1, 0, 0]).collect(), "truncated envelope: 11 bytes, it needs 28"),
        ("last byte lost".into(), good[..good.len() - 1].to_vec(), "truncated envelope"),
        ("a byte appended".into(), [&good[..], &[0]].concat(), "bytes past its end"),
        ("a bit flipped in an item".into(), good.iter().enumerate().map(|(i, b)| if i == 30 { b ^ 4 } else { *b }).collect(), "corrupted envelope: its CRC32"),
        ("version 2".into(), edited(8, &[2]), "envelope version 2: this ebb reads version 1"),
        ("codec 9".into(), edited(layout::CODEC, &[9]), "unknown codec 9"),
        ("a flag set".into(), edited(layout::FLAGS, &[2, 0]), "unknown flags 0x0002"),
        ("the message flag on packed items".into(), edited(layout::FLAGS, &[1, 0]), "must be one claim check"),
        ("count over the limit".into(), edited(layout::COUNT, &101u32.to_le_bytes()), "101 items, over the limit of 100"),
        ("decoded length over the limit".into(), edited(layout::DECODED, &(1u32 << 30).to_le_bytes()), "over the limit of 65536"),
        ("count no section holds".into(), edited(layout::COUNT, &4u32.to_le_bytes()), "4 items cannot fit in 27 bytes"),
        ("count one short".into(), edited(layout::COUNT, &1u32.to_le_bytes()), "bytes after the last of 1 items"),
        (
            "length past the end".into(),
            forge(0, 1, 12, &[&[0u8, 0, 0, 0, 0], &1000u32.to_le_bytes()[..], b"abc"].concat()),
            "item 0 of 1: it needs 1000 more bytes, 3 are left",
        ),
        ("count one over".into(), forge(0, 2, 18, &inline(b"123456789")), "item 1 of 2: it needs 1 more bytes, 0 are left"),
        ("unknown item kind".into(), forge(0, 1, 9, &[7, 0, 0, 0, 0, 0, 0, 0, 0]), "item 0: unknown kind 7"),
        ("stored shorter than declared".into(), forge(0, 1, 20, &inline(b"hi")), "the none section comes to 11 bytes, its header says 20"),
        ("garbage for deflate".into(), forge(1, 1, 100, &[0xff; 40]), "the deflate section does not decompress"),
        ("garbage for zstd".into(), forge(2, 1, 100, &[0xff; 40]), "the zstd section does not decompress"),
    ];
    for codec in [Codec::Deflate, Codec::Zstd, Codec::Lz4] {
        // 1 MiB of zeros squeezed into a few hundred bytes, declared as 1,000.
        cases.push((format!("{codec} bomb"), forge(codec.id(), 1, 1000, &compressed(codec, &zeros)), "decompression bomb"));
        cases.push((
            format!("{codec} shorter than declared"),
            forge(codec.id(), 1, 2000, &compressed(codec, &inline(&[1; 100]))),
            "comes to 109 bytes, its header says 2000",
        ));
    }
    for (location, reason) in [
        (
            azure_blob("other-bodies", "a"),
            "claim check azure blob devstoreaccount1/other-bodies/\"a\" is not allowed here (only blobs in devstoreaccount1/orders-bodies",
        ),
        (BlobRef::Azure { account: "victim".into(), container: "orders-bodies".into(), blob: "a".into() }, "is not allowed here"),
        (BlobRef::Embedded { queue: "payroll".into(), key: 1 }, "claim check embedded body 1 of queue payroll is not allowed here"),
    ] {
        cases.push((format!("reference to {location}"), encode(&[claim_check(location)], Codec::None)?, reason));
    }
    let mut bad_name = encode(&[claim_check(azure_blob("orders-bodies", "a"))], Codec::None)?;
    let at = bad_name.windows(13).position(|w| w == b"orders-bodies").unwrap();
    bad_name[at] = b'O';
    cases.push(("container name with a capital".into(), reseal(bad_name), "claim check: container \"Orders-bodies\" is not 3 to 63"));
    let mut huge = encode(&[claim_check(azure_blob("orders-bodies", "a"))], Codec::None)?;
    huge[layout::HEADER + 5..layout::HEADER + 13].copy_from_slice(&(1u64 << 40).to_le_bytes());
    cases.push(("claim check past the body limit".into(), reseal(huge), "claim check of 1099511627776 bytes, over the limit of 104857600"));

    for (name, envelope, reason) in cases {
        match decode(&envelope, &limits) {
            Err(error) => assert!(error.to_string().contains(reason), "{name}: {error}"),
            Ok(decoded) => panic!("{name}: decoded as {decoded:?}"),
        }
    }
    Ok(())
}

#[test]
fn without_allowed_references_every_claim_check_is_refused() -> anyhow::Result<()> {
    let envelope = encode(&[claim_check(azure_blob("orders-bodies", "a"))], Codec::None)?;
    let error = decode(&envelope, &Limits::default()).unwrap_err();
    assert!(error.to_string().ends_with("(this consumer takes no claim checks)"), "{error}");
    Ok(())
}

#[test]
fn a_claim_check_with_a_malformed_name_cannot_be_encoded() {
    for location in [
        azure_blob("x", "a"),
        azure_blob("orders--bodies", "a"),
        azure_blob("orders-bodies", ""),
        azure_blob("orders-bodies", "a\nb"),
        BlobRef::Embedded { queue: "Orders".into(), key: 1 },
    ] {
        assert!(encode(&[claim_check(location.clone())], Codec::None).is_err(), "{location}");
        assert!(Packer::new(Codec::None, 1000).unwrap().pack(&[claim_check(location.clone())]).is_err(), "{location}");
    }
}

fn check_packed(packer: &Packer, sent: &[Item], packed: &Packed, limits: &Limits) -> anyhow::Result<()> {
    let mut seen: Vec<usize> = packed.needs_claim_check.clone();
    for envelope in &packed.envelopes {
        assert!(envelope.bytes.len() <= packer.max_envelope_bytes(), "{} bytes over {}", envelope.bytes.len(), packer.max_envelope_bytes());
        let expected: Vec<Item> = envelope.items.iter().map(|&i| sent[i].clone()).collect();
        assert_eq!(items(&envelope.bytes, limits)?, expected);
        seen.extend(&envelope.items);
    }
    let in_order: Vec<usize> = packed.envelopes.iter().flat_map(|e| e.items.iter().copied()).collect();
    assert!(in_order.windows(2).all(|w| w[0] < w[1]), "items out of order: {in_order:?}");
    seen.sort_unstable();
    assert_eq!(seen, (0..sent.len()).collect::<Vec<_>>(), "every item exactly once");
    Ok(())
}

#[test]
fn packed_envelopes_stay_within_the_limit_and_hold_every_item_once_in_order() -> anyhow::Result<()> {
    let sent: Vec<Item> = (0..400).map(|i| json_item(i, 50 + (i * 37) % 900)).collect();
    for codec in Codec::ALL {
        for limit in [MIN_ENVELOPE_BYTES, 300, 4096, AZURE_MAX_ENVELOPE_BYTES] {
            let packer = Packer::new(codec, limit)?;
            check_packed(&packer, &sent, &packer.pack(&sent)?, &Limits::default())?;
        }
    }
    Ok(())
}

/// Each envelope but the last is full: the next item would not have fitted.
#[test]
fn the_packer_leaves_no_room_for_the_next_item() -> anyhow::Result<()> {
    let sent: Vec<Item> = (0..1500).map(|i| json_item(i, 1024)).collect();
    for codec in Codec::ALL {
        let packer = Packer::new(codec, 8192)?;
        let packed = packer.pack(&sent)?;
        assert!(packed.envelopes.len() > 2, "{codec}");
        for envelope in &packed.envelopes[..packed.envelopes.len() - 1] {
            let next = envelope.items.last().unwrap() + 1;
            let with_next: Vec<Item> = envelope.items.iter().chain([&next]).map(|&i| sent[i].clone()).collect();
            assert!(encode(&with_next, codec)?.len() > 8192, "{codec}: item {next} would have fitted");
        }
    }
    Ok(())
}

#[test]
fn compression_packs_more_items_per_envelope_than_none() -> anyhow::Result<()> {
    let sent: Vec<Item> = (0..2000).map(|i| json_item(i, 1024)).collect();
    let envelopes = |codec| Packer::new(codec, AZURE_MAX_ENVELOPE_BYTES).and_then(|p| p.pack(&sent)).map(|p| p.envelopes.len());
    let none = envelopes(Codec::None)?;
    assert_eq!(none, 2000_usize.div_ceil(AZURE_MAX_ENVELOPE_BYTES / (1024 + MIN_ITEM_BYTES)));
    for codec in [Codec::Deflate, Codec::Zstd, Codec::Lz4] {
        assert!(envelopes(codec)? * 2 < none, "{codec}: {} envelopes against {none} uncompressed", envelopes(codec)?);
    }
    Ok(())
}

#[test]
fn an_item_too_large_even_compressed_is_handed_back_for_a_claim_check() -> anyhow::Result<()> {
    let sent = vec![json_item(0, 100), Item::inline(noise(5000, 2)), json_item(2, 5000), json_item(3, 100)];
    let packer = Packer::new(Codec::Zstd, 4096)?;
    let packed = packer.pack(&sent)?;
    assert_eq!(packed.needs_claim_check, vec![1], "the noise does not shrink; the JSON of the same size does");
    check_packed(&packer, &sent, &packed, &Limits::default())?;
    let uncompressed = Packer::new(Codec::None, 4096)?.pack(&sent)?;
    assert_eq!(uncompressed.needs_claim_check, vec![1, 2]);
    Ok(())
}

#[test]
fn the_packer_writes_only_what_readers_with_its_limits_accept() -> anyhow::Result<()> {
    let limits = Limits { max_items: 10, max_decoded_bytes: 20_000, ..Limits::default() };
    let sent: Vec<Item> = (0..300).map(|i| json_item(i, 900)).chain([json_item(300, 25_000)]).collect();
    for codec in Codec::ALL {
        let packer = Packer::new(codec, AZURE_MAX_ENVELOPE_BYTES)?.within(&limits);
        let packed = packer.pack(&sent)?;
        assert!(packed.envelopes.iter().all(|e| e.items.len() <= 10), "{codec}");
        assert_eq!(packed.needs_claim_check, vec![300], "{codec}: over the decoded limit alone");
        check_packed(&packer, &sent, &packed, &limits)?;
    }
    Ok(())
}

#[test]
fn repacking_keeps_only_the_failed_items_each_with_one_more_attempt_and_where_it_was_sent() -> anyhow::Result<()> {
    let sent: Vec<Item> = (0..50).map(|i| json_item(i, 200).with_attempts(i as u32 % 3)).chain([Item::inline("last").with_attempts(u32::MAX)]).collect();
    let origin = |index| Some(Origin { message_id: "2130".into(), index });
    for codec in Codec::ALL {
        let packer = Packer::new(codec, AZURE_MAX_ENVELOPE_BYTES)?;
        let Decoded::Envelope(envelope) = decode(&packer.pack(&sent)?.envelopes[0].bytes, &Limits::default())? else { panic!() };
        let repacked = packer.repack_failed(&envelope, &[50, 7, 3], "2130")?;
        assert_eq!(repacked.envelopes.len(), 1);
        assert_eq!(repacked.envelopes[0].items, vec![3, 7, 50], "the envelope's indices, in its order");
        let expected = vec![
            Item { origin: origin(3), ..sent[3].clone().with_attempts(1) },
            Item { origin: origin(7), ..sent[7].clone().with_attempts(2) },
            Item { origin: origin(50), ..sent[50].clone() },
        ];
        assert_eq!(items(&repacked.envelopes[0].bytes, &Limits::default())?, expected, "{codec}: attempts saturate at u32::MAX");
        // Put back again from the new envelope (another id): still where its producer sent it.
        let Decoded::Envelope(again) = decode(&repacked.envelopes[0].bytes, &Limits::default())? else { panic!() };
        let twice = packer.repack_failed(&again, &[1], "2135")?;
        assert_eq!(items(&twice.envelopes[0].bytes, &Limits::default())?[0].origin, origin(7), "{codec}");
    }
    Ok(())
}

#[test]
fn an_origin_is_written_only_within_255_bytes_and_read_only_when_not_empty() -> anyhow::Result<()> {
    let with = |id: &str| Item { origin: Some(Origin { message_id: id.into(), index: 1 }), ..Item::inline("x") };
    let too_long = encode(&[with(&"i".repeat(256))], Codec::None).unwrap_err();
    assert!(format!("{too_long:#}").contains("1 to 255"), "{too_long:#}");
    assert!(encode(&[with("")], Codec::None).is_err());
    let mut bytes = encode(&[with("7")], Codec::None)?;
    // Its id's length byte (after the header, kind and attempts) set to 0, the CRC redone.
    bytes[layout::HEADER + 5] = 0;
    let end = bytes.len() - 4;
    let crc = crc32fast::hash(&bytes[..end]);
    bytes[end..].copy_from_slice(&crc.to_le_bytes());
    assert_eq!(decode(&bytes, &Limits::default()).unwrap_err().to_string(), "item 0: its origin's message id is empty");
    Ok(())
}

#[test]
fn repacking_refuses_an_index_out_of_range_or_named_twice() -> anyhow::Result<()> {
    let envelope = Envelope { codec: Codec::None, items: vec![Item::inline("a"), Item::inline("b")], message: false };
    let packer = Packer::new(Codec::None, 1000)?;
    assert_eq!(packer.repack_failed(&envelope, &[2], "1").unwrap_err().to_string(), "failed item 2: the envelope holds 2 items");
    assert_eq!(packer.repack_failed(&envelope, &[1, 1], "1").unwrap_err().to_string(), "failed item 1 is named twice");
    assert_eq!(packer.repack_failed(&envelope, &[], "1")?.envelopes, vec![]);
    Ok(())
}

#[test]
fn repacking_an_item_that_fits_only_without_its_origin_keeps_it_as_it_came_and_refuses_one_that_fits_no_message() -> anyhow::Result<()> {
    // Alone in a message of exactly 1000 bytes, no origin: as a foreign producer packs it.
    let full = Item::inline(vec![b'x'; 1000 - ENVELOPE_OVERHEAD_BYTES - MIN_ITEM_BYTES]);
    let envelope = Envelope { codec: Codec::None, items: vec![full.clone()], message: false };
    let repacked = Packer::new(Codec::None, 1000)?.repack_failed(&envelope, &[0], "a-message-id")?;
    assert_eq!(repacked.envelopes.len(), 1, "put back, not left for a claim store the listener does not use");
    assert_eq!(items(&repacked.envelopes[0].bytes, &Limits::default())?, vec![full.with_attempts(1)], "as it came, one more attempt");
    // Packed compressed by another: in a packer without a codec, no message holds it.
    let compressible = Envelope { codec: Codec::Zstd, items: vec![Item::inline(vec![b'y'; 5000])], message: false };
    let error = Packer::new(Codec::None, 1000)?.repack_failed(&compressible, &[0], "1").unwrap_err();
    assert_eq!(error.to_string(), "failed item 0: it fits no message of 1000 bytes alone, even as it came");
    Ok(())
}

#[test]
fn a_packer_refuses_a_limit_below_one_empty_item() {
    assert!(Packer::new(Codec::None, MIN_ENVELOPE_BYTES).is_ok());
    let error = Packer::new(Codec::None, MIN_ENVELOPE_BYTES - 1).unwrap_err();
    assert_eq!(error.to_string(), "max_envelope_bytes 36: at least 37, an envelope of one empty item");
}

#[test]
fn codec_names_parse_back() {
    for codec in Codec::ALL {
        assert_eq!(codec.name().parse::<Codec>().unwrap(), codec);
        assert_eq!(Codec::from_id(codec.id()), Some(codec));
    }
    assert_eq!("gzip".parse::<Codec>().unwrap_err().to_string(), "unknown codec \"gzip\": one of none, deflate, zstd, lz4");
}

#[test]
fn an_offloaded_message_is_one_claim_check_with_the_message_flag_and_nothing_else_passes_for_one() -> anyhow::Result<()> {
    let Item { body: Body::ClaimCheck(check), .. } = claim_check(azure_blob("orders-bodies", "b-1")) else { unreachable!() };
    let bytes = encode_message(check.clone())?;
    assert_eq!(u16::from_le_bytes([bytes[layout::FLAGS], bytes[layout::FLAGS + 1]]), FLAG_MESSAGE);
    let Decoded::Envelope(envelope) = decode(&bytes, &limits_with_references())? else { panic!("not an envelope") };
    assert!(envelope.message);
    assert_eq!(envelope.items, vec![Item::claim_check(check)]);
    // Packed items never carry the flag.
    let packed = encode(&[Item::inline("a")], Codec::None)?;
    let Decoded::Envelope(plain) = decode(&packed, &Limits::default())? else { panic!("not an envelope") };
    assert!(!plain.message);
    // The flag on an inline item, or on two items, is refused: a reader cannot take one for a message.
    for items in [vec![Item::inline("a")], vec![claim_check(azure_blob("orders-bodies", "b-1")), Item::inline("b")]] {
        let mut forged = encode(&items, Codec::None)?;
        forged[layout::FLAGS] = 1;
        let forged = reseal(forged);
        assert!(matches!(decode(&forged, &limits_with_references()), Err(EnvelopeError::BadMessage { .. })), "{items:?}");
    }
    // Any other flag is still unknown.
    let mut unknown = packed.clone();
    unknown[layout::FLAGS] = 2;
    assert!(matches!(decode(&reseal(unknown), &Limits::default()), Err(EnvelopeError::UnknownFlags { flags: 2 })));
    Ok(())
}

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn traced(item: Item, tracestate: Option<&str>) -> Item {
    item.with_trace(crate::telemetry::TraceContext::parse(TRACEPARENT, tracestate))
}

#[test]
fn an_items_trace_context_follows_its_origin_and_reads_back() -> anyhow::Result<()> {
    let origin = Some(Origin { message_id: "m-1".into(), index: 4 });
    let sent = vec![
        traced(Item::inline("a"), Some("vendor=1")),
        Item { origin: origin.clone(), ..traced(Item::inline("b"), None) },
        traced(claim_check(azure_blob("orders-bodies", "b-1")), None),
        Item::inline("untraced"),
    ];
    let bytes = encode(&sent, Codec::None)?;
    assert_eq!(items(&bytes, &limits_with_references())?, sent);
    // Byte by byte: kind with bits 7 and 6, attempts, origin, then the context.
    let record = &bytes[layout::HEADER..];
    assert_eq!(record[0], 0x40, "inline, a trace context follows");
    let state_at = 5 + 1 + TRACEPARENT.len();
    assert_eq!((record[5] as usize, &record[6..state_at]), (TRACEPARENT.len(), TRACEPARENT.as_bytes()));
    assert_eq!(&record[state_at..state_at + 2 + 8], b"\x08\x00vendor=1");
    // An envelope written before the bit (the same items untraced) reads as it did.
    let untraced: Vec<Item> = sent.iter().map(|item| item.clone().with_trace(None)).collect();
    assert_eq!(items(&encode(&untraced, Codec::Zstd)?, &limits_with_references())?, untraced);
    Ok(())
}

#[test]
fn a_malformed_trace_context_in_an_envelope_is_counted_and_dropped_the_item_kept() -> anyhow::Result<()> {
    let mut bytes = encode(&[traced(Item::inline("a"), None)], Codec::None)?;
    // The trace id's first digit becomes uppercase: not a traceparent.
    let at = layout::HEADER + 6 + 3;
    bytes[at] = b'A';
    let before = crate::telemetry::traceparent::rejected().get();
    assert_eq!(items(&reseal(bytes), &Limits::default())?, vec![Item::inline("a")]);
    assert!(crate::telemetry::traceparent::rejected().get() > before, "counted");
    Ok(())
}

#[test]
fn a_plain_messages_envelope_is_a_claim_check_or_an_inline_body_with_its_trace_context() -> anyhow::Result<()> {
    let inline = traced(Item::inline("{\"order\":1}"), Some("a=1"));
    let bytes = encode_message_item(&inline)?;
    let Decoded::Envelope(envelope) = decode(&bytes, &Limits::default())? else { panic!("not an envelope") };
    assert!(envelope.message);
    assert_eq!(envelope.items, vec![inline]);
    assert!(encode_message_item(&Item::inline("no context")).is_err(), "an untraced inline body is the plain message itself");
    Ok(())
}
