//! Non-blocking operations' handles.

use std::marker::PhantomData;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytemuck::Pod;
use ringcast_transport_rocev2_udp::Taken;

use super::error::CommError;
use super::fallback::Progress;
use super::stats::OpStats;

/// What the engine hands back: the operation's bytes (the caller's vector, taken out of the
/// operation's buffer), or why it failed.
pub(crate) type Completion = Result<(Taken, OpStats), CommError>;

/// What a request's channel holds: its end, if there (a channel whose sender is gone: the
/// operation was cancelled).
pub(crate) fn end_of(rx: &Receiver<Completion>) -> Option<Completion> {
    match rx.try_recv() {
        Ok(c) => Some(c),
        Err(TryRecvError::Disconnected) => Some(Err(CommError::Cancelled)),
        Err(TryRecvError::Empty) => None,
    }
}

/// An operation in flight, from [`Communicator::ibroadcast`](super::Communicator::ibroadcast)
/// and the other non-blocking calls. It owns nothing the engine writes to: the engine owns the
/// buffer until the operation is over and hands it back through [`wait`](Self::wait). Dropping
/// or leaking (`mem::forget`) a request is therefore harmless: the operation still runs to its
/// end on every rank, and its buffer is freed by the engine. A request holds nothing of its
/// communicator alive: a leaked one costs its own small allocation, no thread or descriptor.
#[derive(Debug)]
#[must_use = "an operation's result comes back through its request"]
pub struct Request<T: Pod = u8> {
    rx: Receiver<Completion>,
    /// Boxed: keeps a pending request small.
    got: Option<Box<Completion>>,
    /// The element type the caller's vector comes back as.
    elem: PhantomData<fn() -> T>,
    /// A TCP operation's dispatcher, which the thread waiting for it drives (while the
    /// communicator lives; after, its end is on the channel).
    driver: Option<Weak<Progress>>,
}

impl<T: Pod> Request<T> {
    pub(crate) fn new(rx: Receiver<Completion>) -> Self {
        Request {
            rx,
            got: None,
            elem: PhantomData,
            driver: None,
        }
    }

    /// A TCP operation: waiting for it drives its dispatcher (see the fallback's `Progress`).
    pub(crate) fn driven_by(mut self, p: &Arc<Progress>) -> Self {
        self.driver = Some(Arc::downgrade(p));
        self
    }

    /// The dispatcher that drives this operation, while its communicator lives.
    fn driver(&self) -> Option<Arc<Progress>> {
        self.driver.as_ref().and_then(Weak::upgrade)
    }

    /// Takes the operation's end from the channel, if there.
    fn arrived(&mut self) -> bool {
        if self.got.is_none() {
            self.got = end_of(&self.rx).map(Box::new);
        }
        self.got.is_some()
    }

    /// Whether the operation is over (completed or failed); [`wait`](Self::wait) then returns
    /// at once. Never blocks.
    ///
    /// A TCP operation's test also moves it on (as `MPI_Test` does): one turn of its
    /// dispatcher, unless another thread runs it.
    pub fn test(&mut self) -> bool {
        if self.arrived() {
            return true;
        }
        if let Some(p) = self.driver() {
            p.poke();
        }
        self.arrived()
    }

    /// Waits for the end of the operation and returns its buffer.
    pub fn wait(self) -> Result<Vec<T>, CommError> {
        self.wait_with_stats().map(|(v, _)| v)
    }

    /// Waits for the end of the operation and returns its buffer and what it did.
    pub fn wait_with_stats(mut self) -> Result<(Vec<T>, OpStats), CommError> {
        let c = match self.got.take() {
            Some(c) => *c,
            None => match self.driver().and_then(|p| p.lead(&self.rx, None)) {
                Some(c) => c,
                None => self.rx.recv().unwrap_or(Err(CommError::Cancelled)),
            },
        };
        self.finish(c)
    }

    /// Waits at most `timeout`: the result, or the request back when the operation is still
    /// in flight.
    pub fn wait_timeout(mut self, timeout: Duration) -> Result<Result<Vec<T>, CommError>, Self> {
        let deadline = Instant::now().checked_add(timeout);
        let driven = match self.driver() {
            Some(p) if self.got.is_none() => p.lead(&self.rx, deadline),
            _ => None,
        };
        if let Some(c) = driven {
            self.got = Some(Box::new(c));
        }
        if self.got.is_none() {
            let left = deadline.map_or(timeout, |at| at.saturating_duration_since(Instant::now()));
            match self.rx.recv_timeout(left) {
                Ok(c) => self.got = Some(Box::new(c)),
                Err(RecvTimeoutError::Timeout) => return Err(self),
                Err(RecvTimeoutError::Disconnected) => {
                    self.got = Some(Box::new(Err(CommError::Cancelled)))
                }
            }
        }
        Ok(self.wait())
    }

    fn finish(&mut self, c: Completion) -> Result<(Vec<T>, OpStats), CommError> {
        let (bytes, stats) = c?;
        // The caller's own vector, moved back (a copy only for a lent buffer's empty one).
        let out = bytes.into_vec::<T>();
        Ok((out, stats))
    }
}
