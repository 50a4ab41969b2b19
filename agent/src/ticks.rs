//! The clock of the agent's periodic loops (log rotation, image
//! collection, eviction): a tick at once and then every period, a late
//! tick delayed rather than followed by a burst, until shutdown.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::time::{Interval, MissedTickBehavior};

pub struct Ticks<S> {
    interval: Interval,
    shutdown: Pin<Box<S>>,
}

impl<S: Future<Output = ()>> Ticks<S> {
    pub fn new(period: Duration, shutdown: S) -> Ticks<S> {
        let mut interval = tokio::time::interval(period);
        interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Ticks {
            interval,
            shutdown: Box::pin(shutdown),
        }
    }

    /// Wait for the next tick: true, or false once shutdown has come
    /// (then the loop ends; do not call again).
    pub async fn next(&mut self) -> bool {
        tokio::select! {
            _ = self.interval.tick() => true,
            _ = &mut self.shutdown => false,
        }
    }
}
