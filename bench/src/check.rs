//! The data check: deterministic per-(seed, rank, index) inputs, expected results computed on the
//! host in `f64`, and the comparison.
//!
//! Reductions use small integers chosen so that every partial result any reduction order can
//! produce is exactly representable in the element type (see [`RedGen`]); results are then
//! compared bit for bit. The one exception is `avg` on floating-point types, which the library
//! computes as a PreMulSum by `1/nranks` rounded to the type (then a sum whose partial results
//! are no longer integers): it is compared with the tolerance of [`Check::avg_tolerance`].
//! Data-movement collectives move arbitrary bit patterns (hashed from seed, rank and index) and
//! are compared bit for bit.

use crate::coll::{Coll, Counts};
use crate::dtype::{premul_scalar, Dtype, Op};

/// Byte written to receive buffers before a checked call, so that unwritten elements show.
const POISON_SALT: u64 = 0xdead_beef_cafe_f00d;

#[inline]
fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// How reduction inputs are drawn for one (type, op, nranks).
#[derive(Clone, Copy, Debug)]
enum RedGen {
    /// Integers in [-a, a] (signed types) or [0, a].
    Dense { a: u64, signed: bool },
    /// 0/1 with at most `k` ones per element (fp8 sums over many ranks).
    Sparse { k: u64 },
    /// 1/2 with at most `k` twos per element.
    Prod { k: u64 },
}

impl RedGen {
    fn new(dtype: Dtype, op: Op, nranks: usize) -> RedGen {
        let n = nranks as u64;
        let m = dtype.exact_int_limit();
        let signed = dtype.is_signed();
        match op {
            Op::Sum | Op::Avg | Op::MulSum => {
                let smax = if op == Op::MulSum { 2 } else { 1 };
                let budget = m / smax;
                let a = (budget / n).min(100);
                if a >= 1 {
                    RedGen::Dense { a, signed }
                } else {
                    RedGen::Sparse { k: budget.min(n) }
                }
            }
            Op::Prod => RedGen::Prod { k: (63 - m.leading_zeros() as u64).min(n) },
            Op::Min | Op::Max => RedGen::Dense { a: m.min(100), signed },
        }
    }

    #[inline]
    fn value(self, seed: u64, rank: usize, index: usize, nranks: usize) -> f64 {
        let (r, g, n) = (rank as u64, index as u64, nranks as u64);
        match self {
            RedGen::Dense { a, signed } => {
                let h = r.wrapping_mul(7).wrapping_add(g.wrapping_mul(3)).wrapping_add(seed);
                if signed {
                    (h % (2 * a + 1)) as f64 - a as f64
                } else {
                    (h % (a + 1)) as f64
                }
            }
            RedGen::Sparse { k } => {
                // (r + g + seed) % n is a permutation of the ranks, so exactly `ones` ranks hold 1.
                let ones = g.wrapping_add(seed) % (k + 1);
                if (r + g.wrapping_add(seed) % n) % n < ones {
                    1.0
                } else {
                    0.0
                }
            }
            RedGen::Prod { k } => {
                let twos = g.wrapping_add(seed) % (k + 1);
                if (r + g.wrapping_add(seed) % n) % n < twos {
                    2.0
                } else {
                    1.0
                }
            }
        }
    }
}

/// What one checked call of one (collective, type, op, root) looks like.
pub struct Check {
    pub coll: Coll,
    pub dtype: Dtype,
    pub op: Op,
    pub root: usize,
    pub nranks: usize,
    pub seed: u64,
    gen: RedGen,
}

impl Check {
    pub fn new(coll: Coll, dtype: Dtype, op: Op, root: usize, nranks: usize, seed: u64) -> Check {
        Check { coll, dtype, op, root, nranks, seed, gen: RedGen::new(dtype, op, nranks) }
    }

    /// Reduction input of `rank` at element `index` of its send buffer.
    #[inline]
    fn red(&self, rank: usize, index: usize) -> f64 {
        self.gen.value(self.seed, rank, index, self.nranks)
    }

    /// Data-movement payload of `rank` at element `index` of its send buffer.
    #[inline]
    fn data(&self, rank: usize, index: usize, out: &mut [u8]) {
        let h = splitmix64(self.seed.wrapping_mul(0x1000_0000_01b3) ^ ((rank as u64) << 44) ^ index as u64);
        let sz = self.dtype.size();
        out[..sz].copy_from_slice(&h.to_ne_bytes()[..sz]);
    }

    /// Fills `rank`'s send region (`counts.send` elements).
    pub fn fill_send(&self, rank: usize, buf: &mut [u8]) {
        let sz = self.dtype.size();
        if self.coll.reduces() {
            for (i, e) in buf.chunks_exact_mut(sz).enumerate() {
                self.dtype.encode(self.red(rank, i), e);
            }
        } else {
            for (i, e) in buf.chunks_exact_mut(sz).enumerate() {
                self.data(rank, i, e);
            }
        }
    }

    /// Overwrites `buf` with a pattern no correct result is expected to keep.
    pub fn poison(&self, buf: &mut [u8]) {
        for (i, chunk) in buf.chunks_mut(8).enumerate() {
            let h = splitmix64(POISON_SALT ^ self.seed ^ (i as u64).wrapping_mul(0x9e37));
            let n = chunk.len();
            chunk.copy_from_slice(&h.to_ne_bytes()[..n]);
        }
    }

    /// Whether `rank` holds a defined result to check.
    pub fn rank_checks(&self, rank: usize) -> bool {
        match self.coll {
            Coll::Reduce | Coll::Gather => rank == self.root,
            _ => true,
        }
    }

    fn combine(&self, global: usize) -> f64 {
        let n = self.nranks;
        let mut acc = self.red(0, global);
        if self.op == Op::MulSum {
            acc *= premul_scalar(0);
        }
        for r in 1..n {
            let v = self.red(r, global);
            acc = match self.op {
                Op::Sum | Op::Avg => acc + v,
                Op::Prod => acc * v,
                Op::Max => acc.max(v),
                Op::Min => acc.min(v),
                Op::MulSum => acc + v * premul_scalar(r),
            };
        }
        if self.op == Op::Avg {
            acc /= n as f64;
            if !self.dtype.is_float() {
                acc = acc.trunc();
            }
        }
        acc
    }

    /// The expected receive region (`counts.recv` elements) of `rank`.
    pub fn expected(&self, rank: usize, counts: &Counts) -> Vec<u8> {
        let sz = self.dtype.size();
        let n = self.nranks;
        let mut out = vec![0u8; counts.recv * sz];
        let base = counts.param;
        for (k, e) in out.chunks_exact_mut(sz).enumerate() {
            match self.coll {
                Coll::AllReduce | Coll::Reduce => self.dtype.encode(self.combine(k), e),
                Coll::ReduceScatter => self.dtype.encode(self.combine(rank * base + k), e),
                Coll::AllGather | Coll::Gather => self.data(k / base, k % base, e),
                Coll::Broadcast => self.data(self.root, k, e),
                Coll::Scatter => self.data(self.root, rank * base + k, e),
                Coll::Alltoall => self.data(k / base, rank * base + k % base, e),
                Coll::Sendrecv => self.data((rank + n - 1) % n, k, e),
            }
        }
        out
    }

    /// Index, in the reduction's element space, of element `k` of `rank`'s receive region.
    fn global_index(&self, rank: usize, counts: &Counts, k: usize) -> usize {
        if self.coll == Coll::ReduceScatter {
            rank * counts.param + k
        } else {
            k
        }
    }

    /// Allowed |got - expected| of a float `avg` element: the larger of the relative tolerance
    /// of [`Dtype::avg_tolerance`] (1e-6 for f32/f64, 1e-2 for f16/bf16/fp8) and the rounding
    /// bound of the computation, (nranks + 1) ulps at S = sum(|x_r|)/nranks, the largest
    /// magnitude any partial result can reach (n products x_r * round(1/n) and n-1 additions,
    /// each rounding by at most half an ulp, plus the error of round(1/n)). The second term is
    /// what matters when the result cancels to near zero, or for fp8, whose ulp exceeds 1e-2.
    fn avg_tolerance(&self, global: usize, expected: f64) -> f64 {
        let n = self.nranks;
        let s: f64 = (0..n).map(|r| self.red(r, global).abs()).sum::<f64>() / n as f64;
        let bound = if s > 0.0 { (n as f64 + 1.0) * self.dtype.ulp(s) } else { 0.0 };
        (self.dtype.avg_tolerance() * expected.abs()).max(bound)
    }

    /// Number of elements of `got` (`rank`'s receive region) that differ from `expected`.
    pub fn count_wrong(&self, rank: usize, counts: &Counts, got: &[u8], expected: &[u8]) -> u64 {
        let sz = self.dtype.size();
        let tolerant = self.coll.reduces() && self.op == Op::Avg && self.dtype.is_float();
        let mut wrong = 0;
        for (k, (g, e)) in got.chunks_exact(sz).zip(expected.chunks_exact(sz)).enumerate() {
            if g == e {
                continue;
            }
            if tolerant {
                let (gv, ev) = (self.dtype.decode(g), self.dtype.decode(e));
                if gv.is_finite() && (gv - ev).abs() <= self.avg_tolerance(self.global_index(rank, counts, k), ev) {
                    continue;
                }
            }
            wrong += 1;
        }
        wrong
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every partial sum/product any order can form stays exact in the type.
    #[test]
    fn reduction_inputs_stay_exact() {
        for &dt in &Dtype::ALL {
            for &op in &Op::ALL {
                for n in 1..=8usize {
                    let c = Check::new(Coll::AllReduce, dt, op, 0, n, 7);
                    let m = dt.exact_int_limit() as f64;
                    for g in 0..257 {
                        let vals: Vec<f64> = (0..n)
                            .map(|r| c.red(r, g) * if op == Op::MulSum { premul_scalar(r) } else { 1.0 })
                            .collect();
                        // Each input round-trips through the type.
                        for (r, &v) in vals.iter().enumerate() {
                            let mut b = [0u8; 8];
                            dt.encode(c.red(r, g), &mut b);
                            assert_eq!(dt.decode(&b), c.red(r, g), "{dt:?} {op:?} n={n}");
                            assert!(v.abs() <= m);
                        }
                        // Any subset's sum (positive and negative parts) or product is in range.
                        let pos: f64 = vals.iter().filter(|v| **v > 0.0).sum();
                        let neg: f64 = vals.iter().filter(|v| **v < 0.0).sum();
                        let prod: f64 = vals.iter().map(|v| v.abs()).product();
                        match op {
                            Op::Prod => assert!(prod <= m, "{dt:?} n={n} prod {prod}"),
                            Op::Sum | Op::Avg | Op::MulSum => assert!(pos <= m && -neg <= m, "{dt:?} {op:?} n={n}"),
                            _ => {}
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn sparse_and_prod_vary() {
        let c = Check::new(Coll::AllReduce, Dtype::F8e5m2, Op::MulSum, 0, 8, 0);
        let sums: Vec<f64> = (0..16).map(|g| c.combine(g)).collect();
        assert!(sums.iter().any(|&s| s > 0.0) && sums.contains(&0.0));
        let c = Check::new(Coll::AllReduce, Dtype::Int8, Op::Prod, 0, 8, 0);
        assert!((0..16).map(|g| c.combine(g)).any(|p| p > 2.0));
    }

    #[test]
    fn int_avg_truncates() {
        let c = Check::new(Coll::AllReduce, Dtype::Int32, Op::Avg, 0, 3, 0);
        for g in 0..50 {
            let s: f64 = (0..3).map(|r| c.red(r, g)).sum();
            assert_eq!(c.combine(g), (s / 3.0).trunc());
        }
    }

    #[test]
    fn avg_tolerance_covers_cancellation_only() {
        let c = Check::new(Coll::AllReduce, Dtype::Bfloat16, Op::Avg, 0, 6, 3);
        // A result that cancels to ~0 still gets the rounding bound of its inputs' magnitude.
        let g = (0..64).find(|&g| c.combine(g).abs() < 1.0 && (0..6).any(|r| c.red(r, g) != 0.0)).unwrap();
        assert!(c.avg_tolerance(g, c.combine(g)) > 0.0);
        let z = Check::new(Coll::AllReduce, Dtype::Float, Op::Avg, 0, 2, 0);
        // One element off by far more than the bound is counted.
        let counts = Coll::AllReduce.counts(4, 4, 2);
        let mut exp = vec![0u8; 16];
        let mut got = vec![0u8; 16];
        for k in 0..4 {
            z.dtype.encode(z.combine(k), &mut exp[k * 4..]);
            z.dtype.encode(z.combine(k) + if k == 2 { 10.0 } else { 0.0 }, &mut got[k * 4..]);
        }
        assert_eq!(z.count_wrong(0, &counts, &got, &exp), 1);
    }

    #[test]
    fn layouts() {
        let n = 3;
        let counts = Coll::Alltoall.counts(48, 1, n);
        let c = Check::new(Coll::Alltoall, Dtype::Uint8, Op::Sum, 0, n, 1);
        // Simulate the exchange and compare with `expected`.
        let sends: Vec<Vec<u8>> = (0..n)
            .map(|r| {
                let mut b = vec![0u8; counts.send];
                c.fill_send(r, &mut b);
                b
            })
            .collect();
        for me in 0..n {
            let mut got = vec![0u8; counts.recv];
            for s in 0..n {
                got[s * counts.param..(s + 1) * counts.param]
                    .copy_from_slice(&sends[s][me * counts.param..(me + 1) * counts.param]);
            }
            assert_eq!(c.count_wrong(me, &counts, &got, &c.expected(me, &counts)), 0);
        }
    }
}
