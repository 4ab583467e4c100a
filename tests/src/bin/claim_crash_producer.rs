//! A producer that offloads a body as a claim check, says so on stdout (`claimed <where>`),
//! then waits for a line on stdin before putting the message that points at it, so a test
//! can kill it with SIGKILL in between and leave an orphan body for the sweeper.
//!
//! `claim-crash-producer embedded DATA_DIR QUEUE` or
//! `claim-crash-producer azure CONNECTION_STRING QUEUE` (the connection string with a
//! `BlobEndpoint`).

use std::io::{BufRead, Write};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ebb::payload::claims::{AzureClaims, ClaimStore, EmbeddedClaims};
use ebb::payload::{Codec, DEFAULT_MAX_CLAIM_CHECK_BYTES, Item, Packer};
use ebb::queue::QueueClient;
use ebb::queue::azure::{AzureAccount, AzureOptions, AzureQueue};
use ebb::queue::embedded::{EmbeddedOptions, EmbeddedStore};

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [kind, place, name] = args.as_slice() else {
        anyhow::bail!("usage: claim-crash-producer embedded DATA_DIR QUEUE | azure CONNECTION_STRING QUEUE");
    };
    let (queue, claims): (Arc<dyn QueueClient>, Arc<dyn ClaimStore>) = match kind.as_str() {
        "embedded" => {
            let store = EmbeddedStore::open(place.as_ref(), EmbeddedOptions::default())?;
            let queue = store.queue(name);
            queue.create_if_missing().await?;
            (Arc::new(queue), Arc::new(EmbeddedClaims::new(store.queue(name), DEFAULT_MAX_CLAIM_CHECK_BYTES)))
        }
        "azure" => {
            let account = AzureAccount::from_connection_string(place)?;
            let queue = AzureQueue::new(&account, name, AzureOptions::default())?;
            queue.create_if_missing().await?;
            (Arc::new(queue), Arc::new(AzureClaims::new(&account, name, DEFAULT_MAX_CLAIM_CHECK_BYTES, &AzureOptions::default())?))
        }
        other => anyhow::bail!("unknown store {other:?}: embedded or azure"),
    };
    let body = Bytes::from(vec![7u8; 1 << 20]);
    let check = claims.put(body).await?;
    let mut out = std::io::stdout();
    writeln!(out, "claimed {}", check.location)?;
    out.flush()?;
    // The crash point: the body is stored, its message is not.
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    let packed = Packer::new(Codec::None, 4096)?.pack(&[Item::claim_check(check)])?;
    queue.put(&packed.envelopes[0].bytes, Duration::ZERO).await?;
    writeln!(out, "sent")?;
    Ok(())
}
