use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use softrnic_daemon::client::Channel;
use softrnic_event::{EventQueue, wait_readable};
use softrnic_transport::{Completion, CqId};

use crate::{Context, Error};
use softrnic_daemon::backend::{Backend, CqBackend};

pub(crate) struct CqHandle {
    ctx: Context,
    queue: CqBackend,
    /// The completion channel through softrnicd, made at the first
    /// `request_notify`.
    daemon_channel: OnceLock<Channel>,
}

impl Drop for CqHandle {
    fn drop(&mut self) {
        let _ = self.ctx.backend.destroy_cq(&self.queue);
        if let (Backend::Daemon(session), Some(channel)) = (&*self.ctx.backend, self.daemon_channel.get()) {
            let _ = session.destroy_channel(channel);
        }
    }
}

/// A completion queue. Polling it also makes the device progress from the
/// polling thread, so a thread that spins on its CQ sees completions as
/// soon as the packets behind them arrive.
pub struct CompletionQueue {
    ctx: Context,
    handle: Arc<CqHandle>,
}

/// Where a CQ's notifications arrive.
enum Notifications<'a> {
    Engine(Arc<EventQueue<CqId>>),
    Daemon(&'a Channel),
}

impl CompletionQueue {
    pub(crate) fn new(ctx: Context, queue: CqBackend) -> CompletionQueue {
        let handle = Arc::new(CqHandle { ctx: ctx.clone(), queue, daemon_channel: OnceLock::new() });
        CompletionQueue { ctx, handle }
    }

    pub(crate) fn id(&self) -> CqId {
        self.handle.queue.id()
    }

    pub(crate) fn handle(&self) -> Arc<CqHandle> {
        self.handle.clone()
    }

    /// Moves up to `max` completions into `out`; returns how many.
    ///
    /// With none ready, the calling thread receives what has arrived for
    /// the QPs that feed this queue (`softrnic_engine::progress`); through
    /// softrnicd it only reads the queue's shared ring.
    pub fn poll(&self, max: usize, out: &mut Vec<Completion>) -> usize {
        self.ctx.backend.poll_cq(&self.handle.queue, max, out)
    }

    /// Polls until a completion arrives or `timeout` passes.
    pub fn wait(&self, timeout: Duration) -> Result<Completion, Error> {
        let deadline = Instant::now() + timeout;
        let mut out = Vec::with_capacity(1);
        loop {
            if self.poll(1, &mut out) == 1 {
                return Ok(out[0]);
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout(timeout));
            }
            std::hint::spin_loop();
        }
    }

    /// [`CompletionQueue::wait`] with a ten-second limit.
    pub fn wait_one(&self) -> Result<Completion, Error> {
        self.wait(Duration::from_secs(10))
    }

    /// Arms the completion channel for the next completion (or the next
    /// solicited one), as `ibv_req_notify_cq` does.
    pub fn request_notify(&self, solicited_only: bool) -> Result<(), Error> {
        self.notifications()?;
        match &self.handle.queue {
            CqBackend::Engine(queue) => queue.request_notify(solicited_only),
            CqBackend::Daemon(queue) => queue.request_notify(solicited_only),
        }
        Ok(())
    }

    fn notifications(&self) -> Result<Notifications<'_>, Error> {
        match &*self.ctx.backend {
            Backend::Engine(nic) => Ok(Notifications::Engine(nic.channel(self.id())?)),
            Backend::Daemon(session) => {
                if let Some(channel) = self.handle.daemon_channel.get() {
                    return Ok(Notifications::Daemon(channel));
                }
                let channel = session.create_channel()?;
                session.set_cq_channel(self.id(), Some(&channel))?;
                // Two threads may race to make it: the loser's goes.
                if let Err(extra) = self.handle.daemon_channel.set(channel) {
                    let _ = session.destroy_channel(&extra);
                    session.set_cq_channel(self.id(), self.handle.daemon_channel.get())?;
                }
                Ok(Notifications::Daemon(self.handle.daemon_channel.get().expect("set above")))
            }
        }
    }

    /// The completion channel's file descriptor, for `poll`/`epoll`.
    pub fn channel_fd(&self) -> Result<RawFd, Error> {
        Ok(match self.notifications()? {
            Notifications::Engine(queue) => queue.as_raw_fd(),
            Notifications::Daemon(channel) => channel.as_fd().as_raw_fd(),
        })
    }

    /// Blocks until the armed notification fires or `timeout` passes;
    /// returns whether it fired. The engine threads make the progress.
    pub fn wait_event(&self, timeout: Duration) -> Result<bool, Error> {
        match (self.notifications()?, &*self.ctx.backend, &self.handle.queue) {
            (Notifications::Engine(channel), Backend::Engine(nic), CqBackend::Engine(queue)) => {
                if channel.try_pop().is_some() {
                    return Ok(true);
                }
                let _waiting = nic.application_waits(queue.shards());
                wait_readable(&[channel.as_raw_fd()], timeout)?;
                Ok(channel.try_pop().is_some())
            }
            (Notifications::Daemon(channel), ..) => Ok(channel.get_event(timeout)?.is_some()),
            _ => unreachable!("a CQ belongs to the backend that made it"),
        }
    }
}
