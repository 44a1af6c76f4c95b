use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use softrnic_engine::EventQueue;
use softrnic_engine::eventfd::wait_readable;
use softrnic_transport::{Completion, CqId};

type Queue = softrnic_transport::CompletionQueue;

use crate::{Context, Error};

pub(crate) struct CqHandle {
    ctx: Context,
    queue: Arc<Queue>,
}

impl Drop for CqHandle {
    fn drop(&mut self) {
        let _ = self.ctx.nic.destroy_cq(self.queue.id());
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
    pub(crate) fn new(ctx: Context, queue: Arc<Queue>) -> CompletionQueue {
        let handle = Arc::new(CqHandle { ctx: ctx.clone(), queue });
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
    /// the QPs that feed this queue (`softrnic_engine::progress`).
    pub fn poll(&self, max: usize, out: &mut Vec<Completion>) -> usize {
        self.ctx.nic.poll_cq(&self.handle.queue, max, out)
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

    fn channel(&self) -> Result<Arc<EventQueue<CqId>>, Error> {
        Ok(self.ctx.nic.channel(self.id())?)
    }

    /// The completion channel's file descriptor, for `poll`/`epoll`.
    pub fn channel_fd(&self) -> Result<RawFd, Error> {
        Ok(self.channel()?.as_raw_fd())
    }

    /// Blocks until the armed notification fires or `timeout` passes;
    /// returns whether it fired. The engine threads make the progress.
    pub fn wait_event(&self, timeout: Duration) -> Result<bool, Error> {
        let channel = self.channel()?;
        if channel.try_pop().is_some() {
            return Ok(true);
        }
        let _waiting = self.ctx.nic.application_waits(self.handle.queue.shards());
        wait_readable(&[channel.as_raw_fd()], timeout)?;
        Ok(channel.try_pop().is_some())
    }
}
