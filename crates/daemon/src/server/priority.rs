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
//! Raised means two things. A nice value (`--nice`, -20) for every
//! thread weighs the daemon against the programs, but a weight is still a
//! share: at nice -20 against 128 spinning programs on its core the
//! processor got about 40 % of it, and 128 pairs moved 83 % of what 2
//! pairs did. So the command processors also run real-time (`--realtime`,
//! `SCHED_RR` at priority 1), as cores given to the engine would: each
//! runs whenever it has work and sleeps when it has none
//! ([`super::processor`]), and the kernel's real-time throttle (95 % of
//! each second by default) leaves the programs their share even if it did
//! not. Only while the processors leave a core to the programs: two
//! real-time processors on two cores left two pairs' clients a twentieth
//! of the CPU, and they moved a third of what they did at nice -20.

use std::time::Duration;

use rustix::process::Pid;

/// How often softrnicd's main thread looks (`follow`).
pub const LOOK_EVERY: Duration = Duration::from_millis(50);

pub struct Priority {
    /// The nice value the daemon was started with, and the one it takes
    /// while programs outnumber cores.
    base: i32,
    raised: i32,
    /// The real-time priority its command processors take with `raised`,
    /// if any.
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
    /// The raised nice value, with the processors real-time when allowed.
    Raised { realtime: bool },
}

impl Priority {
    /// Priority moving between the calling thread's nice value and
    /// `raised`, with real-time priority `realtime` (1 to 99) for the
    /// daemon's `processors` command processors when raised, if they leave
    /// a core to the programs.
    pub fn new(raised: i32, realtime: Option<i32>, processors: usize) -> Priority {
        let base = rustix::process::getpriority_process(None).unwrap_or(0);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let realtime = realtime.filter(|_| {
            let leaves_a_core = processors < cores;
            if !leaves_a_core {
                eprintln!(
                    "softrnicd: its {processors} command processors on {cores} cores would leave the programs none: \
                     they will not run real-time (pass fewer --processors, or --realtime 0 to say so)"
                );
            }
            leaves_a_core
        });
        Priority { base, raised, realtime, cores, now: Level::Own, refused: false, realtime_refused: false }
    }

    /// Where every thread of the daemon stands now.
    pub fn now(&self) -> Level {
        self.now
    }

    /// `tenants` programs are connected: raised if they outnumber the
    /// cores, the daemon's own otherwise. `processors` are the command
    /// processors' threads.
    pub fn follow(&mut self, tenants: usize, processors: &[Pid]) {
        let raise = tenants > self.cores;
        match (raise, self.now) {
            (true, Level::Own) if !self.refused => self.raise(tenants, processors),
            (false, Level::Raised { realtime }) => self.lower(realtime.then_some(processors)),
            _ => {}
        }
    }

    fn raise(&mut self, tenants: usize, processors: &[Pid]) {
        if let Err(e) = every_thread(|tid| set_nice(tid, self.raised)) {
            self.refused = true;
            eprintln!(
                "softrnicd: keeps nice {}: cannot take nice {} ({e}) with {tenants} programs on {} cores; \
                 run it as root or with CAP_SYS_NICE, or pass --nice {}",
                self.base, self.raised, self.cores, self.base
            );
            let _ = every_thread(|tid| set_nice(tid, self.base));
            return;
        }
        let realtime = match self.realtime {
            Some(priority) if !self.realtime_refused => {
                match processors.iter().try_for_each(|&tid| set_policy(tid, Policy::RoundRobin(priority))) {
                    Ok(()) => true,
                    Err(e) => {
                        // A container may be refused real-time time even as
                        // root (its cgroup's rt_runtime_us is 0).
                        self.realtime_refused = true;
                        back_to_normal(processors);
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

    fn lower(&mut self, realtime: Option<&[Pid]>) {
        if let Some(processors) = realtime {
            back_to_normal(processors);
        }
        // Back to the nice value it was started with, which it was allowed.
        let _ = every_thread(|tid| set_nice(tid, self.base));
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

fn set_nice(tid: Pid, nice: i32) -> std::io::Result<()> {
    rustix::process::setpriority_process(Some(tid), nice).map_err(Into::into)
}

fn set_policy(tid: Pid, policy: Policy) -> std::io::Result<()> {
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

/// `SCHED_OTHER` again for `threads` (always allowed).
fn back_to_normal(threads: &[Pid]) {
    for &tid in threads {
        let _ = set_policy(tid, Policy::Normal);
    }
}

/// Applies `set` to every thread of this process (on Linux a nice value
/// is a thread's; threads started later inherit their starter's).
fn every_thread(set: impl Fn(Pid) -> std::io::Result<()>) -> std::io::Result<()> {
    for entry in std::fs::read_dir("/proc/self/task")? {
        let Some(tid) = entry?.file_name().to_str().and_then(|t| t.parse::<i32>().ok()) else { continue };
        let Some(tid) = Pid::from_raw(tid) else { continue };
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

    fn nice_of(tid: Option<Pid>) -> i32 {
        rustix::process::getpriority_process(tid).unwrap()
    }

    fn policy_of(tid: Option<Pid>) -> i32 {
        // SAFETY: reads one thread's policy (0 is the calling thread).
        unsafe { libc::sched_getscheduler(tid.map_or(0, |t| t.as_raw_nonzero().get())) }
    }

    /// A thread that stands by until the returned sender is dropped, and
    /// its id.
    fn standing_thread() -> (Pid, std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>) {
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            tid_tx.send(rustix::thread::gettid()).unwrap();
            let _ = go_rx.recv();
        });
        (tid_rx.recv().unwrap(), go_tx, thread)
    }

    /// The nice value the tests start from, if they can change it.
    fn changeable_nice() -> Option<i32> {
        let base = nice_of(None);
        if base == -20 || !rustix::process::geteuid().is_root() {
            assert!(std::env::var("CI").is_err(), "CI runs the tests as root at nice 0");
            eprintln!("skipped: changing nice values back and forth takes root");
            return None;
        }
        Some(base)
    }

    /// More programs than cores raise every thread's nice value, the ones
    /// started before and the ones after, and make the processors (and
    /// only them) `SCHED_RR`. Fewer put both back.
    #[test]
    fn programs_outnumbering_the_cores_raise_every_thread_and_the_processors_most() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let Some(base) = changeable_nice() else { return };
        let (processor, stop, thread) = standing_thread();
        let mut priority = Priority::new(base - 1, Some(1), 1);
        let cores = priority.cores;
        priority.follow(cores, &[processor]);
        assert_eq!(priority.now(), Level::Own, "as many as the cores");
        assert_eq!((nice_of(None), nice_of(Some(processor))), (base, base));
        assert_eq!(policy_of(Some(processor)), libc::SCHED_OTHER);

        priority.follow(cores + 1, &[processor]);
        assert_eq!((nice_of(None), nice_of(Some(processor))), (base - 1, base - 1));
        let after = std::thread::spawn(|| nice_of(None)).join().unwrap();
        assert_eq!(after, base - 1, "a thread started now inherits it");
        assert_eq!(policy_of(None), libc::SCHED_OTHER, "only the processors run real-time");
        if cores < 2 {
            assert_eq!(priority.now(), Level::Raised { realtime: false }, "one core: none to leave");
        } else if priority.now() == (Level::Raised { realtime: false }) {
            assert!(std::env::var("CI").is_err(), "CI's machine allows SCHED_RR to root");
            eprintln!("this machine refuses SCHED_RR to root (its cgroup has no real-time time): nice only");
        } else {
            assert_eq!(priority.now(), Level::Raised { realtime: true });
            assert_eq!(policy_of(Some(processor)), libc::SCHED_RR);
        }

        priority.follow(0, &[processor]);
        assert_eq!(priority.now(), Level::Own);
        assert_eq!((nice_of(None), nice_of(Some(processor))), (base, base));
        assert_eq!(policy_of(Some(processor)), libc::SCHED_OTHER);
        drop(stop);
        thread.join().unwrap();
    }

    /// Without real-time priority asked for, or with as many processors
    /// as cores, raised is a nice value only.
    #[test]
    fn no_realtime_without_a_core_left_or_when_not_asked() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let Some(base) = changeable_nice() else { return };
        let (processor, stop, thread) = standing_thread();
        let cores = std::thread::available_parallelism().unwrap().get();
        for (realtime, processors) in [(None, 1), (Some(1), cores)] {
            let mut priority = Priority::new(base - 1, realtime, processors);
            priority.follow(cores + 1, &[processor]);
            assert_eq!(priority.now(), Level::Raised { realtime: false });
            assert_eq!((nice_of(Some(processor)), policy_of(Some(processor))), (base - 1, libc::SCHED_OTHER));
            priority.follow(0, &[processor]);
            assert_eq!((priority.now(), nice_of(Some(processor))), (Level::Own, base));
        }
        drop(stop);
        thread.join().unwrap();
    }
}
