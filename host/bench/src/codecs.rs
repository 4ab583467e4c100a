//! `ebb bench codecs`: the envelope's codecs (issue 20) on a corpus of JSON work items,
//! against no compression in the same run. What a queue's bill depends on is items per
//! envelope (one put, get and delete per envelope); what its CPU depends on is the
//! packer's and the decoder's speed. Each round runs every codec in turn; the figures are
//! medians over the rounds.

use std::fmt::Write as _;
use std::time::{Duration, Instant, UNIX_EPOCH};

use anyhow::{Context as _, ensure};
use bytes::Bytes;
use serde::Serialize;
use serde_json::json;

use crate::report::median;
use ebb::payload::{Codec, Decoded, ENVELOPE_OVERHEAD_BYTES, Item, Limits, Packer, decode};

/// The corpus's seed: the same items on every machine and every run.
const CORPUS_SEED: u64 = 20;

/// What to run.
#[derive(Debug, Clone)]
pub(crate) struct CodecsBench {
    /// Items in the corpus.
    pub(crate) items: usize,
    /// Each item's length in bytes.
    pub(crate) item_bytes: usize,
    /// The message limit envelopes are packed to.
    pub(crate) envelope_bytes: usize,
    pub(crate) rounds: u32,
}

/// One codec's figures.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CodecFigures {
    pub(crate) codec: Codec,
    pub(crate) envelopes: usize,
    /// Items per envelope, the last (partly filled) one left out.
    pub(crate) items_per_envelope: f64,
    /// The item sections' bytes before compression over after.
    pub(crate) ratio: f64,
    /// Envelopes without compression over envelopes with it: how many times fewer
    /// messages (and so transactions) the codec needs.
    pub(crate) fewer_messages_than_none: f64,
    /// Envelope bytes per item: what the queue stores.
    pub(crate) wire_bytes_per_item: f64,
    /// Items' bytes packed per second (the packer's tries at each envelope included), in
    /// MB (10^6 bytes).
    pub(crate) encode_mb_per_s: f64,
    pub(crate) encode_us_per_envelope: f64,
    /// Items' bytes decoded per second, in MB.
    pub(crate) decode_mb_per_s: f64,
    pub(crate) decode_us_per_envelope: f64,
}

/// The corpus: `count` JSON work items of exactly `size` bytes, as a producer sends them
/// (ids, timestamps, the same keys in every item, names, amounts, some free text), the
/// same for a given count and size.
pub(crate) fn corpus(count: usize, size: usize) -> anyhow::Result<Vec<Bytes>> {
    let mut rng = fastrand::Rng::with_seed(CORPUS_SEED);
    (0..count).map(|index| work_item(&mut rng, index, size)).collect()
}

const KINDS: [&str; 5] = ["order.created", "order.paid", "invoice.issued", "shipment.dispatched", "refund.requested"];
const TENANTS: [&str; 5] = ["contoso-eu", "fabrikam-us", "northwind-apac", "adventure-works", "tailspin-toys"];
const FIRST: [&str; 8] = ["Ada", "Grace", "Alan", "Edsger", "Barbara", "Donald", "Frances", "Ken"];
const LAST: [&str; 8] = ["Lovelace", "Hopper", "Turing", "Dijkstra", "Liskov", "Knuth", "Allen", "Thompson"];
const COUNTRIES: [&str; 5] = ["GB", "DE", "FR", "NL", "US"];
const WORDS: [&str; 32] = [
    "please",
    "deliver",
    "before",
    "noon",
    "the",
    "customer",
    "asked",
    "for",
    "gift",
    "wrapping",
    "call",
    "on",
    "arrival",
    "fragile",
    "items",
    "leave",
    "at",
    "reception",
    "invoice",
    "attached",
    "to",
    "order",
    "priority",
    "handling",
    "backorder",
    "replacement",
    "warehouse",
    "north",
    "dock",
    "pallet",
    "and",
    "a",
];

fn work_item(rng: &mut fastrand::Rng, index: usize, size: usize) -> anyhow::Result<Bytes> {
    // Items a second or two apart from 2026-11-25 on.
    let created = UNIX_EPOCH + Duration::from_millis(1_795_564_800_000 + index as u64 * 1700 + rng.u64(..1000));
    let (first, last) = (FIRST[rng.usize(..FIRST.len())], LAST[rng.usize(..LAST.len())]);
    let country = COUNTRIES[rng.usize(..COUNTRIES.len())];
    let lines: Vec<_> = (0..rng.usize(1..=4))
        .map(|_| json!({"sku": format!("SKU-{:05}", rng.u32(..50_000)), "quantity": rng.u32(1..=12), "unit_price": f64::from(rng.u32(99..20_000)) / 100.0, "currency": "EUR"}))
        .collect();
    let mut item = json!({
        "id": format!("wi-{index:08}"),
        "type": KINDS[rng.usize(..KINDS.len())],
        "tenant": TENANTS[rng.usize(..TENANTS.len())],
        "created_at": humantime::format_rfc3339_millis(created).to_string(),
        "trace_id": format!("{:016x}{:016x}", rng.u64(..), rng.u64(..)),
        "priority": if rng.u8(..10) == 0 { "high" } else { "normal" },
        "customer": {
            "id": format!("cus_{:08x}", rng.u32(..)),
            "name": format!("{first} {last}"),
            "email": format!("{}.{}@example.com", first.to_lowercase(), last.to_lowercase()),
            "country": country,
        },
        "lines": lines,
        "shipping": {"method": if rng.bool() { "express" } else { "standard" }, "address": format!("{} Market Street, Springfield", rng.u32(1..300))},
        "note": "",
    });
    let bare = serde_json::to_string(&item)?.len();
    ensure!(bare <= size, "an item of {size} bytes cannot hold the work item's fields ({bare} bytes)");
    let mut note = String::new();
    while note.len() < size - bare {
        note.push_str(WORDS[rng.usize(..WORDS.len())]);
        note.push(' ');
    }
    note.truncate(size - bare);
    item["note"] = json!(note);
    let bytes = serde_json::to_vec(&item)?;
    ensure!(bytes.len() == size, "work item {index} came to {} bytes, not {size}", bytes.len());
    Ok(bytes.into())
}

/// One codec over the corpus, once.
struct Run {
    packing: Duration,
    decoding: Duration,
    /// Each envelope's length and item count.
    envelopes: Vec<(usize, usize)>,
}

fn run_once(codec: Codec, items: &[Item], envelope_bytes: usize, check: bool) -> anyhow::Result<Run> {
    let packer = Packer::new(codec, envelope_bytes)?;
    let started = Instant::now();
    let packed = packer.pack(items)?;
    let packing = started.elapsed();
    ensure!(packed.needs_claim_check.is_empty(), "{codec}: {} items fit no envelope", packed.needs_claim_check.len());
    let limits = Limits::default();
    let started = Instant::now();
    let mut decoded = 0;
    for envelope in &packed.envelopes {
        let Decoded::Envelope(unpacked) = decode(&envelope.bytes, &limits).with_context(|| format!("{codec}: decoding an envelope"))? else {
            anyhow::bail!("{codec}: an envelope read as a plain message");
        };
        if check {
            ensure!(unpacked.items.iter().eq(envelope.items.iter().map(|&i| &items[i])), "{codec}: an envelope decoded to other items");
        }
        decoded += unpacked.items.len();
    }
    let decoding = started.elapsed();
    ensure!(decoded == items.len(), "{codec}: {decoded} items decoded of {}", items.len());
    Ok(Run { packing, decoding, envelopes: packed.envelopes.iter().map(|e| (e.bytes.len(), e.items.len())).collect() })
}

/// Runs the bench: every codec once per round, in turn.
pub(crate) fn run(bench: &CodecsBench) -> anyhow::Result<Vec<CodecFigures>> {
    let items: Vec<Item> = corpus(bench.items, bench.item_bytes)?.into_iter().map(Item::inline).collect();
    let item_bytes = (bench.items * bench.item_bytes) as f64;
    let mut runs: Vec<Vec<(Duration, Duration)>> = vec![Vec::new(); Codec::ALL.len()];
    let mut envelopes: Vec<Vec<(usize, usize)>> = vec![Vec::new(); Codec::ALL.len()];
    for round in 0..bench.rounds {
        for (index, codec) in Codec::ALL.into_iter().enumerate() {
            // The first round checks every item comes back; the others only time.
            let run = run_once(codec, &items, bench.envelope_bytes, round == 0)?;
            runs[index].push((run.packing, run.decoding));
            envelopes[index] = run.envelopes;
        }
    }
    // A record adds 9 bytes to each item (its kind, attempts and length).
    let section_bytes = item_bytes + 9.0 * bench.items as f64;
    let none_envelopes = envelopes[0].len() as f64;
    Ok(Codec::ALL
        .into_iter()
        .zip(runs.iter().zip(&envelopes))
        .map(|(codec, (times, packed))| {
            let count = packed.len().max(1) as f64;
            let stored: usize = packed.iter().map(|(length, _)| length - ENVELOPE_OVERHEAD_BYTES).sum();
            let packing = median(times.iter().map(|t| t.0.as_secs_f64()).collect());
            let decoding = median(times.iter().map(|t| t.1.as_secs_f64()).collect());
            // The last envelope takes what is left: it would skew the mean.
            let full = if packed.len() > 1 { &packed[..packed.len() - 1] } else { &packed[..] };
            CodecFigures {
                codec,
                envelopes: packed.len(),
                items_per_envelope: full.iter().map(|(_, items)| items).sum::<usize>() as f64 / full.len().max(1) as f64,
                ratio: section_bytes / stored.max(1) as f64,
                fewer_messages_than_none: none_envelopes / count,
                wire_bytes_per_item: packed.iter().map(|(length, _)| length).sum::<usize>() as f64 / bench.items as f64,
                encode_mb_per_s: item_bytes / packing / 1e6,
                encode_us_per_envelope: packing * 1e6 / count,
                decode_mb_per_s: item_bytes / decoding / 1e6,
                decode_us_per_envelope: decoding * 1e6 / count,
            }
        })
        .collect())
}

/// The figures as a table, with what produced them.
pub(crate) fn table(bench: &CodecsBench, figures: &[CodecFigures]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} JSON work items of {} bytes ({:.1} MB), envelopes of at most {} bytes, medians of {} rounds\n",
        bench.items,
        bench.item_bytes,
        (bench.items * bench.item_bytes) as f64 / 1e6,
        bench.envelope_bytes,
        bench.rounds
    );
    let _ = writeln!(
        out,
        "{:<8} {:>6} {:>10} {:>9} {:>9} {:>10} {:>11} {:>11} {:>11} {:>11}",
        "codec", "ratio", "items/env", "envelopes", "vs none", "wire B/it", "enc MB/s", "enc µs/env", "dec MB/s", "dec µs/env"
    );
    for f in figures {
        let _ = writeln!(
            out,
            "{:<8} {:>6.2} {:>10.1} {:>9} {:>8.2}× {:>10.1} {:>11.1} {:>11.1} {:>11.1} {:>11.1}",
            f.codec.name(),
            f.ratio,
            f.items_per_envelope,
            f.envelopes,
            f.fewer_messages_than_none,
            f.wire_bytes_per_item,
            f.encode_mb_per_s,
            f.encode_us_per_envelope,
            f.decode_mb_per_s,
            f.decode_us_per_envelope
        );
    }
    out
}

/// The figures as JSON, with what produced them.
pub(crate) fn json(bench: &CodecsBench, figures: &[CodecFigures]) -> serde_json::Value {
    json!({
        "corpus": {"items": bench.items, "item_bytes": bench.item_bytes, "seed": CORPUS_SEED},
        "envelope_bytes": bench.envelope_bytes,
        "rounds": bench.rounds,
        "codecs": figures,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_corpus_is_the_same_json_every_time_each_item_exactly_its_size() -> anyhow::Result<()> {
        let corpus = corpus(50, 1024)?;
        assert_eq!(corpus, super::corpus(50, 1024)?);
        for item in &corpus {
            assert_eq!(item.len(), 1024);
            let value: serde_json::Value = serde_json::from_slice(item)?;
            assert!(value["id"].is_string() && value["created_at"].is_string() && value["lines"].is_array());
        }
        assert_ne!(corpus[0], corpus[1]);
        Ok(())
    }

    #[test]
    fn an_item_too_small_for_the_fields_is_refused() {
        let error = corpus(1, 100).unwrap_err().to_string();
        assert!(error.starts_with("an item of 100 bytes cannot hold the work item's fields"), "{error}");
    }

    #[test]
    fn every_codec_is_measured_against_none_in_the_same_run() -> anyhow::Result<()> {
        let bench = CodecsBench { items: 300, item_bytes: 1024, envelope_bytes: 49_152, rounds: 1 };
        let figures = run(&bench)?;
        assert_eq!(figures.iter().map(|f| f.codec).collect::<Vec<_>>(), Codec::ALL);
        assert_eq!(figures[0].fewer_messages_than_none, 1.0);
        assert_eq!(figures[0].ratio, 1.0, "none stores its records as they are");
        assert_eq!(figures[0].items_per_envelope, 47.0, "(49,152 - 28) / (1,024 + 9)");
        for f in &figures[1..] {
            assert!(f.ratio > 2.0 && f.fewer_messages_than_none > 1.5, "{f:?}");
        }
        let table = table(&bench, &figures);
        assert_eq!(table.lines().filter(|l| Codec::ALL.iter().any(|c| l.starts_with(c.name()))).count(), 4, "{table}");
        Ok(())
    }
}
