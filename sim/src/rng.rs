//! A tiny deterministic PRNG (SplitMix64): every thread of a run derives its own stream from
//! `--seed`, so a run's random choices (not its thread timings) are reproducible.

/// SplitMix64 generator.
#[derive(Clone, Debug)]
pub struct Rng(u64);

/// The SplitMix64 finaliser: a good 64-bit mix, also used for the byte pattern.
#[inline]
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rng {
    /// A generator for stream `stream` of seed `seed`.
    pub fn new(seed: u64, stream: u64) -> Rng {
        Rng(mix(seed ^ mix(stream.wrapping_add(0x9E37_79B9_7F4A_7C15))))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }

    /// Uniform in `0..n` (0 when `n == 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
        }
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi.saturating_sub(lo).saturating_add(1))
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_stays_in_bounds_and_streams_differ() {
        let mut a = Rng::new(1, 0);
        let mut b = Rng::new(1, 1);
        let mut same = 0;
        for _ in 0..1000 {
            let x = a.range(3, 7);
            assert!((3..=7).contains(&x));
            same += u32::from(a.next_u64() == b.next_u64());
        }
        assert_eq!(same, 0);
        assert_eq!(a.below(0), 0);
        assert!(!a.chance(0.0));
        assert!(a.chance(1.0));
    }
}
