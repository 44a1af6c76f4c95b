//! The marking probability of RED-style ECN (Floyd and Jacobson's RED with
//! marks for drops, as DCQCN and HPCC configure it), decided at dequeue so
//! the mark reaches the receiver as early as the queue allows.

use crate::config::RedConfig;

impl RedConfig {
    /// The probability of marking a packet that leaves a queue holding
    /// `queued` bytes.
    pub fn probability(&self, queued: u64) -> f64 {
        if queued <= self.kmin {
            0.0
        } else if queued > self.kmax {
            1.0
        } else {
            self.pmax * (queued - self.kmin) as f64 / (self.kmax - self.kmin).max(1) as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_below_kmin_linear_to_pmax_one_above_kmax() {
        let red = RedConfig { kmin: 1000, kmax: 3000, pmax: 0.2 };
        assert_eq!(red.probability(0), 0.0);
        assert_eq!(red.probability(1000), 0.0);
        assert!((red.probability(2000) - 0.1).abs() < 1e-12);
        assert!((red.probability(3000) - 0.2).abs() < 1e-12);
        assert_eq!(red.probability(3001), 1.0);
    }
}
