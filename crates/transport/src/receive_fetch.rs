//! Receives fetched when a message needs one.
//!
//! A NIC reads a program's receive WQEs from the ring in host memory when
//! a message arrives and needs one, not only when the program rings the
//! doorbell: a receive posted a moment before the message is found. When
//! the receives reach the engine by another way, as through softrnicd's
//! command processor, which moves a program's ring into the engine on its
//! passes, a message that arrives between the program's post and the next
//! pass finds the engine's queue empty, and the sender gets an RNR NAK the
//! program never asked for. A [`ReceiveFetch`] is the hook that closes
//! that gap: the QP (or SRQ) calls it before it answers "receiver not
//! ready", and the hook posts whatever the program has written. A QP
//! that enters the error state calls it too, so that the receives the
//! program wrote flush with the rest.

use std::fmt;
use std::sync::OnceLock;

/// The hook a queue `Q` (a QP's [`PostQueues`](crate::PostQueues) or a
/// [`SharedReceiveQueue`](crate::SharedReceiveQueue)) calls when it finds
/// no receive. Installed once; without one, an empty queue is simply
/// empty.
pub struct ReceiveFetch<Q> {
    hook: OnceLock<Hook<Q>>,
}

type Hook<Q> = Box<dyn Fn(&Q) + Send + Sync>;

impl<Q> ReceiveFetch<Q> {
    pub(crate) fn new() -> ReceiveFetch<Q> {
        ReceiveFetch { hook: OnceLock::new() }
    }

    /// Installs `hook`. It runs in the engine's thread with the QP's shard
    /// locked, so it may post receives to the queue it is given and
    /// nothing else of the engine, and it may wait only for what never
    /// waits for the engine. False if a hook was installed already.
    pub(crate) fn install(&self, hook: impl Fn(&Q) + Send + Sync + 'static) -> bool {
        self.hook.set(Box::new(hook)).is_ok()
    }

    /// Runs the hook on `queue`; false if there is none.
    pub(crate) fn fetch(&self, queue: &Q) -> bool {
        match self.hook.get() {
            Some(hook) => {
                hook(queue);
                true
            }
            None => false,
        }
    }
}

impl<Q> fmt::Debug for ReceiveFetch<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReceiveFetch").field("installed", &self.hook.get().is_some()).finish()
    }
}
