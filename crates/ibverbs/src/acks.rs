//! Event acknowledgement, as rdma-core defines it: every completion event
//! (`ibv_get_cq_event`) and asynchronous event (`ibv_get_async_event`)
//! handed to the program must be acknowledged (`ibv_ack_cq_events`,
//! `ibv_ack_async_event`) before the object it names can be destroyed; the
//! destroy verb blocks until then. The program's side of the count lives in
//! the object's C view (`comp_events_completed`, `events_completed`, under
//! its `mutex`, signalled through its `cond`), exactly where rdma-core keeps
//! it; ours, how many were handed out, is a [`Reported`] beside it.

use std::sync::atomic::{AtomicU32, Ordering};

use libc::{pthread_cond_t, pthread_mutex_t};

/// How many events naming one object the library handed out.
#[derive(Debug, Default)]
pub struct Reported(AtomicU32);

impl Reported {
    pub fn one_more(&self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }

    fn get(&self) -> u32 {
        self.0.load(Ordering::Acquire)
    }
}

/// The acknowledgement fields of one object's C view.
pub struct AckFields {
    pub mutex: *mut pthread_mutex_t,
    pub cond: *mut pthread_cond_t,
    pub completed: *mut u32,
}

impl AckFields {
    /// Records `n` acknowledgements and wakes a destroy waiting for them.
    ///
    /// # Safety
    /// The pointers must point into a live object's C view.
    pub unsafe fn acknowledge(&self, n: u32) {
        // SAFETY: live fields (caller); the count is only touched under
        // the mutex, as rdma-core's own functions do.
        unsafe {
            libc::pthread_mutex_lock(self.mutex);
            *self.completed = (*self.completed).wrapping_add(n);
            libc::pthread_cond_broadcast(self.cond);
            libc::pthread_mutex_unlock(self.mutex);
        }
    }

    /// Blocks until the program has acknowledged every event `reported`
    /// counts.
    ///
    /// # Safety
    /// As for [`AckFields::acknowledge`].
    pub unsafe fn wait_for(&self, reported: &Reported) {
        // SAFETY: as above.
        unsafe {
            libc::pthread_mutex_lock(self.mutex);
            while *self.completed != reported.get() {
                libc::pthread_cond_wait(self.cond, self.mutex);
            }
            libc::pthread_mutex_unlock(self.mutex);
        }
    }
}
