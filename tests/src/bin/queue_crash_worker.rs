//! Drains queue `work` of the embedded store in the data directory given as the only
//! argument, deleting each batch's messages one by one, slowly, and reporting on stdout
//! (`leased N`, `deleting ID`, `deleted ID`), so that a test can kill it mid-batch.

use std::io::Write;
use std::time::Duration;

use ebb::queue::QueueClient;
use ebb::queue::embedded::{EmbeddedOptions, EmbeddedStore};

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let dir = std::env::args().nth(1).expect("usage: queue-crash-worker DATA_DIR");
    let store = EmbeddedStore::open(dir.as_ref(), EmbeddedOptions::default())?;
    let queue = store.queue("work");
    let mut out = std::io::stdout();
    loop {
        let batch = queue.get(32, Duration::from_secs(600)).await?;
        if batch.is_empty() {
            return Ok(());
        }
        writeln!(out, "leased {}", batch.len())?;
        for message in batch {
            writeln!(out, "deleting {}", message.id)?;
            out.flush()?;
            queue.delete(&message.id, &message.pop_receipt).await?;
            writeln!(out, "deleted {}", message.id)?;
            out.flush()?;
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}
