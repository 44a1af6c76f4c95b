//! The CM agent thread: waits on QP1's completion channel (and a wake-up
//! eventfd) until a MAD arrives or the protocol's next timer is due, hands
//! MADs and timers to the protocol, sends what it produced, and delivers
//! its events to the rdma_cm IDs they concern ([`crate::id::deliver`]),
//! until the device goes away (softrnicd stopped), which every ID hears.

use std::sync::Arc;
use std::time::Duration;

use crate::device::CmDevice;

/// The longest the agent sleeps without a timer due.
const IDLE: Duration = Duration::from_secs(1);

pub fn start(device: Arc<CmDevice>) -> Result<(), String> {
    std::thread::Builder::new()
        .name("softrnic-cm".into())
        .spawn(move || run(&device))
        .map(|_| ())
        .map_err(|e| format!("softrnic librdmacm: cannot start the CM agent thread: {e}"))
}

fn run(device: &CmDevice) {
    loop {
        let timeout = {
            let mut state = device.lock();
            let now = device.now();
            device.drain(&mut state);
            state.cm.handle_timeout(now);
            device.flush(&mut state);
            crate::id::deliver(device, &mut state);
            state.cm.poll_timeout().map_or(IDLE, |at| at.saturating_sub(device.now())).min(IDLE)
        };
        let mut fds = [
            libc::pollfd { fd: device.channel_fd(), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: std::os::fd::AsRawFd::as_raw_fd(&device.wake), events: libc::POLLIN, revents: 0 },
        ];
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: two valid pollfds.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
        // A channel whose device has gone reads as closed: the IDs are
        // told, and there is nothing more for the agent to do.
        if fds[0].revents & (libc::POLLIN | libc::POLLHUP) != 0 && !device.ack_event() {
            device.removed();
            return;
        }
        if fds[1].revents & libc::POLLIN != 0 {
            device.wake.drain();
        }
    }
}
