//! Fault injection in the datapath, for testing and teaching: every
//! datagram, sent or received, may be dropped, corrupted, duplicated or held
//! back so that the next one overtakes it.
//!
//! Set by `--loss/--reorder/--duplicate/--corrupt` or by the environment
//! (`SOFTRNIC_LOSS`, `SOFTRNIC_REORDER`, `SOFTRNIC_DUPLICATE`,
//! `SOFTRNIC_CORRUPT`) for any program using softrnic.

use std::net::SocketAddr;

use softrnic_transport::RecvMeta;

/// Probabilities, from 0 to 1, applied in each direction.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FaultConfig {
    pub loss: f64,
    pub reorder: f64,
    pub duplicate: f64,
    pub corrupt: f64,
}

impl FaultConfig {
    pub fn is_none(&self) -> bool {
        self.loss == 0.0 && self.reorder == 0.0 && self.duplicate == 0.0 && self.corrupt == 0.0
    }
}

/// Parses a probability, with an error that says what a valid one is.
pub fn parse_probability(text: &str) -> Result<f64, String> {
    let p: f64 =
        text.trim().parse().map_err(|_| format!("`{text}` is not a number; give a probability such as 0.01"))?;
    if (0.0..=1.0).contains(&p) { Ok(p) } else { Err(format!("{p} is not a probability; use a value from 0 to 1")) }
}

/// Counts of what the injector did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct FaultStats {
    pub dropped: u64,
    pub corrupted: u64,
    pub duplicated: u64,
    pub reordered: u64,
}

impl std::ops::AddAssign for FaultStats {
    fn add_assign(&mut self, other: FaultStats) {
        self.dropped += other.dropped;
        self.corrupted += other.corrupted;
        self.duplicated += other.duplicated;
        self.reordered += other.reordered;
    }
}

/// A datagram held back: its peer, what the network said of it (on
/// receipt), and its bytes.
pub type Held = (SocketAddr, RecvMeta, Vec<u8>);

/// A datagram the faults let through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Passed<'a> {
    /// The datagram as it was given (or a duplicate of it): the caller
    /// passes on its own bytes, copied nowhere.
    AsGiven,
    /// Bytes the injector made: a corrupted datagram, or one it held back.
    Made(&'a [u8]),
}

/// Applies a [`FaultConfig`] to a stream of datagrams.
#[derive(Debug)]
pub struct FaultInjector {
    config: FaultConfig,
    rng: fastrand::Rng,
    /// A datagram held back, released after the next one.
    held: Option<Held>,
    pub stats: FaultStats,
}

impl FaultInjector {
    pub fn new(config: FaultConfig, seed: u64) -> FaultInjector {
        FaultInjector { config, rng: fastrand::Rng::with_seed(seed), held: None, stats: FaultStats::default() }
    }

    /// Passes one datagram through the faults; `pass` gets what survives
    /// (zero to three datagrams, counting a released held one), in order.
    /// Only a datagram the faults change or hold is copied: the injector
    /// is a test tool, and its copies once cost a sixth of a lossy run's
    /// rate (BENCHMARKS.md, under loss).
    ///
    /// A corrupted datagram loses [`RecvMeta::same_host`]: one that came
    /// without an ICRC (from a ring) now meets the check it was spared, and
    /// fails it, as a datagram corrupted on a wire fails its ICRC.
    pub fn apply(
        &mut self,
        peer: SocketAddr,
        meta: RecvMeta,
        bytes: &[u8],
        pass: &mut dyn FnMut(SocketAddr, RecvMeta, Passed<'_>),
    ) {
        if self.rng.f64() < self.config.loss {
            self.stats.dropped += 1;
            return;
        }
        let mut corrupted = None;
        if !bytes.is_empty() && self.rng.f64() < self.config.corrupt {
            self.stats.corrupted += 1;
            let mut copy = bytes.to_vec();
            let at = self.rng.usize(..copy.len());
            copy[at] ^= 1 << self.rng.u8(..8);
            corrupted = Some((RecvMeta { same_host: false, ..meta }, copy));
        }
        let deliver = |pass: &mut dyn FnMut(SocketAddr, RecvMeta, Passed<'_>)| match &corrupted {
            Some((meta, copy)) => pass(peer, *meta, Passed::Made(copy)),
            None => pass(peer, meta, Passed::AsGiven),
        };
        if self.rng.f64() < self.config.duplicate {
            self.stats.duplicated += 1;
            deliver(pass);
        }
        if self.held.is_none() && self.rng.f64() < self.config.reorder {
            self.stats.reordered += 1;
            self.held = Some(match corrupted {
                Some((meta, copy)) => (peer, meta, copy),
                None => (peer, meta, bytes.to_vec()),
            });
            return;
        }
        deliver(pass);
        if let Some((peer, meta, bytes)) = self.held.take() {
            pass(peer, meta, Passed::Made(&bytes));
        }
    }

    /// Releases a held datagram (when traffic pauses, nothing would).
    pub fn release(&mut self) -> Option<Held> {
        self.held.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer() -> SocketAddr {
        "127.0.0.2:4791".parse().unwrap()
    }

    /// Runs `bytes` through `f`, collecting what passes.
    fn run(f: &mut FaultInjector, bytes: &[u8], out: &mut Vec<(RecvMeta, Vec<u8>)>) {
        f.apply(peer(), RecvMeta { same_host: true, ..RecvMeta::default() }, bytes, &mut |_, meta, passed| {
            out.push((
                meta,
                match passed {
                    Passed::AsGiven => bytes.to_vec(),
                    Passed::Made(made) => made.to_vec(),
                },
            ))
        });
    }

    #[test]
    fn no_faults_passes_everything_through_uncopied() {
        let mut f = FaultInjector::new(FaultConfig::default(), 1);
        let mut out = Vec::new();
        for i in 0..100u8 {
            f.apply(peer(), RecvMeta::default(), &[i], &mut |_, _, passed| {
                assert_eq!(passed, Passed::AsGiven, "nothing copied");
                out.push(i);
            });
        }
        assert_eq!(out, (0..100).collect::<Vec<_>>());
    }

    /// A corrupted datagram differs from what was given in one bit, and
    /// no longer counts as spared its ICRC check.
    #[test]
    fn a_corrupted_datagram_is_a_changed_copy_that_meets_the_check() {
        let mut f = FaultInjector::new(FaultConfig { corrupt: 1.0, ..FaultConfig::default() }, 3);
        let mut out = Vec::new();
        run(&mut f, &[0u8; 64], &mut out);
        let [(meta, bytes)] = &out[..] else { panic!("one datagram: {out:?}") };
        assert!(!meta.same_host);
        assert_eq!(bytes.iter().map(|b| b.count_ones()).sum::<u32>(), 1);
    }

    #[test]
    fn each_fault_happens_about_as_often_as_asked() {
        let config = FaultConfig { loss: 0.1, reorder: 0.1, duplicate: 0.1, corrupt: 0.1 };
        let mut f = FaultInjector::new(config, 7);
        let mut out = Vec::new();
        for _ in 0..10_000 {
            run(&mut f, &[0u8; 16], &mut out);
        }
        out.extend(f.release().map(|(_, meta, bytes)| (meta, bytes)));
        let s = f.stats;
        for (name, n) in [("dropped", s.dropped), ("corrupted", s.corrupted), ("duplicated", s.duplicated)] {
            assert!((700..1300).contains(&n), "{name}: {n}");
        }
        assert!(s.reordered > 500, "reordered: {}", s.reordered);
        assert_eq!(out.len() as u64, 10_000 - s.dropped + s.duplicated);
    }

    #[test]
    fn probabilities_are_checked() {
        assert_eq!(parse_probability("0.25"), Ok(0.25));
        assert!(parse_probability("1.5").unwrap_err().contains("from 0 to 1"));
        assert!(parse_probability("lots").unwrap_err().contains("not a number"));
    }
}
