//! Envelopes (issue 20) read without ebb: `tests/azure-sdk/unpack.py`, in the virtualenv
//! of the official Azure SDK for Python, unpacks what ebb packs, byte for byte, with each
//! codec, from the raw bytes and from the base64 an Azure queue holds.

use std::io::Write as _;
use std::process::{Command, Output, Stdio};

use ebb::payload::{AZURE_MAX_ENVELOPE_BYTES, BlobRef, Body, ClaimCheck, Codec, Item, Packer, encode, to_text};
use ebb_tests::azure_sdk::AZURE_SDK_PYTHON;
use serde_json::{Value, json};

const UNPACK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/azure-sdk/unpack.py");

/// `unpack.py` with `input` on its standard input.
fn unpack(input: &[u8]) -> Output {
    let mut child = Command::new(AZURE_SDK_PYTHON).arg(UNPACK).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

/// The items `unpack.py` printed, as the JSON it promises for each.
fn unpacked(input: &[u8]) -> Vec<Value> {
    let output = unpack(input);
    assert!(output.status.success(), "unpack.py: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap().lines().map(|line| serde_json::from_str(line).unwrap()).collect()
}

/// What `unpack.py` should print for `item`.
fn expected(item: &Item) -> Value {
    match &item.body {
        Body::Inline(bytes) => json!({"attempts": item.attempts, "body_hex": hex::encode(bytes)}),
        Body::ClaimCheck(ClaimCheck { location, size, sha256 }) => {
            let location = match location {
                BlobRef::Azure { account, container, blob } => json!({"azure_blob": {"account": account, "container": container, "blob": blob}}),
                BlobRef::Embedded { queue, key } => json!({"embedded_body": {"queue": queue, "key": key}}),
                BlobRef::S3 { bucket, key } => json!({"s3_object": {"bucket": bucket, "key": key}}),
            };
            let mut check = location;
            check["size"] = json!(size);
            check["sha256"] = json!(hex::encode(sha256));
            json!({"attempts": item.attempts, "claim_check": check})
        }
    }
}

#[test]
fn python_unpacks_what_ebb_packs_byte_for_byte_with_every_codec() {
    let mut items: Vec<Item> = (0..300)
        .map(|i| Item::inline(format!("{{\"id\":\"order-{i:06}\",\"status\":\"created\",\"note\":\"{}\"}}", "leave it at the door ".repeat(i % 40))))
        .collect();
    items.push(Item::inline(Vec::<u8>::new()).with_attempts(3));
    items.push(Item::inline((0..=255u8).collect::<Vec<u8>>()).with_attempts(u32::MAX));
    items.push(Item::claim_check(ClaimCheck {
        location: BlobRef::Azure { account: "devstoreaccount1".into(), container: "orders-bodies".into(), blob: "2026/11/25/großes ding.json".into() },
        size: 50 << 20,
        sha256: [0xab; 32],
    }));
    items.push(
        Item::claim_check(ClaimCheck { location: BlobRef::Embedded { queue: "orders".into(), key: 1 << 40 }, size: 7, sha256: [1; 32] }).with_attempts(1),
    );
    for codec in Codec::ALL {
        let packed = Packer::new(codec, AZURE_MAX_ENVELOPE_BYTES).unwrap().pack(&items).unwrap();
        assert!(packed.needs_claim_check.is_empty());
        let mut from_raw = Vec::new();
        let mut from_base64 = Vec::new();
        for envelope in &packed.envelopes {
            from_raw.extend(unpacked(&envelope.bytes));
            // As an Azure queue holds it, broken into lines as MIME writers do.
            let text: Vec<String> = to_text(&envelope.bytes).as_bytes().chunks(76).map(|l| String::from_utf8(l.to_vec()).unwrap()).collect();
            from_base64.extend(unpacked(text.join("\n").as_bytes()));
        }
        let expected: Vec<Value> = items.iter().map(expected).collect();
        assert_eq!(from_raw, expected, "{codec}");
        assert_eq!(from_base64, expected, "{codec}");
    }
}

#[test]
fn python_refuses_a_plain_message_and_a_corrupted_envelope_with_the_reason() {
    let plain = unpack(b"{\"order\": 1}");
    assert_eq!(plain.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&plain.stderr).contains("no envelope marker"), "{plain:?}");

    let mut envelope = encode(&[Item::inline("hello")], Codec::Deflate).unwrap();
    // A bit of the compressed section (header ends at 24, the CRC takes the last 4).
    let in_section = envelope.len() - 6;
    envelope[in_section] ^= 1;
    let corrupted = unpack(&envelope);
    assert_eq!(corrupted.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&corrupted.stderr).contains("corrupted envelope"), "{corrupted:?}");
}

/// `ebb bench codecs` through the binary: a short run reports each codec against none.
#[test]
fn bench_codecs_reports_every_codec_against_none() {
    let output = Command::new(crate::binary::EBB).args(["bench", "codecs", "--json", "--items", "200", "--rounds", "1"]).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    let names: Vec<&str> = report["codecs"].as_array().unwrap().iter().map(|c| c["codec"].as_str().unwrap()).collect();
    assert_eq!(names, ["none", "deflate", "zstd", "lz4"]);
    assert_eq!(report["envelope_bytes"], 49_152);
    for codec in report["codecs"].as_array().unwrap() {
        for figure in ["ratio", "items_per_envelope", "encode_mb_per_s", "decode_mb_per_s", "encode_us_per_envelope", "decode_us_per_envelope"] {
            assert!(codec[figure].as_f64().is_some_and(|v| v.is_finite() && v > 0.0), "{figure}: {codec}");
        }
    }
    assert_eq!(report["codecs"][0]["fewer_messages_than_none"], 1.0);
}
