//! The daemon's scheduling priority: raised while the programs it serves
//! outnumber the cores, its own otherwise.
//!
//! Programs poll their CQs in a loop, and through softrnicd a poll reads
//! shared memory while the daemon's threads do the network work. With more
//! spinning programs than cores the scheduler shares the CPU evenly among
//! them and the daemon: 128 pairs of `ib_write_bw` on two cores left its
//! command processor 1.8 % of a CPU (E12). There a raised priority (a
//! lower nice value) is what a NIC has by being hardware. With a core to
//! spare it is not: the processor's idle polls then kept a ping-pong's
//! programs off the cores, and `ib_send_lat` through the daemon went from
//! 13 to 146 µs (E11).

use std::time::Duration;

/// How often softrnicd's main thread looks (`follow`).
pub const LOOK_EVERY: Duration = Duration::from_millis(50);

pub struct Priority {
    /// The nice value the daemon was started with, and the one it takes
    /// while programs outnumber cores.
    base: i32,
    raised: i32,
    cores: usize,
    now: i32,
    /// Said once that raising it is not allowed.
    refused: bool,
}

impl Priority {
    /// Priority moving between the calling thread's nice value and
    /// `raised`.
    pub fn new(raised: i32) -> Priority {
        let base = rustix::process::getpriority_process(None).unwrap_or(0);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Priority { base, raised, cores, now: base, refused: false }
    }

    /// The nice value every thread of the daemon has now.
    pub fn now(&self) -> i32 {
        self.now
    }

    /// `tenants` programs are connected: raised if they outnumber the
    /// cores, the daemon's own otherwise.
    pub fn follow(&mut self, tenants: usize) {
        let wanted = if tenants > self.cores { self.raised } else { self.base };
        if wanted == self.now || (wanted < self.now && self.refused) {
            return;
        }
        match set_every_thread(wanted) {
            Ok(()) => self.now = wanted,
            Err(e) => {
                self.refused = true;
                eprintln!(
                    "softrnicd: keeps nice {}: cannot take nice {wanted} ({e}) with {tenants} programs on {} cores; \
                     run it as root or with CAP_SYS_NICE, or pass --nice {}",
                    self.now, self.cores, self.base
                );
            }
        }
    }
}

/// Sets the nice value of every thread of this process (on Linux a nice
/// value is a thread's; the threads started later inherit their starter's).
fn set_every_thread(nice: i32) -> std::io::Result<()> {
    for entry in std::fs::read_dir("/proc/self/task")? {
        let Some(tid) = entry?.file_name().to_str().and_then(|t| t.parse::<i32>().ok()) else { continue };
        let Some(pid) = rustix::process::Pid::from_raw(tid) else { continue };
        match rustix::process::setpriority_process(Some(pid), nice) {
            // A thread that ended meanwhile.
            Err(rustix::io::Errno::SRCH) => {}
            result => result?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// More programs than cores lower the nice value of every thread, the
    /// ones started before and the ones after; fewer put it back.
    #[test]
    fn programs_outnumbering_the_cores_raise_every_thread() {
        let base = rustix::process::getpriority_process(None).unwrap();
        if base == -20 || !rustix::process::geteuid().is_root() {
            assert!(std::env::var("CI").is_err(), "CI runs the tests as root at nice 0");
            eprintln!("skipped: changing nice values back and forth takes root");
            return;
        }
        let nice_of = |pid| rustix::process::getpriority_process(pid).unwrap();
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let before = std::thread::spawn(move || {
            tid_tx.send(rustix::thread::gettid()).unwrap();
            go_rx.recv().unwrap();
        });
        let other = Some(tid_rx.recv().unwrap());
        let mut priority = Priority::new(base - 1);
        priority.follow(priority.cores);
        assert_eq!((priority.now(), nice_of(None), nice_of(other)), (base, base, base), "as many as the cores");
        priority.follow(priority.cores + 1);
        assert_eq!((priority.now(), nice_of(None), nice_of(other)), (base - 1, base - 1, base - 1));
        let after = std::thread::spawn(|| rustix::process::getpriority_process(None).unwrap()).join().unwrap();
        assert_eq!(after, base - 1, "a thread started now inherits it");
        priority.follow(0);
        assert_eq!((priority.now(), nice_of(None), nice_of(other)), (base, base, base));
        go_tx.send(()).unwrap();
        before.join().unwrap();
    }
}
