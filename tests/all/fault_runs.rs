//! What the fault tests (`azure_faults`, `sqs::faults`) share: the handler they run behind
//! the fault proxy, and what a run leaves.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use ebb::handler::{Handler, IncomingMessage};
use ebb::queue::Retrying;

/// Records successes per body (`m-<number>`); the first try of every tenth body fails, so a
/// host that deleted before the handler succeeded would lose those bodies for good.
#[derive(Default)]
pub(crate) struct Recording {
    pub(crate) successes: Mutex<BTreeMap<String, u32>>,
    pub(crate) failures: Mutex<BTreeMap<String, u32>>,
}

#[async_trait]
impl Handler for Recording {
    async fn handle(&self, message: &IncomingMessage) -> anyhow::Result<()> {
        let body = String::from_utf8(message.body.to_vec())?;
        tokio::time::sleep(Duration::from_millis(2)).await;
        let number: u32 = body.trim_start_matches("m-").parse()?;
        if number.is_multiple_of(10) && message.dequeue_count == 1 {
            *self.failures.lock().unwrap().entry(body.clone()).or_default() += 1;
            anyhow::bail!("the first try of {body} fails");
        }
        *self.successes.lock().unwrap().entry(body).or_default() += 1;
        Ok(())
    }
}

/// What a run through the proxy left, on storage queues `Q`.
pub(crate) struct Run<Q> {
    pub(crate) sent: Vec<String>,
    pub(crate) handler: Arc<Recording>,
    pub(crate) queue: Arc<Retrying<Q>>,
    pub(crate) poison: Arc<Retrying<Q>>,
    pub(crate) poison_direct: Q,
    pub(crate) took: Duration,
}
