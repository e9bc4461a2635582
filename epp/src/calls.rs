//! The picker's calls to the predictor: what Envoy's `dispatch_http_call` is to the Wasm
//! filter. Each call runs as a task; its answer comes back to the worker as an [`Input`],
//! to the context that made it.
//!
//! Answers mirror what Envoy hands the filter: a reply's status and body; 504 when the call
//! timed out (Envoy's own answer then); no status when the predictor could not be reached.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use headroom_filter_core::host::HostError;
use tokio::sync::mpsc::UnboundedSender;

use crate::inbox::{Answer, Input};

/// proxy-wasm's status for a call to a cluster the host does not know.
const NOT_FOUND: u32 = 1;

pub struct Calls {
    /// Predictor clusters (`host:port`) by the name the filter configuration uses.
    clusters: Arc<HashMap<String, String>>,
    client: reqwest::Client,
    inbox: UnboundedSender<Input>,
    next_token: u32,
    /// The context that made each call under way.
    owners: HashMap<u32, u32>,
    /// A wake-up is queued and not yet handled: one is enough.
    wake_queued: bool,
}

impl Calls {
    pub fn new(
        clusters: Arc<HashMap<String, String>>,
        client: reqwest::Client,
        inbox: UnboundedSender<Input>,
    ) -> Calls {
        Calls { clusters, client, inbox, next_token: 0, owners: HashMap::new(), wake_queued: false }
    }

    /// Starts a call to `cluster` as context `context`; its answer comes back by token.
    pub fn start(
        &mut self,
        context: u32,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout: Duration,
    ) -> Result<u32, HostError> {
        let addr = self.clusters.get(cluster).ok_or(HostError(NOT_FOUND))?;
        let path = headers.iter().find(|(n, _)| *n == ":path").map_or("/", |(_, v)| *v);
        let mut request = self.client.post(format!("http://{addr}{path}")).timeout(timeout).body(body.to_vec());
        for (name, value) in headers.iter().filter(|(n, _)| !n.starts_with(':')) {
            request = request.header(*name, *value);
        }
        self.next_token = self.next_token.wrapping_add(1).max(1);
        let token = self.next_token;
        self.owners.insert(token, context);
        let inbox = self.inbox.clone();
        tokio::spawn(async move {
            let answer = match request.send().await {
                Ok(response) => {
                    let status = Some(response.status().as_u16());
                    match response.bytes().await {
                        Ok(body) => Answer { status, body: body.to_vec() },
                        Err(e) if e.is_timeout() => Answer { status: Some(504), body: Vec::new() },
                        Err(_) => Answer { status: None, body: Vec::new() },
                    }
                }
                Err(e) if e.is_timeout() => Answer { status: Some(504), body: Vec::new() },
                Err(_) => Answer { status: None, body: Vec::new() },
            };
            // The worker is gone only when the picker is shutting down.
            let _ = inbox.send(Input::Answer { token, answer });
        });
        Ok(token)
    }

    /// The context that made call `token`; forgets it (each answer arrives once).
    pub fn owner(&mut self, token: u32) -> Option<u32> {
        self.owners.remove(&token)
    }

    /// Queues a wake-up of the worker's VM, unless one is queued.
    pub fn wake(&mut self) {
        if !self.wake_queued {
            self.wake_queued = self.inbox.send(Input::Wake).is_ok();
        }
    }

    /// The queued wake-up is being handled.
    pub fn woke(&mut self) {
        self.wake_queued = false;
    }
}
