//! The daemon's scheduling priority: raised while the programs it serves
//! outnumber the cores, its own otherwise.
//!
//! Programs poll their CQs in a loop, and through softrnicd a poll reads
//! shared memory while the daemon's threads do the network work. With more
//! spinning programs than cores the scheduler shares the CPU evenly among
//! them and the daemon: 128 pairs of `ib_write_bw` on two cores left its
//! command processor 1.8 % of a CPU (E12). There a raised priority is what
//! a NIC has by being hardware. With a core to spare it is not: the
//! processor's idle polls then kept a ping-pong's programs off the cores,
//! and `ib_send_lat` through the daemon went from 13 to 146 µs (E11).
//!
//! Raised means two things. A nice value (`--nice`, -20) weighs the
//! daemon's threads against the programs, but a weight is still a share:
//! at nice -20 against 256 spinning programs the processor got about a
//! third of its core, and 128 pairs moved 75 % of what 2 pairs did. A
//! real-time policy (`--realtime`, `SCHED_RR` at priority 1) runs the
//! processor whenever it has work, as a core given to the engine would:
//! it sleeps when it has none ([`super::processor`]), and the kernel's
//! real-time throttle (95 % of each second by default) leaves the
//! programs their share even if it did not.

use std::time::Duration;

/// How often softrnicd's main thread looks (`follow`).
pub const LOOK_EVERY: Duration = Duration::from_millis(50);

pub struct Priority {
    /// The nice value the daemon was started with, and the one it takes
    /// while programs outnumber cores.
    base: i32,
    raised: i32,
    /// The real-time priority it takes with `raised`, if any.
    realtime: Option<i32>,
    cores: usize,
    now: Level,
    /// Said once that raising it (or making it real-time) is not allowed.
    refused: bool,
    realtime_refused: bool,
}

/// Where the daemon's threads stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Its own nice value, as started.
    Own,
    /// The raised nice value, with the real-time policy when allowed.
    Raised { realtime: bool },
}

impl Priority {
    /// Priority moving between the calling thread's nice value and
    /// `raised`, with real-time priority `realtime` (1 to 99) when raised.
    pub fn new(raised: i32, realtime: Option<i32>) -> Priority {
        let base = rustix::process::getpriority_process(None).unwrap_or(0);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Priority { base, raised, realtime, cores, now: Level::Own, refused: false, realtime_refused: false }
    }

    /// Where every thread of the daemon stands now.
    pub fn now(&self) -> Level {
        self.now
    }

    /// `tenants` programs are connected: raised if they outnumber the
    /// cores, the daemon's own otherwise.
    pub fn follow(&mut self, tenants: usize) {
        let raise = tenants > self.cores;
        match (raise, self.now) {
            (true, Level::Own) if !self.refused => self.raise(tenants),
            (false, Level::Raised { realtime }) => self.lower(realtime),
            _ => {}
        }
    }

    fn raise(&mut self, tenants: usize) {
        if let Err(e) = set_every_thread(|tid| set_nice(tid, self.raised)) {
            self.refused = true;
            eprintln!(
                "softrnicd: keeps nice {}: cannot take nice {} ({e}) with {tenants} programs on {} cores; \
                 run it as root or with CAP_SYS_NICE, or pass --nice {}",
                self.base, self.raised, self.cores, self.base
            );
            let _ = set_every_thread(|tid| set_nice(tid, self.base));
            return;
        }
        let realtime = match self.realtime {
            Some(priority) if !self.realtime_refused => {
                match set_every_thread(|tid| set_policy(tid, Policy::RoundRobin(priority))) {
                    Ok(()) => true,
                    Err(e) => {
                        // A container may be refused real-time time even as
                        // root (its cgroup's rt_runtime_us is 0).
                        self.realtime_refused = true;
                        let _ = set_every_thread(|tid| set_policy(tid, Policy::Normal));
                        eprintln!(
                            "softrnicd: runs at nice {} without real-time priority: cannot take SCHED_RR {priority} \
                             ({e}); run it with CAP_SYS_NICE and real-time time in its cgroup, or pass --realtime 0",
                            self.raised
                        );
                        false
                    }
                }
            }
            _ => false,
        };
        self.now = Level::Raised { realtime };
    }

    fn lower(&mut self, realtime: bool) {
        if realtime {
            let _ = set_every_thread(|tid| set_policy(tid, Policy::Normal));
        }
        // Back to the nice value it was started with, which it was allowed.
        let _ = set_every_thread(|tid| set_nice(tid, self.base));
        self.now = Level::Own;
    }
}

/// A thread's scheduling policy.
enum Policy {
    /// `SCHED_OTHER`: shares by nice value.
    Normal,
    /// `SCHED_RR` at a real-time priority, 1 to 99.
    RoundRobin(i32),
}

fn set_nice(tid: rustix::process::Pid, nice: i32) -> std::io::Result<()> {
    rustix::process::setpriority_process(Some(tid), nice).map_err(Into::into)
}

fn set_policy(tid: rustix::process::Pid, policy: Policy) -> std::io::Result<()> {
    let (policy, priority) = match policy {
        Policy::Normal => (libc::SCHED_OTHER, 0),
        Policy::RoundRobin(priority) => (libc::SCHED_RR, priority),
    };
    let param = libc::sched_param { sched_priority: priority };
    // SAFETY: `param` is a valid sched_param that outlives the call, and
    // on Linux a thread id names that one thread; the call reads `param`
    // and keeps nothing.
    let result = unsafe { libc::sched_setscheduler(tid.as_raw_nonzero().get(), policy, &param) };
    if result == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

/// Applies `set` to every thread of this process (on Linux a nice value
/// and a scheduling policy are a thread's; threads started later inherit
/// their starter's).
fn set_every_thread(set: impl Fn(rustix::process::Pid) -> std::io::Result<()>) -> std::io::Result<()> {
    for entry in std::fs::read_dir("/proc/self/task")? {
        let Some(tid) = entry?.file_name().to_str().and_then(|t| t.parse::<i32>().ok()) else { continue };
        let Some(tid) = rustix::process::Pid::from_raw(tid) else { continue };
        match set(tid) {
            // A thread that ended meanwhile.
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
            result => result?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each test changes every thread of the test process: one at a time.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// More programs than cores raise every thread, the ones started
    /// before and the ones after: a lower nice value and `SCHED_RR`. Fewer
    /// put both back.
    #[test]
    fn programs_outnumbering_the_cores_raise_every_thread() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let base = rustix::process::getpriority_process(None).unwrap();
        if base == -20 || !rustix::process::geteuid().is_root() {
            assert!(std::env::var("CI").is_err(), "CI runs the tests as root at nice 0");
            eprintln!("skipped: changing nice values back and forth takes root");
            return;
        }
        let nice_of = |tid| rustix::process::getpriority_process(tid).unwrap();
        let policy_of = |tid: Option<rustix::process::Pid>| {
            // SAFETY: reads one thread's policy (0 is the calling thread).
            unsafe { libc::sched_getscheduler(tid.map_or(0, |t| t.as_raw_nonzero().get())) }
        };
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let before = std::thread::spawn(move || {
            tid_tx.send(rustix::thread::gettid()).unwrap();
            go_rx.recv().unwrap();
        });
        let other = Some(tid_rx.recv().unwrap());
        let mut priority = Priority::new(base - 1, Some(1));
        priority.follow(priority.cores);
        assert_eq!(priority.now(), Level::Own, "as many as the cores");
        assert_eq!((nice_of(None), nice_of(other)), (base, base));
        assert_eq!((policy_of(None), policy_of(other)), (libc::SCHED_OTHER, libc::SCHED_OTHER));

        priority.follow(priority.cores + 1);
        assert_eq!((nice_of(None), nice_of(other)), (base - 1, base - 1));
        if priority.now() == (Level::Raised { realtime: false }) {
            assert!(std::env::var("CI").is_err(), "CI's machine allows SCHED_RR to root");
            eprintln!("this machine refuses SCHED_RR to root (its cgroup has no real-time time): nice only");
        } else {
            assert_eq!(priority.now(), Level::Raised { realtime: true });
            assert_eq!((policy_of(None), policy_of(other)), (libc::SCHED_RR, libc::SCHED_RR));
            let after = std::thread::spawn(move || policy_of(None)).join().unwrap();
            assert_eq!(after, libc::SCHED_RR, "a thread started now inherits it");
        }
        let after = std::thread::spawn(|| rustix::process::getpriority_process(None).unwrap()).join().unwrap();
        assert_eq!(after, base - 1, "a thread started now inherits it");

        priority.follow(0);
        assert_eq!(priority.now(), Level::Own);
        assert_eq!((nice_of(None), nice_of(other)), (base, base));
        assert_eq!((policy_of(None), policy_of(other)), (libc::SCHED_OTHER, libc::SCHED_OTHER));
        go_tx.send(()).unwrap();
        before.join().unwrap();
    }

    /// Without real-time priority asked for, raised is a nice value only.
    #[test]
    fn realtime_zero_raises_the_nice_value_alone() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let base = rustix::process::getpriority_process(None).unwrap();
        if base == -20 || !rustix::process::geteuid().is_root() {
            assert!(std::env::var("CI").is_err(), "CI runs the tests as root at nice 0");
            eprintln!("skipped: changing nice values back and forth takes root");
            return;
        }
        let mut priority = Priority::new(base - 1, None);
        priority.follow(priority.cores + 1);
        assert_eq!(priority.now(), Level::Raised { realtime: false });
        // SAFETY: reads the calling thread's policy.
        assert_eq!(unsafe { libc::sched_getscheduler(0) }, libc::SCHED_OTHER);
        priority.follow(0);
        assert_eq!(priority.now(), Level::Own);
    }
}
