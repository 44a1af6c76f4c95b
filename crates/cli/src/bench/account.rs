//! `softrnic bench --account`: where an operation's time goes. The
//! engine's own counts ([`softrnic_account`]: system calls by kind,
//! wake-ups, bytes copied, ICRC bytes, locks) and the kernel's (CPU time
//! and context switches, from `getrusage`) over the measured loop, divided
//! by the operations in it: per round trip for latency tests, per message
//! for bandwidth tests.
//!
//! Time is counted too (`softrnic_account::set_timing`): in system calls
//! by kind, and in the passes that moved data, whose difference is
//! softrnic's own work on the packets.
//!
//! Both are the process's: a loopback run's account holds both ends, a
//! run against another process this end's only (the report says which).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use softrnic_account::Tally;

/// The counts at the start of a measured loop.
pub struct Meter {
    tally: Tally,
    usage: Usage,
}

/// What the kernel says the process has spent.
#[derive(Clone, Copy)]
struct Usage {
    cpu: Duration,
    voluntary: u64,
    involuntary: u64,
}

impl Usage {
    fn now() -> Usage {
        // SAFETY: rusage is plain data, all-zero a valid value; getrusage
        // writes only into it.
        let u = unsafe {
            let mut u: libc::rusage = std::mem::zeroed();
            libc::getrusage(libc::RUSAGE_SELF, &mut u);
            u
        };
        let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
        Usage {
            cpu: time(u.ru_utime) + time(u.ru_stime),
            voluntary: u.ru_nvcsw as u64,
            involuntary: u.ru_nivcsw as u64,
        }
    }
}

/// One operation's costs, averaged over a loop.
#[derive(Debug, Clone, Serialize)]
pub struct Account {
    /// "round trip" or "message".
    pub per: &'static str,
    pub ops: u64,
    /// "both ends" (a loopback run) or "this end".
    pub ends: &'static str,
    /// CPU time of the whole process (every thread), in µs.
    pub cpu_us: f64,
    /// Context switches: the thread gave up its core (slept, waited), or
    /// the kernel took it.
    pub voluntary_switches: f64,
    pub involuntary_switches: f64,
    /// The engine's counts, by [`softrnic_account::Cost::name`].
    pub costs: BTreeMap<&'static str, f64>,
}

impl Meter {
    pub fn start() -> Meter {
        Meter { tally: softrnic_account::snapshot(), usage: Usage::now() }
    }

    /// What the `ops` operations since [`Meter::start`] cost, each.
    /// Both ends' until [`Account::ends`] says otherwise.
    pub fn per_op(&self, ops: u64, per: &'static str) -> Account {
        let (tally, usage) = (softrnic_account::snapshot().since(&self.tally), Usage::now());
        let each = |n: u64| n as f64 / ops.max(1) as f64;
        Account {
            per,
            ops,
            ends: "both ends",
            cpu_us: (usage.cpu.saturating_sub(self.usage.cpu)).as_secs_f64() * 1e6 / ops.max(1) as f64,
            voluntary_switches: each(usage.voluntary.saturating_sub(self.usage.voluntary)),
            involuntary_switches: each(usage.involuntary.saturating_sub(self.usage.involuntary)),
            costs: tally.iter().map(|(cost, n)| (cost.name(), each(n))).collect(),
        }
    }
}

impl Account {
    /// Says whose costs these are.
    pub fn ends(self, loopback: bool) -> Account {
        Account { ends: if loopback { "both ends" } else { "this end" }, ..self }
    }
}

/// The account as a block under a table's results.
pub fn print(account: &Account) {
    println!(" Where the time goes, per {} ({}, {} operations):", account.per, account.ends, account.ops);
    println!(
        "   CPU {:.2} us; context switches {:.2} voluntary, {:.2} involuntary",
        account.cpu_us, account.voluntary_switches, account.involuntary_switches
    );
    let c = |name: &str| account.costs.get(name).copied().unwrap_or(0.0);
    println!(
        "   system calls: {:.2} sendmmsg ({:.2} datagrams, {:.0} B), {:.2} recvmmsg ({:.2} empty; {:.2} datagrams, {:.0} B), {:.2} poll sleeps",
        c("send_calls"),
        c("datagrams_sent"),
        c("bytes_to_kernel"),
        c("receive_calls"),
        c("empty_receives"),
        c("datagrams_received"),
        c("bytes_from_kernel"),
        c("sleeps")
    );
    println!(
        "   wake-ups: {:.2} eventfd writes, {:.2} eventfd reads, {:.2} doorbells rung",
        c("wake_signals"),
        c("wake_reads"),
        c("doorbells")
    );
    let us = |name: &str| c(name) / 1000.0;
    println!(
        "   time: {:.2} us in send calls, {:.2} us in receive calls that brought data, {:.2} us in empty ones",
        us("send_ns"),
        us("receive_ns"),
        us("empty_receive_ns")
    );
    println!(
        "         {:.2} us of softrnic's own work sending, {:.2} us receiving (passes that moved data, less their calls)",
        (us("transmit_pass_ns") - us("send_ns")).max(0.0),
        (us("receive_pass_ns") - us("receive_ns")).max(0.0)
    );
    println!(
        "   bytes copied by softrnic {:.0}, through the ICRC {:.0}; shard locks {:.2} ({:.2} found held)",
        c("bytes_copied"),
        c("icrc_bytes"),
        c("locks"),
        c("locks_contended")
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use softrnic_account::Cost;

    /// The account divides what was counted in its loop, and only that.
    #[test]
    fn the_account_divides_what_its_loop_counted() {
        softrnic_account::add(Cost::Doorbells, 1_000_000);
        let meter = Meter::start();
        softrnic_account::add(Cost::Doorbells, 40);
        let account = meter.per_op(20, "message");
        // Another test's engine may ring a doorbell meanwhile; what came
        // before the loop must not count.
        let each = account.costs["doorbells"];
        assert!((2.0..3.0).contains(&each), "{each}");
        assert_eq!(account.costs.len(), softrnic_account::COSTS);
        assert!(account.cpu_us >= 0.0);
    }
}
