use std::os::fd::RawFd;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use softrnic_provider::{CompletionChannel, DeviceCq};
use softrnic_transport::{Completion, CqId};

use crate::{Context, Error};

pub(crate) struct CqHandle {
    ctx: Context,
    queue: DeviceCq,
    /// The CQ's own completion channel, made at the first
    /// `request_notify`.
    channel: OnceLock<CompletionChannel>,
}

impl Drop for CqHandle {
    fn drop(&mut self) {
        let _ = self.ctx.provider.destroy_cq(&self.queue);
        if let Some(channel) = self.channel.get() {
            self.ctx.provider.forget_cq(self.queue.id(), channel);
            let _ = self.ctx.provider.destroy_channel(channel);
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

impl CompletionQueue {
    pub(crate) fn new(ctx: Context, queue: DeviceCq) -> CompletionQueue {
        let handle = Arc::new(CqHandle { ctx: ctx.clone(), queue, channel: OnceLock::new() });
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
        self.ctx.provider.poll_cq(&self.handle.queue, max, out)
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
        self.channel()?;
        self.handle.queue.request_notify(solicited_only);
        Ok(())
    }

    /// The CQ's completion channel, made and attached on first use.
    fn channel(&self) -> Result<&CompletionChannel, Error> {
        if let Some(channel) = self.handle.channel.get() {
            return Ok(channel);
        }
        let provider = &self.ctx.provider;
        let channel = provider.create_channel()?;
        provider.attach_cq(self.id(), Some(&channel))?;
        // Two threads may race to make it: the loser's goes, and the CQ
        // goes back to the winner's.
        if let Err(extra) = self.handle.channel.set(channel) {
            provider.attach_cq(self.id(), self.handle.channel.get())?;
            let _ = provider.destroy_channel(&extra);
        }
        Ok(self.handle.channel.get().expect("set above"))
    }

    /// The completion channel's file descriptor, for `poll`/`epoll`.
    pub fn channel_fd(&self) -> Result<RawFd, Error> {
        Ok(self.channel()?.fd())
    }

    /// Blocks until the armed notification fires or `timeout` passes;
    /// returns whether it fired. The engine threads make the progress.
    pub fn wait_event(&self, timeout: Duration) -> Result<bool, Error> {
        let fired = self.channel()?.wait(&self.ctx.provider, self.handle.queue.shards(), timeout)?;
        Ok(fired.is_some())
    }
}
