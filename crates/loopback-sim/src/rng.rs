//! A small, fast, seeded random number generator (xoshiro256++), so runs are reproducible
//! on every platform without depending on a crate's stream stability.

/// xoshiro256++ seeded through splitmix64.
#[derive(Clone, Debug)]
pub(crate) struct Rng {
    s: [u64; 4],
}

/// One step of splitmix64 (the core's one implementation): a good 64-bit mixer, also used
/// for fingerprints.
pub(crate) use ringcast_core::port::splitmix64;

impl Rng {
    /// A generator for `seed`; distinct `stream`s give independent sequences.
    pub(crate) fn new(seed: u64, stream: u64) -> Self {
        let mut x = seed ^ splitmix64(stream);
        let mut s = [0; 4];
        for w in &mut s {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            *w = splitmix64(x);
        }
        Rng { s }
    }

    /// The next 64 random bits.
    #[inline]
    pub(crate) fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = (s[0].wrapping_add(s[3])).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// True with the probability `p` was converted from (see [`Prob`]).
    #[inline]
    pub(crate) fn chance(&mut self, p: Prob) -> bool {
        p.0 != 0 && self.next_u64() < p.0
    }

    /// Uniform in `0..n` (`n > 0`), by multiply-shift (bias below 2^-32 for our ranges).
    #[inline]
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

/// A probability as a 64-bit threshold: exact integer comparisons keep runs bit-reproducible.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Prob(u64);

impl Prob {
    /// Converts `p` (clamped to `0..=1`; NaN is 0).
    pub(crate) fn new(p: f64) -> Self {
        if p.is_nan() || p <= 0.0 {
            Prob(0)
        } else if p >= 1.0 {
            Prob(u64::MAX)
        } else {
            // 2^64 * p, exact enough for any probability a user types.
            Prob((p * 18_446_744_073_709_551_616.0) as u64)
        }
    }

    /// Whether this probability is zero.
    pub(crate) fn is_zero(self) -> bool {
        self.0 == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream() {
        let mut a = Rng::new(7, 1);
        let mut b = Rng::new(7, 1);
        let mut c = Rng::new(7, 2);
        let xs: Vec<u64> = (0..8).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..8).map(|_| b.next_u64()).collect();
        let zs: Vec<u64> = (0..8).map(|_| c.next_u64()).collect();
        assert_eq!(xs, ys);
        assert_ne!(xs, zs);
    }

    #[test]
    fn chance_matches_probability() {
        let mut r = Rng::new(1, 0);
        let p = Prob::new(0.25);
        let hits = (0..100_000).filter(|_| r.chance(p)).count();
        assert!((24_000..26_000).contains(&hits), "{hits}");
        assert!(!r.chance(Prob::new(0.0)));
        assert!(r.chance(Prob::new(1.0)));
    }
}
