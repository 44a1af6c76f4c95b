//! Where the transport's unpredictable numbers come from: memory keys and
//! QP numbers. Whoever can predict them can forge requests
//! that pass a responder's checks (ReDMArk, USENIX Security 2021, did so
//! against real RNICs, whose keys and QP numbers count up), and under
//! softrnicd one device's numbers are shared by every tenant. So they are
//! drawn from a cryptographic generator (ChaCha12), which no number of
//! keys seen lets anyone extrapolate.
//!
//! The transport does no I/O: its driver seeds the generator, the engine
//! from the operating system, the simulator from the run's seed (so a run
//! replays, keys and all).

use std::collections::VecDeque;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rustc_hash::FxHashSet;

/// A seeded source of unpredictable numbers.
pub struct Entropy(StdRng);

impl Entropy {
    /// Seeded with 32 bytes the driver drew from the operating system.
    pub fn from_seed(seed: [u8; 32]) -> Entropy {
        Entropy(StdRng::from_seed(seed))
    }

    /// Seeded from a run's seed: as predictable as that seed, for the
    /// simulator and tests.
    pub fn from_u64(seed: u64) -> Entropy {
        Entropy(StdRng::seed_from_u64(seed))
    }

    pub fn u32(&mut self) -> u32 {
        self.0.next_u32()
    }

    /// A source of memory keys ([`crate::memory::MemoryTable::register`])
    /// for the tests of the table.
    #[cfg(test)]
    pub(crate) fn into_draw(mut self) -> impl FnMut() -> u32 {
        move || self.u32()
    }
}

impl std::fmt::Debug for Entropy {
    /// The state stays secret, in logs too.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Entropy(..)")
    }
}

/// Numbers let go of lately (memory keys, QP numbers), which are not
/// handed out again until [`Recent::HELD`] later ones have been: a peer's
/// stale key, or a late packet for a destroyed QP, never names a new
/// object however quickly objects come and go.
#[derive(Debug, Default)]
pub struct Recent {
    order: VecDeque<u32>,
    held: FxHashSet<u32>,
}

impl Recent {
    /// How many numbers let go of are held back.
    pub const HELD: usize = 4096;

    pub fn contains(&self, n: u32) -> bool {
        self.held.contains(&n)
    }

    /// Holds `n` back, releasing the oldest held once there are
    /// [`Recent::HELD`].
    pub fn let_go(&mut self, n: u32) {
        if self.order.len() == Self::HELD
            && let Some(oldest) = self.order.pop_front()
        {
            self.held.remove(&oldest);
        }
        if self.held.insert(n) {
            self.order.push_back(n);
        }
        debug_assert_eq!(self.order.len(), self.held.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_and_different_seeds_differ() {
        let draw = |seed| {
            let mut e = Entropy::from_u64(seed);
            (0..8).map(|_| e.u32()).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        assert_eq!(format!("{:?}", Entropy::from_u64(7)), "Entropy(..)");
    }

    #[test]
    fn recent_numbers_are_held_back_until_enough_later_ones_go() {
        let mut recent = Recent::default();
        recent.let_go(5);
        assert!(recent.contains(5));
        (1000..1000 + Recent::HELD as u32 - 1).for_each(|n| recent.let_go(n));
        assert!(recent.contains(5), "held while fewer than HELD later ones went");
        recent.let_go(9);
        assert!(!recent.contains(5));
        assert!(recent.contains(9) && recent.contains(1000));
    }
}
