//! The engine in (scaled) real time: one step at a time, each taking its
//! simulated duration divided by the time scale; each step's tokens go to their
//! requests' channels, and a request whose client went away is aborted.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::metrics::Telemetry;
use crate::engine::{Engine, NewRequest, RequestId, Token};
use crate::profile::Profile;

/// What the HTTP side asks of the engine.
pub enum Command {
    /// A new request, and where its tokens go.
    Submit(NewRequest, mpsc::UnboundedSender<Token>),
}

/// A request the engine is working on, as the server tracks it.
struct Stream {
    tx: mpsc::UnboundedSender<Token>,
    arrived: Instant,
    last_token: Instant,
}

/// Waits until `deadline`. tokio's timer ticks in whole milliseconds: a wait far shorter than
/// one (a large time scale, as the gateway benchmark runs) yields instead of being rounded up
/// to a millisecond, so a fast server answers in microseconds.
pub async fn sleep_until(deadline: Instant) {
    if deadline.saturating_duration_since(Instant::now()) > Duration::from_micros(200) {
        tokio::time::sleep_until(deadline).await;
    } else {
        tokio::task::yield_now().await;
    }
}

/// Runs the engine: one step at a time, each taking its simulated duration
/// divided by the time scale; tokens go to their requests' channels.
pub async fn drive(
    profile: Profile,
    scale: f64,
    telemetry: Arc<Telemetry>,
    mut commands: mpsc::UnboundedReceiver<Command>,
) {
    let mut engine = Engine::new(profile);
    let mut streams: HashMap<RequestId, Stream> = HashMap::new();
    let mut deadline = Instant::now();
    loop {
        if engine.is_idle() {
            match commands.recv().await {
                Some(cmd) => accept(&mut engine, &mut streams, cmd),
                None => return,
            }
            deadline = Instant::now();
        }
        while let Ok(cmd) = commands.try_recv() {
            accept(&mut engine, &mut streams, cmd);
        }
        let Some(step) = engine.step() else { continue };
        deadline += Duration::from_secs_f64(step.duration_ms / 1000.0 / scale);
        let now = Instant::now();
        if deadline < now {
            deadline = now; // the host fell behind: do not race to catch up
        }
        sleep_until(deadline).await;
        let now = Instant::now();
        let simulated = |d: Duration| d.as_secs_f64() * scale;
        {
            let mut lat = telemetry.latencies();
            for token in step.tokens {
                let Some(stream) = streams.get_mut(&token.id) else { continue };
                if token.index == 1 {
                    lat.ttft.observe(simulated(now - stream.arrived));
                } else {
                    lat.inter_token.observe(simulated(now - stream.last_token));
                }
                stream.last_token = now;
                let delivered = stream.tx.send(token).is_ok();
                if token.last {
                    lat.e2e.observe(simulated(now - stream.arrived));
                }
                if token.last || !delivered {
                    streams.remove(&token.id);
                    if !delivered {
                        engine.abort(token.id); // client went away
                    }
                }
            }
        }
        telemetry.publish(&engine);
    }
}

fn accept(engine: &mut Engine, streams: &mut HashMap<RequestId, Stream>, cmd: Command) {
    match cmd {
        Command::Submit(req, tx) => {
            let now = Instant::now();
            streams.insert(req.id, Stream { tx, arrived: now, last_token: now });
            engine.submit(req);
        }
    }
}
